"""Stream capture, CUDA graphs and launches with attributes through cuda-python's driver bindings (run
under the shim, or natively on a GPU): `python graph_check.py KERNELS.fatbin` with the kernels of
tests/programs/driver_api.cu.

Checks and sections as tests/programs/checks.py says.
"""

from __future__ import annotations

import ctypes
import struct
import sys

from checks import XPUREMOTE, check, fails, finish, ok, section
from cuda.bindings import driver as cu

R = cu.CUresult
N = 1024
ACTIVE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
NONE = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
GLOBAL = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
RELAXED = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
T = cu.CUgraphNodeType


def floats(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def upload(ptr: object, data: bytes) -> None:
    ok(cu.cuMemcpyHtoD(ptr, data, len(data)), "cuMemcpyHtoD")


def download(ptr: object, n: int = N) -> list[float]:
    buf = ctypes.create_string_buffer(4 * n)
    ok(cu.cuMemcpyDtoH(buf, ptr, 4 * n), "cuMemcpyDtoH")
    return list(struct.unpack(f"<{n}f", buf.raw))


def saxpy_args(a: float, x: object, y: object) -> tuple:
    return ((a, x, y, N), (ctypes.c_float, None, None, ctypes.c_int))


ok(cu.cuInit(0), "cuInit")
dev = ok(cu.cuDeviceGet(0), "cuDeviceGet")
DRIVER = ok(cu.cuDriverGetVersion(), "cuDriverGetVersion")
ctx = ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
with open(sys.argv[1], "rb") as f:
    image = f.read()
module = ok(cu.cuModuleLoadData(image), "cuModuleLoadData")
saxpy = ok(cu.cuModuleGetFunction(module, b"saxpy"), "saxpy")
x, y, z, w = (ok(cu.cuMemAlloc(4 * N), "cuMemAlloc") for _ in range(4))
xs = [float(i % 97) for i in range(N)]
upload(x, floats(xs))
stream = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate non-blocking")
side = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate side")


def launch(grid_stream: object, a: float, src: object, dst: object) -> None:
    ok(cu.cuLaunchKernel(saxpy, N // 256, 1, 1, 256, 1, 1, 0, grid_stream, saxpy_args(a, src, dst), 0),
       "cuLaunchKernel saxpy")


def instantiate_and_run(graph: object, what: str) -> object:
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0), f"cuGraphInstantiate {what}")
    ok(cu.cuGraphLaunch(graph_exec, stream), f"cuGraphLaunch {what}")
    ok(cu.cuStreamSynchronize(stream), f"synchronize after {what}")
    return graph_exec


