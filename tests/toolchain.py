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
