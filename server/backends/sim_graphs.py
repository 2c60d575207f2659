"""Stream capture and CUDA graphs on the sim device.

While a stream captures, its work is recorded as nodes of a graph instead of being done; a
node depends on the work its stream had captured before it, and a stream that waits for an
event recorded in a capture joins that capture. Launching an instantiated graph does its nodes
in an order that respects every edge. The rules the driver enforces are enforced here too, with
its errors: a capture ends on the stream it began on, with every joined stream joined back; a
capturing stream cannot be synchronised; legacy-stream work while a blocking stream captures
is refused (an implicit dependency on captured work); each of these invalidates the capture.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import COND_ASSIGN_DEFAULT, CONDITIONAL_BODIES

from ..gpu_timer import is_gpu_work
from .base import CAPTURE_REFUSED, Backend
from .sim_graph_memory import GraphAllocation

LEGACY = (0, 1)
NON_BLOCKING = ENUMS["CU_STREAM_NON_BLOCKING"]
EXTERNAL = ENUMS["CU_EVENT_RECORD_EXTERNAL"]
SET_DEPENDENCIES = ENUMS["CU_STREAM_SET_CAPTURE_DEPENDENCIES"]
WAITS = ("cuStreamSynchronize", "cuStreamQuery")
RECORDS = ("cuEventRecord", "cuEventRecordWithFlags")
ALLOCS, FREE = ("cuMemAllocAsync", "cuMemAllocFromPoolAsync"), "cuMemFreeAsync"  # in a capture: memory nodes
# looked at while a capture is on
STREAM_CONTROL = (*WAITS, *RECORDS, "cuStreamWaitEvent", *CAPTURE_REFUSED, *ALLOCS, FREE)
SWITCHABLE = tuple(ENUMS[f"CU_GRAPH_NODE_TYPE_{k}"] for k in ("KERNEL", "MEMSET", "MEMCPY"))  # may be disabled
ALLOC_NODE, FREE_NODE = "xpuGraphAddMemAllocNode", "cuGraphAddMemFreeNode"  # the calls memory nodes record
FORGETTING = ("cuStreamDestroy", "cuEventDestroy", "cuGraphDestroy")  # what a capture must hear of
CONDITIONAL = "xpuGraphAddConditionalNode"  # the call a conditional node records
IF, WHILE, SWITCH = (ENUMS[f"CU_GRAPH_COND_TYPE_{t}"] for t in ("IF", "WHILE", "SWITCH"))
MAX_DEPTH = 8  # graphs launched inside graphs, so deep at most
MAX_WORK = 1 << 20  # nodes one launch may run, children's included
MAX_BYTES = 1 << 30  # what the session's graphs may hold (nodes and their kernels' parameters)
MAX_CONDITIONS = 1 << 16  # conditional nodes' conditions a graph may hold
NODE_BYTES = 256  # a node's own keep, beside its parameters


_idents = itertools.count(1)  # graphs' and instantiations' ids, unique in the session


@dataclass(eq=False)
class Node:
    call: Call | None  # None: an empty node, only an ordering point
    args: list[Any]
    graph: Graph
    local: int  # its id within its graph
    deps: list[Node] = field(default_factory=list)
    enabled: bool = True  # an instantiation's node may be disabled (cuGraphNodeSetEnabled)


@dataclass(eq=False)
class Graph:
    nodes: list[Node] = field(default_factory=list)
    ident: int = field(default_factory=lambda: next(_idents))
    size: int = 0  # bytes its nodes hold
    conditions: dict[int, Condition] = field(default_factory=dict)  # its conditional nodes' conditions, by handle

    def add(self, call: Call | None, args: list[Any], deps: list[Node]) -> Node:
        node = Node(call, args, self, len(self.nodes), list(deps))
        self.nodes.append(node)
        return node


def allocations(nodes: list[Node]) -> list[GraphAllocation]:
    """What the allocation nodes among these allocate."""
    return [n.args[0] for n in nodes if n.call is not None and n.call.family == ALLOC_NODE]


@dataclass(eq=False)
class Exec:
    order: list[Node]  # copies of the graph's nodes, each after everything it depends on
    copies: dict[int, Node] = field(default_factory=dict)  # id(a node of the graph) -> its copy here
    shape: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # the graph's, as exec_shape() says
    ident: int = field(default_factory=lambda: next(_idents))
    depth: int = 1  # graphs launched within graphs, this one included
    work: int = 0  # nodes a launch runs, those of the graphs it launches included
    conditions: list[Condition] = field(default_factory=list)  # those of its graph and its conditional bodies
    allocations: list[GraphAllocation] = field(default_factory=list)  # its allocation nodes'
    launched: bool = False


@dataclass(eq=False)
class Condition:
    """A conditional node's condition: its value, set to the default at each launch if `assign` (kernels set
    it on a GPU; the sim runs no device code that could)."""
    default: int
    assign: bool
    value: int = 0


@dataclass(eq=False)
class Conditional:
    """What a conditional node runs: its condition, its type, its body graphs (instantiated with its graph)."""
    condition: Condition
    kind: int
    bodies: list[Any]  # Graph in a graph's node, Exec in an instantiation's


@dataclass(eq=False)
class Capture:
    graph: Graph
    origin: Any  # the key of the stream it began on
    tails: dict[Any, list[Node]]  # stream key -> the nodes that stream's next work depends on
    blocking: bool  # the origin synchronises with the legacy stream
    invalid: str = ""


def key(stream: Any) -> Any:
    """Streams are the backend's objects, or 0/1/2 for the default streams."""
    return stream if isinstance(stream, int) or stream is None else id(stream)


