"""What the client keeps of graphs: the parameters of the nodes it made, as given (the getters answer them), which
of an instantiation's nodes are disabled, the addresses of each graph's allocations (in the device map while the
graph or an instantiation of it lives), and the host sides of copy nodes, staged through device memory of the
session's own.

A graph runs on the server, which cannot read or write the application's memory when one of its nodes
runs. So a copy node with a host side becomes, on the server, a device-to-device node to or from a
staging buffer (a cuMemAlloc of the session's, one per node), and the host half of the copy travels with
each launch of a graph that holds it: the bytes a launch copies to the GPU are read from the application's
memory when the graph is launched (as cuMemcpyHtoDAsync reads them when it is called), and those it copies
to the host are written into the application's memory when the answer comes back, which is before any later
synchronisation can report the launch done (as a cuMemcpyDtoHAsync into page-locked memory).

The client keeps, per graph and per instantiation, the host copies of each node (a child-graph node holds its
child's), so that a launch knows them without asking. Staging buffers are shared by the graphs, clones and
instantiations that copy a node, and freed when the last of them goes.

What differs from a driver that runs the node on the machine of the host memory: within one launch, a node
copying to the GPU does not see bytes that an earlier node of the same launch copied to the host; a copy to
the host lands only when the whole launch is done. Host copies are refused in a conditional node's bodies
(whether a body runs is known only on the server) and in a stream capture (as before).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.errors import CudaError

from . import marshal, memory
from .driver import Driver, implements
from .streams import HOST_COPY, refuse_in_capture, stream_of


@dataclass(eq=False)
class Staging:
    """A device buffer holding one node's bytes between the GPU and the host half of its copy."""

    address: int
    size: int
    holders: int = 0


@dataclass(frozen=True)
class HostCopy:
    to_device: bool  # the host is the source (else the destination)
    host: int  # the first byte on the host
    pitch: int  # of the host rows
    width: int  # bytes per row
    rows: int
    staging: Staging


@dataclass(eq=False)
class GraphMemory:
    """A graph's allocations: their addresses stay in the device map while the graph or an instantiation of it
    lives (PyTorch destroys a captured graph once it is instantiated, and replays the instantiation)."""

    addresses: list[int] = field(default_factory=list)
    holders: int = 1


Copies = dict[int, list[HostCopy]]  # node -> its host copies (a child-graph node: its child's)


@dataclass
class Registry:
    graphs: dict[int, Copies] = field(default_factory=dict)
    execs: dict[int, Copies] = field(default_factory=dict)
    nodes: dict[int, int] = field(default_factory=dict)  # node -> graph, for the nodes the client made
    params: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # node -> (its type, its struct as given)
    bodies: set[int] = field(default_factory=set)  # conditional nodes' body graphs
    allocations: dict[int, GraphMemory] = field(default_factory=dict)  # graph -> its allocations
    exec_memory: dict[int, GraphMemory] = field(default_factory=dict)  # instantiation -> its graph's allocations
    keep: dict[int, Any] = field(default_factory=dict)  # node -> what its given parameters point to
    disabled: set[tuple[int, int]] = field(default_factory=set)  # (instantiation, node) set disabled


def registry(d: Driver) -> Registry:
    if "graph_nodes" not in d.state:
        d.state["graph_nodes"] = Registry()
    return d.state["graph_nodes"]


# ---- a node's copy -----------------------------------------------------------------------------------------
def staged(d: Driver, graph: int, old: list[HostCopy], to_device: bool, host: int, pitch: int, width: int,
           rows: int) -> HostCopy:
    """A host copy of a node of `graph`: the node's staging buffer (`old`, what it held) where it is large
    enough, else a new one; the node copies to or from it on the server."""
    if graph in registry(d).bodies:
        raise CudaError(errors.NOT_SUPPORTED, "a copy with a host side in a conditional node's body is not "
                        "forwarded: whether the body runs is known only on the server")
    if not width or not rows:
        raise CudaError(errors.INVALID_VALUE, "an empty copy node")
    if old and width * rows <= old[0].staging.size:
        return HostCopy(to_device, host, pitch, width, rows, old[0].staging)
    out = marshal.ffi.new("uint64_t[1]")
    memory.cu_mem_alloc(d, CALLS["cuMemAlloc_v2"], [int(marshal.ffi.cast("uintptr_t", out)), width * rows])
    return HostCopy(to_device, host, pitch, width, rows, Staging(out[0], width * rows))


