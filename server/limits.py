"""Per-client limits, enforced in the client's worker: a device memory quota, how many handles it
may hold, and which addresses it may name.

`Accounted` wraps a session's backend, so that every backend gets the same checks. It counts the
device memory the client holds (cuMemAlloc, cuMemAllocPitch at the driver's granularity, and the
variables of the modules it loads; host memory does not count), refuses an allocation beyond the
quota with CUDA_ERROR_OUT_OF_MEMORY (for this client only: every client has its own worker), and
keeps the peak for the session's log line and metrics. Memory pools' allocations count as cuMemAlloc's
do, and VMM's physical allocations (cuMemCreate) in whole granules of 2 MiB until released and
unmapped. `--max-handles` bounds the live handles of each kind (allocations, physical allocations and
reserved ranges here, streams, events, modules, pools and descriptors in the worker's session).
Every device address a call names (a CUdeviceptr, a math library's data pointer or device-mode
scalar, the pointers inside cuBLASLt and cuDNN attributes) must lie, with the bytes the call
touches, inside the client's own allocations, module variables or mapped VMM ranges (an address that
is only reserved is not memory); a VMM call's handle must be one the client holds, and its range one
the client reserved; a pool's allocation the client placed itself (xpuMemPoolAlloc) must lie in a range
reserved for that pool (xpuMemPoolReserve), over none of the client's memory: a hand-made client cannot
make the real driver read or write the worker's own memory, nor reach around the quota. (Calls the
client library never sends, such as copies whose structs hold host pointers, the worker refuses
before decoding them: `Call.sent`.)
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import abi, errors, fatbin, mathlibs, memprops, wire
from xpuremote.protocol.calls import CALLS, Call, Extent, Param
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import (
    ARRAY3D_DESCRIPTOR,
    ARRAY_DESCRIPTOR,
    ARRAY_FORMAT_BYTES,
    RESOURCE_ARRAY,
    RESOURCE_DESC,
    RESOURCE_LINEAR,
    RESOURCE_LINEAR_TYPE,
    RESOURCE_MIPMAPPED,
    RESOURCE_PITCH2D,
    RESOURCE_PITCH2D_TYPE,
)

from .backends.base import Backend, Inventory, Namer

log = logging.getLogger("xpuremote.worker")
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
GRANULE = 512  # what the driver aligns each allocation to: a 1-byte allocation costs this much
DEFAULT_MAX_HANDLES = 1 << 16  # of each kind (allocations, streams, events, modules, descriptors...)
DEFAULT_CONNECT_TIMEOUT_S = 10.0  # a session's client has this long to connect after its hello
# attribute values that are device addresses: cuDNN's VOID_PTR arrays (a variant pack's data), and
# cuBLASLt's matmul descriptor pointers (bias, scales, epilogue auxiliaries)
_LT = mathlibs.api(mathlibs.CUBLASLT).ENUMS
LT_POINTER_ATTRIBUTES = frozenset(v for k, v in _LT.items()
                                  if k.startswith("CUBLASLT_MATMUL_DESC_") and k.endswith("_POINTER"))
LAUNCHES = ("xpuLaunchKernel", "xpuLaunchKernelEx", "xpuGraphAddKernelNode", "xpuGraphNodeSetKernel")
MAX_KERNEL_PARAMETERS = 32764
ALLOCATIONS = ("cuMemAlloc", "cuMemAllocPitch", "cuMemAllocAsync", "cuMemAllocFromPoolAsync", "xpuGraphAddMemAllocNode")
STREAM_ORDERED = ("cuMemAllocAsync", "cuMemAllocFromPoolAsync")  # in a capture: the graph's allocations
GRAPH_LIFE = ("cuGraphInstantiateWithFlags", "cuGraphExecDestroy", "cuGraphDestroy")  # who holds graph memory
FREES = ("cuMemFree", "cuMemFreeAsync")  # either takes either kind of allocation, as the driver's do
# VMM addresses that need not be memory: a wanted address, a reservation to free, a range to map. The
# session's reserved ranges are their check, not its memory.
RESERVED_ADDRESSES = {("cuMemAddressReserve", "addr"), ("cuMemAddressFree", "ptr"), ("cuMemMap", "ptr"),
                      ("xpuMemPoolAlloc", "dptr")}


def parse_size(text: str) -> int:
    """'512M', '2G', '1048576' -> bytes (binary units; a trailing B or iB is allowed)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in UNITS else ""
    number = float(value[: len(value) - len(unit)])
    if number < 0:
        raise ValueError(f"negative size {text!r}")
    return int(number * UNITS[unit])


