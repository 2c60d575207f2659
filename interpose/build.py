"""Build the shim: `libcuda.so.1` (SONAME libcuda.so.1, plain C), the client core it loads into
a namespace of its own (`libxpuremote-core.so`, a cffi embedding of the client in this Python), and
beside them plain C libraries that forward to libcuda.so.1: `libnvidia-ml.so.1` (NVML) and the
math libraries `libcublas.so.13`, `libcublasLt.so.13`, `libcudnn.so.9`.

    python -m xpuremote.interpose.build [--out DIR]

Built for the Python that runs this, once per source version, into a cache directory
(XPU_SHIM_DIR, else ~/.cache/xpuremote); `xpu-run` builds it on first use.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import site
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from xpuremote.protocol import abi, errors, mathlibs
from xpuremote.protocol.cbuild import built_once, cache_root, cc

HERE = Path(__file__).resolve().parent
PROTOCOL = HERE.parent / "protocol"  # abi.h: the records, enums and limits C shares with Python
SOURCES = ("shim.c", "entry_points.c", "front.h", "lane.h", "answers.h", "kept.h", "core.c", "first_call.h", "nvml.c",
           "nvml_entry_points.c", "mathlib.c", *(f"{lib.name}_entry_points.c" for lib in mathlibs.LIBRARIES))
NAME = "libcuda.so.1"
CORE_NAME = "libxpuremote-core.so"
NVML_NAME = "libnvidia-ml.so.1"
LIBRARY_NAMES = tuple(lib.soname for lib in mathlibs.LIBRARIES)


def lent() -> list[str]:
    """The declarations of what the front lends the core's Python: front.h's XPU_FRONT_LENT list, one entry a
    line (continued with backslashes), as `return-type xpu_name(parameters);`."""
    text = (HERE / "front.h").read_text()
    body = text[text.index("#define XPU_FRONT_LENT("):].split("\n\n", 1)[0].replace("\\\n", "\n")
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    found = []
    for m in re.finditer(r"XPU_LENT(_VOID)?\((.*?)\)\s*(?=XPU_LENT|$)", body.split("\n", 1)[1], flags=re.S):
        fields = " ".join(m.group(2).split())
        if m.group(1):
            name, _, rest = fields.partition(", ")
            ret = "void"
        else:
            ret, name, rest = fields.split(", ", 2)
        params = rest[: _closing(rest) + 1]
        found.append(f"{ret} xpu_{name}{params};")
    return found


def _closing(text: str) -> int:
    """Where the parenthesis that opens `text` closes."""
    depth = 0
    for i, c in enumerate(text):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if depth == 0:
            return i
    raise ValueError(f"front.h: unbalanced parentheses in {text!r}")


CDEF = "\n".join([
    'extern "Python" int xpu_dispatch(int op, uint64_t *slots);',
    "int xpu_symbol_count(void);",  # core.c's own, from the table's data
    "void xpu_set_python_ready(void);",
    *lent(),
]) + abi.CDEF

# Runs in the core's interpreter as it starts, before cffi imports _cffi_backend: the install's
# folders may not be on the build Python's own path (pip install --target, PYTHONPATH).
SITE = """
import site, sys
for path in {paths!r}:
    if path not in sys.path:
        site.addsitedir(path)