def stream_of(call: Call, args: list[Any]) -> Any:
    """The stream a call's work goes to: its stream argument, a math library handle's stream, or the
    legacy stream for the driver's synchronous copies and memsets; None for work on no stream."""
    for p, a in zip(call.params, args):
        if p.ctype in ("CUstream", "cudaStream_t"):
            return a or 0
    if call.library != "cuda":
        handle = args[0] if args else None
        return (handle.get("stream") if isinstance(handle, dict) else getattr(handle, "stream", None)) or 0
    if is_gpu_work(call):
        return 2 if call.per_thread else 0
    return None


def is_stream_work(call: Call) -> bool:
    """Work a capture records: GPU work of the driver, graph launches, and the math libraries'
    calls on device data (a cuDNN plan's execution names its data inside a variant pack)."""
    if call.library == "cuda":
        return is_gpu_work(call) or call.family == "cuGraphLaunch"
    return any(p.is_address for p in call.params) or call.family.endswith("Execute")


def unjoined(capture: Capture) -> bool:
    """Whether a stream that joined the capture was not joined back: its last nodes must precede the origin's."""
    before: set[int] = set()
    todo = list(capture.tails[capture.origin])
    while todo:
        node = todo.pop()
        if id(node) not in before:
            before.add(id(node))
            todo += node.deps
    return any(id(n) not in before for k, tails in capture.tails.items() if k != capture.origin for n in tails)


NODE_TYPES = {"cuGraphLaunch": "GRAPH", CONDITIONAL: "CONDITIONAL", "cuEventRecord": "EVENT_RECORD",
              "cuEventRecordWithFlags": "EVENT_RECORD", "cuStreamWaitEvent": "WAIT_EVENT", ALLOC_NODE: "MEM_ALLOC",
              FREE_NODE: "MEM_FREE"}


def node_type(node: Node) -> int:
    """The CUgraphNodeType a driver gives such a node: a launched graph is a child graph, a math library's
    work is kernels."""
    if node.call is None:
        name = "EMPTY"
    elif node.call.family.startswith("cuMemset"):
        name = "MEMSET"
    elif node.call.family.startswith(("cuMemcpy", "xpuMemcpy")):
        name = "MEMCPY"
    else:
        name = NODE_TYPES.get(node.call.family, "KERNEL")
    return ENUMS[f"CU_GRAPH_NODE_TYPE_{name}"]


# what a kernel, memset or copy node runs: the call and its arguments, as a launch or a stream's work would be
def kernel_work(func: Any, grid_block_shared: tuple[int, ...], params: bytes, size: int) -> tuple[Call, list[Any]]:
    return CALLS["xpuLaunchKernel"], [func, *grid_block_shared, None, bytes(params), size, 0]


def memset_work(dst: int, pitch: int, value: int, element: int, width: int, height: int) -> tuple[Call, list[Any]]:
    return CALLS[f"cuMemsetD2D{8 * element}Async"], [dst, pitch, value, width, height, None]


