"""NVIDIA's libraries link each other, and so link xpuremote's replacements of the ones it replaces.

The stock torch wheel's `libcusolver.so.12` needs `cublasSetEnvironmentMode@libcublas.so.13`, NVIDIA's own
`libcublas.so.13` (mapped beside the replacement) needs cuBLASLt's internal calls: once xpu-run has preloaded
the replacements, each such import binds to them. Every NVIDIA library of the torch venv is loaded here with
RTLD_NOW, one per forked child (so that one library's symbols cannot stand in for a replacement's), beside the
replacements preloaded as xpu-run preloads them, and every symbol left unresolved is named. No call is made, so
no server is needed. Needs the torch venv (`make torch`), whose NVIDIA wheels hold the libraries.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from xpuremote.interpose.build import LIBRARY_NAMES, NAME, NVML_NAME
from xpuremote.interpose.run import child_env
from xpuremote.protocol import linked

REPLACED = frozenset({NAME, NVML_NAME, *LIBRARY_NAMES})

# In the child: each library loaded in a forked process of its own. One that fails for an undefined symbol is
# mapped again lazily, and each of its imports looked up as the loader would (the global scope, then the
# library's own dependencies, where the preloaded replacements stand for their SONAMEs), to name all of them.
LOADER = r"""
import ctypes, json, os, sys
from xpuremote.protocol import linked

libdl = ctypes.CDLL(None)
libdl.dlvsym.restype = libdl.dlsym.restype = libdl.dlopen.restype = ctypes.c_void_p
libdl.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
libdl.dlvsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
libdl.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def found(handle, imp):
    name = imp.name.encode()
    look = (lambda h: libdl.dlvsym(h, name, imp.version.encode())) if imp.version else (lambda h: libdl.dlsym(h, name))
    return bool(look(None) or look(handle))  # None is RTLD_DEFAULT


def unresolved(path):
    handle = libdl.dlopen(path.encode(), os.RTLD_LAZY | os.RTLD_GLOBAL)
    if not handle:
        return None
    return sorted(f"{i.name}@{i.version}" if i.version else i.name
                  for i in linked.read(path).imports if not i.weak and not found(handle, i))


def load(path):
    try:
        ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        return {"path": path}
    except OSError as exc:
        error = str(exc)
    return {"path": path, "error": error, "unresolved": unresolved(path) if "undefined symbol" in error else None}


results = []
for path in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, json.dumps(load(path)).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    results.append(json.loads(text) if text else {"path": path, "error": "the child died loading it"})
print(json.dumps(results))
"""


def wheel_dirs() -> list[Path]:
    dirs = sorted(ROOT.glob(".venv-torch/lib/python3*/site-packages/nvidia/*/lib"))
    if not dirs:
        pytest.skip("no torch venv with NVIDIA's wheels: run `make torch`")
    return dirs


def loader_env(shim: Path, dirs: list[Path]) -> dict[str, str]:
    """xpu-run's environment (the replacements preloaded), with the wheels' folders on the library path as
    PyTorch's DT_RPATH has them. No server is started: nothing here makes a call."""
    env = child_env(str(shim.parent), "tcp://127.0.0.1:1")
    env["LD_LIBRARY_PATH"] = ":".join([env["LD_LIBRARY_PATH"], *map(str, dirs)])
    return env


def test_every_wheel_library_loads_beside_the_replacements(shim: Path) -> None:
    dirs = wheel_dirs()
    libraries = {str(lib.path): lib for lib in linked.shared_libraries(dirs)}
    assert any(lib.soname == "libcusolver.so.12" for lib in libraries.values()), sorted(libraries)
    proc = subprocess.run([sys.executable, "-c", LOADER, *libraries], capture_output=True, text=True, timeout=120,
                          env=loader_env(shim, dirs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    failures, absent = [], []
    for result in json.loads(proc.stdout):
        error, lib = result.get("error"), libraries[result["path"]]
        if error is None:
            continue
        missing = re.search(r"(\S+): cannot open shared object file", error)
        if result.get("unresolved"):
            failures.append(f"{lib.path.name}: {', '.join(result['unresolved'])}")
        elif missing and not REPLACED & set(lib.needed) and missing.group(1) not in lib.path.name:
            # a system library this machine lacks (InfiniBand, MPI): it links nothing xpuremote replaces
            absent.append(f"{lib.path.name} ({missing.group(1)})")
        else:
            failures.append(f"{lib.path.name}: {error}")
    assert not failures, "NVIDIA's libraries that do not load beside the replacements:\n" + "\n".join(failures)
    loaded = len(libraries) - len(absent)
    assert loaded >= 20, f"only {loaded} of {len(libraries)} loaded; lacking a system library: {absent}"


REFUSED = r"""
import ctypes, os, sys
cublas = ctypes.CDLL("libcublas.so.13", mode=os.RTLD_NOW | os.RTLD_NOLOAD)
print(cublas.cublasSetEnvironmentMode(None, 0), cublas.cublasSetEnvironmentMode(None, 0))
"""


def test_an_import_no_header_declares_is_refused_once(shim: Path) -> None:
    """cuSOLVER's cublasSetEnvironmentMode, answered by the preloaded replacement: NOT_SUPPORTED, said once."""
    from xpuremote.protocol import cublas_api

    proc = subprocess.run([sys.executable, "-c", REFUSED], capture_output=True, text=True, timeout=60,
                          env={**child_env(str(shim.parent), "tcp://127.0.0.1:1"), "XPU_LOG": "WARNING"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = cublas_api.ENUMS["CUBLAS_STATUS_NOT_SUPPORTED"]
    assert proc.stdout.split() == [str(status)] * 2
    said = [line for line in proc.stderr.splitlines() if "cublasSetEnvironmentMode" in line]
    assert said == ["xpuremote: WARNING cublasSetEnvironmentMode is not supported by xpuremote yet "
                    "(returning CUBLAS_STATUS_NOT_SUPPORTED)"], proc.stderr
