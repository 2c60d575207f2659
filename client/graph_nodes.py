"""Graphs built node by node: adding nodes, new parameters for them (in a graph or in an instantiation),
the polymorphic forms, and the getters of the parameters the client gave.

Kernel, memset and copy nodes go as the client's own requests (xpuGraphAdd*Node, xpuGraphNodeSet*): their
structs hold host pointers (a kernel's argument pointers, a copy's host side). A copy with a host side is
staged through device memory (client/graph_state.py). The getters answer from what the client was given
for the nodes it made; a node a capture or a clone made has no such record.
"""

from __future__ import annotations

from typing import Any

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import (
    CONDITIONAL_BODIES,
    CONDITIONAL_NODE,
    KERNEL_NODE,
    KERNEL_NODE_V2,
    MEM_ALLOC_NODE,
    MEMCPY3D,
    MEMSET_NODE,
)

from . import graph_state, marshal, memory, modules
from .driver import Driver, implements
from .graph_state import HostCopy
from .memory import ARRAY, HOST, UNIFIED, is_device

NODE_TYPE = {name: ENUMS[f"CU_GRAPH_NODE_TYPE_{name}"] for name in (
    "KERNEL", "MEMCPY", "MEMSET", "GRAPH", "EMPTY", "WAIT_EVENT", "EVENT_RECORD", "CONDITIONAL", "MEM_ALLOC",
    "MEM_FREE")}
PARAMS_AT = 16  # CUgraphNodeParams: the node's type, 12 reserved bytes, then the union of every type's parameters
COPY_AT = 16  # CUDA_MEMCPY_NODE_PARAMS: flags, reserved, the context, then the CUDA_MEMCPY3D
PROPS = memprops.POOL_PROPS.size  # CUDA_MEM_ALLOC_NODE_PARAMS: the pool's properties, then MEM_ALLOC_NODE


def _node(d: Driver, call: Call, node_out: int, graph: int, deps: int, count: int) -> tuple[int, bytes | None]:
    """A new node's client handle (written for the application) and its dependencies' handles."""
    dependencies = _dependencies(call, node_out, graph, deps, count)
    node = d.new_handle()
    marshal.put_u64(node_out, node)
    return node, dependencies


def _dependencies(call: Call, node_out: int, graph: int, deps: int, count: int) -> bytes | None:
    """The handles a new node depends on, once the pointers a node's creation needs are there."""
    if not node_out or not graph or (count and not deps):
        raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: a required pointer is NULL")
    return marshal.read(deps, 8 * count) if count else None


# ---- each type's parameters, as the client's requests take them -------------------------------------------
def _kernel_params(d: Driver, params: int, v2: bool) -> list[Any]:
    """A kernel node's CUDA_KERNEL_NODE_PARAMS (or its _v2), as xpuGraph*Kernel* take it: the function's
    handle, grid, block, shared bytes, the arguments packed as for launches, their size. The function named
    (a CUfunction or a CUkernel) is kept as the getter's answer, `func`."""
    if not params:
        raise CudaError(errors.INVALID_VALUE, "nodeParams is NULL")
    if v2:
        func, gx, gy, gz, bx, by, bz, shared, kernel_params, extra, kern, _ctx = KERNEL_NODE_V2.unpack(
            marshal.read(params, KERNEL_NODE_V2.size))
        func = func or kern
    else:
        func, gx, gy, gz, bx, by, bz, shared, kernel_params, extra = KERNEL_NODE.unpack(
            marshal.read(params, KERNEL_NODE.size))
    fn = modules.ensure_function(d, func)
    packed = modules.pack_params(fn, kernel_params, extra)
    return [fn.handle, gx, gy, gz, bx, by, bz, shared, packed, len(packed)]


def _kernel_record(d: Driver, kernel: list[Any]) -> tuple[tuple[int, bytes], Any]:
    """What the kernel getters answer: a CUDA_KERNEL_NODE_PARAMS_v2 whose kernelParams point into the client's
    copy of the arguments (as the driver's point into its own)."""
    handle, gx, gy, gz, bx, by, bz, shared, packed, _size = kernel
    fn = modules.registry(d)[2][handle]
    values = marshal.ffi.new("char[]", packed or b"\0")
    base = int(marshal.ffi.cast("uintptr_t", values))
    pointers = marshal.ffi.new("uint64_t[]", [base + p.offset for p in fn.kernel.params] or [0])
    struct_ = KERNEL_NODE_V2.pack(handle, gx, gy, gz, bx, by, bz, shared, int(marshal.ffi.cast("uintptr_t", pointers)),
                                  0, 0, 0)
    return (NODE_TYPE["KERNEL"], struct_), (values, pointers)


