"""Memory: device allocations mapped client-side (for pointer attributes and unified copies),
pinned host memory as plain client memory, and the copies that need splitting by direction.

The device map holds every range of device memory the application may name: cuMemAlloc's, memory
pools' (client/pools.py) and mapped VMM ranges (client/vmm.py)."""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cffi

from xpuremote.protocol import errors, memprops, wire
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import MEMCPY2D, MEMCPY3D

from . import arrays, data, marshal
from .arrays import ArraySide
from .driver import IMPLEMENTATIONS, Driver, implements, routed
from .streams import HOST_COPY, check_work, refuse_in_capture, stream_of

_libc_ffi = cffi.FFI()
_libc_ffi.cdef("int posix_memalign(void **memptr, size_t alignment, size_t size); void free(void *ptr);")
libc = _libc_ffi.dlopen(None)

HOST, DEVICE = ENUMS["CU_MEMORYTYPE_HOST"], ENUMS["CU_MEMORYTYPE_DEVICE"]
ARRAY, UNIFIED = ENUMS["CU_MEMORYTYPE_ARRAY"], ENUMS["CU_MEMORYTYPE_UNIFIED"]


@dataclass
class Range:
    base: int
    size: int
    ctx: int
    device: int
    flags: int = 0
    ident: int = 0
    owned: bool = False  # host memory we allocated (vs registered)
    pool: int | None = None  # the memory pool it came from (stream-ordered allocation)
    arena: Any = None  # of a pool's allocation the client placed: the pools.Arena its address is from
    handle: int | None = None  # of a VMM mapping: the physical allocation it shows (the server's value)
    graph: int | None = None  # of a graph's allocation: the graph, which holds the address for its life
    access: int = ENUMS["CU_MEM_ACCESS_FLAGS_PROT_READWRITE"]  # a mapping's: none until cuMemSetAccess


@dataclass
class RangeMap:
    """Non-overlapping address ranges, looked up by any address inside them."""

    bases: list[int] = field(default_factory=list)
    ranges: dict[int, Range] = field(default_factory=dict)
    changes: int = 0  # ranges added and removed: what was found by address holds while this stays
    on_change: Callable[[], None] | None = None  # told of each change (C keeps a copy of device memory)

    def add(self, r: Range) -> None:
        bisect.insort(self.bases, r.base)
        self.ranges[r.base] = r
        self.changed()

    def remove(self, base: int) -> Range | None:
        r = self.ranges.pop(base, None)
        if r is not None:
            self.bases.remove(base)
            self.changed()
        return r

    def changed(self) -> None:
        self.changes += 1
        if self.on_change is not None:
            self.on_change()

    def find(self, address: int) -> Range | None:
        i = bisect.bisect_right(self.bases, address) - 1
        if i >= 0:
            r = self.ranges[self.bases[i]]
            if address < r.base + max(r.size, 1):
                return r
        return None


def maps(d: Driver) -> tuple[RangeMap, RangeMap]:
    """(device allocations, host allocations and registrations) of this driver."""
    if "memory" not in d.state:
        d.state["memory"] = (RangeMap(), RangeMap())
    return d.state["memory"]


def record_device(d: Driver, base: int, size: int, device: int | None = None, **kind: Any) -> Range:
    """A new range of device memory, of the current context's device unless told (`kind`: Range's pool,
    handle...)."""
    ctx = d.current_ctx()
    r = Range(base, size, ctx, d.ctxs[ctx].device if device is None else device, ident=d.new_handle(), **kind)
    if len(d.sessions) > 1:
        refuse_overlap(d, r)
    maps(d)[0].add(r)
    return r


