"""Stream-ordered allocations at the client's addresses, on a GPU (xpuMemPoolReserve, xpuMemPoolAlloc).

The client places a pool's allocations itself, so that allocating waits for no answer (client/pools.py). A
driver's pool chooses its own addresses, so here a pool's ranges are addresses reserved apart from memory
(cuMemAddressReserve) and memory is mapped into them in granules of 2 MiB as allocations need it (cuMemCreate,
cuMemMap, cuMemSetAccess): a granule stays mapped while an allocation holds a byte of it, and after that as the
pool's cached memory, as a driver's pool keeps what was freed to it. A granule mapped for the first time is
zeroed before any allocation in it is the client's (it may hold what another process left there); one the
session used before holds the session's own bytes, as a driver's pool does.

Stream order: an allocation's memory is mapped when its record runs, which is before its stream reaches it. A
free records its stream's event again (one event a stream: the GPU is past every free of a stream whose event
is done); an allocation on another stream over bytes whose free is not known done waits for that event on its
stream (the driver's REUSE_ALLOW_INTERNAL_DEPENDENCIES). Cached granules over
the pool's release threshold are given back (unmapped) at the pool's next allocation, free, trim or
attribute question once the GPU is past their frees, not at the next synchronisation as the driver does.

The figures a pool answers (reserved and used memory, their high-water marks) are the driver's pool's plus
these: a pool's stream-ordered allocations are all placed ones, but a capture's (a graph's, the driver's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError

GRANULE = memprops.GRANULARITY
ALIGN = 512
A = memprops.POOL_ATTRIBUTE
DISABLE_TIMING = ENUMS["CU_EVENT_DISABLE_TIMING"]
NOT_READY = ENUMS["CUDA_ERROR_NOT_READY"]


@dataclass
class Placed:
    """What one pool holds at the client's addresses."""

    device: int
    ranges: list[tuple[int, int]] = field(default_factory=list)  # (base, size) reserved
    granules: dict[int, int] = field(default_factory=dict)  # mapped granule's address -> allocations on it
    used: int = 0
    used_high: int = 0
    reserved_high: int = 0
    threshold: int = 0  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, as the client last set it
    destroyed: bool = False

    @property
    def reserved(self) -> int:
        return len(self.granules) * GRANULE


