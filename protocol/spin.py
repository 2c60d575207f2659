"""How an end waits for its peer's next message: it looks without sleeping for a while, then blocks.

A thread blocked in a receive is woken by the message: a scheduler wake-up, on a CPU that may have
idled into a deeper state, with caches gone cold (client/wake.py measures it). On a round trip of a
synchronous call that happens at both ends, every call. NVIDIA's driver makes the same choice for
the GPU's answers: by default a thread that waits for the GPU spins, if the process has fewer
contexts than the machine has CPUs, and yields or blocks otherwise (the context's scheduling flags).

So the client's wait for an answer, and the worker's wait for the next message after one, spin for
up to `XPU_SPIN_US` µs (the worker: `xpu-server --spin-us`) before they block. The default is
DEFAULT_US where the process may use SPIN_MIN_CPUS or more, and 0 below: on two CPUs the spinning
end would take the CPU the other end needs. A server's new session spins by default only while the
sessions are fewer than its CPUs, as the driver's rule counts contexts.

Only the data connection's waits spin (client/data.py); a session over ZeroMQ alone waits in
ZeroMQ's own receive, behind its I/O thread's wake-up anyway.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

SCHED_MASK, SCHED_YIELD, SCHED_BLOCKING_SYNC = 0x07, 0x02, 0x04  # CUctx_flags: how a context's threads wait
DEFAULT_US = 200  # longer than a loopback round trip (40-110 µs measured) plus the client's own work
SPIN_MIN_CPUS = 4

T = TypeVar("T")


def cpus() -> int:
    """The CPUs this process may run on: a container's or taskset's share, not the whole machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_us(spinners: int = 1) -> int:
    """The spin bound an end uses unless told otherwise: XPU_SPIN_US, or DEFAULT_US where this process may use
    SPIN_MIN_CPUS or more and `spinners` (the ends that would spin here: a server's sessions) are fewer."""
    value = os.environ.get("XPU_SPIN_US")
    if value is not None:
        if not value.strip().isdecimal():
            raise ValueError(f"XPU_SPIN_US={value!r} is not a whole number of microseconds (0: never spin)")
        return int(value)
    n = cpus()
    return DEFAULT_US if n >= SPIN_MIN_CPUS and spinners < n else 0


def spin(ready: Callable[[], T], bound_ns: int, yielding: bool = False) -> T | None:
    """`ready()`'s first true answer within `bound_ns`, asked again and again without sleeping; None if it
    had none. `yielding`: give the CPU to another runnable thread between two looks."""
    if bound_ns <= 0:
        return None
    clock = time.perf_counter_ns
    end = clock() + bound_ns
    while True:
        answer = ready()
        if answer:
            return answer
        if clock() >= end:
            return None
        if yielding:
            os.sched_yield()
