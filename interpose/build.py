"""Build the shim: `libcuda.so.1` (SONAME libcuda.so.1), a cffi embedding of the client.

    python -m xpuremote.interpose.build [--out DIR]

Built for the Python that runs this, once per source version, into a cache directory
(XPU_SHIM_DIR, else ~/.cache/xpuremote); `xpu-run` builds it on first use.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("shim.c", "entry_points.c", "first_call.h")
NAME = "libcuda.so.1"

CDEF = """
extern "Python" int xpu_dispatch(int op, uint64_t *slots);
extern const int xpu_symbol_count;
void xpu_set_finalized(void);
void xpu_set_python_ready(void);
int xpu_requested_version(void);
uint64_t xpu_ctx_current(void);
void xpu_ctx_set_current(uint64_t ctx);
int xpu_ctx_push(uint64_t ctx);
uint64_t xpu_ctx_pop(void);
void xpu_cls_release(uint64_t ctx);
"""

# Runs inside the application's interpreter (or one the shim starts) on the first driver call.
INIT = """
import site, sys
for path in {paths!r}:
    if path not in sys.path:
        site.addsitedir(path)
from _xpuremote_shim import ffi, lib
from xpuremote.interpose import entry
entry.install(ffi, lib)
"""


def python_paths() -> list[str]:
    """Where this interpreter finds xpuremote and its dependencies, for a host that lacks them."""
    import xpuremote.client  # noqa: F401  (the package must be importable from here)

    paths = [*site.getsitepackages(), site.getusersitepackages()]
    package_root = Path(sys.modules["xpuremote.client"].__file__).resolve().parent.parent
    return [p for p in dict.fromkeys([*paths, str(package_root)]) if os.path.isdir(p)]


def cache_key() -> str:
    h = hashlib.sha256()
    for name in (*SOURCES, "build.py"):
        h.update((HERE / name).read_bytes())
    h.update(sys.executable.encode() + sys.version.encode() + repr(python_paths()).encode())
    return h.hexdigest()[:16]


def libpython() -> str:
    return sysconfig.get_config_var("INSTSONAME") or f"libpython{sysconfig.get_python_version()}.so.1.0"


def build(out_dir: Path) -> Path:
    import cffi

    ffi = cffi.FFI()
    ffi.embedding_api("")
    ffi.cdef(CDEF)
    ffi.set_source(
        "_xpuremote_shim",
        "static int xpu_dispatch(int op, uint64_t *slots);\n#include \"shim.c\"\n",
        include_dirs=[str(HERE)],
        define_macros=[("XPU_LIBPYTHON", f'"{libpython()}"')],
        extra_compile_args=["-O2", "-fvisibility=hidden", "-Wno-unused-function"],
        extra_link_args=[f"-Wl,-soname,{NAME}", "-ldl", "-lpthread"],
    )
    ffi.embedding_init_code(INIT.format(paths=python_paths()))
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        built = Path(ffi.compile(tmpdir=tmp, target=NAME, verbose=False))
        final = out_dir / NAME
        os.replace(built, final)
    return final


def ensure_shim() -> Path:
    """The shim for this interpreter, built if missing. Safe to call from parallel processes."""
    root = Path(os.environ.get("XPU_SHIM_DIR") or Path.home() / ".cache" / "xpuremote")
    out_dir = root / f"shim-{cache_key()}"
    target = out_dir / NAME
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            build(out_dir)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="build into this directory instead of the cache")
    args = parser.parse_args(argv)
    print(build(args.out) if args.out else ensure_shim())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