def memcpy_work(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> tuple[Call, list[Any]]:
    return CALLS["xpuMemcpy2DDevice"], [dst, dst_pitch, src, src_pitch, width, height, None]


def children(node: Node) -> list[Any]:
    """The instantiations a node runs: a child graph's, a conditional node's bodies'."""
    if node.call is None:
        return []
    if node.call.family == "cuGraphLaunch":
        return [node.args[0]]
    return node.args[0].bodies if node.call.family == CONDITIONAL else []


def bounded(nodes: list[Node]) -> tuple[int, int]:
    """How deep the graphs launched within these nodes go, and how many nodes one launch of them runs (a while
    loop's body once); refused past what the sim runs (MAX_DEPTH, MAX_WORK)."""
    children_ = [c for n in nodes for c in children(n) if isinstance(c, Exec)]
    depth = 1 + max((c.depth for c in children_), default=0)
    work = len(nodes) + sum(c.work for c in children_)
    if depth > MAX_DEPTH or work > MAX_WORK:
        raise CudaError(errors.NOT_SUPPORTED, f"graphs launched {depth} deep, {work} nodes in one launch "
                        f"(the sim runs at most {MAX_DEPTH} deep, {MAX_WORK} nodes)")
    return depth, work


def exec_shape(graph: Graph) -> list[tuple[int, tuple[int, ...]]]:
    """What an instantiation's update may not change: each node's type and the positions of its dependencies."""
    where = {id(n): i for i, n in enumerate(graph.nodes)}
    return [(node_type(n), tuple(sorted(where[id(dep)] for dep in n.deps))) for n in graph.nodes]


def topological(graph: Graph) -> list[Node]:
    waiting = {id(n): len(n.deps) for n in graph.nodes}
    users: dict[int, list[Node]] = {}
    for n in graph.nodes:
        for dep in n.deps:
            users.setdefault(id(dep), []).append(n)
    ready = [n for n in graph.nodes if not n.deps]
    order: list[Node] = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for user in users.get(id(node), ()):
            waiting[id(user)] -= 1
            if not waiting[id(user)]:
                ready.append(user)
    if len(order) != len(graph.nodes):
        raise CudaError(errors.INVALID_VALUE, "the graph's dependencies form a cycle")
    return order


class SimGraphs(Backend):
    """The sim backend's captures and graphs (a part of SimBackend)."""

    def __init__(self) -> None:
        self.captures: dict[Any, Capture] = {}  # stream key -> its capture
        self.graph_bytes = 0  # what the session's graphs hold (MAX_BYTES)
        self.capture_events: dict[int, tuple[Capture, list[Node]]] = {}  # id(event) -> capture, nodes

    def runner(self, call: Call) -> Callable[[list[Any]], Any]:
        """The plain dispatch while no capture is on (a capture may begin between two records)."""
        direct = self.direct(call)
        if direct is None or call.family in FORGETTING:
            return lambda args: self.execute(call, args)
        if any(p.direction == "out" for p in call.params):
            return lambda args: direct(args) if not self.captures else self.execute(call, args)
        method = getattr(self, call.family)  # a lane's record, without `direct`'s call in between
        return lambda args: method(*args) if not self.captures else self.execute(call, args)

    def execute(self, call: Call, args: list[Any]) -> list[Any]:
        if not self.captures:
            return super().execute(call, args)
        if call.family in FORGETTING:
            self.forget(call.family, args[0])
        if not (is_stream_work(call) or call.family in STREAM_CONTROL):
            return super().execute(call, args)
        stream = stream_of(call, args)
        capture = self.capture_of(stream)
        if call.family in RECORDS:
            if capture is not None:
                self.record_event(capture, stream, args)
                return []
            self.capture_events.pop(id(args[0]), None)  # recorded outside any capture now
        elif call.family == "cuStreamWaitEvent":
            self.wait_event(capture, stream, args[1])
        if capture is None or call.family in RECORDS or call.family == "cuStreamWaitEvent":
            return super().execute(call, args)
        if call.family in ALLOCS or call.family == FREE:
            return self.capture_memory(capture, stream, call, args)
        if call.family in WAITS or call.family in CAPTURE_REFUSED:
            self.invalidate(capture, f"{call.family} in a capture")
            raise CudaError(errors.CAPTURE_UNSUPPORTED if call.family in WAITS else errors.NOT_SUPPORTED,
                            f"{call.family} of a capturing stream")
        if len(capture.graph.nodes) >= MAX_WORK:
            self.invalidate(capture, "the capture grew past its bound")
            raise CudaError(errors.OUT_OF_MEMORY, f"a capture of more than {MAX_WORK} nodes")
        self.capture_work(capture, stream, call, args)
        return []

    # ---- what a capture records ------------------------------------------------------------------
    def capture_graph(self, stream: Any) -> Graph | None:
        capture = self.captures.get(key(stream))
        return None if capture is None else capture.graph

    def capture_of(self, stream: Any) -> Capture | None:
        if stream in LEGACY:
            blocking = [c for c in self.captures.values() if c.blocking and not c.invalid]
            if blocking:
                for c in blocking:
                    self.invalidate(c, "legacy-stream work while a blocking stream captured")
                raise CudaError(errors.CAPTURE_IMPLICIT, "the legacy stream synchronises with a capturing stream")
        return self.captures.get(key(stream))

    def capture_work(self, capture: Capture, stream: Any, call: Call, args: list[Any]) -> None:
        node = self.add_node(capture.graph, call, list(args), capture.tails[key(stream)])
        capture.tails[key(stream)] = [node]

    def capture_memory(self, capture: Capture, stream: Any, call: Call, args: list[Any]) -> list[Any]:
        """A stream-ordered allocation in a capture is the graph's allocation node (its address now), a free
        its free node."""
        if call.family == FREE:
            self.capture_work(capture, stream, CALLS[FREE_NODE], [self.graph_allocation(args[0]).address])
            return []
        pool = args[2] if call.family == "cuMemAllocFromPoolAsync" else self.pools.current_of(self._current_device())
        alloc = self.graph_memory.allocate(pool.device, args[1])
        self.capture_work(capture, stream, CALLS[ALLOC_NODE], [alloc])
        return [alloc.address]

    def graph_allocation(self, address: int) -> GraphAllocation:
        alloc = self.graph_memory.allocations.get(address)
        if alloc is None:
            raise CudaError(errors.INVALID_VALUE, f"{address:#x} is not a graph's allocation: a graph frees only "
                            "what a graph allocated")
        return alloc

    def add_node(self, graph: Graph, call: Call | None, args: list[Any], deps: list[Node]) -> Node:
        """A node, within what the session's graphs may hold."""
        size = NODE_BYTES + sum(len(a) for a in args if isinstance(a, (bytes, memoryview)))
        if self.graph_bytes + size > MAX_BYTES:
            raise CudaError(errors.OUT_OF_MEMORY, f"this session's graphs hold {self.graph_bytes} bytes already")
        self.graph_bytes += size
        graph.size += size
        return graph.add(call, args, deps)

    def forget(self, family: str, obj: Any) -> None:
        """A stream or event destroyed leaves its capture; a graph being captured cannot be destroyed."""
        if family == "cuStreamDestroy" and (capture := self.captures.get(key(obj))) is not None:
            self.invalidate(capture, "a stream of the capture was destroyed")
            if capture.origin == key(obj):
                self.end(capture)
            else:
                del self.captures[key(obj)]
        elif family == "cuEventDestroy":
            self.capture_events.pop(id(obj), None)
        elif family == "cuGraphDestroy" and any(c.graph is obj for c in self.captures.values()):
            raise CudaError(errors.ILLEGAL_STATE, "the graph is being captured into")

    def end(self, capture: Capture) -> None:
        for k in [k for k, c in self.captures.items() if c is capture]:
            del self.captures[k]
        for e in [e for e, (c, _) in self.capture_events.items() if c is capture]:
            del self.capture_events[e]

    def record_event(self, capture: Capture, stream: Any, args: list[Any]) -> None:
        event, flags = args[0], args[2] if len(args) > 2 else 0
        if flags & EXTERNAL:
            self.capture_work(capture, stream, CALLS["cuEventRecordWithFlags"], [event, stream, 0])
        self.capture_events[id(event)] = (capture, list(capture.tails[key(stream)]))

    def wait_event(self, capture: Capture | None, stream: Any, event: Any) -> None:
        """Waiting for an event of a capture joins the stream to it, after the event's nodes."""
        joined, nodes = self.capture_events.get(id(event), (None, []))
        if joined is None:
            return
        if capture is None:
            if stream in (0, 1, 2):
                raise CudaError(errors.CAPTURE_IMPLICIT, "a default stream cannot join a capture")
            self.captures[key(stream)] = joined
            joined.tails[key(stream)] = list(nodes)
        elif capture is joined:
            tails = joined.tails[key(stream)]
            tails += [n for n in nodes if n not in tails]
        else:
            self.invalidate(capture, "waited for an event of another capture")
            self.invalidate(joined, "another capture waited for its event")
            raise CudaError(errors.CAPTURE_ISOLATION, "an event of another capture")

    def invalidate(self, capture: Capture, why: str) -> None:
        capture.invalid = capture.invalid or why

    # ---- beginning and ending ---------------------------------------------------------------------
    def xpuStreamBeginCapture(self, stream: Any, mode: int) -> tuple[Graph]:
        if stream in LEGACY or stream is None:
            raise CudaError(errors.CAPTURE_UNSUPPORTED, "the legacy stream cannot be captured")
        if key(stream) in self.captures:
            raise CudaError(errors.ILLEGAL_STATE, "the stream is already capturing")
        blocking = stream != 2 and not getattr(stream, "flags", 0) & NON_BLOCKING
        graph = Graph()
        self.captures[key(stream)] = Capture(graph, key(stream), {key(stream): []}, blocking)
        return (graph,)

    def xpuStreamEndCapture(self, stream: Any, graph_handle: int) -> None:
        capture = self.captures.get(key(stream))
        if capture is None:
            raise CudaError(errors.ILLEGAL_STATE, "the stream is not capturing")
        if capture.origin != key(stream):
            raise CudaError(errors.CAPTURE_UNMATCHED, "a capture ends on the stream where it began")
        if self.handles.get(graph_handle, (None, None))[1] is not capture.graph:
            raise CudaError(errors.INVALID_VALUE, f"{graph_handle:#x} is not the graph of this capture")
        self.end(capture)
        status = errors.CAPTURE_INVALIDATED if capture.invalid else errors.CAPTURE_UNJOINED if unjoined(capture) else 0
        if status:
            self.cuGraphDestroy(capture.graph)
            self.drop_handle(graph_handle)  # the driver destroys the graph of a failed capture
            raise CudaError(status, capture.invalid or "a stream that joined the capture was not joined back")

    def xpuStreamGetCaptureDependencies(self, stream: Any) -> tuple[list[int]]:
        """The nodes the stream's next captured work will depend on, as handles for the client."""
        capture = self.captures.get(key(stream))
        if capture is None:
            raise CudaError(errors.ILLEGAL_STATE, "the stream is not capturing")
        return ([self.name_handle("CUgraphNode", n, capture.graph) for n in capture.tails[key(stream)]],)

    def cuStreamUpdateCaptureDependencies(self, stream: Any, deps: bytes, *rest: Any) -> None:
        """rest: the edges' data (_v2), the count, and whether the nodes replace the stream's or join them."""
        count, flags = rest[-2], rest[-1]
        capture = self.captures.get(key(stream))
        if capture is None:
            raise CudaError(errors.ILLEGAL_STATE, "the stream is not capturing")
        nodes = self.nodes(deps, count)
        if any(n not in capture.graph.nodes for n in nodes):
            raise CudaError(errors.INVALID_VALUE, "a node of another graph")
        tails = capture.tails[key(stream)]
        capture.tails[key(stream)] = nodes if flags & SET_DEPENDENCIES else tails + [n for n in nodes if n not in tails]

    # ---- graphs ----------------------------------------------------------------------------------------
    def nodes(self, raw: bytes | None, count: int) -> list[Node]:
        """Nodes named by client handles in an array."""
        return self.handle_array(raw, count, "CUgraphNode")

    def cuGraphCreate(self, flags: int) -> tuple[Graph]:
        return (Graph(),)

    def cuGraphDestroy(self, graph: Graph) -> None:
        """The worker forgets the handle (and its nodes' and conditional bodies'); instantiations keep what they
        need."""
        for node in graph.nodes:
            if node.call is not None and node.call.family == CONDITIONAL:
                for body in node.args[0].bodies:
                    self.cuGraphDestroy(body)
        self.graph_bytes -= graph.size
        graph.size = 0
        self.graph_memory.release(allocations(graph.nodes))
        graph.nodes = [n for n in graph.nodes if n.call is None or n.call.family != ALLOC_NODE]

    def cuGraphAddEmptyNode(self, graph: Graph, deps: bytes | None, count: int) -> tuple[Node]:
        return (self.add_node(graph, None, [], self.nodes(deps, count)),)

    def cuGraphAddDependencies(self, graph: Graph, sources: bytes, targets: bytes, *rest: Any) -> None:
        """rest: the edges' data (_v2; the sim's edges are all plain), then their count."""
        count = rest[-1]
        for source, target in zip(self.nodes(sources, count), self.nodes(targets, count)):
            if source not in graph.nodes or target not in graph.nodes:
                raise CudaError(errors.INVALID_VALUE, "a dependency between nodes of another graph")
            if source not in target.deps:
                target.deps.append(source)

    def xpuGraphAddKernelNode(self, graph: Graph, deps: bytes | None, count: int, func: Any, gx: int, gy: int,
                              gz: int, bx: int, by: int, bz: int, shared: int, params: bytes,
                              param_bytes: int) -> tuple[Node]:
        call, args = kernel_work(func, (gx, gy, gz, bx, by, bz, shared), params, param_bytes)
        return (self.add_node(graph, call, args, self.nodes(deps, count)),)

    def xpuGraphAddMemsetNode(self, graph: Graph, deps: bytes | None, count: int, dst: int, pitch: int, value: int,
                              element: int, width: int, height: int) -> tuple[Node]:
        call, args = memset_work(dst, pitch, value, element, width, height)
        return (self.add_node(graph, call, args, self.nodes(deps, count)),)

    def xpuGraphAddMemcpyNode(self, graph: Graph, deps: bytes | None, count: int, dst: int, dst_pitch: int,
                              src: int, src_pitch: int, width: int, height: int) -> tuple[Node]:
        call, args = memcpy_work(dst, dst_pitch, src, src_pitch, width, height)
        return (self.add_node(graph, call, args, self.nodes(deps, count)),)

    def xpuGraphCountNodes(self, graph: Graph, roots: int) -> tuple[int]:
        return (sum(1 for n in graph.nodes if not roots or not n.deps),)

    def xpuGraphListNodes(self, graph: Graph, roots: int) -> tuple[list[int]]:
        return ([self.name_handle("CUgraphNode", n, graph) for n in graph.nodes if not roots or not n.deps],)

    def xpuGraphNodeListEdges(self, node: Node, dependents: int) -> tuple[list[int]]:
        found = [n for n in node.graph.nodes if node in n.deps] if dependents else node.deps
        return ([self.name_handle("CUgraphNode", n, node.graph) for n in found],)

    def xpuGraphListEdges(self, graph: Graph) -> tuple[list[int]]:
        """Each edge as its two nodes' handles, from then to, one after another."""
        return ([self.name_handle("CUgraphNode", end, graph) for n in graph.nodes for dep in n.deps
                 for end in (dep, n)],)

    def cuGraphNodeGetType(self, node: Node) -> tuple[int]:
        return (node_type(node),)

    def cuGraphAddChildGraphNode(self, graph: Graph, deps: bytes | None, count: int, child: Graph) -> tuple[Node]:
        """The child is cloned, as the driver does, and runs as a graph launched within this one."""
        self.refuse_memory_nodes(child, "a child graph")
        (child_exec,) = self.cuGraphInstantiateWithFlags(self.clone(child), 0)
        return (self.add_node(graph, CALLS["cuGraphLaunch"], [child_exec, None], self.nodes(deps, count)),)

    def cuGraphAddEventRecordNode(self, graph: Graph, deps: bytes | None, count: int, event: Any) -> tuple[Node]:
        return (self.add_node(graph, CALLS["cuEventRecord"], [event, None], self.nodes(deps, count)),)

    def cuGraphAddEventWaitNode(self, graph: Graph, deps: bytes | None, count: int, event: Any) -> tuple[Node]:
        return (self.add_node(graph, CALLS["cuStreamWaitEvent"], [None, event, 0], self.nodes(deps, count)),)

    def cuGraphClone(self, original: Graph) -> tuple[Graph]:
        self.refuse_memory_nodes(original, "a clone")
        return (self.clone(original),)

    @staticmethod
    def refuse_memory_nodes(graph: Graph, what: str) -> None:
        if any(node_type(n) in (ENUMS["CU_GRAPH_NODE_TYPE_MEM_ALLOC"], ENUMS["CU_GRAPH_NODE_TYPE_MEM_FREE"])
               for n in graph.nodes):
            raise CudaError(errors.NOT_SUPPORTED, f"{what} of a graph with memory nodes is not modelled by the sim")

    def clone(self, original: Graph) -> Graph:
        """The same nodes and edges in a new graph (the edges after the nodes: an edge may point forward)."""
        copy, made = Graph(), {}
        for n in original.nodes:
            made[id(n)] = self.add_node(copy, n.call, list(n.args), [])
        for n in original.nodes:
            made[id(n)].deps = [made[id(dep)] for dep in n.deps]
        return copy

    def cuGraphDestroyNode(self, node: Node) -> None:
        """Out of its graph, with its edges; the worker forgets the handle."""
        graph = node.graph
        if any(c.graph is graph for c in self.captures.values()):
            raise CudaError(errors.ILLEGAL_STATE, "the graph is being captured into")
        graph.nodes.remove(node)
        for n in graph.nodes:
            if node in n.deps:
                n.deps.remove(node)
        self.graph_memory.release(allocations([node]))

    def cuGraphInstantiateWithFlags(self, graph: Graph, flags: int) -> tuple[Exec]:
        """Graphs launched within graphs are bounded: so deep, so much work in one launch."""
        order = topological(graph)
        # copies, in the graph's order of nodes: what changes in the graph later stays out of this instantiation;
        # a conditional node's bodies are instantiated with it
        copies = {id(n): Node(n.call, self.instantiated(n), n.graph, n.local) for n in graph.nodes}
        depth, work = bounded(list(copies.values()))
        conditions = [*graph.conditions.values(), *(c for n in copies.values() for body in children(n)
                                                     if n.call.family == CONDITIONAL for c in body.conditions)]
        held = allocations(graph.nodes)
        self.graph_memory.hold(held)
        return (Exec([copies[id(n)] for n in order], copies, exec_shape(graph), depth=depth, work=work,
                     conditions=conditions, allocations=held),)

    def instantiated(self, node: Node) -> list[Any]:
        """A node's arguments for an instantiation: a conditional node's with its bodies instantiated."""
        if node.call is None or node.call.family != CONDITIONAL:
            return list(node.args)
        conditional = node.args[0]
        bodies = [self.cuGraphInstantiateWithFlags(body, 0)[0] for body in conditional.bodies]
        return [Conditional(conditional.condition, conditional.kind, bodies)]

    # ---- conditional nodes: bodies run as the condition's value says (the sim's kernels cannot set it) -----
    def cuGraphConditionalHandleCreate(self, graph: Graph, ctx: Any, default: int, flags: int) -> tuple[int]:
        if flags & ~COND_ASSIGN_DEFAULT:
            raise CudaError(errors.INVALID_VALUE, f"conditional handle flags {flags:#x}")
        if len(graph.conditions) >= MAX_CONDITIONS:
            raise CudaError(errors.OUT_OF_MEMORY, f"a graph of {MAX_CONDITIONS} conditions")
        handle = graph.ident << 32 | len(graph.conditions) + 1  # a value kernels would be given
        graph.conditions[handle] = Condition(default, bool(flags & COND_ASSIGN_DEFAULT), default)
        return (handle,)

    def xpuGraphAddConditionalNode(self, graph: Graph, deps: bytes | None, count: int, handle: int, kind: int,
                                   size: int) -> tuple[Node, list[int]]:
        condition = graph.conditions.get(handle)
        if condition is None or not 1 <= size <= CONDITIONAL_BODIES.get(kind, 0):
            raise CudaError(errors.INVALID_VALUE, f"conditional handle {handle:#x}, node type {kind}, {size} bodies")
        made = [Graph() for _ in range(size)]
        for body in made:  # held as nodes are
            body.size = NODE_BYTES
            self.graph_bytes += NODE_BYTES
        node = self.add_node(graph, CALLS[CONDITIONAL], [Conditional(condition, kind, made)], self.nodes(deps, count))
        return node, [self.name_handle("CUgraph", body, graph) for body in made]

    def run_conditional(self, conditional: Conditional, budget: list[int]) -> None:
        """IF: body 0 if the value is not 0, else body 1 if there is one; WHILE: body 0 while it is not 0 (a
        loop no kernel ends stops at the sim's bound of work, with an error); SWITCH: the value's body."""
        condition, bodies = conditional.condition, conditional.bodies
        if conditional.kind == IF:
            chosen = bodies[:1] if condition.value else bodies[1:]
        elif conditional.kind == SWITCH:
            chosen = bodies[condition.value:condition.value + 1]
        else:
            chosen = []
            while condition.value:
                self.run(bodies[0], budget)
        for body in chosen:
            self.run(body, budget)

    # ---- new parameters: of a graph's node, or of its copy in an instantiation -----------------------------
    def target(self, graph_exec: Exec | None, node: Node, kind: str) -> Node:
        """The node whose parameters change, which must be of `kind` (a CU_GRAPH_NODE_TYPE_ name)."""
        found = node if graph_exec is None else graph_exec.copies.get(id(node))
        if found is None:
            raise CudaError(errors.INVALID_VALUE, "the node is not one of the instantiated graph's")
        if node_type(found) != ENUMS[f"CU_GRAPH_NODE_TYPE_{kind}"]:
            raise CudaError(errors.INVALID_VALUE, f"the node is not a {kind.lower()} node")
        return found

    def xpuGraphNodeSetKernel(self, graph_exec: Exec | None, node: Node, func: Any, gx: int, gy: int, gz: int,
                              bx: int, by: int, bz: int, shared: int, params: bytes, param_bytes: int) -> None:
        target = self.target(graph_exec, node, "KERNEL")
        if target.call is not CALLS["xpuLaunchKernel"]:
            raise CudaError(errors.NOT_SUPPORTED, "new parameters for a kernel node that is not a plain launch "
                            "(a captured library call, or a launch with attributes) are not forwarded")
        target.call, target.args = kernel_work(func, (gx, gy, gz, bx, by, bz, shared), params, param_bytes)

    def xpuGraphNodeSetMemset(self, graph_exec: Exec | None, node: Node, dst: int, pitch: int, value: int,
                              element: int, width: int, height: int) -> None:
        target = self.target(graph_exec, node, "MEMSET")
        target.call, target.args = memset_work(dst, pitch, value, element, width, height)

    def xpuGraphNodeSetMemcpy(self, graph_exec: Exec | None, node: Node, dst: int, dst_pitch: int, src: int,
                              src_pitch: int, width: int, height: int) -> None:
        target = self.target(graph_exec, node, "MEMCPY")
        rows = target.args[5] if target.call is CALLS["xpuMemcpy2DDevice"] else 1  # else a captured plain copy
        if graph_exec is not None and max(height, rows) > 1:  # as cuda.h says, and the driver does
            raise CudaError(errors.INVALID_VALUE, "an instantiation's copy node is updated only where the old and "
                            "the new copy are 1-dimensional")
        target.call, target.args = memcpy_work(dst, dst_pitch, src, src_pitch, width, height)

    def cuGraphEventRecordNodeSetEvent(self, node: Node, event: Any) -> None:
        self.target(None, node, "EVENT_RECORD").args[0] = event

    def cuGraphEventWaitNodeSetEvent(self, node: Node, event: Any) -> None:
        self.target(None, node, "WAIT_EVENT").args[1] = event

    def cuGraphExecEventRecordNodeSetEvent(self, graph_exec: Exec, node: Node, event: Any) -> None:
        self.target(graph_exec, node, "EVENT_RECORD").args[0] = event

    def cuGraphExecEventWaitNodeSetEvent(self, graph_exec: Exec, node: Node, event: Any) -> None:
        self.target(graph_exec, node, "WAIT_EVENT").args[1] = event

    def cuGraphNodeSetEnabled(self, graph_exec: Exec, node: Node, enabled: int) -> None:
        """Kernel, memset and copy nodes only, as the driver's."""
        copy = graph_exec.copies.get(id(node))
        if copy is None or node_type(copy) not in SWITCHABLE:
            raise CudaError(errors.INVALID_VALUE, "only an instantiation's kernel, memset and copy nodes can be "
                            "disabled")
        copy.enabled = bool(enabled)

    def xpuGraphExecUpdate(self, graph_exec: Exec, graph: Graph) -> tuple[int]:
        """The graph's parameters into the instantiation, where the graph has the shape it was instantiated
        from (as many nodes, the same edges, each node of the same type): a CUgraphExecUpdateResult."""
        shape = exec_shape(graph)
        if len(shape) != len(graph_exec.shape) or any(a[1] != b[1] for a, b in zip(shape, graph_exec.shape)):
            return (ENUMS["CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED"],)
        if shape != graph_exec.shape:
            return (ENUMS["CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED"],)
        try:  # graphs launched within it may have grown
            graph_exec.depth, graph_exec.work = bounded(graph.nodes)
        except CudaError:
            return (ENUMS["CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED"],)
        for node, copy in zip(graph.nodes, graph_exec.copies.values()):  # both in the order nodes were added
            copy.call, copy.args = node.call, self.instantiated(node)
        return (ENUMS["CU_GRAPH_EXEC_UPDATE_SUCCESS"],)

    def cuGraphUpload(self, graph_exec: Exec, stream: Any) -> None:
        """Nothing to upload to the sim device."""

    def cuGraphLaunch(self, graph_exec: Exec, stream: Any) -> None:
        """The nodes' work, each as its call would have done it (never captured again); the conditions that
        take their default at each launch take it first."""
        for condition in graph_exec.conditions:
            if condition.assign:
                condition.value = condition.default
        if not graph_exec.launched:
            graph_exec.launched = True
            self.graph_memory.launched(graph_exec.allocations)
        self.run(graph_exec, [MAX_WORK])

    def run(self, graph_exec: Exec, budget: list[int]) -> None:
        budget[0] -= len(graph_exec.order)
        if budget[0] < 0:
            raise CudaError(errors.NOT_SUPPORTED, f"a launch ran more than {MAX_WORK} nodes (a while loop whose "
                            "condition only a kernel could end?)")
        for node in graph_exec.order:
            if node.call is not None and node.call.family == CONDITIONAL:
                self.run_conditional(node.args[0], budget)
            elif node.call is not None and node.enabled and node.call.family not in (ALLOC_NODE, FREE_NODE):
                Backend.execute(self, node.call, node.args)

    def cuGraphExecDestroy(self, graph_exec: Exec) -> None:
        """The worker forgets the handle; the allocations it held go when their graph has gone too."""
        if graph_exec.launched:
            self.graph_memory.unlaunched(graph_exec.allocations)
        self.graph_memory.release(graph_exec.allocations)
        graph_exec.allocations = []

    # ---- ids (CUDA 13.1) ----------------------------------------------------------------------------------
    def cuGraphGetId(self, graph: Graph) -> tuple[int]:
        return (graph.ident,)

    def cuGraphExecGetId(self, graph_exec: Exec) -> tuple[int]:
        return (graph_exec.ident,)

    def cuGraphNodeGetLocalId(self, node: Node) -> tuple[int]:
        return (node.local,)

    def cuGraphNodeGetToolsId(self, node: Node) -> tuple[int]:
        return (node.graph.ident << 32 | node.local,)

    def xpuGraphNodeGetContainingGraph(self, node: Node) -> tuple[int]:
        return (self.handle_of("CUgraph", node.graph),)

    # ---- graph memory (sim_graph_memory) --------------------------------------------------------------------
    def xpuGraphAddMemAllocNode(self, graph: Graph, deps: bytes | None, count: int, props: bytes,
                                access: bytes | None, access_count: int, bytesize: int) -> tuple[Node, int]:
        memprops.check_pool_props(props)
        device = self._device(memprops.POOL_PROPS.unpack(bytes(props))[3])
        for location_type, ident, _flags in memprops.access_descs(bytes(access or b"")[: 12 * access_count]):
            if location_type != memprops.ON_DEVICE:
                raise CudaError(errors.INVALID_VALUE, f"access for location type {location_type}")
            self._device(ident)
        dependencies = self.nodes(deps, count)
        alloc = self.graph_memory.allocate(device, bytesize)
        return self.add_node(graph, CALLS[ALLOC_NODE], [alloc], dependencies), alloc.address

    def cuGraphAddMemFreeNode(self, graph: Graph, deps: bytes | None, count: int, dptr: int) -> tuple[Node]:
        return (self.add_node(graph, CALLS[FREE_NODE], [self.graph_allocation(dptr).address],
                              self.nodes(deps, count)),)

    def cuDeviceGetGraphMemAttribute(self, device: int, attr: int) -> tuple[bytes]:
        return (self.graph_memory.attribute(self._device(device), attr).to_bytes(8, "little"),)

    def cuDeviceSetGraphMemAttribute(self, device: int, attr: int, value: bytes) -> None:
        self.graph_memory.reset_high(self._device(device), attr, int.from_bytes(bytes(value)[:8], "little"))

    def cuDeviceGraphMemTrim(self, device: int) -> None:
        self.graph_memory.trim(self._device(device))
