"""NVML in Python: the state behind the `libnvidia-ml.so.1` shim's entry points.

Devices are the server's, all of them and in its order (NVML ignores CUDA_VISIBLE_DEVICES;
PyTorch maps between the two by UUID). Names, UUIDs and PCI ids come from the inventory the
driver session fetched at connect; memory, sensors and processes are asked of the server
(`xpuDeviceStatus`), over the same session as the process's CUDA calls, so an allocation made
just before is counted. Process ids are the server's (the workers holding device memory).
"""

from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable
from typing import Any

from xpuremote.protocol import nvml
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.errors import CudaError

from . import marshal
from .driver import DRIVER, Driver

log = logging.getLogger("xpuremote.client")

Handler = Callable[["Nvml", list[int]], int]
HANDLERS: dict[str, Handler] = {}


class NvmlError(Exception):
    def __init__(self, code: int, detail: str = "") -> None:
        super().__init__(detail)
        self.code = code


def handles(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for name in names:
            HANDLERS[name] = fn
        return fn

    return register


class Nvml:
    """Initialisation count and device handles (addresses of small buffers of our own)."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.inits = 0
        self.lock = threading.Lock()
        self.buffers: list[Any] = []  # one per server device; its address is the nvmlDevice_t

    def devices(self) -> list[dict[str, Any]]:
        if self.inits == 0:
            raise NvmlError(nvml.UNINITIALIZED, "nvmlInit has not been called")
        return [device for _, _, device in self.placed()]

    def placed(self) -> list[tuple[Any, int, dict[str, Any]]]:
        """Every device of every server (NVML ignores CUDA_VISIBLE_DEVICES), with its session and its index there."""
        return [(conn, i, device) for conn in self.driver.sessions
                for i, device in enumerate(conn.inventory["devices"])]

    def handle(self, index: int) -> int:
        while len(self.buffers) <= index:
            self.buffers.append(marshal.ffi.new("uint64_t[2]", [0x6E766D6C, len(self.buffers)]))  # "nvml", index
        return int(marshal.ffi.cast("uintptr_t", self.buffers[index]))

    def index(self, handle: int) -> int:
        count = len(self.devices())
        for i in range(min(count, len(self.buffers))):
            if self.handle(i) == handle:
                return i
        raise NvmlError(nvml.INVALID_ARGUMENT, f"{handle:#x} is not a device handle")

    def status(self, handle: int) -> dict[str, Any]:
        conn, index, _ = self.placed()[self.index(handle)]
        with self.driver.acting_in(0):  # a tool's question: asked of that device's server, in no context
            (answer,) = self.driver.query(CALLS["xpuDeviceStatus"], [index, 1], conn)
        return answer


NVML = Nvml(DRIVER)


def need(*addresses: int) -> None:
    if not all(addresses):
        raise NvmlError(nvml.INVALID_ARGUMENT, "NULL pointer")


def put_u32(address: int, value: int) -> None:
    need(address)
    marshal.write(address, struct.pack("<I", value & 0xFFFFFFFF))


def put_text(address: int, length: int, text: str) -> None:
    need(address)
    if length < len(text) + 1:
        raise NvmlError(nvml.INSUFFICIENT_SIZE, f"{length} bytes for {text!r}")
    marshal.write_string(address, text, length)


# ---- initialisation --------------------------------------------------------------------------
@handles("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags")
def nvml_init(n: Nvml, args: list[int]) -> int:
    try:
        n.driver.connect()
    except CudaError:  # connect() said why, once per process
        return nvml.DRIVER_NOT_LOADED
    with n.lock:
        n.inits += 1
    return nvml.SUCCESS


@handles("nvmlShutdown")
def nvml_shutdown(n: Nvml, args: list[int]) -> int:
    with n.lock:
        if n.inits == 0:
            return nvml.UNINITIALIZED
        n.inits -= 1
    return nvml.SUCCESS


@handles("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2")
def nvml_cuda_driver_version(n: Nvml, args: list[int]) -> int:
    n.devices()
    put_u32(args[0], n.driver.driver_version)
    return nvml.SUCCESS


# ---- devices from the inventory -----------------------------------------------------------------
@handles("nvmlDeviceGetCount", "nvmlDeviceGetCount_v2")
def nvml_device_count(n: Nvml, args: list[int]) -> int:
    put_u32(args[0], len(n.devices()))
    return nvml.SUCCESS


@handles("nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2")
def nvml_handle_by_index(n: Nvml, args: list[int]) -> int:
    index, out = args
    if index >= len(n.devices()):
        return nvml.INVALID_ARGUMENT
    need(out)
    marshal.put_u64(out, n.handle(index))
    return nvml.SUCCESS


def find_device(n: Nvml, matches: Callable[[dict[str, Any]], bool]) -> int:
    for i, device in enumerate(n.devices()):
        if matches(device):
            return i
    raise NvmlError(nvml.NOT_FOUND)


@handles("nvmlDeviceGetHandleByUUID")
def nvml_handle_by_uuid(n: Nvml, args: list[int]) -> int:
    need(*args)
    wanted = marshal.read_string(args[0]).lower()
    index = find_device(n, lambda d: nvml.uuid_text(bytes(d["uuid"])).lower() == wanted)
    marshal.put_u64(args[1], n.handle(index))
    return nvml.SUCCESS


def bus_id(device: dict[str, Any]) -> str:
    domain, bus, dev = device["pci"]
    return f"{domain:08x}:{bus:02x}:{dev:02x}.0"  # NVML's form: an 8-digit domain


@handles("nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2")
def nvml_handle_by_pci_bus_id(n: Nvml, args: list[int]) -> int:
    need(*args)
    wanted = marshal.read_string(args[0]).lower()
    index = find_device(n, lambda d: wanted in (bus_id(d), bus_id(d)[4:]))
    marshal.put_u64(args[1], n.handle(index))
    return nvml.SUCCESS


@handles("nvmlDeviceGetIndex")
def nvml_device_index(n: Nvml, args: list[int]) -> int:
    put_u32(args[1], n.index(args[0]))
    return nvml.SUCCESS


@handles("nvmlDeviceGetName")
def nvml_device_name(n: Nvml, args: list[int]) -> int:
    handle, address, length = args
    put_text(address, length, n.devices()[n.index(handle)]["name"])
    return nvml.SUCCESS


@handles("nvmlDeviceGetUUID")
def nvml_device_uuid(n: Nvml, args: list[int]) -> int:
    handle, address, length = args
    put_text(address, length, nvml.uuid_text(bytes(n.devices()[n.index(handle)]["uuid"])))
    return nvml.SUCCESS


# ---- what the server measures ---------------------------------------------------------------
@handles("nvmlDeviceGetMemoryInfo")
def nvml_memory_info(n: Nvml, args: list[int]) -> int:
    handle, address = args
    need(address)
    s = n.status(handle)
    marshal.write(address, nvml.MEMORY.pack(s["memory_total"], s["memory_free"], s["memory_used"]))
    return nvml.SUCCESS


@handles("nvmlDeviceGetMemoryInfo_v2")
def nvml_memory_info_v2(n: Nvml, args: list[int]) -> int:
    handle, address = args
    need(address)
    (version,) = struct.unpack("<I", marshal.read(address, 4))
    if version != nvml.MEMORY_V2_VERSION:
        return nvml.CODES["UNKNOWN"] if version else nvml.INVALID_ARGUMENT
    s = n.status(handle)
    reserved = s["memory_total"] - s["memory_free"] - s["memory_used"]
    marshal.write(address, nvml.MEMORY_V2.pack(version, s["memory_total"], max(reserved, 0), s["memory_free"],
                                               s["memory_used"]))
    return nvml.SUCCESS


@handles("nvmlDeviceGetUtilizationRates")
def nvml_utilization(n: Nvml, args: list[int]) -> int:
    handle, address = args
    need(address)
    s = n.status(handle)
    if s.get("utilization_gpu") is None:
        return nvml.NOT_SUPPORTED
    marshal.write(address, nvml.UTILIZATION.pack(s["utilization_gpu"], s["utilization_memory"]))
    return nvml.SUCCESS


def sensor(n: Nvml, handle: int, address: int, key: str) -> int:
    value = n.status(handle).get(key)
    if value is None:
        return nvml.NOT_SUPPORTED
    put_u32(address, value)
    return nvml.SUCCESS


@handles("nvmlDeviceGetTemperature")
def nvml_temperature(n: Nvml, args: list[int]) -> int:
    handle, which, address = args
    if which != nvml.TEMPERATURE_GPU:
        return nvml.INVALID_ARGUMENT
    return sensor(n, handle, address, "temperature_c")


@handles("nvmlDeviceGetPowerUsage")
def nvml_power(n: Nvml, args: list[int]) -> int:
    return sensor(n, args[0], args[1], "power_mw")


@handles("nvmlDeviceGetClockInfo")
def nvml_clock(n: Nvml, args: list[int]) -> int:
    handle, which, address = args
    if which not in nvml.CLOCKS:
        return nvml.INVALID_ARGUMENT
    return sensor(n, handle, address, nvml.CLOCKS[which])


def processes(n: Nvml, args: list[int], layout: struct.Struct) -> int:
    """The count-then-fill protocol: too small a count (or no array) gets the count and
    INSUFFICIENT_SIZE; no processes is SUCCESS with a count of 0."""
    handle, count_address, infos = args
    need(count_address)
    procs = n.status(handle).get("processes", [])
    (room,) = struct.unpack("<I", marshal.read(count_address, 4))
    put_u32(count_address, len(procs))
    if not procs:
        return nvml.SUCCESS
    if room < len(procs) or not infos:
        return nvml.INSUFFICIENT_SIZE
    extra = (nvml.NO_INSTANCE, nvml.NO_INSTANCE) if layout is nvml.PROCESS_V2 else ()
    marshal.write(infos, b"".join(layout.pack(pid, used, *extra) for pid, used in procs))
    return nvml.SUCCESS


@handles("nvmlDeviceGetComputeRunningProcesses")
def nvml_processes_v1(n: Nvml, args: list[int]) -> int:
    return processes(n, args, nvml.PROCESS_V1)


@handles("nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3")
def nvml_processes_v2(n: Nvml, args: list[int]) -> int:
    return processes(n, args, nvml.PROCESS_V2)


@handles("nvmlDeviceGetP2PStatus")
def nvml_p2p_status(n: Nvml, args: list[int]) -> int:
    a, b, _index, out = args
    n.index(a), n.index(b)
    need(out)
    marshal.write(out, struct.pack("<i", nvml.P2P_STATUS_NOT_SUPPORTED))  # peer access is not forwarded
    return nvml.SUCCESS


@handles("nvmlDeviceGetCudaComputeCapability")
def nvml_compute_capability(n: Nvml, args: list[int]) -> int:
    handle, major, minor = args
    need(major, minor)
    sm = n.devices()[n.index(handle)]["sm"]
    marshal.write(major, struct.pack("<i", sm // 10))
    marshal.write(minor, struct.pack("<i", sm % 10))
    return nvml.SUCCESS


# The server's links and PCI slot are not the application's: NVLink, fabric, PCIe and platform
# questions (NCCL's topology) are answered NOT_SUPPORTED, as for a device without them.
@handles("nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNvLinkRemotePciInfo_v2", "nvmlDeviceGetGpuFabricInfoV",
         "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkCapability",
         "nvmlDeviceGetFieldValues", "nvmlDeviceGetPciInfoExt", "nvmlDeviceGetPciInfo_v3",
         "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetPcieLinkMaxSpeed",
         "nvmlDeviceGetPlatformInfo")
def nvml_not_supported(n: Nvml, args: list[int]) -> int:
    n.index(args[0])
    return nvml.NOT_SUPPORTED


def handler(function: nvml.Function) -> Callable[[Any], int]:
    """What the shim calls for `function`, given its argument slots."""
    impl = HANDLERS[function.name]
    count = len(function.params)

    def run(slots: Any) -> int:
        try:
            return impl(NVML, [int(slots[i]) for i in range(count)])
        except NvmlError as exc:
            log.debug("%s -> %d %s", function.name, exc.code, exc)
            return exc.code
        except CudaError as exc:  # the session failed: the server is gone
            log.error("%s: %s", function.name, exc.detail)
            return nvml.CODES["GPU_IS_LOST"]
        except Exception:
            log.exception("internal error in %s", function.name)
            return nvml.UNKNOWN

    return run


def handlers() -> list[Callable[[Any], int]]:
    """One handler per shim op number."""
    missing = [f.name for f in nvml.TABLE if f.name not in HANDLERS]
    if missing:
        raise RuntimeError(f"NVML functions without a handler: {missing}")
    return [handler(f) for f in nvml.TABLE]
