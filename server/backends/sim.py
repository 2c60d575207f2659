"""A device without a GPU, for development and CI.

Real bookkeeping, no pretence: device memory is bounds-checked host memory at device-looking
addresses; copies, memsets, streams, events, contexts and modules behave as the driver
documents. Work completes in issue order, at once. A kernel runs only if a host
implementation is registered for its name (see sim_kernels); any other launch fails with an
error that names the kernel.
"""

from __future__ import annotations

import bisect
import logging
import os
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, fatbin, mathlibs, wire
from xpuremote.protocol.cuda_api import ENUMS, HEADER_VERSIONS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import EVENT_ATTRIBUTES

from ..data import Incoming
from . import sim_kernels
from .base import DeviceInfo, Inventory, check_module_image, cluster_size, launch_attributes
from .sim_arrays import SimArrays
from .sim_board import Board
from .sim_graph_memory import GraphMemory
from .sim_graphs import SimGraphs
from .sim_pools import Pool, Pools
from .sim_vmm import VirtualMemory

log = logging.getLogger("xpuremote.server")
SIM_DRIVER_VERSION = HEADER_VERSIONS[0]  # the newest headers the call table covers: their runtimes accept it
SIM_SM = 90
SIM_TEMPERATURE_C, SIM_POWER_MW = 35, 60_000  # an idle device's sensors
# Each session's addresses start at a random 64 KiB step of [BASE_LOW, BASE_HIGH): 64 TiB, 30 bits,
# below where Linux puts a process's heap and libraries, with a TiB above for what it allocates.
BASE_LOW, BASE_HIGH = 0x1000_0000_0000, 0x5000_0000_0000 - (1 << 40)
BASE_STEP = 64 << 10
ADDRESS_ROOM = 1 << 40  # the addresses a session may hand out from its start: the TiB BASE_HIGH leaves above
ALIGN = 512
MAX_CLUSTER = 8  # blocks per cluster that a portable launch may ask for


@dataclass(eq=False)
class Allocation:
    base: int
    data: bytearray | memoryview  # its own bytes, or a mapping's window on a physical allocation's pages
    device: int = 0
    pool: Any = None  # the sim_pools.Pool it came from (stream-ordered allocation), else None
    mapping: Any = None  # for a VMM mapping (sim_vmm.Mapping): whose bytes these are, and their access


