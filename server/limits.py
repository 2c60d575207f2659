"""Per-client limits, enforced in the client's worker: a device memory quota, how many handles it
may hold, and which addresses it may name.

`Accounted` wraps a session's backend, so that every backend gets the same checks. It counts the
device memory the client holds (cuMemAlloc, cuMemAllocPitch at the driver's granularity, and the
variables of the modules it loads; host memory does not count), refuses an allocation beyond the
quota with CUDA_ERROR_OUT_OF_MEMORY (for this client only: every client has its own worker), and
keeps the peak for the session's log line and metrics. `--max-handles` bounds the live handles of
each kind (allocations here, streams, events, modules and descriptors in the worker's session).
Every device address a call names (a CUdeviceptr, a math library's data pointer or device-mode
scalar, the pointers inside cuBLASLt and cuDNN attributes) must lie, with the bytes the call
touches, inside the client's own allocations or module variables: a hand-made client cannot make
the real driver read or write the worker's own memory, nor reach around the quota. (Calls the
client library never sends, such as copies whose structs hold host pointers, the worker refuses
before decoding them: `Call.sent`.)
"""

from __future__ import annotations

import bisect
import ctypes
import re
import struct
from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import errors, fatbin, mathlibs, wire
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.errors import CudaError

from .backends.base import Backend, Inventory

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
GRANULE = 512  # what the driver aligns each allocation to: a 1-byte allocation costs this much
DEFAULT_MAX_HANDLES = 1 << 16  # of each kind (allocations, streams, events, modules, descriptors...)
DEFAULT_CONNECT_TIMEOUT_S = 10.0  # a session's client has this long to connect after its hello
# attribute values that are device addresses: cuDNN's VOID_PTR arrays (a variant pack's data), and
# cuBLASLt's matmul descriptor pointers (bias, scales, epilogue auxiliaries)
_DNN, _LT = mathlibs.api(mathlibs.CUDNN).ENUMS, mathlibs.api(mathlibs.CUBLASLT).ENUMS
DNN_VOID_PTR, DNN_DATA_POINTERS = _DNN["CUDNN_TYPE_VOID_PTR"], _DNN["CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS"]
LT_POINTER_ATTRIBUTES = frozenset(v for k, v in _LT.items()
                                  if k.startswith("CUBLASLT_MATMUL_DESC_") and k.endswith("_POINTER"))


def parse_size(text: str) -> int:
    """'512M', '2G', '1048576' -> bytes (binary units; a trailing B or iB is allowed)."""
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in UNITS else ""
    number = float(value[: len(value) - len(unit)])
    if number < 0:
        raise ValueError(f"negative size {text!r}")
    return int(number * UNITS[unit])


@dataclass
class Limits:
    mem_quota: int = 0  # bytes of device memory per client; 0: no quota
    max_request_bytes: int = 0  # bytes in one request message; 0: no limit
    max_handles: int = DEFAULT_MAX_HANDLES  # live handles of each kind per client; 0: no limit

    def check_count(self, held: int, kind: str) -> None:
        """One more `kind` may be made, or CUDA_ERROR_OUT_OF_MEMORY for this client."""
        if self.max_handles and held >= self.max_handles:
            raise CudaError(errors.OUT_OF_MEMORY, f"this client holds {held} {kind}, the server's limit "
                            f"(--max-handles)")

    def request_frames(self) -> int:
        """Most frames a request within max_request_bytes can have (0: no bound): a header, then bulk
        frames of over INLINE_MAX bytes each. Bounds what a message of empty frames costs."""
        return 1 + self.max_request_bytes // wire.INLINE_MAX if self.max_request_bytes else 0