def _memset_params(params: int) -> list[Any]:
    """CUDA_MEMSET_NODE_PARAMS: destination, pitch, value, element size, width, height."""
    if not params:
        raise CudaError(errors.INVALID_VALUE, "memsetParams is NULL")
    dst, pitch, value, element, width, height = MEMSET_NODE.unpack(marshal.read(params, MEMSET_NODE.size))
    if element not in (1, 2, 4):
        raise CudaError(errors.INVALID_VALUE, f"memset element size {element}")
    return [dst, pitch, value, element, width, height]


def _memcpy_params(d: Driver, params: int, graph: int, old: list[HostCopy]) -> tuple[list[Any], list[HostCopy]]:
    """A CUDA_MEMCPY3D as one rectangle (destination, its pitch, source, its pitch, width, rows) between device
    addresses, and the host copy staged for a host side (`old`: what the node held)."""
    if not params:
        raise CudaError(errors.INVALID_VALUE, "copyParams is NULL")
    (sx, sy, sz, _slod, stype, shost, sdev, sarr, spitch, sheight,
     dx, dy, dz, _dlod, dtype, dhost, ddev, darr, dpitch, dheight,
     width, height, depth) = MEMCPY3D.unpack(marshal.read(params, MEMCPY3D.size))
    if depth > 1 and (sheight != height or dheight != height):  # slices one after another: one rectangle
        raise CudaError(errors.NOT_SUPPORTED, "a 3D copy node with different slice layouts is not forwarded yet")
    rows = height * max(depth, 1)
    src_host, src = _side(d, stype, shost, sdev, sarr)
    dst_host, dst = _side(d, dtype, dhost, ddev, darr)
    src, dst = src + sx + (sy + sz * sheight) * spitch, dst + dx + (dy + dz * dheight) * dpitch
    if src_host and dst_host:
        raise CudaError(errors.NOT_SUPPORTED, "a copy node from host memory to host memory is not forwarded")
    if not src_host and not dst_host:
        return [dst, dpitch, src, spitch, width, rows], []
    host, pitch = (src, spitch) if src_host else (dst, dpitch)
    copy = graph_state.staged(d, graph, old, src_host, host, pitch, width, rows)
    if src_host:
        return [dst, dpitch, copy.staging.address, width, width, rows], [copy]
    return [copy.staging.address, width, src, spitch, width, rows], [copy]


def _side(d: Driver, kind: int, host: int, device: int, array: int) -> tuple[bool, int]:
    """(is host memory, its address) of one side of a copy node."""
    if kind == ARRAY or array:
        raise CudaError(errors.NOT_SUPPORTED, "a copy node with an array side is not forwarded yet")
    if kind == UNIFIED:
        return not is_device(d, host), host
    return kind == HOST, host if kind == HOST else device


# ---- adding nodes ------------------------------------------------------------------------------------------
@implements("cuGraphAddKernelNode")
def cu_graph_add_kernel_node(d: Driver, call: Call, args: list[Any]) -> None:
    node_out, graph, deps, count, params = args
    _add_kernel(d, call, [node_out, graph, deps, count], params, call.symbol.endswith("_v2"))


def _add_kernel(d: Driver, call: Call, added: list[Any], params: int, v2: bool) -> None:
    kernel = _kernel_params(d, params, v2)
    node = _add_node(d, call, "xpuGraphAddKernelNode", added, kernel)
    graph_state.made(d, added[1], node, *_kernel_record(d, kernel))


@implements("cuGraphAddMemsetNode")
def cu_graph_add_memset_node(d: Driver, call: Call, args: list[Any]) -> None:
    node_out, graph, deps, count, params, _ctx = args
    _add_memset(d, call, [node_out, graph, deps, count], params)


@implements("cuGraphAddMemcpyNode")
def cu_graph_add_memcpy_node(d: Driver, call: Call, args: list[Any]) -> None:
    node_out, graph, deps, count, params, _ctx = args
    _add_memcpy(d, call, [node_out, graph, deps, count], params)


