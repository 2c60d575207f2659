"""CUDA arrays and texture/surface objects.

An array's handle is the server's (creation waits for it: an array is device memory, so a refusal, the
quota's included, is the creation's answer); the client keeps each array's descriptor, so the descriptor
questions and the bounds of every copy are answered here. Copies with an array side go as the
xpuMemcpyArray* requests, one rectangle of one slice each, so that no host pointer reaches the server.
A texture or surface object is a value kernels receive by value: the server's, answered at creation. The
client keeps the descriptors it was given, so the Get*Desc questions are local; the server keeps which
objects are the session's and refuses the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import (
    ARRAY3D_DESCRIPTOR,
    ARRAY_DESCRIPTOR,
    ARRAY_FORMAT_BYTES,
    RESOURCE_ARRAY,
    RESOURCE_DESC,
    RESOURCE_LINEAR,
    RESOURCE_LINEAR_TYPE,
    RESOURCE_MIPMAPPED,
    RESOURCE_PITCH2D,
    RESOURCE_PITCH2D_TYPE,
    RESOURCE_VIEW_DESC_SIZE,
    TEXTURE_DESC_SIZE,
)

from . import marshal
from .driver import Driver, implements
from .streams import HOST_COPY, refuse_in_capture

LAYERED, SURFACE_LDST, CUBEMAP, TEXTURE_GATHER = 0x01, 0x02, 0x04, 0x08
KNOWN_FLAGS = LAYERED | SURFACE_LDST | CUBEMAP | TEXTURE_GATHER
@dataclass(frozen=True)
class ArrayInfo:
    width: int
    height: int
    depth: int
    format: int
    channels: int
    flags: int = 0

    @property
    def element(self) -> int:
        return ARRAY_FORMAT_BYTES[self.format] * self.channels

    @property
    def row_bytes(self) -> int:
        return self.width * self.element

    @property
    def rows(self) -> int:
        return max(self.height, 1)

    @property
    def slices(self) -> int:
        return max(self.depth, 1)


@dataclass(frozen=True)
class ArraySide:
    """One side of a 2D/3D copy that is an array: its handle, and the first byte's x (bytes), y, z."""

    handle: int
    x: int
    y: int
    z: int


def arrays(d: Driver) -> dict[int, ArrayInfo]:
    return d.state.setdefault("arrays", {})


def objects(d: Driver) -> dict[tuple[str, int], tuple[bytes, ...]]:
    """(kind, value) of each texture or surface object -> the descriptors it was made with."""
    return d.state.setdefault("texture objects", {})


def array_of(d: Driver, handle: int) -> ArrayInfo:
    info = arrays(d).get(handle)
    if info is None:
        raise CudaError(errors.INVALID_HANDLE if handle else errors.INVALID_VALUE, f"{handle:#x} is not a CUDA array")
    return info


def check_descriptor(info: ArrayInfo) -> None:
    """The driver's checks of a new array's descriptor (INVALID_VALUE), and what is not forwarded."""
    if info.format not in ARRAY_FORMAT_BYTES:
        known = any(k.startswith("CU_AD_FORMAT_") and v == info.format for k, v in ENUMS.items())
        if known and info.format != ENUMS["CU_AD_FORMAT_MAX"]:
            raise CudaError(errors.NOT_SUPPORTED, f"arrays of format {info.format:#x} are not forwarded")
        raise CudaError(errors.INVALID_VALUE, f"array format {info.format:#x}")
    if info.channels not in (1, 2, 4):
        raise CudaError(errors.INVALID_VALUE, f"{info.channels} channels (1, 2 or 4)")
    if info.width == 0 or (info.height == 0 and info.depth and not info.flags & LAYERED):
        raise CudaError(errors.INVALID_VALUE, f"array of {info.width}x{info.height}x{info.depth}")
    if info.flags & ~KNOWN_FLAGS:
        raise CudaError(errors.NOT_SUPPORTED, f"array flags {info.flags:#x} (sparse, deferred mapping...) "
                        "are not forwarded")
    if info.flags & CUBEMAP and (info.width != info.height or info.depth % 6 or not info.depth):
        raise CudaError(errors.INVALID_VALUE, "a cubemap's width and height are equal and its depth is 6 faces")


def create(d: Driver, call: Call, args: list[Any], info: ArrayInfo) -> None:
    if call.params[1].ctype.endswith("_v1 *"):
        raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol} takes the CUDA 2.x struct layout")
    if not args[0]:
        raise CudaError(errors.INVALID_VALUE, "NULL array handle pointer")
    d.current_ctx()
    check_descriptor(info)
    d.forward(call, args)
    arrays(d)[marshal.get(call.params[0], args[0])] = info


