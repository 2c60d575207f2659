"""The sim's virtual memory management (VMM): device address ranges reserved without memory, physical
allocations, and mappings of the one into the other.

Modelled with the host's own page mapping, because that is what VMM is: a mapping must make
[address, address+size) read and write the physical allocation's bytes, two mappings of one allocation
must alias, and a copy or a kernel that runs over adjacent mappings must see one contiguous range
(PyTorch's expandable segments map one physical allocation after another and place tensors across
them). So each reservation is a range of this worker's address space, inaccessible until mapped;
each physical allocation a memfd, zero-filled when made; and cuMemMap maps the memfd's pages into
the reservation (mmap MAP_SHARED | MAP_FIXED), where the kernel keeps them aliased and contiguous.

Device addresses are sim.Memory's: a mapping becomes one of its allocations, whose bytes are a window
on the reservation's host range, and Memory checks every access against them (it never touches a page
that is not mapped). This module keeps the driver's rules: sizes and offsets in whole granules, a
mapping inside one reservation and over no other, handles that live until released and unmapped.
"""

from __future__ import annotations

import bisect
import ctypes
import itertools
import mmap
import os
import resource
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.errors import CudaError

if TYPE_CHECKING:
    from .sim import Memory

GRANULARITY = memprops.GRANULARITY
PROT_NONE, MAP_FIXED, MAP_NORESERVE = 0, 0x10, 0x4000  # Linux's values, which the mmap module does not export
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


def _mmap(address: int | None, size: int, prot: int, flags: int, fd: int = -1, offset: int = 0) -> int:
    """libc's mmap; a failure (the host out of address space or memory) is the device's OUT_OF_MEMORY."""
    got = _libc.mmap(address, size, prot, flags, fd, offset)
    if got in (None, MAP_FAILED):
        raise CudaError(errors.OUT_OF_MEMORY, f"the sim could not map {size} bytes: {os.strerror(ctypes.get_errno())}")
    return got


class HostRange:
    """A range of this process's address space that holds nothing until pages are mapped into it."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.address = _mmap(None, size, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)

    def map(self, offset: int, size: int, fd: int, fd_offset: int) -> None:
        _mmap(self.address + offset, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED, fd, fd_offset)

    def clear(self, offset: int, size: int) -> None:
        """Back to holding nothing: the pages mapped there are dropped (the memfd keeps its own)."""
        _mmap(self.address + offset, size, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE)

    def view(self, offset: int, size: int) -> memoryview:
        """The bytes at [offset, offset+size): only for pages that are mapped (others would fault)."""
        return memoryview((ctypes.c_char * size).from_address(self.address + offset)).cast("B")

    def close(self) -> None:
        _libc.munmap(self.address, self.size)


@cache
def _allow_open_files() -> None:
    """Each physical allocation holds a descriptor: let the worker have as many as the system allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


@dataclass(eq=False)
class Physical:
    """A cuMemCreate allocation: memory with no address, reachable only through its mappings."""

    handle: int
    size: int
    device: int
    prop: bytes  # the CUmemAllocationProp it was made with (cuMemGetAllocationPropertiesFromHandle)
    fd: int = -1
    refs: int = 1  # handles the application holds: cuMemCreate's and each cuMemRetainAllocationHandle's
    mappings: int = 0

    def open(self) -> None:
        _allow_open_files()
        try:
            self.fd = os.memfd_create(f"xpu-sim-vmm-{self.handle:x}", os.MFD_CLOEXEC)
            os.ftruncate(self.fd, self.size)  # sparse: host memory is taken as pages are first written
        except OSError as exc:
            self.close()
            raise CudaError(errors.OUT_OF_MEMORY, f"the sim could not make {self.size} bytes: {exc}") from None

    @property
    def alive(self) -> bool:
        """Memory lives while a handle to it or a mapping of it does (cuMemRelease's rule)."""
        return self.refs > 0 or self.mappings > 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(eq=False)
class Mapping:
    """[base, base+size) of a reservation showing [offset, offset+size) of a physical allocation."""

    base: int
    size: int
    physical: Physical
    offset: int
    reservation: Reservation
    access: dict[int, int] = field(default_factory=dict)  # device -> CUmemAccess_flags, from cuMemSetAccess

    @property
    def accessible(self) -> bool:
        """A GPU faults on mapped memory whose access was never set; the sim refuses it instead. (It has no
        per-device view of memory, so any device's access counts, and read-only is not told from read-write.)"""
        return any(self.access.values())


