"""The NVML calls xpuremote's `libnvidia-ml.so.1` answers: signatures, codes, struct layouts.

Only what PyTorch uses: `torch.cuda` (device count and UUIDs for PYTORCH_NVML_BASED_CUDA_CHECK
and CUDA_VISIBLE_DEVICES, and through pynvml `device_memory_used`, `memory_usage`,
`utilization`, `temperature`, `power_draw`, `clock_rate`, `list_gpu_processes`) and its C++
libraries (c10's out-of-memory report and peer-access checks, the IPC channel), and the calls NCCL
makes without checking that dlsym found them (it calls each through its pointer: an absent one
was a call to address 0); the links and PCI details among those answer NVML_ERROR_NOT_SUPPORTED.
The shim's C entry points are generated from FUNCTIONS; every other NVML symbol is absent, as in
an older library, and callers that dlsym it see that.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

# name(C parameter types): each becomes an exported `nvmlReturn_t name(...)`.
FUNCTIONS = """
nvmlInit()
nvmlInit_v2()
nvmlInitWithFlags(unsigned int)
nvmlShutdown()
nvmlSystemGetCudaDriverVersion(int *)
nvmlSystemGetCudaDriverVersion_v2(int *)
nvmlDeviceGetCount(unsigned int *)
nvmlDeviceGetCount_v2(unsigned int *)
nvmlDeviceGetHandleByIndex(unsigned int, void **)
nvmlDeviceGetHandleByIndex_v2(unsigned int, void **)
nvmlDeviceGetHandleByUUID(const char *, void **)
nvmlDeviceGetHandleByPciBusId(const char *, void **)
nvmlDeviceGetHandleByPciBusId_v2(const char *, void **)
nvmlDeviceGetIndex(void *, unsigned int *)
nvmlDeviceGetName(void *, char *, unsigned int)
nvmlDeviceGetUUID(void *, char *, unsigned int)
nvmlDeviceGetMemoryInfo(void *, void *)
nvmlDeviceGetMemoryInfo_v2(void *, void *)
nvmlDeviceGetUtilizationRates(void *, void *)
nvmlDeviceGetTemperature(void *, int, unsigned int *)
nvmlDeviceGetPowerUsage(void *, unsigned int *)
nvmlDeviceGetClockInfo(void *, int, unsigned int *)
nvmlDeviceGetComputeRunningProcesses(void *, unsigned int *, void *)
nvmlDeviceGetComputeRunningProcesses_v2(void *, unsigned int *, void *)
nvmlDeviceGetComputeRunningProcesses_v3(void *, unsigned int *, void *)
nvmlDeviceGetP2PStatus(void *, void *, int, int *)
nvmlDeviceGetNvLinkRemoteDeviceType(void *, unsigned int, int *)
nvmlDeviceGetNvLinkRemotePciInfo_v2(void *, unsigned int, void *)
nvmlDeviceGetGpuFabricInfoV(void *, void *)
nvmlDeviceGetCudaComputeCapability(void *, int *, int *)
nvmlDeviceGetNvLinkState(void *, unsigned int, int *)
nvmlDeviceGetNvLinkRemotePciInfo(void *, unsigned int, void *)
nvmlDeviceGetNvLinkCapability(void *, unsigned int, int, unsigned int *)
nvmlDeviceGetFieldValues(void *, int, void *)
nvmlDeviceGetPciInfoExt(void *, void *)
nvmlDeviceGetPciInfo_v3(void *, void *)
nvmlDeviceGetCurrPcieLinkGeneration(void *, unsigned int *)
nvmlDeviceGetCurrPcieLinkWidth(void *, unsigned int *)
nvmlDeviceGetPcieLinkMaxSpeed(void *, unsigned int *)
nvmlDeviceGetPlatformInfo(void *, void *)
"""


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[str, ...]
    op: int


def _parse(text: str) -> tuple[Function, ...]:
    out = []
    for line in filter(None, (s.strip() for s in text.splitlines())):
        m = re.fullmatch(r"(\w+)\((.*)\)", line)
        if not m:
            raise ValueError(f"cannot read NVML declaration {line!r}")
        params = tuple(p.strip() for p in m.group(2).split(",") if p.strip())
        out.append(Function(m.group(1), params, len(out)))
    return tuple(out)


TABLE = _parse(FUNCTIONS)
BY_NAME = {f.name: f for f in TABLE}

# nvmlReturn_t, with nvmlErrorString's text
RETURNS = {
    "SUCCESS": (0, "Success"), "UNINITIALIZED": (1, "Uninitialized"),
    "INVALID_ARGUMENT": (2, "Invalid Argument"), "NOT_SUPPORTED": (3, "Not Supported"),
    "NO_PERMISSION": (4, "Insufficient Permissions"), "ALREADY_INITIALIZED": (5, "Already Initialized"),
    "NOT_FOUND": (6, "Not Found"), "INSUFFICIENT_SIZE": (7, "Insufficient Size"),
    "DRIVER_NOT_LOADED": (9, "Driver Not Loaded"), "TIMEOUT": (10, "Timeout"),
    "GPU_IS_LOST": (15, "GPU is lost"), "UNKNOWN": (999, "Unknown Error"),
}
CODES = {name: code for name, (code, _) in RETURNS.items()}
SUCCESS, UNINITIALIZED, INVALID_ARGUMENT = CODES["SUCCESS"], CODES["UNINITIALIZED"], CODES["INVALID_ARGUMENT"]
NOT_SUPPORTED, NOT_FOUND, INSUFFICIENT_SIZE = CODES["NOT_SUPPORTED"], CODES["NOT_FOUND"], CODES["INSUFFICIENT_SIZE"]
DRIVER_NOT_LOADED, UNKNOWN = CODES["DRIVER_NOT_LOADED"], CODES["UNKNOWN"]

# the device status keys of the clocks, and the nvmlClockType_t each is read with on the server
CLOCK_TYPES = {"clock_graphics_mhz": 0, "clock_sm_mhz": 1, "clock_memory_mhz": 2}
# nvmlClockType_t -> the key answering it; the video clock (3) has no key and is the graphics clock
CLOCKS = {**{kind: key for key, kind in CLOCK_TYPES.items()}, 3: "clock_graphics_mhz"}
TEMPERATURE_GPU = 0  # nvmlTemperatureSensors_t
P2P_STATUS_NOT_SUPPORTED = 5  # nvmlGpuP2PStatus_t NVML_P2P_STATUS_NOT_SUPPORTED

# Structs, little-endian with C alignment.
MEMORY = struct.Struct("<QQQ")  # nvmlMemory_t: total, free, used
MEMORY_V2 = struct.Struct("<I4xQQQQ")  # nvmlMemory_v2_t: version, total, reserved, free, used
MEMORY_V2_VERSION = MEMORY_V2.size | (2 << 24)
UTILIZATION = struct.Struct("<II")  # nvmlUtilization_t: gpu %, memory %
PROCESS_V1 = struct.Struct("<I4xQ")  # nvmlProcessInfo_v1_t: pid, usedGpuMemory
PROCESS_V2 = struct.Struct("<I4xQII")  # nvmlProcessInfo_v2_t (= _v3): pid, usedGpuMemory, gpu/compute instance
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId outside MIG

# Buffer sizes NVML documents (NVML_DEVICE_UUID_V2_BUFFER_SIZE, NVML_DEVICE_NAME_V2_BUFFER_SIZE)
UUID_BUFFER, NAME_BUFFER = 96, 96


def uuid_text(uuid: bytes) -> str:
    """A device UUID as NVML (and nvidia-smi) write it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = uuid.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