@implements("cuArrayCreate")
def cu_array_create(d: Driver, call: Call, args: list[Any]) -> None:
    if not args[1]:
        raise CudaError(errors.INVALID_VALUE, "NULL array descriptor")
    width, height, fmt, channels = ARRAY_DESCRIPTOR.unpack(marshal.read(args[1], ARRAY_DESCRIPTOR.size))
    create(d, call, args, ArrayInfo(width, height, 0, fmt, channels))


@implements("cuArray3DCreate")
def cu_array_3d_create(d: Driver, call: Call, args: list[Any]) -> None:
    if not args[1]:
        raise CudaError(errors.INVALID_VALUE, "NULL array descriptor")
    width, height, depth, fmt, channels, flags = ARRAY3D_DESCRIPTOR.unpack(
        marshal.read(args[1], ARRAY3D_DESCRIPTOR.size))
    create(d, call, args, ArrayInfo(width, height, depth, fmt, channels, flags))


@implements("cuArrayDestroy")
def cu_array_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    array_of(d, args[0])
    del arrays(d)[args[0]]
    d.post(call, [args[0]])


@implements("cuArrayGetDescriptor")
def cu_array_get_descriptor(d: Driver, call: Call, args: list[Any]) -> None:
    if call.params[0].ctype.endswith("_v1 *"):
        raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol} takes the CUDA 2.x struct layout")
    info = array_of(d, args[1])
    marshal.write(args[0], ARRAY_DESCRIPTOR.pack(info.width, info.height, info.format, info.channels))


@implements("cuArray3DGetDescriptor")
def cu_array_3d_get_descriptor(d: Driver, call: Call, args: list[Any]) -> None:
    if call.params[0].ctype.endswith("_v1 *"):
        raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol} takes the CUDA 2.x struct layout")
    info = array_of(d, args[1])
    marshal.write(args[0], ARRAY3D_DESCRIPTOR.pack(info.width, info.height, info.depth, info.format, info.channels,
                                                   info.flags))


# ---- copies ---------------------------------------------------------------------------------------------
def check_rect(d: Driver, side: ArraySide, width: int, height: int) -> None:
    """A rectangle of `width` bytes by `height` rows at the side's place lies inside its array."""
    info = array_of(d, side.handle)
    if side.x + width > info.row_bytes or side.y + height > info.rows or side.z >= info.slices:
        raise CudaError(errors.INVALID_VALUE, f"a copy of {width} bytes x {height} rows at ({side.x}, {side.y}, "
                        f"{side.z}) runs past an array of {info.row_bytes} bytes x {info.rows} rows x {info.slices}")