def _add_memset(d: Driver, call: Call, added: list[Any], params: int) -> None:
    node = _add_node(d, call, "xpuGraphAddMemsetNode", added, _memset_params(params))
    graph_state.made(d, added[1], node, (NODE_TYPE["MEMSET"], marshal.read(params, MEMSET_NODE.size)))


def _add_memcpy(d: Driver, call: Call, added: list[Any], params: int) -> None:
    rect, copies = _memcpy_params(d, params, added[1], [])
    node = _add_node(d, call, "xpuGraphAddMemcpyNode", added, rect)
    graph_state.made(d, added[1], node, (NODE_TYPE["MEMCPY"], marshal.read(params, MEMCPY3D.size)))
    graph_state.set_node(d, 0, node, copies)


def _add_node(d: Driver, call: Call, request: str, added: list[Any], params: list[Any]) -> int:
    """A kernel, memset or copy node as `request` (xpuGraphAdd*Node) with the node's parameters read."""
    node_out, graph, deps, count = added
    node, dependencies = _node(d, call, node_out, graph, deps, count)
    size = params[-1] if request == "xpuGraphAddKernelNode" else 0  # the kernel's packed arguments
    d.post(CALLS[request], [node, graph, dependencies, count, *params], size)
    return node


@implements("cuGraphAddEventRecordNode", "cuGraphAddEventWaitNode")
def cu_graph_add_event_node(d: Driver, call: Call, args: list[Any]) -> None:
    d.forward(call, args)
    kind = NODE_TYPE["EVENT_RECORD" if call.family == "cuGraphAddEventRecordNode" else "WAIT_EVENT"]
    graph_state.made(d, args[1], marshal.get(call.params[0], args[0]), (kind, args[4].to_bytes(8, "little")))


@implements("cuGraphAddMemAllocNode")
def cu_graph_add_mem_alloc_node(d: Driver, call: Call, args: list[Any]) -> None:
    node_out, graph, deps, count, params = args
    _add_mem_alloc(d, call, [node_out, graph, deps, count], params)


@implements("cuGraphAddMemFreeNode")
def cu_graph_add_mem_free_node(d: Driver, call: Call, args: list[Any]) -> None:
    d.forward(call, args)
    node = marshal.get(call.params[0], args[0])
    graph_state.made(d, args[1], node, (NODE_TYPE["MEM_FREE"], args[4].to_bytes(8, "little")))


def _add_mem_alloc(d: Driver, call: Call, added: list[Any], params: int) -> None:
    """An allocation node. Its address is the server's answer, fixed for the life of the graph (the client's
    device map holds it until then); the properties' device ordinals go as the server's, the access
    descriptions as their bytes (kept for the getter, as the driver keeps its copy)."""
    node_out, graph, deps, count = added
    dependencies = _dependencies(call, node_out, graph, deps, count)
    if not params:
        raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: nodeParams is NULL")
    given = marshal.read(params, PROPS + MEM_ALLOC_NODE.size)
    props = given[:PROPS]
    access, access_count, size, _ = MEM_ALLOC_NODE.unpack_from(given, PROPS)
    memprops.check_pool_props(props)
    device = memprops.POOL_PROPS.unpack(props)[3]
    d.device(device)
    if not size or (access_count and not access):
        raise CudaError(errors.INVALID_VALUE, f"an allocation node of {size} bytes, {access_count} access descriptions")
    descs = marshal.read(access, access_count * memprops.ACCESS_DESC.size) if access_count else b""
    node, dptr = d.call(CALLS["xpuGraphAddMemAllocNode"], [
        8, graph, dependencies, count,
        memory.to_server(d, memprops.POOL_PROPS, props, 3), memory.to_server(d, memprops.ACCESS_DESC, descs, 1) or None,
        access_count, size, 8])
    address = int.from_bytes(dptr, "little")
    marshal.write(params + PROPS + 24, dptr)
    marshal.write(node_out, node)
    node = int.from_bytes(node, "little")
    kept = marshal.ffi.new("char[]", descs or b"\0")
    given = given[:PROPS] + MEM_ALLOC_NODE.pack(int(marshal.ffi.cast("uintptr_t", kept)) if descs else 0, access_count,
                                                size, address)
    graph_state.made(d, graph, node, (NODE_TYPE["MEM_ALLOC"], given), kept)
    memory.record_device(d, address, size, device, graph=graph)
    graph_state.allocated(d, graph, address)


