"""xpuremote's libnvidia-ml.so.1 over the libcuda shim, read two ways; prints one JSON line.

    python nvml_check.py LIBNVIDIA_ML SIZE

Plain ctypes calls (count, handles, UUIDs, PCI lookup, error strings, the uninitialised case),
then the cuda backend's own NVML reader (server/backends/nvml_status.py) as a client of it,
while this process holds SIZE bytes on device 1 through the driver API.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

from xpuremote.server.backends.nvml_status import NvmlStatus


def driver_alloc(size: int, device: int) -> int:
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, ptr = ctypes.c_void_p(), ctypes.c_uint64()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(size)) == 0
    return ptr.value


def main() -> int:
    path, size = sys.argv[1], int(sys.argv[2])
    lib = ctypes.CDLL(path)
    lib.nvmlErrorString.restype = ctypes.c_char_p
    out: dict = {"error_string_7": lib.nvmlErrorString(7).decode()}
    count = ctypes.c_uint()
    out["count_before_init"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    out["init"] = lib.nvmlInit_v2()
    out["count_status"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
    out["count"] = count.value
    out["uuids"], out["by_uuid"], out["by_pci"] = [], [], []
    for i in range(count.value):
        handle, again, index = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint()
        assert lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) == 0
        text = ctypes.create_string_buffer(96)
        assert lib.nvmlDeviceGetUUID(handle, text, 96) == 0
        out["uuids"].append(text.value.decode())
        assert lib.nvmlDeviceGetHandleByUUID(text.value, ctypes.byref(again)) == 0
        assert lib.nvmlDeviceGetIndex(again, ctypes.byref(index)) == 0
        out["by_uuid"].append(index.value)
        bus = f"00000000:{0x10 + i:02x}:00.0".encode()  # the sim's PCI addresses
        out["by_pci"].append(lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(again)) == 0
                             and again.value == handle.value)
    bad = ctypes.c_void_p()
    out["bad_index"] = lib.nvmlDeviceGetHandleByIndex_v2(count.value, ctypes.byref(bad))
    out["pointer"] = driver_alloc(size, 1)
    os.environ["XPU_NVML_LIBRARY"] = path
    reader = NvmlStatus()
    out["status"] = [reader.status(bytes.fromhex(u[4:].replace("-", ""))) for u in out["uuids"]]
    out["pid"] = os.getpid()
    out["shutdown"] = lib.nvmlShutdown()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