@dataclass(eq=False)
class Reservation:
    """cuMemAddressReserve's range of device addresses, backed by a host range of the same size."""

    base: int
    size: int
    host: HostRange
    mappings: dict[int, Mapping] = field(default_factory=dict)  # by device address

    def view(self, address: int, size: int) -> memoryview:
        return self.host.view(address - self.base, size)

    def inside(self, address: int, size: int) -> list[Mapping]:
        """The mappings that [address, address+size) overlaps, by address."""
        return sorted((m for m in self.mappings.values() if m.base < address + size and address < m.base + m.size),
                      key=lambda m: m.base)


class VirtualMemory:
    """The driver's VMM calls over sim.Memory, for one session."""

    def __init__(self, memory: Memory, check_device: Callable[[int], int]) -> None:
        self.memory = memory
        self.check_device = check_device  # raises INVALID_DEVICE for an ordinal the sim does not have
        self.bases: list[int] = []
        self.reservations: dict[int, Reservation] = {}
        self.handles: dict[int, Physical] = {}  # the live handles, by value
        # handle values: opaque numbers, as the driver's are, from a random start (as the sim's addresses are),
        # so that another session's handle names nothing here rather than one of this session's
        self.numbers = itertools.count((1 << 40) + (secrets.randbelow(1 << 30) << 8), 16)

    # ---- physical memory ---------------------------------------------------------------------------
    def granularity(self, prop: bytes) -> int:
        self.check_prop(prop)
        return GRANULARITY

    def create(self, size: int, prop: bytes, flags: int) -> int:
        device = self.check_prop(prop)
        if flags or size <= 0 or size % GRANULARITY:
            raise CudaError(errors.INVALID_VALUE, f"cuMemCreate of {size} bytes (flags {flags}): sizes are whole "
                            f"granules of {GRANULARITY} bytes")
        physical = Physical(next(self.numbers), size, device, bytes(prop))
        self.memory.charge(device, size)
        try:
            physical.open()
        except CudaError:
            self.memory.discharge(device, size)
            raise
        self.handles[physical.handle] = physical
        return physical.handle

    def check_prop(self, prop: bytes) -> int:
        """The device a CUmemAllocationProp places memory on, or the driver's error for it."""
        kind, handle_types, location_type, device, win32, *_ = memprops.ALLOCATION_PROP.unpack(bytes(prop))
        if win32 or kind != memprops.PINNED or location_type != memprops.ON_DEVICE:
            raise CudaError(errors.INVALID_VALUE, "the sim makes pinned device memory (CUmemAllocationProp)")
        if handle_types != memprops.NO_HANDLES:
            raise CudaError(errors.NOT_SUPPORTED, memprops.export_refusal(handle_types))
        return self.check_device(device)

    def physical(self, handle: int) -> Physical:
        found = self.handles.get(handle)
        if found is None:
            raise CudaError(errors.INVALID_VALUE, f"{handle:#x} is not a live allocation handle")
        return found

    def release(self, handle: int) -> None:
        physical = self.physical(handle)
        physical.refs -= 1
        if physical.refs == 0:
            del self.handles[handle]
            self._end_if_unused(physical)

    def retain(self, address: int) -> int:
        """The handle of the physical allocation mapped at `address`, held once more."""
        physical = self.mapping_at(address).physical
        physical.refs += 1
        self.handles[physical.handle] = physical
        return physical.handle

    def _end_if_unused(self, physical: Physical) -> None:
        if not physical.alive:
            physical.close()
            self.memory.discharge(physical.device, physical.size)

    # ---- address ranges ------------------------------------------------------------------------
    def reserve(self, size: int, alignment: int, hint: int, flags: int) -> int:
        """A range of addresses with nothing behind them. The hint (a wanted address) is only that: the sim
        places every range itself, as far as a hint goes the driver may too."""
        if flags or size <= 0 or size % GRANULARITY or alignment & (alignment - 1):
            raise CudaError(errors.INVALID_VALUE, f"cuMemAddressReserve of {size} bytes aligned to {alignment}: "
                            f"sizes are whole granules of {GRANULARITY} bytes, alignments powers of two")
        base = self.memory.take(size, max(alignment, GRANULARITY))
        self.reservations[base] = Reservation(base, size, HostRange(size))
        bisect.insort(self.bases, base)
        return base

    def free(self, address: int, size: int) -> None:
        reservation = self.reservations.get(address)
        if reservation is None or reservation.size != size:
            raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not a range cuMemAddressReserve made")
        if reservation.mappings:
            raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) still has mappings: unmap them first")
        reservation.host.close()
        del self.reservations[address]
        self.bases.remove(address)

    def reservation(self, address: int, size: int) -> Reservation:
        """The reservation holding [address, address+size)."""
        i = bisect.bisect_right(self.bases, address) - 1
        if i >= 0:
            found = self.reservations[self.bases[i]]
            if address + size <= found.base + found.size:
                return found
        raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not inside one reserved address range")

    # ---- mappings --------------------------------------------------------------------------------
    def map(self, address: int, size: int, offset: int, handle: int, flags: int) -> None:
        physical = self.physical(handle)
        if flags or size <= 0 or (address | size | offset) % GRANULARITY or offset + size > physical.size:
            raise CudaError(errors.INVALID_VALUE, f"cuMemMap of {size} bytes at offset {offset} of a {physical.size}"
                            f"-byte allocation to {address:#x}: whole granules of {GRANULARITY}, inside the allocation")
        reservation = self.reservation(address, size)
        if reservation.inside(address, size):
            raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is already mapped, in part or whole")
        reservation.host.map(address - reservation.base, size, physical.fd, offset)
        mapping = Mapping(address, size, physical, offset, reservation)
        reservation.mappings[address] = mapping
        physical.mappings += 1
        self.memory.add_mapping(mapping, reservation.view(address, size))

    def unmap(self, address: int, size: int) -> None:
        """Every mapping in [address, address+size), which must hold whole mappings and start with one."""
        reservation = self.reservation(address, size)
        mappings = reservation.inside(address, size)
        if not mappings or mappings[0].base != address or any(m.base + m.size > address + size for m in mappings):
            raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not a range of whole mappings")
        for mapping in mappings:
            self._unmap(mapping)

    def _unmap(self, mapping: Mapping) -> None:
        self.memory.remove_mapping(mapping.base)
        reservation = mapping.reservation
        reservation.host.clear(mapping.base - reservation.base, mapping.size)
        del reservation.mappings[mapping.base]
        mapping.physical.mappings -= 1
        self._end_if_unused(mapping.physical)

    def mapping_at(self, address: int) -> Mapping:
        alloc = self.memory.allocation_at(address)
        if alloc is None or alloc.mapping is None:
            raise CudaError(errors.INVALID_VALUE, f"{address:#x} is not mapped memory")
        return alloc.mapping

    # ---- access --------------------------------------------------------------------------------
    def set_access(self, address: int, size: int, descs: bytes, count: int) -> None:
        """Each mapping of [address, address+size), which mappings must cover without a gap."""
        reservation = self.reservation(address, size)
        mappings, reach = reservation.inside(address, size), address
        for mapping in mappings:
            if mapping.base > reach:
                break
            reach = mapping.base + mapping.size
        if not mappings or mappings[0].base > address or reach < address + size:
            raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not all mapped")
        wanted = [(self.location_device(kind, device), flags) for kind, device, flags in memprops.access_descs(descs)]
        if len(wanted) != count or any(flags not in VALID_ACCESS for _, flags in wanted):
            raise CudaError(errors.INVALID_VALUE, f"{count} access descriptors with flags {[f for _, f in wanted]}")
        for mapping in mappings:
            mapping.access.update(wanted)

    def get_access(self, location: bytes, address: int) -> int:
        device = self.location_device(*memprops.LOCATION.unpack(bytes(location)))
        return self.mapping_at(address).access.get(device, memprops.ACCESS_NONE)

    def location_device(self, kind: int, device: int) -> int:
        if kind != memprops.ON_DEVICE:
            raise CudaError(errors.INVALID_VALUE, f"location type {kind}: the sim's memory is a device's")
        return self.check_device(device)

    def close(self) -> None:
        """The session is over: every mapping, range and allocation goes."""
        for reservation in list(self.reservations.values()):
            for mapping in list(reservation.mappings.values()):
                self._unmap(mapping)
            reservation.host.close()
        for physical in self.handles.values():
            physical.close()
        self.reservations.clear()
        self.bases.clear()
        self.handles.clear()


VALID_ACCESS = (memprops.ACCESS_NONE, memprops.ACCESS_READ, memprops.ACCESS_READWRITE)