# ---- new parameters of a node, in its graph or in an instantiation of it (exec 0: the graph's node) ------
def _target(call: Call, args: list[Any]) -> tuple[int, int, list[Any]]:
    """(the instantiation or 0, the node, the rest) of a node setter's arguments."""
    if call.family.startswith("cuGraphExec"):
        return args[0], args[1], args[2:]
    return 0, args[0], args[1:]


@implements("cuGraphKernelNodeSetParams", "cuGraphExecKernelNodeSetParams")
def cu_graph_kernel_node_set_params(d: Driver, call: Call, args: list[Any]) -> None:
    graph_exec, node, (params,) = _target(call, args)
    _set_kernel(d, graph_exec, node, params, call.symbol.endswith("_v2"))


@implements("cuGraphMemsetNodeSetParams", "cuGraphExecMemsetNodeSetParams")
def cu_graph_memset_node_set_params(d: Driver, call: Call, args: list[Any]) -> None:
    graph_exec, node, (params, *_ctx) = _target(call, args)
    _set_memset(d, graph_exec, node, params)


@implements("cuGraphMemcpyNodeSetParams", "cuGraphExecMemcpyNodeSetParams")
def cu_graph_memcpy_node_set_params(d: Driver, call: Call, args: list[Any]) -> None:
    graph_exec, node, (params, *_ctx) = _target(call, args)
    _set_memcpy(d, graph_exec, node, params)


def _set_kernel(d: Driver, graph_exec: int, node: int, params: int, v2: bool) -> None:
    kernel = _kernel_params(d, params, v2)
    d.post(CALLS["xpuGraphNodeSetKernel"], [graph_exec, node, *kernel], kernel[-1])
    if not graph_exec:
        graph_state.remember(d, node, *_kernel_record(d, kernel))


def _set_memset(d: Driver, graph_exec: int, node: int, params: int) -> None:
    d.post(CALLS["xpuGraphNodeSetMemset"], [graph_exec, node, *_memset_params(params)])
    if not graph_exec:
        graph_state.remember(d, node, (NODE_TYPE["MEMSET"], marshal.read(params, MEMSET_NODE.size)))


def _set_memcpy(d: Driver, graph_exec: int, node: int, params: int) -> None:
    """An instantiation's copy node keeps its kind of memory on each side, and only a 1-dimensional one is
    updated, as the driver requires (cuda.h; measured on an H200); a graph's node may change either."""
    old = graph_state.of_node(d, graph_exec, node)
    rect, copies = _memcpy_params(d, params, graph_state.graph_of(d, node), old)
    if graph_exec and ([c.to_device for c in old] != [c.to_device for c in copies]
                       or rect[-1] > 1 or any(c.rows > 1 for c in old)):
        for c in copies:
            graph_state.drop_unheld(d, c)
        raise CudaError(errors.INVALID_VALUE, "an instantiation's copy node keeps which side is host memory, and "
                        "is updated only where the old and the new copy are 1-dimensional")
    d.post(CALLS["xpuGraphNodeSetMemcpy"], [graph_exec, node, *rect])
    graph_state.set_node(d, graph_exec, node, copies)
    if not graph_exec:
        graph_state.remember(d, node, (NODE_TYPE["MEMCPY"], marshal.read(params, MEMCPY3D.size)))


@implements("cuGraphExecUpdate")
def cu_graph_exec_update(d: Driver, call: Call, args: list[Any]) -> None:
    """The instantiation takes the graph's parameters where the two have the same shape; the result says
    why not otherwise (the node at fault is not named: 0)."""
    graph_exec, graph, *outs = args
    (result,) = d.call(CALLS["xpuGraphExecUpdate"], [graph_exec, graph, 4])
    result = int.from_bytes(result, "little")
    if len(outs) == 1:  # _v2: CUgraphExecUpdateResultInfo {result, errorNode, errorFromNode}
        if not outs[0]:
            raise CudaError(errors.INVALID_VALUE, "resultInfo is NULL")
        marshal.write(outs[0], result.to_bytes(8, "little") + bytes(16))
    else:
        error_node, result_out = outs
        if error_node:
            marshal.put_u64(error_node, 0)
        marshal.put(call.params[3], result_out, result)
    if result:
        raise CudaError(ENUMS["CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"], f"the graph cannot update the instantiation "
                        f"(CUgraphExecUpdateResult {result})")
    graph_state.instantiated(d, graph, graph_exec)