def give_back_memory() -> None:
    """Return free heap pages to the system (glibc; elsewhere nothing). After a refused message:
    ZeroMQ took it in whole, and the allocator would otherwise keep that much for good."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


_LIBC = ctypes.CDLL(None)


class Regions:
    """Address ranges of device memory, looked up by any byte inside them."""

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.sizes: dict[int, int] = {}

    def add(self, base: int, size: int) -> None:
        if base not in self.sizes:
            bisect.insort(self.bases, base)
        self.sizes[base] = max(size, self.sizes.get(base, 0))

    def remove(self, base: int) -> None:
        if self.sizes.pop(base, None) is not None:
            self.bases.remove(base)

    def holds(self, address: int, size: int) -> bool:
        i = bisect.bisect_right(self.bases, address) - 1
        return i >= 0 and address + size <= self.bases[i] + self.sizes[self.bases[i]]


@dataclass
class LoadedImage:
    key: bytes
    charge: int  # bytes of its variables, counted against the quota
    refs: int = 1  # client module handles on it (the backends load an image once per session)
    variables: tuple[tuple[int, int], ...] = ()  # (address, size) the client has looked up


class Accounted(Backend):
    """A backend with the session's device memory counted and capped, and its calls checked."""

    def __init__(self, inner: Backend, limits: Limits) -> None:
        self.inner = inner
        self.limits = limits
        self.name = inner.name
        self.sizes: dict[int, int] = {}  # address -> bytes charged, of this client's allocations
        self.regions = Regions()  # where this client's device addresses may point
        self.images: dict[int, LoadedImage] = {}  # by the backend's module object (_ident)
        self.used = 0
        self.peak = 0

    def __getattr__(self, name: str) -> Any:  # the backend's own attributes (memory, ...)
        return getattr(self.inner, name)

    def inventory(self) -> Inventory:
        return self.inner.inventory()

    def bind(self, handles: dict[int, tuple[str, Any]]) -> None:
        self.inner.bind(handles)

    def close(self) -> None:
        self.inner.close()
        self.sizes.clear()
        self.images.clear()
        self.used = 0

    def execute(self, call: Call, args: list[Any]) -> list[Any]:
        self.check_addresses(call, args)
        if call.family in ("cuMemAlloc", "cuMemAllocPitch"):
            return self.allocate(call, args)
        if call.family == "xpuModuleLoad":
            return self.load_module(call, args)
        if call.family == "cuModuleUnload":
            return self.unload_module(call, args)
        if call.family == "cuMemFree" and args[0] not in self.sizes:
            raise CudaError(errors.INVALID_VALUE, f"{args[0]:#x} is not one of this client's allocations")
        outs = self.inner.execute(call, args)
        if call.family == "cuMemFree":
            self.charge(-self.sizes.pop(args[0]))
            self.regions.remove(args[0])
        elif call.family == "cuModuleGetGlobal":
            self.learn_variable(args[2], _integer(outs[0]), _integer(outs[1]))
        return outs

    # ---- addresses ---------------------------------------------------------------------------
    def check_addresses(self, call: Call, args: list[Any]) -> None:
        """Every device address the call names lies, with the bytes it touches, in this client's memory."""
        values = {p.name: a for p, a in zip(call.params, args) if p.kind in ("int", "float")}
        for p, value in zip(call.params, args):
            if (p.is_device or p.is_scalar) and isinstance(value, int) and value:
                try:
                    extent = p.device_extent(values)
                except (TypeError, ValueError, KeyError):  # a size that is not a number: the decoder says so
                    extent = 1
                self.check_address(call, p.name, value, extent)
        for address in _embedded_addresses(call, args):
            if _by_value(call, args) and not self.regions.holds(address, 1):
                self.check_by_value(address)
            else:
                self.check_address(call, f"attribute {args[1]}", address, 1)

    def check_by_value(self, address: int) -> None:
        """A variant pack's pointer outside device memory is a by-value scalar's (cudnn-frontend passes
        attention scales so): the application's host address, which a real cuDNN would read in the
        worker's own memory. Refused there until its bytes travel; the sim never follows it."""
        if getattr(self.inner, "follows_host_pointers", False):
            raise errors.library_error("cudnn", "not_supported", f"a by-value tensor (host pointer {address:#x} in "
                                       "a variant pack) is not forwarded yet")

    def check_address(self, call: Call, what: str, address: int, size: int) -> None:
        if address and not self.regions.holds(address, max(size, 1)):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: {what} [{address:#x}, +{size}) is not inside "
                            f"one of this client's allocations")

    # ---- allocations ---------------------------------------------------------------------------
    def allocate(self, call: Call, args: list[Any]) -> list[Any]:
        ins = [a for p, a in zip(call.params, args) if p.direction != "out"]
        wanted = ins[0] * (ins[1] if call.family == "cuMemAllocPitch" else 1)
        self.limits.check_count(len(self.sizes), "allocations")
        self.check_quota(_granules(wanted))
        outs = self.inner.execute(call, args)
        address = _integer(outs[0])
        pitched = call.family == "cuMemAllocPitch" and outs[1] is not None
        size = _integer(outs[1]) * ins[1] if pitched else wanted  # pitch * height
        try:
            self.check_quota(_granules(size))
        except CudaError:
            self.inner.execute(CALLS["cuMemFree_v2"], [address])  # the pitch rounded it over the quota
            raise
        self.sizes[address] = _granules(size)
        self.regions.add(address, size)
        self.charge(_granules(size))
        return outs

    def charge(self, size: int) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)

    def check_quota(self, size: int) -> None:
        quota = self.limits.mem_quota
        if quota and self.used + size > quota:
            raise CudaError(errors.OUT_OF_MEMORY, f"{size} bytes requested; this client holds {self.used} "
                            f"of its quota of {quota} bytes")

    # ---- modules: their variables are device memory too ----------------------------------------
    def load_module(self, call: Call, args: list[Any]) -> list[Any]:
        key, image = bytes(args[1]), args[2]
        loaded = next((i for i in self.images.values() if i.key == key), None)
        charge = 0 if loaded else _variable_bytes(image)
        self.check_quota(charge)
        outs = self.inner.execute(call, args)
        ident = _ident(outs[0])
        if ident in self.images:
            self.images[ident].refs += 1
        else:
            self.images[ident] = LoadedImage(key, charge)
            self.charge(charge)
        return outs

    def unload_module(self, call: Call, args: list[Any]) -> list[Any]:
        """The image is unloaded with its last handle; its variables then count no more."""
        loaded = self.images.get(_ident(args[0]))
        if loaded is None:
            raise CudaError(errors.INVALID_HANDLE, f"{call.symbol}: not a loaded module")
        if loaded.refs > 1:
            loaded.refs -= 1
            return []
        outs = self.inner.execute(call, args)
        del self.images[_ident(args[0])]
        self.charge(-loaded.charge)
        for address, _ in loaded.variables:
            self.regions.remove(address)
        return outs

    def learn_variable(self, module: Any, address: int, size: int) -> None:
        """A variable the client looked up: its address is one the client may name from now on."""
        loaded = self.images.get(_ident(module))
        if loaded is not None and address:
            loaded.variables += ((address, size),)
            self.regions.add(address, size)


