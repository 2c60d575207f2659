"""Memory pools: stream-ordered allocation (cuMemAllocAsync, cuMemFreeAsync), pools and their attributes.

An allocation's address is the server's, so allocating waits for its answer (one round trip, as
cuMemAlloc); freeing, trimming and setting an attribute or access are queued. Pools are the server's
(CUmemoryPool handles from the worker's table). The client keeps each device's default pool (asked
once) and current pool (cuDeviceSetMemPool, cuMemPoolDestroy), so cuDeviceGetMemPool is answered
locally and a pool is always the same handle. Every allocation joins the device map with its pool
(pointer attributes, unified copies). A stream-ordered allocation inside a stream capture would be a
graph's memory node, which is not forwarded: refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.errors import CudaError

from . import graph_state, marshal
from .driver import Driver, implements
from .memory import client_device, forget_device, forward_with, maps, record_device, to_server
from .streams import capture_of, stream, stream_of
from .vmm import sendable


@dataclass
class PoolState:
    defaults: dict[int, int] = field(default_factory=dict)  # device ordinal -> its default pool
    current: dict[int, int] = field(default_factory=dict)  # device ordinal -> the pool cuDeviceSetMemPool set
    devices: dict[int, int] = field(default_factory=dict)  # pool -> its device ordinal


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
    pools(d).devices[marshal.get(call.params[0], address)] = memprops.POOL_PROPS.unpack(data)[3]


@implements("cuMemPoolDestroy")
def cu_mem_pool_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    (pool,) = args
    state = pools(d)
    if pool in state.defaults.values() or pool not in state.devices:
        raise CudaError(errors.INVALID_VALUE, f"{pool:#x} is not a memory pool made by cuMemPoolCreate")
    d.forward(call, args)
    device = state.devices.pop(pool)
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
    d.forward(call, args)
    capture = capture_of(d, handle)
    graph = None if capture is None else capture.graph
    record_device(d, marshal.get(call.params[0], address), size, device, pool=pool if graph is None else None,
                  graph=graph)
    if graph is not None:
        graph_state.allocated(d, graph, marshal.get(call.params[0], address))


@implements("cuMemFreeAsync")
def cu_mem_free_async(d: Driver, call: Call, args: list[Any]) -> None:
    """In a capture, a free node of the capture's graph: nothing is freed now."""
    dptr, handle = args
    if not dptr:
        return
    if capture_of(d, stream_of(call, handle)) is None:
        forget_device(d, dptr)
    elif getattr(maps(d)[0].ranges.get(dptr), "graph", None) is None:
        raise CudaError(errors.INVALID_VALUE, f"{dptr:#x} is not a graph's allocation: a capture frees only what a "
                        "graph allocated")
    d.forward(call, args)