def _hold(copies: list[HostCopy]) -> list[HostCopy]:
    for c in copies:
        c.staging.holders += 1
    return copies


def _release(d: Driver, copies: list[HostCopy]) -> None:
    for c in copies:
        c.staging.holders -= 1
        drop_unheld(d, c)


def _put(d: Driver, table: Copies, node: int, copies: list[HostCopy]) -> None:
    """`node`'s copies in a graph's or an instantiation's table, in place of what it held (held first: the new
    copies may share a staging buffer with the old)."""
    old = table.pop(node, [])
    if copies:
        table[node] = _hold(list(copies))
    _release(d, old)


def drop_unheld(d: Driver, copy: HostCopy) -> None:
    """A copy's staging buffer freed once nothing holds it (released, or staged for parameters then refused)."""
    if copy.staging.holders == 0:
        memory.cu_mem_free(d, CALLS["cuMemFree_v2"], [copy.staging.address])


def made(d: Driver, graph: int, node: int, params: tuple[int, bytes] | None = None, keep: Any = None) -> None:
    """A node the client made, and (its type, the struct) it was given, kept for the getters with what the struct
    points to."""
    registry(d).nodes[node] = graph
    if params is not None:
        remember(d, node, params, keep)


def remember(d: Driver, node: int, params: tuple[int, bytes], keep: Any = None) -> None:
    """New parameters of a node the client made."""
    r = registry(d)
    if node in r.nodes:
        r.params[node] = params
        r.keep[node] = keep


def enabled(d: Driver, graph_exec: int, node: int) -> bool:
    return (graph_exec, node) not in registry(d).disabled


def set_enabled(d: Driver, graph_exec: int, node: int, on: bool) -> None:
    (registry(d).disabled.discard if on else registry(d).disabled.add)((graph_exec, node))


def given(d: Driver, node: int) -> tuple[int, bytes] | None:
    return registry(d).params.get(node)


def graph_of(d: Driver, node: int) -> int:
    return registry(d).nodes.get(node, 0)


def of_node(d: Driver, graph_exec: int, node: int) -> list[HostCopy]:
    """A node's host copies in an instantiation (exec != 0), or in its graph."""
    r = registry(d)
    table = r.execs.get(graph_exec) if graph_exec else r.graphs.get(r.nodes.get(node, 0))
    return (table or {}).get(node, [])


def set_node(d: Driver, graph_exec: int, node: int, copies: list[HostCopy]) -> None:
    """Record a node's host copies (none: a device-only node) in its instantiation or its graph."""
    r = registry(d)
    if graph_exec:
        _lane_forgets(d, graph_exec)
        _put(d, r.execs.setdefault(graph_exec, {}), node, copies)
    elif node in r.nodes:
        _put(d, r.graphs.setdefault(r.nodes[node], {}), node, copies)
    elif copies:
        for c in copies:
            drop_unheld(d, c)
        raise CudaError(errors.NOT_SUPPORTED, "a host side for a copy node the client did not make (a capture's "
                        "or a clone's) is not forwarded")


# ---- graphs, their children, clones and instantiations -----------------------------------------------------
def _held(table: Copies) -> Copies:
    """A copy of a graph's table for a clone or an instantiation, which holds its staging buffers too."""
    return {node: _hold(list(copies)) for node, copies in table.items()}


def _flat(table: Copies | None) -> list[HostCopy]:
    return [c for copies in (table or {}).values() for c in copies]


def add_child(d: Driver, added: list[Any], child: int) -> None:
    """A child-graph node copies its child: the child's host copies are the node's."""
    call = CALLS["cuGraphAddChildGraphNode"]
    d.forward(call, [*added, child])
    node = marshal.get(call.params[0], added[0])
    made(d, added[1], node)
    set_node(d, 0, node, _flat(registry(d).graphs.get(child)))


@implements("cuGraphAddChildGraphNode")
def cu_graph_add_child_graph_node(d: Driver, call: Call, args: list[Any]) -> None:
    add_child(d, args[:4], args[4])


def cloned(d: Driver, original: int, clone: int) -> None:
    """A clone holds the original's copies (under the original's node handles: the clone's nodes are named by
    the server)."""
    table = registry(d).graphs.get(original)
    if table:
        registry(d).graphs[clone] = _held(table)


