"""Stream capture and CUDA graphs. The capture itself happens on the server's driver, which
records the stream's work into a graph instead of running it; the client keeps each stream's
capture state, so that what PyTorch asks before every allocation and event (is this stream
capturing, in which capture) is answered without a message.

A capture begins on one stream (its origin) and other streams join it by waiting for an event
recorded in it; it ends at the origin, for every stream that joined. A graph's handle is made
by the client when the capture begins (`xpuStreamBeginCapture`), so that the graph being
captured has a handle to report before the capture ends.

What cannot be captured over a network is refused, and invalidates the capture as the driver
does for illegal work: copies between host memory and the GPU and host functions (a replay would
read or write the application's memory, which is on the client, at the time of the replay).
"""

from __future__ import annotations

import itertools
import struct
import threading
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, DEFAULT_STREAMS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import INSTANTIATE_PARAMS

from . import graph_state, marshal, servers
from .driver import Driver, implements
from .streams import LEGACY, Capture, capture_events, capture_of, captures, invalidate, stream, stream_of

NONE, ACTIVE, INVALIDATED = (ENUMS[f"CU_STREAM_CAPTURE_STATUS_{s}"] for s in ("NONE", "ACTIVE", "INVALIDATED"))
GLOBAL, RELAXED = ENUMS["CU_STREAM_CAPTURE_MODE_GLOBAL"], ENUMS["CU_STREAM_CAPTURE_MODE_RELAXED"]
_ids = itertools.count(1)  # capture ids are unique over the process's life
_mode = threading.local()  # each thread's capture mode (cuThreadExchangeStreamCaptureMode)


# ---- beginning and ending ------------------------------------------------------------------------------
@implements("cuStreamBeginCapture")
def cu_stream_begin_capture(d: Driver, call: Call, args: list[Any]) -> None:
    handle = stream_of(call, args[0])
    mode = args[1] if len(args) > 1 else GLOBAL
    if handle in LEGACY:
        raise CudaError(errors.CAPTURE_UNSUPPORTED, "the legacy stream cannot be captured")
    stream(d, handle)
    if mode not in (0, 1, 2):
        raise CudaError(errors.INVALID_VALUE, f"capture mode {mode}")
    if handle in captures(d):
        raise CudaError(errors.ILLEGAL_STATE, f"stream {handle:#x} is already capturing")
    graph = d.new_handle()
    captures(d)[handle] = Capture(next(_ids), handle, graph, mode, threading.get_ident())
    d.lane_gate()  # closed: the work of a capture goes through the client
    try:
        d.post(CALLS["xpuStreamBeginCapture"], [graph, handle, mode])
    except CudaError:
        del captures(d)[handle]
        d.lane_gate()
        raise


@implements("cuStreamEndCapture")
def cu_stream_end_capture(d: Driver, call: Call, args: list[Any]) -> None:
    handle, graph_out = stream_of(call, args[0]), args[1]
    stream(d, handle)
    capture = captures(d).get(handle)
    if capture is None:
        raise CudaError(errors.ILLEGAL_STATE, f"stream {handle:#x} is not capturing")
    if capture.origin != handle:
        raise CudaError(errors.CAPTURE_UNMATCHED, "a capture ends on the stream where it began")
    if capture.mode != RELAXED and capture.thread != threading.get_ident():
        raise CudaError(errors.CAPTURE_WRONG_THREAD, "the capture began in another thread")
    if graph_out:
        marshal.put_u64(graph_out, 0)
    for s in [s for s, c in captures(d).items() if c is capture]:
        del captures(d)[s]
    for e in [e for e, c in capture_events(d).items() if c is capture]:
        del capture_events(d)[e]
    try:
        d.call(CALLS["xpuStreamEndCapture"], [handle, capture.graph])
    except CudaError:
        graph_state.forget_graph(d, capture.graph)  # the server dropped the graph it invalidated
        raise
    finally:
        d.lane_gate()
    if capture.invalid:  # what this end refused: the server's graph is complete, and of no use
        d.post(CALLS["cuGraphDestroy"], [capture.graph])
        graph_state.forget_graph(d, capture.graph)
        raise CudaError(errors.CAPTURE_INVALIDATED, capture.invalid)
    if graph_out:
        marshal.put_u64(graph_out, capture.graph)


@implements("cuThreadExchangeStreamCaptureMode")
def cu_thread_exchange_stream_capture_mode(d: Driver, call: Call, args: list[Any]) -> None:
    """Kept per thread. The server's captures are all RELAXED (its worker thread serves every
    application thread), so the prohibitions of the stricter modes are not enforced."""
    (address,) = args
    if not address:
        raise CudaError(errors.INVALID_VALUE)
    mode = marshal.get(call.params[0], address)
    if mode not in (0, 1, 2):
        raise CudaError(errors.INVALID_VALUE, f"capture mode {mode}")
    marshal.put(call.params[0], address, getattr(_mode, "value", GLOBAL))
    _mode.value = mode


