"""Building C with the compiler this Python was built with, once per source, into the cache that the shim
(interpose/build.py) and the worker's native lane (server/native_lane.py) share."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shlex
import sys
import sysconfig
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cc() -> list[str]:
    return shlex.split(sysconfig.get_config_var("CC") or "cc")


def cache_root() -> Path:
    """Where built libraries are kept, each under a name that changes with its sources."""
    return Path(os.environ.get("XPU_SHIM_DIR") or Path.home() / ".cache" / "xpuremote")


def built_once(target: Path, make: Callable[[], object]) -> Path:
    """`target`, made by `make` if missing. Safe to call from parallel processes (one lock for the cache)."""
    if target.exists():
        return target
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            make()
    return target


BEGIN, END = "/* cffi: begin */", "/* cffi: end */"


def declarations(source: Path) -> str:
    """What a C file declares for Python: its lines between BEGIN and END, which the file itself then uses, so the
    structures and prototypes cffi is given are the ones compiled, written once."""
    text = source.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{source.name} has no {BEGIN} ... {END} part")
    return text[start + len(BEGIN):end]


def cffi_module(name: str, source: Path, cdef: str | None = None, macros: list[tuple[str, str]] | None = None,
                flags: tuple[str, ...] = ("-O2",)) -> Any:
    """The compiled (API-mode) cffi module `name` of a C file, built once per cache under a name that changes with
    its source, declarations (`cdef`, else the file's own: declarations()), macros, compiler and Python, and
    loaded; any failure to build or load raises."""
    cdef = declarations(source) if cdef is None else cdef
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    digest = hashlib.sha256(source.read_bytes() + cdef.encode() + repr((macros, flags, cc())).encode()
                            + sys.version.encode()).hexdigest()[:16]
    target = cache_root() / f"{name}-{digest}{suffix}"

    def make() -> None:
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(cdef)
        ffi.set_source(name, source.read_text(), define_macros=macros or [], extra_compile_args=list(flags))
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # setuptools' own, which would reach the application's stderr
            os.replace(ffi.compile(tmpdir=tmp, verbose=False), target)

    spec = importlib.util.spec_from_file_location(name, built_once(target, make))
    if spec is None or spec.loader is None:
        raise ImportError(f"no module at {target}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