class Memory:
    """Device memory: allocations kept sorted by address, every access bounds-checked.

    One address space for all devices of the session (as with unified addressing), with a
    capacity per device; `on_change(device, bytes)` hears each device's new total. Besides
    cuMemAlloc's own buffers, its allocations are memory pools' (sim_pools) and VMM mappings
    (sim_vmm), which it finds by address like any other."""

    def __init__(self, capacity: int, on_change: Callable[[int, int], None] | None = None) -> None:
        self.capacity = capacity  # per device
        self.used = 0
        self.by_device: dict[int, int] = {}
        self.bases: list[int] = []
        self.allocs: dict[int, Allocation] = {}
        self.last: Allocation | None = None  # the one found last: work runs on one buffer again and again
        # sessions are separate address spaces, as processes on a GPU are; a random start makes
        # another session's pointer point at nothing here rather than at this session's own memory
        self.next = BASE_LOW + secrets.randbelow((BASE_HIGH - BASE_LOW) // BASE_STEP) * BASE_STEP
        self.end = self.next + ADDRESS_ROOM
        self.on_change = on_change

    def take(self, size: int, alignment: int = ALIGN) -> int:
        """Addresses for `size` bytes at `alignment` (a power of two), never handed out before."""
        base = -(-self.next // alignment) * alignment
        if base + size > self.end:
            raise CudaError(errors.OUT_OF_MEMORY, f"{size} bytes of addresses requested: the session's "
                            f"{ADDRESS_ROOM >> 40} TiB of device addresses are spent")
        self.next = base + (size + ALIGN - 1) // ALIGN * ALIGN + ALIGN  # a guard gap between allocations
        return base

    def alloc(self, size: int, device: int = 0, pool: Any = None) -> int:
        if size <= 0:
            raise CudaError(errors.INVALID_VALUE, "allocation of 0 bytes")
        self.charge(device, size)
        try:
            base = self.take(size)
        except CudaError:
            self.discharge(device, size)
            raise
        # a fresh buffer is zero-filled: no allocation ever shows the bytes of an earlier one
        self._insert(Allocation(base, bytearray(size), device, pool))
        return base

    def place(self, base: int, size: int, device: int, pool: Any) -> None:
        """An allocation at an address the client chose, inside a range take() gave its pool (sim_pools): over no
        other allocation."""
        i = bisect.bisect_left(self.bases, base)
        before = self.allocs[self.bases[i - 1]] if i else None
        if size <= 0 or (i < len(self.bases) and self.bases[i] < base + size) or (
                before is not None and before.base + len(before.data) > base):
            raise CudaError(errors.INVALID_VALUE, f"[{base:#x}, +{size}) overlaps an allocation")
        self.charge(device, size)
        self._insert(Allocation(base, bytearray(size), device, pool))  # zero-filled, as alloc's

    def free(self, base: int) -> Allocation:
        alloc = self.allocs.get(base)
        if alloc is None or alloc.mapping is not None:
            what = "mapped memory (cuMemUnmap it)" if alloc else "the start of an allocation"
            raise CudaError(errors.INVALID_VALUE, f"{base:#x} is not {what}")
        self._remove(base)
        self.discharge(alloc.device, len(alloc.data))
        return alloc

    def add_mapping(self, mapping: Any, data: memoryview) -> None:
        """A VMM mapping's addresses now reach `data`; its bytes are counted with its physical allocation."""
        self._insert(Allocation(mapping.base, data, mapping.physical.device, mapping=mapping))

    def remove_mapping(self, base: int) -> None:
        self._remove(base)

    def _insert(self, alloc: Allocation) -> None:
        bisect.insort(self.bases, alloc.base)
        self.allocs[alloc.base] = alloc

    def _remove(self, base: int) -> None:
        del self.allocs[base]
        self.bases.remove(base)
        self.last = None

    # ---- device memory in use, per device -------------------------------------------------------
    def charge(self, device: int, size: int, checked: bool = True) -> None:
        """`size` more bytes of `device` in use; beyond its capacity OUT_OF_MEMORY, unless they are bytes
        that were in use already (a pool keeping what was freed to it)."""
        held = self.by_device.get(device, 0)
        if checked and held + size > self.capacity:
            raise CudaError(errors.OUT_OF_MEMORY, f"{size} bytes requested, {self.capacity - held} free")
        self._count(device, size)

    def discharge(self, device: int, size: int) -> None:
        self._count(device, -size)

    def _count(self, device: int, delta: int) -> None:
        self.used += delta
        self.by_device[device] = self.by_device.get(device, 0) + delta
        if self.on_change is not None:
            self.on_change(device, self.by_device[device])

    # ---- finding bytes by address ------------------------------------------------------------------
    def allocation_at(self, address: int) -> Allocation | None:
        """The allocation (or mapping) holding `address`."""
        last = self.last
        if last is not None and last.base <= address < last.base + len(last.data):
            return last
        i = bisect.bisect_right(self.bases, address) - 1
        if i >= 0:
            alloc = self.allocs[self.bases[i]]
            if address < alloc.base + len(alloc.data):
                self.last = alloc
                return alloc
        return None

    def find(self, address: int, size: int = 1) -> tuple[Allocation, int]:
        """The allocation holding [address, address+size) and the offset into it."""
        alloc = self.allocation_at(address)
        if alloc is not None and address - alloc.base + size <= len(alloc.data):
            self._check_access(alloc)
            return alloc, address - alloc.base
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not inside one device allocation")

    def _locate(self, address: int, size: int) -> tuple[bytearray | memoryview, int]:
        """Bytes holding [address, address+size) and the offset into them: one allocation's, or a reservation's
        where the range runs over adjacent mappings (contiguous there, as on a GPU)."""
        alloc = self.allocation_at(address)
        if alloc is not None:
            offset = address - alloc.base
            if offset + size <= len(alloc.data):
                self._check_access(alloc)
                return alloc.data, offset
            if alloc.mapping is not None:
                return self._across_mappings(alloc, address, size), 0
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not inside one device allocation")

    def _across_mappings(self, first: Allocation, address: int, size: int) -> memoryview:
        reservation, alloc = first.mapping.reservation, first
        while True:
            self._check_access(alloc)
            end = alloc.base + len(alloc.data)
            if end >= address + size:
                return reservation.view(address, size)
            alloc = self.allocation_at(end)
            if alloc is None or alloc.mapping is None or alloc.mapping.reservation is not reservation:
                raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) runs past the mapped memory at "
                                f"{end:#x}")

    @staticmethod
    def _check_access(alloc: Allocation) -> None:
        if alloc.mapping is not None and not alloc.mapping.accessible:
            raise CudaError(errors.INVALID_VALUE, f"{alloc.base:#x} is mapped but no device may access it yet "
                            "(cuMemSetAccess)")

    def view(self, address: int, size: int) -> memoryview:
        data, offset = self._locate(address, max(size, 1))
        return memoryview(data)[offset : offset + size]

    def read(self, address: int, size: int) -> bytes:
        return bytes(self.view(address, size))

    def write(self, address: int, data: bytes | memoryview) -> None:
        self.view(address, len(data))[:] = data

    def fill(self, address: int, pattern: bytes, count: int) -> None:
        size = len(pattern) * count
        data, offset = self._locate(address, max(size, 1))  # bounds first: never build an absurd pattern
        data[offset : offset + size] = pattern * count

    def rect(self, address: int, pitch: int, width: int, height: int) -> bool:
        """Check that a pitched rectangle lies inside one allocation before touching its rows, so
        that an absurd height fails at once instead of looping; False when it is empty."""
        if width == 0 or height == 0:
            return False
        if height > 1 and pitch < width:
            raise CudaError(errors.INVALID_VALUE, f"pitch {pitch} is less than the row width {width}")
        self._locate(address, pitch * (height - 1) + width)
        return True

    def release_all(self) -> None:
        self.bases.clear()
        self.allocs.clear()
        for device in list(self.by_device):
            self._count(device, -self.by_device[device])


@dataclass
class Context:
    device: int
    flags: int = 0
    primary: bool = False
    limits: dict[int, int] = field(default_factory=dict)


@dataclass
class GreenContext(Context):  # also the CUcontext that stands for it
    sms: int = 0  # how many SMs it was provisioned with


@dataclass
class Module:
    kernels: dict[str, fatbin.Kernel]
    globals: dict[str, int]  # name -> device address
    global_sizes: dict[str, int]


@dataclass
class Function:
    module: Module
    kernel: fatbin.Kernel
    attributes: dict[int, int] = field(default_factory=dict)


@dataclass
class Stream:
    flags: int = 0
    priority: int = 0


@dataclass
class Event:
    flags: int = 0
    recorded_at: float | None = None