"""

# Runs in the core's own interpreter on the first driver call.
INIT = """
from _xpuremote_core import ffi, lib
from xpuremote.interpose import entry
entry.install(ffi, lib)
"""


def python_paths() -> list[str]:
    """Where this interpreter finds xpuremote and its dependencies, for a host that lacks them."""
    import xpuremote.client  # noqa: F401  (the package must be importable from here)

    paths = [*site.getsitepackages(), site.getusersitepackages()]
    # The folder holding the package (pip install --target, PYTHONPATH, the tree of links of a strict
    # editable install); the default editable install's import hook is found through site-packages.
    holder = Path(sys.modules["xpuremote.client"].__file__).parents[2]  # as found, links and all
    if (holder / "xpuremote").is_dir():
        paths.append(str(holder))
    return [p for p in dict.fromkeys(paths) if os.path.isdir(p)]


def cache_key() -> str:
    h = hashlib.sha256()
    for name in (*SOURCES, "build.py"):
        h.update((HERE / name).read_bytes())
    for name in ("mathlibs.py", "abi.h"):
        h.update((HERE.parent / "protocol" / name).read_bytes())
    h.update(sys.executable.encode() + sys.version.encode() + repr(python_paths()).encode())
    return h.hexdigest()[:16]


def build_core(tmp: Path) -> Path:
    """The client in this Python, as a cffi embedding: the core libcuda.so.1 loads with dlmopen."""
    import cffi

    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        raise SystemExit(f"xpuremote: {sys.executable} has no shared libpython, which the CUDA client needs to "
                         "run inside other programs; install xpuremote into a Python built with --enable-shared "
                         "(python.org, pyenv with PYTHON_CONFIGURE_OPTS=--enable-shared, Debian's, conda's, uv's)")
    ffi = cffi.FFI()
    ffi.embedding_api("")
    ffi.cdef(CDEF)
    ffi.set_source(
        "_xpuremote_core",
        "static int xpu_dispatch(int op, uint64_t *slots);\n#include \"core.c\"\n",
        include_dirs=[str(HERE), str(PROTOCOL)],
        define_macros=[("XPU_PYTHON", json.dumps(sys.executable)),
                       ("XPU_PYTHON_SITE", json.dumps(SITE.format(paths=python_paths())))],
        extra_compile_args=["-O2", "-fvisibility=hidden", "-Wno-unused-function"],
        extra_link_args=["-ldl", "-lpthread"],
    )
    ffi.embedding_init_code(INIT)
    return Path(ffi.compile(tmpdir=str(tmp), target=CORE_NAME, verbose=False))


# The libraries the core calls back into stay mapped until the process ends: loaded with dlopen and
# closed (cffi closes a library its interpreter frees at shutdown), libcuda.so.1 was gone when the
# core namespace's exit handlers (OpenSSL's) reached its thread-key functions.
NEVER_UNLOADED = "-Wl,-z,nodelete"


def build_front(tmp: Path) -> Path:
    """libcuda.so.1 itself: C only, no Python, so any program can load it."""
    target = tmp / NAME
    built_for = f"{sys.version.split()[0]} ({sys.executable})"
    subprocess.run([*cc(), "-shared", "-fPIC", "-O2", "-fvisibility=hidden", "-Wno-unused-function",
                    f"-I{HERE}", f"-I{PROTOCOL}", f'-DXPU_CORE_NAME="{CORE_NAME}"', f'-DXPU_BUILT_FOR="{built_for}"',
                    str(HERE / "shim.c"), "-o", str(target), f"-Wl,-soname,{NAME}", NEVER_UNLOADED,
                    "-ldl", "-lpthread"], check=True)
    return target


def build(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        os.replace(build_core(Path(tmp)), out_dir / CORE_NAME)
        os.replace(build_nvml(Path(tmp)), out_dir / NVML_NAME)
        for lib in mathlibs.LIBRARIES:
            os.replace(build_library(lib, Path(tmp)), out_dir / lib.soname)
        final = out_dir / NAME
        os.replace(build_front(Path(tmp)), final)  # last: its presence says the directory is complete
    return final


def build_nvml(tmp: Path) -> Path:
    """libnvidia-ml.so.1: nvml.c with its generated entry points (nvml_entry_points.c)."""
    target = tmp / NVML_NAME
    subprocess.run([*cc(), "-shared", "-fPIC", "-O2", "-fvisibility=hidden", f"-I{HERE}", str(HERE / "nvml.c"),
                    "-o", str(target), f"-Wl,-soname,{NVML_NAME}", NEVER_UNLOADED, "-ldl", "-lpthread"], check=True)
    return target


def build_library(lib: mathlibs.Library, tmp: Path) -> Path:
    """One math library: its generated entry points in mathlib.c, every symbol under the version
    node NVIDIA's library uses (its SONAME), as the application was linked against."""
    script = tmp / f"{lib.name}.map"
    script.write_text(f"{lib.soname} {{ global: *; }};\n")
    target = tmp / lib.soname
    not_initialized = errors.status_for(errors.CudaError(errors.NOT_INITIALIZED), lib.name)
    subprocess.run([*cc(), "-shared", "-fPIC", "-O2", "-fvisibility=hidden", f"-I{HERE}", f"-I{PROTOCOL}",
                    f'-DXPU_ENTRY_POINTS="{lib.name}_entry_points.c"', f"-DXPU_NOT_INITIALIZED={not_initialized}",
                    str(HERE / "mathlib.c"), "-o", str(target), f"-Wl,-soname,{lib.soname}",
                    f"-Wl,--version-script={script}", NEVER_UNLOADED, "-ldl", "-lpthread"], check=True)
    return target


def ensure_shim() -> Path:
    """The shim for this interpreter, built if missing."""
    out_dir = cache_root() / f"shim-{cache_key()}"
    return built_once(out_dir / NAME, lambda: build(out_dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="build into this directory instead of the cache")
    args = parser.parse_args(argv)
    print(build(args.out) if args.out else ensure_shim())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