# ---- getters: what the client was given -----------------------------------------------------------------
def _given(d: Driver, node: int, kind: int) -> bytes:
    found = graph_state.given(d, node)
    if found is None:
        raise CudaError(errors.NOT_SUPPORTED, "the parameters of a node that a capture or a clone made (or of this "
                        "node's type) are not kept by the client")
    if found[0] != kind:
        raise CudaError(errors.INVALID_VALUE, f"the node is of type {found[0]} (CUgraphNodeType), not {kind}")
    return found[1]


GETTERS = {"cuGraphMemcpyNodeGetParams": "MEMCPY", "cuGraphMemsetNodeGetParams": "MEMSET",
           "cuGraphMemAllocNodeGetParams": "MEM_ALLOC", "cuGraphMemFreeNodeGetParams": "MEM_FREE",
           "cuGraphEventRecordNodeGetEvent": "EVENT_RECORD", "cuGraphEventWaitNodeGetEvent": "WAIT_EVENT"}


@implements(*GETTERS)
def cu_graph_node_get(d: Driver, call: Call, args: list[Any]) -> None:
    """A memset, copy, memory or event node's parameters as the client gave them."""
    node, out = args
    marshal.write(out, _given(d, node, NODE_TYPE[GETTERS[call.family]]))


@implements("cuGraphKernelNodeGetParams")
def cu_graph_kernel_node_get_params(d: Driver, call: Call, args: list[Any]) -> None:
    """The _v2 struct; the first form's is its first part."""
    node, out = args
    given = _given(d, node, NODE_TYPE["KERNEL"])
    marshal.write(out, given if call.symbol.endswith("_v2") else given[:KERNEL_NODE.size])


@implements("cuGraphEventRecordNodeSetEvent", "cuGraphEventWaitNodeSetEvent", "cuGraphExecEventRecordNodeSetEvent",
            "cuGraphExecEventWaitNodeSetEvent")
def cu_graph_event_node_set_event(d: Driver, call: Call, args: list[Any]) -> None:
    graph_exec, node, (event,) = _target(call, args)
    d.forward(call, args)
    if not graph_exec:
        kind = NODE_TYPE["EVENT_RECORD" if "Record" in call.family else "WAIT_EVENT"]
        graph_state.remember(d, node, (kind, event.to_bytes(8, "little")))


@implements("cuGraphNodeGetEnabled")
def cu_graph_node_get_enabled(d: Driver, call: Call, args: list[Any]) -> None:
    """As the client last set it (cuGraphNodeSetEnabled); a node is enabled when instantiated."""
    graph_exec, node, out = args
    if not out:
        raise CudaError(errors.INVALID_VALUE, "isEnabled is NULL")
    marshal.put(call.params[2], out, int(graph_state.enabled(d, graph_exec, node)))


@implements("cuGraphNodeSetEnabled")
def cu_graph_node_set_enabled(d: Driver, call: Call, args: list[Any]) -> None:
    d.forward(call, args)
    graph_state.set_enabled(d, args[0], args[1], bool(args[2]))


@implements("cuGraphNodeGetParams")
def cu_graph_node_get_params(d: Driver, call: Call, args: list[Any]) -> None:
    """A memset, copy or memory node's parameters in the polymorphic struct (the context: NULL, the current
    one)."""
    node, out = args
    found = graph_state.given(d, node)
    kind = found[0] if found else -1
    given = _given(d, node, kind)
    at = PARAMS_AT + (COPY_AT if kind == NODE_TYPE["MEMCPY"] else 0)
    marshal.write(out, kind.to_bytes(4, "little") + bytes(at - 4) + given)