def refuse_overlap(d: Driver, r: Range) -> None:
    """Two servers' drivers choose their addresses apart: a range one gave that overlaps another's would make an
    address name two places, so it is refused (it stays allocated on its server until the session ends)."""
    devices = maps(d)[0]
    i = bisect.bisect_left(devices.bases, r.base + max(r.size, 1))  # the ranges that begin before its end
    other = devices.ranges[devices.bases[i - 1]] if i else None
    if other is not None and other.base + max(other.size, 1) > r.base:
        servers = d.sessions[d.devices[r.device].server].address, d.sessions[d.devices[other.device].server].address
        raise CudaError(errors.OUT_OF_MEMORY, f"the server at {servers[0]} gave device memory at {r.base:#x} "
                        f"({r.size} bytes), which overlaps memory of device {other.device} ({servers[1]}) at "
                        f"{other.base:#x}: one address cannot name both")


def forward_with(d: Driver, call: Call, args: list[Any], index: int, data: bytes) -> None:
    """Forward `call` with its argument `index` pointing at `data` instead: a struct of the application's
    rewritten for the server (device ordinals), or a value widened to what the table carries."""
    buffer = marshal.ffi.new("char[]", data)
    d.forward(call, [*args[:index], int(marshal.ffi.cast("uintptr_t", buffer)), *args[index + 1 :]])


# ---- device ordinals inside structs (CUmemLocation): the application's are not the server's ----------
def to_server(d: Driver, layout: struct.Struct, data: bytes, at: int) -> bytes:
    """`data` (one `layout` struct) with the device ordinal at field `at` the server's, where the field
    before it says the location is a device."""
    return _relocate(layout, data, at, lambda ordinal: d.device(ordinal).server_index)


def to_client(d: Driver, layout: struct.Struct, data: bytes, at: int) -> bytes:
    """The other way: the server's device index as the application's ordinal (CUDA_VISIBLE_DEVICES)."""
    return _relocate(layout, data, at, lambda index: client_device(d, index))


def client_device(d: Driver, server_index: int) -> int:
    return next((i for i, dev in enumerate(d.devices) if dev.server_index == server_index), server_index)


def _relocate(layout: struct.Struct, data: bytes, at: int, move: Callable[[int], int]) -> bytes:
    out = bytearray()
    for fields in layout.iter_unpack(bytes(data)):
        fields = list(fields)
        if fields[at - 1] == memprops.ON_DEVICE:
            fields[at] = move(fields[at])
        out += layout.pack(*fields)
    return bytes(out)


# ---- allocation -----------------------------------------------------------------------------
@implements("cuMemAlloc")
def cu_mem_alloc(d: Driver, call: Call, args: list[Any]) -> None:
    address, size = args
    if not address:
        raise CudaError(errors.INVALID_VALUE)
    d.current_ctx()
    if size == 0:
        raise CudaError(errors.INVALID_VALUE, "cuMemAlloc of 0 bytes")
    d.forward(call, args)
    record_device(d, marshal.get(call.params[0], address), size)


@implements("cuMemAllocPitch")
def cu_mem_alloc_pitch(d: Driver, call: Call, args: list[Any]) -> None:
    address, pitch_address, _width, height, _element = args
    d.current_ctx()
    d.forward(call, args)
    pitch = marshal.get(call.params[1], pitch_address)
    record_device(d, marshal.get(call.params[0], address), pitch * height)


@implements("cuMemFree")
@routed  # before its range leaves the map: the server to tell is the memory's
def cu_mem_free(d: Driver, call: Call, args: list[Any]) -> None:
    (base,) = args
    if base == 0:
        return
    r = forget_device(d, base)
    d.post(call, [base])
    release_placed(r)


def forget_device(d: Driver, base: int) -> Range:
    """An allocation (cuMemAlloc's or a pool's) is freed: out of the map, or INVALID_VALUE. A graph's allocation
    stays: its address is its graph's, and the next launch of the graph allocates it again."""
    r = maps(d)[0].ranges.get(base)
    if r is None or r.handle is not None:
        what = "mapped VMM memory (cuMemUnmap it)" if r else "a device allocation"
        raise CudaError(errors.INVALID_VALUE, f"{base:#x} is {'' if r else 'not '}{what}")
    return r if r.graph is not None else maps(d)[0].remove(base)


