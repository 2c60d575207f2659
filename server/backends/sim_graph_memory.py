"""Graph memory on the sim device: what allocation nodes allocate, and the device's graph memory attributes.

An allocation node's address is fixed when the node is made, for the life of its graph and of the
instantiations made from it (the driver's rule), so the sim backs it with device memory for that whole
time; a free of it, in the graph or after a launch, leaves the bytes where they are, as a GPU's driver
leaves the address reserved. The attributes count as the driver's: an instantiation's allocations are
associated with graphs (USED) from its first launch until it is destroyed, and their memory stays reserved
(RESERVED) until cuDeviceGraphMemTrim; a later launch reuses what is reserved. The driver maps device memory
in pages of 2 MiB, and so does this count.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.errors import CudaError

# CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, _USED_MEM_HIGH, _RESERVED_MEM_CURRENT, _RESERVED_MEM_HIGH: cuda.h gives
# them no explicit values, and the generated ENUMS hold explicit ones only
USED, USED_HIGH, RESERVED, RESERVED_HIGH = ATTRIBUTES = (0, 1, 2, 3)


@dataclass(eq=False)
class GraphAllocation:
    address: int
    size: int
    device: int
    holders: int = 1  # the graph that made it, and the instantiations made from that graph


@dataclass
class DeviceCounts:
    used: int = 0
    used_high: int = 0
    reserved: int = 0
    reserved_high: int = 0


@dataclass
class GraphMemory:
    memory: Any  # the sim's device memory (sim.Memory)
    allocations: dict[int, GraphAllocation] = field(default_factory=dict)  # by address
    counts: dict[int, DeviceCounts] = field(default_factory=lambda: defaultdict(DeviceCounts))

    def allocate(self, device: int, size: int) -> GraphAllocation:
        if size <= 0:
            raise CudaError(errors.INVALID_VALUE, f"a graph allocation of {size} bytes")
        alloc = GraphAllocation(self.memory.alloc(size, device), size, device)
        self.allocations[alloc.address] = alloc
        return alloc

    def hold(self, allocations: list[GraphAllocation]) -> None:
        for a in allocations:
            a.holders += 1

    def release(self, allocations: list[GraphAllocation]) -> None:
        """The graph or an instantiation that held these is gone; the last one frees their memory."""
        for a in allocations:
            a.holders -= 1
            if a.holders == 0:
                del self.allocations[a.address]
                self.memory.free(a.address)

    def launched(self, allocations: list[GraphAllocation]) -> None:
        """An instantiation's first launch: its allocations are associated with graphs from now on."""
        for device, pages in _pages(allocations).items():
            c = self.counts[device]
            c.used += pages
            c.reserved = max(c.reserved, c.used)
            c.used_high, c.reserved_high = max(c.used_high, c.used), max(c.reserved_high, c.reserved)

    def unlaunched(self, allocations: list[GraphAllocation]) -> None:
        """A launched instantiation is destroyed: its memory stays reserved until a trim."""
        for device, pages in _pages(allocations).items():
            self.counts[device].used -= pages

    def attribute(self, device: int, attr: int) -> int:
        c = self.counts[device]
        return (c.used, c.used_high, c.reserved, c.reserved_high)[_checked(attr, ATTRIBUTES)]

    def reset_high(self, device: int, attr: int, value: int) -> None:
        """Only the high watermarks may be set, and only to 0: they become the current amounts."""
        if value:
            raise CudaError(errors.INVALID_VALUE, f"graph memory attribute {attr} can only be reset, to 0")
        c = self.counts[device]
        if _checked(attr, (USED_HIGH, RESERVED_HIGH)) == 0:
            c.used_high = c.used
        else:
            c.reserved_high = c.reserved

    def trim(self, device: int) -> None:
        c = self.counts[device]
        c.reserved = c.used


def _checked(attr: int, allowed: tuple[int, ...]) -> int:
    if attr not in allowed:
        raise CudaError(errors.INVALID_VALUE, f"graph memory attribute {attr}")
    return allowed.index(attr)


def _pages(allocations: list[GraphAllocation]) -> dict[int, int]:
    """Bytes per device, each allocation in whole pages."""
    pages: dict[int, int] = defaultdict(int)
    for a in allocations:
        pages[a.device] += -(-a.size // memprops.GRANULARITY) * memprops.GRANULARITY
    return pages