# ---- the polymorphic forms -----------------------------------------------------------------------------------
@implements("cuGraphAddNode")
def cu_graph_add_node(d: Driver, call: Call, args: list[Any]) -> None:
    """Each node type goes as the call that adds a node of that type."""
    node_out, graph, deps, *edge_data, count, params = args
    if not params:
        raise CudaError(errors.INVALID_VALUE, "nodeParams is NULL")
    if edge_data and edge_data[0] and count and any(marshal.read(edge_data[0], 8 * count)):
        raise CudaError(errors.NOT_SUPPORTED, "graph edges other than plain ones (edge data) are not forwarded yet")
    kind = int.from_bytes(marshal.read(params, 4), "little")
    union = params + PARAMS_AT
    added = [node_out, graph, deps, count]
    if kind == NODE_TYPE["KERNEL"]:  # CUDA_KERNEL_NODE_PARAMS_v3, laid out as _v2
        _add_kernel(d, call, added, union, True)
    elif kind == NODE_TYPE["MEMSET"]:  # CUDA_MEMSET_NODE_PARAMS_v2: the _v1 fields, then the context
        _add_memset(d, call, added, union)
    elif kind == NODE_TYPE["MEMCPY"]:
        _add_memcpy(d, call, added, union + COPY_AT)
    elif kind == NODE_TYPE["EMPTY"]:
        d.forward(CALLS["cuGraphAddEmptyNode"], added)
    elif kind == NODE_TYPE["GRAPH"]:
        graph_state.add_child(d, added, int.from_bytes(marshal.read(union, 8), "little"))
    elif kind in (NODE_TYPE["WAIT_EVENT"], NODE_TYPE["EVENT_RECORD"]):
        symbol = "cuGraphAddEventWaitNode" if kind == NODE_TYPE["WAIT_EVENT"] else "cuGraphAddEventRecordNode"
        cu_graph_add_event_node(d, CALLS[symbol], [*added, int.from_bytes(marshal.read(union, 8), "little")])
    elif kind == NODE_TYPE["CONDITIONAL"]:
        _add_conditional(d, call, added, union)
    elif kind == NODE_TYPE["MEM_ALLOC"]:  # CUDA_MEM_ALLOC_NODE_PARAMS_v2, laid out as _v1
        _add_mem_alloc(d, call, added, union)
    elif kind == NODE_TYPE["MEM_FREE"]:
        address = int.from_bytes(marshal.read(union, 8), "little")  # CUDA_MEM_FREE_NODE_PARAMS
        cu_graph_add_mem_free_node(d, CALLS["cuGraphAddMemFreeNode"], [*added, address])
    else:
        raise CudaError(errors.NOT_SUPPORTED, f"graph nodes of type {kind} (CUgraphNodeType) are not forwarded yet")


@implements("cuGraphNodeSetParams", "cuGraphExecNodeSetParams")
def cu_graph_node_set_params(d: Driver, call: Call, args: list[Any]) -> None:
    """Kernel, memset and copy nodes' new parameters, as their own setters."""
    graph_exec, node, (params,) = _target(call, args)
    if not params:
        raise CudaError(errors.INVALID_VALUE, "nodeParams is NULL")
    kind = int.from_bytes(marshal.read(params, 4), "little")
    union = params + PARAMS_AT
    if kind == NODE_TYPE["KERNEL"]:
        _set_kernel(d, graph_exec, node, union, True)
    elif kind == NODE_TYPE["MEMSET"]:
        _set_memset(d, graph_exec, node, union)
    elif kind == NODE_TYPE["MEMCPY"]:
        _set_memcpy(d, graph_exec, node, union + COPY_AT)
    else:
        raise CudaError(errors.NOT_SUPPORTED, f"new parameters for graph nodes of type {kind} (CUgraphNodeType) are "
                        "not forwarded yet")


def _add_conditional(d: Driver, call: Call, added: list[Any], params: int) -> None:
    """A conditional node: its body graphs are made and named by the server; the array that lists them is the
    client's, kept for the process (the driver's lives as long as the node), its address written in `params`."""
    node_out, graph, deps, count = added
    handle, kind, size, _, _ = CONDITIONAL_NODE.unpack(marshal.read(params, CONDITIONAL_NODE.size))
    dependencies = _dependencies(call, node_out, graph, deps, count)
    if not 1 <= size <= CONDITIONAL_BODIES.get(kind, 0):
        raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: a conditional node of type {kind} with {size} bodies")
    node, bodies = d.call(CALLS["xpuGraphAddConditionalNode"], [8, graph, dependencies, count, handle, kind, size, 1])
    array = marshal.ffi.new("uint64_t[]", bodies)
    d.state.setdefault("conditional_bodies", []).append(array)
    graph_state.registry(d).bodies.update(bodies)
    marshal.write(params + 16, int(marshal.ffi.cast("uintptr_t", array)).to_bytes(8, "little"))
    marshal.write(node_out, node)
