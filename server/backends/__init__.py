"""Backends execute a session's calls: `cuda` on real GPUs, `sim` anywhere."""

from __future__ import annotations

import ctypes.util
import logging
import os

from .base import Backend

log = logging.getLogger("xpuremote.server")


def gpu_present() -> bool:
    """Whether a real CUDA driver is installed here (checked without initialising it)."""
    return ctypes.util.find_library("cuda") is not None


def load_backend(name: str) -> Backend:
    if name == "auto":
        name = "cuda" if gpu_present() else "sim"
    if name == "sim":
        from .sim import SimBackend

        return SimBackend(device_count=int(os.environ.get("XPU_SIM_DEVICES", "1")))
    if name == "cuda":
        from .cuda import CudaBackend

        return CudaBackend()
    raise ValueError(f"unknown backend {name!r}: use auto, cuda or sim")