def release_placed(r: Range) -> None:
    """After its free is queued: a placed allocation's addresses may be placed again (the server takes the free
    first, as it takes the calls in order)."""
    if r.arena is not None:
        with r.arena.lock:
            r.arena.give(r.base)


@implements("cuMemGetAddressRange")
def cu_mem_get_address_range(d: Driver, call: Call, args: list[Any]) -> None:
    pbase, psize, address = args
    r = maps(d)[0].find(address)
    if r is None:
        raise CudaError(errors.NOT_FOUND, f"{address:#x} is not inside a device allocation")
    marshal.put(call.params[0], pbase, r.base)
    marshal.put(call.params[1], psize, r.size)


# ---- host memory: plain client memory, tracked as ranges ------------------------------------------
def host_alloc(d: Driver, call: Call, address: int, size: int, flags: int) -> None:
    if not address:
        raise CudaError(errors.INVALID_VALUE)
    holder = _libc_ffi.new("void **")
    if libc.posix_memalign(holder, 4096, max(size, 1)) != 0:
        raise CudaError(errors.OUT_OF_MEMORY, f"pinned host allocation of {size} bytes")
    base = int(_libc_ffi.cast("uintptr_t", holder[0]))
    ctx = d.contexts.current()
    maps(d)[1].add(Range(base, size, ctx, d.ctxs[ctx].device if ctx else 0, flags, d.new_handle(), owned=True))
    marshal.put(call.params[0], address, base)


@implements("cuMemAllocHost")
def cu_mem_alloc_host(d: Driver, call: Call, args: list[Any]) -> None:
    d.session()
    host_alloc(d, call, args[0], args[1], 0)


@implements("cuMemHostAlloc")
def cu_mem_host_alloc(d: Driver, call: Call, args: list[Any]) -> None:
    d.session()
    host_alloc(d, call, *args)


@implements("cuMemFreeHost")
def cu_mem_free_host(d: Driver, call: Call, args: list[Any]) -> None:
    (base,) = args
    r = maps(d)[1].ranges.get(base)
    if r is None or not r.owned:
        raise CudaError(errors.INVALID_VALUE, f"{base:#x} was not allocated by cuMemHostAlloc")
    maps(d)[1].remove(base)
    libc.free(_libc_ffi.cast("void *", base))


@implements("cuMemHostRegister")
def cu_mem_host_register(d: Driver, call: Call, args: list[Any]) -> None:
    base, size, flags = args
    d.session()
    if not base or not size:
        raise CudaError(errors.INVALID_VALUE)
    hosts = maps(d)[1]
    if hosts.find(base) or hosts.find(base + size - 1):
        raise CudaError(ENUMS["CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"], f"{base:#x} is already registered")
    ctx = d.contexts.current()
    hosts.add(Range(base, size, ctx, d.ctxs[ctx].device if ctx else 0, flags, d.new_handle()))


@implements("cuMemHostUnregister")
def cu_mem_host_unregister(d: Driver, call: Call, args: list[Any]) -> None:
    (base,) = args
    r = maps(d)[1].ranges.get(base)
    if r is None or r.owned:
        inside = maps(d)[1].find(base)
        if inside is not None and not inside.owned:  # as the driver: inside a registered range, not its start
            raise CudaError(errors.INVALID_VALUE, f"{base:#x} lies inside the range registered at {inside.base:#x}")
        raise CudaError(ENUMS["CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"], f"{base:#x} is not registered")
    maps(d)[1].remove(base)


@implements("cuMemHostGetFlags")
def cu_mem_host_get_flags(d: Driver, call: Call, args: list[Any]) -> None:
    address, base = args
    r = maps(d)[1].find(base)
    if r is None:
        raise CudaError(errors.INVALID_VALUE, f"{base:#x} is not pinned host memory")
    marshal.put(call.params[0], address, r.flags)