# ---- questions: answered here ---------------------------------------------------------------------------
def _status(capture: Capture | None) -> int:
    return NONE if capture is None else INVALIDATED if capture.invalid else ACTIVE


@implements("cuStreamIsCapturing")
def cu_stream_is_capturing(d: Driver, call: Call, args: list[Any]) -> None:
    handle = stream_of(call, args[0])
    stream(d, handle)
    marshal.put(call.params[1], args[1], _status(capture_of(d, handle)))


@implements("cuStreamGetCaptureInfo")
def cu_stream_get_capture_info(d: Driver, call: Call, args: list[Any]) -> None:
    """Status, id and graph are known here; the nodes the stream's next work will depend on are the
    server's, asked for only when the caller wants them."""
    handle = stream_of(call, args[0])
    stream(d, handle)
    capture = capture_of(d, handle)
    outs = dict(zip(call.names[1:], args[1:]))
    if not outs["captureStatus_out"] or (outs.get("edgeData_out") and not outs.get("dependencies_out")):
        raise CudaError(errors.INVALID_VALUE, "captureStatus_out is required, and edgeData_out needs dependencies_out")
    marshal.put(call.params[1], outs["captureStatus_out"], _status(capture))
    if capture is None:
        return
    if outs.get("id_out"):
        marshal.put_u64(outs["id_out"], capture.ident)
    if outs.get("graph_out"):
        marshal.put_u64(outs["graph_out"], capture.graph)
    if outs.get("dependencies_out") or outs.get("numDependencies_out"):
        nodes = _dependencies(d, capture, handle)
        for name, value in (("dependencies_out", _address(nodes[0])), ("edgeData_out", _address(nodes[1])),
                            ("numDependencies_out", len(nodes[0]))):
            if outs.get(name):
                marshal.put_u64(outs[name], value)


def _dependencies(d: Driver, capture: Capture, handle: int) -> tuple[Any, Any]:
    """The server's answer, kept in arrays that live until the next question about the stream, as the
    driver's do; the edges are plain (all zero)."""
    (found,) = d.call(CALLS["xpuStreamGetCaptureDependencies"], [handle, 1])
    arrays = (marshal.ffi.new("uint64_t[]", found), marshal.ffi.new("uint64_t[]", len(found)))
    capture.arrays[handle] = arrays
    return arrays


def _address(array: Any) -> int:
    return int(marshal.ffi.cast("uintptr_t", array)) if len(array) else 0


# ---- work that joins a capture or breaks it ---------------------------------------------------------------
@implements("cuEventRecord", "cuEventRecordWithFlags")
def cu_event_record(d: Driver, call: Call, args: list[Any]) -> None:
    capture = capture_of(d, stream_of(call, args[1]))
    if capture is not None:
        capture_events(d)[args[0]] = capture
    elif capture_events(d).pop(args[0], None) is not None:
        d.lane_gate()  # perhaps the last event recorded in a capture
    d.forward(call, args)


@implements("cuStreamWaitEvent")
def cu_stream_wait_event(d: Driver, call: Call, args: list[Any]) -> None:
    """A stream that waits for an event recorded in a capture joins that capture."""
    handle = stream_of(call, args[0])
    joined = capture_events(d).get(args[1])
    mine = capture_of(d, handle)
    if joined is not None and mine is not None and mine is not joined:
        invalidate(mine, "a capture waited for an event of another capture")
        invalidate(joined, "a capture waited for an event of another capture")
    elif joined is not None and mine is None:
        if handle in DEFAULT_STREAMS:
            raise CudaError(errors.CAPTURE_IMPLICIT, "a default stream cannot join a capture")
        captures(d)[handle] = joined
    if not servers.waited_here(d, call, args):
        d.forward(call, args)


@implements("cuStreamSynchronize", "cuStreamQuery")
def cu_stream_wait(d: Driver, call: Call, args: list[Any]) -> None:
    handle = stream_of(call, args[0])
    capture = capture_of(d, handle)
    if capture is not None:
        invalidate(capture, f"{call.family} of a capturing stream")
        raise CudaError(errors.CAPTURE_UNSUPPORTED, f"{call.family} of a stream that is capturing")
    d.forward(call, args)


# ---- instantiation and node counts -----------------------------------------------------------------------
INSTANTIATE = CALLS["cuGraphInstantiateWithFlags"]


def instantiate(d: Driver, exec_out: int, graph: int, flags: int) -> None:
    if not exec_out:
        raise CudaError(errors.INVALID_VALUE, "phGraphExec is NULL")
    (handle,) = d.call(INSTANTIATE, [8, graph, flags])
    marshal.write(exec_out, handle)
    graph_exec = int.from_bytes(handle, "little")
    graph_state.instantiated(d, graph, graph_exec)
    graph_state.hold_memory(d, graph, graph_exec)


@implements("cuGraphInstantiateWithFlags")
def cu_graph_instantiate_with_flags(d: Driver, call: Call, args: list[Any]) -> None:
    instantiate(d, *args)


