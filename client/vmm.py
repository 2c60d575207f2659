"""Virtual memory management (VMM): address ranges reserved apart from memory, physical allocations,
and mappings of the one into the other (PyTorch's expandable segments).

Reserving addresses and creating physical memory wait for the server's answer (one round trip each);
mapping, setting access, unmapping, releasing and freeing a range are queued, once checked here against
what the client was answered, so that they fail at once where the driver would. Allocation handles are
the server's values, kept as they are. A mapped range is device memory: it joins the device map (pointer
attributes, unified copies) at cuMemMap and leaves it at cuMemUnmap; an address that is only reserved is
not memory. Memory that could be exported to another process is not made, and the export and import
calls are refused: that process would have to be on the server's machine.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.calls import Call
from xpuremote.protocol.errors import CudaError

from . import marshal
from .driver import Driver, implements
from .memory import Range, RangeMap, forward_with, maps, record_device, to_client, to_server


@dataclass
class Physical:
    size: int
    device: int  # the application's ordinal
    refs: int = 1  # handles the application holds: cuMemCreate's and each cuMemRetainAllocationHandle's
    mappings: int = 0


@dataclass
class VmmState:
    reserved: RangeMap = field(default_factory=RangeMap)
    physical: dict[int, Physical] = field(default_factory=dict)  # by the server's handle value


def vmm(d: Driver) -> VmmState:
    if "vmm" not in d.state:
        d.state["vmm"] = VmmState()
    return d.state["vmm"]


def checked_prop(d: Driver, call: Call, address: int) -> bytes:
    """The application's CUmemAllocationProp as the server gets it: not exportable (memprops.without_fd_export),
    refused here with the reason said once, and with its device ordinal the server's."""
    data = sendable(d, call, memprops.ALLOCATION_PROP, marshal.read(address, memprops.ALLOCATION_PROP.size))
    try:
        memprops.check_allocation_prop(data)
    except CudaError as exc:
        d.say_once(f"prop {exc.detail}", "%s refused: %s", call.family, exc.detail)
        if "location type" in exc.detail and nccl_loaded():
            say_nccl_unsupported(d)
        raise
    return to_server(d, memprops.ALLOCATION_PROP, data, 3)


NCCL_LIBRARY = "libnccl.so.2"
CORE = "libxpuremote-core.so"  # beside xpuremote's libnccl.so.2 (interpose/build.py)


def nccl_loaded() -> bool:
    """Whether NVIDIA's NCCL is mapped in this process (PyTorch's CUDA library links it), not xpuremote's (which
    xpu-run preloads, beside the client core). Read from the process's maps, not dlopen(RTLD_NOLOAD), which looks
    only in the client's own link namespace; asked only on a refusal."""
    try:
        with open("/proc/self/maps") as maps_file:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps_file if line.rstrip().endswith(NCCL_LIBRARY)}
    except OSError:
        return False
    return any(p.endswith("/" + NCCL_LIBRARY) and not os.path.exists(os.path.join(os.path.dirname(p), CORE))
               for p in paths)


def say_nccl_unsupported(d: Driver) -> None:
    """Host-memory VMM is what an NCCL communicator asks for first (its host buffers, at init): say plainly,
    once, that NCCL cannot work through xpuremote, before its later failures (its memory registration,
    its kernels) surface as bare CUDA errors."""
    d.say_once("nccl", "NVIDIA's NCCL (%s) is loaded in this process instead of xpuremote's, which xpu-run "
               "preloads: a communicator made here maps host memory and peer memory for the GPU, and a GPU across "
               "the network cannot reach either, so its calls fail; run the program under xpu-run, which forwards "
               "NCCL to the server", NCCL_LIBRARY, level=logging.ERROR)


def sendable(d: Driver, call: Call, layout: struct.Struct, data: bytes) -> bytes:
    """`data` without a request to export memory as a file descriptor, said once when there was one."""
    kept = memprops.without_fd_export(layout, data)
    if kept != data:
        d.say_once(f"fd-export {call.family}", "%s asks for memory exportable as a file descriptor: made unexportable "
                   "(another process would have to run on the server's machine to import it)", call.family,
                   level=logging.INFO)
    return kept


def held(d: Driver, handle: int) -> Physical:
    physical = vmm(d).physical.get(handle)
    if physical is None or physical.refs == 0:
        raise CudaError(errors.INVALID_VALUE, f"{handle:#x} is not a live allocation handle")
    return physical


def mappings_in(d: Driver, address: int, size: int) -> list[Range]:
    """The mappings that start inside [address, address+size), by address."""
    devices = maps(d)[0]
    first, last = bisect.bisect_left(devices.bases, address), bisect.bisect_left(devices.bases, address + size)
    return [r for r in (devices.ranges[b] for b in devices.bases[first:last]) if r.handle is not None]


def reservation_of(d: Driver, address: int, size: int) -> Range:
    r = vmm(d).reserved.find(address)
    if r is None or address + size > r.base + r.size:
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not inside one reserved address range")
    return r


# ---- physical memory -------------------------------------------------------------------------------
@implements("cuMemCreate")
def cu_mem_create(d: Driver, call: Call, args: list[Any]) -> None:
    address, size, prop, _flags = args
    forward_with(d, call, args, 2, checked_prop(d, call, prop))
    device = memprops.ALLOCATION_PROP.unpack(marshal.read(prop, memprops.ALLOCATION_PROP.size))[3]
    vmm(d).physical[marshal.get(call.params[0], address)] = Physical(size, device)