@implements("cuMemHostGetDevicePointer")
def cu_mem_host_get_device_pointer(d: Driver, call: Call, args: list[Any]) -> None:
    d.say_once("mapped", "mapped pinned memory (cuMemHostGetDevicePointer) cannot be reached by a remote GPU")
    raise CudaError(errors.NOT_SUPPORTED, "host memory cannot be mapped into a remote device")


# ---- pointer attributes, from the two maps --------------------------------------------------------
ATTRIBUTE_SIZES = {"CONTEXT": 8, "MEMORY_TYPE": 4, "DEVICE_POINTER": 8, "HOST_POINTER": 8, "P2P_TOKENS": 16,
                   "SYNC_MEMOPS": 4, "BUFFER_ID": 8, "IS_MANAGED": 4, "DEVICE_ORDINAL": 4,
                   "IS_LEGACY_CUDA_IPC_CAPABLE": 4, "RANGE_START_ADDR": 8, "RANGE_SIZE": 8, "MAPPED": 4,
                   "ALLOWED_HANDLE_TYPES": 8, "IS_GPU_DIRECT_RDMA_CAPABLE": 4, "ACCESS_FLAGS": 4,
                   "MEMPOOL_HANDLE": 8, "MAPPING_SIZE": 8, "MAPPING_BASE_ADDR": 8, "MEMORY_BLOCK_ID": 8,
                   "IS_HW_DECOMPRESS_CAPABLE": 4}
ATTRIBUTES = {ENUMS[f"CU_POINTER_ATTRIBUTE_{k}"]: (k, n) for k, n in ATTRIBUTE_SIZES.items()
              if f"CU_POINTER_ATTRIBUTE_{k}" in ENUMS}


def pointer_attribute(d: Driver, attribute: int, address: int) -> tuple[int, int] | None:
    """(value, size in bytes) of one attribute, or None for memory CUDA does not know."""
    name, size = ATTRIBUTES.get(attribute, (None, 0))
    if name is None:
        raise CudaError(errors.INVALID_VALUE, f"pointer attribute {attribute}")
    devices, hosts = maps(d)
    r, kind = devices.find(address), DEVICE
    if r is None:
        r, kind = hosts.find(address), HOST
    if r is None:
        return None
    values = {"CONTEXT": r.ctx, "MEMORY_TYPE": kind, "DEVICE_POINTER": address if kind == DEVICE else 0,
              "HOST_POINTER": address if kind == HOST else 0, "SYNC_MEMOPS": 1, "BUFFER_ID": r.ident,
              "DEVICE_ORDINAL": r.device, "RANGE_START_ADDR": r.base, "RANGE_SIZE": r.size, "MAPPED": 1,
              "ACCESS_FLAGS": r.access if kind == DEVICE else 1, "MAPPING_SIZE": r.size, "MAPPING_BASE_ADDR": r.base,
              "MEMORY_BLOCK_ID": r.ident, "MEMPOOL_HANDLE": r.pool or 0}
    return values.get(name, 0), size


@implements("cuPointerGetAttribute")
def cu_pointer_get_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    data, attribute, address = args
    d.session()
    found = pointer_attribute(d, attribute, address)
    if found is None:
        raise CudaError(errors.INVALID_VALUE, f"{address:#x} is not memory CUDA knows")
    value, size = found
    marshal.write(data, value.to_bytes(size, "little"))


@implements("cuPointerGetAttributes")
def cu_pointer_get_attributes(d: Driver, call: Call, args: list[Any]) -> None:
    count, attributes, data, address = args
    d.session()
    kinds = struct.unpack(f"<{count}i", marshal.read(attributes, 4 * count))
    slots = struct.unpack(f"<{count}Q", marshal.read(data, 8 * count))
    for attribute, slot in zip(kinds, slots):
        found = pointer_attribute(d, attribute, address)
        size = ATTRIBUTES[attribute][1]
        if slot:  # memory CUDA does not know reads as zeros here, as the driver does
            marshal.write(slot, (found[0] if found else 0).to_bytes(size, "little"))


