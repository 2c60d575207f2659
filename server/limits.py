"""Per-client limits, enforced in the client's worker: a device memory quota and what it may call.

`Accounted` wraps a session's backend. It counts the device memory the client holds
(cuMemAlloc, cuMemAllocPitch; host memory does not count), refuses an allocation beyond the
quota with CUDA_ERROR_OUT_OF_MEMORY (for this client only: every client has its own worker),
and keeps the peak for the session's log line and metrics. Calls the client library never
sends (the table's `unsupported` class: managed memory, IPC, VMM, ...) are refused here, so
that a hand-made client cannot reach around the quota or the isolation through the real driver.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import errors, wire
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.errors import CudaError

from .backends.base import Backend, Inventory

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'512M', '2G', '1048576' -> bytes (binary units; a trailing B or iB is allowed)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in UNITS else ""
    number = float(value[: len(value) - len(unit)])
    if number < 0:
        raise ValueError(f"negative size {text!r}")
    return int(number * UNITS[unit])


@dataclass
class Limits:
    mem_quota: int = 0  # bytes of device memory per client; 0: no quota
    max_request_bytes: int = 0  # bytes in one request message; 0: no limit

    def request_frames(self) -> int:
        """Most frames a request within max_request_bytes can have (0: no bound): a header, then bulk
        frames of over INLINE_MAX bytes each. Bounds what a message of empty frames costs."""
        return 1 + self.max_request_bytes // wire.INLINE_MAX if self.max_request_bytes else 0


def give_back_memory() -> None:
    """Return free heap pages to the system (glibc; elsewhere nothing). After a refused message:
    ZeroMQ took it in whole, and the allocator would otherwise keep that much for good."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


_LIBC = ctypes.CDLL(None)


class Accounted(Backend):
    """A backend with the session's device memory counted and capped."""

    def __init__(self, inner: Backend, limits: Limits) -> None:
        self.inner = inner
        self.limits = limits
        self.name = inner.name
        self.sizes: dict[int, int] = {}  # address -> bytes, of this client's allocations
        self.used = 0
        self.peak = 0

    def __getattr__(self, name: str) -> Any:  # the backend's own attributes (memory, ...)
        return getattr(self.inner, name)

    def inventory(self) -> Inventory:
        return self.inner.inventory()

    def bind(self, handles: dict[int, tuple[str, Any]]) -> None:
        self.inner.bind(handles)

    def close(self) -> None:
        self.inner.close()
        self.sizes.clear()
        self.used = 0

    def execute(self, call: Call, args: list[Any]) -> list[Any]:
        if call.cls == "unsupported":
            raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol} is not served")
        if call.family in ("cuMemAlloc", "cuMemAllocPitch"):
            return self.allocate(call, args)
        outs = self.inner.execute(call, args)
        if call.family == "cuMemFree":
            self.used -= self.sizes.pop(args[0], 0)
        return outs

    def allocate(self, call: Call, args: list[Any]) -> list[Any]:
        ins = [a for p, a in zip(call.params, args) if p.direction != "out"]
        wanted = ins[0] * (ins[1] if call.family == "cuMemAllocPitch" else 1)
        self.check_quota(wanted)
        outs = self.inner.execute(call, args)
        address = _integer(outs[0])
        pitched = call.family == "cuMemAllocPitch" and outs[1] is not None
        size = _integer(outs[1]) * ins[1] if pitched else wanted  # pitch * height
        try:
            self.check_quota(size)
        except CudaError:
            self.inner.execute(CALLS["cuMemFree_v2"], [address])  # the pitch rounded it over the quota
            raise
        self.sizes[address] = size
        self.used += size
        self.peak = max(self.peak, self.used)
        return outs

    def check_quota(self, size: int) -> None:
        quota = self.limits.mem_quota
        if quota and self.used + size > quota:
            raise CudaError(errors.OUT_OF_MEMORY, f"{size} bytes requested; this client holds {self.used} "
                            f"of its quota of {quota} bytes")


def _integer(value: Any) -> int:
    """An output integer as the backends give it: a Python int (sim) or its bytes (cuda)."""
    return value if isinstance(value, int) else int.from_bytes(bytes(value)[:8], "little")
