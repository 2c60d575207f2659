"""Several servers, one client: which server a call goes to, and what crosses between servers.

XPU_SERVER may name several servers. The client then holds a session with each and shows their devices as one
list, in the order named (client/driver.py). A call goes to the server of the context it acts in: the current
one, or the context of the stream, event or memory the call names (`route`), as NVIDIA's driver lets a call name
another context's stream or memory. Two servers share nothing, so the client joins them where a program does:
- a copy between devices of two servers is staged through the client, in pieces;
- a stream that waits for another server's event waits here, until that event has happened;
- peer access between their devices is refused (client/devices.py).
Everything the fast lane could send to the wrong server goes through the client (driver.CROSSING).
"""

from __future__ import annotations

from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, DEFAULT_STREAMS, Call
from xpuremote.protocol.errors import CudaError

from . import marshal, memory
from .driver import ROUTE, Driver, implements
from .streams import capture_of, events, stream_of, streams

STAGE_BYTES = 64 << 20  # the client's buffer for a copy between servers: at most this much of it at a time
_OWNERS: dict[str, list[tuple[int, str]]] = {}  # symbol -> (parameter, what it names) that route may look at
_KINDS = {"CUstream": 0, "CUevent": 1, "CUdeviceptr": 2}  # which decides first: the stream a call runs on


def route(d: Driver, call: Call, args: list[Any]) -> int:
    """The context whose server `call` goes to: of its stream, else its event, else its first device address
    the client knows; 0 (the acting context) where it names none of them."""
    found = _OWNERS.get(call.symbol)
    if found is None:
        found = _OWNERS[call.symbol] = sorted(
            ((i, p.ctype) for i, p in enumerate(call.params) if p.ctype in _KINDS), key=lambda f: _KINDS[f[1]])
    for i, ctype in found:
        if type(args[i]) is not int:  # a packed argument (bytes the call carries) names no object
            continue
        ctx = owner(d, ctype, stream_of(call, args[i]) if ctype == "CUstream" else args[i])
        if ctx:
            return ctx
    return 0


def owner(d: Driver, ctype: str, value: int) -> int:
    """The context of a stream, an event or device memory; 0 where the client knows none."""
    if not value or (ctype == "CUstream" and value in DEFAULT_STREAMS):
        return 0
    if ctype == "CUstream":
        s = streams(d).get(value)
        return s.ctx if s is not None else 0
    if ctype == "CUevent":
        return events(d).get(value, 0)
    r = memory.maps(d)[0].find(value)
    return r.ctx if r is not None else 0


def server_of(d: Driver, ctx: int) -> int:
    return d.server_of(d.context(ctx))


ROUTE.append(route)


# ---- copies between devices ------------------------------------------------------------------------------
@implements("cuMemcpyDtoD", "cuMemcpyDtoDAsync", "cuMemcpyPeer", "cuMemcpyPeerAsync")
def cu_memcpy_dtod(d: Driver, call: Call, args: list[Any]) -> None:
    """Within one server as the table says; between two, staged (the peer forms' contexts add nothing: the
    addresses are unified)."""
    if call.family.startswith("cuMemcpyPeer"):
        dst, _, src, _, size, *tail = args
    else:
        dst, src, size, *tail = args
    stream = stream_of(call, tail[0]) if tail else None
    if len(d.sessions) > 1 and size:
        src_ctx, dst_ctx = owner(d, "CUdeviceptr", src), owner(d, "CUdeviceptr", dst)
        if src_ctx and dst_ctx and server_of(d, src_ctx) != server_of(d, dst_ctx):
            stage(d, dst, dst_ctx, src, src_ctx, size, stream)
            return
    d.forward(call, args)


def stage(d: Driver, dst: int, dst_ctx: int, src: int, src_ctx: int, size: int, stream: int | None) -> None:
    """A copy between two servers' devices, through the client: read from one and written to the other, in the
    stream's order on the server that has the stream, and done when this returns (nothing but the client orders
    two servers' work)."""
    if stream is not None and capture_of(d, stream) is not None:
        raise CudaError(errors.CAPTURE_UNSUPPORTED, "a copy between devices of two servers cannot be captured")
    on = server_of(d, owner(d, "CUstream", stream) or d.acting()) if stream is not None else None
    buffer = marshal.ffi.new("char[]", min(size, STAGE_BYTES))
    address = int(marshal.ffi.cast("uintptr_t", buffer))
    for offset in range(0, size, STAGE_BYTES):
        n = min(STAGE_BYTES, size - offset)
        with d.acting_in(src_ctx):
            if on == server_of(d, src_ctx):  # after the stream's earlier work (into pageable memory: waited)
                memory.cu_memcpy_dtoh_async(d, CALLS["cuMemcpyDtoHAsync_v2"], [address, src + offset, n, stream])
            else:
                memory.cu_memcpy_dtoh(d, CALLS["cuMemcpyDtoH_v2"], [address, src + offset, n])
        with d.acting_in(dst_ctx):
            if on == server_of(d, dst_ctx):  # from pageable memory: read before it returns
                memory.cu_memcpy_htod(d, CALLS["cuMemcpyHtoDAsync_v2"], [dst + offset, address, n, stream])
            else:
                memory.cu_memcpy_htod(d, CALLS["cuMemcpyHtoD_v2"], [dst + offset, address, n])
    if on is not None and on != server_of(d, dst_ctx):  # the stream's later work may read what was written
        with d.acting_in(dst_ctx):
            d.call(CALLS["cuCtxSynchronize"], [])


# ---- a stream waiting for another server's event ---------------------------------------------------------
def waited_here(d: Driver, call: Call, args: list[Any]) -> bool:
    """cuStreamWaitEvent on a stream of one server for an event of another: the event waited for here, at once,
    so the stream's later work comes after it; True if it was."""
    if len(d.sessions) < 2:
        return False
    stream, event = stream_of(call, args[0]), args[1]
    event_ctx = events(d).get(event, 0)
    stream_ctx = owner(d, "CUstream", stream) or d.acting()
    if not event_ctx or not stream_ctx or server_of(d, event_ctx) == server_of(d, stream_ctx):
        return False
    if capture_of(d, stream) is not None:
        raise CudaError(errors.CAPTURE_UNSUPPORTED, "a capture cannot wait for an event of another server")
    with d.acting_in(event_ctx):
        d.call(CALLS["cuEventSynchronize"], [event])
    return True
