"""Where the tests find NVIDIA's compiler and runtimes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# NVIDIA's runtime wheels by CUDA major: (package, folder), libcudart being nvidia/FOLDER/lib/libcudart.so.MAJOR
RUNTIME_WHEELS = {12: ("nvidia-cuda-runtime-cu12", "cuda_runtime"), 13: ("nvidia-cuda-runtime", "cu13")}
# Runtimes tested besides the two the test extra pins (the newest 12.x and 13.x on the index, 12.9.79 and
# 13.5.37, whose headers the call table is generated from): the oldest of each major. One venv holds one
# version of a wheel, so these are fetched with pip into a cache directory (fetch_cudart()).
# bench/runtimes.py runs every release from 12.4 on.
OLDEST_CUDART12 = "12.4.99"
OLDEST_CUDART13 = "13.0.48"
FETCHED_CUDARTS = (OLDEST_CUDART12, OLDEST_CUDART13)


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
    """NVIDIA's libcudart of CUDA `major` (12 or 13), from the runtime wheels installed."""
    for base in _nvidia_dirs():
        candidate = base.parent / cudart_member(major)
        if candidate.is_file():
            return str(candidate)
    return None


def cudart_member(major: int) -> str:
    """Where the runtime wheel of CUDA `major` keeps libcudart."""
    return f"nvidia/{RUNTIME_WHEELS[major][1]}/lib/libcudart.so.{major}"


def cudart_requirement(version: str) -> str:
    """pip's requirement for NVIDIA's runtime `version` (the package's name depends on the major)."""
    return f"{RUNTIME_WHEELS[int(version.split('.')[0])][0]}=={version}"


def fetch_cudart(version: str) -> tuple[str | None, str]:
    """(libcudart of NVIDIA's runtime `version`, "") from the cache (XPU_SHIM_DIR, else ~/.cache/xpuremote),
    downloaded there with pip the first time; (None, why) when pip cannot get it."""
    major = int(version.split(".")[0])
    root = Path(os.environ.get("XPU_SHIM_DIR") or Path.home() / ".cache" / "xpuremote")
    lib = root / f"cudart-{version}" / f"libcudart.so.{major}"
    if lib.is_file():
        return str(lib), ""
    requirement = cudart_requirement(version)
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                               "--retries", "1", "--timeout", "15", "-d", tmp, requirement],
                              capture_output=True, text=True, timeout=300)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode or not wheels:
            why = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            return None, f"pip could not download {requirement} (offline?): {why}"
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = cudart_member(major)
            if member not in wheel.namelist():
                return None, f"{wheels[0].name} has no {member}"
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