@implements("cuMemcpyDtoHAsync")
@routed
def cu_memcpy_dtoh_async(d: Driver, call: Call, args: list[Any]) -> None:
    """Into page-locked memory: sent at once, not waited for; the bytes land in the application's
    buffer when the answer is read, which happens before any later synchronisation can report
    completion. Into pageable memory the driver returns only once the copy is done, so wait."""
    refuse_in_capture(d, stream_of(call, args[3]), HOST_COPY)
    wire_args, _ = marshal.pack(call, d.translate(call, args), d.new_handle, snapshot=False)
    dst, size = args[0], args[2]
    if not is_pinned(d, dst, size):
        to_host(d, call, args, wire_args, by_data_connection(d, call, args, size))
        return
    d.session().call_later(call, wire_args, d.wire_ctx(), lambda status, outs: marshal.unpack(call, args, outs),
                           answer_bytes=size)


@implements("cuMemcpyDtoH")
@routed
def cu_memcpy_dtoh(d: Driver, call: Call, args: list[Any]) -> None:
    if by_data_connection(d, call, args, args[2]):
        to_host(d, call, args, marshal.pack(call, args, d.new_handle, snapshot=False)[0], by_data=True)
    else:
        d.forward(call, args)


def to_host(d: Driver, call: Call, args: list[Any], wire_args: list[Any], by_data: bool) -> None:
    """A device-to-host copy the application waits for; `by_data`: its bytes come on the data connection,
    straight into the application's buffer."""
    if by_data:
        wire_args[0] = wire.Data(marshal.view(args[0], args[2]), asked=True)
    marshal.unpack(call, args, d.call(call, wire_args, by_data))


def by_data_connection(d: Driver, call: Call, args: list[Any], size: int) -> bool:
    """Whether a copy the application waits for goes on the data connection (checked as the generic path
    checks a call in a capture)."""
    if size < data.DATA_MIN or d.session().data is None:
        return False
    if d.state.get("captures"):
        check_work(d, call, args)
    return True


def is_pinned(d: Driver, host: int, size: int) -> bool:
    """Whether [host, host+size) is page-locked memory of the application's (cuMemAllocHost, registered)."""
    pinned = maps(d)[1].find(host)
    return pinned is not None and host + size <= pinned.base + pinned.size


# ---- host-to-device copies: on the data connection, or in pieces that the server takes -----------------
@implements("cuMemcpyHtoD", "cuMemcpyHtoDAsync")
@routed
def cu_memcpy_htod(d: Driver, call: Call, args: list[Any]) -> None:
    """A large copy the application waits for (a sync one, or from pageable memory, which the driver has
    read by the time it returns) goes on the data connection; otherwise as the table says, in pieces of
    what one request may carry under the server's size limit."""
    dst, src, size, *tail = args
    if tail:
        refuse_in_capture(d, stream_of(call, tail[0]), HOST_COPY)
    if not (tail and is_pinned(d, src, size)) and by_data_connection(d, call, args, size):
        wire_args, _ = marshal.pack(call, d.translate(call, args), d.new_handle, snapshot=False)
        wire_args[1] = wire.Data(marshal.view(src, size))
        d.call(call, wire_args, by_data=True)
        return
    budget = d.session().request_budget
    if not budget or size <= budget:
        d.forward(call, args)
        return
    for offset in range(0, size, budget):
        d.forward(call, [dst + offset, src + offset, min(budget, size - offset), *tail])


# ---- copies whose direction depends on where the pointers point ------------------------------------
def is_device(d: Driver, address: int) -> bool:
    return maps(d)[0].find(address) is not None


_self_memory: dict[int, int] = {}  # pid -> a descriptor of its /proc/self/mem


