"""Memory pools: stream-ordered allocation (cuMemAllocAsync, cuMemFreeAsync), pools and their attributes.

A stream-ordered allocation is not waited for. The first one from a pool asks the server for an address
range reserved for that pool and this session (xpuMemPoolReserve, one round trip); the client then places
the pool's allocations in its ranges itself (Arena: best fit, freed blocks joined with their neighbours)
and sends each as xpuMemPoolAlloc, queued like a launch. The server makes the memory there in stream order
and checks that the range is one it reserved for that pool and that nothing of the session's is there
already. A block freed with cuMemFreeAsync is the arena's again at once, as the driver's pools reuse memory
freed in stream order (the server orders the reuse on another stream after the free). An error the server
finds (the session's memory quota, the device's memory) fails the next call that waits; the client refuses
at once what it can tell itself: a pool's maximum size, more than the device holds. Inside a stream capture
an allocation is the graph's, at the server's address: that one waits for its answer.

Freeing, trimming and setting an attribute or access are queued. Pools are the server's (CUmemoryPool
handles from the worker's table). The client keeps each device's default pool (asked once) and current pool
(cuDeviceSetMemPool, cuMemPoolDestroy), so cuDeviceGetMemPool is answered locally and a pool is always the
same handle. Every allocation joins the device map with its pool (pointer attributes, unified copies).
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.errors import CudaError

from . import graph_state, marshal
from .driver import Driver, implements, routed
from .memory import client_device, forget_device, forward_with, maps, record_device, release_placed, to_server
from .streams import capture_of, stream, stream_of
from .vmm import sendable


@dataclass
class PoolState:
    defaults: dict[int, int] = field(default_factory=dict)  # device ordinal -> its default pool
    current: dict[int, int] = field(default_factory=dict)  # device ordinal -> the pool cuDeviceSetMemPool set
    devices: dict[int, int] = field(default_factory=dict)  # pool -> its device ordinal
    max_sizes: dict[int, int] = field(default_factory=dict)  # pool -> its CUmemPoolProps maxSize (0: none)
    arenas: dict[int, Arena] = field(default_factory=dict)  # pool -> where the client places its allocations


ALIGN = 512  # the driver's allocation granule: each allocation's size is rounded up to it
FIRST_RANGE = 4 << 30  # bytes of addresses a pool's first range holds: addresses only, no memory
LARGEST_RANGE = 64 << 30  # ranges double up to this (an allocation larger gets a range of its own size)


class Arena:
    """A pool's address ranges (reserved by the server for this session) and which of their bytes are free:
    best fit among the free blocks, a freed block joined with free neighbours. Addresses only: the server
    holds the memory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_size: list[tuple[int, int]] = []  # free blocks (size, base), sorted
        self.by_base: dict[int, int] = {}  # free block base -> size
        self.by_end: dict[int, int] = {}  # free block end -> base
        self.live: dict[int, int] = {}  # placed allocation base -> rounded size
        self.live_bytes = 0
        self.reserved = 0  # bytes of addresses in all its ranges

    def take(self, size: int) -> int | None:
        """The base of `size` bytes (ALIGN-rounded) from the best-fitting free block, or None: none fits."""
        i = bisect.bisect_left(self.by_size, (size, 0))
        if i == len(self.by_size):
            return None
        block, base = self.by_size[i]
        self._unfree(block, base)
        if block > size:
            self._free(base + size, block - size)
        self.live[base] = size
        self.live_bytes += size
        return base

    def give(self, base: int) -> None:
        """A placed allocation is freed: its block is free again, joined with free neighbours."""
        size = self.live.pop(base)
        self.live_bytes -= size
        after = self.by_base.get(base + size)
        if after is not None:
            self._unfree(after, base + size)
            size += after
        before = self.by_end.get(base)
        if before is not None:
            self._unfree(base - before, before)
            size, base = size + base - before, before
        self._free(base, size)

    def add_range(self, base: int, size: int) -> None:
        self.reserved += size
        self._free(base, size)

    def next_range(self, size: int) -> int:
        """Bytes of addresses to reserve next, for an allocation of `size` that no free block holds."""
        wanted = min(max(FIRST_RANGE, 2 * self.reserved), LARGEST_RANGE)
        return max(wanted, -(-size // memprops.GRANULARITY) * memprops.GRANULARITY)

    def _free(self, base: int, size: int) -> None:
        bisect.insort(self.by_size, (size, base))
        self.by_base[base] = size
        self.by_end[base + size] = base

    def _unfree(self, size: int, base: int) -> None:
        del self.by_size[bisect.bisect_left(self.by_size, (size, base))]
        del self.by_base[base]
        del self.by_end[base + size]


def pools(d: Driver) -> PoolState:
    if "pools" not in d.state:
        d.state["pools"] = PoolState()
    return d.state["pools"]


def default_pool(d: Driver, device: int) -> int:
    """The device's default pool: asked of the server once."""
    state = pools(d)
    with d.lock:
        if device not in state.defaults:
            (answer,) = d.call(CALLS["cuDeviceGetDefaultMemPool"], [8, d.device(device).server_index])
            state.defaults[device] = int.from_bytes(answer, "little")
            state.devices[state.defaults[device]] = device
        return state.defaults[device]


def current_pool(d: Driver, device: int) -> int:
    return pools(d).current.get(device) or default_pool(d, device)


def set_current_pool(d: Driver, device: int, pool: int) -> None:
    """cuDeviceSetMemPool, checked here (the driver answers at once; a queued call could not)."""
    d.device(device)
    if pools(d).devices.get(pool) != device:
        raise CudaError(errors.INVALID_VALUE, f"{pool:#x} is not a memory pool of device {device}")
    d.forward(CALLS["cuDeviceSetMemPool"], [device, pool])
    pools(d).current[device] = pool


def put_handle(address: int, value: int) -> None:
    marshal.put_u64(address, value)  # NULL is the driver's INVALID_VALUE


def location_device(d: Driver, location: int, kind: int) -> int:
    """The device ordinal a CUmemLocation names, for a pool of device memory; host and managed pools (CUDA
    13's location forms) live on the server's machine and are not forwarded."""
    loc_type, ordinal = memprops.LOCATION.unpack(marshal.read(location, memprops.LOCATION.size))
    if loc_type != memprops.ON_DEVICE or kind != memprops.PINNED:
        raise CudaError(errors.NOT_SUPPORTED, f"memory pools of location type {loc_type}, allocation type {kind}: only "
                        "devices' pools of pinned memory are forwarded")
    d.device(ordinal)
    return ordinal


# ---- which pool ---------------------------------------------------------------------------------
@implements("cuDeviceGetDefaultMemPool")
def cu_device_get_default_mem_pool(d: Driver, call: Call, args: list[Any]) -> None:
    address, dev = args
    put_handle(address, default_pool(d, dev))


@implements("cuDeviceGetMemPool")
def cu_device_get_mem_pool(d: Driver, call: Call, args: list[Any]) -> None:
    address, dev = args
    put_handle(address, current_pool(d, dev))


@implements("cuDeviceSetMemPool")
def cu_device_set_mem_pool(d: Driver, call: Call, args: list[Any]) -> None:
    set_current_pool(d, *args)


@implements("cuMemGetDefaultMemPool")
def cu_mem_get_default_mem_pool(d: Driver, call: Call, args: list[Any]) -> None:
    address, location, kind = args
    put_handle(address, default_pool(d, location_device(d, location, kind)))


@implements("cuMemGetMemPool")
def cu_mem_get_mem_pool(d: Driver, call: Call, args: list[Any]) -> None:
    address, location, kind = args
    put_handle(address, current_pool(d, location_device(d, location, kind)))


@implements("cuMemSetMemPool")
def cu_mem_set_mem_pool(d: Driver, call: Call, args: list[Any]) -> None:
    location, kind, pool = args
    set_current_pool(d, location_device(d, location, kind), pool)


# ---- pools ----------------------------------------------------------------------------------------
@implements("cuMemPoolCreate")
def cu_mem_pool_create(d: Driver, call: Call, args: list[Any]) -> None:
    address, props = args
    data = sendable(d, call, memprops.POOL_PROPS, marshal.read(props, memprops.POOL_PROPS.size))
    try:
        memprops.check_pool_props(data)
    except CudaError as exc:
        d.say_once(f"pool-props {exc.detail}", "cuMemPoolCreate refused: %s", exc.detail)
        raise
    forward_with(d, call, args, 1, to_server(d, memprops.POOL_PROPS, data, 3))
    pool, fields = marshal.get(call.params[0], address), memprops.POOL_PROPS.unpack(data)
    pools(d).devices[pool] = fields[3]
    pools(d).max_sizes[pool] = fields[5]


@implements("cuMemPoolDestroy")
def cu_mem_pool_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    (pool,) = args
    state = pools(d)
    if pool in state.defaults.values() or pool not in state.devices:
        raise CudaError(errors.INVALID_VALUE, f"{pool:#x} is not a memory pool made by cuMemPoolCreate")
    d.forward(call, args)
    device = state.devices.pop(pool)
    state.max_sizes.pop(pool, None)
    state.arenas.pop(pool, None)  # its live allocations keep their arena until they are freed
    if state.current.get(device) == pool:  # the device's default is current again, as the driver does
        del state.current[device]


@implements("cuMemPoolSetAttribute")
def cu_mem_pool_set_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    pool, attr, value = args
    data = marshal.read(value, attribute_size(attr))
    forward_with(d, call, args, 2, data.ljust(memprops.POOL_VALUE_BYTES, b"\0"))


@implements("cuMemPoolGetAttribute")
def cu_mem_pool_get_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    pool, attr, value = args
    size = attribute_size(attr)
    answer = marshal.ffi.new("char[]", memprops.POOL_VALUE_BYTES)
    d.forward(call, [pool, attr, int(marshal.ffi.cast("uintptr_t", answer))])
    data = marshal.ffi.buffer(answer)[:size]
    if attr == memprops.POOL_ATTRIBUTE["LOCATION_ID"]:
        data = client_device(d, int.from_bytes(data, "little", signed=True)).to_bytes(size, "little", signed=True)
    marshal.write(value, data)


def attribute_size(attr: int) -> int:
    size = memprops.POOL_ATTRIBUTE_SIZES.get(attr)
    if size is None:
        raise CudaError(errors.INVALID_VALUE, f"memory pool attribute {attr}")
    return size


@implements("cuMemPoolSetAccess")
def cu_mem_pool_set_access(d: Driver, call: Call, args: list[Any]) -> None:
    pool, descs, count = args
    data = marshal.read(descs, count * memprops.ACCESS_DESC.size)
    forward_with(d, call, args, 1, to_server(d, memprops.ACCESS_DESC, data, 1))


@implements("cuMemPoolGetAccess")
def cu_mem_pool_get_access(d: Driver, call: Call, args: list[Any]) -> None:
    flags, pool, location = args
    data = marshal.read(location, memprops.LOCATION.size)
    forward_with(d, call, args, 2, to_server(d, memprops.LOCATION, data, 1))


# ---- stream-ordered allocation (in a capture: the graph's allocation and free nodes) -----------------------
@implements("cuMemAllocAsync", "cuMemAllocFromPoolAsync")
def cu_mem_alloc_async(d: Driver, call: Call, args: list[Any]) -> None:
    address, size, handle = args[0], args[1], stream_of(call, args[-1])
    if not address:
        raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: dptr is NULL")
    if call.family == "cuMemAllocFromPoolAsync":
        pool = args[2]
        device = pools(d).devices.get(pool)
        if device is None:
            raise CudaError(errors.INVALID_HANDLE, f"{pool:#x} is not a memory pool")
    else:
        device = d.context(stream(d, handle).ctx).device
        pool = current_pool(d, device)
    capture = capture_of(d, handle)
    if capture is None:
        base, arena = place(d, pool, device, size)
        try:
            d.forward(CALLS["xpuMemPoolAlloc"], [pool, base, size, handle])
        except CudaError:
            with arena.lock:
                arena.give(base)
            raise
        marshal.put(call.params[0], address, base)
        record_device(d, base, size, device, pool=pool, arena=arena)
        return
    d.forward(call, args)  # the graph's allocation: its address is the server's
    base = marshal.get(call.params[0], address)
    record_device(d, base, size, device, graph=capture.graph)
    graph_state.allocated(d, capture.graph, base)


def place(d: Driver, pool: int, device: int, size: int) -> tuple[int, Arena]:
    """An address for `size` bytes of `pool`'s, from its arena; a new range of addresses first if no free
    block holds them (the one round trip). What the driver would refuse at once is refused here."""
    if size == 0:
        raise CudaError(errors.INVALID_VALUE, "a stream-ordered allocation of 0 bytes")
    rounded = -(-size // ALIGN) * ALIGN
    state = pools(d)
    with d.lock:
        arena = state.arenas.get(pool) or state.arenas.setdefault(pool, Arena())
    with arena.lock:
        limit = state.max_sizes.get(pool) or d.device(device).total_mem
        if arena.live_bytes + rounded > limit:
            raise CudaError(errors.OUT_OF_MEMORY, f"{size} bytes requested of a pool holding {arena.live_bytes} "
                            f"of at most {limit}")
        base = arena.take(rounded)
        if base is None:
            span = arena.next_range(rounded)
            (answer,) = d.call(CALLS["xpuMemPoolReserve"], [8, pool, span])
            arena.add_range(int.from_bytes(answer, "little"), span)
            base = arena.take(rounded)
        if base is None:
            raise CudaError(errors.OUT_OF_MEMORY, f"a new range of {span} bytes holds no {rounded} bytes")
        return base, arena


@implements("cuMemFreeAsync")
@routed  # before its range leaves the map: the server to tell is the memory's (or the stream's)
def cu_mem_free_async(d: Driver, call: Call, args: list[Any]) -> None:
    """In a capture, a free node of the capture's graph: nothing is freed now."""
    dptr, handle = args
    if not dptr:
        return
    if capture_of(d, stream_of(call, handle)) is not None:
        if getattr(maps(d)[0].ranges.get(dptr), "graph", None) is None:
            raise CudaError(errors.INVALID_VALUE, f"{dptr:#x} is not a graph's allocation: a capture frees only what "
                            "a graph allocated")
        d.forward(call, args)
        return
    r = forget_device(d, dptr)
    d.forward(call, args)
    release_placed(r)
