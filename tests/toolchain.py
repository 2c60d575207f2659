"""Where the tests find NVIDIA's compiler."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


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