class PlacedPools:
    """The placed allocations of one session's pools."""

    def __init__(self, ffi: Any, lib: Any, check: Callable[[int, str], None],
                 zero: Callable[[int, int], int]) -> None:
        """`zero(address, size)`: the backend's zeroing of device memory on a stream of its own (a status)."""
        self.ffi, self.lib, self.check, self.zero = ffi, lib, check, zero
        self.pools: dict[int, Placed] = {}
        self.allocations: dict[int, tuple[Placed, int]] = {}  # base -> (its pool, its rounded size)
        self.frees: dict[int, list[tuple[int, int]]] = {}  # stream -> [base, end) of frees the GPU may not be past
        self.events: dict[int, Any] = {}  # stream -> its event, recorded again at each free there

    # ---- ranges and allocations ---------------------------------------------------------------------
    def reserve(self, pool: int, size: int) -> int:
        placed = self.pools.get(pool)
        if placed is None:
            placed = self.pools[pool] = Placed(self.device_of(pool),
                                               threshold=self.attribute(pool, A["RELEASE_THRESHOLD"]))
        size = -(-size // GRANULE) * GRANULE
        address = self.ffi.new("uint64_t *")
        self.check(self.lib.cuMemAddressReserve(address, size, GRANULE, 0, 0), "cuMemAddressReserve")
        placed.ranges.append((int(address[0]), size))
        return int(address[0])

    def allocate(self, pool: int, address: int, size: int, stream: int) -> None:
        """Memory at [address, address+size) in stream order: its granules mapped (new ones zeroed), and a wait
        on `stream` for an unfinished free of its bytes on another stream."""
        placed = self.pools.get(pool)
        size = -(-size // ALIGN) * ALIGN
        if placed is None or placed.destroyed or not any(b <= address and address + size <= b + n
                                                         for b, n in placed.ranges):
            raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not inside a range of this pool")
        self.release(placed)
        granules = range(address // GRANULE * GRANULE, address + size, GRANULE)
        new = [g for g in granules if g not in placed.granules]
        self.map(placed, new)
        for g in granules:
            placed.granules[g] += 1
        self.wait_for_frees(address, address + size, stream)
        self.allocations[address] = (placed, size)
        placed.used += size
        placed.used_high = max(placed.used_high, placed.used)
        placed.reserved_high = max(placed.reserved_high, placed.reserved)

    def free(self, address: int, stream: int) -> None:
        """cuMemFreeAsync (or cuMemFree, on the legacy stream) of a placed allocation: its granules' counts
        go down; their memory stays the pool's."""
        placed, size = self.allocations.pop(address)
        event = self.events.get(stream)
        if event is None:
            made = self.ffi.new("void **")
            self.check(self.lib.cuEventCreate(made, DISABLE_TIMING), "cuEventCreate")
            event = self.events[stream] = made[0]
        self.check(self.lib.cuEventRecord(event, self.ffi.cast("void *", stream)), "cuEventRecord")
        spans = self.frees.setdefault(stream, [])
        spans.append((address, address + size))
        if len(spans) % 1024 == 0:  # a stream never waited for keeps no endless list
            self.forget_done_frees()
        for g in range(address // GRANULE * GRANULE, address + size, GRANULE):
            placed.granules[g] -= 1
        placed.used -= size
        self.release(placed)

    # ---- mapping ------------------------------------------------------------------------------------
    def map(self, placed: Placed, granules: list[int]) -> None:
        """Fresh memory under each of `granules`, zeroed; all or none (CUDA_ERROR_OUT_OF_MEMORY names it)."""
        done: list[int] = []
        try:
            for g in granules:
                self.map_one(placed.device, g)
                done.append(g)
                placed.granules[g] = 0
            for first, count in runs(granules):
                self.check(self.zero(first, count * GRANULE), "zeroing new pool memory (cuMemsetD8)")
        except CudaError:
            for g in done:
                self.lib.cuMemUnmap(g, GRANULE)
                placed.granules.pop(g, None)
            raise

    def map_one(self, device: int, address: int) -> None:
        lib, handle = self.lib, self.ffi.new("uint64_t *")
        prop = self.ffi.from_buffer(memprops.ALLOCATION_PROP.pack(memprops.PINNED, 0, memprops.ON_DEVICE, device,
                                                                  0, 0, 0, 0))
        self.check(lib.cuMemCreate(handle, GRANULE, prop, 0), "cuMemCreate (a pool's memory)")
        try:
            self.check(lib.cuMemMap(address, GRANULE, 0, handle[0], 0), "cuMemMap (a pool's memory)")
        finally:
            lib.cuMemRelease(handle[0])  # the mapping holds the memory; unmapping gives it back
        access = self.ffi.from_buffer(memprops.ACCESS_DESC.pack(memprops.ON_DEVICE, device,
                                                                memprops.ACCESS_READWRITE))
        status = lib.cuMemSetAccess(address, GRANULE, access, 1)
        if status:
            lib.cuMemUnmap(address, GRANULE)
            self.check(status, "cuMemSetAccess (a pool's memory)")

    # ---- stream order and giving back -------------------------------------------------------------------
    def wait_for_frees(self, base: int, end: int, stream: int) -> None:
        if not self.frees or (len(self.frees) == 1 and stream in self.frees):  # one stream: in order already
            return
        self.forget_done_frees()
        for other, spans in self.frees.items():
            if other != stream and any(b < end and base < e for b, e in spans):
                self.check(self.lib.cuStreamWaitEvent(self.ffi.cast("void *", stream), self.events[other], 0),
                           "cuStreamWaitEvent")

    def forget_done_frees(self) -> None:
        for stream in [s for s in self.frees if self.lib.cuEventQuery(self.events[s]) != NOT_READY]:
            del self.frees[stream]

    def pending(self, granule: int) -> bool:
        """A free of a byte of `granule` the GPU may not be past."""
        return any(b < granule + GRANULE and granule < e for spans in self.frees.values() for b, e in spans)

    def release(self, placed: Placed, keep: int | None = None) -> None:
        """Unused granules unmapped while the pool holds more than `keep` (its release threshold unless told),
        those the GPU is past the frees of."""
        keep = placed.threshold if keep is None else keep
        if placed.reserved - placed.used <= keep and not placed.destroyed:
            return
        self.forget_done_frees()
        for g in [g for g, n in placed.granules.items() if n == 0]:
            if placed.reserved <= keep and not placed.destroyed:
                break
            if self.pending(g):
                continue
            self.lib.cuMemUnmap(g, GRANULE)
            del placed.granules[g]
        if placed.destroyed and not placed.granules:
            for base, size in placed.ranges:
                self.lib.cuMemAddressFree(base, size)
            placed.ranges.clear()

    def device_of(self, pool: int) -> int:
        """The pool's device: its LOCATION_ID where the driver answers it, else the current context's (the 580
        driver of an H200 refused the attribute; a pool of another device is then mapped on this one)."""
        try:
            return self.attribute(pool, A["LOCATION_ID"])
        except CudaError:
            device = self.ffi.new("int *")
            self.check(self.lib.cuCtxGetDevice(device), "cuCtxGetDevice")
            return int(device[0])

    # ---- the pool's calls -----------------------------------------------------------------------------
    def attribute(self, pool: int, attr: int) -> int:
        value = self.ffi.new("uint64_t *")
        self.check(self.lib.cuMemPoolGetAttribute(self.ffi.cast("void *", pool), attr, value), "cuMemPoolGetAttribute")
        return int(value[0]) & ((1 << 8 * memprops.POOL_ATTRIBUTE_SIZES[attr]) - 1)

    def figure(self, pool: int, attr: int, driver: int) -> int:
        """The driver's answer for its pool, with what is placed added (the four memory figures)."""
        placed = self.pools.get(pool)
        if placed is None:
            return driver
        self.release(placed)
        extra = {A["RESERVED_MEM_CURRENT"]: placed.reserved, A["RESERVED_MEM_HIGH"]: placed.reserved_high,
                 A["USED_MEM_CURRENT"]: placed.used, A["USED_MEM_HIGH"]: placed.used_high}
        return driver + extra.get(attr, 0)

    def set_attribute(self, pool: int, attr: int, value: int) -> None:
        placed = self.pools.get(pool)
        if placed is None:
            return
        if attr == A["RELEASE_THRESHOLD"]:
            placed.threshold = value
            self.release(placed)
        elif attr == A["RESERVED_MEM_HIGH"]:
            placed.reserved_high = placed.reserved
        elif attr == A["USED_MEM_HIGH"]:
            placed.used_high = placed.used

    def trim(self, pool: int, keep: int) -> None:
        if pool in self.pools:
            self.release(self.pools[pool], keep)

    def destroy(self, pool: int) -> None:
        """Its cached memory goes now, the rest as its allocations are freed."""
        placed = self.pools.pop(pool, None)
        if placed is not None:
            placed.destroyed = True
            self.release(placed)


def runs(granules: list[int]) -> list[tuple[int, int]]:
    """(first, count) of each run of adjacent granules."""
    out: list[tuple[int, int]] = []
    for g in granules:
        if out and out[-1][0] + out[-1][1] * GRANULE == g:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((g, 1))
    return out