def _granules(size: int) -> int:
    return -(-size // GRANULE) * GRANULE


def _variable_bytes(image: Any) -> int:
    """Device memory a module image's variables take: a cubin's sections of them, or what PTX declares."""
    data = bytes(image)
    try:
        if data[:4] == fatbin.ELF_MAGIC:
            return fatbin.variable_bytes(data)
        return _ptx_variable_bytes(data)
    except (ValueError, IndexError, struct.error) as exc:
        raise CudaError(errors.INVALID_IMAGE, f"cannot read the module image: {exc}") from None


# A module-scope `.global`/`.const` declaration (not `ld.global`): its vector width, element bits and
# array dimensions up to an initializer or the end. Bounded repeats keep the scan linear in the text.
_PTX_VARIABLE = re.compile(rb"(?<![\w.])\.(?:global|const)\b[^;=]{0,64}?\.(?:v([248])\s+\.)?[bsuf](8|16|32|64|128)"
                           rb"\s+[\w$%]{1,512}((?:\s*\[\s*\d{0,20}\s*\]){0,8})")


def _ptx_variable_bytes(ptx: bytes) -> int:
    """Bytes PTX text declares in the global and constant state spaces (what JIT compiling it commits)."""
    total = 0
    for match in _PTX_VARIABLE.finditer(ptx):
        vector, bits, dims = match.groups()
        size = int(vector or 1) * int(bits) // 8
        for dim in re.findall(rb"\d+", dims):
            size *= int(dim)
        total += size
    return total


def _embedded_addresses(call: Call, args: list[Any]) -> list[int]:
    """Device addresses inside an attribute's bytes."""
    if call.family == "cudnnBackendSetAttribute" and args[2] == DNN_VOID_PTR and args[4] is not None:
        data = bytes(args[4])
        return [a for (a,) in struct.iter_unpack("<Q", data[: len(data) // 8 * 8])]
    if call.family == "cublasLtMatmulDescSetAttribute" and args[1] in LT_POINTER_ATTRIBUTES and args[2] is not None:
        data = bytes(args[2])
        return [int.from_bytes(data[:8], "little")] if len(data) >= 8 else []
    return []


def _by_value(call: Call, args: list[Any]) -> bool:
    return call.family == "cudnnBackendSetAttribute" and args[1] == DNN_DATA_POINTERS


def _ident(module: Any) -> int:
    """A backend's module object as a key: the cuda backend's is a number, the sim's an object."""
    return module if isinstance(module, int) else id(module)


def _integer(value: Any) -> int:
    """An output integer as the backends give it: a Python int (sim) or its bytes (cuda)."""
    return value if isinstance(value, int) else int.from_bytes(bytes(value)[:8], "little")