DEVICE_ATTRIBUTES = {  # an H100-like device (sm_90): what runtimes and frameworks ask about
    "MAX_THREADS_PER_BLOCK": 1024, "MAX_BLOCK_DIM_X": 1024, "MAX_BLOCK_DIM_Y": 1024, "MAX_BLOCK_DIM_Z": 64,
    "MAX_GRID_DIM_X": 2**31 - 1, "MAX_GRID_DIM_Y": 65535, "MAX_GRID_DIM_Z": 65535,
    "MAX_SHARED_MEMORY_PER_BLOCK": 49152, "TOTAL_CONSTANT_MEMORY": 65536, "WARP_SIZE": 32,
    "MAX_PITCH": 2**31 - 1, "MAX_REGISTERS_PER_BLOCK": 65536, "CLOCK_RATE": 1980000,
    "TEXTURE_ALIGNMENT": 512, "GPU_OVERLAP": 1, "MULTIPROCESSOR_COUNT": 132, "INTEGRATED": 0,
    "CAN_MAP_HOST_MEMORY": 1, "COMPUTE_MODE": 0, "SURFACE_ALIGNMENT": 512, "CONCURRENT_KERNELS": 1,
    "ECC_ENABLED": 0, "TCC_DRIVER": 0, "MEMORY_CLOCK_RATE": 2619000, "GLOBAL_MEMORY_BUS_WIDTH": 5120,
    "L2_CACHE_SIZE": 50 * 2**20, "MAX_THREADS_PER_MULTIPROCESSOR": 2048, "ASYNC_ENGINE_COUNT": 2,
    "UNIFIED_ADDRESSING": 1, "COMPUTE_CAPABILITY_MAJOR": SIM_SM // 10, "COMPUTE_CAPABILITY_MINOR": SIM_SM % 10,
    "STREAM_PRIORITIES_SUPPORTED": 1, "GLOBAL_L1_CACHE_SUPPORTED": 1, "LOCAL_L1_CACHE_SUPPORTED": 1,
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233472, "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
    "MANAGED_MEMORY": 1, "MULTI_GPU_BOARD": 0, "MULTI_GPU_BOARD_GROUP_ID": 0,
    "SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO": 2, "PAGEABLE_MEMORY_ACCESS": 0, "CONCURRENT_MANAGED_ACCESS": 1,
    "COMPUTE_PREEMPTION_SUPPORTED": 1, "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM": 0,
    "COOPERATIVE_LAUNCH": 1, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232448, "MAX_BLOCKS_PER_MULTIPROCESSOR": 32,
    "MAX_PERSISTING_L2_CACHE_SIZE": 32 * 2**20, "MAX_ACCESS_POLICY_WINDOW_SIZE": 2**27,
    "RESERVED_SHARED_MEMORY_PER_BLOCK": 1024, "MEMORY_POOLS_SUPPORTED": 1, "GENERIC_COMPRESSION_SUPPORTED": 0,
    "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED": 1, "MEMPOOL_SUPPORTED_HANDLE_TYPES": 0,
    "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED": 0,
    "CLUSTER_LAUNCH": 1, "DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED": 0, "IPC_EVENT_SUPPORTED": 0,
    "MEM_SYNC_DOMAIN_COUNT": 4, "HOST_NATIVE_ATOMIC_SUPPORTED": 0, "DMA_BUF_SUPPORTED": 0,
    "MAXIMUM_TEXTURE1D_WIDTH": 131072, "MAXIMUM_TEXTURE2D_WIDTH": 131072, "MAXIMUM_TEXTURE2D_HEIGHT": 65536,
    "MAXIMUM_TEXTURE3D_WIDTH": 16384, "MAXIMUM_TEXTURE3D_HEIGHT": 16384, "MAXIMUM_TEXTURE3D_DEPTH": 16384,
    "PCI_BUS_ID": 0, "PCI_DEVICE_ID": 0, "PCI_DOMAIN_ID": 0, "NUMA_CONFIG": 0, "NUMA_ID": -1,
    "HOST_NUMA_ID": -1, "GPU_DIRECT_RDMA_SUPPORTED": 0, "TIMELINE_SEMAPHORE_INTEROP_SUPPORTED": 0,
}


def _attribute_ids() -> dict[int, int]:
    out = {}
    for key, value in DEVICE_ATTRIBUTES.items():
        code = ENUMS.get(f"CU_DEVICE_ATTRIBUTE_{key}")
        if code is not None:
            out[code] = value
    return out


def _refused_attributes() -> list[int]:
    """XPU_SIM_REFUSED_ATTRIBUTES (`148,149`): codes the sim's driver does not know, as a driver older than
    the headers refuses the newer ones (an H100's 580 driver refused 148-161)."""
    return [int(code) for code in filter(None, os.environ.get("XPU_SIM_REFUSED_ATTRIBUTES", "").split(","))]


def _refuser(family: str) -> Callable[..., Any]:
    """XPU_SIM_REFUSED_CALLS (`xpuGreenCtxCreate`): calls the sim's driver refuses, as a driver that lacks a
    feature does (an H100's 580 driver in a virtual machine refused every green context, INVALID_VALUE)."""
    def refuse(*args: Any) -> None:
        raise CudaError(errors.INVALID_VALUE, f"{family}: refused by this driver (XPU_SIM_REFUSED_CALLS)")
    return refuse


