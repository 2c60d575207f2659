"""cuda-python's `cuda.bindings.driver` on xpuremote's libcuda.so.1 (run under the shim).

Checks and sections as tests/programs/checks.py says.
"""

from __future__ import annotations

import ctypes
import os

from checks import SUCCESS, XPUREMOTE, check, finish, ok, section
from cuda.bindings import driver as cu

# Some answers are xpuremote's own. It refuses stale and made-up handles, where NVIDIA's driver may
# crash (it dereferences a bogus CUstream); its pinned memory is not mapped into the device, where
# the driver's is (UVA: CU_MEMHOSTALLOC_DEVICEMAP always set); it forwards no graphics interop.
DEVICEMAP = 0 if XPUREMOTE else cu.CU_MEMHOSTALLOC_DEVICEMAP


def addr(buf: ctypes.Array) -> int:
    return ctypes.addressof(buf)


def pattern(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


# ---- initialisation, versions, devices ---------------------------------------------------------
ok(cu.cuInit(0), "cuInit")
version = ok(cu.cuDriverGetVersion(), "cuDriverGetVersion")
check(isinstance(version, int) and version >= 12000, "driver version", f"{version!r}")
count = ok(cu.cuDeviceGetCount(), "cuDeviceGetCount")
check(count >= 1, "device count >= 1", f"{count!r}")
dev = ok(cu.cuDeviceGet(0), "cuDeviceGet")
err, _ = cu.cuDeviceGet(count)
check(err == cu.CUresult.CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet(count) is INVALID_DEVICE", repr(err))
name = ok(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
name = name.split(b"\0", 1)[0].decode()
# the sim's name, or NVIDIA's for a GPU (the tests' XPU_TEST_BACKEND reaches this program)
own_name = "NVIDIA" if os.environ.get("XPU_TEST_BACKEND") == "cuda" else "sim device"
check(own_name in name, "device name", repr(name))
short = ok(cu.cuDeviceGetName(5, dev), "cuDeviceGetName short buffer")
check(short[:5] == name[:4].encode() + b"\0", "name truncated with a NUL", repr(short))
uuid = ok(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid")
check(len(uuid.bytes) == 16 and any(uuid.bytes), "uuid is 16 bytes", repr(uuid.bytes))
total = ok(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
check(total >= 2**30, "total memory", repr(total))
A = cu.CUdevice_attribute
attrs = {
    A.CU_DEVICE_ATTRIBUTE_WARP_SIZE: 32,
    A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024,
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: None,
    A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: None,
    A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: None,
    A.CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: 1,
    A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: None,
}
values = {}
for attr, expected in attrs.items():
    values[attr] = ok(cu.cuDeviceGetAttribute(attr, dev), f"cuDeviceGetAttribute({attr.name})")
    if expected is not None:
        check(values[attr] == expected, f"{attr.name} == {expected}", repr(values[attr]))
check(values[A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR] >= 5, "compute capability major",
      repr(values[A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR]))
check(values[A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT] > 0, "SM count > 0")
pci = ok(cu.cuDeviceGetPCIBusId(64, dev), "cuDeviceGetPCIBusId")
pci = pci.split(b"\0", 1)[0].decode()
bus = values[A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID]
check(len(pci.split(":")) == 3 and int(pci.split(":")[1], 16) == bus, "PCI bus id matches attribute",
      f"{pci!r} vs bus {bus}")
check(len(pci.split(":")[0]) == 4, "PCI domain of 4 digits, as the driver writes it", repr(pci))
for form in (pci, pci.split(":", 1)[1]):  # documented: [domain]:[bus]:[device].[function], or without the domain
    found = ok(cu.cuDeviceGetByPCIBusId(form.encode()), f"cuDeviceGetByPCIBusId {form}")
    check(int(found) == int(dev), f"device at {form}", repr(found))
err, _ = cu.cuDeviceGetByPCIBusId(b"0000:fe:1f.0")
check(err == cu.CUresult.CUDA_ERROR_INVALID_DEVICE, "no device at an unused PCI address", repr(err))
err, _ = cu.cuDeviceGetAttribute(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE, count)
check(err == cu.CUresult.CUDA_ERROR_INVALID_DEVICE, "attribute of a missing device", repr(err))


# ---- primary context -----------------------------------------------------------------------------
@section
def primary_context() -> None:
    flags, active = ok(cu.cuDevicePrimaryCtxGetState(dev), "cuDevicePrimaryCtxGetState")
    check(active == 0, "primary context inactive at first", repr(active))
    pctx = ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(int(pctx) != 0, "primary context handle")
    again = ok(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain again")
    check(int(again) == int(pctx), "the same primary context", f"{again} vs {pctx}")
    _, active = ok(cu.cuDevicePrimaryCtxGetState(dev), "cuDevicePrimaryCtxGetState retained")
    check(active == 1, "primary context active once retained", repr(active))
    ok(cu.cuCtxSetCurrent(pctx), "cuCtxSetCurrent(primary)")
    ptr = ok(cu.cuMemAlloc(4096), "cuMemAlloc in the primary context")
    ok(cu.cuMemsetD8(ptr, 0x5A, 4096), "cuMemsetD8 in the primary context")
    host = ctypes.create_string_buffer(4096)
    ok(cu.cuMemcpyDtoH(addr(host), ptr, 4096), "cuMemcpyDtoH in the primary context")
    check(host.raw == b"\x5a" * 4096, "primary-context memory round trip")
    ok(cu.cuMemFree(ptr), "cuMemFree in the primary context")
    ok(cu.cuCtxSetCurrent(None), "cuCtxSetCurrent(NULL)")
    cur = ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent after unset")
    check(int(cur) == 0, "no current context", repr(cur))
    ok(cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease")
    ok(cu.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease again")
    _, active = ok(cu.cuDevicePrimaryCtxGetState(dev), "cuDevicePrimaryCtxGetState released")
    check(active == 0, "primary context inactive once released", repr(active))
    err, = cu.cuDevicePrimaryCtxRelease(dev)
    check(err != SUCCESS, "releasing an unretained primary context fails", repr(err))


# ---- contexts ----------------------------------------------------------------------------------
ctx = ok(cu.cuCtxCreate(None, 0, dev), "cuCtxCreate")
check(int(ctx) != 0, "context handle")


@section
def contexts() -> None:
    cur = ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    check(int(cur) == int(ctx), "cuCtxCreate makes the context current", f"{cur} vs {ctx}")
    popped = ok(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
    check(int(popped) == int(ctx), "popped the created context")
    cur = ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent after pop")
    check(int(cur) == 0, "stack empty after pop", repr(cur))
    err, _ = cu.cuCtxGetDevice()
    check(err == cu.CUresult.CUDA_ERROR_INVALID_CONTEXT, "cuCtxGetDevice without a context", repr(err))
    ok(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
    other = ok(cu.cuCtxCreate(None, 0, dev), "cuCtxCreate a second context")
    cur = ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent with two pushed")
    check(int(cur) == int(other), "the newest context is current")
    ok(cu.cuCtxDestroy(other), "cuCtxDestroy the second context")
    cur = ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent after destroying the top")
    check(int(cur) == int(ctx), "destroying the top context pops it", f"{cur} vs {ctx}")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    d = ok(cu.cuCtxGetDevice(), "cuCtxGetDevice")
    check(int(d) == int(dev), "context device", repr(d))
    api = ok(cu.cuCtxGetApiVersion(ctx), "cuCtxGetApiVersion")
    check(api >= 3020, "context API version", repr(api))
    least, greatest = ok(cu.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
    check(greatest <= least, "priority range (greatest is numerically lowest)", f"{least}, {greatest}")


# ---- device memory --------------------------------------------------------------------------------
N = 1 << 20  # over the wire's inline limit: bulk frames both ways


@section
def memory() -> None:
    free0, total0 = ok(cu.cuMemGetInfo(), "cuMemGetInfo")
    check(0 < free0 <= total0, "free <= total", f"{free0}, {total0}")
    a = ok(cu.cuMemAlloc(N), "cuMemAlloc")
    b = ok(cu.cuMemAlloc(N), "cuMemAlloc second")
    free1, _ = ok(cu.cuMemGetInfo(), "cuMemGetInfo after alloc")
    check(free1 <= free0 - 2 * N, "allocations use device memory", f"{free0} -> {free1}")
    base, size = ok(cu.cuMemGetAddressRange(int(a) + 1000), "cuMemGetAddressRange")
    check(int(base) == int(a) and size == N, "address range of an inner pointer", f"{base}, {size}")
    err, *_ = cu.cuMemGetAddressRange(1234)
    check(err != SUCCESS, "address range of a stray pointer fails", repr(err))

    data = pattern(N)
    ok(cu.cuMemcpyHtoD(a, data, N), "cuMemcpyHtoD (bytes)")
    ok(cu.cuMemcpyDtoD(b, a, N), "cuMemcpyDtoD")
    out = ctypes.create_string_buffer(N)
    ok(cu.cuMemcpyDtoH(addr(out), b, N), "cuMemcpyDtoH")
    check(out.raw == data, "HtoD -> DtoD -> DtoH byte for byte")
    small = ctypes.create_string_buffer(100)
    ok(cu.cuMemcpyDtoH(addr(small), int(a) + 4000, 100), "cuMemcpyDtoH at an offset")
    check(small.raw == data[4000:4100], "DtoH at an offset")
    src = ctypes.create_string_buffer(pattern(300, 3), 300)
    ok(cu.cuMemcpyHtoD(int(a) + 17, addr(src), 300), "cuMemcpyHtoD at an offset (address)")
    ok(cu.cuMemcpyDtoH(addr(out), a, N), "cuMemcpyDtoH whole")
    check(out.raw == data[:17] + pattern(300, 3) + data[317:], "HtoD at an offset leaves the rest")

    non_blocking = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
    stream = ok(cu.cuStreamCreate(non_blocking), "cuStreamCreate for async copies")
    data2 = pattern(N, 99)
    src2 = ctypes.create_string_buffer(data2, N)
    ok(cu.cuMemcpyHtoDAsync(a, addr(src2), N, stream), "cuMemcpyHtoDAsync")
    ok(cu.cuMemcpyDtoDAsync(b, a, N, stream), "cuMemcpyDtoDAsync")
    out2 = ctypes.create_string_buffer(N)
    ok(cu.cuMemcpyDtoHAsync(addr(out2), b, N, stream), "cuMemcpyDtoHAsync")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize after async copies")
    check(out2.raw == data2, "async HtoD -> DtoD -> DtoH byte for byte")
    ok(cu.cuMemcpyHtoDAsync(a, addr(src), 300, 0), "cuMemcpyHtoDAsync on the NULL stream")
    ok(cu.cuMemcpyDtoH(addr(small), a, 100), "cuMemcpyDtoH after a NULL-stream async copy")
    check(small.raw == pattern(300, 3)[:100], "NULL-stream async copy ordered before a sync copy")

    # memsets, checked byte for byte against what CUDA documents
    def read(ptr: int, n: int) -> bytes:
        buf = ctypes.create_string_buffer(n)
        ok(cu.cuMemcpyDtoH(addr(buf), ptr, n), "cuMemcpyDtoH (memset check)")
        return buf.raw

    ok(cu.cuMemsetD8(a, 0, N), "cuMemsetD8 clear")
    ok(cu.cuMemsetD8(int(a) + 3, 0xAB, 10), "cuMemsetD8")
    check(read(a, 16) == b"\0" * 3 + b"\xab" * 10 + b"\0" * 3, "cuMemsetD8 bytes")
    ok(cu.cuMemsetD16(a, 0x1234, 5), "cuMemsetD16")
    check(read(a, 12) == b"\x34\x12" * 5 + b"\xab\xab", "cuMemsetD16 bytes (little endian)")
    ok(cu.cuMemsetD32(a, 0xDEADBEEF, 3), "cuMemsetD32")
    check(read(a, 16) == b"\xef\xbe\xad\xde" * 3 + b"\xab" + b"\0" * 3, "cuMemsetD32 bytes")
    ok(cu.cuMemsetD8Async(a, 0x11, 8, stream), "cuMemsetD8Async")
    ok(cu.cuMemsetD16Async(int(a) + 8, 0x2233, 4, stream), "cuMemsetD16Async")
    ok(cu.cuMemsetD32Async(int(a) + 16, 0x44556677, 2, stream), "cuMemsetD32Async")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize after async memsets")
    check(read(a, 24) == b"\x11" * 8 + b"\x33\x22" * 4 + b"\x77\x66\x55\x44" * 2, "async memset bytes")

    # 2D memsets on a pitched allocation: only `width` elements of each row change
    width, height = 100, 6
    p, pitch = ok(cu.cuMemAllocPitch(width * 4, height, 4), "cuMemAllocPitch")
    check(pitch >= width * 4, "pitch >= row bytes", f"{pitch}")
    base, size = ok(cu.cuMemGetAddressRange(p), "cuMemGetAddressRange of a pitched allocation")
    check(size >= pitch * height, "pitched allocation covers pitch*height", f"{size} vs {pitch * height}")
    ok(cu.cuMemsetD8(p, 0, pitch * height), "clear pitched")

    def rows(elem: bytes, w: int, h: int, fill: bytes = b"\0") -> bytes:
        row = elem * w
        return b"".join(row + fill * (pitch - len(row)) for _ in range(h))

    ok(cu.cuMemsetD2D8(p, pitch, 0x7E, width, height - 1), "cuMemsetD2D8")
    got = read(p, pitch * height)
    check(got == rows(b"\x7e", width, height - 1) + b"\0" * pitch, "cuMemsetD2D8 bytes")
    ok(cu.cuMemsetD2D16(p, pitch, 0xBEEF, width, height), "cuMemsetD2D16")
    check(read(p, pitch * height) == rows(b"\xef\xbe", width, height), "cuMemsetD2D16 bytes")
    ok(cu.cuMemsetD2D32(p, pitch, 0x01020304, width, height), "cuMemsetD2D32")
    check(read(p, pitch * height) == rows(b"\x04\x03\x02\x01", width, height), "cuMemsetD2D32 bytes")
    ok(cu.cuMemsetD8(p, 0, pitch * height), "clear pitched again")
    ok(cu.cuMemsetD2D8Async(p, pitch, 0x01, 7, 2, stream), "cuMemsetD2D8Async")
    ok(cu.cuMemsetD2D16Async(int(p) + 2 * pitch, pitch, 0x0203, 5, 2, stream), "cuMemsetD2D16Async")
    ok(cu.cuMemsetD2D32Async(int(p) + 4 * pitch, pitch, 0x04050607, 3, 2, stream), "cuMemsetD2D32Async")
    ok(cu.cuStreamSynchronize(stream), "cuStreamSynchronize after async 2D memsets")
    want = (rows(b"\x01", 7, 2) + rows(b"\x03\x02", 5, 2) + rows(b"\x07\x06\x05\x04", 3, 2))
    check(read(p, pitch * height) == want, "async 2D memset bytes")

    ok(cu.cuStreamDestroy(stream), "cuStreamDestroy (memory section)")
    for ptr in (a, b, p):
        ok(cu.cuMemFree(ptr), "cuMemFree")
    free2, _ = ok(cu.cuMemGetInfo(), "cuMemGetInfo after free")
    # NVIDIA's driver may keep a 2 MiB page of its own meanwhile (seen with per-thread streams)
    slack = 2 << 20 if os.environ.get("XPU_TEST_BACKEND") == "cuda" else 0
    check(free0 - slack <= free2 <= free0, "freeing gives the memory back", f"{free0} -> {free2}")
    err, = cu.cuMemFree(a)
    check(err != SUCCESS, "double free fails", repr(err))
    err, _ = cu.cuMemAlloc(0)
    check(err == cu.CUresult.CUDA_ERROR_INVALID_VALUE, "cuMemAlloc(0) is INVALID_VALUE", repr(err))
    err, _ = cu.cuMemAlloc(1 << 50)
    check(err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc(1 PiB) is OUT_OF_MEMORY", repr(err))


# ---- host memory and pointer attributes ------------------------------------------------------------
@section
def host_memory() -> None:
    P = cu.CUpointer_attribute
    flags = cu.CU_MEMHOSTALLOC_PORTABLE
    h = ok(cu.cuMemHostAlloc(8192, flags), "cuMemHostAlloc")
    check(int(h) != 0 and int(h) % 4096 == 0, "pinned memory is page aligned", hex(int(h)))
    got = ok(cu.cuMemHostGetFlags(h), "cuMemHostGetFlags")
    check(got == flags | DEVICEMAP, "host alloc flags", f"{got} vs {flags}")
    ctypes.memmove(int(h), pattern(8192, 5), 8192)  # it is ordinary, writable host memory
    d = ok(cu.cuMemAlloc(8192), "cuMemAlloc (host section)")
    ok(cu.cuMemcpyHtoD(d, h, 8192), "cuMemcpyHtoD from pinned memory")
    back = ctypes.create_string_buffer(8192)
    ok(cu.cuMemcpyDtoH(addr(back), d, 8192), "cuMemcpyDtoH to pageable memory")
    check(back.raw == pattern(8192, 5), "pinned -> device -> pageable")

    mtype = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d), "cuPointerGetAttribute type")
    check(mtype == cu.CUmemorytype.CU_MEMORYTYPE_DEVICE, "device memory type", repr(mtype))
    mtype = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, h), "cuPointerGetAttribute host")
    check(mtype == cu.CUmemorytype.CU_MEMORYTYPE_HOST, "host memory type", repr(mtype))
    pctx = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_CONTEXT, d), "cuPointerGetAttribute context")
    check(int(pctx) == int(ctx), "pointer context", f"{pctx} vs {ctx}")
    ordinal = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, int(d) + 5),
                 "cuPointerGetAttribute ordinal")
    check(ordinal == int(dev), "pointer device ordinal", repr(ordinal))
    start = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, int(d) + 100),
               "cuPointerGetAttribute range start")
    check(int(start) == int(d), "range start of an inner pointer", f"{start} vs {d}")
    size = ok(cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_RANGE_SIZE, d), "cuPointerGetAttribute size")
    check(size == 8192, "range size", repr(size))
    err, _ = cu.cuPointerGetAttribute(P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 16)
    check(err == cu.CUresult.CUDA_ERROR_INVALID_VALUE, "attribute of unknown memory", repr(err))
    wanted = [P.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, P.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
              P.CU_POINTER_ATTRIBUTE_RANGE_SIZE, P.CU_POINTER_ATTRIBUTE_BUFFER_ID]
    many = ok(cu.cuPointerGetAttributes(len(wanted), wanted, d), "cuPointerGetAttributes")
    check(many[0] == cu.CUmemorytype.CU_MEMORYTYPE_DEVICE and many[1] == int(dev) and many[2] == 8192,
          "cuPointerGetAttributes values", repr(many))
    check(int(many[3]) != 0, "buffer id set", repr(many[3]))

    buf = ctypes.create_string_buffer(3 * 4096)
    base = (addr(buf) + 4095) // 4096 * 4096
    ok(cu.cuMemHostRegister(base, 4096, cu.CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister")
    err, = cu.cuMemHostUnregister(base + 64)
    check(err == cu.CUresult.CUDA_ERROR_INVALID_VALUE, "unregistering from inside the range", repr(err))
    got = ok(cu.cuMemHostGetFlags(base), "cuMemHostGetFlags registered")
    check(got == cu.CU_MEMHOSTREGISTER_PORTABLE | DEVICEMAP, "registered flags", repr(got))
    err, = cu.cuMemHostRegister(base, 4096, 0)
    check(err == cu.CUresult.CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "registering twice", repr(err))
    ok(cu.cuMemHostUnregister(base), "cuMemHostUnregister")
    err, = cu.cuMemHostUnregister(base)
    check(err == cu.CUresult.CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "unregistering twice", repr(err))
    err, _ = cu.cuMemHostGetFlags(base)
    check(err != SUCCESS, "flags of unregistered memory", repr(err))
    ok(cu.cuMemFreeHost(h), "cuMemFreeHost")
    err, = cu.cuMemFreeHost(h)
    check(err != SUCCESS, "cuMemFreeHost twice fails", repr(err))
    ok(cu.cuMemFree(d), "cuMemFree (host section)")


# ---- streams, host functions, events ----------------------------------------------------------------
@section
def streams_and_events() -> None:
    s1 = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    least, greatest = ok(cu.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange (streams)")
    s2 = ok(cu.cuStreamCreateWithPriority(0, greatest), "cuStreamCreateWithPriority")
    flags = ok(cu.cuStreamGetFlags(s1), "cuStreamGetFlags")
    check(flags == cu.CUstream_flags.CU_STREAM_NON_BLOCKING, "stream flags", repr(flags))
    check(ok(cu.cuStreamGetFlags(s2), "cuStreamGetFlags (priority)") == 0, "default flags")
    prio = ok(cu.cuStreamGetPriority(s2), "cuStreamGetPriority")
    check(prio == greatest, "stream priority", f"{prio} vs {greatest}")
    check(ok(cu.cuStreamGetPriority(s1), "cuStreamGetPriority default") == 0, "default priority")
    sctx = ok(cu.cuStreamGetCtx(s1), "cuStreamGetCtx")
    check(int(sctx) == int(ctx), "stream context", f"{sctx} vs {ctx}")
    ok(cu.cuStreamQuery(s1), "cuStreamQuery")
    ok(cu.cuStreamSynchronize(s1), "cuStreamSynchronize")
    if XPUREMOTE:
        err, _ = cu.cuStreamGetFlags(cu.CUstream(0x1234560))
        check(err == cu.CUresult.CUDA_ERROR_INVALID_HANDLE, "flags of a bogus stream", repr(err))

    e_flags = cu.CUevent_flags.CU_EVENT_DEFAULT
    start = ok(cu.cuEventCreate(e_flags), "cuEventCreate")
    stop = ok(cu.cuEventCreate(e_flags), "cuEventCreate second")
    untimed = ok(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate untimed")
    ok(cu.cuEventRecord(start, s1), "cuEventRecord")
    d = ok(cu.cuMemAlloc(1 << 16), "cuMemAlloc (streams)")
    ok(cu.cuMemsetD32Async(d, 7, 1 << 14, s1), "cuMemsetD32Async (streams)")
    ok(cu.cuEventRecord(stop, s1), "cuEventRecord second")
    ok(cu.cuEventRecord(untimed, s1), "cuEventRecord untimed")
    ok(cu.cuStreamWaitEvent(s2, stop, 0), "cuStreamWaitEvent")
    ok(cu.cuEventSynchronize(stop), "cuEventSynchronize")
    ok(cu.cuEventQuery(stop), "cuEventQuery")
    ms = ok(cu.cuEventElapsedTime(start, stop), "cuEventElapsedTime")
    check(isinstance(ms, float) and 0.0 <= ms < 60_000.0, "elapsed time in ms", repr(ms))
    err, _ = cu.cuEventElapsedTime(start, untimed)
    check(err == cu.CUresult.CUDA_ERROR_INVALID_HANDLE, "elapsed time with an untimed event", repr(err))

    # a host function: a Python callable behind a C function pointer (cuda-python takes its address)
    calls: list[int] = []
    host_fn_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    callback = host_fn_type(lambda user: calls.append(user or 0))
    fn = cu.CUhostFn(ctypes.cast(callback, ctypes.c_void_p).value)
    out = ctypes.create_string_buffer(4)
    ok(cu.cuMemsetD32Async(d, 0x0BADF00D, 1, s2), "cuMemsetD32Async before the host function")
    ok(cu.cuLaunchHostFunc(s2, fn, 0x1234), "cuLaunchHostFunc")
    ok(cu.cuStreamSynchronize(s2), "cuStreamSynchronize after the host function")
    check(calls == [0x1234], "host function ran once with its user data", repr(calls))
    ok(cu.cuMemcpyDtoH(addr(out), d, 4), "cuMemcpyDtoH after the host function")
    check(out.raw == (0x0BADF00D).to_bytes(4, "little"), "work before the host function done")

    for e in (start, stop, untimed):
        ok(cu.cuEventDestroy(e), "cuEventDestroy")
    if XPUREMOTE:
        err, = cu.cuEventDestroy(start)
        check(err == cu.CUresult.CUDA_ERROR_INVALID_HANDLE, "destroying an event twice", repr(err))
    ok(cu.cuMemFree(d), "cuMemFree (streams)")
    ok(cu.cuStreamDestroy(s1), "cuStreamDestroy")
    ok(cu.cuStreamDestroy(s2), "cuStreamDestroy second")
    if XPUREMOTE:
        err, = cu.cuStreamQuery(s1)
        check(err == cu.CUresult.CUDA_ERROR_INVALID_HANDLE, "query of a destroyed stream", repr(err))


# ---- errors ---------------------------------------------------------------------------------------
@section
def error_strings() -> None:
    for code, name in [(cu.CUresult.CUDA_SUCCESS, "CUDA_SUCCESS"),
                       (cu.CUresult.CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"),
                       (cu.CUresult.CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED")]:
        got = ok(cu.cuGetErrorName(code), f"cuGetErrorName({name})")
        check(got == name.encode(), f"name of {name}", repr(got))
        text = ok(cu.cuGetErrorString(code), f"cuGetErrorString({name})")
        check(isinstance(text, bytes) and len(text) > 5, f"string of {name}", repr(text))
    # the driver's own short texts (as NVIDIA's 580 driver answered them on an H100)
    for code, want in ((cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, b"out of memory"),
                       (cu.CUresult.CUDA_ERROR_INVALID_VALUE, b"invalid argument"),
                       (cu.CUresult.CUDA_SUCCESS, b"no error")):
        text = ok(cu.cuGetErrorString(code), f"cuGetErrorString({code!r})")
        check(text == want, f"the driver's text for {code!r}", repr(text))


@section
def coredump_settings() -> None:
    """Kept and read back, globally and per context; making a dump is refused under xpuremote (it would be
    written on the server's machine)."""
    dump = cu.CUcoredumpSettings
    default_file = ok(cu.cuCoredumpGetAttributeGlobal(dump.CU_COREDUMP_FILE), "cuCoredumpGetAttributeGlobal FILE")
    check(default_file == b"", "the file reads as empty until set, as the driver answers", repr(default_file))
    check(ok(cu.cuCoredumpGetAttributeGlobal(dump.CU_COREDUMP_TRIGGER_HOST), "TRIGGER_HOST") is True,
          "TRIGGER_HOST is true by default")
    for attrib, value in ((dump.CU_COREDUMP_TRIGGER_HOST, False), (dump.CU_COREDUMP_FILE, b"corefile"),
                          (dump.CU_COREDUMP_PIPE, b"corepipe"), (dump.CU_COREDUMP_LIGHTWEIGHT, True),
                          (dump.CU_COREDUMP_GENERATION_FLAGS, 6)):
        try:
            set_global = cu.cuCoredumpSetAttributeGlobal(attrib, value)
        except TypeError as exc:  # an older cuda-bindings cannot pass this attribute: no driver call was made
            print(f"skip {attrib!r}: {exc}")
            continue
        ok(set_global, f"cuCoredumpSetAttributeGlobal {attrib!r}")
        got = ok(cu.cuCoredumpGetAttributeGlobal(attrib), f"cuCoredumpGetAttributeGlobal {attrib!r}")
        check(got == value, f"{attrib!r} reads back as set", f"{got!r}")
    ok(cu.cuCoredumpSetAttribute(dump.CU_COREDUMP_FILE, b"context.core"), "cuCoredumpSetAttribute FILE")
    check(ok(cu.cuCoredumpGetAttribute(dump.CU_COREDUMP_FILE), "cuCoredumpGetAttribute") == b"context.core",
          "the context's own file")
    check(ok(cu.cuCoredumpGetAttributeGlobal(dump.CU_COREDUMP_FILE), "global FILE") == b"corefile",
          "the process's file is unchanged")
    if XPUREMOTE:
        (err,) = cu.cuCoredumpSetAttributeGlobal(dump.CU_COREDUMP_ENABLE_ON_EXCEPTION, True)
        check(err == cu.CUresult.CUDA_ERROR_NOT_SUPPORTED, "enabling GPU coredumps is refused", repr(err))


@section
def unsupported() -> None:
    if not XPUREMOTE:
        return
    (err,) = cu.cuGraphicsUnregisterResource(cu.CUgraphicsResource(0))  # graphics interop: never forwarded
    check(err == cu.CUresult.CUDA_ERROR_NOT_SUPPORTED and int(err) == 801,
          "cuGraphicsUnregisterResource is NOT_SUPPORTED", repr(err))
    (err,) = cu.cuGraphicsUnregisterResource(cu.CUgraphicsResource(0))  # said once in the log, answered every time
    check(err == cu.CUresult.CUDA_ERROR_NOT_SUPPORTED, "cuGraphicsUnregisterResource again", repr(err))


@section
def resolution() -> None:
    """cuda-python binds through cuGetProcAddress: the variants it got must be the shim's own symbols,
    per-thread ones when CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1."""
    try:
        from cuda.bindings._internal import driver as internal

        pointers = internal._inspect_function_pointers()
    except (ImportError, AttributeError):
        print("skip resolution: this cuda-python cannot list its function pointers")
        return
    shim = ctypes.CDLL("libcuda.so.1")
    ptsz = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
    suffix = "_ptsz" if ptsz else ""
    for name, symbol in [("cuMemcpyHtoDAsync_v2", f"cuMemcpyHtoDAsync_v2{suffix}"),
                         ("cuMemsetD8_v2", "cuMemsetD8_v2_ptds" if ptsz else "cuMemsetD8_v2"),
                         ("cuMemAlloc_v2", "cuMemAlloc_v2"), ("cuCtxGetDevice_v2", "cuCtxGetDevice_v2"),
                         ("cuLaunchHostFunc", f"cuLaunchHostFunc{suffix}")]:
        want = ctypes.cast(getattr(shim, symbol), ctypes.c_void_p).value
        got = pointers.get(f"__{name}")
        check(got == want, f"cuda-python's {name} is the shim's {symbol}", f"{got!r} vs {want:#x}")


ok(cu.cuCtxDestroy(ctx), "cuCtxDestroy")
cur = ok(cu.cuCtxGetCurrent(), "cuCtxGetCurrent after destroy")
check(int(cur) == 0, "no context after destroying the last", repr(cur))
err, _ = cu.cuMemAlloc(16)
check(err == cu.CUresult.CUDA_ERROR_INVALID_CONTEXT, "cuMemAlloc without a context", repr(err))

finish()
