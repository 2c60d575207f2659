"""Device status on a real GPU server, from NVIDIA's NVML (cffi ABI mode), for xpuDeviceStatus.

Answers what nvidia-smi shows of a device: memory used device-wide (every process's), sensors,
and the processes holding memory (the server's, including xpu-server's workers). Devices are
matched by UUID, so CUDA_VISIBLE_DEVICES on the server does not confuse the two numberings.
Not yet run on a GPU in this project's CI (there is none there).
"""

from __future__ import annotations

import os
from typing import Any

import cffi

from xpuremote.protocol import errors, nvml
from xpuremote.protocol.errors import CudaError

DECLARATIONS = """
int nvmlInit_v2(void);
const char *nvmlErrorString(int result);
int nvmlDeviceGetHandleByUUID(const char *uuid, void **device);
int nvmlDeviceGetMemoryInfo(void *device, void *memory);
int nvmlDeviceGetUtilizationRates(void *device, void *utilization);
int nvmlDeviceGetTemperature(void *device, int sensor, unsigned int *temperature);
int nvmlDeviceGetPowerUsage(void *device, unsigned int *milliwatts);
int nvmlDeviceGetClockInfo(void *device, int type, unsigned int *mhz);
int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, void *infos);
"""
MAX_PROCESSES = 256


class NvmlStatus:
    def __init__(self) -> None:
        self.ffi = cffi.FFI()
        self.ffi.cdef(DECLARATIONS)
        try:
            self.lib = self.ffi.dlopen(os.environ.get("XPU_NVML_LIBRARY", "libnvidia-ml.so.1"))
        except OSError as exc:
            raise CudaError(errors.NOT_SUPPORTED, f"NVML is not available on the server: {exc}") from None
        self.check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handles: dict[bytes, Any] = {}

    def check(self, status: int, what: str) -> None:
        if status != nvml.SUCCESS:
            text = self.ffi.string(self.lib.nvmlErrorString(status)).decode()
            raise CudaError(errors.NOT_SUPPORTED, f"{what} on the server: NVML error {status} ({text})")

    def handle(self, uuid: bytes) -> Any:
        if uuid not in self.handles:
            out = self.ffi.new("void **")
            found = self.lib.nvmlDeviceGetHandleByUUID(nvml.uuid_text(uuid).encode(), out)
            self.check(found, "nvmlDeviceGetHandleByUUID")
            self.handles[uuid] = out[0]
        return self.handles[uuid]

    def optional(self, fn: Any, *args: Any) -> int | None:
        """A sensor some boards lack: None when NVML says so."""
        value = self.ffi.new("unsigned int *")
        return value[0] if fn(*args, value) == nvml.SUCCESS else None

    def status(self, uuid: bytes) -> dict[str, Any]:
        lib, dev = self.lib, self.handle(uuid)
        memory = self.ffi.new("char[]", nvml.MEMORY.size)
        self.check(lib.nvmlDeviceGetMemoryInfo(dev, memory), "nvmlDeviceGetMemoryInfo")
        total, free, used = nvml.MEMORY.unpack(self.ffi.buffer(memory))
        rates = self.ffi.new("char[]", nvml.UTILIZATION.size)
        gpu, mem = nvml.UTILIZATION.unpack(self.ffi.buffer(rates)) if (
            lib.nvmlDeviceGetUtilizationRates(dev, rates) == nvml.SUCCESS) else (None, None)
        clocks = {key: self.optional(lib.nvmlDeviceGetClockInfo, dev, kind) for key, kind in nvml.CLOCK_TYPES.items()}
        return {"memory_total": total, "memory_used": used, "memory_free": free,
                "utilization_gpu": gpu, "utilization_memory": mem,
                "temperature_c": self.optional(lib.nvmlDeviceGetTemperature, dev, nvml.TEMPERATURE_GPU),
                "power_mw": self.optional(lib.nvmlDeviceGetPowerUsage, dev), **clocks,
                "processes": self.processes(dev)}

    def processes(self, dev: Any) -> list[list[int]]:
        count = self.ffi.new("unsigned int *", MAX_PROCESSES)
        infos = self.ffi.new("char[]", nvml.PROCESS_V2.size * MAX_PROCESSES)
        if self.lib.nvmlDeviceGetComputeRunningProcesses_v3(dev, count, infos) != nvml.SUCCESS:
            return []
        raw = self.ffi.buffer(infos)
        rows = [nvml.PROCESS_V2.unpack_from(raw, i * nvml.PROCESS_V2.size) for i in range(count[0])]
        return [[pid, used] for pid, used, _gi, _ci in rows]
