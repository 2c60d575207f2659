"""Streams, events and host functions. Handles are made client-side (creation never waits);
their flags, priorities and contexts are remembered here so that queries are local."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, DEFAULT_STREAMS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError

from . import marshal
from .driver import CAPTURE_CHECK, Driver, implements


@dataclass
class Stream:
    flags: int
    priority: int
    ctx: int
    ident: int


def streams(d: Driver) -> dict[int, Stream]:
    return d.state.setdefault("streams", {})


def create(d: Driver, call: Call, args: list[Any], flags: int, priority: int, ctx: int = 0) -> None:
    """A stream in `ctx` (a green context's), or else in the current context; its priority clamped to the
    range, as CUDA does."""
    ctx = ctx or d.current_ctx()
    d.forward(call, args)
    handle = marshal.get(call.params[0], args[0])
    streams(d)[handle] = Stream(flags, max(-5, min(0, priority)), ctx, len(streams(d)) + 16)


@implements("cuStreamCreate")
def cu_stream_create(d: Driver, call: Call, args: list[Any]) -> None:
    create(d, call, args, args[1], 0)


@implements("cuStreamCreateWithPriority")
def cu_stream_create_with_priority(d: Driver, call: Call, args: list[Any]) -> None:
    _, flags, priority = args
    create(d, call, args, flags, priority)


@implements("cuStreamDestroy")
def cu_stream_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    if streams(d).pop(args[0], None) is None:
        raise CudaError(errors.INVALID_HANDLE, f"{args[0]:#x} is not a stream")
    capture = captures(d).pop(args[0], None)
    if capture is not None:  # its capture is over if it began here, invalidated if the stream only joined it
        invalidate(capture, "a stream of the capture was destroyed")
        if capture.origin == args[0]:
            for s in [s for s, c in captures(d).items() if c is capture]:
                del captures(d)[s]
    d.forward(call, args)


def stream(d: Driver, handle: int) -> Stream:
    if handle in DEFAULT_STREAMS:
        d.session()
        return Stream(0, 0, d.current_ctx(), handle)
    s = streams(d).get(handle)
    if s is None:
        raise CudaError(errors.INVALID_HANDLE, f"{handle:#x} is not a stream")
    return s


@implements("cuStreamGetFlags")
def cu_stream_get_flags(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.put(call.params[1], args[1], stream(d, args[0]).flags)


@implements("cuStreamGetPriority")
def cu_stream_get_priority(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.put(call.params[1], args[1], stream(d, args[0]).priority)


@implements("cuStreamGetCtx")
def cu_stream_get_ctx(d: Driver, call: Call, args: list[Any]) -> None:
    """_v2 names a green context's stream by the green context and its device's primary context."""
    ctx = stream(d, args[0]).ctx
    green = d.ctxs[ctx].green if len(args) > 2 and ctx in d.ctxs else 0
    marshal.put_u64(args[1], d.primaries[d.ctxs[ctx].device].handle if green else ctx)
    if len(args) > 2 and args[2]:
        marshal.put_u64(args[2], green)


@implements("cuStreamGetId")
def cu_stream_get_id(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.put(call.params[1], args[1], stream(d, args[0]).ident)


@implements("cuStreamGetDevice")
def cu_stream_get_device(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.put(call.params[1], args[1], d.context(stream(d, args[0]).ctx).device)


# ---- capture state (client/graphs.py begins and ends captures) ----------------------------------
LEGACY = (0, 1)  # the NULL stream and CU_STREAM_LEGACY
NON_BLOCKING = ENUMS["CU_STREAM_NON_BLOCKING"]


@dataclass
class Capture:
    ident: int
    origin: int  # the stream it began on, where it must end
    graph: int  # the client's handle of the graph being captured
    mode: int
    thread: int  # the thread that began it: a capture not RELAXED must end there
    invalid: str = ""  # why the capture is invalidated, once something illegal was done in it
    arrays: dict[int, Any] = field(default_factory=dict)  # stream -> the node array last reported for it


def captures(d: Driver) -> dict[int, Capture]:
    """Stream handle -> the capture it is part of."""
    return d.state.setdefault("captures", {})


def capture_events(d: Driver) -> dict[int, Capture]:
    """Event handle -> the capture it was last recorded in (a stream that waits for it joins)."""
    return d.state.setdefault("capture_events", {})


def stream_of(call: Call, handle: int) -> int:
    return 2 if call.per_thread and not handle else handle


def capture_of(d: Driver, handle: int) -> Capture | None:
    """The capture `handle` is part of; work on the legacy stream while a blocking stream captures
    is an implicit dependency on captured work, which the driver refuses (and so does this)."""
    active = captures(d)
    if handle in LEGACY and active:
        blocking = [c for s, c in active.items() if s not in DEFAULT_STREAMS and not streams(d)[s].flags & NON_BLOCKING]
        if blocking:
            invalidate(blocking[0], "the legacy stream was used while a blocking stream was capturing")
            raise CudaError(errors.CAPTURE_IMPLICIT, "the legacy stream synchronises with a capturing stream")
    return active.get(handle)


def check_work(d: Driver, call: Call, args: list[Any]) -> None:
    """Stream work on the legacy stream while a blocking stream captures is refused (capture_of);
    the driver's copies and memsets without a stream are the legacy stream's."""
    for p, a in zip(call.params, args):
        if p.ctype == "CUstream":
            capture_of(d, stream_of(call, a))
            return
    if call.family.startswith(("cuMemcpy", "cuMemset")) and not call.per_thread:
        capture_of(d, 0)


CAPTURE_CHECK.append(check_work)


def invalidate(capture: Capture, why: str) -> None:
    capture.invalid = capture.invalid or why


HOST_COPY = "a copy between host memory and the GPU"


def refuse_in_capture(d: Driver, handle: int, what: str) -> None:
    """Work that cannot be part of a graph over the network: refused, and the capture invalidated."""
    capture = captures(d).get(handle)
    if capture is not None:
        invalidate(capture, what)
        raise CudaError(errors.NOT_SUPPORTED, f"{what} cannot be captured into a graph: a replay on the server "
                        "cannot reach the application's host memory")


# ---- host functions: a reverse call --------------------------------------------------------------
def enqueue_host_function(d: Driver, handle: int, fn: Any) -> None:
    """The server stops when it reaches this point of the stream's work and answers; the
    function then runs on the client's host-function thread, which says `done`, and the server
    goes on. The caller does not wait."""
    token = d.new_handle()
    conn = d.session()
    conn.call_later(CALLS["xpuHostFunc"], [handle, token], d.wire_ctx(),
                    lambda status, outs: conn.run_host_function(fn, token))


@implements("cuLaunchHostFunc")
def cu_launch_host_func(d: Driver, call: Call, args: list[Any]) -> None:
    handle, fn, user_data = args
    if not fn:
        raise CudaError(errors.INVALID_VALUE)
    stream(d, handle)
    host_fn = marshal.ffi.cast("void (*)(void *)", fn)
    handle = stream_of(call, handle)
    refuse_in_capture(d, handle, "a host function")
    enqueue_host_function(d, handle, lambda: host_fn(marshal.ffi.cast("void *", user_data)))


@implements("cuStreamAddCallback")
def cu_stream_add_callback(d: Driver, call: Call, args: list[Any]) -> None:
    handle, fn, user_data, _flags = args
    if not fn:
        raise CudaError(errors.INVALID_VALUE)
    stream(d, handle)
    refuse_in_capture(d, stream_of(call, handle), "a stream callback")
    callback = marshal.ffi.cast("void (*)(void *, int, void *)", fn)
    enqueue_host_function(d, handle, lambda: callback(marshal.ffi.cast("void *", handle), 0,
                                                      marshal.ffi.cast("void *", user_data)))


# ---- events -----------------------------------------------------------------------------------------
def events(d: Driver) -> dict[int, int]:
    """Each event's context."""
    return d.state.setdefault("events", {})


@implements("cuEventCreate")
def cu_event_create(d: Driver, call: Call, args: list[Any]) -> None:
    ctx = d.current_ctx()
    d.forward(call, args)
    events(d)[marshal.get(call.params[0], args[0])] = ctx


@implements("cuEventDestroy")
def cu_event_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    if args[0] not in events(d):
        raise CudaError(errors.INVALID_HANDLE, f"{args[0]:#x} is not an event")
    d.forward(call, args)
    del events(d)[args[0]]
