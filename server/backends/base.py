"""What a backend is: the device inventory, and calls executed by family name."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, fatbin
from xpuremote.protocol.calls import Call
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import CLUSTER_DIMENSION, LAUNCH_ATTRIBUTE

Namer = Callable[[str, Any, Any], int]  # (handle type, object, owner) -> the object's handle for the client

# refused on a capturing stream (the client refuses them first): work whose data is the client's host
# memory, which a graph replayed on the server could not reach
CAPTURE_REFUSED = ("cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "xpuMemcpy2DFromHost", "xpuMemcpy2DToHost",
                   "xpuMemcpyArrayFromHost", "xpuMemcpyArrayToHost", "xpuHostFunc")


def _outputs(call: Call) -> tuple[int, ...]:
    """A call's output parameters: not passed to the backend."""
    outputs = _OUTPUTS.get(call.symbol)
    if outputs is None:
        outputs = _OUTPUTS[call.symbol] = tuple(i for i, p in enumerate(call.params) if p.direction == "out")
    return outputs


def launch_attributes(data: bytes | None, count: int) -> list[tuple[int, bytes]]:
    """cuLaunchKernelEx's attributes as (id, 64 bytes of value)."""
    raw = bytes(data or b"")
    return [LAUNCH_ATTRIBUTE.unpack_from(raw, i * LAUNCH_ATTRIBUTE.size) for i in range(count)]


def cluster_size(attributes: list[tuple[int, bytes]]) -> int:
    """Blocks per cluster that the launch asks for (1 without CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)."""
    for ident, value in attributes:
        if ident == CLUSTER_DIMENSION:
            x, y, z = struct.unpack_from("<3I", value)
            return x * y * z
    return 1


def check_module_image(image: bytes, sm: int) -> str:
    """A module image's kind, "elf" or "ptx", or the driver's error for it (fatbin.check_module_image)."""
    try:
        return fatbin.check_module_image(image, sm)
    except fatbin.NoBinaryForGpu as exc:
        raise CudaError(errors.NO_BINARY_FOR_GPU, f"cannot load the module image: {exc}") from None
    except (ValueError, IndexError, struct.error) as exc:
        raise CudaError(errors.INVALID_IMAGE, f"cannot read the module image: {exc}") from None


_OUTPUTS: dict[str, tuple[int, ...]] = {}  # a call's output parameters: not passed to the backend


@dataclass
class DeviceInfo:
    """What the client needs to answer device queries locally: fetched once, at connect."""

    name: str
    uuid: bytes
    total_mem: int
    attributes: dict[int, int]  # CUdevice_attribute -> value
    pci: tuple[int, int, int]  # domain, bus, device
    sm: int  # compute capability as major*10+minor, e.g. 90
    refused: list[int] = field(default_factory=list)  # attributes the driver does not know (older than cuda.h)

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "uuid": self.uuid, "total_mem": self.total_mem,
                "attributes": self.attributes, "pci": list(self.pci), "sm": self.sm, "refused": self.refused}


@dataclass
class Inventory:
    driver_version: int
    devices: list[DeviceInfo] = field(default_factory=list)
    backend: str = ""

    def to_wire(self) -> dict[str, Any]:
        return {"driver_version": self.driver_version, "backend": self.backend,
                "devices": [d.to_wire() for d in self.devices]}


