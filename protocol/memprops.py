"""The structs of memory pools and virtual memory management (VMM), and what xpuremote refuses in them.

Both ends read them: the client to rewrite device ordinals (the application's, under
CUDA_VISIBLE_DEVICES, are not the server's) and to refuse early with a clear message, the server's
limits to refuse what a hand-made client might send, the sim to model the driver. Layouts are
x86-64's, as the driver's headers (13.x) declare them.
"""

from __future__ import annotations

import struct

from . import errors
from .cuda_api import ENUMS
from .errors import CudaError

# CUmemLocation: CUmemLocationType type; int id
LOCATION = struct.Struct("<Ii")
# CUmemAllocationProp: type, requestedHandleTypes, location (type, id), void *win32HandleMetaData,
# allocFlags {compressionType, gpuDirectRDMACapable, usage, reserved[4]}
ALLOCATION_PROP = struct.Struct("<IIIiQBBH4x")
# CUmemPoolProps: allocType, handleTypes, location (type, id), void *win32SecurityAttributes, maxSize,
# usage, gpuDirectRDMACapable, reserved[53]
POOL_PROPS = struct.Struct("<IIIiQQHB53x")
# CUmemAccessDesc: location (type, id), CUmemAccess_flags flags
ACCESS_DESC = struct.Struct("<IiI")

PINNED = ENUMS["CU_MEM_ALLOCATION_TYPE_PINNED"]
ON_DEVICE = ENUMS["CU_MEM_LOCATION_TYPE_DEVICE"]
NO_HANDLES = ENUMS["CU_MEM_HANDLE_TYPE_NONE"]
ACCESS_NONE, ACCESS_READ, ACCESS_READWRITE = (ENUMS[f"CU_MEM_ACCESS_FLAGS_PROT_{k}"] for k in ("NONE", "READ",
                                                                                          "READWRITE"))
# What the sim's driver answers cuMemGetAllocationGranularity with, and what the server's limits round
# a physical allocation to: NVIDIA's GPUs map device memory in pages of 2 MiB.
GRANULARITY = 2 << 20

# CUmemPool_attribute -> bytes of its value: the three reuse switches are ints, the byte counts and
# thresholds cuuint64_t; the later ones (CUDA 12.9/13) describe the pool and are read-only. cuda.h
# numbers them implicitly from REUSE_FOLLOW_EVENT_DEPENDENCIES = 1, so the generated ENUMS lack them.
POOL_ATTRIBUTES = ("REUSE_FOLLOW_EVENT_DEPENDENCIES", "REUSE_ALLOW_OPPORTUNISTIC", "REUSE_ALLOW_INTERNAL_DEPENDENCIES",
                   "RELEASE_THRESHOLD", "RESERVED_MEM_CURRENT", "RESERVED_MEM_HIGH", "USED_MEM_CURRENT",
                   "USED_MEM_HIGH", "ALLOCATION_TYPE", "EXPORT_HANDLE_TYPES", "LOCATION_ID", "LOCATION_TYPE",
                   "MAX_POOL_SIZE", "HW_DECOMPRESS_ENABLED", "LOCALITY_DOMAIN_ID")
POOL_ATTRIBUTE = {name: code for code, name in enumerate(POOL_ATTRIBUTES, 1)}
_WIDE = {"RELEASE_THRESHOLD", "RESERVED_MEM_CURRENT", "RESERVED_MEM_HIGH", "USED_MEM_CURRENT", "USED_MEM_HIGH",
         "MAX_POOL_SIZE"}
POOL_ATTRIBUTE_SIZES = {code: 8 if name in _WIDE else 4 for name, code in POOL_ATTRIBUTE.items()}
POOL_VALUE_BYTES = 8  # a pool attribute's value travels as 8 bytes whatever its width (calls.py SPEC)

# Handle types that export memory to another process (a file descriptor, a fabric handle, Windows
# handles): that process would have to be on the server's machine, and a client is not, so xpuremote
# creates no exportable memory: the client drops a request for a file descriptor (without_fd_export),
# and the rest are refused. (The export and import calls themselves are refused too.)
EXPORTABLE = {ENUMS[f"CU_MEM_HANDLE_TYPE_{k}"]: k for k in ("POSIX_FILE_DESCRIPTOR", "WIN32", "WIN32_KMT", "FABRIC")}
POSIX_FD = ENUMS["CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"]


def without_fd_export(layout: struct.Struct, data: bytes) -> bytes:
    """A CUmemAllocationProp or CUmemPoolProps (`layout`) without a request to export as a POSIX file
    descriptor. PyTorch makes that request for every expandable segment, in case a tensor is later shared
    with another process; such a process would have to run on the server's machine, so the memory is made
    unexportable instead, and an export, should one be tried, is refused (cuMemExportToShareableHandle)."""
    fields = list(layout.unpack(bytes(data)))
    fields[1] &= ~POSIX_FD  # requestedHandleTypes, handleTypes
    return layout.pack(*fields)


def export_refusal(handle_types: int) -> str | None:
    """Why memory with these requested handle types is not made, or None when none is requested."""
    if handle_types == NO_HANDLES:
        return None
    names = [name for bit, name in EXPORTABLE.items() if handle_types & bit] or [f"{handle_types:#x}"]
    return (f"exportable memory ({', '.join(names)} handles) cannot be shared across the network: the importing "
            "process would have to run on the server's machine")


def check_allocation_prop(data: bytes) -> None:
    """A CUmemAllocationProp that xpuremote forwards: pinned device memory that exports nothing, with no host
    pointer (win32HandleMetaData would be the client's address). CudaError otherwise."""
    kind, handle_types, location_type, _id, win32, *_ = ALLOCATION_PROP.unpack(bytes(data))
    _check(win32, "CUmemAllocationProp.win32HandleMetaData", handle_types, kind, location_type)


def check_pool_props(data: bytes) -> None:
    """As check_allocation_prop, for a CUmemPoolProps."""
    kind, handle_types, location_type, _id, win32, *_ = POOL_PROPS.unpack(bytes(data))
    _check(win32, "CUmemPoolProps.win32SecurityAttributes", handle_types, kind, location_type)


def _check(host_pointer: int, field: str, handle_types: int, kind: int, location_type: int) -> None:
    if host_pointer:
        raise CudaError(errors.INVALID_VALUE, f"{field} is a host pointer ({host_pointer:#x}); it must be NULL")
    refusal = export_refusal(handle_types)
    if refusal:
        raise CudaError(errors.NOT_SUPPORTED, refusal)
    if kind != PINNED:
        raise CudaError(errors.NOT_SUPPORTED, f"allocation type {kind}: only CU_MEM_ALLOCATION_TYPE_PINNED (device "
                        "memory) is forwarded")
    if location_type != ON_DEVICE:
        raise CudaError(errors.NOT_SUPPORTED, f"location type {location_type}: only device memory "
                        "(CU_MEM_LOCATION_TYPE_DEVICE) is forwarded; the server machine's host memory is not the "
                        "application's")


def access_descs(data: bytes) -> list[tuple[int, int, int]]:
    """A CUmemAccessDesc array as (location type, id, flags) triples."""
    return list(ACCESS_DESC.iter_unpack(bytes(data)))