@dataclass
class Limits:
    mem_quota: int = 0  # bytes of device memory per client; 0: no quota
    max_request_bytes: int = 0  # bytes in one request message; 0: no limit
    max_handles: int = DEFAULT_MAX_HANDLES  # live handles of each kind per client; 0: no limit

    def check_count(self, held: int, kind: str) -> None:
        """One more `kind` may be made, or CUDA_ERROR_OUT_OF_MEMORY for this client."""
        if self.max_handles and held >= self.max_handles:
            raise CudaError(errors.OUT_OF_MEMORY, f"this client holds {held} {kind}, the server's limit "
                            f"(--max-handles)")

    def request_frames(self) -> int:
        """Most frames a request within max_request_bytes can have (0: no bound): a header, then bulk
        frames of over INLINE_MAX bytes each. Bounds what a message of empty frames costs."""
        return 1 + self.max_request_bytes // wire.INLINE_MAX if self.max_request_bytes else 0


def give_back_memory() -> None:
    """Return free heap pages to the system (glibc; elsewhere nothing). After a refused message:
    ZeroMQ took it in whole, and the allocator would otherwise keep that much for good."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


_LIBC = ctypes.CDLL(None)


class Regions:
    """Address ranges of device memory, looked up by any byte inside them."""

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.sizes: dict[int, int] = {}
        self.last = (0, 0)  # the region a check found last: calls name one buffer again and again
        self.gone = 0  # removals

    def add(self, base: int, size: int) -> None:
        if base not in self.sizes:
            bisect.insort(self.bases, base)
        self.sizes[base] = max(size, self.sizes.get(base, 0))
        self.last = (0, 0)

    def remove(self, base: int) -> None:
        if self.sizes.pop(base, None) is not None:
            self.bases.remove(base)
        self.last = (0, 0)
        self.gone += 1  # the lane's C side forgets the ranges it was taught (server/native_lane.py)

    def holds(self, address: int, size: int) -> bool:
        """[address, address+size) lies in regions that follow each other without a gap (adjacent VMM
        mappings are one range of memory, as on a GPU)."""
        low, high = self.last
        if low <= address and address + size <= high:
            return True
        i = bisect.bisect_right(self.bases, address) - 1
        if i < 0:
            return False
        first = self.bases[i]
        reach = first + self.sizes[first]
        while reach < address + size and i + 1 < len(self.bases) and self.bases[i + 1] <= reach:
            i += 1
            reach = max(reach, self.bases[i] + self.sizes[self.bases[i]])
        if address < reach and address + size <= reach:
            self.last = (first, reach)
            return True
        return False

    def within_one(self, address: int, size: int) -> bool:
        """[address, address+size) lies inside a single region."""
        i = bisect.bisect_right(self.bases, address) - 1
        return i >= 0 and address + size <= self.bases[i] + self.sizes[self.bases[i]]

    def overlaps(self, address: int, size: int) -> bool:
        """Some region holds a byte of [address, address+size) (the regions do not overlap one another)."""
        i = bisect.bisect_right(self.bases, address + size - 1) - 1
        return i >= 0 and self.bases[i] + self.sizes[self.bases[i]] > address

    def containing(self, address: int) -> int | None:
        """The base of the region holding `address`."""
        i = bisect.bisect_right(self.bases, address) - 1
        return self.bases[i] if i >= 0 and address < self.bases[i] + self.sizes[self.bases[i]] else None


@dataclass
class Physical:
    """A VMM physical allocation (cuMemCreate) the client holds, by the backend's handle value."""

    charge: int  # bytes counted against the quota, in whole granules
    refs: int = 1  # the client's handles to it: cuMemCreate's, and each cuMemRetainAllocationHandle's
    mappings: int = 0

    @property
    def alive(self) -> bool:
        return self.refs > 0 or self.mappings > 0


@dataclass
class GraphMemory:
    """A graph's allocations, held by the graph and each instantiation made from it: their addresses stay the
    client's, and charged, until the last of them is destroyed (the driver keeps them for that long)."""
    graph: Any  # the backend's object, kept so that its identity stays unique
    addresses: list[int] = field(default_factory=list)
    holders: int = 1


@dataclass
class LoadedImage:
    key: bytes
    charge: int  # bytes of its variables, counted against the quota
    refs: int = 1  # client module handles on it (the backends load an image once per session)
    variables: tuple[tuple[int, int], ...] = ()  # (address, size) the client has looked up