@implements("cuGraphInstantiate")
def cu_graph_instantiate(d: Driver, call: Call, args: list[Any]) -> None:
    """The older form: an error node and a log, which a server's error is not mapped to."""
    exec_out, graph, error_node, log_buffer, log_size = args
    if error_node:
        marshal.put_u64(error_node, 0)
    if log_buffer and log_size:
        marshal.write(log_buffer, b"\0")
    instantiate(d, exec_out, graph, 0)


@implements("cuGraphInstantiateWithParams")
def cu_graph_instantiate_with_params(d: Driver, call: Call, args: list[Any]) -> None:
    exec_out, graph, params = args
    if not params:
        raise CudaError(errors.INVALID_VALUE, "instantiateParams is NULL")
    flags, upload, _error_node, _result = INSTANTIATE_PARAMS.unpack(marshal.read(params, INSTANTIATE_PARAMS.size))
    result = 1  # CUDA_GRAPH_INSTANTIATE_ERROR, until it is known to have worked
    try:
        instantiate(d, exec_out, graph, flags & ~ENUMS["CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD"])
        result = 0
    finally:
        marshal.write(params + 16, bytes(8) + result.to_bytes(4, "little"))
    if flags & ENUMS["CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD"]:
        exec_handle = int.from_bytes(marshal.read(exec_out, 8), "little")
        d.post(CALLS["cuGraphUpload"], [exec_handle, stream_of(call, upload)])


@implements("cuGraphGetNodes", "cuGraphGetRootNodes")
def cu_graph_get_nodes(d: Driver, call: Call, args: list[Any]) -> None:
    """The number of nodes (one question, no handles named), or their handles: those the client made, and
    handles the server names for the nodes a capture made."""
    graph, nodes, count = args
    if not count:
        raise CudaError(errors.INVALID_VALUE, "the count pointer is NULL")
    roots = int(call.family == "cuGraphGetRootNodes")
    if not nodes:
        (n,) = d.call(CALLS["xpuGraphCountNodes"], [graph, roots, 8])
        marshal.write(count, n)
        return
    (found,) = d.call(CALLS["xpuGraphListNodes"], [graph, roots, 1])
    _write_nodes(call.params[2], nodes, None, count, found)


@implements("cuGraphNodeGetDependencies", "cuGraphNodeGetDependentNodes")
def cu_graph_node_get_edges(d: Driver, call: Call, args: list[Any]) -> None:
    """A node's dependencies or dependents; the edges' data (_v2) are the plain edges'. An edgeData array
    without a node array is refused, as the driver does (580.159 on an H200)."""
    node, nodes, *edge_data, count = args
    if not count:
        raise CudaError(errors.INVALID_VALUE, "the count pointer is NULL")
    if edge_data and edge_data[0] and not nodes:
        raise CudaError(errors.INVALID_VALUE, "edgeData needs the node array")
    dependents = int(call.family == "cuGraphNodeGetDependentNodes")
    (found,) = d.call(CALLS["xpuGraphNodeListEdges"], [node, dependents, 1])
    if nodes:
        _write_nodes(call.params[-1], nodes, edge_data[0] if edge_data else None, count, found)
    else:
        marshal.put(call.params[-1], count, len(found))


@implements("cuGraphGetEdges")
def cu_graph_get_edges(d: Driver, call: Call, args: list[Any]) -> None:
    """The graph's edges as two arrays, from and to; the edges' data (_v2) are the plain edges'."""
    graph, sources, targets, *edge_data, count = args
    if not count or bool(sources) != bool(targets) or (edge_data and edge_data[0] and not sources):
        raise CudaError(errors.INVALID_VALUE, "numEdges, or one of from/to without the other, or edgeData alone")
    (found,) = d.call(CALLS["xpuGraphListEdges"], [graph, 1])
    if not sources:
        marshal.put(call.params[-1], count, len(found) // 2)
        return
    room = marshal.get(call.params[-1], count)
    _write_nodes(call.params[-1], targets, None, count, found[1::2])
    _write_nodes(call.params[-1], sources, edge_data[0] if edge_data else None, count, found[0::2], room)


def _write_nodes(count_param: Any, array: int, edges: int | None, count: int, found: list[int],
                 room: int | None = None) -> None:
    """As the driver fills a caller's array: as many as it has room for, NULL in the rest of the room, and
    how many it wrote; each edge's data (8 bytes) zero, a plain edge."""
    room = marshal.get(count_param, count) if room is None else room
    written = found[:room]
    marshal.write(array, struct.pack(f"<{len(written)}Q", *written) + bytes(8 * (room - len(written))))
    if edges:
        marshal.write(edges, bytes(8 * room))
    marshal.put(count_param, count, min(room, len(found)))


@implements("cuGraphNodeGetContainingGraph")
def cu_graph_node_get_containing_graph(d: Driver, call: Call, args: list[Any]) -> None:
    """The client's own handle of the node's graph, which the server looks up."""
    node, graph_out = args
    if not graph_out:
        raise CudaError(errors.INVALID_VALUE, "phGraph is NULL")
    (graph,) = d.call(CALLS["xpuGraphNodeGetContainingGraph"], [node, 8])
    marshal.write(graph_out, graph)
