"""Streams, events and host functions. Handles are made client-side (creation never waits);
their flags, priorities and contexts are remembered here so that queries are local."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, DEFAULT_STREAMS, Call
from xpuremote.protocol.errors import CudaError

from . import marshal
from .driver import Driver, implements


@dataclass
class Stream:
    flags: int
    priority: int
    ctx: int
    ident: int


def streams(d: Driver) -> dict[int, Stream]:
    return d.state.setdefault("streams", {})


def create(d: Driver, call: Call, args: list[Any], flags: int, priority: int) -> None:
    ctx = d.current_ctx()
    d.forward(call, args)
    handle = marshal.get(call.params[0], args[0])
    streams(d)[handle] = Stream(flags, priority, ctx, len(streams(d)) + 16)


@implements("cuStreamCreate")
def cu_stream_create(d: Driver, call: Call, args: list[Any]) -> None:
    create(d, call, args, args[1], 0)


@implements("cuStreamCreateWithPriority")
def cu_stream_create_with_priority(d: Driver, call: Call, args: list[Any]) -> None:
    _, flags, priority = args
    create(d, call, args, flags, max(-5, min(0, priority)))  # clamped to the range, as CUDA does


@implements("cuStreamDestroy")
def cu_stream_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    if streams(d).pop(args[0], None) is None:
        raise CudaError(errors.INVALID_HANDLE, f"{args[0]:#x} is not a stream")
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
    marshal.put_u64(args[1], stream(d, args[0]).ctx)
    if len(args) > 2 and args[2]:
        marshal.put_u64(args[2], 0)  # not a green context


@implements("cuStreamGetId")
def cu_stream_get_id(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.put(call.params[1], args[1], stream(d, args[0]).ident)


@implements("cuStreamGetDevice")
def cu_stream_get_device(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.put(call.params[1], args[1], d.context(stream(d, args[0]).ctx).device)


@implements("cuStreamIsCapturing")
def cu_stream_is_capturing(d: Driver, call: Call, args: list[Any]) -> None:
    stream(d, args[0])
    marshal.put(call.params[1], args[1], 0)  # CU_STREAM_CAPTURE_STATUS_NONE: capture is not forwarded yet


@implements("cuStreamGetCaptureInfo")
def cu_stream_get_capture_info(d: Driver, call: Call, args: list[Any]) -> None:
    """Not capturing (PyTorch asks before drawing random numbers); the graph outputs are NULL/0."""
    stream(d, args[0])
    for p, address in zip(call.params[1:], args[1:]):
        if address:
            marshal.write(address, bytes(4 if p.name == "captureStatus_out" else 8))


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
    handle = 2 if call.per_thread and not handle else handle
    enqueue_host_function(d, handle, lambda: host_fn(marshal.ffi.cast("void *", user_data)))


@implements("cuStreamAddCallback")
def cu_stream_add_callback(d: Driver, call: Call, args: list[Any]) -> None:
    handle, fn, user_data, _flags = args
    if not fn:
        raise CudaError(errors.INVALID_VALUE)
    stream(d, handle)
    callback = marshal.ffi.cast("void (*)(void *, int, void *)", fn)
    enqueue_host_function(d, handle, lambda: callback(marshal.ffi.cast("void *", handle), 0,
                                                      marshal.ffi.cast("void *", user_data)))


# ---- events -----------------------------------------------------------------------------------------
@implements("cuEventCreate")
def cu_event_create(d: Driver, call: Call, args: list[Any]) -> None:
    d.current_ctx()
    d.forward(call, args)
    d.state.setdefault("events", set()).add(marshal.get(call.params[0], args[0]))


@implements("cuEventDestroy")
def cu_event_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    events = d.state.setdefault("events", set())
    if args[0] not in events:
        raise CudaError(errors.INVALID_HANDLE, f"{args[0]:#x} is not an event")
    events.discard(args[0])
    d.forward(call, args)