class Accounted(Backend):
    """A backend with the session's device memory counted and capped, and its calls checked."""

    def __init__(self, inner: Backend, limits: Limits) -> None:
        self.inner = inner
        self.limits = limits
        self.name = inner.name
        self.sizes: dict[int, int] = {}  # address -> bytes charged, of this client's allocations
        self.regions = Regions()  # where this client's device addresses may point
        self.images: dict[int, LoadedImage] = {}  # by the backend's module object (_ident)
        self.physical: dict[int, Physical] = {}  # VMM: the backend's handle value -> what the client holds
        self.reserved = Regions()  # VMM: address ranges the client reserved (not memory until mapped)
        self.pool_space = Regions()  # ranges reserved for the client's pools, where it places their allocations
        self.pool_of: dict[int, int] = {}  # such a range's base -> its pool (_ident)
        self.unplaced: set[int] = set()  # placed allocations refused (their error told once): their free is quiet
        self.mapped: dict[int, tuple[int, int]] = {}  # VMM: mapping address -> (size, handle)
        self.arrays: dict[int, int] = {}  # CUDA arrays: the backend's array (_ident) -> bytes charged
        self.objects: set[tuple[str, int]] = set()  # texture and surface objects: (family, value)
        self.graphs: dict[int, GraphMemory] = {}  # graphs that allocate memory, by the backend's graph (_ident)
        self.graph_owned: dict[int, GraphMemory] = {}  # a graph allocation's address -> its graph's
        self.execs: dict[int, tuple[Any, GraphMemory]] = {}  # instantiations of those graphs (_ident)
        self.used = 0
        self.peak = 0

    def __getattr__(self, name: str) -> Any:  # the backend's own attributes (memory, ...)
        return getattr(self.inner, name)

    def inventory(self) -> Inventory:
        return self.inner.inventory()

    def bind(self, handles: dict[int, tuple[str, Any]], name: Namer | None = None,
             drop: Callable[[int], None] | None = None, owner: Callable[[str, Any], Any] | None = None) -> None:
        self.inner.bind(handles, name, drop, owner)

    def close(self) -> None:
        self.inner.close()
        self.sizes.clear()
        self.images.clear()
        self.physical.clear()
        self.reserved = Regions()
        self.pool_space = Regions()
        self.pool_of.clear()
        self.unplaced.clear()
        self.mapped.clear()
        self.arrays.clear()
        self.objects.clear()
        self.graphs.clear()
        self.graph_owned.clear()
        self.execs.clear()
        self.used = 0

    def runner(self, call: Call) -> Callable[[list[Any]], Any]:
        """The address checks, then the backend's runner, for calls this layer only checks."""
        if call.family in _ACCOUNTED or call.family in EMBEDDING:
            return lambda args: self.execute(call, args)
        inner, check, params = self.inner.runner(call), self.check_params, _address_params(call)
        if len(params) == 1 and params[0][2].length is not None:  # one address, a length: most hot calls
            (i, p, _), (constant, j), regions = params[0], params[0][2].length, self.regions

            def run_one(args: list[Any]) -> Any:  # args are the runner's: integers already checked
                address, size = args[i], max(constant * args[j], 1)
                if address and not regions.holds(address, size):
                    self.refuse_address(call, p.name, address, size)
                return inner(args)
            return run_one

        def run(args: list[Any]) -> Any:
            check(call, args, params)
            return inner(args)
        return run

    def native_call(self, call: Call) -> tuple[int, int, int, int, int, int] | None:
        """For the lane's C side (server/native_lane.py), a call this layer checks no more than run_one does,
        or a launch it checks no more than the size of: (the inner backend's C function, how it takes the
        arguments, the argument holding the one device address or -1, its length's, bytes per unit of the
        length, a blob's largest size). None: the call runs in Python."""
        found = getattr(self.inner, "native_function", lambda call: None)(call)
        if found is not None and found[1] == abi.NATIVE_CALL_VETTED:  # a record run here first: checked here
            return None if call.family in _ACCOUNTED or call.family in EMBEDDING else (*found, -1, -1, 0, 0)
        if found is not None and found[1] == abi.NATIVE_CALL_EXECUTE:  # the same: its data pointers checked here
            return (*found, -1, -1, 0, 0) if call.family == "xpuCudnnExecute" else None
        params = _address_params(call)
        if found is None or len(params) > 1 or (params and params[0][2].length is None):
            return None
        if call.family == "xpuLaunchKernel" and not params:
            return *found, -1, -1, 0, MAX_KERNEL_PARAMETERS
        if call.family in _ACCOUNTED or call.family in EMBEDDING:
            return None
        if not params:
            return *found, -1, -1, 0, 0
        (i, _, _), (scale, j) = params[0], params[0][2].length
        return *found, i, j, scale, 0

    def execute(self, call: Call, args: list[Any]) -> list[Any]:
        if call.family in FREES and args[0] in self.unplaced:  # its allocation's failure was the error to tell
            self.unplaced.discard(args[0])
            return []
        self.check_addresses(call, args)
        if call.family not in _ACCOUNTED:  # most calls, the hot ones among them
            return self.inner.execute(call, args)
        if call.family in ALLOCATIONS:
            return self.allocate(call, args)
        if call.family in VMM_CALLS:
            return VMM_CALLS[call.family](self, call, args)
        if call.family == "xpuModuleLoad":
            return self.load_module(call, args)
        if call.family == "cuModuleUnload":
            return self.unload_module(call, args)
        if call.family in ARRAY_CALLS:
            return ARRAY_CALLS[call.family](self, call, args)
        if call.family == "cuMemPoolCreate":
            memprops.check_pool_props(args[1])
        if call.family == "cuMemPoolSetAttribute":
            args = self.pool_attribute(args)
        if call.family in LAUNCHES:
            check_parameters(call, args)
        if call.family in GRAPH_LIFE:
            return self.graph_life(call, args)
        if call.family in FREES and args[0] not in self.sizes:
            raise CudaError(errors.INVALID_VALUE, f"{args[0]:#x} is not one of this client's allocations")
        if call.family in FREES and args[0] in self.graph_owned:
            return self.inner.execute(call, args)  # a graph's allocation stays its graph's
        if call.family == "cuMemFreeAsync" and self.inner.capture_graph(args[1]) is not None:
            raise CudaError(errors.INVALID_VALUE, f"{args[0]:#x} is not a graph's allocation: a capture frees only "
                            "what a graph allocated")
        outs = self.inner.execute(call, args)
        if call.family in FREES:
            self.forget_allocation(args[0])
        elif call.family == "cuModuleGetGlobal":
            self.learn_variable(args[2], _integer(outs[0]), _integer(outs[1]))
        return outs

    def pool_attribute(self, args: list[Any]) -> list[Any]:
        """Under a quota a pool keeps nothing cached after frees: what a pool caches is device memory the
        quota does not see, and every pool would cache its own (release threshold clamped to 0)."""
        pool, attribute, value = args
        if self.limits.mem_quota and attribute == memprops.POOL_ATTRIBUTE["RELEASE_THRESHOLD"] and any(value or b""):
            log.info("a pool's release threshold is kept at 0 under the memory quota")
            return [pool, attribute, bytes(8)]
        return args

    # ---- addresses ---------------------------------------------------------------------------
    def check_addresses(self, call: Call, args: list[Any]) -> None:
        """Every device address the call names lies, with the bytes it touches, in this client's memory."""
        self.check_params(call, args, _address_params(call))
        if call.family not in EMBEDDING:
            return
        for address in _embedded_addresses(call, args):
            if _by_value(call, args) and not self.regions.holds(address, 1):
                self.check_by_value(address)
            else:
                self.check_address(call, "a data pointer" if call.symbol.startswith("xpu") else f"attribute {args[1]}",
                                   address, 1)

    def check_params(self, call: Call, args: list[Any], params: tuple[tuple[int, Param, Extent], ...]) -> None:
        """The address parameters' part of check_addresses."""
        for i, p, extent in params:
            value = args[i]
            if isinstance(value, int) and value:
                try:
                    size = extent.size(args)
                except (TypeError, ValueError):  # a size that is not a number: the decoder says so
                    size = 1
                if not self.regions.holds(value, size):
                    self.refuse_address(call, p.name, value, size)

    def check_by_value(self, address: int) -> None:
        """A variant pack's pointer outside device memory is a by-value scalar's (cudnn-frontend passes
        attention scales so): the application's host address, which a real cuDNN would read in the
        worker's own memory. The client sends its bytes instead (xpuCudnnSetDataPointers); a host address
        itself is refused where a library would follow it, and the sim never does."""
        if getattr(self.inner, "follows_host_pointers", False):
            raise errors.library_error("cudnn", "not_supported", f"a by-value tensor's host pointer {address:#x} "
                                       "in a variant pack: its bytes go in xpuCudnnSetDataPointers")

    def check_address(self, call: Call, what: str, address: int, size: int) -> None:
        if address and not self.regions.holds(address, max(size, 1)):
            self.refuse_address(call, what, address, size)

    @staticmethod
    def refuse_address(call: Call, what: str, address: int, size: int) -> None:
        raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: {what} [{address:#x}, +{size}) is not inside "
                        "one of this client's allocations")

    # ---- allocations ---------------------------------------------------------------------------
    def allocate(self, call: Call, args: list[Any]) -> list[Any]:
        """cuMemAlloc, cuMemAllocPitch, and a memory pool's allocations (cuMemAllocAsync...)."""
        ins = [a for p, a in zip(call.params, args) if p.direction != "out"]
        node = call.family == "xpuGraphAddMemAllocNode"  # outputs the node, then the address
        wanted = ins[-1] if node else ins[0] * (ins[1] if call.family == "cuMemAllocPitch" else 1)
        self.limits.check_count(len(self.sizes), "allocations")
        self.check_quota(_granules(wanted))
        outs = self.inner.execute(call, args)
        address = _integer(outs[-1] if node else outs[0])
        pitched = call.family == "cuMemAllocPitch" and outs[1] is not None
        size = _integer(outs[1]) * ins[1] if pitched else wanted  # pitch * height
        try:
            self.check_quota(_granules(size))
        except CudaError:
            self.inner.execute(CALLS["cuMemFree_v2"], [address])  # the pitch rounded it over the quota
            raise
        self.record(address, size)
        graph = args[1] if node else self.inner.capture_graph(args[-1]) if call.family in STREAM_ORDERED else None
        if graph is not None:
            held = self.graphs.setdefault(_ident(graph), GraphMemory(graph))
            held.addresses.append(address)
            self.graph_owned[address] = held
        return outs

    # ---- stream-ordered allocation at the client's addresses ---------------------------------------------
    def reserve_pool_range(self, call: Call, args: list[Any]) -> list[Any]:
        """xpuMemPoolReserve(base, pool, size): addresses for the pool's allocations, not memory; bounded in number
        with the VMM ranges."""
        _, pool, size = args
        self.limits.check_count(len(self.reserved.sizes) + len(self.pool_space.sizes), "reserved address ranges")
        outs = self.inner.execute(call, args)
        base = _integer(outs[0])
        self.pool_space.add(base, size)
        self.pool_of[base] = _ident(pool)
        return outs

    def place_pool_allocation(self, call: Call, args: list[Any]) -> list[Any]:
        """xpuMemPoolAlloc(pool, dptr, size, stream): inside a range reserved for that pool, over none of the
        client's memory, within its quota and handle limit; then memory the client may name, freed as any
        allocation. Never in a capture (the client sends a capture's allocations as cuMemAllocAsync)."""
        pool, address, size, stream = args
        base = self.pool_space.containing(address)
        if size <= 0 or base is None or self.pool_of[base] != _ident(pool) or \
                not self.pool_space.within_one(address, size):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: [{address:#x}, +{size}) is not inside an address "
                            "range reserved for this pool")
        if self.regions.overlaps(address, size):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: [{address:#x}, +{size}) overlaps memory this "
                            "client holds")
        if self.inner.capture_graph(stream) is not None:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol} in a stream capture")
        try:
            self.limits.check_count(len(self.sizes), "allocations")
            self.check_quota(_granules(size))
            outs = self.inner.execute(call, args)
        except CudaError as exc:  # out of memory: the client holds it as allocated until it frees it
            if exc.code == errors.OUT_OF_MEMORY and len(self.unplaced) < (self.limits.max_handles or 1 << 16):
                self.unplaced.add(address)
            raise
        self.unplaced.discard(address)
        self.record(address, size)
        return outs

    # ---- graph memory: allocation nodes, and stream-ordered allocation in a capture ---------------------------
    def graph_life(self, call: Call, args: list[Any]) -> list[Any]:
        """Instantiations hold their graph's memory; the last holder destroyed gives it back."""
        outs = self.inner.execute(call, args)
        if call.family == "cuGraphInstantiateWithFlags":
            held = self.graphs.get(_ident(args[1]))
            if held is not None:
                held.holders += 1
                self.execs[_ident(_handle(outs[0]))] = (_handle(outs[0]), held)
        elif call.family == "cuGraphExecDestroy":
            found = self.execs.pop(_ident(args[0]), None)
            if found is not None:
                self.release_graph_memory(found[1])
        elif (held := self.graphs.get(_ident(args[0]))) is not None:  # cuGraphDestroy
            self.release_graph_memory(held)
        return outs

    def release_graph_memory(self, held: GraphMemory) -> None:
        held.holders -= 1
        if held.holders:
            return
        self.graphs.pop(_ident(held.graph), None)
        for address in held.addresses:
            self.graph_owned.pop(address, None)
            self.forget_allocation(address)

    def record(self, address: int, size: int) -> None:
        """An allocation of the client's: charged, and an address range it may name."""
        self.sizes[address] = _granules(size)
        self.regions.add(address, size)
        self.charge(_granules(size))

    def forget_allocation(self, address: int) -> None:
        """An allocation of the client's is gone: record() undone."""
        self.charge(-self.sizes.pop(address))
        self.regions.remove(address)

    def charge(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)

    def check_quota(self, size: int) -> None:
        quota = self.limits.mem_quota
        if quota and self.used + size > quota:
            raise CudaError(errors.OUT_OF_MEMORY, f"{size} bytes requested; this client holds {self.used} "
                            f"of its quota of {quota} bytes")

    # ---- virtual memory management: physical allocations, reserved ranges, mappings -------------------
    def create_physical(self, call: Call, args: list[Any]) -> list[Any]:
        """cuMemCreate(handle, size, prop, flags): charged in whole granules until released and unmapped."""
        _, size, prop, _ = args
        memprops.check_allocation_prop(prop)
        charge = -(-size // memprops.GRANULARITY) * memprops.GRANULARITY
        self.limits.check_count(len(self.physical), "physical allocations")
        self.check_quota(charge)
        outs = self.inner.execute(call, args)
        self.physical[_integer(outs[0])] = Physical(charge)
        self.charge(charge)
        return outs

    def held(self, call: Call, handle: int) -> Physical:
        physical = self.physical.get(handle)
        if physical is None or physical.refs == 0:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: {handle:#x} is not an allocation handle this "
                            "client holds")
        return physical

    def release_physical(self, call: Call, args: list[Any]) -> list[Any]:
        physical = self.held(call, args[0])
        outs = self.inner.execute(call, args)
        physical.refs -= 1
        self.end_if_unused(args[0])
        return outs

    def retain_physical(self, call: Call, args: list[Any]) -> list[Any]:
        """cuMemRetainAllocationHandle(handle, addr): addr is mapped memory of the client's (checked as an
        address), so the handle is of a physical allocation the client made."""
        outs = self.inner.execute(call, args)
        physical = self.physical.get(_integer(outs[0]))
        if physical is None:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: the server answered a handle this client never made")
        physical.refs += 1
        return outs

    def physical_properties(self, call: Call, args: list[Any]) -> list[Any]:
        self.held(call, args[1])
        return self.inner.execute(call, args)

    def granularity(self, call: Call, args: list[Any]) -> list[Any]:
        memprops.check_allocation_prop(args[1])
        return self.inner.execute(call, args)

    def end_if_unused(self, handle: int) -> None:
        physical = self.physical[handle]
        if not physical.alive:
            del self.physical[handle]
            self.charge(-physical.charge)

    def reserve(self, call: Call, args: list[Any]) -> list[Any]:
        """cuMemAddressReserve(ptr, size, alignment, addr, flags): addresses, not memory; bounded in number."""
        self.limits.check_count(len(self.reserved.sizes), "reserved address ranges")
        outs = self.inner.execute(call, args)
        self.reserved.add(_integer(outs[0]), args[1])
        return outs

    def free_reserved(self, call: Call, args: list[Any]) -> list[Any]:
        ptr, size = args
        if self.reserved.sizes.get(ptr) != size:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: [{ptr:#x}, +{size}) is not a range this client "
                            "reserved")
        if any(ptr <= base < ptr + size for base in self.mapped):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: [{ptr:#x}, +{size}) still has mappings")
        outs = self.inner.execute(call, args)
        self.reserved.remove(ptr)
        return outs

    def map(self, call: Call, args: list[Any]) -> list[Any]:
        """cuMemMap(ptr, size, offset, handle, flags): into a range the client reserved, over no mapping; the
        range is then memory the client may name."""
        ptr, size, _, handle, _ = args
        physical = self.held(call, handle)
        if not self.reserved.within_one(ptr, max(size, 1)):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: [{ptr:#x}, +{size}) is not inside one address "
                            "range this client reserved")
        if any(base < ptr + size and ptr < base + length for base, (length, _) in self.mapped.items()):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: [{ptr:#x}, +{size}) is mapped already")
        outs = self.inner.execute(call, args)
        self.mapped[ptr] = (size, handle)
        physical.mappings += 1
        self.regions.add(ptr, size)
        return outs

    def unmap(self, call: Call, args: list[Any]) -> list[Any]:
        """cuMemUnmap(ptr, size) of whole mappings (the range is mapped memory: checked as an address)."""
        ptr, size = args
        inside = [base for base in self.mapped if ptr <= base < ptr + size]
        if ptr not in self.mapped or any(base + self.mapped[base][0] > ptr + size for base in inside):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: [{ptr:#x}, +{size}) is not a range of whole "
                            "mappings")
        outs = self.inner.execute(call, args)
        for base in inside:
            _, handle = self.mapped.pop(base)
            self.regions.remove(base)
            self.physical[handle].mappings -= 1
            self.end_if_unused(handle)
        return outs

    # ---- CUDA arrays and texture/surface objects ----------------------------------------------------
    def create_array(self, call: Call, args: list[Any]) -> list[Any]:
        """cuArrayCreate/cuArray3DCreate: device memory, charged (at 512-byte granules) until destroyed."""
        charge = _granules(_array_bytes(call.family, bytes(args[1])))
        self.limits.check_count(len(self.arrays), "arrays")
        self.check_quota(charge)
        outs = self.inner.execute(call, args)
        self.arrays[_ident(_array_object(outs[0]))] = charge
        self.charge(charge)
        return outs

    def destroy_array(self, call: Call, args: list[Any]) -> list[Any]:
        outs = self.inner.execute(call, args)
        self.charge(-self.arrays.pop(_ident(args[0]), 0))
        return outs

    def create_object(self, call: Call, args: list[Any]) -> list[Any]:
        """xpuTexObjectCreate/xpuSurfObjectCreate(object, array, resource...): memory a resource names is the
        client's; the object is the session's from now on."""
        kind, union, _ = RESOURCE_DESC.unpack(bytes(args[2]))
        if kind == RESOURCE_MIPMAPPED:
            raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol}: mipmapped arrays are not forwarded")
        if kind == RESOURCE_ARRAY and args[1] is None:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: the resource names no array")
        if kind in (RESOURCE_LINEAR_TYPE, RESOURCE_PITCH2D_TYPE):
            address, extent = _resource_extent(kind, union)
            self.check_address(call, "the resource", address, extent)
        self.limits.check_count(len(self.objects), "texture and surface objects")
        outs = self.inner.execute(call, args)
        self.objects.add((call.family, _integer(outs[0])))
        return outs

    def destroy_object(self, call: Call, args: list[Any]) -> list[Any]:
        key = (OBJECT_FAMILIES[call.family], args[0])
        if key not in self.objects:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: {args[0]:#x} is not an object of this client's")
        outs = self.inner.execute(call, args)
        self.objects.discard(key)
        return outs

    # ---- modules: their variables are device memory too ----------------------------------------
    def load_module(self, call: Call, args: list[Any]) -> list[Any]:
        key, image = bytes(args[1]), args[2]
        loaded = next((i for i in self.images.values() if i.key == key), None)
        charge = 0 if loaded else _variable_bytes(image)
        self.check_quota(charge)
        outs = self.inner.execute(call, args)
        ident = _ident(outs[0])
        if ident in self.images:
            self.images[ident].refs += 1
        else:
            self.images[ident] = LoadedImage(key, charge)
            self.charge(charge)
        return outs

    def unload_module(self, call: Call, args: list[Any]) -> list[Any]:
        """The image is unloaded with its last handle; its variables then count no more."""
        loaded = self.images.get(_ident(args[0]))
        if loaded is None:
            raise CudaError(errors.INVALID_HANDLE, f"{call.symbol}: not a loaded module")
        if loaded.refs > 1:
            loaded.refs -= 1
            return []
        outs = self.inner.execute(call, args)
        del self.images[_ident(args[0])]
        self.charge(-loaded.charge)
        for address, _ in loaded.variables:
            self.regions.remove(address)
        return outs

    def learn_variable(self, module: Any, address: int, size: int) -> None:
        """A variable the client looked up: its address is one the client may name from now on."""
        loaded = self.images.get(_ident(module))
        if loaded is not None and address:
            loaded.variables += ((address, size),)
            self.regions.add(address, size)


VMM_CALLS = {"cuMemCreate": Accounted.create_physical, "cuMemRelease": Accounted.release_physical,
             "cuMemRetainAllocationHandle": Accounted.retain_physical,
             "cuMemGetAllocationPropertiesFromHandle": Accounted.physical_properties,
             "cuMemGetAllocationGranularity": Accounted.granularity, "cuMemAddressReserve": Accounted.reserve,
             "cuMemAddressFree": Accounted.free_reserved, "cuMemMap": Accounted.map, "cuMemUnmap": Accounted.unmap,
             "xpuMemPoolReserve": Accounted.reserve_pool_range, "xpuMemPoolAlloc": Accounted.place_pool_allocation}


ARRAY_CALLS = {"cuArrayCreate": Accounted.create_array, "cuArray3DCreate": Accounted.create_array,
               "cuArrayDestroy": Accounted.destroy_array, "xpuTexObjectCreate": Accounted.create_object,
               "xpuSurfObjectCreate": Accounted.create_object, "cuTexObjectDestroy": Accounted.destroy_object,
               "cuSurfObjectDestroy": Accounted.destroy_object}
OBJECT_FAMILIES = {"cuTexObjectDestroy": "xpuTexObjectCreate", "cuSurfObjectDestroy": "xpuSurfObjectCreate"}


def _array_bytes(family: str, desc: bytes) -> int:
    """Bytes of an array's elements, from its descriptor (a descriptor the driver refuses counts 0)."""
    if family == "cuArrayCreate":
        width, height, fmt, channels = ARRAY_DESCRIPTOR.unpack(desc)
        depth = 0
    else:
        width, height, depth, fmt, channels, _ = ARRAY3D_DESCRIPTOR.unpack(desc)
    return width * ARRAY_FORMAT_BYTES.get(fmt, 0) * channels * max(height, 1) * max(depth, 1)


def _array_object(value: Any) -> Any:
    """An array as the backends answer it: the sim's object, or the cuda backend's handle bytes."""
    return _integer(value) if isinstance(value, (bytes, memoryview)) else value


def _resource_extent(kind: int, union: bytes) -> tuple[int, int]:
    """(address, bytes) of the device memory a linear or pitch2D resource names."""
    if kind == RESOURCE_LINEAR_TYPE:
        address, _, _, size = RESOURCE_LINEAR.unpack_from(union)
        return address, max(size, 1)
    address, fmt, channels, width, height, pitch = RESOURCE_PITCH2D.unpack_from(union)
    row = width * ARRAY_FORMAT_BYTES.get(fmt, 1) * channels
    return address, max(max(pitch, row) * (height - 1) + row if height else 1, 1)


def check_parameters(call: Call, args: list[Any]) -> None:
    """A kernel's parameters are at most 32,764 bytes (the driver's limit since CUDA 12.1)."""
    size = next((len(a) for p, a in zip(call.params, args) if p.name == "params" and a is not None), 0)
    if size > MAX_KERNEL_PARAMETERS:
        raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: {size} bytes of kernel parameters "
                        f"(at most {MAX_KERNEL_PARAMETERS})")


def _granules(size: int) -> int:
    return -(-size // GRANULE) * GRANULE


def _variable_bytes(image: Any) -> int:
    """Device memory a module image's variables take: a cubin's sections of them, or what PTX declares."""
    data = bytes(image)
    try:
        if data[:4] == fatbin.ELF_MAGIC:
            return fatbin.variable_bytes(data)
        return _ptx_variable_bytes(data)
    except (ValueError, IndexError, struct.error) as exc:
        raise CudaError(errors.INVALID_IMAGE, f"cannot read the module image: {exc}") from None


# A module-scope `.global`/`.const` declaration (not `ld.global`): its vector width, element bits and
# array dimensions up to an initializer or the end. Bounded repeats keep the scan linear in the text.
_PTX_VARIABLE = re.compile(rb"(?<![\w.])\.(?:global|const)\b[^;=]{0,64}?\.(?:v([248])\s+\.)?[bsuf](8|16|32|64|128)"
                           rb"\s+[\w$%]{1,512}((?:\s*\[\s*\d{0,20}\s*\]){0,8})")


def _ptx_variable_bytes(ptx: bytes) -> int:
    """Bytes PTX text declares in the global and constant state spaces (what JIT compiling it commits)."""
    total = 0
    for match in _PTX_VARIABLE.finditer(ptx):
        vector, bits, dims = match.groups()
        size = int(vector or 1) * int(bits) // 8
        for dim in re.findall(rb"\d+", dims):
            size *= int(dim)
        total += size
    return total


# the families Accounted.execute does more for than check their addresses
_ACCOUNTED = frozenset((*ALLOCATIONS, *VMM_CALLS, *ARRAY_CALLS, *LAUNCHES, *FREES, *GRAPH_LIFE, "xpuModuleLoad",
                        "cuModuleUnload",
                        "cuMemPoolCreate", "cuMemPoolSetAttribute", "cuModuleGetGlobal"))
EMBEDDING = ("cudnnBackendSetAttribute", "cublasLtMatmulDescSetAttribute",  # addresses inside attributes
             "xpuCudnnSetDataPointers", "xpuCudnnExecute")
_ADDRESS_PARAMS: dict[str, tuple[tuple[int, Param, Extent], ...]] = {}


def _address_params(call: Call) -> tuple[tuple[int, Param, Extent], ...]:
    """The parameters of `call` that may name device memory: (index, parameter, extent)."""
    found = _ADDRESS_PARAMS.get(call.symbol)
    if found is None:
        found = _ADDRESS_PARAMS[call.symbol] = tuple(
            entry for entry in call.address_extents if (call.family, entry[1].name) not in RESERVED_ADDRESSES)
    return found


def _embedded_addresses(call: Call, args: list[Any]) -> list[int]:
    """Device addresses inside an attribute's bytes."""
    if call.family == "cudnnBackendSetAttribute" and args[2] == mathlibs.CUDNN_VOID_PTR and args[4] is not None:
        data = bytes(args[4])
        return [a for (a,) in struct.iter_unpack("<Q", data[: len(data) // 8 * 8])]
    if call.family == "xpuCudnnSetDataPointers":  # the data pointers but the by-value scalars' (sizes: the table's)
        return _not_by_value(args[2], args[3])
    if call.family == "xpuCudnnExecute":  # the same, and the workspace
        pointers, _, _, by_value = mathlibs.execute_parts(args[2], args[4] or b"")
        return [*_not_by_value(pointers, by_value), args[3]]
    if call.family == "cublasLtMatmulDescSetAttribute" and args[1] in LT_POINTER_ATTRIBUTES and args[2] is not None:
        data = bytes(args[2])
        return [int.from_bytes(data[:8], "little")] if len(data) >= 8 else []
    return []


def _not_by_value(pointers: bytes | None, by_value: bytes | None) -> list[int]:
    flags = bytes(by_value or b"")
    return [p for (p,), flag in zip(struct.iter_unpack("<Q", bytes(pointers or b"")), flags) if not flag]


def _by_value(call: Call, args: list[Any]) -> bool:
    return call.family == "cudnnBackendSetAttribute" and args[1] == mathlibs.CUDNN_DATA_POINTERS


def _ident(module: Any) -> int:
    """A backend's module object as a key: the cuda backend's is a number, the sim's an object."""
    return module if isinstance(module, int) else id(module)


def _handle(value: Any) -> Any:
    """A created object as the backends give it: the sim's object, or the cuda backend's handle as bytes."""
    return _integer(value) if isinstance(value, (bytes, bytearray, memoryview)) else value


def _integer(value: Any) -> int:
    """An output integer as the backends give it: a Python int (sim) or its bytes (cuda)."""
    return value if isinstance(value, int) else int.from_bytes(bytes(value)[:8], "little")
