"""The fast lane, from the client's side: what the shim's C entry points may queue themselves.

The hot asynchronous calls (protocol.calls.LANE) are appended in C to one buffer as records
(interpose/lane.h), without entering Python, while the lane is open. The client takes the records
before it queues anything of its own, so that everything reaches the server in the order the
application made it, and sends them as one `xpuLane` call of its batch.

The lane is open only where a record needs nothing the client would do: a session without per-call logging
or CUDA_LAUNCH_BLOCKING, no stream capture under way, and contexts the server already has (an emulated link
keeps it: the link delays the lane's batches as it does every message). In a traced
session each record also gets a stamp in C (protocol/records.py's lane_stamp: when it was queued, the
lane's time on it, its call and stream), taken with the records for the trace (client/trace.py).
A launch takes the lane once the client has learnt the kernel's argument layout (its first launch
goes the usual way), a graph's launch once the client has seen that the instantiation has no host copies.
Everything else the lane declines goes through the client as before.
"""

from __future__ import annotations

from typing import Any

from xpuremote.protocol import abi
from xpuremote.protocol.calls import CALLS, LANE_LAUNCH, SYMBOLS

KINDS = {"args": abi.LANE_PLAIN, "launch": abi.LANE_LAUNCH, "known": abi.LANE_KNOWN}  # calls.LANE's words
LANE_CALL = CALLS["xpuLane"]


class Lane:
    """The C lane of this process (the shim's), driven through the core's cffi module."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib
        self.buf = ffi.new("unsigned char[]", abi.LANE_BYTES)
        self.state = ffi.new("uint64_t[3]")
        self.kernels: set[int] = set()
        self.known: set[int] = set()
        self.contexts: set[int] = set()
        self.is_open = False
        for op, symbol in enumerate(SYMBOLS):
            call = CALLS[symbol]
            if call.lane:
                stream = next((i for i, p in enumerate(call.params) if p.ctype == "CUstream"), -1)
                nargs = len(CALLS[LANE_LAUNCH].params) if call.lane == "launch" else len(call.params)
                opcode = CALLS[LANE_LAUNCH].opcode if call.lane == "launch" else call.opcode
                lib.xpu_lane_allow(op, opcode, KINDS[call.lane], nargs, stream_arg(stream, call.per_thread))

    def decline(self, families: tuple[str, ...]) -> None:
        """These calls (every variant) go through the client from now on."""
        for op, symbol in enumerate(SYMBOLS):
            call = CALLS[symbol]
            if call.lane and call.family in families:
                self.lib.xpu_lane_allow(op, call.opcode, abi.LANE_OFF, 0, -1)

    def open(self, alarm_fd: int, window_s: float, traced: bool = False) -> None:
        """Records may be queued; the first of a batch sets the flusher's alarm to the batch window. `traced`:
        each record is stamped, and `take` gives the stamps."""
        self.is_open = True
        state = abi.LANE_OPEN_TRACED if traced else abi.LANE_OPEN_OPEN
        self.lib.xpu_lane_set_open(state, alarm_fd, int(window_s * 1e9))

    def close(self) -> None:
        """Every call goes through the client (records already queued are still taken)."""
        if self.is_open:
            self.is_open = False
            self.lib.xpu_lane_set_open(abi.LANE_OPEN_CLOSED, -1, 0)

    def take(self) -> tuple[bytes, int, int, bytes] | None:
        """The records queued so far, the count of records ever queued, the last one's context and the records'
        stamps (lane_stamp each; empty where the lane was not opened traced); or None."""
        n = self.lib.xpu_lane_take(self.buf, self.state)
        if not n:
            return None
        stamps = self.state[2]
        return (self.ffi.buffer(self.buf, n)[:], self.state[0], self.state[1],
                self.ffi.buffer(self.buf + n, stamps * abi.LANE_STAMP_SIZE)[:] if stamps else b"")

    def waiting(self) -> bool:
        return bool(self.lib.xpu_lane_waiting())

    def appended(self) -> int:
        return self.lib.xpu_lane_appended()

    def context(self, ctx: int, ready: bool = True) -> None:
        """Whether the server has context `ctx` (a record names its context, which must exist there)."""
        if ready and ctx not in self.contexts:
            self.contexts.add(ctx)
            self.lib.xpu_lane_context(ctx, 1)
        elif not ready and ctx in self.contexts:
            self.contexts.discard(ctx)
            self.lib.xpu_lane_context(ctx, 0)

    def kernel(self, handle: int, server: int, params: list[tuple[int, int]], size: int) -> None:
        """Launches of `handle` may take the lane: its arguments at (offset, size), `size` bytes in all."""
        if handle not in self.kernels:
            self.kernels.add(handle)
            offsets = self.ffi.new("uint32_t[]", [o for o, _ in params] or [0])
            sizes = self.ffi.new("uint32_t[]", [s for _, s in params] or [0])
            self.lib.xpu_lane_kernel(handle, server, len(params), offsets, sizes, size)

    def allow(self, handle: int) -> None:
        """Calls of kind `known` naming `handle` first may take the lane (a graph instantiation's launches)."""
        if handle not in self.known:
            self.known.add(handle)
            self.lib.xpu_lane_known(handle, 1)

    def forget(self, handle: int) -> None:
        if handle in self.known:
            self.known.discard(handle)
            self.lib.xpu_lane_known(handle, 0)

    def forget_kernel(self, handle: int) -> None:
        if handle in self.kernels:
            self.kernels.discard(handle)
            self.lib.xpu_lane_kernel(handle, 0, -1, self.ffi.NULL, self.ffi.NULL, 0)


def stream_arg(stream: int, per_thread: bool) -> int:
    """xpu_lane_allow's stream argument: a per-thread op's stream (0 there is CU_STREAM_PER_THREAD), another op's
    marked as read only by a trace's stamps (lane.h's XPU_LANE_STREAM_NOTED), or -1: none."""
    if stream < 0 or per_thread:
        return stream
    return stream + abi.LANE_STREAM_NOTED
