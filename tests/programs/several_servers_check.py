"""The driver API across the devices of several servers, named by one XPU_SERVER list (run under the shim).

Device 0 is the first server's, the last device the last server's. Checks copies between them (synchronous,
on streams, unified), a stream of one waiting for an event of the other, calls that name another server's
stream, event or memory while a context of the first is current, peer access, and NVML's device list.
Prints one JSON line of what it saw; exits non-zero at the first call that fails."""

from __future__ import annotations

import ctypes
import json

cu = ctypes.CDLL("libcuda.so.1")
SIZE = 3 << 20  # more than one message carries: copies take the data connection
PATTERN = bytes(range(256)) * (SIZE // 256)


def ck(rc: int, what: str) -> None:
    if rc:
        raise SystemExit(f"{what} failed: CUresult {rc}")


def ptr(value: int) -> ctypes.c_uint64:
    return ctypes.c_uint64(value)


def main() -> None:
    seen: dict = {}
    ck(cu.cuInit(0), "cuInit")
    n = ctypes.c_int()
    ck(cu.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    last = n.value - 1
    seen["count"] = n.value
    uuids = []
    for i in range(n.value):
        uuid = ctypes.create_string_buffer(16)
        ck(cu.cuDeviceGetUuid(uuid, i), "cuDeviceGetUuid")
        uuids.append(uuid.raw.hex())
    seen["uuids"] = uuids
    ctxs = []
    for i in range(n.value):
        c = ctypes.c_void_p()
        ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), i), "cuDevicePrimaryCtxRetain")
        ctxs.append(c)

    def on(i: int) -> None:
        ck(cu.cuCtxSetCurrent(ctxs[i]), "cuCtxSetCurrent")

    def alloc(i: int) -> int:
        on(i)
        p = ctypes.c_uint64()
        ck(cu.cuMemAlloc_v2(ctypes.byref(p), SIZE), f"cuMemAlloc on device {i}")
        return p.value

    a, b = alloc(0), alloc(last)
    out = ctypes.create_string_buffer(SIZE)
    on(0)
    ck(cu.cuMemcpyHtoD_v2(ptr(a), PATTERN, SIZE), "cuMemcpyHtoD")
    on(last)
    ck(cu.cuMemcpyDtoD_v2(ptr(b), ptr(a), SIZE), "cuMemcpyDtoD between servers")
    ck(cu.cuMemcpyDtoH_v2(out, ptr(b), SIZE), "cuMemcpyDtoH")
    seen["dtod"] = out.raw == PATTERN
    on(0)  # memory of the other server, named while a context of the first is current
    piece = ctypes.create_string_buffer(64)
    ck(cu.cuMemcpyDtoH_v2(piece, ptr(b + 64), 64), "cuMemcpyDtoH of the other server's memory")
    seen["by_address"] = piece.raw == PATTERN[64:128]

    stream0 = ctypes.c_void_p()
    ck(cu.cuStreamCreate(ctypes.byref(stream0), 1), "cuStreamCreate")
    ck(cu.cuMemsetD8Async(ptr(a + SIZE - 16), 9, 16, stream0), "cuMemsetD8Async")  # the lane's, where it is open
    on(last)
    stream1, event = ctypes.c_void_p(), ctypes.c_void_p()
    ck(cu.cuStreamCreate(ctypes.byref(stream1), 1), "cuStreamCreate")
    ck(cu.cuEventCreate(ctypes.byref(event), 0), "cuEventCreate")
    ck(cu.cuMemsetD8Async(ptr(b), 7, 4096, stream1), "cuMemsetD8Async")
    ck(cu.cuEventRecord(event, stream1), "cuEventRecord")
    on(0)
    ck(cu.cuStreamWaitEvent(stream0, event, 0), "cuStreamWaitEvent for the other server's event")
    ck(cu.cuMemcpyDtoDAsync_v2(ptr(a), ptr(b), 8192, stream0), "cuMemcpyDtoDAsync between servers")
    ck(cu.cuMemcpyAsync(ptr(a + 8192), ptr(b), 16, stream0), "cuMemcpyAsync (unified) between servers")
    ck(cu.cuStreamSynchronize(stream0), "cuStreamSynchronize")
    ck(cu.cuMemcpyDtoH_v2(out, ptr(a), SIZE), "cuMemcpyDtoH")
    seen["on_streams"] = (out.raw[:4096] == b"\7" * 4096 and out.raw[4096:8192] == PATTERN[4096:8192]
                          and out.raw[8192:8208] == b"\7" * 16 and out.raw[8208:-16] == PATTERN[8208:-16]
                          and out.raw[-16:] == b"\11" * 16)
    ck(cu.cuStreamSynchronize(stream1), "cuStreamSynchronize of the other server's stream")
    ck(cu.cuEventSynchronize(event), "cuEventSynchronize of the other server's event")

    can = ctypes.c_int(9)
    ck(cu.cuDeviceCanAccessPeer(ctypes.byref(can), 0, last), "cuDeviceCanAccessPeer")
    seen["can_access_peer"] = can.value
    seen["enable_peer_access"] = cu.cuCtxEnablePeerAccess(ctxs[last], 0)
    ck(cu.cuMemFree_v2(ptr(b)), "cuMemFree of the other server's memory")

    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    ck(nvml.nvmlInit_v2(), "nvmlInit")
    count = ctypes.c_uint()
    ck(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount")
    seen["nvml_count"] = count.value
    handle, memory = ctypes.c_void_p(), (ctypes.c_ulonglong * 3)()
    ck(nvml.nvmlDeviceGetHandleByIndex_v2(count.value - 1, ctypes.byref(handle)), "nvmlDeviceGetHandleByIndex")
    ck(nvml.nvmlDeviceGetMemoryInfo(handle, memory), "nvmlDeviceGetMemoryInfo of the last server's device")
    seen["nvml_memory"] = memory[0] > 0
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
