"""CUDA arrays and texture/surface objects on the sim device.

An array is zero-filled host memory laid out as rows of width x element bytes, rows x slices, counted
against the device's memory like an allocation (but at no device address: arrays have none). Texture and
surface objects keep their descriptors (a kernel implementation could read them; none does yet).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import (
    ARRAY3D_DESCRIPTOR,
    ARRAY_DESCRIPTOR,
    ARRAY_FORMAT_BYTES,
    RESOURCE_ARRAY,
    RESOURCE_DESC,
    RESOURCE_LINEAR,
    RESOURCE_LINEAR_TYPE,
    RESOURCE_PITCH2D,
    RESOURCE_PITCH2D_TYPE,
)

LAYERED = 0x01


@dataclass(eq=False)
class Array:
    width: int
    height: int
    depth: int
    format: int
    channels: int
    flags: int
    device: int
    data: bytearray

    @property
    def row_bytes(self) -> int:
        return self.width * ARRAY_FORMAT_BYTES[self.format] * self.channels

    @property
    def rows(self) -> int:
        return max(self.height, 1)

    @property
    def slices(self) -> int:
        return max(self.depth, 1)

    def offset(self, x: int, y: int, z: int, width: int, height: int) -> int:
        """Where (x, y, z) starts, once the rectangle from it is known to lie inside the array."""
        if x + width > self.row_bytes or y + height > self.rows or z >= self.slices:
            raise CudaError(errors.INVALID_VALUE, f"{width} bytes x {height} rows at ({x}, {y}, {z}) run past an "
                            f"array of {self.row_bytes} bytes x {self.rows} rows x {self.slices}")
        return (z * self.rows + y) * self.row_bytes + x

    def read(self, x: int, y: int, z: int, width: int, height: int) -> bytes:
        at, row = self.offset(x, y, z, width, height), self.row_bytes
        return b"".join(bytes(self.data[at + r * row : at + r * row + width]) for r in range(height))

    def write(self, x: int, y: int, z: int, width: int, height: int, rows: bytes) -> None:
        at, row = self.offset(x, y, z, width, height), self.row_bytes
        if len(rows) != width * height:
            raise CudaError(errors.INVALID_VALUE, f"{len(rows)} bytes for {height} rows of {width}")
        for r in range(height):
            self.data[at + r * row : at + r * row + width] = rows[r * width : (r + 1) * width]


@dataclass(eq=False)
class TextureObject:
    kind: str  # "tex" or "surf"
    resource: bytes  # the CUDA_RESOURCE_DESC as the client gave it (its array handle the client's)
    array: Array | None
    texture: bytes | None = None
    view: bytes | None = None


class SimArrays:
    """The SimBackend's arrays and texture/surface objects (it has `memory` and `_current_device`)."""

    memory: Any

    def _current_device(self) -> int:
        raise NotImplementedError

    def _objects(self) -> dict[int, TextureObject]:
        if not hasattr(self, "texture_objects"):
            self.texture_objects: dict[int, TextureObject] = {}
            self.next_object = 1 + secrets.randbelow(1 << 40) * 16
        return self.texture_objects

    def _new_array(self, width: int, height: int, depth: int, fmt: int, channels: int, flags: int) -> Array:
        if fmt not in ARRAY_FORMAT_BYTES or channels not in (1, 2, 4) or width == 0 \
                or (height == 0 and depth and not flags & LAYERED):
            raise CudaError(errors.INVALID_VALUE, f"array of {width}x{height}x{depth}, format {fmt:#x}, "
                            f"{channels} channels")
        device = self._current_device()
        array = Array(width, height, depth, fmt, channels, flags, device, bytearray())
        size = array.row_bytes * array.rows * array.slices
        self.memory.charge(device, size)
        array.data = bytearray(size)  # zero-filled: no array shows an earlier one's bytes
        return array

    def cuDeviceGetTexture1DLinearMaxWidth(self, fmt: int, channels: int, dev: int) -> tuple[int]:
        """An sm_90's answer: 2^28 elements, whatever their size."""
        if fmt not in ARRAY_FORMAT_BYTES or channels not in (1, 2, 4):
            raise CudaError(errors.INVALID_VALUE, f"format {fmt:#x}, {channels} channels")
        return (1 << 28,)

    def cuArrayCreate(self, desc: bytes) -> tuple[Array]:
        width, height, fmt, channels = ARRAY_DESCRIPTOR.unpack(bytes(desc))
        return (self._new_array(width, height, 0, fmt, channels, 0),)

    def cuArray3DCreate(self, desc: bytes) -> tuple[Array]:
        return (self._new_array(*ARRAY3D_DESCRIPTOR.unpack(bytes(desc))),)

    def cuArrayDestroy(self, array: Array) -> None:
        if not isinstance(array, Array):
            raise CudaError(errors.INVALID_HANDLE, "not an array")
        self.memory.discharge(array.device, len(array.data))
        array.data = bytearray()

    def xpuMemcpyArrayFromHost(self, dst: Array, x: int, y: int, z: int, src: bytes, width: int, height: int,
                               stream: Any) -> None:
        dst.write(x, y, z, width, height, bytes(src))

    def xpuMemcpyArrayToHost(self, src: Array, x: int, y: int, z: int, width: int, height: int,
                             stream: Any) -> tuple[bytes]:
        return (src.read(x, y, z, width, height),)

    def _device_rows(self, address: int, pitch: int, width: int, height: int) -> bytes:
        if not self.memory.rect(address, pitch, width, height):
            return b""
        return b"".join(self.memory.read(address + r * pitch, width) for r in range(height))

    def xpuMemcpyArrayFromDevice(self, dst: Array, x: int, y: int, z: int, src: int, pitch: int, width: int,
                                 height: int, stream: Any) -> None:
        dst.offset(x, y, z, width, height)
        dst.write(x, y, z, width, height, self._device_rows(src, pitch, width, height))

    def xpuMemcpyArrayToDevice(self, dst: int, pitch: int, src: Array, x: int, y: int, z: int, width: int,
                               height: int, stream: Any) -> None:
        rows = src.read(x, y, z, width, height)
        if not self.memory.rect(dst, pitch, width, height):
            return
        for r in range(height):
            self.memory.write(dst + r * pitch, rows[r * width : (r + 1) * width])

    def xpuMemcpyArrayToArray(self, dst: Array, dx: int, dy: int, dz: int, src: Array, sx: int, sy: int, sz: int,
                              width: int, height: int, stream: Any) -> None:
        dst.offset(dx, dy, dz, width, height)
        dst.write(dx, dy, dz, width, height, src.read(sx, sy, sz, width, height))

    # ---- texture and surface objects ------------------------------------------------------------------
    def _resource(self, array: Array | None, desc: bytes) -> None:
        kind, union, _ = RESOURCE_DESC.unpack(bytes(desc))
        if kind == RESOURCE_ARRAY:
            if not isinstance(array, Array) or not array.data:
                raise CudaError(errors.INVALID_VALUE, "the resource names no live array")
            return
        if array is not None:
            raise CudaError(errors.INVALID_VALUE, "an array named for a resource that is not one")
        if kind == RESOURCE_LINEAR_TYPE:
            ptr, fmt, channels, size = RESOURCE_LINEAR.unpack_from(union)
        elif kind == RESOURCE_PITCH2D_TYPE:
            ptr, fmt, channels, width, height, pitch = RESOURCE_PITCH2D.unpack_from(union)
            element = ARRAY_FORMAT_BYTES.get(fmt, 0) * channels
            size = pitch * (height - 1) + width * element if height and pitch >= width * element else 0
        else:
            raise CudaError(errors.NOT_SUPPORTED if kind == 1 else errors.INVALID_VALUE, f"resource type {kind}")
        if fmt not in ARRAY_FORMAT_BYTES or channels not in (1, 2, 4) or not size:
            raise CudaError(errors.INVALID_VALUE, f"resource of format {fmt:#x}, {channels} channels, {size} bytes")
        self.memory.find(ptr, size)

    def _new_object(self, obj: TextureObject) -> tuple[int]:
        objects = self._objects()
        value, self.next_object = self.next_object, self.next_object + 16
        objects[value] = obj
        return (value,)

    def xpuTexObjectCreate(self, array: Array | None, res: bytes, tex: bytes, view: bytes | None) -> tuple[int]:
        self._resource(array, res)
        if view is not None and array is None:
            raise CudaError(errors.INVALID_VALUE, "a resource view needs an array resource")
        return self._new_object(TextureObject("tex", bytes(res), array, bytes(tex), view and bytes(view)))

    def xpuSurfObjectCreate(self, array: Array | None, res: bytes) -> tuple[int]:
        self._resource(array, res)
        if array is None:  # an array made without SURFACE_LDST is taken, as the driver (580.159) does
            raise CudaError(errors.INVALID_VALUE, "a surface object's resource is an array")
        return self._new_object(TextureObject("surf", bytes(res), array))

    def _destroy_object(self, value: int, kind: str) -> None:
        obj = self._objects().get(value)
        if obj is None or obj.kind != kind:
            raise CudaError(errors.INVALID_VALUE, f"{value:#x} is not a {kind} object of this session")
        del self._objects()[value]

    def cuTexObjectDestroy(self, value: int) -> None:
        self._destroy_object(value, "tex")

    def cuSurfObjectDestroy(self, value: int) -> None:
        self._destroy_object(value, "surf")
