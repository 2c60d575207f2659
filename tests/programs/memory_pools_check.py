"""Memory pools (stream-ordered allocation) and virtual memory management through cuda-python's driver
bindings, run under the shim (tests/test_memory_pools.py).

Checks and sections as tests/programs/checks.py says. Exact byte counts of a pool's reserve, the granularity, and
the kernel's results (the sim runs saxpy's host implementation; the PTX body is empty) are the sim's:
they are checked where XPU_TEST_BACKEND is not `cuda`.
"""

from __future__ import annotations

import ctypes
import os
import struct

from checks import SUCCESS, check, fails, finish, ok, section
from cuda.bindings import driver as cu

INVALID_VALUE = cu.CUresult.CUDA_ERROR_INVALID_VALUE
NOT_SUPPORTED = cu.CUresult.CUDA_ERROR_NOT_SUPPORTED
SIM = os.environ.get("XPU_TEST_BACKEND", "sim") != "cuda"
MIB = 1 << 20
A = cu.CUmemPool_attribute
P = cu.CUpointer_attribute
RW = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry saxpy(.param .f32 a, .param .u64 x, .param .u64 y, .param .u32 n)
{
    ret;
}
"""


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def read(ptr: int, n: int) -> bytes:
    buf = ctypes.create_string_buffer(n)
    ok(cu.cuMemcpyDtoH(ctypes.addressof(buf), ptr, n), f"cuMemcpyDtoH {n} bytes")
    return buf.raw


def write(ptr: int, data: bytes) -> None:
    ok(cu.cuMemcpyHtoD(ptr, data, len(data)), f"cuMemcpyHtoD {len(data)} bytes")


def attribute(pool: cu.CUmemoryPool, attr: A) -> int:
    return int(ok(cu.cuMemPoolGetAttribute(pool, attr), f"cuMemPoolGetAttribute {attr.name}"))


def free_memory() -> int:
    free, _ = ok(cu.cuMemGetInfo(), "cuMemGetInfo")
    return free


def device_location(device: int = 0) -> cu.CUmemLocation:
    location = cu.CUmemLocation()
    location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    location.id = device
    return location


def access(device: int = 0) -> cu.CUmemAccessDesc:
    desc = cu.CUmemAccessDesc()
    desc.location = device_location(device)
    desc.flags = RW
    return desc


def allocation_prop(handle_types: int = 0) -> cu.CUmemAllocationProp:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location = device_location()
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType(handle_types)
    return prop


def pool_props(handle_types: int = 0) -> cu.CUmemPoolProps:
    props = cu.CUmemPoolProps()
    props.allocType = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location = device_location()
    props.handleTypes = cu.CUmemAllocationHandleType(handle_types)
    return props


# ---- the device says what it has ------------------------------------------------------------------------
ok(cu.cuInit(0), "cuInit")
dev = ok(cu.cuDeviceGet(0), "cuDeviceGet")
D = cu.CUdevice_attribute
for name, expected in (("CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED", 1),
                       ("CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", 1),
                       ("CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES", 0),
                       ("CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", 0)):
    value = ok(cu.cuDeviceGetAttribute(getattr(D, name), dev), f"cuDeviceGetAttribute {name}")
    check(value == expected, f"{name} is {expected}", repr(value))
pctx = ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(pctx), "cuCtxSetCurrent")
stream = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")


# ---- the default pool ------------------------------------------------------------------------------------
@section
def default_pool() -> None:
    pool = ok(cu.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool")
    again = ok(cu.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool again")
    current = ok(cu.cuDeviceGetMemPool(dev), "cuDeviceGetMemPool")
    check(int(pool) != 0 and int(pool) == int(again) == int(current), "one default pool, also the current one",
          f"{pool} {again} {current}")
    check(attribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0, "release threshold 0 by default")
    check(attribute(pool, A.CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC) == 1, "opportunistic reuse on by default")
    before = free_memory()

    ptr = ok(cu.cuMemAllocAsync(MIB, stream), "cuMemAllocAsync 1 MiB")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize after the allocation")
    check(read(ptr, MIB) == bytes(MIB), "a new pool allocation reads as zeros")
    data = pattern(MIB, 3)
    ok(cu.cuMemcpyHtoDAsync(ptr, data, MIB, stream), "cuMemcpyHtoDAsync into pool memory")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(read(ptr, MIB) == data, "pool memory round trip")
    used = attribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    reserved = attribute(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    check(used >= MIB and reserved >= used, "used and reserved count the allocation", f"{used} {reserved}")
    if SIM:
        check(before - free_memory() == reserved, "cuMemGetInfo counts the pool's memory", f"{before} {free_memory()}")

    # pointer attributes and address ranges, from the client's map
    kind = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, int(ptr) + 100), "pointer MEMORY_TYPE")
    check(kind == cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, "pool memory is device memory", repr(kind))
    owner = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr), "pointer MEMPOOL_HANDLE")
    check(int(owner) == int(pool), "the allocation's pool", f"{owner} vs {pool}")
    base, size = ok(cu.cuMemGetAddressRange(int(ptr) + 4096), "cuMemGetAddressRange")
    check(int(base) == int(ptr) and size == MIB, "address range of a pool allocation", f"{base} {size}")
    host = ctypes.create_string_buffer(64)
    ok(cu.cuMemcpy(ctypes.addressof(host), ptr, 64), "unified cuMemcpy from pool memory")
    check(host.raw == data[:64], "unified copy direction from the map")

    ok(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize after the free")
    check(attribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == used - MIB, "used drops with the free")
    err, _ = cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    check(err == INVALID_VALUE, "a freed pool allocation is not memory any more", repr(err))
    fails(cu.cuMemFreeAsync(ptr, stream), INVALID_VALUE, "freeing it twice")
    check(attribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH) >= MIB, "used high-water mark")

    # a threshold keeps freed memory reserved; trimming gives it back
    ok(cu.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(2**64 - 1)),
       "cuMemPoolSetAttribute RELEASE_THRESHOLD")
    check(attribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 2**64 - 1, "release threshold set")
    ptr = ok(cu.cuMemAllocAsync(4 * MIB, stream), "cuMemAllocAsync 4 MiB")
    ok(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync 4 MiB")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    held = attribute(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    check(held >= 4 * MIB, "freed memory stays reserved under the threshold", repr(held))
    ok(cu.cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo 0")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    trimmed = attribute(pool, A.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    check(trimmed < held, "trimming releases reserved memory", f"{held} -> {trimmed}")
    if SIM:
        check(trimmed == 0 and free_memory() == before, "all of it", f"{trimmed}, {before} vs {free_memory()}")
    ok(cu.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH, cu.cuuint64_t(0)), "reset USED_MEM_HIGH")
    check(attribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_HIGH) == attribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
          "the high-water mark starts again from the current use")
    ok(cu.cuMemPoolSetAttribute(pool, A.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, cu.cuuint64_t(0)), "threshold back to 0")
    err, = cu.cuMemPoolDestroy(pool)
    check(err != SUCCESS, "a device's default pool cannot be destroyed", repr(err))


# ---- a pool of the application's own ---------------------------------------------------------------------
@section
def created_pool() -> None:
    default = ok(cu.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool")
    pool = ok(cu.cuMemPoolCreate(pool_props()), "cuMemPoolCreate")
    check(int(pool) not in (0, int(default)), "a new pool", repr(pool))
    ptr = ok(cu.cuMemAllocFromPoolAsync(8192, pool, stream), "cuMemAllocFromPoolAsync")
    data = pattern(8192, 5)
    ok(cu.cuMemcpyHtoDAsync(ptr, data, 8192, stream), "cuMemcpyHtoDAsync")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    check(read(ptr, 8192) == data, "created pool's memory round trip")
    owner = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr), "pointer MEMPOOL_HANDLE")
    check(int(owner) == int(pool), "allocated from the created pool")
    check(attribute(pool, A.CU_MEMPOOL_ATTR_USED_MEM_CURRENT) >= 8192, "the created pool counts it")

    ok(cu.cuDeviceSetMemPool(dev, pool), "cuDeviceSetMemPool")
    current = ok(cu.cuDeviceGetMemPool(dev), "cuDeviceGetMemPool")
    check(int(current) == int(pool), "the created pool is current")
    other = ok(cu.cuMemAllocAsync(4096, stream), "cuMemAllocAsync from the current pool")
    owner = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, other), "pointer MEMPOOL_HANDLE")
    check(int(owner) == int(pool), "cuMemAllocAsync takes the device's current pool")
    ok(cu.cuMemFreeAsync(other, stream), "cuMemFreeAsync")

    ok(cu.cuMemPoolSetAccess(pool, [access()], 1), "cuMemPoolSetAccess")
    flags = ok(cu.cuMemPoolGetAccess(pool, device_location()), "cuMemPoolGetAccess")
    check(flags == RW, "the pool's device has read-write access", repr(flags))
    check(attribute(pool, A.CU_MEMPOOL_ATTR_LOCATION_ID) == 0, "the pool's location is device 0")

    # destroyed with an allocation outstanding: the allocation lives on until freed
    ok(cu.cuMemPoolDestroy(pool), "cuMemPoolDestroy with an allocation outstanding")
    current = ok(cu.cuDeviceGetMemPool(dev), "cuDeviceGetMemPool after the destroy")
    check(int(current) == int(default), "the default pool is current again", f"{current} vs {default}")
    check(read(ptr, 8192) == data, "an outstanding allocation outlives its pool")
    ok(cu.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync after the pool's destroy")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")

    # exportable pools: a file descriptor request is dropped, the rest refused, exports refused
    fd_type = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    fd_pool = ok(cu.cuMemPoolCreate(pool_props(int(fd_type))), "cuMemPoolCreate asking for fd export")
    check(attribute(fd_pool, A.CU_MEMPOOL_ATTR_EXPORT_HANDLE_TYPES) == 0, "made unexportable")
    err, _ = cu.cuMemPoolExportToShareableHandle(fd_pool, fd_type, 0)
    check(err == NOT_SUPPORTED, "cuMemPoolExportToShareableHandle is refused", repr(err))
    ok(cu.cuMemPoolDestroy(fd_pool), "cuMemPoolDestroy")
    fabric = int(cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC)
    fails(cu.cuMemPoolCreate(pool_props(fabric)), NOT_SUPPORTED, "a pool exportable as fabric handles is refused")


def kernel_across_mappings(x: int, y_plain: int) -> None:
    """saxpy reading 128 floats that straddle two mappings (the sim's host saxpy)."""
    module = ok(cu.cuModuleLoadData(PTX), "cuModuleLoadData")
    func = ok(cu.cuModuleGetFunction(module, b"saxpy"), "cuModuleGetFunction")
    xs = struct.pack("<128f", *range(128))
    write(x, xs)
    ok(cu.cuMemsetD32(y_plain, 0, 128), "cuMemsetD32 y")
    args = ((2.0, x, int(y_plain), 128), (ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint))
    ok(cu.cuLaunchKernel(func, 1, 1, 1, 128, 1, 1, 0, 0, args, 0), "cuLaunchKernel saxpy")
    ys = struct.unpack("<128f", read(y_plain, 512))
    check(list(ys) == [2.0 * i for i in range(128)], "a kernel reads across two mappings", repr(ys[:4]))
    ok(cu.cuMemcpyDtoD(x, y_plain, 512), "cuMemcpyDtoD back")
    ok(cu.cuLaunchKernel(func, 1, 1, 1, 128, 1, 1, 0, 0, ((1.0, int(y_plain), x, 128), args[1]), 0), "saxpy into them")
    check(struct.unpack("<128f", read(x, 512)) == tuple(4.0 * i for i in range(128)),
          "a kernel writes across two mappings")
    ok(cu.cuModuleUnload(module), "cuModuleUnload")


# ---- virtual memory management -----------------------------------------------------------------------------
@section
def vmm() -> None:
    prop = allocation_prop()
    minimum = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    gran = ok(cu.cuMemGetAllocationGranularity(prop, minimum), "cuMemGetAllocationGranularity")
    if SIM:
        check(gran == 2 * MIB, "granularity 2 MiB", repr(gran))
    before = free_memory()
    va = int(ok(cu.cuMemAddressReserve(8 * gran, 0, 0, 0), "cuMemAddressReserve 8 granules"))
    first = ok(cu.cuMemCreate(2 * gran, prop, 0), "cuMemCreate 2 granules")
    second = ok(cu.cuMemCreate(gran, prop, 0), "cuMemCreate 1 granule")
    if SIM:
        check(before - free_memory() == 3 * gran, "physical memory counts as used", f"{before - free_memory()}")
    got = ok(cu.cuMemGetAllocationPropertiesFromHandle(first), "cuMemGetAllocationPropertiesFromHandle")
    check(got.type == prop.type and got.location.id == 0, "properties of the handle", f"{got.type} {got.location.id}")

    err, = cu.cuMemcpyHtoD(va, b"x" * 16, 16)
    check(err != SUCCESS, "a reserved address that is not mapped is not memory", repr(err))
    ok(cu.cuMemMap(va, 2 * gran, 0, first, 0), "cuMemMap the first allocation")
    ok(cu.cuMemMap(va + 2 * gran, gran, 0, second, 0), "cuMemMap the second right after it")
    ok(cu.cuMemMap(va + 4 * gran, gran, gran, first, 0), "cuMemMap the first's second granule again (an alias)")
    fails(cu.cuMemMap(va + gran, gran, 0, second, 0), INVALID_VALUE, "mapping over a mapping is refused")
    ok(cu.cuMemSetAccess(va, 3 * gran, [access()], 1), "cuMemSetAccess over two mappings")
    ok(cu.cuMemSetAccess(va + 4 * gran, gran, [access()], 1), "cuMemSetAccess of the alias")
    flags = ok(cu.cuMemGetAccess(device_location(), va + 5), "cuMemGetAccess")
    check(flags == RW, "read-write access", repr(flags))
    check(read(va, 3 * gran) == bytes(3 * gran), "new physical memory reads as zeros")

    data = pattern(gran, 11)  # across the end of the first allocation into the second
    write(va + gran + gran // 2, data)
    check(read(va + gran + gran // 2, gran) == data, "a copy across two mappings round trips")
    check(read(va + 2 * gran, gran // 2) == data[gran // 2 :], "the second allocation holds its half")
    check(read(va + 4 * gran + gran // 2, gran // 2) == data[: gran // 2], "the alias shows the first's bytes")
    write(va + 4 * gran, b"alias" * 100)
    check(read(va + gran, 500) == b"alias" * 100, "a write through the alias shows through the first mapping")
    ok(cu.cuMemsetD32(va + 2 * gran - 64, 0x01020304, 32), "cuMemsetD32 across the mappings' boundary")
    check(read(va + 2 * gran - 64, 128) == b"\x04\x03\x02\x01" * 32, "memset landed on both sides")
    plain = ok(cu.cuMemAlloc(4096), "cuMemAlloc")
    ok(cu.cuMemcpyDtoD(plain, va + 2 * gran - 2048, 4096), "cuMemcpyDtoD from mapped memory")
    ok(cu.cuMemcpyDtoD(va + 4 * gran + 100, plain, 4096), "cuMemcpyDtoD into mapped memory")
    check(read(va + 4 * gran + 100, 4096) == read(va + 2 * gran - 2048, 4096), "device copies through mappings")
    if SIM:
        kernel_across_mappings(va + 2 * gran - 256, plain)
    ok(cu.cuMemFree(plain), "cuMemFree")

    kind = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 2 * gran + 8), "pointer MEMORY_TYPE")
    check(kind == cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, "mapped memory is device memory", repr(kind))
    base, size = ok(cu.cuMemGetAddressRange(va + 2 * gran + 8), "cuMemGetAddressRange of mapped memory")
    check(int(base) == va + 2 * gran and size == gran, "the mapping's range", f"{base} {size}")
    for where in (va + 3 * gran, va + 3 * gran - 8):  # unmapped, and a copy running off the mapped end
        err, = cu.cuMemcpyHtoD(where, b"y" * 16, 16)
        check(err == INVALID_VALUE, f"copy into unmapped addresses at +{where - va:#x} is refused", repr(err))
    ok(cu.cuMemsetD8(va + 3 * gran, 1, 16), "cuMemsetD8 of unmapped addresses (queued)")
    err, = cu.cuCtxSynchronize()
    check(err == INVALID_VALUE, "the queued memset of unmapped addresses fails", repr(err))
    fails(cu.cuMemFree(va), INVALID_VALUE, "cuMemFree of mapped memory is refused")

    retained = ok(cu.cuMemRetainAllocationHandle(va + 4 * gran + 10), "cuMemRetainAllocationHandle")
    check(int(retained) == int(first), "the handle mapped there", f"{retained} vs {first}")
    ok(cu.cuMemRelease(retained), "cuMemRelease the retained handle")
    ok(cu.cuMemUnmap(va, 3 * gran), "cuMemUnmap two whole mappings")
    err, _ = cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va)
    check(err == INVALID_VALUE, "unmapped memory is not memory any more", repr(err))
    fails(cu.cuMemcpyHtoD(va, b"z" * 16, 16), INVALID_VALUE, "copy into what was unmapped")
    ok(cu.cuMemRelease(first), "cuMemRelease while the alias is mapped")
    ok(cu.cuMemRelease(second), "cuMemRelease")
    fails(cu.cuMemRelease(second), INVALID_VALUE, "releasing a handle twice")
    check(read(va + 4 * gran, 100) == b"alias" * 20, "a released allocation lives while it is mapped")
    if SIM:
        check(before - free_memory() == 2 * gran, "the unmapped, released one is given back")
    fails(cu.cuMemAddressFree(va, 8 * gran), INVALID_VALUE, "freeing a range that still has a mapping")
    ok(cu.cuMemUnmap(va + 4 * gran, gran), "cuMemUnmap the alias")
    ok(cu.cuMemAddressFree(va, 8 * gran), "cuMemAddressFree")
    if SIM:
        check(free_memory() == before, "everything given back", f"{before} vs {free_memory()}")


# ---- what xpuremote refuses, and what it makes instead -------------------------------------------------------
@section
def refusals() -> None:
    fd_type = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    handle = ok(cu.cuMemCreate(2 * MIB, allocation_prop(int(fd_type)), 0), "cuMemCreate asking for fd export")
    got = ok(cu.cuMemGetAllocationPropertiesFromHandle(handle), "its properties")
    check(int(got.requestedHandleTypes) == 0, "made unexportable", repr(got.requestedHandleTypes))
    err, _ = cu.cuMemExportToShareableHandle(handle, fd_type, 0)
    check(err == NOT_SUPPORTED, "cuMemExportToShareableHandle is refused", repr(err))
    ok(cu.cuMemRelease(handle), "cuMemRelease")
    fabric = int(cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_FABRIC)
    fails(cu.cuMemCreate(2 * MIB, allocation_prop(fabric), 0), NOT_SUPPORTED, "fabric-exportable memory is refused")
    prop = allocation_prop()
    prop.win32HandleMetaData = 0x1000
    fails(cu.cuMemCreate(2 * MIB, prop, 0), INVALID_VALUE, "a host pointer in the properties is refused")
    va = ok(cu.cuMemAddressReserve(2 * MIB, 0, 0, 0), "the session goes on")
    ok(cu.cuMemAddressFree(va, 2 * MIB), "cuMemAddressFree")


ok(cu.cuStreamDestroy(stream), "cuStreamDestroy")
finish()