def _lane_forgets(d: Driver, graph_exec: int) -> None:
    """The instantiation's launches come here again (its host copies may change), until one shows none."""
    if d.lane is not None:
        d.lane.forget(graph_exec)


def instantiated(d: Driver, graph: int, graph_exec: int) -> None:
    """A new instantiation, or one updated from `graph` (cuGraphExecUpdate): the graph's copies."""
    r = registry(d)
    _lane_forgets(d, graph_exec)
    _release(d, _flat(r.execs.pop(graph_exec, None)))
    table = r.graphs.get(graph)
    if table:
        r.execs[graph_exec] = _held(table)


def allocated(d: Driver, graph: int, address: int) -> None:
    """An allocation of `graph`'s (an allocation node, or an allocation in its capture)."""
    registry(d).allocations.setdefault(graph, GraphMemory()).addresses.append(address)


def hold_memory(d: Driver, graph: int, graph_exec: int) -> None:
    """A new instantiation holds its graph's allocations."""
    r = registry(d)
    held = r.allocations.get(graph)
    if held is not None:
        held.holders += 1
        r.exec_memory[graph_exec] = held


def _release_memory(d: Driver, held: GraphMemory | None) -> None:
    if held is None:
        return
    held.holders -= 1
    if not held.holders:
        for address in held.addresses:
            memory.maps(d)[0].remove(address)


@implements("cuGraphDestroy")
def cu_graph_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    d.forward(call, args)
    forget_graph(d, args[0])


def forget_graph(d: Driver, graph: int) -> None:
    """A graph destroyed: its nodes' records, its host copies' staging, its allocations' addresses."""
    r = registry(d)
    r.bodies.discard(graph)
    for node in [n for n, g in r.nodes.items() if g == graph]:
        _forget_node(r, node)
    _release(d, _flat(r.graphs.pop(graph, None)))
    _release_memory(d, r.allocations.pop(graph, None))


@implements("cuGraphExecDestroy")
def cu_graph_exec_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    d.forward(call, args)
    _lane_forgets(d, args[0])
    r = registry(d)
    _release(d, _flat(r.execs.pop(args[0], None)))
    _release_memory(d, r.exec_memory.pop(args[0], None))
    r.disabled = {(e, n) for e, n in r.disabled if e != args[0]}


@implements("cuGraphDestroyNode")
def cu_graph_destroy_node(d: Driver, call: Call, args: list[Any]) -> None:
    d.forward(call, args)
    set_node(d, 0, args[0], [])
    _forget_node(registry(d), args[0])


def _forget_node(r: Registry, node: int) -> None:
    for table in (r.nodes, r.params, r.keep):
        table.pop(node, None)


@implements("cuGraphClone")
def cu_graph_clone(d: Driver, call: Call, args: list[Any]) -> None:
    d.forward(call, args)
    cloned(d, args[1], marshal.get(call.params[0], args[0]))


# ---- launches ----------------------------------------------------------------------------------------------
@implements("cuGraphLaunch")
def cu_graph_launch(d: Driver, call: Call, args: list[Any]) -> None:
    """The host bytes to the staging buffers before the launch; the staging buffers' bytes to the host after."""
    graph_exec, stream = args[0], stream_of(call, args[1])
    copies = _flat(registry(d).execs.get(graph_exec))
    if copies:
        refuse_in_capture(d, stream, HOST_COPY)
    for c in copies:
        if c.to_device:
            memory.to_device(d, c.host, c.pitch, c.staging.address, c.width, c.width, c.rows, stream)
    d.forward(call, args)
    if not copies and d.lane is not None:  # its next launches need nothing of this module: C queues them
        d.lane.allow(graph_exec)
    for c in copies:
        if not c.to_device:
            _to_host_later(d, c, stream)


def _to_host_later(d: Driver, c: HostCopy, stream: int) -> None:
    to_host = CALLS["xpuMemcpy2DToHost"]
    wire_args = [c.width * c.rows, c.staging.address, c.width, c.width, c.rows, stream]
    d.session().call_later(to_host, wire_args, d.wire_ctx(),
                           lambda status, outs: memory.to_host_rows(outs[0], c.host, c.pitch, c.width, c.rows))