class Backend:
    """Executes driver calls for one client session.

    `execute` gets the wire arguments aligned with `call.params` (handles already resolved to
    the backend's own objects; an output parameter's value is its size in bytes, or None when
    the application passed NULL) and returns the outputs aligned with `call.outputs`.
    The default calls the method named after the call's family with the inputs only, on the
    backend itself for driver calls and on `library(call.library)` for a math library's.
    """

    name = "base"
    handles: dict[int, tuple[str, Any]] = {}

    def handle_of(self, family: str, obj: Any) -> int:
        """The client's handle of one of the session's objects (found by looking: for rare questions)."""
        found = next((h for h, (f, o) in self.handles.items() if f == family and o == obj), None)
        if found is None:
            raise CudaError(errors.NOT_FOUND, f"no handle of the session names that {family}")
        return found

    def name_handle(self, ctype: str, obj: Any, owner: Any) -> int:
        """Replaced by the session's (bind)."""
        raise CudaError(errors.NOT_SUPPORTED, "no session names this backend's objects")

    def drop_handle(self, handle: int) -> None:
        """Replaced by the session's (bind)."""
        self.handles.pop(handle, None)

    def owner_of(self, ctype: str, obj: Any) -> Any:
        """Replaced by the session's (bind): the owner an object's handle was made with, or None."""
        return None

    def handle_array(self, data: bytes | None, count: int, family: str) -> list[Any]:
        """The objects an array of client handles names, each of `family` (a CUgraphNode array, say)."""
        raw = bytes(data or b"")
        if len(raw) < 8 * count:
            raise CudaError(errors.INVALID_VALUE, f"{count} handles in {len(raw)} bytes")
        found = []
        for (handle,) in struct.iter_unpack("<Q", raw[: 8 * count]):
            entry = self.handles.get(handle)
            if entry is None or entry[0] != family:
                raise CudaError(errors.INVALID_VALUE, f"{handle:#x} is not a live {family}")
            found.append(entry[1])
        return found

    def inventory(self) -> Inventory:
        raise NotImplementedError

    def capture_graph(self, stream: Any) -> Any | None:
        """The graph a stream is capturing into, or None (the limits' question about stream-ordered allocation)."""
        return None

    def execute(self, call: Call, args: list[Any]) -> list[Any]:
        if call.library == "cuda":
            method = getattr(self, call.family, None)
        else:
            method = getattr(self.library(call.library), call.family, None)
        if method is None:
            raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol} is not implemented by the {self.name} backend")
        outputs = _outputs(call)
        outs = method(*args) if not outputs else method(*[a for i, a in enumerate(args) if i not in outputs])
        return list(outs) if outs is not None else []

    def runner(self, call: Call) -> Callable[[list[Any]], Any]:
        """`execute` for one call, compiled: what the session's hot path (the lane) calls per record. A backend
        whose `execute` does more than dispatch keeps it."""
        direct = self.direct(call)
        if type(self).execute is Backend.execute and direct is not None:
            return direct
        return lambda args: self.execute(call, args)

    def direct(self, call: Call) -> Callable[[list[Any]], Any] | None:
        """What Backend.execute does for a driver call, its method looked up once (a call without outputs gets
        the method's own result); None where the backend has no method for it."""
        method = getattr(self, call.family, None) if call.library == "cuda" else None
        if method is None:
            return None
        outputs = _outputs(call)
        if not outputs:
            return lambda args: method(*args)
        inputs = [i for i in range(len(call.params)) if i not in outputs]

        def run(args: list[Any]) -> list[Any]:
            outs = method(*[args[i] for i in inputs])
            return list(outs) if outs is not None else []
        return run

    def library(self, name: str) -> Any:
        """What serves the math library `name` (its families as methods), or None."""
        return None

    def bind(self, handles: dict[int, tuple[str, Any]], name: Namer | None = None,
             drop: Callable[[int], None] | None = None, owner: Callable[[str, Any], Any] | None = None) -> None:
        """The session's handle table (client handle -> (type, object)), for libraries whose
        arguments hold handles inside arrays (cuDNN's descriptor attributes); `name(type, object,
        owner)`: the one handle of an object the backend made on its own (the nodes of a capture),
        forgotten with its owner's; `drop(handle)`: forget a handle whose object is gone;
        `owner(type, object)`: what a handle was made with as its owner (a node's graph)."""
        self.handles = handles
        if name is not None:
            self.name_handle = name
        if drop is not None:
            self.drop_handle = drop
        if owner is not None:
            self.owner_of = owner

    def close(self) -> None:
        """Release everything this session holds."""
