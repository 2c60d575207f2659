"""The sim's memory pools (stream-ordered allocation): a default pool per device, pools the client
creates, each device's current pool, and what each pool holds.

A pool's allocations are sim.Memory's own (a fresh zero-filled buffer at a new address each); the pool
adds the driver's bookkeeping around them. Bytes freed to a pool stay reserved by it (device memory in
use, as cuMemGetInfo shows) until its release threshold or cuMemPoolTrimTo gives them back, and a
later allocation reuses them. The sim's work is done by the time it is queued, so the release that
CUDA makes at the next synchronisation is made at the free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xpuremote.protocol import errors, memprops
from xpuremote.protocol.errors import CudaError

if TYPE_CHECKING:
    from .sim import Memory

ALIGN = 512  # pool allocations are counted in the driver's allocation granule
A = memprops.POOL_ATTRIBUTE
REUSE = (A["REUSE_FOLLOW_EVENT_DEPENDENCIES"], A["REUSE_ALLOW_OPPORTUNISTIC"], A["REUSE_ALLOW_INTERNAL_DEPENDENCIES"])


@dataclass(eq=False)
class Pool:
    device: int
    props: bytes  # CUmemPoolProps
    default: bool = False
    reuse: dict[int, int] = field(default_factory=lambda: dict.fromkeys(REUSE, 1))  # the three switches, all on
    threshold: int = 0  # CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    used: int = 0  # bytes of live allocations
    cached: int = 0  # bytes freed to the pool and kept for reuse
    used_high: int = 0
    reserved_high: int = 0
    access: dict[int, int] = field(default_factory=dict)  # other devices' CUmemAccess_flags
    destroyed: bool = False  # its memory goes with its last allocation
    ranges: list[tuple[int, int]] = field(default_factory=list)  # (base, size): where the client places allocations

    @property
    def reserved(self) -> int:
        return self.used + self.cached

    @property
    def max_size(self) -> int:
        return memprops.POOL_PROPS.unpack(self.props)[5]


class Pools:
    """The driver's pool calls over sim.Memory, for one session."""

    def __init__(self, memory: Memory, check_device: Callable[[int], int]) -> None:
        self.memory = memory
        self.check_device = check_device  # raises INVALID_DEVICE for an ordinal the sim does not have
        self.defaults: dict[int, Pool] = {}
        self.current: dict[int, Pool] = {}  # set by cuDeviceSetMemPool; the default otherwise

    def default(self, device: int) -> Pool:
        if device not in self.defaults:
            self.check_device(device)
            props = memprops.POOL_PROPS.pack(memprops.PINNED, memprops.NO_HANDLES, memprops.ON_DEVICE, device,
                                             0, 0, 0, 0)
            self.defaults[device] = Pool(device, props, default=True)
        return self.defaults[device]

    def current_of(self, device: int) -> Pool:
        return self.current.get(device) or self.default(device)

    def set_current(self, device: int, pool: Pool) -> None:
        if pool.device != device:
            raise CudaError(errors.INVALID_VALUE, f"the pool is device {pool.device}'s, not device {device}'s")
        self.current[device] = pool

    def create(self, props: bytes) -> Pool:
        kind, handle_types, location_type, device, win32, *_ = memprops.POOL_PROPS.unpack(bytes(props))
        if handle_types != memprops.NO_HANDLES:
            raise CudaError(errors.NOT_SUPPORTED, memprops.export_refusal(handle_types))
        if win32 or kind != memprops.PINNED or location_type != memprops.ON_DEVICE:
            raise CudaError(errors.INVALID_VALUE, "the sim's pools hold pinned device memory (CUmemPoolProps)")
        return Pool(self.check_device(device), bytes(props))

    def destroy(self, pool: Pool) -> None:
        """Its cached bytes go now, its allocations when they are freed (as the driver's do)."""
        if pool.default:
            raise CudaError(errors.INVALID_VALUE, "a device's default pool cannot be destroyed")
        pool.destroyed = True
        self._give_back(pool, pool.cached)
        if self.current.get(pool.device) is pool:
            del self.current[pool.device]

    # ---- allocations ---------------------------------------------------------------------------
    def allocate(self, pool: Pool, size: int) -> int:
        """An allocation at an address of the sim's choosing (cuMemAllocAsync: in a capture, or a hand-made
        client's)."""
        return self._counted(pool, size, lambda size: self.memory.alloc(size, pool.device, pool))

    def reserve(self, pool: Pool, size: int) -> int:
        """Addresses for the client to place the pool's allocations in (xpuMemPoolReserve): not memory yet."""
        if pool.destroyed or size <= 0:
            raise CudaError(errors.INVALID_VALUE, f"a range of {size} bytes, for a pool that is destroyed or of none")
        base = self.memory.take(size, memprops.GRANULARITY)
        pool.ranges.append((base, size))
        return base

    def place(self, pool: Pool, address: int, size: int) -> None:
        """An allocation at the client's address (xpuMemPoolAlloc), inside a range reserved for this pool."""
        rounded = -(-size // ALIGN) * ALIGN
        if pool.destroyed or address % ALIGN or not any(
                base <= address and address + rounded <= base + length for base, length in pool.ranges):
            raise CudaError(errors.INVALID_VALUE, f"[{address:#x}, +{size}) is not inside a range of this pool")

        def make(size: int) -> int:
            self.memory.place(address, size, pool.device, pool)
            return address
        self._counted(pool, size, make)

    def _counted(self, pool: Pool, size: int, make: Callable[[int], int]) -> int:
        """`make(size)` with the pool's bookkeeping: its cached bytes reused first, its limit, its watermarks."""
        size = -(-size // ALIGN) * ALIGN
        if pool.max_size and pool.used + size > pool.max_size:
            raise CudaError(errors.OUT_OF_MEMORY, f"{size} bytes requested of a pool of at most {pool.max_size}")
        reuse = min(pool.cached, size)
        self._give_back(pool, reuse)  # counted again, as the allocation's own
        try:
            address = make(size)
        except CudaError:
            self._keep(pool, reuse)
            raise
        pool.used += size
        pool.used_high = max(pool.used_high, pool.used)
        pool.reserved_high = max(pool.reserved_high, pool.reserved)
        return address

    def free(self, address: int) -> None:
        """Any allocation (cuMemFree and cuMemFreeAsync take either kind); a pool's bytes stay with it."""
        alloc = self.memory.free(address)
        pool, size = alloc.pool, len(alloc.data)
        if pool is None:
            return
        pool.used -= size
        if not pool.destroyed:
            self._keep(pool, size)
            self._give_back(pool, min(pool.cached, max(pool.reserved - pool.threshold, 0)))

    def trim(self, pool: Pool, keep: int) -> None:
        self._give_back(pool, min(pool.cached, max(pool.reserved - keep, 0)))

    def _keep(self, pool: Pool, size: int) -> None:
        """Freed bytes stay the pool's: still device memory in use, though no allocation holds them."""
        self.memory.charge(pool.device, size, checked=False)
        pool.cached += size

    def _give_back(self, pool: Pool, size: int) -> None:
        pool.cached -= size
        self.memory.discharge(pool.device, size)

    # ---- attributes and access ---------------------------------------------------------------------
    def get_attribute(self, pool: Pool, attr: int) -> bytes:
        """The value as the 8 bytes that travel (calls.py SPEC), little-endian."""
        kind, handle_types, _, _, _, max_size, *_ = memprops.POOL_PROPS.unpack(pool.props)
        values = {A["RELEASE_THRESHOLD"]: pool.threshold, A["RESERVED_MEM_CURRENT"]: pool.reserved,
                  A["RESERVED_MEM_HIGH"]: pool.reserved_high, A["USED_MEM_CURRENT"]: pool.used,
                  A["USED_MEM_HIGH"]: pool.used_high, A["ALLOCATION_TYPE"]: kind,
                  A["EXPORT_HANDLE_TYPES"]: handle_types, A["LOCATION_ID"]: pool.device,
                  A["LOCATION_TYPE"]: memprops.ON_DEVICE, A["MAX_POOL_SIZE"]: max_size,
                  A["HW_DECOMPRESS_ENABLED"]: 0, A["LOCALITY_DOMAIN_ID"]: -1, **pool.reuse}
        if attr not in values:
            raise CudaError(errors.INVALID_VALUE, f"memory pool attribute {attr}")
        return (values[attr] % (1 << 64)).to_bytes(memprops.POOL_VALUE_BYTES, "little")  # -1 as the C int's bytes

    def set_attribute(self, pool: Pool, attr: int, value: bytes) -> None:
        size = memprops.POOL_ATTRIBUTE_SIZES.get(attr, 0)
        number = int.from_bytes(bytes(value)[:size], "little")
        if attr in REUSE:
            pool.reuse[attr] = int(number != 0)
        elif attr == A["RELEASE_THRESHOLD"]:
            pool.threshold = number
            self.trim(pool, number)
        elif attr == A["RESERVED_MEM_HIGH"] and number == 0:  # a reset: the watermark starts again from now
            pool.reserved_high = pool.reserved
        elif attr == A["USED_MEM_HIGH"] and number == 0:
            pool.used_high = pool.used
        else:
            raise CudaError(errors.INVALID_VALUE, f"memory pool attribute {attr} cannot be set to {number}")

    def set_access(self, pool: Pool, descs: bytes, count: int) -> None:
        wanted = memprops.access_descs(descs)
        if len(wanted) != count:
            raise CudaError(errors.INVALID_VALUE, f"{count} access descriptors, {len(wanted)} sent")
        for kind, device, flags in wanted:
            device = self.location_device(kind, device)
            if flags not in (memprops.ACCESS_NONE, memprops.ACCESS_READWRITE) or (
                    device == pool.device and flags != memprops.ACCESS_READWRITE):
                raise CudaError(errors.INVALID_VALUE, f"access {flags} for device {device} to a pool of device "
                                f"{pool.device}")
            pool.access[device] = flags

    def get_access(self, pool: Pool, location: bytes) -> int:
        device = self.location_device(*memprops.LOCATION.unpack(bytes(location)))
        return memprops.ACCESS_READWRITE if device == pool.device else pool.access.get(device, memprops.ACCESS_NONE)

    def location_device(self, kind: int, device: int) -> int:
        if kind != memprops.ON_DEVICE:
            raise CudaError(errors.INVALID_VALUE, f"location type {kind}: the sim's pools are devices'")
        return self.check_device(device)
