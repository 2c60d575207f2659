"""The client's own CPU per call, by entry point: with XPU_CALL_CPU=FILE, each handler the core runs is timed on
its thread's CPU clock, and FILE gets one line per entry point at the end of the session: its name, how many
calls, their nanoseconds. Calls answered in C (the lane, the context questions, kept descriptors) never reach
the core and are not in it. A trace (XPU_TRACE) records every call, the lane's as C stamps them; this times the
core's own work per entry point, what an application pays with the C paths on (bench/client_cpu.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

Handler = Callable[[Any], int]
SPENT: dict[str, list[int]] = {}  # entry point -> [calls, CPU nanoseconds]; threads adding at once may lose one


def wanted() -> bool:
    return bool(os.environ.get("XPU_CALL_CPU"))


def timed(name: str, handler: Handler) -> Handler:
    """`handler`, adding each call's CPU time on its thread to SPENT[name]."""
    spent = SPENT.setdefault(name, [0, 0])
    clock = time.thread_time_ns

    def run(slots: Any) -> int:
        began = clock()
        try:
            return handler(slots)
        finally:
            spent[0] += 1
            spent[1] += clock() - began
    return run


def read(path: str | os.PathLike[str]) -> dict[str, tuple[int, int]]:
    """A FILE that write() made: entry point -> (calls, CPU nanoseconds), dearest first."""
    with open(path) as f:
        return {name: (int(n), int(ns)) for name, n, ns in (line.split("\t") for line in f.read().splitlines())}


def write() -> None:
    """FILE's lines, dearest first (at the session's end)."""
    path = os.environ.get("XPU_CALL_CPU", "").replace("%p", str(os.getpid()))
    if not path:
        return
    rows = sorted(((name, n, ns) for name, (n, ns) in SPENT.items() if n), key=lambda row: -row[2])
    with open(path, "w") as f:
        f.writelines(f"{name}\t{n}\t{ns}\n" for name, n, ns in rows)
