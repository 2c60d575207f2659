"""What a session's calls do to the GPU's queues, for a client's trace (protocol/trace.py, GPU_OPS): each
kernel's, copy's, memset's, graph launch's and math library call's GPU time on its stream (a library call's: the
stream its handle was given), the events recorded and waited for, and how long the server waited for the GPU in
each synchronizing call. xpu-perf keeps a queue per stream with them.

On the cuda backend a work's GPU time is measured with a pair of events recorded around it on its own stream,
taken from a pool (never created per call) and read without stalling anything: each answer looks at the oldest
pending pairs with cuEventQuery and stops at the first not done, so it costs a query while the GPU is behind;
only the session's last answer (`bye`) waits for the rest. A stream being captured into a graph gets no events
(they would become nodes of the graph). On the sim, which runs each call to its end before the next, a work's
GPU time is the sim's own time running it: a stand-in, measured on the host, not a GPU's.

On by default while the client records a trace (XPU_TRACE_GPU=0 turns it off).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import Call
from xpuremote.protocol.trace import RECORD, SYNC_ALL, SYNC_EVENT, SYNC_STREAM, WAIT, WORK

from .backends.base import Backend

GPU_WORK = ("cuLaunch", "xpuLaunch", "cuMemcpy", "xpuMemcpy", "cuMemset")
TIMED_WORK = (*GPU_WORK, "cuGraphLaunch")
NOT_TIMED = ("cuLaunchHostFunc",)  # on a stream, but the client's CPU runs it
# copies that return once done (the host waits for the GPU); one between two device buffers does not wait. A copy
# to the server's host memory waits too, async or not: its bytes are read there to be answered, and the driver
# returns from an async copy to pageable memory once it is done
TO_HOST = ("DtoH", "AtoH", "ToHost")
SYNC_COPIES = ("cuMemcpy", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpy2D", "cuMemcpy2DUnaligned", "cuMemcpy3D",
               "cuMemcpy3DPeer", "cuMemcpyPeer", "cuMemcpyAtoH", "cuMemcpyHtoA", "xpuMemcpy2DFromHost",
               "xpuMemcpy2DToHost", "xpuMemcpyArrayFromHost", "xpuMemcpyArrayToHost")
ON_HANDLES = ("xpuCudnnExecute",)  # the client's form of a library's call: on its handle's stream (its first argument)
LIBRARY_SETTINGS = ("Set", "Get", "Create", "Destroy")  # a library's calls that queue no work, device data or not
STREAMS = ("CUstream", "cudaStream_t")
LEGACY, PER_THREAD = 1, 2  # CU_STREAM_LEGACY (the same queue as stream 0), CU_STREAM_PER_THREAD
CAPTURE_BEGIN, CAPTURE_END = "xpuStreamBeginCapture", "xpuStreamEndCapture"
MARKS = ("cuEventRecord", "cuEventRecordWithFlags", "cuStreamWaitEvent")
SYNCS = {"cuCtxSynchronize": SYNC_ALL, "cuStreamSynchronize": SYNC_STREAM, "cuEventSynchronize": SYNC_EVENT}

Run = Callable[[list[Any]], Any]


def is_gpu_work(call: Call) -> bool:
    """A call that queues work on a stream, host functions included (what the sim's captures record)."""
    return call.family.startswith(GPU_WORK)


def is_timed_work(call: Call) -> bool:
    """A call whose GPU time the timer measures: the driver's work, and a math library's (or NCCL's) call on device
    data (a cuDNN plan's execution names its data in a variant pack), not its settings."""
    if call.family in ON_HANDLES:
        return True
    if call.library == "cuda":
        return call.family.startswith(TIMED_WORK) and not call.family.startswith(NOT_TIMED)
    return (any(p.is_address for p in call.params) or call.family.endswith("Execute")) and \
        not any(word in call.family for word in LIBRARY_SETTINGS)


def sets_stream(call: Call) -> bool:
    """A math library's setter of the stream its handle queues work on (cublasSetStream, cudnnSetStream, ...)."""
    return call.library != "cuda" and call.family.endswith("SetStream") and _index(call, *STREAMS) is not None


def _index(call: Call, *ctypes: str) -> int | None:
    return next((i for i, p in enumerate(call.params) if p.ctype in ctypes), None)


def _stream(value: Any) -> int:
    """A client's stream handle as the trace numbers queues: the legacy stream is stream 0."""
    return 0 if not value or value == LEGACY else value


class HostClock:
    """The sim's stand-in: a call's GPU time is the host time the sim spent running it."""

    def __init__(self) -> None:
        self.capturing = 0

    def timed(self, run: Run, decoded: list[Any], stream: Any) -> tuple[Any, Any]:
        began = time.monotonic_ns()
        outs = run(decoded)
        return outs, time.monotonic_ns() - began

    def read(self, token: Any, final: bool) -> int | None:
        return token

    def close(self) -> None:
        pass


class EventClock:
    """A GPU's own time for a call: events recorded on its stream before and after it (cuda backend)."""

    def __init__(self, backend: Backend) -> None:
        self.ffi, self.lib = backend.ffi, backend.lib
        self.spare: list[Any] = []  # events made for this and done with
        self.made: list[Any] = []
        self.capturing = 0  # captures begun and not ended: only then is a stream asked whether it captures
        self.status, self.ms = self.ffi.new("int *"), self.ffi.new("float *")

    def timed(self, run: Run, decoded: list[Any], stream: Any) -> tuple[Any, Any]:
        handle = self.ffi.cast("void *", stream or 0)
        if self.capturing and (self.lib.cuStreamIsCapturing(handle, self.status) or self.status[0]):
            return run(decoded), None  # recorded into the graph, they would change it
        begin, end = self._event(), self._event()
        if begin is None or end is None or self.lib.cuEventRecord(begin, handle):
            self._give_back(begin, end)
            return run(decoded), None
        try:
            outs = run(decoded)
        except BaseException:
            self._give_back(begin, end)  # recorded or not, an event may be recorded again
            raise
        if self.lib.cuEventRecord(end, handle):  # the call broke its stream, say: nothing to read
            self._give_back(begin, end)
            return outs, None
        return outs, (begin, end)

    def read(self, token: tuple[Any, Any], final: bool) -> int | None:
        """The pair's elapsed ns; None while the work runs (or, `final`, after waiting for it); -1 if it cannot
        be read (a context gone, a stream destroyed with the work)."""
        begin, end = token
        status = self.lib.cuEventSynchronize(end) if final else self.lib.cuEventQuery(end)
        if status == errors.NOT_READY:
            return None
        ns = -1
        if not status and not self.lib.cuEventElapsedTime(self.ms, begin, end):
            ns = int(self.ms[0] * 1e6)
        self._give_back(begin, end)
        return ns

    def _event(self) -> Any:
        if self.spare:
            return self.spare.pop()
        out = self.ffi.new("void **")
        if self.lib.cuEventCreate(out, 0):  # CU_EVENT_DEFAULT: timed
            return None
        self.made.append(out[0])
        return out[0]

    def _give_back(self, *events: Any) -> None:
        self.spare.extend(e for e in events if e is not None)

    def close(self) -> None:
        for event in self.made:
            self.lib.cuEventDestroy_v2(event)
        self.made.clear()
        self.spare.clear()


class GpuTimer:
    """A session's GPU operations, message by message, handed back with the answers (`collect`)."""

    def __init__(self, backend: Backend) -> None:
        self.clock: HostClock | EventClock = EventClock(backend) if backend.name == "cuda" else HostClock()
        self.ops: list[Any] = []  # this message's, flat: pos, op, a, b (b a clock's token for WORK until read)
        self.pending: collections.deque[tuple[int, list[Any], list[int]]] = collections.deque()  # seq, ops, works
        self.pos = 0  # the item of the message being run
        self.library_streams: dict[Any, tuple[Any, Any]] = {}  # a library handle -> its stream, client's and backend's

    def touches(self, call: Call) -> bool:
        """Whether `call` does something to the GPU's queues that the timer records (`wrap` wraps it)."""
        return is_timed_work(call) or call.family in MARKS or call.family in SYNCS or sets_stream(call) or \
            call.family in (CAPTURE_BEGIN, CAPTURE_END)

    def wrap(self, call: Call, run: Run) -> Run | None:
        """`run` (the backend's, taking decoded arguments) timed for `call`, given its raw arguments too; None
        for a call that does nothing to the GPU's queues."""
        family = call.family
        stream_at, event_at = _index(call, *STREAMS), _index(call, "CUevent", "cudaEvent_t")
        ops, clock, streams = self.ops, self.clock, self.library_streams
        if family in (CAPTURE_BEGIN, CAPTURE_END):
            def capture(raw: list[Any], decoded: list[Any]) -> Any:
                outs = run(decoded)
                clock.capturing = max(0, clock.capturing + (1 if family == CAPTURE_BEGIN else -1))
                return outs
            return capture
        if sets_stream(call):
            def set_stream(raw: list[Any], decoded: list[Any]) -> Any:
                outs = run(decoded)
                streams[raw[0]] = raw[stream_at], decoded[stream_at]
                return outs
            return set_stream
        if is_timed_work(call):
            sync = stream_at is None and family in SYNC_COPIES or any(k in family for k in TO_HOST)
            default = PER_THREAD if call.per_thread else None  # the stream of a call that names none
            library = (call.library != "cuda" or family in ON_HANDLES) and stream_at is None  # on its handle's stream

            def work(raw: list[Any], decoded: list[Any]) -> Any:
                if library:
                    queue, stream = streams.get(raw[0] if raw else None, (default, default))
                else:
                    queue = raw[stream_at] if stream_at is not None else default
                    stream = decoded[stream_at] if stream_at is not None else default
                began = time.monotonic_ns()
                outs, token = clock.timed(run, decoded, stream)
                queue = _stream(queue)
                if token is not None:
                    ops.extend((self.pos, WORK, queue, token))
                if sync:
                    ops.extend((self.pos, SYNC_STREAM, queue, time.monotonic_ns() - began))
                return outs
            return work
        if family in MARKS:
            op = WAIT if family == "cuStreamWaitEvent" else RECORD

            def mark(raw: list[Any], decoded: list[Any]) -> Any:
                outs = run(decoded)
                ops.extend((self.pos, op, _stream(raw[stream_at]), raw[event_at]))
                return outs
            return mark
        sync_op = SYNCS.get(family)
        if sync_op is None:
            return None
        target_at = event_at if sync_op == SYNC_EVENT else stream_at

        def sync(raw: list[Any], decoded: list[Any]) -> Any:
            began = time.monotonic_ns()
            outs = run(decoded)
            target = raw[target_at] if target_at is not None else 0
            ops.extend((self.pos, sync_op, _stream(target) if sync_op == SYNC_STREAM else target,
                        time.monotonic_ns() - began))
            return outs
        return sync

    def end_message(self, seq: int) -> None:
        """The message `seq` has been run: its operations wait for their GPU times."""
        if self.ops:
            ops = list(self.ops)
            self.ops.clear()
            self.pending.append((seq, ops, [i + 3 for i in range(0, len(ops), 4) if ops[i + 1] == WORK]))
        self.pos = 0

    def collect(self, final: bool = False) -> list[list[Any]]:
        """[seq, ops] for each message whose GPU work is all done (in order, up to the first that is not; `final`:
        all, waiting for them)."""
        out = []
        read = self.clock.read
        while self.pending:
            seq, ops, works = self.pending[0]
            while works:
                ns = read(ops[works[0]], final)
                if ns is None:
                    return out
                ops[works.pop(0)] = ns
            self.pending.popleft()
            kept = [v for i in range(0, len(ops), 4) if ops[i + 3] != -1 or ops[i + 1] != WORK
                    for v in ops[i:i + 4]]  # a work whose time could not be read is left out
            out.append([seq, kept])
        return out

    def close(self) -> None:
        self.clock.close()