@implements("cuMemGetAllocationGranularity")
def cu_mem_get_allocation_granularity(d: Driver, call: Call, args: list[Any]) -> None:
    forward_with(d, call, args, 1, checked_prop(d, call, args[1]))


@implements("cuMemRelease")
def cu_mem_release(d: Driver, call: Call, args: list[Any]) -> None:
    (handle,) = args
    physical = held(d, handle)
    d.forward(call, args)
    physical.refs -= 1
    forget_if_unused(d, handle)


def forget_if_unused(d: Driver, handle: int) -> None:
    physical = vmm(d).physical[handle]
    if physical.refs == 0 and physical.mappings == 0:
        del vmm(d).physical[handle]


@implements("cuMemRetainAllocationHandle")
def cu_mem_retain_allocation_handle(d: Driver, call: Call, args: list[Any]) -> None:
    address, where = args
    r = maps(d)[0].find(where)
    if r is None or r.handle is None:
        raise CudaError(errors.INVALID_VALUE, f"{where:#x} is not mapped memory")
    d.forward(call, args)
    vmm(d).physical[r.handle].refs += 1


@implements("cuMemGetAllocationPropertiesFromHandle")
def cu_mem_get_allocation_properties_from_handle(d: Driver, call: Call, args: list[Any]) -> None:
    prop, handle = args
    held(d, handle)
    d.forward(call, args)
    data = marshal.read(prop, memprops.ALLOCATION_PROP.size)
    marshal.write(prop, to_client(d, memprops.ALLOCATION_PROP, data, 3))


# ---- address ranges -------------------------------------------------------------------------------
@implements("cuMemAddressReserve")
def cu_mem_address_reserve(d: Driver, call: Call, args: list[Any]) -> None:
    address, size = args[0], args[1]
    d.forward(call, args)
    vmm(d).reserved.add(Range(marshal.get(call.params[0], address), size, 0, 0))


@implements("cuMemAddressFree")
def cu_mem_address_free(d: Driver, call: Call, args: list[Any]) -> None:
    address, size = args
    r = vmm(d).reserved.ranges.get(address)
    if r is None or r.size != size:
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not a range cuMemAddressReserve made")
    if mappings_in(d, address, size):
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) still has mappings: unmap them first")
    d.forward(call, args)
    vmm(d).reserved.remove(address)


# ---- mappings -----------------------------------------------------------------------------------
@implements("cuMemMap")
def cu_mem_map(d: Driver, call: Call, args: list[Any]) -> None:
    address, size, offset, handle, _flags = args
    physical = held(d, handle)
    reservation_of(d, address, size)
    if offset + size > physical.size:
        raise CudaError(errors.INVALID_VALUE, f"{size} bytes at offset {offset} of a {physical.size}-byte allocation")
    if maps(d)[0].find(address) or mappings_in(d, address, size):
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is mapped already")
    d.forward(call, args)
    physical.mappings += 1
    record_device(d, address, size, physical.device, handle=handle, access=memprops.ACCESS_NONE)


@implements("cuMemUnmap")
def cu_mem_unmap(d: Driver, call: Call, args: list[Any]) -> None:
    address, size = args
    mappings = mappings_in(d, address, size)
    if not mappings or mappings[0].base != address or mappings[-1].base + mappings[-1].size > address + size:
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not a range of whole mappings")
    d.forward(call, args)
    for r in mappings:
        maps(d)[0].remove(r.base)
        vmm(d).physical[r.handle].mappings -= 1
        forget_if_unused(d, r.handle)


@implements("cuMemSetAccess")
def cu_mem_set_access(d: Driver, call: Call, args: list[Any]) -> None:
    address, size, descs, count = args
    mappings = covering(d, address, size)
    data = marshal.read(descs, count * memprops.ACCESS_DESC.size)
    forward_with(d, call, args, 2, to_server(d, memprops.ACCESS_DESC, data, 1))
    for kind, device, flags in memprops.access_descs(data):
        for r in mappings:
            if kind == memprops.ON_DEVICE and device == r.device:
                r.access = flags


def covering(d: Driver, address: int, size: int) -> list[Range]:
    """The mappings over [address, address+size), which they must cover without a gap."""
    first = maps(d)[0].find(address)
    mappings = ([first] if first is not None and first.handle is not None and first.base < address else []) + \
        mappings_in(d, address, size)
    reach = address
    for r in mappings:
        if r.base > reach:
            break
        reach = r.base + r.size
    if reach < address + size:
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not all mapped memory")
    return mappings


@implements("cuMemGetAccess")
def cu_mem_get_access(d: Driver, call: Call, args: list[Any]) -> None:
    flags, location, address = args
    covering(d, address, 1)
    forward_with(d, call, args, 1, to_server(d, memprops.LOCATION, marshal.read(location, memprops.LOCATION.size), 1))


# ---- what would leave the server's machine ---------------------------------------------------------
@implements("cuMemExportToShareableHandle", "cuMemImportFromShareableHandle", "cuMemPoolExportToShareableHandle",
            "cuMemPoolImportFromShareableHandle", "cuMemPoolExportPointer", "cuMemPoolImportPointer",
            "cuMemGetHandleForAddressRange")
def cu_mem_share(d: Driver, call: Call, args: list[Any]) -> None:
    d.say_once(call.family, "%s is refused: device memory cannot be shared with another process across the network "
               "(it would have to run on the server's machine)", call.family)
    raise CudaError(errors.NOT_SUPPORTED, f"{call.family}: memory is not shared across the network")