class SimBackend(SimGraphs, SimArrays):
    name = "sim"

    def __init__(self, device_count: int = 1, memory_bytes: int = 16 * 2**30) -> None:
        super().__init__()
        self.device_count = device_count
        self.board = Board()
        self.memory = Memory(memory_bytes, self.board.publish)
        self.pools = Pools(self.memory, self._device)
        self.vmm = VirtualMemory(self.memory, self._device)
        self.graph_memory = GraphMemory(self.memory)
        self.memory_bytes = memory_bytes
        self.current: Context | None = None  # the context the client's calls run in
        # kernels without a host implementation do nothing: their results are garbage, but an
        # application runs on, which shows which driver calls it makes (not for results)
        self.skip_unknown_kernels = os.environ.get("XPU_SIM_SKIP_KERNELS") == "1"
        self.skipped: set[str] = set()
        self.primary: dict[int, Context] = {}
        self.modules: dict[int, Module] = {}
        self.images: dict[bytes, Module] = {}  # content hash -> module loaded from it
        self.created_at = time.perf_counter()
        self.libraries: dict[str, Any] = {}  # made on first use: numpy is imported then
        sim_kernels.load_plugins(os.environ.get("XPU_SIM_KERNELS", ""))
        for family in filter(None, os.environ.get("XPU_SIM_REFUSED_CALLS", "").split(",")):
            setattr(self, family, _refuser(family))

    def inventory(self) -> Inventory:
        attributes = _attribute_ids()
        devices = []
        for i in range(self.device_count):
            attrs = dict(attributes)
            attrs[ENUMS["CU_DEVICE_ATTRIBUTE_PCI_BUS_ID"]] = 0x10 + i
            # the sim stands for one machine per daemon (a worker's parent): two daemons' devices differ, as two
            # machines' GPUs do, for a client that sees several servers' devices as one list
            uuid = bytes.fromhex("5349d0d0") + i.to_bytes(4, "little") + b"xpu\0" + os.getppid().to_bytes(4, "little")
            devices.append(DeviceInfo(f"xpuremote sim device {i} (sm_{SIM_SM})", uuid, self.memory_bytes,
                                      attrs, (0, 0x10 + i, 0), SIM_SM, _refused_attributes()))
        return Inventory(SIM_DRIVER_VERSION, devices, self.name)

    def close(self) -> None:
        if "nccl" in self.libraries:  # its ranks leave their communicators
            self.libraries["nccl"].close()
        self.vmm.close()
        self.memory.release_all()
        self.modules.clear()
        self.board.close()

    # ---- contexts: bookkeeping only, one address space per session ---------------------
    def _device(self, dev: int) -> int:
        if not 0 <= dev < self.device_count:
            raise CudaError(errors.INVALID_DEVICE, f"device {dev} (this server has {self.device_count})")
        return dev

    def cuDevicePrimaryCtxRetain(self, dev: int) -> tuple[Context]:
        ctx = self.primary.setdefault(self._device(dev), Context(dev, primary=True))
        return (ctx,)

    def cuDevicePrimaryCtxRelease(self, dev: int) -> None:
        self._device(dev)

    def cuDevicePrimaryCtxReset(self, dev: int) -> None:
        self.primary.pop(self._device(dev), None)

    def cuCtxCreate(self, *args: Any) -> tuple[Context]:
        dev = args[-1]  # every variant ends with the device
        flags = args[-2] if isinstance(args[-2], int) else 0
        return (Context(self._device(dev), flags),)

    def cuCtxDestroy(self, ctx: Context) -> None:
        if self.current is ctx:
            self.current = None

    def xpuGreenCtxCreate(self, dev: int, sms: bytes, flags: int) -> tuple[GreenContext]:
        """A green context of the SMs in the mask (which the sim does not model beyond their count)."""
        mask = int.from_bytes(sms, "little")
        if not mask or mask.bit_length() > DEVICE_ATTRIBUTES["MULTIPROCESSOR_COUNT"]:
            raise CudaError(errors.INVALID_VALUE, f"SM set {mask:#x} is empty or beyond the device's SMs")
        return (GreenContext(self._device(dev), sms=mask.bit_count()),)

    def cuGreenCtxDestroy(self, green: GreenContext) -> None:
        self.cuCtxDestroy(green)

    def cuGreenCtxStreamCreate(self, green: GreenContext, flags: int, priority: int) -> tuple[Stream]:
        return (Stream(flags, priority),)

    def cuGreenCtxRecordEvent(self, green: GreenContext, event: Event) -> None:
        event.recorded_at = time.perf_counter()

    def cuGreenCtxWaitEvent(self, green: GreenContext, event: Event) -> None:
        pass

    def cuCtxSetCurrent(self, ctx: Context | None) -> None:
        self.current = ctx

    def _current_device(self) -> int:
        return self.current.device if self.current is not None else 0

    def cuCtxSynchronize(self, *ctx: Any) -> None:
        """Everything has completed already (cuCtxSynchronize_v2 of CUDA 13 names the context)."""

    def cuCtxGetLimit(self, limit: int) -> tuple[int]:
        defaults = {0: 1024, 1: 1 << 20, 2: 8 << 20, 3: 2, 4: 2048, 5: 0, 6: 0}
        return (defaults.get(limit, 0),)

    def cuCtxSetLimit(self, limit: int, value: int) -> None:
        pass

    def cuCtxGetCacheConfig(self) -> tuple[int]:
        return (0,)

    def cuCtxSetCacheConfig(self, config: int) -> None:
        pass

    def cuCtxGetStreamPriorityRange(self) -> tuple[int, int]:
        return (0, -5)

    def cuCtxResetPersistingL2Cache(self) -> None:
        pass

    # ---- memory --------------------------------------------------------------------------
    def cuMemAlloc(self, bytesize: int) -> tuple[int]:
        return (self.memory.alloc(bytesize, self._current_device()),)

    def cuMemAllocPitch(self, width: int, height: int, element_size: int) -> tuple[int, int]:
        if element_size not in (4, 8, 16) or width == 0 or height == 0:
            raise CudaError(errors.INVALID_VALUE, f"pitch allocation {width}x{height} of {element_size}-byte elements")
        pitch = (width + ALIGN - 1) // ALIGN * ALIGN
        return self.memory.alloc(pitch * height, self._current_device()), pitch

    def cuMemFree(self, dptr: int) -> None:
        if dptr not in self.graph_memory.allocations:  # a graph's stays its graph's (sim_graph_memory)
            self.pools.free(dptr)  # a pool's allocation too, as the driver allows

    # ---- memory pools: stream-ordered allocation (sim_pools); the work is done when queued ----------
    def cuDeviceGetDefaultMemPool(self, dev: int) -> tuple[Pool]:
        return (self.pools.default(self._device(dev)),)

    def cuDeviceSetMemPool(self, dev: int, pool: Pool) -> None:
        self.pools.set_current(self._device(dev), pool)

    def cuMemAllocAsync(self, bytesize: int, stream: Any) -> tuple[int]:
        return (self.pools.allocate(self.pools.current_of(self._current_device()), bytesize),)

    def cuMemAllocFromPoolAsync(self, bytesize: int, pool: Pool, stream: Any) -> tuple[int]:
        return (self.pools.allocate(pool, bytesize),)

    def xpuMemPoolReserve(self, pool: Pool, size: int) -> tuple[int]:
        return (self.pools.reserve(pool, size),)

    def xpuMemPoolAlloc(self, pool: Pool, dptr: int, bytesize: int, stream: Any) -> None:
        self.pools.place(pool, dptr, bytesize)

    def cuMemFreeAsync(self, dptr: int, stream: Any) -> None:
        self.cuMemFree(dptr)

    def cuMemPoolCreate(self, props: bytes) -> tuple[Pool]:
        return (self.pools.create(props),)

    def cuMemPoolDestroy(self, pool: Pool) -> None:
        self.pools.destroy(pool)

    def cuMemPoolSetAttribute(self, pool: Pool, attr: int, value: bytes) -> None:
        self.pools.set_attribute(pool, attr, value)

    def cuMemPoolGetAttribute(self, pool: Pool, attr: int) -> tuple[bytes]:
        return (self.pools.get_attribute(pool, attr),)

    def cuMemPoolTrimTo(self, pool: Pool, keep: int) -> None:
        self.pools.trim(pool, keep)

    def cuMemPoolSetAccess(self, pool: Pool, descs: bytes, count: int) -> None:
        self.pools.set_access(pool, descs, count)

    def cuMemPoolGetAccess(self, pool: Pool, location: bytes) -> tuple[int]:
        return (self.pools.get_access(pool, location),)

    # ---- virtual memory management (sim_vmm) ------------------------------------------------------
    def cuMemGetAllocationGranularity(self, prop: bytes, option: int) -> tuple[int]:
        return (self.vmm.granularity(prop),)

    def cuMemCreate(self, size: int, prop: bytes, flags: int) -> tuple[int]:
        return (self.vmm.create(size, prop, flags),)

    def cuMemRelease(self, handle: int) -> None:
        self.vmm.release(handle)

    def cuMemRetainAllocationHandle(self, address: int) -> tuple[int]:
        return (self.vmm.retain(address),)

    def cuMemGetAllocationPropertiesFromHandle(self, handle: int) -> tuple[bytes]:
        return (self.vmm.physical(handle).prop,)

    def cuMemAddressReserve(self, size: int, alignment: int, hint: int, flags: int) -> tuple[int]:
        return (self.vmm.reserve(size, alignment, hint, flags),)

    def cuMemAddressFree(self, ptr: int, size: int) -> None:
        self.vmm.free(ptr, size)

    def cuMemMap(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> None:
        self.vmm.map(ptr, size, offset, handle, flags)

    def cuMemUnmap(self, ptr: int, size: int) -> None:
        self.vmm.unmap(ptr, size)

    def cuMemSetAccess(self, ptr: int, size: int, descs: bytes, count: int) -> None:
        self.vmm.set_access(ptr, size, descs, count)

    def cuMemGetAccess(self, location: bytes, ptr: int) -> tuple[int]:
        return (self.vmm.get_access(location, ptr),)

    def cuMemGetInfo(self) -> tuple[int, int]:
        """Device-wide, as a real driver answers: every session's allocations count."""
        return self.memory_bytes - self.board.used(self._current_device()), self.memory_bytes

    def xpuDeviceStatus(self, index: int) -> tuple[dict[str, Any]]:
        """What NVML would say of the device: memory from every session, steady sensor values."""
        self._device(index)
        sessions = self.board.sessions(index)
        used = sum(sessions.values())
        clock_mhz = DEVICE_ATTRIBUTES["CLOCK_RATE"] // 1000
        return ({"memory_total": self.memory_bytes, "memory_used": used, "memory_free": self.memory_bytes - used,
                 "utilization_gpu": 0, "utilization_memory": 0, "temperature_c": SIM_TEMPERATURE_C,
                 "power_mw": SIM_POWER_MW, "clock_sm_mhz": clock_mhz, "clock_graphics_mhz": clock_mhz,
                 "clock_memory_mhz": DEVICE_ATTRIBUTES["MEMORY_CLOCK_RATE"] // 1000,
                 "processes": [[pid, size] for pid, size in sorted(sessions.items())]},)

    def library(self, name: str) -> Any:
        if not self.libraries:
            from .sim_blas import SimBlas
            from .sim_dnn_legacy import SimDnn

            blas, dnn = SimBlas(self.memory), SimDnn(self.memory, self.skip_unknown_kernels)
            dnn.handles = self.handles
            self.libraries = {"cublas": blas, "cublasLt": blas, "cudnn": dnn}
            from .sim_fft import SimFft

            self.libraries["cufft"] = SimFft(self.memory)
            from .sim_sparse import SimSparse

            self.libraries["cusparse"] = SimSparse(self.memory)
            from .sim_nccl import SimNccl

            self.libraries["nccl"] = SimNccl(self.memory, self._current_device)
            from .sim_rand import SimRand

            self.libraries["curand"] = SimRand(self.memory)
            from .sim_sparselt import SimSparseLt

            self.libraries["cusparseLt"] = SimSparseLt(self.memory)
            from .sim_solver import SolvingBlas

            solving = SolvingBlas(self.memory)  # cuBLAS with the batched solvers torch.linalg routes small batches to
            self.libraries.update(cublas=solving, cublasLt=solving, cusolver=solving.solver)
        return self.libraries.get(name)

    def xpuLibraryVersion(self, library: str) -> tuple[list[int] | None]:
        """The sim serves the math libraries at the version the call table was generated from, or
        as XPU_SIM_LIBRARY_VERSIONS says (`cudnn=9.1.0,cublas=13.0.0`: a server with older copies)."""
        lib = mathlibs.BY_NAME.get(library)
        if lib is None or self.library(lib.name) is None:
            return (None,)
        for item in filter(None, os.environ.get("XPU_SIM_LIBRARY_VERSIONS", "").split(",")):
            name, _, version = item.partition("=")
            if name.strip() == library:
                return ([int(v) for v in version.split(".")],)
        return (list(mathlibs.api(lib).VERSION),)

    def xpuCudnnGetDescriptors(self, descriptor: int, name: int, requested: int, handles: bytes | None) -> tuple[int]:
        dnn = self.library("cudnn")
        return (dnn.get_descriptors(dnn.descriptor(descriptor), name, requested, handles),)

    def xpuCudnnSetDataPointers(self, descriptor: int, count: int, pointers: bytes, by_value: bytes,
                                scalars: bytes) -> None:
        dnn = self.library("cudnn")
        dnn.set_data_pointers(dnn.descriptor(descriptor, "VARIANT_PACK_DESCRIPTOR"), count, pointers, by_value, scalars)

    def xpuCudnnExecute(self, handle: int, plan: int, count: int, workspace: int, pack: bytes) -> None:
        pointers, uids, scalars, by_value = mathlibs.execute_parts(count, pack)
        self.library("cudnn").execute_kept(handle, plan, count, pointers, uids, by_value, scalars, workspace)

    def cuMemcpyHtoD(self, dst: int, src: bytes | Incoming, count: int) -> None:
        if len(src) != count:
            raise CudaError(errors.INVALID_VALUE, f"{len(src)} bytes sent for a {count}-byte copy")
        if isinstance(src, Incoming):  # read from the data connection straight into the memory
            src.readinto(self.memory.view(dst, count))
        else:
            self.memory.write(dst, src)

    def cuMemcpyHtoDAsync(self, dst: int, src: bytes, count: int, stream: Any) -> None:
        self.cuMemcpyHtoD(dst, src, count)

    def cuMemcpyDtoH(self, src: int, count: int) -> tuple[bytes | memoryview]:
        """Large reads as a view of the memory, which the worker sends without a copy and holds unchanged until
        sent (the DMA's stand-in is the send itself); small ones as bytes."""
        if count > wire.INLINE_MAX:
            return (self.memory.view(src, count),)
        return (self.memory.read(src, count),)

    def cuMemcpyDtoHAsync(self, src: int, count: int, stream: Any) -> tuple[bytes]:
        return self.cuMemcpyDtoH(src, count)

    def cuMemcpyDtoD(self, dst: int, src: int, count: int) -> None:
        self.memory.write(dst, self.memory.read(src, count))

    def cuMemcpyDtoDAsync(self, dst: int, src: int, count: int, stream: Any) -> None:
        self.cuMemcpyDtoD(dst, src, count)

    def cuMemcpyAsync(self, dst: int, src: int, count: int, stream: Any) -> None:
        self.cuMemcpyDtoD(dst, src, count)

    def cuMemcpyPeer(self, dst: int, dst_ctx: Any, src: int, src_ctx: Any, count: int) -> None:
        self.cuMemcpyDtoD(dst, src, count)

    def cuMemcpyPeerAsync(self, dst: int, dst_ctx: Any, src: int, src_ctx: Any, count: int, stream: Any) -> None:
        self.cuMemcpyDtoD(dst, src, count)

    def memcpy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> None:
        """Device-to-device rectangle; the client splits host rows off itself."""
        if not self.memory.rect(src, src_pitch, width, height) or not self.memory.rect(dst, dst_pitch, width, height):
            return
        for row in range(height):
            self.memory.write(dst + row * dst_pitch, self.memory.read(src + row * src_pitch, width))

    def _memset(self, dst: int, value: int, size: int, count: int) -> None:
        self.memory.fill(dst, (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little"), count)

    def _memset_2d(self, dst: int, pitch: int, value: int, size: int, width: int, height: int) -> None:
        if not self.memory.rect(dst, pitch, width * size, height):
            return
        for row in range(height):
            self._memset(dst + row * pitch, value, size, width)

    def cuMemsetD8(self, dst: int, value: int, count: int, *stream: Any) -> None:
        self._memset(dst, value, 1, count)

    def cuMemsetD16(self, dst: int, value: int, count: int, *stream: Any) -> None:
        self._memset(dst, value, 2, count)

    def cuMemsetD32(self, dst: int, value: int, count: int, *stream: Any) -> None:
        self._memset(dst, value, 4, count)

    cuMemsetD8Async, cuMemsetD16Async, cuMemsetD32Async = cuMemsetD8, cuMemsetD16, cuMemsetD32

    def cuMemsetD2D8(self, dst: int, pitch: int, value: int, width: int, height: int, *stream: Any) -> None:
        self._memset_2d(dst, pitch, value, 1, width, height)

    def cuMemsetD2D16(self, dst: int, pitch: int, value: int, width: int, height: int, *stream: Any) -> None:
        self._memset_2d(dst, pitch, value, 2, width, height)

    def cuMemsetD2D32(self, dst: int, pitch: int, value: int, width: int, height: int, *stream: Any) -> None:
        self._memset_2d(dst, pitch, value, 4, width, height)

    cuMemsetD2D8Async, cuMemsetD2D16Async, cuMemsetD2D32Async = cuMemsetD2D8, cuMemsetD2D16, cuMemsetD2D32

    # ---- modules -------------------------------------------------------------------------
    def load_image(self, key: bytes, image: bytes) -> Module:
        """Load one image (an ELF cubin for this device, or PTX) uploaded by the client."""
        module = self.images.get(key)
        if module is not None:
            return module
        kind = check_module_image(image, SIM_SM)
        try:
            if kind == "elf":
                kernels, globals_ = fatbin.kernels(image), fatbin.globals_(image)
            else:
                text = bytes(image).rstrip(b"\0").decode()
                kernels, globals_ = fatbin.ptx_kernels(text), {}
        except (ValueError, UnicodeDecodeError, struct.error) as exc:
            raise CudaError(errors.INVALID_IMAGE, f"cannot read the module image: {exc}") from None
        addresses, sizes = {}, {}
        for name, (size, init) in globals_.items():
            addresses[name] = self.memory.alloc(max(size, 1), self._current_device())
            sizes[name] = size
            if init:
                self.memory.write(addresses[name], init)
        module = Module(kernels, addresses, sizes)
        self.images[key] = module
        return module

    def cuModuleUnload(self, module: Module) -> None:
        """The image's last handle is gone (the worker counts them): its variables are freed."""
        self.images = {key: m for key, m in self.images.items() if m is not module}
        for address in module.globals.values():
            self.memory.free(address)

    def get_function(self, module: Module, name: str) -> Function:
        kernel = module.kernels.get(name)
        if kernel is None:
            raise CudaError(errors.NOT_FOUND, f"no kernel named {name!r} in the module")
        return Function(module, kernel)

    def get_global(self, module: Module, name: str) -> tuple[int, int]:
        if name not in module.globals:
            raise CudaError(errors.NOT_FOUND, f"no global named {name!r} in the module")
        return module.globals[name], module.global_sizes[name]

    def cuFuncGetAttribute(self, attrib: int, func: Function) -> tuple[int]:
        defaults = {
            ENUMS["CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"]: 1024,
            ENUMS["CU_FUNC_ATTRIBUTE_NUM_REGS"]: 32,
            ENUMS["CU_FUNC_ATTRIBUTE_PTX_VERSION"]: SIM_SM,
            ENUMS["CU_FUNC_ATTRIBUTE_BINARY_VERSION"]: SIM_SM,
            ENUMS["CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"]: 49152,
        }
        return (func.attributes.get(attrib, defaults.get(attrib, 0)),)

    def cuFuncSetAttribute(self, func: Function, attrib: int, value: int) -> None:
        func.attributes[attrib] = value

    def cuFuncSetCacheConfig(self, func: Function, config: int) -> None:
        pass

    def cuKernelGetAttribute(self, attrib: int, kernel: Function, dev: int) -> tuple[int]:
        return self.cuFuncGetAttribute(attrib, kernel)

    def cuKernelSetAttribute(self, attrib: int, value: int, kernel: Function, dev: int) -> None:
        kernel.attributes[attrib] = value

    def cuKernelSetCacheConfig(self, kernel: Function, config: int, dev: int) -> None:
        pass

    def launch(self, func: Function, grid: tuple[int, int, int], block: tuple[int, int, int],
               shared: int, params: bytes) -> None:
        impl = sim_kernels.find(func.kernel.name)
        if impl is None and self.skip_unknown_kernels:
            if func.kernel.name not in self.skipped:
                self.skipped.add(func.kernel.name)
                log.warning("skipping kernel %s (no host implementation; XPU_SIM_SKIP_KERNELS)", func.kernel.name)
            return
        if impl is None:
            raise CudaError(errors.NOT_SUPPORTED, f"the sim backend has no host implementation of kernel "
                            f"{func.kernel.name!r} ({sim_kernels.demangle(func.kernel.name)}); register one "
                            f"with xpuremote.server.backends.sim_kernels.register")
        impl(sim_kernels.Launch(func.kernel, grid, block, shared, params, self.memory))

    # ---- streams and events: everything has completed by the time a call returns -------
    def cuStreamCreate(self, flags: int) -> tuple[Stream]:
        return (Stream(flags),)

    def cuStreamCreateWithPriority(self, flags: int, priority: int) -> tuple[Stream]:
        return (Stream(flags, priority),)

    def cuStreamDestroy(self, stream: Stream) -> None:
        pass

    def cuStreamQuery(self, stream: Any) -> None:
        pass

    def cuStreamSynchronize(self, stream: Any) -> None:
        pass

    def cuStreamWaitEvent(self, stream: Any, event: Event, flags: int) -> None:
        pass

    def cuEventCreate(self, flags: int) -> tuple[Event]:
        return (Event(flags),)

    def cuEventRecord(self, event: Event, stream: Any) -> None:
        event.recorded_at = time.perf_counter()

    def cuEventRecordWithFlags(self, event: Event, stream: Any, flags: int) -> None:
        self.cuEventRecord(event, stream)

    def cuEventQuery(self, event: Event) -> None:
        pass

    def cuEventSynchronize(self, event: Event) -> None:
        pass

    def cuEventDestroy(self, event: Event) -> None:
        pass

    def cuEventElapsedTime(self, start: Event, end: Event) -> tuple[float]:
        if start.recorded_at is None or end.recorded_at is None:
            raise CudaError(errors.NOT_READY if start.recorded_at else errors.INVALID_HANDLE,
                            "both events must have been recorded")
        if (start.flags | end.flags) & ENUMS["CU_EVENT_DISABLE_TIMING"]:
            raise CudaError(errors.INVALID_HANDLE, "an event was created with CU_EVENT_DISABLE_TIMING")
        return ((end.recorded_at - start.recorded_at) * 1000.0,)

    def cuProfilerStart(self) -> None:
        """Nothing to profile on the sim device."""

    def cuProfilerStop(self) -> None:
        """Nothing to profile on the sim device."""

    # ---- occupancy: what an sm_90 with the defaults above allows ---------------------------
    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, func: Function, block: int, smem: int) -> tuple[int]:
        if block <= 0:
            return (0,)
        return (max(0, min(32, 2048 // block, (233472 // smem) if smem else 32)),)

    def cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(self, func: Function, block: int, smem: int,
                                                             flags: int) -> tuple[int]:
        return self.cuOccupancyMaxActiveBlocksPerMultiprocessor(func, block, smem)

    def cuOccupancyAvailableDynamicSMemPerBlock(self, func: Function, blocks: int, block: int) -> tuple[int]:
        return (min(232448, 233472 // max(blocks, 1)),)

    # ---- the client's own requests (protocol.calls.INTERNAL) ------------------------------
    def xpuModuleLoad(self, key: bytes, image: bytes, size: int) -> tuple[Module]:
        return (self.load_image(bytes(key), bytes(image)),)

    def xpuModuleGetFunction(self, module: Module, name: str) -> tuple[Function]:
        return (self.get_function(module, name),)

    def xpuFuncGetParams(self, func: Function) -> tuple[list[list[int]]]:
        return ([[p.offset, p.size] for p in func.kernel.params],)

    def cuModuleGetGlobal(self, module: Module, name: str) -> tuple[int, int]:
        return self.get_global(module, name)

    def xpuLaunchKernel(self, func: Function, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                        shared: int, stream: Any, params: bytes, param_bytes: int, flags: int) -> None:
        if min(gx, gy, gz, bx, by, bz) < 1 or bx * by * bz > 1024:
            raise CudaError(errors.INVALID_VALUE, f"launch of grid {gx}x{gy}x{gz}, block {bx}x{by}x{bz}")
        self.launch(func, (gx, gy, gz), (bx, by, bz), shared, bytes(params))

    def xpuLaunchKernelEx(self, func: Function, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int,
                          stream: Any, params: bytes, param_bytes: int, attrs: bytes, count: int) -> None:
        """Clusters change nothing here; a launch-completion or programmatic event is recorded at once."""
        attributes = launch_attributes(attrs, count)
        cluster = cluster_size(attributes)
        if cluster > MAX_CLUSTER or (gx * gy * gz) % cluster:
            raise CudaError(errors.INVALID_CLUSTER_SIZE, f"clusters of {cluster} blocks in a grid of {gx}x{gy}x{gz}")
        events = [self.event_of(value) for ident, value in attributes if ident in EVENT_ATTRIBUTES]
        if any(not event.flags & ENUMS["CU_EVENT_DISABLE_TIMING"] for event in events):
            # cuda.h asks for one; the driver refuses a timing event so (580.159, measured on an H200)
            raise CudaError(errors.NOT_SUPPORTED, "a launch attribute's event must be made with DISABLE_TIMING")
        self.xpuLaunchKernel(func, gx, gy, gz, bx, by, bz, shared, stream, params, param_bytes, 0)
        for event in events:
            event.recorded_at = time.perf_counter()

    def event_of(self, value: bytes) -> Event:
        entry = self.handles.get(int.from_bytes(value[:8], "little"))
        if entry is None or entry[0] != "CUevent":
            raise CudaError(errors.INVALID_HANDLE, "a launch attribute names no live event")
        return entry[1]

    def xpuOccupancyMaxActiveClusters(self, func: Function, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                                      shared: int, attrs: bytes | None, count: int) -> tuple[int]:
        """As many clusters as the SMs hold blocks of this size (an H100's GPCs would hold somewhat fewer)."""
        if func is None:
            raise CudaError(errors.INVALID_HANDLE, "no function")
        cluster = cluster_size(launch_attributes(attrs, count))
        if cluster > MAX_CLUSTER:
            raise CudaError(errors.INVALID_CLUSTER_SIZE, f"clusters of {cluster} blocks (at most {MAX_CLUSTER})")
        (per_sm,) = self.cuOccupancyMaxActiveBlocksPerMultiprocessor(func, bx * by * bz, shared)
        return (DEVICE_ATTRIBUTES["MULTIPROCESSOR_COUNT"] * per_sm // cluster,)

    def xpuHostFunc(self, stream: Any, token: int) -> None:
        """The stream's earlier work is done (all work is, here): the client may run the function."""

    def xpuMemcpy2DDevice(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int,
                          stream: Any) -> None:
        self.memcpy_2d(dst, dst_pitch, src, src_pitch, width, height)

    def xpuMemcpy2DToHost(self, src: int, src_pitch: int, width: int, height: int, stream: Any) -> tuple[bytes]:
        if not self.memory.rect(src, src_pitch, width, height):
            return (b"",)
        return (b"".join(self.memory.read(src + r * src_pitch, width) for r in range(height)),)

    def xpuMemcpy2DFromHost(self, dst: int, dst_pitch: int, src: bytes, width: int, height: int,
                            stream: Any) -> None:
        if not self.memory.rect(dst, dst_pitch, width, height):
            return
        for r in range(height):
            self.memory.write(dst + r * dst_pitch, src[r * width : (r + 1) * width])