def host_bytes(address: int, most: int) -> bytes | None:
    """Up to `most` bytes at an address of this process, within its page; None where nothing is mapped
    there. Read through /proc/self/mem, where an unmapped address fails the read, not the process."""
    n = min(most, mmap.PAGESIZE - address % mmap.PAGESIZE)
    try:
        if os.getpid() not in _self_memory:
            _self_memory[os.getpid()] = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
        found = os.pread(_self_memory[os.getpid()], n, address)
    except (OSError, OverflowError, ValueError):
        return None
    return found if len(found) == n else None


def copy(d: Driver, dst: int, src: int, size: int, stream: int | None) -> None:
    """A unified-addressing copy, split by direction."""
    if size == 0:
        return
    if not dst or not src:
        raise CudaError(errors.INVALID_VALUE, "cuMemcpy with a NULL pointer")
    dst_dev, src_dev = is_device(d, dst), is_device(d, src)
    if stream is not None and dst_dev != src_dev:
        refuse_in_capture(d, stream, HOST_COPY)
    suffix = "" if stream is None else "Async"
    tail = [] if stream is None else [stream]
    if dst_dev and src_dev:  # as cuMemcpyDtoD: between two servers' devices, staged (client/servers.py)
        dtod = CALLS[f"cuMemcpyDtoD{suffix}_v2"]
        IMPLEMENTATIONS[dtod.family](d, dtod, [dst, src, size, *tail])
    elif dst_dev:
        cu_memcpy_htod(d, CALLS[f"cuMemcpyHtoD{suffix}_v2"], [dst, src, size, *tail])
    elif src_dev and stream is None:
        cu_memcpy_dtoh(d, CALLS["cuMemcpyDtoH_v2"], [dst, src, size])
    elif src_dev:  # answered, as the call it is: its bytes come back
        cu_memcpy_dtoh_async(d, CALLS["cuMemcpyDtoHAsync_v2"], [dst, src, size, stream])
    else:
        marshal.ffi.memmove(marshal.ffi.cast("char *", dst), marshal.ffi.cast("char *", src), size)


@implements("cuMemcpy")
def cu_memcpy(d: Driver, call: Call, args: list[Any]) -> None:
    dst, src, size = args
    copy(d, dst, src, size, None)


@implements("cuMemcpyAsync")
def cu_memcpy_async(d: Driver, call: Call, args: list[Any]) -> None:
    dst, src, size, stream = args
    copy(d, dst, src, size, 2 if call.per_thread and not stream else stream)



def side(d: Driver, kind: int, host: int, device: int, x: int, y: int, pitch: int, array: int = 0,
         z: int = 0) -> tuple[bool, int, int] | ArraySide:
    """(is host memory, address of the first byte, pitch) of one side of a 2D/3D copy, or an array's
    place (`z`: an array's slice; memory's slices are in `y`)."""
    if kind == ARRAY:
        return ArraySide(array, x, y, z)
    if kind == UNIFIED:
        on_host = not is_device(d, host)
    else:
        on_host, host = kind == HOST, host if kind == HOST else device
    return on_host, host + y * pitch + x, pitch


def rect_copy(d: Driver, src: tuple[bool, int, int], dst: tuple[bool, int, int], width: int, height: int,
              stream: int, wait: bool) -> None:
    """Copy `height` rows of `width` bytes, each side with its own pitch."""
    if isinstance(src, ArraySide) or isinstance(dst, ArraySide):
        arrays.rect_copy(d, src, dst, width, height, stream, wait)
        return
    (src_host, s, spitch), (dst_host, t, dpitch) = src, dst
    if src_host != dst_host:
        refuse_in_capture(d, stream, HOST_COPY)
    if src_host and dst_host:
        for row in range(height):
            marshal.write(t + row * dpitch, marshal.read(s + row * spitch, width))
    elif src_host:
        to_device(d, s, spitch, t, dpitch, width, height, stream)
        if wait:
            d.call(CALLS["cuStreamSynchronize"], [stream])
    elif dst_host:
        (rows,) = d.call(CALLS["xpuMemcpy2DToHost"], [width * height, s, spitch, width, height, stream])
        to_host_rows(rows, t, dpitch, width, height)
    else:
        d.post(CALLS["xpuMemcpy2DDevice"], [t, dpitch, s, spitch, width, height, stream])


