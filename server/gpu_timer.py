"""GPU time of a session's GPU work, for a client's trace: events recorded around each kernel
launch, copy and memset on the work's own stream, through the session's backend, read once the
work is done. Only while the client asks for it (XPU_TRACE_GPU): two more events per call.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.errors import CudaError

from .backends.base import Backend

GPU_WORK = ("cuLaunch", "xpuLaunch", "cuMemcpy", "xpuMemcpy", "cuMemset")
CREATE, RECORD, QUERY = CALLS["cuEventCreate"], CALLS["cuEventRecord"], CALLS["cuEventQuery"]
ELAPSED, DESTROY = CALLS["cuEventElapsedTime"], CALLS["cuEventDestroy"]


def is_gpu_work(call: Call) -> bool:
    return call.family.startswith(GPU_WORK)


class GpuTimer:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.pending: list[tuple[int, Any, Any]] = []  # (message seq, start event, end event)
        self.sums: dict[int, int] = defaultdict(int)  # seq -> GPU ns of its work read so far

    def start(self, call: Call, args: list[Any]) -> tuple[Any, Any]:
        stream = _stream(call, args)
        begin = self._event()
        self.backend.execute(RECORD, [begin, stream])
        return begin, stream

    def stop(self, seq: int, begun: tuple[Any, Any]) -> None:
        begin, stream = begun
        end = self._event()
        self.backend.execute(RECORD, [end, stream])
        self.pending.append((seq, begin, end))

    def collect(self) -> list[list[int]]:
        """[seq, gpu_ns] for each message whose timed work has all finished, summed per message."""
        waiting = []
        for seq, begin, end in self.pending:
            try:
                self.backend.execute(QUERY, [end])
            except CudaError as exc:
                if exc.code != errors.NOT_READY:
                    raise
                waiting.append((seq, begin, end))
                continue
            self.sums[seq] += int(_float(self.backend.execute(ELAPSED, [4, begin, end])[0]) * 1e6)
            for event in (begin, end):
                self.backend.execute(DESTROY, [event])
        self.pending = waiting
        unfinished = {seq for seq, _, _ in waiting}
        finished = [[seq, ns] for seq, ns in self.sums.items() if seq not in unfinished]
        for seq, _ in finished:
            del self.sums[seq]
        return finished

    def _event(self) -> Any:
        return self.backend.execute(CREATE, [8, 0])[0]


def _stream(call: Call, args: list[Any]) -> Any:
    for p, a in zip(call.params, args):
        if p.ctype == "CUstream":
            return a
    return None  # a synchronous copy or memset: the legacy default stream


def _float(value: Any) -> float:
    return struct.unpack("<f", bytes(value))[0] if isinstance(value, (bytes, bytearray, memoryview)) else value
