"""Where the tests find NVIDIA's compiler and runtimes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# The newest CUDA 13 runtime tested besides the one the test extra pins: one venv holds one version
# of a wheel, so its libcudart is fetched with pip into a cache directory (newest_cudart()).
NEWEST_CUDART = "13.5.37"


def nvcc_path() -> str | None:
    """nvcc from $NVCC, else the one the ``nvidia-cuda-nvcc`` wheel installs, else the one on $PATH."""
    if os.environ.get("NVCC"):
        return os.environ["NVCC"]
    try:
        import nvidia  # namespace package of NVIDIA's wheels: several directories, no __file__
    except ImportError:
        nvidia = None
    for base in getattr(nvidia, "__path__", []):
        candidate = Path(base) / "cu13" / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("nvcc")


def _nvidia_dirs() -> list[Path]:
    try:
        import nvidia
    except ImportError:
        return []
    return [Path(p) for p in getattr(nvidia, "__path__", [])]


def cudart_path(major: int) -> str | None:
    """NVIDIA's libcudart of CUDA `major` (12 or 13), from the runtime wheels."""
    sub = {12: ("cuda_runtime", "libcudart.so.12"), 13: ("cu13", "libcudart.so.13")}[major]
    for base in _nvidia_dirs():
        candidate = base / sub[0] / "lib" / sub[1]
        if candidate.is_file():
            return str(candidate)
    return None


def newest_cudart() -> tuple[str | None, str]:
    """(libcudart.so.13 of nvidia-cuda-runtime==NEWEST_CUDART, "") from the cache (XPU_SHIM_DIR, else
    ~/.cache/xpuremote), downloaded there with pip the first time; (None, why) when pip cannot get it."""
    root = Path(os.environ.get("XPU_SHIM_DIR") or Path.home() / ".cache" / "xpuremote")
    lib = root / f"cudart-{NEWEST_CUDART}" / "libcudart.so.13"
    if lib.is_file():
        return str(lib), ""
    requirement = f"nvidia-cuda-runtime=={NEWEST_CUDART}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--retries", "1", "--timeout", "15", "-d", tmp, requirement],
                              capture_output=True, text=True, timeout=300)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode or not wheels:
            why = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            return None, f"pip could not download {requirement} (offline?): {why}"
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith("/lib/libcudart.so.13"))
            lib.parent.mkdir(parents=True, exist_ok=True)
            part = lib.with_suffix(f".part{os.getpid()}")
            part.write_bytes(wheel.read(member))
            part.replace(lib)  # atomic: a concurrent test sees the whole file or none
    return str(lib), ""


def nvcc_lib_dir() -> str | None:
    """Where nvcc's libcudart_static.a and friends are, for -L: lib beside the wheel's bin, lib64
    beside a CUDA toolkit's (/usr/local/cuda/bin/nvcc, say)."""
    nvcc = nvcc_path()
    if nvcc is None:
        return None
    root = Path(nvcc).resolve().parent.parent
    for lib in (root / "lib", root / "lib64"):
        if (lib / "libcudart_static.a").is_file():
            return str(lib)
    return None
