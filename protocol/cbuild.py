"""Building C with the compiler this Python was built with, once per source, into the cache that the shim
(interpose/build.py) and the worker's native lane (server/native_lane.py) share."""

from __future__ import annotations

import fcntl
import os
import shlex
import sysconfig
from collections.abc import Callable
from pathlib import Path


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
