"""Device resources and green contexts.

A device resource is a set of SMs of one device. The client describes it itself: the SM set (a bit
mask), its device and the split that made it travel in the driver's private bytes of the
application's CUdevResource, so asking for resources, splitting them and making descriptors are local.
A green context is provisioned on the server (xpuGreenCtxCreate, with the SM set). Its handle, the
client's, is also the CUcontext that stands for it (cuCtxFromGreenCtx): one handle, one entry in the
client's contexts. Streams made in it run on its SMs there.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import DEV_RESOURCE, SM_GROUP_PARAMS, SM_MASK_BYTES, SM_RESOURCE

from . import marshal
from .devices import destroy_context, out, release_primary, retain_primary
from .driver import Context, Driver, implements
from .streams import NON_BLOCKING, create, stream

SM = ENUMS["CU_DEV_RESOURCE_TYPE_SM"]
WORKQUEUES = (ENUMS["CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG"], ENUMS["CU_DEV_RESOURCE_TYPE_WORKQUEUE"])
IGNORE_COSCHEDULING = ENUMS["CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING"]
MAX_CLUSTER_SIZE = ENUMS["CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE"]
BACKFILL = ENUMS["CU_DEV_SM_RESOURCE_GROUP_BACKFILL"]
LOCALITY = ENUMS["CU_DEV_SM_RESOURCE_GROUP_LOCALITY_DOMAIN_ID"] | ENUMS[
    "CU_DEV_SM_RESOURCE_GROUP_LOCALITY_DOMAIN_SUPPLEMENTAL_SMS"]
DEFAULT_STREAM = ENUMS["CU_GREEN_CTX_DEFAULT_STREAM"]
INVALID_RESOURCE_TYPE = errors.CODES["CUDA_ERROR_INVALID_RESOURCE_TYPE"]
INVALID_CONFIGURATION = errors.CODES["CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"]
# the client's part of the driver's private bytes: a mark, the device (client ordinal), the split, the SMs
PRIVATE = struct.Struct(f"<4sII{SM_MASK_BYTES}s")
MARK = b"xpuR"


@dataclass(frozen=True)
class Resource:
    device: int
    sms: int  # bit i: SM i
    split: int = 0  # the split that made it; 0 for a device's or a context's whole set
    min_size: int = 0
    alignment: int = 0
    flags: int = 0

    @property
    def count(self) -> int:
        return self.sms.bit_count()

    def to_bytes(self) -> bytes:
        private = PRIVATE.pack(MARK, self.device, self.split, self.sms.to_bytes(SM_MASK_BYTES, "little"))
        sm = SM_RESOURCE.pack(self.count, self.min_size, self.alignment, self.flags, 0)
        return DEV_RESOURCE.pack(SM if self.sms else 0, private, sm, 0)


def granularity(d: Driver, device: int, flags: int = 0) -> tuple[int, int]:
    """(minimum partition, alignment) of SM splits on `device`: NVIDIA's documented guideline for its
    architecture (the client does not ask the server's driver; on a GPU the two are to be compared)."""
    major = d.devices[device].sm // 10
    if major < 7:
        return 1, 1
    if flags & IGNORE_COSCHEDULING:
        return 2, 2
    return {7: (2, 2), 8: (4, 2)}.get(major, (8, 8))


def whole(d: Driver, device: int, sms: int | None = None) -> Resource:
    count = d.devices[device].attributes.get(ENUMS["CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"], 0)
    if count > 8 * SM_MASK_BYTES:
        raise CudaError(errors.NOT_SUPPORTED, f"device {device} has {count} SMs, more than xpuremote describes")
    min_size, alignment = granularity(d, device)
    return Resource(device, (1 << count) - 1 if sms is None else sms, 0, min_size, alignment)


def descriptors(d: Driver) -> dict[int, Resource]:
    """Descriptor handle -> the SMs it gives (a descriptor lives as long as the process, as the driver's)."""
    return d.state.setdefault("resource_descriptors", {})


def read_resource(d: Driver, address: int) -> Resource:
    kind, private, sm, _ = DEV_RESOURCE.unpack(marshal.read(address, DEV_RESOURCE.size))
    if kind != SM:
        raise CudaError(INVALID_RESOURCE_TYPE, f"resource type {kind} is not CU_DEV_RESOURCE_TYPE_SM")
    mark, device, split, mask = PRIVATE.unpack_from(private)
    count, min_size, alignment, flags, _ = SM_RESOURCE.unpack(sm)
    resource = Resource(device, int.from_bytes(mask, "little"), split, min_size, alignment, flags)
    if mark != MARK or device >= len(d.devices) or resource.count != count or \
            resource.sms & ~whole(d, device).sms:
        raise CudaError(errors.INVALID_VALUE, "not a resource this driver gave")
    return resource


def give(d: Driver, call: Call, address: int, kind: int, resource: Resource) -> None:
    """Answer a resource question: SMs only (workqueue resources are not forwarded)."""
    if kind in WORKQUEUES:
        d.say_once("workqueues", "workqueue resources (type %d) are not supported by xpuremote yet", kind)
        raise CudaError(errors.NOT_SUPPORTED, "workqueue resources")
    if kind != SM:
        raise CudaError(INVALID_RESOURCE_TYPE, f"resource type {kind}")
    if not address:
        raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: resource is NULL")
    marshal.write(address, resource.to_bytes())


def of_context(d: Driver, handle: int) -> Resource:
    ctx = d.context(handle)
    return whole(d, ctx.device, ctx.sms if ctx.green else None)


@implements("cuDeviceGetDevResource")
def cu_device_get_dev_resource(d: Driver, call: Call, args: list[Any]) -> None:
    device, address, kind = args
    d.device(device)
    give(d, call, address, kind, whole(d, device))


@implements("cuCtxGetDevResource")
def cu_ctx_get_dev_resource(d: Driver, call: Call, args: list[Any]) -> None:
    handle, address, kind = args
    give(d, call, address, kind, of_context(d, handle))


@implements("cuGreenCtxGetDevResource")
def cu_green_ctx_get_dev_resource(d: Driver, call: Call, args: list[Any]) -> None:
    handle, address, kind = args
    give(d, call, address, kind, of_context(d, green(d, handle)))


@implements("cuStreamGetDevResource")
def cu_stream_get_dev_resource(d: Driver, call: Call, args: list[Any]) -> None:
    handle, address, kind = args
    give(d, call, address, kind, of_context(d, stream(d, handle).ctx))


# ---- splits: the lowest SMs of the input first, as one contiguous run per group where it can be --------
def lowest(sms: int, count: int) -> int:
    """The `count` lowest SMs of the set."""
    taken = 0
    while count:
        bit = sms & -sms
        taken, sms, count = taken | bit, sms ^ bit, count - 1
    return taken


def new_split(d: Driver) -> int:
    return next(d.state.setdefault("splits", itertools.count(1)))


def write_split(d: Driver, result: int, groups: list[Resource], remainder_address: int, rest: Resource) -> None:
    if result:  # NULL: the groups were only counted
        for i, group in enumerate(groups):
            marshal.write(result + i * DEV_RESOURCE.size, group.to_bytes())
    if remainder_address:
        marshal.write(remainder_address, rest.to_bytes())


@implements("cuDevSmResourceSplitByCount")
def cu_dev_sm_resource_split_by_count(d: Driver, call: Call, args: list[Any]) -> None:
    result, count_address, input_address, remainder, flags, min_count = args
    if not count_address or flags & ~(IGNORE_COSCHEDULING | MAX_CLUSTER_SIZE):
        raise CudaError(errors.INVALID_VALUE, "nbGroups is NULL or flags unknown")
    source = read_resource(d, input_address)
    if min_count > source.count:
        raise CudaError(errors.INVALID_VALUE, f"minCount {min_count} > the input's {source.count} SMs")
    min_size, alignment = granularity(d, source.device, flags)
    size = -(-max(min_count, min_size) // alignment) * alignment  # rounded up, as the driver rounds it
    possible = source.count // size
    wanted = marshal.get(call.params[1], count_address) if result else possible
    made = min(wanted, possible)
    split, left, groups = new_split(d), source.sms, []
    for _ in range(made):
        sms = lowest(left, size)
        groups.append(Resource(source.device, sms, split, min_size, alignment))
        left ^= sms
    write_split(d, result, groups, remainder, Resource(source.device, left, split, min_size, alignment))
    marshal.put(call.params[1], count_address, made)


def check_group(i: int, sm_count: int, unit: int, flags: int, available: int, largest: int) -> None:
    """A group's params as cuda.h allows them: a count of 0 (discovery) or an even count of at most the
    input's SMs, a multiple of the co-scheduled unit unless backfilled; a unit of at most `largest`."""
    bad_count = sm_count and (sm_count < 2 or sm_count > available or sm_count % 2
                              or sm_count % unit and not flags & BACKFILL)
    if flags & ~BACKFILL or unit > largest or bad_count:
        raise CudaError(errors.INVALID_VALUE, f"group {i}: {sm_count} SMs co-scheduled by {unit}, flags {flags:#x}")


@implements("cuDevSmResourceSplit")
def cu_dev_sm_resource_split(d: Driver, call: Call, args: list[Any]) -> None:
    """CUDA 13.1's structured split: each group's SM count and co-scheduling in its params, in order;
    a count of 0 discovers (and writes back) what is left in whole co-scheduled units."""
    result, count, input_address, remainder, flags, params_address = args
    if flags or not count or not params_address:
        raise CudaError(errors.INVALID_VALUE, "flags must be 0, and groups and their params given")
    source = read_resource(d, input_address)
    min_size, default = granularity(d, source.device)
    largest = 32 if d.devices[source.device].sm >= 90 else 2
    split, left, groups = new_split(d), source.sms, []
    for i in range(count):
        where = params_address + i * SM_GROUP_PARAMS.size
        sm_count, cosched, _preferred, group_flags, _domain = SM_GROUP_PARAMS.unpack(
            marshal.read(where, SM_GROUP_PARAMS.size))
        if group_flags & LOCALITY:
            d.say_once("locality", "SM splits by locality domain are not supported by xpuremote yet")
            raise CudaError(errors.NOT_SUPPORTED, "locality domains")
        unit = cosched or default
        check_group(i, sm_count, unit, group_flags, source.count, largest)
        available = left.bit_count()
        if not sm_count:  # discovery
            sm_count = available if group_flags & BACKFILL else available // unit * unit
            marshal.write(where, sm_count.to_bytes(4, "little"))
        if sm_count > available or result and (not sm_count or sm_count < unit):
            raise CudaError(INVALID_CONFIGURATION, f"group {i}: {sm_count} SMs of {available} left")
        sms = lowest(left, sm_count)
        groups.append(Resource(source.device, sms, split, min_size, unit, group_flags & BACKFILL))
        left ^= sms
    write_split(d, result, groups, remainder, Resource(source.device, left, split, min_size, default))


@implements("cuDevResourceGenerateDesc")
def cu_dev_resource_generate_desc(d: Driver, call: Call, args: list[Any]) -> None:
    address, resources, count = args
    if not address or not resources or not count:
        raise CudaError(errors.INVALID_VALUE, "no descriptor, or no resources")
    chosen = [read_resource(d, resources + i * DEV_RESOURCE.size) for i in range(count)]
    first = chosen[0]
    if any(r.device != first.device for r in chosen) or len(chosen) > 1 and (
            not first.split or any(r.split != first.split or r.alignment != first.alignment for r in chosen)):
        raise CudaError(INVALID_CONFIGURATION, "resources of several devices or splits")
    handle = d.new_handle()
    descriptors(d)[handle] = Resource(first.device, sum(r.sms for r in chosen))  # a split's parts are disjoint
    marshal.put_u64(address, handle)


# ---- green contexts -------------------------------------------------------------------------------
def green(d: Driver, handle: int) -> int:
    """A green context's handle (also its CUcontext's); NULL is the current context, if it is green."""
    ctx = d.ctxs.get(handle or d.current_ctx())
    if ctx is None or not ctx.green:
        raise CudaError(errors.INVALID_CONTEXT, f"{handle:#x} is not a green context")
    return ctx.green


@implements("cuGreenCtxCreate")
def cu_green_ctx_create(d: Driver, call: Call, args: list[Any]) -> None:
    address, desc, device, flags = args
    if not address or flags & ~DEFAULT_STREAM:
        raise CudaError(errors.INVALID_VALUE, "phCtx is NULL or flags unknown")
    sms = descriptors(d).get(desc)
    if sms is None:
        raise CudaError(errors.INVALID_VALUE, f"{desc:#x} is not a resource descriptor")
    server_index = d.device(device).server_index
    if sms.device != device:
        raise CudaError(errors.INVALID_DEVICE, f"the descriptor's SMs are device {sms.device}'s, not {device}'s")
    # Waited for: a driver may refuse green contexts altogether (an H100's in a virtual machine did), and a
    # create answered before the server's would make every later call in it fail instead.
    retain_primary(d, device)  # the driver's green context holds its device's primary context
    handle = d.new_handle()
    try:
        d.call(CALLS["xpuGreenCtxCreate"], [handle, server_index, sms.sms.to_bytes(SM_MASK_BYTES, "little"), flags])
    except CudaError:
        release_primary(d, device)
        raise
    d.ctxs[handle] = Context(device, ident=len(d.ctxs) + 1, green=handle, sms=sms.sms)
    marshal.put_u64(address, handle)


@implements("cuGreenCtxDestroy")
def cu_green_ctx_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    (handle,) = args
    if not handle:
        raise CudaError(errors.INVALID_CONTEXT, "NULL green context")
    device = d.ctxs[green(d, handle)].device
    destroy_context(d, call, handle)
    release_primary(d, device)


@implements("cuCtxFromGreenCtx")
def cu_ctx_from_green_ctx(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle = args
    if not address:
        raise CudaError(errors.INVALID_VALUE, "pContext is NULL")
    marshal.put_u64(address, green(d, handle) if handle else 0)


@implements("cuGreenCtxGetId")
def cu_green_ctx_get_id(d: Driver, call: Call, args: list[Any]) -> None:
    handle, address = args
    out(call, "greenCtxId", address, d.ctxs[green(d, handle)].ident)


@implements("cuGreenCtxStreamCreate")
def cu_green_ctx_stream_create(d: Driver, call: Call, args: list[Any]) -> None:
    _, handle, flags, priority = args
    if not flags & NON_BLOCKING:
        raise CudaError(errors.INVALID_VALUE, "a green context's stream must be CU_STREAM_NON_BLOCKING")
    create(d, call, args, flags, priority, green(d, handle))


@implements("cuStreamGetGreenCtx")
def cu_stream_get_green_ctx(d: Driver, call: Call, args: list[Any]) -> None:
    handle, address = args
    ctx = d.ctxs.get(stream(d, handle).ctx)
    marshal.put_u64(address, ctx.green if ctx is not None else 0)