@section
def capture_and_replay() -> None:
    """y = 0; y = 2x + y; z = y: captured, checked not to have run, then replayed with new x."""
    upload(y, floats([-1.0] * N))
    ok(cu.cuStreamBeginCapture(stream, GLOBAL), "cuStreamBeginCapture")
    status = ok(cu.cuStreamIsCapturing(stream), "cuStreamIsCapturing")
    check(status == ACTIVE, "the stream is capturing", repr(status))
    info = ok(cu.cuStreamGetCaptureInfo(stream), "cuStreamGetCaptureInfo")
    check(info[0] == ACTIVE and int(info[1]) > 0 and int(info[2]) != 0, "capture info: active, an id, a graph",
          repr(info))
    ok(cu.cuMemsetD32Async(y, 0, N, stream), "cuMemsetD32Async in capture")
    launch(stream, 2.0, x, y)
    now = ok(cu.cuStreamGetCaptureInfo(stream), "cuStreamGetCaptureInfo with dependencies")
    check(now[5] == 1 and len(now[3]) == 1, "the next work depends on one node: the launch", repr(now))
    memset = cu.CUDA_MEMSET_NODE_PARAMS()  # a node added by hand to the graph being captured: w = 2.0
    memset.dst, memset.value, memset.elementSize, memset.width, memset.height = w, 0x40000000, 4, N, 1
    node = ok(cu.cuGraphAddMemsetNode(info[2], now[3], 1, memset, ctx), "cuGraphAddMemsetNode in a capture")
    ok(cu.cuStreamUpdateCaptureDependencies(stream, [node], None, 1,
                                            cu.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES),
       "cuStreamUpdateCaptureDependencies")
    ok(cu.cuMemcpyDtoDAsync(z, y, 4 * N, stream), "cuMemcpyDtoDAsync in capture")
    check(download(y) == [-1.0] * N, "captured work did not run")
    graph = ok(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
    check(int(graph) == int(info[2]), "the graph ended is the graph captured into", f"{graph} vs {info[2]}")
    check(ok(cu.cuStreamIsCapturing(stream), "cuStreamIsCapturing after") == NONE, "capture over")
    count = ok(cu.cuGraphGetNodes(graph), "cuGraphGetNodes count")
    check((count[1] if isinstance(count, tuple) else count) == 4, "four nodes", repr(count))
    captured = ok(cu.cuGraphGetNodes(graph, 4), "cuGraphGetNodes of a captured graph")[0]
    check(int(node) in [int(n) for n in captured], "the node added by hand is listed by its own handle")
    types = sorted(int(ok(cu.cuGraphNodeGetType(n), "cuGraphNodeGetType of a captured node")) for n in captured)
    check(types == sorted(int(t) for t in (T.CU_GRAPH_NODE_TYPE_MEMSET, T.CU_GRAPH_NODE_TYPE_KERNEL,
                                           T.CU_GRAPH_NODE_TYPE_MEMSET, T.CU_GRAPH_NODE_TYPE_MEMCPY)),
          "captured nodes' types: two memsets, a kernel, a copy", repr(types))
    upload(w, floats([0.0] * N))
    graph_exec = instantiate_and_run(graph, "capture")
    check(download(z) == [2 * v for v in xs], "replay: z = 2x")
    check(download(w) == [2.0] * N, "replay ran the node added by hand")
    upload(x, floats([1.5] * N))
    for _ in range(2):  # y is cleared first: replays do not accumulate
        ok(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch again")
    ok(cu.cuStreamSynchronize(stream), "synchronize")
    check(download(z) == [3.0] * N, "replay reads the new x")
    upload(x, floats(xs))
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")


@section
def fork_and_join() -> None:
    """A side stream joins the capture through an event, does its part, and is joined back."""
    fork, join = ok(cu.cuEventCreate(0), "cuEventCreate"), ok(cu.cuEventCreate(0), "cuEventCreate")
    ok(cu.cuStreamBeginCapture(stream, RELAXED), "cuStreamBeginCapture relaxed")
    ok(cu.cuEventRecord(fork, stream), "cuEventRecord in capture")
    ok(cu.cuStreamWaitEvent(side, fork, 0), "side waits for the capture's event")
    info = ok(cu.cuStreamGetCaptureInfo(side), "capture info of the side stream")
    main = ok(cu.cuStreamGetCaptureInfo(stream), "capture info of the origin")
    check(info[0] == ACTIVE and int(info[1]) == int(main[1]), "the side stream joined the same capture",
          f"{info} {main}")
    ok(cu.cuMemsetD32Async(w, 0x40400000, N, side), "memset 3.0 on the side stream")  # 3.0f
    ok(cu.cuMemsetD32Async(y, 0x3F800000, N, stream), "memset 1.0 on the origin")  # 1.0f
    ok(cu.cuEventRecord(join, side), "cuEventRecord on the side")
    ok(cu.cuStreamWaitEvent(stream, join, 0), "the origin waits for the side")
    launch(stream, 1.0, w, y)  # y = w + y = 4
    graph = ok(cu.cuStreamEndCapture(stream), "cuStreamEndCapture after the join")
    check(ok(cu.cuStreamIsCapturing(side), "side stream after the end") == NONE, "the side stream's capture ended")
    graph_exec = instantiate_and_run(graph, "fork/join")
    check(download(y) == [4.0] * N, "fork/join replay: y = 3 + 1")
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    # a side stream that is not joined back
    ok(cu.cuStreamBeginCapture(stream, RELAXED), "cuStreamBeginCapture")
    ok(cu.cuEventRecord(fork, stream), "cuEventRecord")
    ok(cu.cuStreamWaitEvent(side, fork, 0), "side joins")
    ok(cu.cuMemsetD32Async(w, 0, N, side), "memset on the side")
    fails(cu.cuStreamEndCapture(stream), R.CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "a side stream not joined back")
    check(ok(cu.cuStreamIsCapturing(side), "side stream after a failed end") == NONE, "no capture left on the side")


@section
def illegal_work() -> None:
    """What a capture forbids fails with the driver's errors and invalidates the capture."""
    fails(cu.cuStreamBeginCapture(cu.CUstream(cu.CU_STREAM_LEGACY), GLOBAL), R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
          "the legacy stream cannot capture")
    fails(cu.cuStreamEndCapture(stream), R.CUDA_ERROR_ILLEGAL_STATE, "ending a capture never begun")
    ok(cu.cuStreamBeginCapture(stream, GLOBAL), "cuStreamBeginCapture")
    fails(cu.cuStreamSynchronize(stream), R.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "synchronizing a capturing stream")
    status = ok(cu.cuStreamIsCapturing(stream), "cuStreamIsCapturing after")
    check(status == cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_INVALIDATED, "the capture is invalidated",
          repr(status))
    fails(cu.cuStreamEndCapture(stream), R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "ending an invalidated capture")
    blocking = ok(cu.cuStreamCreate(0), "a blocking stream")
    ok(cu.cuStreamBeginCapture(blocking, RELAXED), "capture on a blocking stream")
    fails(cu.cuMemsetD32Async(w, 0, N, cu.CUstream(cu.CU_STREAM_LEGACY)), R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
          "legacy-stream work while a blocking stream captures")
    fails(cu.cuStreamEndCapture(blocking), R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "that capture is invalidated")
    ok(cu.cuStreamDestroy(blocking), "cuStreamDestroy")
    old = ok(cu.cuThreadExchangeStreamCaptureMode(RELAXED), "cuThreadExchangeStreamCaptureMode")
    check(old == GLOBAL, "a thread's capture mode is GLOBAL at first", repr(old))
    back = ok(cu.cuThreadExchangeStreamCaptureMode(old), "cuThreadExchangeStreamCaptureMode back")
    check(back == RELAXED, "the mode set is the mode returned", repr(back))
    if XPUREMOTE:  # the driver would read the host buffer at each replay; the server cannot
        ok(cu.cuStreamBeginCapture(stream, GLOBAL), "cuStreamBeginCapture")
        host = ctypes.create_string_buffer(4 * N)
        fails(cu.cuMemcpyHtoDAsync(y, host, 4 * N, stream), R.CUDA_ERROR_NOT_SUPPORTED, "a host copy in a capture")
        fails(cu.cuStreamEndCapture(stream), R.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "its capture is invalidated")


def ids(graph: object, nodes: tuple) -> None:
    """CUDA 13.1's ids of graphs and nodes, and a node's graph."""
    for what, node in zip(("empty", "memset", "kernel"), nodes):
        found = ok(cu.cuGraphNodeGetContainingGraph(node), f"cuGraphNodeGetContainingGraph {what}")
        check(int(found) == int(graph), f"the {what} node's graph", f"{found} vs {graph}")
    locals_ = [ok(cu.cuGraphNodeGetLocalId(n), "cuGraphNodeGetLocalId") for n in nodes]
    tools = [ok(cu.cuGraphNodeGetToolsId(n), "cuGraphNodeGetToolsId") for n in nodes]
    check(len(set(locals_)) == 3 and len(set(tools)) == 3, "nodes' ids differ", f"{locals_} {tools}")
    other = ok(cu.cuGraphCreate(0), "cuGraphCreate another")
    graph_ids = [ok(cu.cuGraphGetId(g), "cuGraphGetId") for g in (graph, other)]
    check(graph_ids[0] != graph_ids[1] and min(graph_ids) > 0, "graphs' ids differ", repr(graph_ids))
    ok(cu.cuGraphDestroy(other), "cuGraphDestroy another")


@section
def node_api() -> None:
    """memset -> kernel -> copy, built node by node, with an empty node ahead of the memset."""
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    empty = ok(cu.cuGraphAddEmptyNode(graph, None, 0), "cuGraphAddEmptyNode")
    memset = cu.CUDA_MEMSET_NODE_PARAMS()
    memset.dst, memset.value, memset.elementSize, memset.width, memset.height = y, 0x3F800000, 4, N, 1
    memset.pitch = 0
    set_node = ok(cu.cuGraphAddMemsetNode(graph, None, 0, memset, ctx), "cuGraphAddMemsetNode")
    ok(cu.cuGraphAddDependencies(graph, [empty], [set_node], None, 1), "cuGraphAddDependencies")
    kernel = cu.CUDA_KERNEL_NODE_PARAMS()
    kernel.func, kernel.gridDimX, kernel.gridDimY, kernel.gridDimZ = saxpy, N // 256, 1, 1
    kernel.blockDimX, kernel.blockDimY, kernel.blockDimZ, kernel.sharedMemBytes = 256, 1, 1, 0
    kernel.kernelParams = saxpy_args(2.0, x, y)
    run_node = ok(cu.cuGraphAddKernelNode(graph, [set_node], 1, kernel), "cuGraphAddKernelNode")
    copy = cu.CUDA_MEMCPY3D()
    copy.srcMemoryType = copy.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    copy.srcDevice, copy.dstDevice, copy.WidthInBytes, copy.Height, copy.Depth = y, z, 4 * N, 1, 1
    ok(cu.cuGraphAddMemcpyNode(graph, [run_node], 1, copy, ctx), "cuGraphAddMemcpyNode")
    if DRIVER >= 13010:  # the ids are CUDA 13.1's
        ids(graph, (empty, set_node, run_node))
    roots = ok(cu.cuGraphGetRootNodes(graph), "cuGraphGetRootNodes count")
    check((roots[1] if isinstance(roots, tuple) else roots) == 1, "one root (the empty node)", repr(roots))
    upload(z, floats([0.0] * N))
    graph_exec = instantiate_and_run(graph, "nodes")
    check(download(z) == [2 * v + 1 for v in xs], "node graph: z = 2x + 1")
    if DRIVER >= 13010:
        exec_id = ok(cu.cuGraphExecGetId(graph_exec), "cuGraphExecGetId")
        check(exec_id > 0, "an instantiation's id", repr(exec_id))
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")


def node_list(fn: object, handle: object, what: str, room: int | None = None) -> list[int]:
    """Handles as ints, asked as cuda-python does: the count first, then an array of that size (or of `room`)."""
    count = ok(fn(handle), f"{what} count")
    count = count[-1] if isinstance(count, tuple) else count
    found = ok(fn(handle, count if room is None else room), what)
    check(found[-1] == min(count, room if room is not None else count), f"{what}: the count written", repr(found))
    return [int(n) for n in found[0]]


@section
def node_queries_clone_and_children() -> None:
    """Node lists and edges, node types, a clone, a child graph, event nodes and a node destroyed: x -> y = 2x
    (kernel) in a child graph, after a memset of y to 1 (so y = 2x + 1), then z = y (copy), an event recorded
    after the copy and waited for by an empty node."""
    child = ok(cu.cuGraphCreate(0), "cuGraphCreate child")
    kernel = cu.CUDA_KERNEL_NODE_PARAMS()
    kernel.func, kernel.gridDimX, kernel.gridDimY, kernel.gridDimZ = saxpy, N // 256, 1, 1
    kernel.blockDimX, kernel.blockDimY, kernel.blockDimZ, kernel.sharedMemBytes = 256, 1, 1, 0
    kernel.kernelParams = saxpy_args(2.0, x, y)
    ok(cu.cuGraphAddKernelNode(child, None, 0, kernel), "cuGraphAddKernelNode in the child")
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    memset = cu.CUDA_MEMSET_NODE_PARAMS()
    memset.dst, memset.value, memset.elementSize, memset.width, memset.height = y, 0x3F800000, 4, N, 1
    set_node = ok(cu.cuGraphAddMemsetNode(graph, None, 0, memset, ctx), "cuGraphAddMemsetNode")
    child_node = ok(cu.cuGraphAddChildGraphNode(graph, [set_node], 1, child), "cuGraphAddChildGraphNode")
    ok(cu.cuGraphDestroy(child), "cuGraphDestroy the child (the node holds a clone)")
    copy = cu.CUDA_MEMCPY3D()
    copy.srcMemoryType = copy.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    copy.srcDevice, copy.dstDevice, copy.WidthInBytes, copy.Height, copy.Depth = y, z, 4 * N, 1, 1
    copy_node = ok(cu.cuGraphAddMemcpyNode(graph, [child_node], 1, copy, ctx), "cuGraphAddMemcpyNode")
    event = ok(cu.cuEventCreate(0), "cuEventCreate")
    record = ok(cu.cuGraphAddEventRecordNode(graph, [copy_node], 1, event), "cuGraphAddEventRecordNode")
    wait = ok(cu.cuGraphAddEventWaitNode(graph, [record], 1, event), "cuGraphAddEventWaitNode")
    extra = ok(cu.cuGraphAddEmptyNode(graph, [set_node], 1), "cuGraphAddEmptyNode (destroyed below)")
    made = [set_node, child_node, copy_node, record, wait, extra]
    listed = node_list(cu.cuGraphGetNodes, graph, "cuGraphGetNodes")
    check(sorted(listed) == sorted(int(n) for n in made), "the nodes listed are the nodes made", f"{listed}")
    check(node_list(cu.cuGraphGetRootNodes, graph, "cuGraphGetRootNodes") == [int(set_node)], "one root: the memset")
    check(node_list(cu.cuGraphGetNodes, graph, "cuGraphGetNodes, room for 2", room=2) == listed[:2],
          "a short array gets the first nodes")
    check(sorted(node_list(cu.cuGraphNodeGetDependentNodes, set_node, "cuGraphNodeGetDependentNodes"))
          == sorted([int(child_node), int(extra)]), "the memset's dependents")
    # an edge array without a node array: the driver refuses it (580.159, measured on an H200)
    edges_room, count = ctypes.create_string_buffer(64), ctypes.c_size_t(0)
    status = ctypes.CDLL("libcuda.so.1").cuGraphNodeGetDependentNodes_v2(
        ctypes.c_void_p(int(set_node)), None, edges_room, ctypes.byref(count))
    check(status == 1 and count.value == 0, "an edge array alone is refused", f"{status} {count.value}")
    check(node_list(cu.cuGraphNodeGetDependencies, copy_node, "cuGraphNodeGetDependencies") == [int(child_node)],
          "the copy's dependency")
    count = ok(cu.cuGraphGetEdges(graph), "cuGraphGetEdges count")[-1]
    edges = ok(cu.cuGraphGetEdges(graph, count), "cuGraphGetEdges")
    pairs = sorted((int(a), int(b)) for a, b in zip(edges[0], edges[1]))
    want = sorted((int(a), int(b)) for a, b in ((set_node, child_node), (child_node, copy_node), (copy_node, record),
                                                (record, wait), (set_node, extra)))
    check(count == 5 and pairs == want, "the graph's edges, from and to", f"{count} {pairs}")
    types = [ok(cu.cuGraphNodeGetType(n), "cuGraphNodeGetType") for n in made]
    check(types == [T.CU_GRAPH_NODE_TYPE_MEMSET, T.CU_GRAPH_NODE_TYPE_GRAPH, T.CU_GRAPH_NODE_TYPE_MEMCPY,
                    T.CU_GRAPH_NODE_TYPE_EVENT_RECORD, T.CU_GRAPH_NODE_TYPE_WAIT_EVENT, T.CU_GRAPH_NODE_TYPE_EMPTY],
          "node types", repr(types))
    ok(cu.cuGraphDestroyNode(extra), "cuGraphDestroyNode")
    check(len(node_list(cu.cuGraphGetNodes, graph, "cuGraphGetNodes after a destroy")) == 5, "five nodes left")
    check(node_list(cu.cuGraphNodeGetDependentNodes, set_node, "dependents after a destroy") == [int(child_node)],
          "the destroyed node's edge is gone")
    clone = ok(cu.cuGraphClone(graph), "cuGraphClone")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy the original (the clone stands alone)")
    check(len(node_list(cu.cuGraphGetNodes, clone, "cuGraphGetNodes of the clone")) == 5, "the clone has five nodes")
    upload(z, floats([0.0] * N))
    graph_exec = instantiate_and_run(clone, "the clone")
    check(download(z) == [2 * v + 1 for v in xs], "the clone with its child graph: z = 2x + 1")
    ok(cu.cuEventSynchronize(event), "the event node's event was recorded")
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(clone), "cuGraphDestroy the clone")
    ok(cu.cuEventDestroy(event), "cuEventDestroy")


@section
def polymorphic_nodes() -> None:
    """cuGraphAddNode of each forwarded type: memset y = 1 -> child graph (y = 2x + y) -> copy z = y, an empty
    node and an event record after it; a host node is refused (its function would run on the server)."""
    child = ok(cu.cuGraphCreate(0), "cuGraphCreate child")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_KERNEL
    k = params.kernel
    k.func, k.gridDimX, k.gridDimY, k.gridDimZ, k.blockDimX, k.blockDimY, k.blockDimZ = saxpy, N // 256, 1, 1, 256, 1, 1
    k.kernelParams = saxpy_args(2.0, x, y)
    ok(cu.cuGraphAddNode(child, None, None, 0, params), "cuGraphAddNode kernel")
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_MEMSET
    m = params.memset
    m.dst, m.value, m.elementSize, m.width, m.height, m.ctx = y, 0x3F800000, 4, N, 1, ctx
    set_node = ok(cu.cuGraphAddNode(graph, None, None, 0, params), "cuGraphAddNode memset")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_GRAPH
    params.graph.graph = child
    child_node = ok(cu.cuGraphAddNode(graph, [set_node], None, 1, params), "cuGraphAddNode child graph")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_MEMCPY
    c = params.memcpy.copyParams
    c.srcMemoryType = c.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    c.srcDevice, c.dstDevice, c.WidthInBytes, c.Height, c.Depth = y, z, 4 * N, 1, 1
    params.memcpy.copyCtx = ctx
    copy_node = ok(cu.cuGraphAddNode(graph, [child_node], None, 1, params), "cuGraphAddNode memcpy")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_EMPTY
    empty = ok(cu.cuGraphAddNode(graph, [copy_node], None, 1, params), "cuGraphAddNode empty")
    event = ok(cu.cuEventCreate(0), "cuEventCreate")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_EVENT_RECORD
    params.eventRecord.event = event
    ok(cu.cuGraphAddNode(graph, [empty], None, 1, params), "cuGraphAddNode event record")
    if XPUREMOTE:
        params = cu.CUgraphNodeParams()
        params.type = T.CU_GRAPH_NODE_TYPE_HOST
        fails(cu.cuGraphAddNode(graph, None, None, 0, params)[0], R.CUDA_ERROR_NOT_SUPPORTED, "a host node is refused")
    types = [ok(cu.cuGraphNodeGetType(n), "cuGraphNodeGetType") for n in (set_node, child_node, copy_node, empty)]
    check(types == [T.CU_GRAPH_NODE_TYPE_MEMSET, T.CU_GRAPH_NODE_TYPE_GRAPH, T.CU_GRAPH_NODE_TYPE_MEMCPY,
                    T.CU_GRAPH_NODE_TYPE_EMPTY], "the types of the nodes added", repr(types))
    upload(z, floats([0.0] * N))
    graph_exec = instantiate_and_run(graph, "polymorphic nodes")
    check(download(z) == [2 * v + 1 for v in xs], "polymorphic nodes: z = 2x + 1")
    ok(cu.cuEventSynchronize(event), "the event node's event was recorded")
    for what, fn, obj in (("exec", cu.cuGraphExecDestroy, graph_exec), ("graph", cu.cuGraphDestroy, graph),
                          ("child", cu.cuGraphDestroy, child), ("event", cu.cuEventDestroy, event)):
        ok(fn(obj), f"destroy the {what}")


@section
def new_parameters_and_updates() -> None:
    """memset y = 1 -> kernel y = 2x + y -> copy z = y, instantiated; new parameters for the instantiation's
    nodes, then for the graph's, which reach the instantiation through cuGraphExecUpdate; a graph of another
    shape does not."""
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")

    def memset_params(value: float) -> object:
        m = cu.CUDA_MEMSET_NODE_PARAMS()
        m.dst, m.value, m.elementSize, m.width, m.height = y, struct.unpack("<I", struct.pack("<f", value))[0], 4, N, 1
        return m

    def kernel_params(a: float) -> object:
        k = cu.CUDA_KERNEL_NODE_PARAMS()
        k.func, k.gridDimX, k.gridDimY, k.gridDimZ = saxpy, N // 256, 1, 1
        k.blockDimX, k.blockDimY, k.blockDimZ = 256, 1, 1
        k.kernelParams = saxpy_args(a, x, y)
        return k

    def copy_params(dst: object) -> object:
        c = cu.CUDA_MEMCPY3D()
        c.srcMemoryType = c.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
        c.srcDevice, c.dstDevice, c.WidthInBytes, c.Height, c.Depth = y, dst, 4 * N, 1, 1
        return c

    set_node = ok(cu.cuGraphAddMemsetNode(graph, None, 0, memset_params(1.0), ctx), "cuGraphAddMemsetNode")
    run_node = ok(cu.cuGraphAddKernelNode(graph, [set_node], 1, kernel_params(2.0)), "cuGraphAddKernelNode")
    copy_node = ok(cu.cuGraphAddMemcpyNode(graph, [run_node], 1, copy_params(z), ctx), "cuGraphAddMemcpyNode")
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

    def run(what: str) -> None:
        ok(cu.cuGraphLaunch(graph_exec, stream), f"cuGraphLaunch {what}")
        ok(cu.cuStreamSynchronize(stream), f"synchronize {what}")

    ok(cu.cuGraphExecMemsetNodeSetParams(graph_exec, set_node, memset_params(3.0), ctx),
       "cuGraphExecMemsetNodeSetParams")
    ok(cu.cuGraphExecKernelNodeSetParams(graph_exec, run_node, kernel_params(4.0)), "cuGraphExecKernelNodeSetParams")
    run("with new parameters")
    check(download(z) == [4 * v + 3 for v in xs], "the instantiation's new parameters: z = 4x + 3")
    upload(w, floats([0.0] * N))
    ok(cu.cuGraphExecMemcpyNodeSetParams(graph_exec, copy_node, copy_params(w), ctx), "cuGraphExecMemcpyNodeSetParams")
    upload(z, floats([0.0] * N))
    run("copying to w")
    check(download(w) == [4 * v + 3 for v in xs] and download(z) == [0.0] * N, "the copy node now writes w, not z")
    ok(cu.cuGraphKernelNodeSetParams(run_node, kernel_params(5.0)), "cuGraphKernelNodeSetParams")
    ok(cu.cuGraphMemsetNodeSetParams(set_node, memset_params(0.0)), "cuGraphMemsetNodeSetParams")
    run("before the update")
    check(download(w) == [4 * v + 3 for v in xs], "the graph's new parameters do not reach the instantiation alone")
    info = ok(cu.cuGraphExecUpdate(graph_exec, graph), "cuGraphExecUpdate")
    check(info.result == cu.CUgraphExecUpdateResult.CU_GRAPH_EXEC_UPDATE_SUCCESS, "update result: success",
          repr(info.result))
    run("after the update")
    check(download(z) == [5 * v for v in xs], "after cuGraphExecUpdate: the graph's parameters, z = 5x")
    ok(cu.cuGraphAddEmptyNode(graph, [copy_node], 1), "cuGraphAddEmptyNode (another shape)")
    fails(cu.cuGraphExecUpdate(graph_exec, graph), R.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
          "a graph of another shape does not update it")  # (cuda-python drops the result info of a failure)
    run("after a refused update")
    check(download(z) == [5 * v for v in xs], "a refused update leaves the instantiation as it was")
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")


def kernel_node(a: float) -> object:
    k = cu.CUDA_KERNEL_NODE_PARAMS()
    k.func, k.gridDimX, k.gridDimY, k.gridDimZ, k.blockDimX, k.blockDimY, k.blockDimZ = saxpy, N // 256, 1, 1, 256, 1, 1
    k.kernelParams = saxpy_args(a, x, y)
    return k


def copy_params3d(src: object, dst: object) -> object:
    c = cu.CUDA_MEMCPY3D()
    c.srcMemoryType = c.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    c.srcDevice, c.dstDevice, c.WidthInBytes, c.Height, c.Depth = src, dst, 4 * N, 1, 1
    return c


def host_copy(src: object, dst: object, to_device: bool, width: int, height: int = 1, host_pitch: int = 0) -> object:
    """A CUDA_MEMCPY3D between pageable host memory (a ctypes buffer) and device memory."""
    c = cu.CUDA_MEMCPY3D()
    host, device = (src, dst) if to_device else (dst, src)
    host_side = cu.CUmemorytype.CU_MEMORYTYPE_HOST
    if to_device:
        c.srcMemoryType, c.srcHost, c.srcPitch = host_side, host, host_pitch or width
        c.dstMemoryType, c.dstDevice, c.dstPitch = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, device, width
    else:
        c.srcMemoryType, c.srcDevice, c.srcPitch = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, device, width
        c.dstMemoryType, c.dstHost, c.dstPitch = host_side, host, host_pitch or width
    c.WidthInBytes, c.Height, c.Depth = width, height, 1
    return c


def host_floats(buf: object, n: int = N) -> list[float]:
    return list(struct.unpack(f"<{n}f", ctypes.string_at(buf, 4 * n)))


@section
def host_copy_nodes() -> None:
    """Copy nodes with a host side: host a -> y, y = 2x + y, y -> host b (rows of a wider pitch), launched
    twice with new host bytes between; the getters give the parameters back; new host sides for the graph's
    node and the instantiation's; a child graph and a clone that hold host copies."""
    a, b = ctypes.create_string_buffer(4 * N), ctypes.create_string_buffer(8 * N)
    free_before = ok(cu.cuMemGetInfo(), "cuMemGetInfo")[0]
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    to_y = ok(cu.cuGraphAddMemcpyNode(graph, None, 0, host_copy(ctypes.addressof(a), y, True, 4 * N), ctx),
              "cuGraphAddMemcpyNode host to device")
    run_node = ok(cu.cuGraphAddKernelNode(graph, [to_y], 1, kernel_node(2.0)), "cuGraphAddKernelNode")
    rows = host_copy(y, ctypes.addressof(b), False, 4 * N // 4, 4, 8 * N // 4)  # 4 rows, each in half its pitch
    to_b = ok(cu.cuGraphAddMemcpyNode(graph, [run_node], 1, rows, ctx), "cuGraphAddMemcpyNode device to host")
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

    def run(values: list[float], what: str) -> list[float]:
        ctypes.memmove(a, floats(values), 4 * N)
        ok(cu.cuGraphLaunch(graph_exec, stream), f"cuGraphLaunch {what}")
        ctypes.memmove(a, floats([-1.0] * N), 4 * N)  # after the launch, which has read a already
        ok(cu.cuStreamSynchronize(stream), f"synchronize {what}")
        q = N // 4
        return [v for r in range(4) for v in host_floats(ctypes.addressof(b) + r * 8 * q, q)]

    if XPUREMOTE:  # the bytes a launch copies are read when it is launched (a driver may read them later)
        check(run([1.0] * N, "first") == [2 * v + 1 for v in xs], "host copies: b = 2x + a, a read at the launch")
        check(run([5.0] * N, "second") == [2 * v + 5 for v in xs], "a second launch reads a again")
    got = ok(cu.cuGraphMemcpyNodeGetParams(to_b), "cuGraphMemcpyNodeGetParams")
    check(int(got.dstHost) == ctypes.addressof(b) and int(got.srcDevice) == int(y) and got.Height == 4
          and got.dstPitch == 2 * N, "the getter gives the copy's parameters back", repr(got))
    c, d = ctypes.create_string_buffer(4 * N), ctypes.create_string_buffer(4 * N)
    # cuda.h: an instantiation's copy node is updated only where the old and the new copy are 1-dimensional
    fails(cu.cuGraphExecMemcpyNodeSetParams(graph_exec, to_b, host_copy(y, ctypes.addressof(c), False, 4 * N), ctx),
          R.CUDA_ERROR_INVALID_VALUE, "an instantiation's copy node of rows is not updated")
    ok(cu.cuGraphExecMemcpyNodeSetParams(graph_exec, to_y, host_copy(ctypes.addressof(d), y, True, 4 * N), ctx),
       "cuGraphExecMemcpyNodeSetParams: a new host source")
    fails(cu.cuGraphExecMemcpyNodeSetParams(graph_exec, to_y, copy_params3d(z, y), ctx), R.CUDA_ERROR_INVALID_VALUE,
          "an instantiation's copy node keeps its host side")
    ctypes.memmove(d, floats([7.0] * N), 4 * N)
    ctypes.memmove(a, floats([0.0] * N), 4 * N)
    ok(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch from d")
    ok(cu.cuStreamSynchronize(stream), "synchronize from d")
    q = N // 4
    got_b = [v for r in range(4) for v in host_floats(ctypes.addressof(b) + r * 8 * q, q)]
    check(got_b == [2 * v + 7 for v in xs], "the instantiation's node now reads d")
    child = ok(cu.cuGraphCreate(0), "cuGraphCreate parent")
    ok(cu.cuGraphAddChildGraphNode(child, None, 0, graph), "cuGraphAddChildGraphNode with host copies")
    clone = ok(cu.cuGraphClone(child), "cuGraphClone")
    ctypes.memset(b, 0, 8 * N)
    ctypes.memmove(a, floats([3.0] * N), 4 * N)
    clone_exec = instantiate_and_run(clone, "a clone of a graph with a child with host copies")
    got_b = [v for r in range(4) for v in host_floats(ctypes.addressof(b) + r * 8 * q, q)]
    check(got_b == [2 * v + 3 for v in xs], "the clone's child copies from a and to b")
    for what, fn, obj in (("exec", cu.cuGraphExecDestroy, graph_exec), ("clone's exec", cu.cuGraphExecDestroy,
                          clone_exec), ("graph", cu.cuGraphDestroy, graph), ("parent", cu.cuGraphDestroy, child),
                          ("clone", cu.cuGraphDestroy, clone)):
        ok(fn(obj), f"destroy the {what}")
    if XPUREMOTE:  # the staging buffers go with the last graph or instantiation that copies through them
        free_after = ok(cu.cuMemGetInfo(), "cuMemGetInfo")[0]
        check(free_after == free_before, "the host copies' staging memory is freed", f"{free_before} {free_after}")


@section
def polymorphic_setters_and_getters() -> None:
    """cuGraphNodeSetParams and cuGraphExecNodeSetParams for memset and copy nodes; the getters."""
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_MEMSET
    m = params.memset
    m.dst, m.value, m.elementSize, m.width, m.height, m.ctx = y, 0x40000000, 4, N, 1, ctx  # 2.0
    set_node = ok(cu.cuGraphAddNode(graph, None, None, 0, params), "cuGraphAddNode memset")
    copy = cu.CUgraphNodeParams()
    copy.type = T.CU_GRAPH_NODE_TYPE_MEMCPY
    copy.memcpy.copyParams = copy_params3d(y, z)
    copy.memcpy.copyCtx = ctx
    copy_node = ok(cu.cuGraphAddNode(graph, [set_node], None, 1, copy), "cuGraphAddNode memcpy")
    copy.memcpy.copyParams = copy_params3d(y, w)
    ok(cu.cuGraphNodeSetParams(copy_node, copy), "cuGraphNodeSetParams: copy to w")
    got = ok(cu.cuGraphMemcpyNodeGetParams(copy_node), "cuGraphMemcpyNodeGetParams")
    check(int(got.dstDevice) == int(w), "the getter gives the new destination", repr(got.dstDevice))
    memset = ok(cu.cuGraphMemsetNodeGetParams(set_node), "cuGraphMemsetNodeGetParams")
    check(memset.value == 0x40000000 and memset.width == N, "the memset getter", repr(memset))
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    m.value = 0x40400000  # 3.0
    ok(cu.cuGraphExecNodeSetParams(graph_exec, set_node, params), "cuGraphExecNodeSetParams: memset 3")
    upload(w, floats([0.0] * N))
    ok(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")
    ok(cu.cuStreamSynchronize(stream), "synchronize")
    check(download(w) == [3.0] * N, "the instantiation's new memset value reached w")
    memset = ok(cu.cuGraphMemsetNodeGetParams(set_node), "cuGraphMemsetNodeGetParams after the exec's")
    check(memset.value == 0x40000000, "an instantiation's new parameters leave the graph's node as it was")
    if DRIVER >= 13020:
        got = ok(cu.cuGraphNodeGetParams(copy_node), "cuGraphNodeGetParams")
        check(got.type == T.CU_GRAPH_NODE_TYPE_MEMCPY and int(got.memcpy.copyParams.dstDevice) == int(w),
              "the polymorphic getter", repr(got.type))
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")


@section
def kernel_and_event_nodes_and_enabling() -> None:
    """memset y = 1 -> kernel y = 2x + y -> event record: the kernel's and the event's getters, new events for
    the graph's node and the instantiation's, and the kernel disabled in the instantiation, then enabled."""
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    m = cu.CUDA_MEMSET_NODE_PARAMS()
    m.dst, m.value, m.elementSize, m.width, m.height = y, 0x3F800000, 4, N, 1  # 1.0
    set_node = ok(cu.cuGraphAddMemsetNode(graph, None, 0, m, ctx), "cuGraphAddMemsetNode")
    run_node = ok(cu.cuGraphAddKernelNode(graph, [set_node], 1, kernel_node(2.0)), "cuGraphAddKernelNode")
    got = ok(cu.cuGraphKernelNodeGetParams(run_node), "cuGraphKernelNodeGetParams")
    check(int(got.func) == int(saxpy) and got.gridDimX == N // 256 and got.blockDimX == 256 and got.gridDimY == 1,
          "the kernel node's parameters come back", repr((got.gridDimX, got.blockDimX)))
    first, second, third = (ok(cu.cuEventCreate(0), "cuEventCreate") for _ in range(3))
    record = ok(cu.cuGraphAddEventRecordNode(graph, [run_node], 1, first), "cuGraphAddEventRecordNode")
    check(int(ok(cu.cuGraphEventRecordNodeGetEvent(record), "cuGraphEventRecordNodeGetEvent")) == int(first),
          "the event node's event")
    ok(cu.cuGraphEventRecordNodeSetEvent(record, second), "cuGraphEventRecordNodeSetEvent")
    check(int(ok(cu.cuGraphEventRecordNodeGetEvent(record), "cuGraphEventRecordNodeGetEvent")) == int(second),
          "the event node's new event")
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    ok(cu.cuGraphExecEventRecordNodeSetEvent(graph_exec, record, third), "cuGraphExecEventRecordNodeSetEvent")
    ok(cu.cuGraphNodeSetEnabled(graph_exec, run_node, 0), "cuGraphNodeSetEnabled 0")
    check(ok(cu.cuGraphNodeGetEnabled(graph_exec, run_node), "cuGraphNodeGetEnabled") == 0, "the kernel is disabled")
    ok(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch with the kernel disabled")
    ok(cu.cuEventSynchronize(third), "the instantiation records its own event")
    check(download(y) == [1.0] * N, "a disabled kernel does not run: y = 1")
    ok(cu.cuGraphNodeSetEnabled(graph_exec, run_node, 1), "cuGraphNodeSetEnabled 1")
    ok(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch with the kernel enabled")
    ok(cu.cuStreamSynchronize(stream), "synchronize")
    check(download(y) == [2 * v + 1 for v in xs], "enabled again: y = 2x + 1")
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    for event in (first, second, third):
        ok(cu.cuEventDestroy(event), "cuEventDestroy")


@section
def launch_attributes() -> None:
    """cuLaunchKernelEx with clusters of two blocks and a launch-completion event; cluster occupancy."""
    LA = cu.CUlaunchAttributeID
    cluster, done = cu.CUlaunchAttribute(), cu.CUlaunchAttribute()
    cluster.id = LA.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    cluster.value.clusterDim.x, cluster.value.clusterDim.y, cluster.value.clusterDim.z = 2, 1, 1
    # cuda.h: the event must not time (the driver refuses a timing one with NOT_SUPPORTED)
    event = ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    done.id = LA.CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT
    done.value.launchCompletionEvent.event = event
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = N // 256, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = 256, 1, 1
    config.sharedMemBytes, config.hStream = 0, stream
    config.attrs, config.numAttrs = [cluster, done], 2
    upload(y, floats([1.0] * N))
    ok(cu.cuLaunchKernelEx(config, saxpy, saxpy_args(3.0, x, y), 0), "cuLaunchKernelEx with clusters and an event")
    ok(cu.cuEventSynchronize(event), "the launch-completion event")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(download(y) == [3 * v + 1 for v in xs], "the clustered launch: y = 3x + 1")
    config.attrs, config.numAttrs = [cluster], 1
    clusters = ok(cu.cuOccupancyMaxActiveClusters(saxpy, config), "cuOccupancyMaxActiveClusters")
    check(isinstance(clusters, int) and clusters > 0, "clusters of two fit", repr(clusters))
    ok(cu.cuEventDestroy(event), "cuEventDestroy")


def conditional_graph(kind: object, bodies: int, default: int, flags: int = 1) -> tuple[object, list[object]]:
    """A graph of one conditional node whose body i sets x[0..N) to float i + 1, and the bodies."""
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    handle = ok(cu.cuGraphConditionalHandleCreate(graph, ctx, default, flags), "cuGraphConditionalHandleCreate")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle, params.conditional.type, params.conditional.size = handle, kind, bodies
    params.conditional.ctx = ctx
    node = ok(cu.cuGraphAddNode(graph, None, None, 0, params), f"cuGraphAddNode conditional {kind!r}")
    check(int(ok(cu.cuGraphNodeGetType(node), "cuGraphNodeGetType")) == int(T.CU_GRAPH_NODE_TYPE_CONDITIONAL),
          "a conditional node")
    made = list(params.conditional.phGraph_out)
    check(len(made) == bodies and all(int(b) for b in made), f"{bodies} body graphs", repr(made))
    for i, body in enumerate(made):
        m = cu.CUDA_MEMSET_NODE_PARAMS()
        m.dst, m.value, m.elementSize, m.width, m.height = x, struct.unpack("<I", floats([i + 1.0]))[0], 4, N, 1
        ok(cu.cuGraphAddMemsetNode(body, None, 0, m, ctx), f"a memset in body {i}")
    return graph, made


@section
def conditional_nodes() -> None:
    """IF with an else body, SWITCH and WHILE, run as their condition's default value says (a kernel would
    set the value on a GPU; these graphs have none)."""
    cond = cu.CUgraphConditionalNodeType
    for kind, bodies, default, ran in ((cond.CU_GRAPH_COND_TYPE_IF, 2, 1, 1.0), (cond.CU_GRAPH_COND_TYPE_IF, 2, 0, 2.0),
                                       (cond.CU_GRAPH_COND_TYPE_SWITCH, 3, 2, 3.0),
                                       (cond.CU_GRAPH_COND_TYPE_SWITCH, 3, 7, 0.0),
                                       (cond.CU_GRAPH_COND_TYPE_WHILE, 1, 0, 0.0)):
        upload(x, floats([0.0] * N))
        graph, _ = conditional_graph(kind, bodies, default)
        graph_exec = instantiate_and_run(graph, f"{kind.name} with {default}")
        ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        got = download(x)[:2]
        check(got == [ran, ran], f"{kind.name} with value {default} ran the right body", repr(got))
        ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
        ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    fails(cu.cuGraphConditionalHandleCreate(graph, ctx, 0, 2), R.CUDA_ERROR_INVALID_VALUE, "unknown condition flags")
    handle = ok(cu.cuGraphConditionalHandleCreate(graph, ctx, 0, 0), "cuGraphConditionalHandleCreate")
    params = cu.CUgraphNodeParams()
    params.type = T.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional.handle, params.conditional.size = handle, 2
    params.conditional.type, params.conditional.ctx = cond.CU_GRAPH_COND_TYPE_WHILE, ctx
    fails(cu.cuGraphAddNode(graph, None, None, 0, params), R.CUDA_ERROR_INVALID_VALUE, "a while node of two bodies")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")


def graph_mem(attr: str) -> int:
    value = cu.cuDeviceGetGraphMemAttribute(dev, getattr(cu.CUgraphMem_attribute, f"CU_GRAPH_MEM_ATTR_{attr}"))
    return int(ok(value, f"graph memory {attr}"))


def launch_twice(graph: object, target: object, value: float, what: str) -> object:
    """Instantiate `graph` and launch it twice, `target` cleared before each; each launch must leave `value`."""
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    for launch_ in ("first", "second"):
        upload(target, floats([0.0] * N))
        ok(cu.cuGraphLaunch(graph_exec, stream), f"cuGraphLaunch {launch_}")
        ok(cu.cuStreamSynchronize(stream), f"synchronize {launch_}")
        check(download(target) == [value] * N, f"{what}, {launch_} launch: {value}")
    return graph_exec


@section
def graph_memory_nodes() -> None:
    """An allocation node -> memset 7 on it -> copy it to z -> its free node, launched twice; the device's graph
    memory as cuda-python's own test checks it; the getters; trimmed after the graph and its instantiation go."""
    params = cu.CUDA_MEM_ALLOC_NODE_PARAMS()
    params.poolProps.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    params.poolProps.location.id = dev
    params.poolProps.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    params.bytesize = 4 * N
    graph = ok(cu.cuGraphCreate(0), "cuGraphCreate")
    alloc = ok(cu.cuGraphAddMemAllocNode(graph, None, 0, params), "cuGraphAddMemAllocNode")
    dptr = params.dptr
    check(int(dptr) != 0, "the allocation node gives its address at once", repr(dptr))
    m = cu.CUDA_MEMSET_NODE_PARAMS()
    m.dst, m.value, m.elementSize, m.width, m.height = dptr, 0x40E00000, 4, N, 1  # 7.0
    fill = ok(cu.cuGraphAddMemsetNode(graph, [alloc], 1, m, ctx), "cuGraphAddMemsetNode on it")
    c = cu.CUDA_MEMCPY3D()
    c.srcMemoryType = c.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    c.srcDevice, c.dstDevice, c.WidthInBytes, c.Height, c.Depth = dptr, z, 4 * N, 1, 1
    out = ok(cu.cuGraphAddMemcpyNode(graph, [fill], 1, c, ctx), "cuGraphAddMemcpyNode from it")
    free = ok(cu.cuGraphAddMemFreeNode(graph, [out], 1, dptr), "cuGraphAddMemFreeNode")
    kinds = [ok(cu.cuGraphNodeGetType(n), "cuGraphNodeGetType") for n in (alloc, free)]
    check(kinds == [T.CU_GRAPH_NODE_TYPE_MEM_ALLOC, T.CU_GRAPH_NODE_TYPE_MEM_FREE], "memory nodes' types", repr(kinds))
    got = ok(cu.cuGraphMemAllocNodeGetParams(alloc), "cuGraphMemAllocNodeGetParams")
    check(got.bytesize == 4 * N and int(got.dptr) == int(dptr), "the allocation node's parameters", repr(got.bytesize))
    freed = ok(cu.cuGraphMemFreeNodeGetParams(free), "cuGraphMemFreeNodeGetParams")
    check(int(freed) == int(dptr), "the free node's address", repr(freed))
    graph_exec = launch_twice(graph, z, 7.0, "through the graph's own memory")
    used = graph_mem("USED_MEM_CURRENT")
    check(used >= 4 * N and graph_mem("USED_MEM_HIGH") == used and graph_mem("RESERVED_MEM_CURRENT") == used
          and graph_mem("RESERVED_MEM_HIGH") == used, "graph memory: used >= the allocation, all four alike", str(used))
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    ok(cu.cuDeviceGraphMemTrim(dev), "cuDeviceGraphMemTrim")
    if XPUREMOTE:  # the sim's model: memory stays reserved until trimmed, used goes with the instantiation
        check(graph_mem("USED_MEM_CURRENT") == 0 and graph_mem("RESERVED_MEM_CURRENT") == 0,
              "after the graph, its instantiation and a trim: no graph memory")
    A = cu.CUgraphMem_attribute
    ok(cu.cuDeviceSetGraphMemAttribute(dev, A.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, cu.cuuint64_t(0)),
       "cuDeviceSetGraphMemAttribute resets a high watermark")
    check(graph_mem("USED_MEM_HIGH") == graph_mem("USED_MEM_CURRENT"), "the high watermark is the current amount")


@section
def allocation_in_a_capture() -> None:
    """cuMemAllocAsync, a memset on it, a copy to w and cuMemFreeAsync captured: memory nodes, replayed twice;
    an allocation the captured graph does not free lives on after its launch and is freed outside."""
    ok(cu.cuStreamBeginCapture(stream, GLOBAL), "cuStreamBeginCapture")
    dptr = ok(cu.cuMemAllocAsync(4 * N, stream), "cuMemAllocAsync in the capture")
    ok(cu.cuMemsetD32Async(dptr, 0x40A00000, N, stream), "cuMemsetD32Async 5 on it")  # 5.0
    ok(cu.cuMemcpyDtoDAsync(w, dptr, 4 * N, stream), "cuMemcpyDtoDAsync to w")
    ok(cu.cuMemFreeAsync(dptr, stream), "cuMemFreeAsync in the capture")
    graph = ok(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
    types = sorted(int(ok(cu.cuGraphNodeGetType(n), "cuGraphNodeGetType"))
                   for n in node_list(cu.cuGraphGetNodes, graph, "cuGraphGetNodes"))
    check(types == sorted(int(t) for t in (T.CU_GRAPH_NODE_TYPE_MEM_ALLOC, T.CU_GRAPH_NODE_TYPE_MEMSET,
                                           T.CU_GRAPH_NODE_TYPE_MEMCPY, T.CU_GRAPH_NODE_TYPE_MEM_FREE)),
          "the capture made allocation and free nodes", repr(types))
    graph_exec = launch_twice(graph, w, 5.0, "captured memory nodes")
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")
    ok(cu.cuStreamBeginCapture(stream, GLOBAL), "cuStreamBeginCapture, keeping the allocation")
    kept = ok(cu.cuMemAllocAsync(4 * N, stream), "cuMemAllocAsync in the capture")
    ok(cu.cuMemsetD32Async(kept, 0x41000000, N, stream), "cuMemsetD32Async 8 on it")  # 8.0
    graph = ok(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
    graph_exec = instantiate_and_run(graph, "a graph that keeps its allocation")
    check(download(kept) == [8.0] * N, "the allocation outlives the launch: read outside the graph")
    ok(cu.cuMemFreeAsync(kept, stream), "cuMemFreeAsync outside the graph")
    ok(cu.cuStreamSynchronize(stream), "synchronize")
    if XPUREMOTE:
        plain = ok(cu.cuMemAlloc(64), "cuMemAlloc")
        ok(cu.cuStreamBeginCapture(stream, GLOBAL), "cuStreamBeginCapture")
        fails(cu.cuMemFreeAsync(plain, stream), R.CUDA_ERROR_INVALID_VALUE, "a capture frees only a graph's memory")
        ok(cu.cuGraphDestroy(ok(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")), "cuGraphDestroy")
        ok(cu.cuMemFree(plain), "cuMemFree: still allocated")
    ok(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
    ok(cu.cuGraphDestroy(graph), "cuGraphDestroy")


for ptr in (x, y, z, w):
    ok(cu.cuMemFree(ptr), "cuMemFree")
finish()