def to_host_rows(rows: Any, t: int, dpitch: int, width: int, height: int) -> None:
    for r in range(height):
        marshal.write(t + r * dpitch, rows[r * width : (r + 1) * width])


def to_device(d: Driver, s: int, spitch: int, t: int, dpitch: int, width: int, height: int, stream: int) -> None:
    """Rows from the host, as many a message as the server's request size limit allows; a row
    alone over it goes as 1D copies in pieces."""
    budget = d.session().request_budget
    if budget and width > budget:
        for r in range(height):
            cu_memcpy_htod(d, CALLS["cuMemcpyHtoDAsync_v2"], [t + r * dpitch, s + r * spitch, width, stream])
        return
    step = budget // max(width, 1) if budget else height
    for first in range(0, max(height, 1), max(step, 1)):
        n = min(step, height - first)
        rows = b"".join(marshal.read(s + (first + r) * spitch, width) for r in range(n))
        d.post(CALLS["xpuMemcpy2DFromHost"], [t + first * dpitch, dpitch, rows, width, n, stream], len(rows))


def copy_stream(call: Call, args: list[Any]) -> int:
    stream = args[1] if len(args) > 1 else 0
    return 2 if call.per_thread and not stream else stream


def modern_struct(call: Call) -> None:
    if call.params[0].ctype.endswith("_v1 *"):
        raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol} takes the CUDA 2.x struct layout")


@implements("cuMemcpy2D", "cuMemcpy2DUnaligned", "cuMemcpy2DAsync")
def cu_memcpy_2d(d: Driver, call: Call, args: list[Any]) -> None:
    modern_struct(call)
    (sx, sy, stype, shost, sdev, sarr, spitch,
     dx, dy, dtype, dhost, ddev, darr, dpitch, width, height) = MEMCPY2D.unpack(marshal.read(args[0], MEMCPY2D.size))
    src = side(d, stype, shost, sdev, sx, sy, spitch, sarr)
    dst = side(d, dtype, dhost, ddev, dx, dy, dpitch, darr)
    rect_copy(d, src, dst, width, height, copy_stream(call, args), call.family != "cuMemcpy2DAsync")


@implements("cuMemcpy3D", "cuMemcpy3DAsync", "cuMemcpy3DPeer", "cuMemcpy3DPeerAsync")
def cu_memcpy_3d(d: Driver, call: Call, args: list[Any]) -> None:
    """The peer forms' struct is the plain one with each side's context where it has reserved fields: the
    addresses are unified, so the contexts add nothing the copy needs."""
    modern_struct(call)
    (sx, sy, sz, slod, stype, shost, sdev, sarr, spitch, sheight,
     dx, dy, dz, dlod, dtype, dhost, ddev, darr, dpitch, dheight,
     width, height, depth) = MEMCPY3D.unpack(marshal.read(args[0], MEMCPY3D.size))
    if slod or dlod:
        raise CudaError(errors.NOT_SUPPORTED, "mipmap levels are not forwarded")
    stream = copy_stream(call, args)
    for z in range(depth):  # one rectangle per slice
        sy_z = sy if stype == ARRAY else sy + (sz + z) * sheight  # an array's slices are its z
        dy_z = dy if dtype == ARRAY else dy + (dz + z) * dheight
        src = side(d, stype, shost, sdev, sx, sy_z, spitch, sarr, sz + z)
        dst = side(d, dtype, dhost, ddev, dx, dy_z, dpitch, darr, dz + z)
        rect_copy(d, src, dst, width, height, stream, not call.family.endswith("Async") and z == depth - 1)