def rect_copy(d: Driver, src: Any, dst: Any, width: int, height: int, stream: int, wait: bool) -> None:
    """One rectangle where a side is an array; the other side is an ArraySide or memory.py's (is host,
    address, pitch)."""
    from .memory import to_host_rows  # memory imports this module's ArraySide

    if width == 0 or height == 0:
        return
    for side in (src, dst):
        if isinstance(side, ArraySide):
            check_rect(d, side, width, height)
    src_host = not isinstance(src, ArraySide) and src[0]
    dst_host = not isinstance(dst, ArraySide) and dst[0]
    if src_host or dst_host:
        refuse_in_capture(d, stream, HOST_COPY)
    if isinstance(src, ArraySide) and isinstance(dst, ArraySide):
        d.post(CALLS["xpuMemcpyArrayToArray"], [dst.handle, dst.x, dst.y, dst.z, src.handle, src.x, src.y, src.z,
                                                width, height, stream])
    elif isinstance(dst, ArraySide) and src_host:
        _, s, spitch = src
        budget = d.session().request_budget
        step = max(budget // max(width, 1), 1) if budget else height
        for first in range(0, height, step):
            n = min(step, height - first)
            rows = b"".join(marshal.read(s + (first + r) * spitch, width) for r in range(n))
            d.post(CALLS["xpuMemcpyArrayFromHost"], [dst.handle, dst.x, dst.y + first, dst.z, rows, width, n, stream],
                   len(rows))
        if wait:
            d.call(CALLS["cuStreamSynchronize"], [stream])
    elif isinstance(dst, ArraySide):
        _, s, spitch = src
        d.post(CALLS["xpuMemcpyArrayFromDevice"], [dst.handle, dst.x, dst.y, dst.z, s, spitch, width, height, stream])
    elif dst_host:
        (rows,) = d.call(CALLS["xpuMemcpyArrayToHost"], [width * height, src.handle, src.x, src.y, src.z, width,
                                                         height, stream])
        to_host_rows(rows, dst[1], dst[2], width, height)
    else:
        _, t, dpitch = dst
        d.post(CALLS["xpuMemcpyArrayToDevice"], [t, dpitch, src.handle, src.x, src.y, src.z, width, height, stream])


def spans(d: Driver, handle: int, offset: int, count: int) -> list[tuple[ArraySide, int]]:
    """A 1D copy's bytes of an array (rows one after another), as pieces of one row each."""
    info = array_of(d, handle)
    row = info.row_bytes
    if offset + count > row * info.rows * info.slices:
        raise CudaError(errors.INVALID_VALUE, f"{count} bytes at offset {offset} run past an array of "
                        f"{row * info.rows * info.slices} bytes")
    out = []
    while count > 0:
        line, x = divmod(offset, row)
        n = min(count, row - x)
        z, y = divmod(line, info.rows)
        out.append((ArraySide(handle, x, y, z), n))
        offset, count = offset + n, count - n
    return out


def linear_copy(d: Driver, dst: Any, dst_offset: int, src: Any, src_offset: int, count: int, stream: int,
                wait: bool) -> None:
    """A 1D copy where `dst` or `src` is an array handle (the other a (is host, address, pitch) side's start,
    as an int address with its kind, or an array handle too)."""
    dst_array, src_array = isinstance(dst, int), isinstance(src, int)
    if dst_array and src_array:  # both arrays: rows of either may break the copy
        pieces, done = [], 0
        while done < count:
            (ds, dn), (ss, sn) = spans(d, dst, dst_offset + done, count - done)[0], \
                spans(d, src, src_offset + done, count - done)[0]
            n = min(dn, sn)
            pieces.append((ss, ds, n))
            done += n
        for ss, ds, n in pieces:
            rect_copy(d, ss, ds, n, 1, stream, False)
        return
    if dst_array:
        host, address = src
        for side, n in spans(d, dst, dst_offset, count):
            rect_copy(d, (host, address, n), side, n, 1, stream, False)
            address += n
    else:
        host, address = dst
        for side, n in spans(d, src, src_offset, count):
            rect_copy(d, side, (host, address, n), n, 1, stream, False)
            address += n
    if wait and (dst_array and src[0]):
        d.call(CALLS["cuStreamSynchronize"], [stream])


def stream_arg(call: Call, stream: int | None) -> int:
    if stream is None:
        return 2 if call.per_thread else 0
    return 2 if call.per_thread and not stream else stream


@implements("cuMemcpyHtoA", "cuMemcpyHtoAAsync")
def cu_memcpy_htoa(d: Driver, call: Call, args: list[Any]) -> None:
    dst, offset, src, count, *tail = args
    if count and not src:
        raise CudaError(errors.INVALID_VALUE, "NULL host pointer")
    linear_copy(d, dst, offset, (True, src), 0, count, stream_arg(call, tail[0] if tail else None), not tail)


@implements("cuMemcpyAtoH", "cuMemcpyAtoHAsync")
def cu_memcpy_atoh(d: Driver, call: Call, args: list[Any]) -> None:
    dst, src, offset, count, *tail = args
    if count and not dst:
        raise CudaError(errors.INVALID_VALUE, "NULL host pointer")
    linear_copy(d, (True, dst), 0, src, offset, count, stream_arg(call, tail[0] if tail else None), False)


@implements("cuMemcpyAtoD")
def cu_memcpy_atod(d: Driver, call: Call, args: list[Any]) -> None:
    dst, src, offset, count = args
    linear_copy(d, (False, dst), 0, src, offset, count, stream_arg(call, None), False)


@implements("cuMemcpyDtoA")
def cu_memcpy_dtoa(d: Driver, call: Call, args: list[Any]) -> None:
    dst, offset, src, count = args
    linear_copy(d, dst, offset, (False, src), 0, count, stream_arg(call, None), False)


@implements("cuMemcpyAtoA")
def cu_memcpy_atoa(d: Driver, call: Call, args: list[Any]) -> None:
    dst, dst_offset, src, src_offset, count = args
    linear_copy(d, dst, dst_offset, src, src_offset, count, stream_arg(call, None), False)


# ---- texture and surface objects ---------------------------------------------------------------------------
def resource(d: Driver, address: int) -> tuple[bytes, int]:
    """The application's CUDA_RESOURCE_DESC, checked, and the array it names (0 for memory)."""
    from .memory import maps

    if not address:
        raise CudaError(errors.INVALID_VALUE, "NULL resource descriptor")
    data = marshal.read(address, RESOURCE_DESC.size)
    kind, union, _flags = RESOURCE_DESC.unpack(data)
    if kind == RESOURCE_ARRAY:
        handle = int.from_bytes(union[:8], "little")
        array_of(d, handle)
        return data, handle
    if kind == RESOURCE_MIPMAPPED:
        raise CudaError(errors.NOT_SUPPORTED, "mipmapped arrays are not forwarded")
    if kind == RESOURCE_LINEAR_TYPE:
        ptr, fmt, channels, size = RESOURCE_LINEAR.unpack_from(union)
    elif kind == RESOURCE_PITCH2D_TYPE:
        ptr, fmt, channels, width, height, pitch = RESOURCE_PITCH2D.unpack_from(union)
        element = ARRAY_FORMAT_BYTES.get(fmt, 0) * channels
        size = pitch * (height - 1) + width * element if height else 0
    else:
        raise CudaError(errors.INVALID_VALUE, f"resource type {kind}")
    if fmt not in ARRAY_FORMAT_BYTES or channels not in (1, 2, 4) or not ptr or not size:
        raise CudaError(errors.INVALID_VALUE, f"resource of format {fmt:#x}, {channels} channels, {size} bytes")
    r = maps(d)[0].find(ptr)
    if r is None or ptr + size > r.base + r.size:
        raise CudaError(errors.INVALID_VALUE, f"[{ptr:#x}, +{size}) is not inside one device allocation")
    return data, 0


def optional_read(address: int, size: int) -> bytes | None:
    return marshal.read(address, size) if address else None


@implements("cuTexObjectCreate")
def cu_tex_object_create(d: Driver, call: Call, args: list[Any]) -> None:
    out, res, tex, view = args
    if not out or not tex:
        raise CudaError(errors.INVALID_VALUE, "NULL texture object or texture descriptor pointer")
    d.current_ctx()
    data, array = resource(d, res)
    texture, viewed = marshal.read(tex, TEXTURE_DESC_SIZE), optional_read(view, RESOURCE_VIEW_DESC_SIZE)
    if viewed is not None and not array:
        raise CudaError(errors.INVALID_VALUE, "a resource view needs an array resource")
    (value,) = d.call(CALLS["xpuTexObjectCreate"], [8, array, data, texture, viewed])
    value = int.from_bytes(bytes(value), "little")
    objects(d)[("tex", value)] = (data, texture, viewed or bytes(RESOURCE_VIEW_DESC_SIZE))
    marshal.put_u64(out, value)


@implements("cuSurfObjectCreate")
def cu_surf_object_create(d: Driver, call: Call, args: list[Any]) -> None:
    out, res = args
    if not out:
        raise CudaError(errors.INVALID_VALUE, "NULL surface object pointer")
    d.current_ctx()
    data, array = resource(d, res)
    if not array:
        raise CudaError(errors.INVALID_VALUE, "a surface object's resource is an array")
    array_of(d, array)  # a live array; the driver (580.159) takes one made without SURFACE_LDST too
    (value,) = d.call(CALLS["xpuSurfObjectCreate"], [8, array, data])
    value = int.from_bytes(bytes(value), "little")
    objects(d)[("surf", value)] = (data,)
    marshal.put_u64(out, value)


def object_of(d: Driver, kind: str, value: int) -> tuple[bytes, ...]:
    found = objects(d).get((kind, value))
    if found is None:
        raise CudaError(errors.INVALID_VALUE, f"{value:#x} is not a {'texture' if kind == 'tex' else 'surface'} "
                        "object")
    return found


@implements("cuTexObjectDestroy", "cuSurfObjectDestroy")
def cu_object_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    kind = "tex" if call.family == "cuTexObjectDestroy" else "surf"
    object_of(d, kind, args[0])
    del objects(d)[(kind, args[0])]
    d.post(call, [args[0]])


@implements("cuTexObjectGetResourceDesc", "cuSurfObjectGetResourceDesc")
def cu_object_get_resource_desc(d: Driver, call: Call, args: list[Any]) -> None:
    kind = "tex" if call.family == "cuTexObjectGetResourceDesc" else "surf"
    marshal.write(args[0], object_of(d, kind, args[1])[0])


@implements("cuTexObjectGetTextureDesc")
def cu_tex_object_get_texture_desc(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.write(args[0], object_of(d, "tex", args[1])[1])


@implements("cuTexObjectGetResourceViewDesc")
def cu_tex_object_get_resource_view_desc(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.write(args[0], object_of(d, "tex", args[1])[2])
