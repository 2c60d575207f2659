"""The real GPU: calls replayed on NVIDIA's libcuda.so.1 through cffi (ABI mode).

Generic by construction: every call of the table is made with the C signature the table
gives, inputs from the wire, outputs into buffers that go back. Only the client's own
requests (lazily uploaded images, packed launches, 2D copies) and the device inventory are
written by hand. XPU_CUDA_LIBRARY overrides which libcuda is loaded.

The math libraries' calls go the same way to NVIDIA's own libcublas, libcublasLt and libcudnn,
found in the server's NVIDIA wheels (as PyTorch installs them), else by name on the library
path; XPU_CUBLAS_LIBRARY, XPU_CUBLASLT_LIBRARY and XPU_CUDNN_LIBRARY override that. What is
hand-written for them: the library versions, and the client handles inside cuDNN's descriptor
arrays, which become the real descriptors. NCCL's libnccl.so.2 (XPU_NCCL_LIBRARY) too, but for
communicator creation, which waits for the peers with a timeout (cuda_nccl.py).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cffi

from xpuremote.protocol import abi, errors, mathlibs, memprops, wire
from xpuremote.protocol.calls import CALLS, DEFAULT_STREAMS, Call, Param
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import (
    ARRAY3D_DESCRIPTOR,
    ARRAY_DESCRIPTOR,
    ARRAY_FORMAT_BYTES,
    CONDITIONAL_NODE,
    DEV_RESOURCE,
    EVENT_ATTRIBUTES,
    KERNEL_NODE_V2,
    LAUNCH_ATTRIBUTE,
    LAUNCH_CONFIG,
    MEM_ALLOC_NODE,
    MEMCPY2D,
    MEMCPY3D,
    MEMSET_NODE,
    RESOURCE_ARRAY,
    SM_RESOURCE,
)

from ..data import Incoming
from . import cuda_nccl
from .base import CAPTURE_REFUSED, Backend, DeviceInfo, Inventory, check_module_image, launch_attributes
from .cuda_pools import PlacedPools
from .cuda_upload import Upload
from .nvml_status import NvmlStatus

RELAXED = ENUMS["CU_STREAM_CAPTURE_MODE_RELAXED"]
SM_RESOURCE_TYPE = ENUMS["CU_DEV_RESOURCE_TYPE_SM"]
IGNORE_COSCHEDULING = ENUMS["CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING"]
ARRAY_CLEAR_BYTES = 16 << 20  # host zeros copied at a time into a new CUDA array
C_INT = {(1, 0): "uint8_t", (1, 1): "int8_t", (2, 0): "uint16_t", (2, 1): "int16_t",
         (4, 0): "uint32_t", (4, 1): "int32_t", (8, 0): "uint64_t", (8, 1): "int64_t"}
HOST, DEVICE, ARRAY = ENUMS["CU_MEMORYTYPE_HOST"], ENUMS["CU_MEMORYTYPE_DEVICE"], ENUMS["CU_MEMORYTYPE_ARRAY"]
EXECUTE_HANDLES = ("cudnnHandle_t", "cudnnBackendDescriptor_t")  # what xpuCudnnExecute's handle and plan name


def c_type(p: Param) -> str:
    if p.kind == "handle" and p.size < 8:  # an integer handle (cufftHandle)
        return C_INT[(p.size, 1)]
    if p.kind in ("ptr", "handle"):
        return "void *"
    if p.kind == "float":
        return "float" if p.size == 4 else "double"
    if p.kind == "struct":
        return f"xpu_struct{p.size}"
    return C_INT[(p.size, int(p.signed))]


def declarations() -> str:
    sizes = sorted({p.size for c in CALLS.values() for p in c.params if p.kind == "struct"})
    lines = [f"typedef struct {{ unsigned char b[{s}]; }} xpu_struct{s};" for s in sizes]
    for call in CALLS.values():
        if not call.symbol.startswith("xpu"):
            lines.append(f"int {call.symbol}({', '.join(c_type(p) for p in call.params) or 'void'});")
    return "\n".join(lines)


def library_path(lib: mathlibs.Library) -> str:
    """NVIDIA's `lib` for this server: the override, the wheel's copy, or the loader's choice."""
    override = os.environ.get(f"XPU_{lib.name.upper()}_LIBRARY")
    if override:
        return override
    try:
        import nvidia  # namespace package of NVIDIA's wheels

        for base in nvidia.__path__:
            for sub in ("cu13", "cudnn", "cublas", "nccl", "cusparselt"):
                candidate = Path(base) / sub / "lib" / lib.soname
                if candidate.is_file():
                    return str(candidate)
    except ImportError:
        pass
    return lib.soname


# driver calls written by hand: the image cache must hear of unloads, a kernel's handle here is the
# CUfunction of its module (xpuModuleGetFunction), so the cuKernel* calls take their cuFunc* forms, and a
# green context's CUcontext is forgotten with it
OWN = ("cuModuleUnload", "cuKernelGetAttribute", "cuKernelSetAttribute", "cuKernelSetCacheConfig", "cuGreenCtxDestroy",
       *("cuMemPoolGetAttribute", "cuMemPoolSetAttribute", "cuMemPoolTrimTo", "cuMemPoolDestroy"))  # + placed memory


class CudaBackend(Backend):
    name = "cuda"
    follows_host_pointers = True  # NVIDIA's libraries read a host address they are given (limits.py)

    def __init__(self) -> None:
        self.ffi = cffi.FFI()
        self.ffi.cdef(declarations())
        self.lib = self.ffi.dlopen(os.environ.get("XPU_CUDA_LIBRARY", "libcuda.so.1"))
        self.modules: dict[bytes, int] = {}  # content hash -> CUmodule, within this session
        self.nvml: NvmlStatus | None = None  # loaded on the first xpuDeviceStatus
        self.libraries: dict[str, Any] = {}  # math library name -> its cffi handle, loaded on first use
        self.libc: Any = None  # aligned_alloc and free, for the structs a library initialises (library_struct)
        self.green_contexts: dict[int, Any] = {}  # green context -> the CUcontext that stands for it
        self.upload: Upload | None = None  # made on the first large input from the data connection
        self.scalars: dict[int, Any] = {}  # cuDNN variant pack -> its by-value scalars (xpuCudnnSetDataPointers)
        self.compiled: dict[int, Callable[[list[Any]], list[Any]]] = {}  # opcode -> its generic path (generic())
        self.check(self.lib.cuInit(0), "cuInit")
        # pools' allocations at the client's addresses, zeroed as any new memory is
        self.placed = PlacedPools(self.ffi, self.lib, self.check, self.zero)

    def check(self, status: int, what: str, library: str = "cuda") -> None:
        if status:
            raise CudaError(status, f"{what} on the server's GPU", library)

    def library(self, name: str) -> Any:
        if name not in self.libraries:
            lib = mathlibs.BY_NAME[name]
            try:
                self.libraries[name] = self.ffi.dlopen(library_path(lib))
            except OSError as exc:
                raise errors.library_error(name, "not_initialized", f"cannot load {lib.soname}: {exc}") from None
        return self.libraries[name]

    def xpuLibraryVersion(self, name: str) -> tuple[list[int] | None]:
        """major, minor, patch of the server's copy (libraryPropertyType 0, 1, 2), or None."""
        lib = mathlibs.BY_NAME.get(name)
        if lib is None:
            return (None,)
        try:
            real = self.library(name)
        except CudaError:
            return (None,)
        if name == "nccl":  # no ncclGetProperty: its version is one number
            return (cuda_nccl.version(self.ffi, real),)
        value = self.ffi.new("int32_t *")
        version = []
        for kind in range(3):
            self.check(getattr(real, f"{lib.prefix}GetProperty")(kind, value), f"{lib.prefix}GetProperty", name)
            version.append(value[0])
        return (version,)

    def xpuCudnnGetDescriptors(self, descriptor: int, name: int, requested: int,
                               handles: bytes | None) -> tuple[int]:
        """cudnnBackendGetAttribute of descriptors: the caller's own descriptors are filled."""
        real = self.real_descriptors(handles or b"")
        count = self.ffi.new("int64_t *")
        array = self.ffi.new("uint64_t[]", real) if real else self.ffi.NULL
        status = self.library("cudnn").cudnnBackendGetAttribute(
            self.ffi.cast("void *", self.real_descriptor(descriptor)), name,
            mathlibs.api(mathlibs.CUDNN).ENUMS["CUDNN_TYPE_BACKEND_DESCRIPTOR"], len(real), count, array)
        self.check(status, "cudnnBackendGetAttribute", "cudnn")
        return (count[0],)

    def xpuCudnnSetDataPointers(self, descriptor: int, count: int, pointers: bytes, by_value: bytes,
                                scalars: bytes) -> None:
        """A variant pack's data pointers, a by-value scalar's pointing at its bytes in this process, where
        NVIDIA's cuDNN reads them when the pack executes: they live as long as the pack."""
        real = self.real_descriptor(descriptor)
        held, array = self.data_pointers(pointers, by_value, scalars)
        self.set_pack_attribute(real, mathlibs.CUDNN_DATA_POINTERS, mathlibs.CUDNN_VOID_PTR, count, array)
        self.scalars[real] = held

    def data_pointers(self, pointers: bytes, by_value: bytes, scalars: bytes) -> tuple[Any, Any]:
        """(the by-value scalars' bytes, held here; the pointers, a by-value scalar's pointing at its bytes)."""
        held = self.ffi.new("char[]", bytes(scalars) or b"\0")
        base = int(self.ffi.cast("uintptr_t", held))
        addresses = [base + 8 * i if by_value[i] else p for i, (p,) in enumerate(struct.iter_unpack("<Q", pointers))]
        return held, self.ffi.new("uint64_t[]", addresses or [0])

    def set_pack_attribute(self, pack: Any, name: int, kind: int, count: int, values: Any) -> None:
        self.check(self.library("cudnn").cudnnBackendSetAttribute(self.ffi.cast("void *", pack), name, kind, count,
                                                                   values), "cudnnBackendSetAttribute", "cudnn")

    def xpuCudnnExecute(self, handle: int, plan: int, count: int, workspace: int, pack: bytes) -> None:
        """A variant pack the client kept, run as PyTorch's calls would have run: made, its data pointers, unique
        ids and workspace set, finalized, executed and destroyed."""
        lib, ffi = self.library("cudnn"), self.ffi
        pointers, uids, scalars, by_value = mathlibs.execute_parts(count, pack)
        real_handle = self.real_descriptor(handle, EXECUTE_HANDLES[0])
        real_plan = self.real_descriptor(plan, EXECUTE_HANDLES[1])
        made = ffi.new("void **")
        self.check(lib.cudnnBackendCreateDescriptor(mathlibs.CUDNN_VARIANT_PACK, made), "cudnnBackendCreateDescriptor",
                   "cudnn")
        pack = made[0]
        try:
            held, array = self.data_pointers(pointers, by_value, scalars)  # held until the execution is queued
            self.set_pack_attribute(pack, mathlibs.CUDNN_DATA_POINTERS, mathlibs.CUDNN_VOID_PTR, count, array)
            ids = ffi.from_buffer(bytes(uids) or b"\0")
            self.set_pack_attribute(pack, mathlibs.CUDNN_UNIQUE_IDS, mathlibs.CUDNN_INT64, count, ids)
            space = ffi.new("uint64_t[1]", [workspace])
            self.set_pack_attribute(pack, mathlibs.CUDNN_WORKSPACE, mathlibs.CUDNN_VOID_PTR, 1, space)
            self.check(lib.cudnnBackendFinalize(pack), "cudnnBackendFinalize", "cudnn")
            self.check(lib.cudnnBackendExecute(ffi.cast("void *", real_handle), ffi.cast("void *", real_plan), pack),
                       "cudnnBackendExecute", "cudnn")
        finally:
            lib.cudnnBackendDestroyDescriptor(pack)

    def real_descriptor(self, handle: int, family: str | None = None) -> int:
        found = self.handles.get(handle)
        if found is None or family is not None and found[0] != family:
            raise errors.library_error("cudnn", "invalid_value",
                                       f"{handle:#x} is not a live {family or 'descriptor or handle'}")
        return int(found[1])

    def real_descriptors(self, data: bytes) -> list[int]:
        return [self.real_descriptor(h) for (h,) in struct.iter_unpack("<Q", data)]

    def library_arguments(self, call: Call, args: list[Any]) -> list[Any]:
        """cuDNN attribute arrays of descriptors (or of the cuDNN handle) hold client handles."""
        if call.family != "cudnnBackendSetAttribute":
            return args
        enums = mathlibs.api(mathlibs.CUDNN).ENUMS
        if args[2] in (enums["CUDNN_TYPE_BACKEND_DESCRIPTOR"], enums["CUDNN_TYPE_HANDLE"]) and args[4]:
            return [*args[:4], struct.pack(f"<{args[3]}Q", *self.real_descriptors(bytes(args[4])))]
        return args

    def handle_arrays(self, call: Call, args: list[Any]) -> list[Any]:
        """A driver call's input arrays of handles (graph nodes) hold client handles: the real ones go."""
        if call.library != "cuda":
            return args
        return [self.real_handles(a, p.ctype.replace("const ", "").rstrip(" *")) if _handle_array(p) and a else a
                for p, a in zip(call.params, args)]

    def stream_arrays(self, call: Call, args: list[Any]) -> list[Any]:
        """cuSPARSELt's array of streams (cusparseLtMatmul's `streams`) holds client streams: the real ones go."""
        out = list(args)
        for i, p in enumerate(call.params):
            if _stream_array(p) and args[i]:
                data = bytes(args[i])
                streams = [s if s in DEFAULT_STREAMS else int(self.ffi.cast("uintptr_t", self.handle_array(
                    struct.pack("<Q", s), 1, "CUstream")[0])) for (s,) in struct.iter_unpack("<Q", data)]
                out[i] = struct.pack(f"<{len(streams)}Q", *streams)
        return out

    def real_handles(self, data: bytes, family: str) -> bytes:
        """The driver's own objects for an array of client handles, each of `family`."""
        real = self.handle_array(data, len(data) // 8, family)
        return struct.pack(f"<{len(real)}Q", *(int(r) for r in real))

    def out(self, ctype: str, what: str, fn: Any, *args: Any) -> Any:
        value = self.ffi.new(ctype)
        self.check(fn(value, *args), what)
        return value[0]

    def xpuDeviceStatus(self, index: int) -> tuple[dict[str, Any]]:
        """What NVML says of the device (untested here: no GPU in this project's CI)."""
        uuid = self.ffi.new("char[16]")
        self.check(self.lib.cuDeviceGetUuid_v2(uuid, index), "cuDeviceGetUuid")
        if self.nvml is None:
            self.nvml = NvmlStatus()
        return (self.nvml.status(bytes(self.ffi.buffer(uuid))),)

    def inventory(self) -> Inventory:
        lib = self.lib
        version = self.out("int *", "cuDriverGetVersion", lib.cuDriverGetVersion)
        devices = []
        for i in range(self.out("int *", "cuDeviceGetCount", lib.cuDeviceGetCount)):
            name = self.ffi.new("char[256]")
            self.check(lib.cuDeviceGetName(name, 256, i), "cuDeviceGetName")
            uuid = self.ffi.new("char[16]")
            self.check(lib.cuDeviceGetUuid_v2(uuid, i), "cuDeviceGetUuid")
            total = self.out("uint64_t *", "cuDeviceTotalMem", lib.cuDeviceTotalMem_v2, i)
            attrs, refused = {}, []
            for code in sorted({v for k, v in ENUMS.items() if k.startswith("CU_DEVICE_ATTRIBUTE_")}):
                value = self.ffi.new("int32_t *")
                if lib.cuDeviceGetAttribute(value, code, i) == 0:
                    attrs[code] = value[0]
                else:
                    refused.append(code)

            def attr(key: str, attrs: dict[int, int] = attrs) -> int:
                return attrs.get(ENUMS[f"CU_DEVICE_ATTRIBUTE_{key}"], 0)

            devices.append(DeviceInfo(self.ffi.string(name).decode(), bytes(self.ffi.buffer(uuid, 16)), total, attrs,
                                      (attr("PCI_DOMAIN_ID"), attr("PCI_BUS_ID"), attr("PCI_DEVICE_ID")),
                                      attr("COMPUTE_CAPABILITY_MAJOR") * 10 + attr("COMPUTE_CAPABILITY_MINOR"),
                                      refused))
        return Inventory(version, devices, self.name)

    # ---- the generic path ----------------------------------------------------------------------
    def execute(self, call: Call, args: list[Any]) -> list[Any]:
        if call.family in ("cuMemFree", "cuMemFreeAsync") and args[0] in self.placed.allocations:
            per_thread = call.symbol.endswith(("_ptds", "_ptsz"))
            self.placed.free(args[0], (args[1] if len(args) > 1 else 0) or (2 if per_thread else 0))
            return []
        if call.library == "nccl" and call.family in cuda_nccl.OWN:
            return cuda_nccl.init_rank(self, call, args)
        if call.family in CAPTURE_REFUSED:
            self.refuse_if_capturing(call, args)
        own = getattr(self, call.family, None) if call.family.startswith("xpu") or call.family in OWN else None
        if own is not None:
            try:
                return Backend.execute(self, call, args)
            except AttributeError as exc:  # cffi's answer for a symbol this driver lacks
                if "not found in library" not in str(exc):
                    raise
                raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol}: the server's driver lacks it ({exc})") from None
        if call.family in ("cuMemcpyHtoD", "cuMemcpyHtoDAsync") and isinstance(args[1], Incoming):
            return self.upload_from_network(call, args)
        return self.generic(call)(args)

    def runner(self, call: Call) -> Callable[[list[Any]], Any]:
        """A call straight to its function, what `execute` looks up per call (its family's special cases, the
        function, each argument's conversion) found once: a call of integers and handles (the lane's, most
        of a batch's) by the shortest way, a math library's call or a driver call with outputs by `generic`."""
        if self.compiles(call):
            return self.plain(call)
        if call.library == "nccl" and call.family in cuda_nccl.OWN:  # waits for the peers, with a timeout
            return lambda args: cuda_nccl.init_rank(self, call, args)
        if call.family in CAPTURE_REFUSED or call.family in OWN or call.family.startswith("xpu") \
                or call.family in ("cuMemcpyHtoD", "cuMemcpyHtoDAsync"):
            return super().runner(call)
        return self.generic(call)

    def plain(self, call: Call) -> Callable[[list[Any]], None]:
        fn, check, symbol, cast = getattr(self.lib, call.symbol), self.check, call.symbol, self.ffi.cast
        handles = [i for i, p in enumerate(call.params) if p.kind == "handle" and p.ctype != "CUcontext"]
        contexts, green = [i for i, p in enumerate(call.params) if p.ctype == "CUcontext"], self.green_contexts
        void_p = self.ffi.typeof("void *")  # looked up once: by name, cffi parses it on every cast

        def run(args: list[Any]) -> None:
            args = list(args)
            for i in handles:
                args[i] = cast(void_p, args[i] or 0)
            for i in contexts:  # a green context stands in for a CUcontext, as in converter()
                args[i] = green[args[i]] if args[i] in green else cast(void_p, args[i] or 0)
            check(fn(*args), symbol)
        return run

    def generic(self, call: Call) -> Callable[[list[Any]], list[Any]]:
        """Any call of the table made with its C signature, compiled once (kept per session): the function,
        each argument's conversion, each output's buffer and what follows a family's call."""
        found = self.compiled.get(call.opcode)
        if found is not None:
            return found
        lib = self.lib if call.library == "cuda" else self.library(call.library)
        fn = getattr(lib, call.symbol, None)  # cffi raises AttributeError for a symbol the library lacks
        if fn is None:
            raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol} is not in the server's {call.library}")
        convert = [(i, self.converter(p)) for i, p in enumerate(call.params) if p.kind not in ("int", "float")]
        outputs = [(i, p) for i, p in enumerate(call.params) if p.direction != "in"]
        prepare = self.library_arguments if call.family == "cudnnBackendSetAttribute" else \
            self.handle_arrays if any(_handle_array(p) for p in call.params) and call.library == "cuda" else \
            self.stream_arrays if any(_stream_array(p) for p in call.params) else None
        after = self.after_family(call)
        check, symbol, library, result = self.check, call.symbol, call.library, self.result

        def run(args: list[Any]) -> list[Any]:
            if prepare is not None:
                args = prepare(call, args)
            c_args, buffers = list(args), {}
            for i, conversion in convert:
                c_args[i], buffers[i] = conversion(args[i])
            check(fn(*c_args), symbol, library)
            results = [result(p, buffers.get(i)) for i, p in outputs]
            if after is not None:
                after(args, results)
            return results
        self.compiled[call.opcode] = run
        return run

    def after_family(self, call: Call) -> Callable[[list[Any], list[Any]], None] | None:
        """What follows a successful call of a family: new memory zeroed, a variant pack's scalars let go."""
        family = call.family
        if family in ("cuMemAlloc", "cuMemAllocPitch"):
            return lambda args, results: self.clear(call, args, results)
        if family in ("cuMemAllocAsync", "cuMemAllocFromPoolAsync"):
            return self.clear_in_order
        if family == "cuMemCreate":
            return self.clear_physical
        if family in ("cuArrayCreate", "cuArray3DCreate"):
            return lambda args, results: self.clear_array(call, args, results)
        if family == "cudnnBackendDestroyDescriptor":
            return lambda args, results: self.scalars.pop(args[0], None)
        return None

    def compiles(self, call: Call) -> bool:
        """A driver call of integers and handles, with no outputs and no special case here."""
        return not (call.library != "cuda" or call.family in CAPTURE_REFUSED or call.family in OWN or call.outputs
                    or call.family.startswith("xpu") or any(p.kind not in ("int", "handle") for p in call.params)
                    or not hasattr(self.lib, call.symbol))

    def native_function(self, call: Call) -> tuple[int, int] | None:
        """(the driver function's address, how it takes the arguments), for the lane's C side
        (server/native_lane.py): a call `runner` compiles that names no context (a green context stands in
        for one, which only Python maps), or a launch as xpuLaunchKernel runs it."""
        if call.family == "xpuLaunchKernel":
            launch = self.ffi.addressof(self.lib, "cuLaunchKernel")
            return int(self.ffi.cast("uintptr_t", launch)), abi.NATIVE_CALL_LAUNCH
        if call.family == "xpuCudnnExecute":
            found = self.native_cudnn("cudnnBackendExecute")
            return None if found is None else (found, abi.NATIVE_CALL_EXECUTE)
        if call.library != "cuda":
            return self.native_library_function(call)
        if not self.compiles(call) or any(p.ctype == "CUcontext" for p in call.params):
            return None
        return int(self.ffi.cast("uintptr_t", self.ffi.addressof(self.lib, call.symbol))), abi.NATIVE_CALL_PLAIN

    def native_library_function(self, call: Call) -> tuple[int, int] | None:
        """A math library's call that `generic` runs with nothing before or after it and no outputs (a GEMM, a
        batch norm): its function's address, for the lane's C side to run records of the values Python ran
        (VETTED; a float or double argument by value goes in a floating register)."""
        if call.outputs or call.family.startswith("xpu") or call.family == "cudnnBackendSetAttribute" \
                or self.after_family(call) is not None or any(p.kind == "struct" for p in call.params):
            return None
        try:
            function = self.ffi.addressof(self.library(call.library), call.symbol)
        except (AttributeError, CudaError):  # not in the server's copy of the library
            return None
        return int(self.ffi.cast("uintptr_t", function)), abi.NATIVE_CALL_VETTED

    def native_cudnn(self, symbol: str) -> int | None:
        """The address of cuDNN's `symbol`, or None where the server's cuDNN lacks it or cannot be loaded."""
        try:
            return int(self.ffi.cast("uintptr_t", self.ffi.addressof(self.library("cudnn"), symbol)))
        except (AttributeError, CudaError):
            return None

    def native_execute(self) -> tuple[tuple[int, ...], tuple[str, str], Any]:
        """What the lane's C side runs xpuCudnnExecute's records with, as xpuCudnnExecute does: cuDNN's functions
        and the constants they take (abi.NATIVE_CUDNN_*'s order), the handle types of its handle and plan, and
        the library, which must stay loaded while the C side holds packs it made."""
        by_part = {abi.NATIVE_CUDNN_CREATE: self.native_cudnn("cudnnBackendCreateDescriptor"),
                   abi.NATIVE_CUDNN_SET: self.native_cudnn("cudnnBackendSetAttribute"),
                   abi.NATIVE_CUDNN_FINALIZE: self.native_cudnn("cudnnBackendFinalize"),
                   abi.NATIVE_CUDNN_DESTROY: self.native_cudnn("cudnnBackendDestroyDescriptor"),
                   abi.NATIVE_CUDNN_VARIANT_PACK: mathlibs.CUDNN_VARIANT_PACK,
                   abi.NATIVE_CUDNN_DATA_POINTERS: mathlibs.CUDNN_DATA_POINTERS,
                   abi.NATIVE_CUDNN_UNIQUE_IDS: mathlibs.CUDNN_UNIQUE_IDS,
                   abi.NATIVE_CUDNN_WORKSPACE: mathlibs.CUDNN_WORKSPACE,
                   abi.NATIVE_CUDNN_VOID_PTR: mathlibs.CUDNN_VOID_PTR, abi.NATIVE_CUDNN_INT64: mathlibs.CUDNN_INT64}
        values = tuple(by_part.get(part) or 0 for part in range(abi.NATIVE_CUDNN_COUNT))  # a missing one: refused
        return values, EXECUTE_HANDLES, self.library("cudnn")

    def upload_from_network(self, call: Call, args: list[Any]) -> list[Any]:
        """A copy whose bytes come on the data connection, in pieces (cuda_upload.py). Not into a capture: its
        buffers would become the graph's."""
        default = 2 if call.symbol.endswith(("_ptds", "_ptsz")) else 0  # CU_STREAM_PER_THREAD, or legacy
        stream = (args[3] if len(args) > 3 else None) or default
        if self.capture_graph(stream) is not None:
            raise CudaError(errors.NOT_SUPPORTED, f"{call.family} from pageable memory cannot be captured")
        if self.upload is None:
            self.upload = Upload(self.ffi, self.lib, self.check)
        self.upload(args[0], args[1], stream)
        return []

    def clear_array(self, call: Call, args: list[Any], results: list[Any]) -> None:
        """A new array is zeroed (a copy of zeros from the worker's memory), as new allocations are."""
        array = results[0]  # a handle output: the generic path's int
        if call.family == "cuArrayCreate":
            width, height, fmt, channels = ARRAY_DESCRIPTOR.unpack(bytes(args[1]))
            depth = 0
        else:
            width, height, depth, fmt, channels, _ = ARRAY3D_DESCRIPTOR.unpack(bytes(args[1]))
        row, rows, slices = width * ARRAY_FORMAT_BYTES.get(fmt, 0) * channels, max(height, 1), max(depth, 1)
        step = max(1, min(rows, ARRAY_CLEAR_BYTES // max(row, 1)))  # rows of zeros per copy
        zeros = self.ffi.new("char[]", max(row * step, 1))
        host = int(self.ffi.cast("uintptr_t", zeros))
        stream = self.ffi.new("void **")  # not the legacy stream: a blocking stream may be capturing (zero())
        status = self.lib.cuStreamCreate(stream, ENUMS["CU_STREAM_NON_BLOCKING"])
        if not status:
            for z in range(slices):
                for first in range(0, rows, step):
                    n = min(step, rows - first)
                    status = status or self.memcpy_3d((HOST, host, row, n), (ARRAY, array, 0, first, z), row, n, 1,
                                                      stream[0])
            self.lib.cuStreamDestroy_v2(stream[0])
        if status:
            self.lib.cuArrayDestroy(self.ffi.cast("void *", array))
            self.check(status, "clearing a new array (cuMemcpy3D)")

    def clear(self, call: Call, args: list[Any], results: list[Any]) -> None:
        """Zero a new allocation before the client sees it: the driver may hand out memory that
        another process has just freed, with its bytes still in it. Cleared here rather than at
        free, so that a worker that dies (kill -9) leaves nothing readable either."""
        address = int.from_bytes(results[0], "little")
        if call.family == "cuMemAlloc":
            size = args[1]
        else:  # pitch * height
            size = int.from_bytes(results[1], "little") * args[3] if results[1] is not None else args[2] * args[3]
        status = self.zero(address, size)
        if status:
            self.lib.cuMemFree_v2(address)
            self.check(status, "clearing a new allocation (cuMemsetD8)")

    def clear_in_order(self, args: list[Any], results: list[Any]) -> None:
        """A pool's allocation is zeroed on its own stream, before anything the client queues there (its
        memory is the allocation's from that point of the stream on): the pool may have grown with memory
        the driver had given another process. Not in a capture: there the allocation is the graph's, and a
        memset would be a node of the graph, run at every launch (docs/security.md)."""
        address, size, stream = int.from_bytes(results[0], "little"), args[1], self.ffi.cast("void *", args[-1] or 0)
        if self.capture_graph(args[-1]) is not None:
            return
        status = self.lib.cuMemsetD8Async(address, 0, size, stream)
        if status:
            self.lib.cuMemFreeAsync(address, stream)
            self.check(status, "clearing a new pool allocation (cuMemsetD8Async)")

    def clear_physical(self, args: list[Any], results: list[Any]) -> None:
        """VMM memory (cuMemCreate) has no address until it is mapped: it is zeroed now, through a mapping of
        the worker's own made and undone here, so that any mapping of it shows zeros or the client's bytes."""
        handle, size = int.from_bytes(results[0], "little"), args[1]
        device = memprops.ALLOCATION_PROP.unpack(bytes(args[2]))[3]
        status = self.zero_physical(handle, size, device)
        if status:
            self.lib.cuMemRelease(handle)
            self.check(status, "clearing new physical memory")

    def zero_physical(self, handle: int, size: int, device: int) -> int:
        lib, address = self.lib, self.ffi.new("uint64_t *")
        status = lib.cuMemAddressReserve(address, size, 0, 0, 0)
        if status:
            return status
        try:
            status = lib.cuMemMap(address[0], size, 0, handle, 0)
            if status:
                return status
            access = self.ffi.from_buffer(memprops.ACCESS_DESC.pack(memprops.ON_DEVICE, device,
                                                                    memprops.ACCESS_READWRITE))
            status = lib.cuMemSetAccess(address[0], size, access, 1) or self.zero(address[0], size)
            unmapped = lib.cuMemUnmap(address[0], size)
            return status or unmapped
        finally:
            lib.cuMemAddressFree(address[0], size)

    def zero(self, address: int, size: int) -> int:
        """Zero device memory and wait, on a stream made for it that does not synchronise with the
        legacy stream: a blocking stream of the client's may be capturing, and work on the legacy
        stream would break its capture. (Made each time: a kept one would outlive its context.)"""
        stream = self.ffi.new("void **")
        status = self.lib.cuStreamCreate(stream, ENUMS["CU_STREAM_NON_BLOCKING"])
        if not status:
            status = self.lib.cuMemsetD8Async(address, 0, size, stream[0]) or self.lib.cuStreamSynchronize(stream[0])
            self.lib.cuStreamDestroy_v2(stream[0])
        return status

    def converter(self, p: Param) -> Callable[[Any], tuple[Any, Any]]:
        """What turns one wire value of `p` (not a number: cffi takes those as they are) into (the C argument,
        the output buffer or None)."""
        ffi, green = self.ffi, self.green_contexts
        void_p = ffi.typeof("void *")
        if p.kind == "handle":
            if p.size < 8:  # an integer handle (cufftHandle): the library's own number
                return lambda value: (value, None)
            if p.ctype == "CUcontext":  # a green context, as a CUcontext
                return lambda value: (green[value] if value in green else ffi.cast(void_p, value or 0), None)
            return lambda value: (ffi.cast(void_p, value or 0), None)
        if p.kind == "struct":
            struct_p = ffi.typeof(f"xpu_struct{p.size} *")
            return lambda value: (ffi.new(struct_p, {"b": bytes(value)})[0], None)
        if p.by_reference:  # the server's struct of a caller's struct handle (cuSPARSELt): its address
            return lambda value: (ffi.cast(void_p, value or 0), None)
        if p.pointee == "handle" and p.pointee_size > 8 and p.direction == "out":
            return lambda value: (self.library_struct(p.pointee_size),) * 2
        if p.is_address:
            return lambda value: (ffi.cast(void_p, value or 0), None)
        scalar, given = p.is_scalar, p.direction == "in"
        scratch = p.name == "bufferOnHost"  # cuSOLVER's host workspace (protocol/mathlibs.py)
        made = ffi.typeof(f"{C_INT[(p.pointee_size, 1)] if p.pointee_size < 8 else 'uint64_t'} *") \
            if p.pointee == "handle" else ffi.typeof("char[]")

        def convert(value: Any) -> tuple[Any, Any]:
            if scalar and isinstance(value, int):  # a device address (device pointer mode)
                return ffi.cast(void_p, value or 0), None
            if given:
                if value is None:
                    return ffi.NULL, None
                if isinstance(value, Incoming):  # from the data connection, into a buffer the driver copies from
                    value = value.read()
                if scratch:  # the library writes there: a copy of its own, never the message's bytes
                    return ffi.from_buffer(bytearray(value)), None
                return ffi.from_buffer(value.encode() + b"\0" if isinstance(value, str) else value), None
            if p.pointee != "handle" and value is None:
                return ffi.NULL, None
            if p.pointee == "handle":
                buf = ffi.new(made)
            elif isinstance(value, int):  # an output's size
                buf = ffi.new(made, value)
            else:  # an inout buffer's bytes: as many back (char[] from bytes would add a NUL, one byte too many)
                buf = ffi.new(made, len(value))
                ffi.memmove(buf, value, len(value))
            return buf, buf
        return convert

    def library_struct(self, size: int) -> Any:
        """A struct of `size` bytes a library initialises (cuSPARSELt's handle, descriptors, plans: 16-byte aligned,
        which cffi's own allocations are not sure to be), zeroed; freed when its handle's object is let go."""
        if self.libc is None:
            self.ffi.cdef("void *aligned_alloc(size_t, size_t); void free(void *);")
            self.libc = self.ffi.dlopen(None)
        raw = self.libc.aligned_alloc(16, size)
        if raw == self.ffi.NULL:
            raise errors.library_error("cusparseLt", "alloc_failed", f"no host memory for a struct of {size} bytes")
        self.ffi.memmove(raw, b"\0" * size, size)
        return self.ffi.gc(raw, self.libc.free)

    def result(self, p: Param, buf: Any) -> Any:
        if buf is None:
            return None
        if p.pointee == "handle" and p.pointee_size > 8:  # the struct itself: its handle's object, held by it
            return buf
        if p.pointee == "handle":
            return int(buf[0])
        data = self.ffi.buffer(buf)  # holds the buffer: a large output is sent from it, not copied first
        return memoryview(data) if len(data) > wire.INLINE_MAX else bytes(data)

    # ---- memory pools: allocations the client placed (cuda_pools.py), and the pool calls that see them ----------
    def xpuMemPoolReserve(self, pool: int, size: int) -> tuple[int]:
        return (self.placed.reserve(pool, size),)

    def xpuMemPoolAlloc(self, pool: int, dptr: int, bytesize: int, stream: int) -> None:
        self.placed.allocate(pool, dptr, bytesize, stream or 0)

    def cuMemPoolGetAttribute(self, pool: int, attr: int) -> tuple[bytes]:
        value = self.ffi.new("char[]", memprops.POOL_VALUE_BYTES)
        self.check(self.lib.cuMemPoolGetAttribute(self.ffi.cast("void *", pool), attr, value), "cuMemPoolGetAttribute")
        driver = int.from_bytes(self.ffi.buffer(value), "little")
        answer = self.placed.figure(pool, attr, driver) & ((1 << 8 * memprops.POOL_VALUE_BYTES) - 1)
        return (answer.to_bytes(memprops.POOL_VALUE_BYTES, "little"),)

    def cuMemPoolSetAttribute(self, pool: int, attr: int, value: bytes) -> None:
        data = bytes(value).ljust(memprops.POOL_VALUE_BYTES, b"\0")
        self.check(self.lib.cuMemPoolSetAttribute(self.ffi.cast("void *", pool), attr, self.ffi.from_buffer(data)),
                   "cuMemPoolSetAttribute")
        self.placed.set_attribute(pool, attr, int.from_bytes(data[:memprops.POOL_ATTRIBUTE_SIZES.get(attr, 8)],
                                                             "little"))

    def cuMemPoolTrimTo(self, pool: int, keep: int) -> None:
        self.check(self.lib.cuMemPoolTrimTo(self.ffi.cast("void *", pool), keep), "cuMemPoolTrimTo")
        self.placed.trim(pool, keep)

    def cuMemPoolDestroy(self, pool: int) -> None:
        self.check(self.lib.cuMemPoolDestroy(self.ffi.cast("void *", pool)), "cuMemPoolDestroy")
        self.placed.destroy(pool)

    # ---- the client's own requests (protocol.calls.INTERNAL) ------------------------------------
    def xpuModuleLoad(self, key: bytes, image: bytes, size: int) -> tuple[int]:
        key = bytes(key)
        if key not in self.modules:
            check_module_image(bytes(image), self.current_sm())  # refused as the driver would, before it parses
            module = self.ffi.new("void **")
            data = self.ffi.from_buffer(bytes(image) + b"\0")  # PTX must end in NUL
            self.check(self.lib.cuModuleLoadData(module, data), "cuModuleLoadData")
            self.modules[key] = int(self.ffi.cast("uintptr_t", module[0]))
        return (self.modules[key],)

    def cuModuleUnload(self, module: int) -> None:
        """The image's last handle is gone (the worker counts them): unloaded, and out of the cache."""
        self.modules = {key: m for key, m in self.modules.items() if m != module}
        self.check(self.lib.cuModuleUnload(self.ffi.cast("void *", module)), "cuModuleUnload")

    def current_sm(self) -> int:
        """The compute capability of the current context's device, as major*10+minor."""
        device = self.out("int *", "cuCtxGetDevice", self.lib.cuCtxGetDevice)
        major, minor = (self.out("int *", "cuDeviceGetAttribute", self.lib.cuDeviceGetAttribute,
                                 ENUMS[f"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{part}"], device)
                        for part in ("MAJOR", "MINOR"))
        return major * 10 + minor

    def xpuModuleGetFunction(self, module: int, name: str) -> tuple[int]:
        fn = self.ffi.new("void **")
        self.check(self.lib.cuModuleGetFunction(fn, self.ffi.cast("void *", module), name.encode()),
                   "cuModuleGetFunction")
        return (int(self.ffi.cast("uintptr_t", fn[0])),)

    def cuKernelGetAttribute(self, attrib: int, kernel: int, dev: int) -> tuple[int]:
        return (self.out("int *", "cuFuncGetAttribute", self.lib.cuFuncGetAttribute, attrib,
                         self.ffi.cast("void *", kernel)),)

    def cuKernelSetAttribute(self, attrib: int, value: int, kernel: int, dev: int) -> None:
        self.check(self.lib.cuFuncSetAttribute(self.ffi.cast("void *", kernel), attrib, value), "cuFuncSetAttribute")

    def cuKernelSetCacheConfig(self, kernel: int, config: int, dev: int) -> None:
        self.check(self.lib.cuFuncSetCacheConfig(self.ffi.cast("void *", kernel), config), "cuFuncSetCacheConfig")

    def xpuFuncGetParams(self, func: int) -> tuple[list[list[int]]]:
        layout, offset, size = [], self.ffi.new("size_t *"), self.ffi.new("size_t *")
        while self.lib.cuFuncGetParamInfo(self.ffi.cast("void *", func), len(layout), offset, size) == 0:
            layout.append([offset[0], size[0]])
        return (layout,)

    def xpuLaunchKernel(self, func: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int,
                        stream: Any, params: bytes, param_bytes: int, flags: int) -> None:
        ffi = self.ffi
        buf = ffi.from_buffer(bytes(params))
        size = ffi.new("size_t *", len(params))
        extra = ffi.new("void *[5]", [ffi.cast("void *", 1), buf, ffi.cast("void *", 2), size, ffi.NULL])
        self.check(self.lib.cuLaunchKernel(ffi.cast("void *", func), gx, gy, gz, bx, by, bz, shared,
                                           ffi.cast("void *", stream or 0), ffi.NULL, extra), "cuLaunchKernel")

    def launch_config(self, grid: tuple, block: tuple, shared: int, stream: Any, attrs: bytes | None,
                      count: int) -> tuple[Any, Any]:
        """A CUlaunchConfig and the attributes it points to, with their events the real ones."""
        ffi = self.ffi
        real = b"".join(LAUNCH_ATTRIBUTE.pack(ident, self.real_handles(value[:8], "CUevent") + value[8:]
                                              if ident in EVENT_ATTRIBUTES else value)
                        for ident, value in launch_attributes(attrs, count))
        array = ffi.from_buffer(real) if real else ffi.NULL
        stream_value = int(ffi.cast("uintptr_t", ffi.cast("void *", stream or 0)))
        config = LAUNCH_CONFIG.pack(*grid, *block, shared, stream_value, int(ffi.cast("uintptr_t", array)), count)
        return ffi.from_buffer(config), array  # the caller keeps the attributes alive with the config

    def xpuLaunchKernelEx(self, func: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, shared: int,
                          stream: Any, params: bytes, param_bytes: int, attrs: bytes, count: int) -> None:
        ffi = self.ffi
        buf, size = ffi.from_buffer(bytes(params)), ffi.new("size_t *", len(params))
        extra = ffi.new("void *[5]", [ffi.cast("void *", 1), buf, ffi.cast("void *", 2), size, ffi.NULL])
        config, _kept = self.launch_config((gx, gy, gz), (bx, by, bz), shared, stream, attrs, count)
        self.check(self.lib.cuLaunchKernelEx(config, ffi.cast("void *", func), ffi.NULL, extra), "cuLaunchKernelEx")

    def xpuOccupancyMaxActiveClusters(self, func: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                                      shared: int, attrs: bytes | None, count: int) -> tuple[int]:
        config, _kept = self.launch_config((gx, gy, gz), (bx, by, bz), shared, None, attrs, count)
        return (self.out("int *", "cuOccupancyMaxActiveClusters", self.lib.cuOccupancyMaxActiveClusters,
                         self.ffi.cast("void *", func), config),)

    def xpuHostFunc(self, stream: Any, token: int) -> None:
        """Answer once the stream's earlier work is done; the worker then waits for the client."""
        self.check(self.lib.cuStreamSynchronize(self.ffi.cast("void *", stream or 0)), "cuStreamSynchronize")

    def memcpy_2d(self, dst: tuple[int, int, int], src: tuple[int, int, int], width: int, height: int,
                  stream: Any) -> None:
        """dst/src: (memory type, address, pitch)."""
        def side(kind: int, address: int, pitch: int) -> tuple:
            return (0, 0, kind, address if kind == HOST else 0, address if kind == DEVICE else 0, 0, pitch)

        desc = self.ffi.from_buffer(MEMCPY2D.pack(*side(*src), *side(*dst), width, height))
        self.check(self.lib.cuMemcpy2DAsync_v2(desc, self.ffi.cast("void *", stream or 0)), "cuMemcpy2DAsync")
        if HOST in (src[0], dst[0]):  # the host side is this message's buffer, gone once it is answered
            self.check(self.lib.cuStreamSynchronize(self.ffi.cast("void *", stream or 0)), "cuStreamSynchronize")

    def xpuMemcpy2DDevice(self, dst: int, dpitch: int, src: int, spitch: int, width: int, height: int,
                          stream: Any) -> None:
        self.memcpy_2d((DEVICE, dst, dpitch), (DEVICE, src, spitch), width, height, stream)

    def xpuMemcpy2DToHost(self, src: int, spitch: int, width: int, height: int, stream: Any) -> tuple[bytes]:
        host = self.ffi.new("char[]", width * height)
        address = int(self.ffi.cast("uintptr_t", host))
        self.memcpy_2d((HOST, address, width), (DEVICE, src, spitch), width, height, stream)
        return (bytes(self.ffi.buffer(host)),)

    def xpuMemcpy2DFromHost(self, dst: int, dpitch: int, src: bytes, width: int, height: int,
                            stream: Any) -> None:
        host = self.ffi.from_buffer(bytes(src))
        address = int(self.ffi.cast("uintptr_t", host))
        self.memcpy_2d((DEVICE, dst, dpitch), (HOST, address, width), width, height, stream)

    # ---- CUDA arrays: sides are (HOST or DEVICE, address, pitch, height) or (ARRAY, array, x, y, z) -----------
    def memcpy_3d(self, src: tuple, dst: tuple, width: int, height: int, depth: int, stream: Any) -> int:
        """A cuMemcpy3DAsync, waited for (a host side is this message's buffer); its status."""
        def side(kind: int, where: int, *rest: int) -> tuple:
            if kind == ARRAY:
                x, y, z = rest
                return (x, y, z, 0, ARRAY, 0, 0, where, 0, 0)
            pitch, rows = rest
            return (0, 0, 0, 0, kind, where if kind == HOST else 0, where if kind == DEVICE else 0, 0, pitch, rows)

        desc = self.ffi.from_buffer(MEMCPY3D.pack(*side(*src), *side(*dst), width, height, depth))
        handle = self.ffi.cast("void *", stream or 0)
        status = self.lib.cuMemcpy3DAsync_v2(desc, handle)
        if not status and HOST in (src[0], dst[0]):
            status = self.lib.cuStreamSynchronize(handle)
        return status

    def xpuMemcpyArrayFromHost(self, dst: int, x: int, y: int, z: int, src: bytes, width: int, height: int,
                               stream: Any) -> None:
        host = self.ffi.from_buffer(bytes(src))
        address = int(self.ffi.cast("uintptr_t", host))
        self.check(self.memcpy_3d((HOST, address, width, height), (ARRAY, dst, x, y, z), width, height, 1, stream),
                   "cuMemcpy3DAsync")

    def xpuMemcpyArrayToHost(self, src: int, x: int, y: int, z: int, width: int, height: int,
                             stream: Any) -> tuple[bytes]:
        host = self.ffi.new("char[]", max(width * height, 1))
        address = int(self.ffi.cast("uintptr_t", host))
        self.check(self.memcpy_3d((ARRAY, src, x, y, z), (HOST, address, width, height), width, height, 1, stream),
                   "cuMemcpy3DAsync")
        return (bytes(self.ffi.buffer(host, width * height)),)

    def xpuMemcpyArrayFromDevice(self, dst: int, x: int, y: int, z: int, src: int, pitch: int, width: int,
                                 height: int, stream: Any) -> None:
        self.check(self.memcpy_3d((DEVICE, src, pitch, height), (ARRAY, dst, x, y, z), width, height, 1, stream),
                   "cuMemcpy3DAsync")

    def xpuMemcpyArrayToDevice(self, dst: int, pitch: int, src: int, x: int, y: int, z: int, width: int,
                               height: int, stream: Any) -> None:
        self.check(self.memcpy_3d((ARRAY, src, x, y, z), (DEVICE, dst, pitch, height), width, height, 1, stream),
                   "cuMemcpy3DAsync")

    def xpuMemcpyArrayToArray(self, dst: int, dx: int, dy: int, dz: int, src: int, sx: int, sy: int, sz: int,
                              width: int, height: int, stream: Any) -> None:
        self.check(self.memcpy_3d((ARRAY, src, sx, sy, sz), (ARRAY, dst, dx, dy, dz), width, height, 1, stream),
                   "cuMemcpy3DAsync")

    def real_resource(self, array: int | None, desc: bytes) -> Any:
        """The client's CUDA_RESOURCE_DESC with the server's array in it (the worker resolved the handle)."""
        data = bytearray(bytes(desc))
        if int.from_bytes(data[:4], "little") == RESOURCE_ARRAY:
            data[8:16] = (array or 0).to_bytes(8, "little")
        return self.ffi.from_buffer(bytes(data))

    def xpuTexObjectCreate(self, array: int | None, res: bytes, tex: bytes, view: bytes | None) -> tuple[int]:
        value = self.ffi.new("uint64_t *")
        view_desc = self.ffi.from_buffer(bytes(view)) if view is not None else self.ffi.NULL
        self.check(self.lib.cuTexObjectCreate(value, self.real_resource(array, res), self.ffi.from_buffer(bytes(tex)),
                                              view_desc), "cuTexObjectCreate")
        return (int(value[0]),)

    def xpuSurfObjectCreate(self, array: int | None, res: bytes) -> tuple[int]:
        value = self.ffi.new("uint64_t *")
        self.check(self.lib.cuSurfObjectCreate(value, self.real_resource(array, res)), "cuSurfObjectCreate")
        return (int(value[0]),)

    # ---- green contexts ---------------------------------------------------------------------------------
    def xpuGreenCtxCreate(self, dev: int, sms: bytes, flags: int) -> tuple[int, int]:
        """A green context on the client's set of SMs (bit i: SM i): the device split into the driver's
        smallest groups, in SM order, and the groups (and the split's remainder) that hold any SM of the
        set. A group may reach past the set: the driver rounds partitions up, as its own splits do."""
        ffi, lib, size = self.ffi, self.lib, DEV_RESOURCE.size
        whole, count = ffi.new(f"char[{size}]"), ffi.new("unsigned int *")
        self.check(lib.cuDeviceGetDevResource(dev, whole, SM_RESOURCE_TYPE), "cuDeviceGetDevResource")
        split = lib.cuDevSmResourceSplitByCount
        self.check(split(ffi.NULL, count, whole, ffi.NULL, IGNORE_COSCHEDULING, 1), "cuDevSmResourceSplitByCount")
        groups, rest = ffi.new(f"char[{size * max(count[0], 1)}]"), ffi.new(f"char[{size}]")
        self.check(split(groups, count, whole, rest, IGNORE_COSCHEDULING, 1), "cuDevSmResourceSplitByCount")
        raw = bytes(ffi.buffer(groups, size * count[0])) + bytes(ffi.buffer(rest))
        mask, first, chosen = int.from_bytes(bytes(sms), "little"), 0, []
        for part in (raw[i:i + size] for i in range(0, len(raw), size)):
            n = SM_RESOURCE.unpack(DEV_RESOURCE.unpack(part)[2])[0]
            if mask >> first & ((1 << n) - 1):
                chosen.append(part)
            first += n
        desc = self.out("void **", "cuDevResourceGenerateDesc", lib.cuDevResourceGenerateDesc,
                        ffi.from_buffer(b"".join(chosen)), len(chosen))
        green = self.out("void **", "cuGreenCtxCreate", lib.cuGreenCtxCreate, desc, dev, flags)
        ctx = self.out("void **", "cuCtxFromGreenCtx", lib.cuCtxFromGreenCtx, green)
        handle = int(ffi.cast("uintptr_t", green))
        self.green_contexts[handle] = ctx  # the client names both by one handle
        return (handle,)

    def cuGreenCtxDestroy(self, green: int) -> None:
        self.check(self.lib.cuGreenCtxDestroy(self.ffi.cast("void *", green)), "cuGreenCtxDestroy")
        self.green_contexts.pop(green, None)

    # ---- stream capture and graphs: the capture is the driver's. Every capture is RELAXED here: this one
    # thread serves all of the client's threads, whose modes the client keeps (client/graphs.py).
    def refuse_if_capturing(self, call: Call, args: list[Any]) -> None:
        stream = next((a for p, a in zip(call.params, args) if p.ctype == "CUstream"), None)
        status = self.ffi.new("int *")
        self.check(self.lib.cuStreamIsCapturing(self.ffi.cast("void *", stream or 0), status), "cuStreamIsCapturing")
        if status[0]:
            raise CudaError(errors.NOT_SUPPORTED, f"{call.family} cannot be captured into a graph over a network")

    def capture_graph(self, stream: Any) -> int | None:
        status, graph, null = self.ffi.new("int *"), self.ffi.new("void **"), self.ffi.NULL
        self.check(self.lib.cuStreamGetCaptureInfo_v3(self.ffi.cast("void *", stream or 0), status, null, graph, null,
                                                      null, null), "cuStreamGetCaptureInfo")
        return int(self.ffi.cast("uintptr_t", graph[0])) if status[0] else None

    def xpuStreamBeginCapture(self, stream: Any, mode: int) -> tuple[int]:
        handle = self.ffi.cast("void *", stream or 0)
        self.check(self.lib.cuStreamBeginCapture_v2(handle, RELAXED), "cuStreamBeginCapture")
        status, graph, null = self.ffi.new("int *"), self.ffi.new("void **"), self.ffi.NULL
        self.check(self.lib.cuStreamGetCaptureInfo_v3(handle, status, null, graph, null, null, null),
                   "cuStreamGetCaptureInfo")
        return (int(self.ffi.cast("uintptr_t", graph[0])),)

    def xpuStreamEndCapture(self, stream: Any, graph_handle: int) -> None:
        graph = self.ffi.new("void **")
        status = self.lib.cuStreamEndCapture(self.ffi.cast("void *", stream or 0), graph)
        if status and self.handles.get(graph_handle, ("",))[0] == "CUgraph":
            del self.handles[graph_handle]  # the driver destroyed the graph of the failed capture
        self.check(status, "cuStreamEndCapture")

    def xpuStreamGetCaptureDependencies(self, stream: Any) -> tuple[list[int]]:
        ffi = self.ffi
        status, graph, count = ffi.new("int *"), ffi.new("void **"), ffi.new("size_t *")
        nodes, edges = ffi.new("void **"), ffi.new("void **")
        self.check(self.lib.cuStreamGetCaptureInfo_v3(ffi.cast("void *", stream or 0), status, ffi.NULL, graph, nodes,
                                                      edges, count), "cuStreamGetCaptureInfo")
        if status[0] != ENUMS["CU_STREAM_CAPTURE_STATUS_ACTIVE"]:
            raise CudaError(errors.ILLEGAL_STATE, "the stream is not capturing")
        owner, found = int(ffi.cast("uintptr_t", graph[0])), ffi.cast("uint64_t *", nodes[0])
        return ([self.name_handle("CUgraphNode", int(found[i]), owner) for i in range(count[0])],)

    def xpuGraphCountNodes(self, graph: int, roots: int) -> tuple[int]:
        count = self.ffi.new("size_t *")
        fn = self.lib.cuGraphGetRootNodes if roots else self.lib.cuGraphGetNodes
        self.check(fn(self.ffi.cast("void *", graph), self.ffi.NULL, count), "cuGraphGetNodes")
        return (count[0],)

    def xpuGraphListNodes(self, graph: int, roots: int) -> tuple[list[int]]:
        fn = self.lib.cuGraphGetRootNodes if roots else self.lib.cuGraphGetNodes
        return (self.named_nodes(lambda nodes, count: fn(self.ffi.cast("void *", graph), nodes, count), graph),)

    def xpuGraphNodeListEdges(self, node: int, dependents: int) -> tuple[list[int]]:
        fn = self.lib.cuGraphNodeGetDependentNodes_v2 if dependents else self.lib.cuGraphNodeGetDependencies_v2
        handle = self.ffi.cast("void *", node)
        return (self.named_nodes(lambda nodes, count: fn(handle, nodes, self.ffi.NULL, count),
                                 self.graph_of_node(node)),)

    def xpuGraphListEdges(self, graph: int) -> tuple[list[int]]:
        """Each edge as its two nodes' handles, from then to, one after another."""
        ffi, handle, null = self.ffi, self.ffi.cast("void *", graph), self.ffi.NULL
        count = ffi.new("size_t *")
        self.check(self.lib.cuGraphGetEdges_v2(handle, null, null, null, count), "cuGraphGetEdges")
        sources, targets = ffi.new("void *[]", max(count[0], 1)), ffi.new("void *[]", max(count[0], 1))
        self.check(self.lib.cuGraphGetEdges_v2(handle, sources, targets, null, count), "cuGraphGetEdges")
        return ([self.name_handle("CUgraphNode", int(ffi.cast("uintptr_t", end[i])), graph)
                 for i in range(count[0]) for end in (sources, targets)],)

    def named_nodes(self, ask: Callable[[Any, Any], int], graph: int) -> list[int]:
        """The client's handles of the nodes `ask(array, count)` lists (asked twice: how many, then which)."""
        count = self.ffi.new("size_t *")
        self.check(ask(self.ffi.NULL, count), "listing graph nodes")
        nodes = self.ffi.new("void *[]", max(count[0], 1))
        self.check(ask(nodes, count), "listing graph nodes")
        return [self.name_handle("CUgraphNode", int(self.ffi.cast("uintptr_t", nodes[i])), graph)
                for i in range(count[0])]

    def xpuGraphNodeGetContainingGraph(self, node: int) -> tuple[int]:
        return (self.handle_of("CUgraph", self.graph_of_node(node)),)

    def graph_of_node(self, node: int) -> int:
        """A node's graph: the one the session made its handle with, else the driver's answer (CUDA 13.1's
        cuGraphNodeGetContainingGraph, which a 13.0 driver lacks)."""
        known = self.owner_of("CUgraphNode", node)
        if known is not None:
            return known
        graph = self.ffi.new("void **")
        self.check(self.lib.cuGraphNodeGetContainingGraph(self.ffi.cast("void *", node), graph),
                   "cuGraphNodeGetContainingGraph")
        return int(self.ffi.cast("uintptr_t", graph[0]))

    def add_node(self, fn: Any, graph: int, deps: bytes | None, count: int, *params: Any) -> tuple[int]:
        node = self.ffi.new("void **")
        real = self.ffi.from_buffer(self.real_handles(bytes(deps or b"")[: 8 * count], "CUgraphNode")) if count \
            else self.ffi.NULL
        self.check(fn(node, self.ffi.cast("void *", graph), real, count, *params), "adding a graph node")
        return (int(self.ffi.cast("uintptr_t", node[0])),)

    def xpuGraphAddKernelNode(self, graph: int, deps: bytes | None, count: int, func: int, gx: int, gy: int,
                              gz: int, bx: int, by: int, bz: int, shared: int, params: bytes,
                              param_bytes: int) -> tuple[int]:
        struct_, _alive = self.kernel_node(func, (gx, gy, gz, bx, by, bz, shared), params)
        return self.add_node(self.lib.cuGraphAddKernelNode_v2, graph, deps, count, struct_)

    def xpuGraphAddConditionalNode(self, graph: int, deps: bytes | None, count: int, handle: int, kind: int,
                                   size: int) -> tuple[int, list[int]]:
        """A conditional node, and handles for the body graphs the driver made (they go with the graph)."""
        ffi = self.ffi
        ctx = self.out("void **", "cuCtxGetCurrent", self.lib.cuCtxGetCurrent)
        conditional = CONDITIONAL_NODE.pack(handle, kind, size, 0, int(ffi.cast("uintptr_t", ctx)))
        params = ffi.new("char[256]", struct.pack("<i12x", ENUMS["CU_GRAPH_NODE_TYPE_CONDITIONAL"]) + conditional)
        (node,) = self.add_node(self.lib.cuGraphAddNode, graph, deps, count, params)
        array = int.from_bytes(ffi.buffer(params, 256)[32:40], "little")  # the bodies, listed by the driver
        bodies = ffi.cast("uintptr_t *", array)
        return node, [self.name_handle("CUgraph", int(bodies[i]), graph) for i in range(size)]

    def kernel_node(self, func: int, grid_block_shared: tuple[int, ...], params: bytes) -> tuple[Any, Any]:
        """A CUDA_KERNEL_NODE_PARAMS_v2 whose arguments are the packed buffer (the `extra` form), and what must
        stay alive while the driver reads it."""
        ffi = self.ffi
        buf, size = ffi.from_buffer(bytes(params)), ffi.new("size_t *", len(params))
        extra = ffi.new("void *[5]", [ffi.cast("void *", 1), buf, ffi.cast("void *", 2), size, ffi.NULL])
        node = KERNEL_NODE_V2.pack(func, *grid_block_shared, 0, int(ffi.cast("uintptr_t", extra)), 0, 0)
        return ffi.from_buffer(node), (buf, size, extra, node)

    def set_node_params(self, kind: str, graph_exec: int | None, node: int, params: Any) -> None:
        """cuGraph{kind}NodeSetParams on a graph's node, or cuGraphExec{kind}NodeSetParams on its copy in an
        instantiation (whose memset and copy forms also name the current context)."""
        handle, where = self.ffi.cast("void *", node), "" if graph_exec is None else "Exec"
        name = f"cuGraph{where}{kind}NodeSetParams" + ("_v2" if kind == "Kernel" else "")
        if graph_exec is None:
            args: tuple[Any, ...] = (handle, params)
        else:
            ctx = () if kind == "Kernel" else (self.out("void **", "cuCtxGetCurrent", self.lib.cuCtxGetCurrent),)
            args = (self.ffi.cast("void *", graph_exec), handle, params, *ctx)
        self.check(getattr(self.lib, name)(*args), name)

    def xpuGraphNodeSetKernel(self, graph_exec: int | None, node: int, func: int, gx: int, gy: int, gz: int,
                              bx: int, by: int, bz: int, shared: int, params: bytes, param_bytes: int) -> None:
        struct_, _alive = self.kernel_node(func, (gx, gy, gz, bx, by, bz, shared), params)
        self.set_node_params("Kernel", graph_exec, node, struct_)

    def xpuGraphNodeSetMemset(self, graph_exec: int | None, node: int, dst: int, pitch: int, value: int,
                              element: int, width: int, height: int) -> None:
        params = self.ffi.from_buffer(MEMSET_NODE.pack(dst, pitch, value, element, width, height))
        self.set_node_params("Memset", graph_exec, node, params)

    def xpuGraphNodeSetMemcpy(self, graph_exec: int | None, node: int, dst: int, dst_pitch: int, src: int,
                              src_pitch: int, width: int, height: int) -> None:
        copy = self.ffi.from_buffer(device_copy(dst, dst_pitch, src, src_pitch, width, height))
        self.set_node_params("Memcpy", graph_exec, node, copy)

    def xpuGraphExecUpdate(self, graph_exec: int, graph: int) -> tuple[int]:
        """The driver's CUgraphExecUpdateResult; its failure status is the client's to raise, after the result."""
        info = self.ffi.new("char[24]")  # CUgraphExecUpdateResultInfo: result, errorNode, errorFromNode
        status = self.lib.cuGraphExecUpdate_v2(self.ffi.cast("void *", graph_exec), self.ffi.cast("void *", graph),
                                               self.ffi.cast("void *", info))
        if status and status != ENUMS["CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE"]:
            self.check(status, "cuGraphExecUpdate")
        return (int.from_bytes(self.ffi.buffer(info, 4)[:], "little"),)

    def xpuGraphAddMemAllocNode(self, graph: int, deps: bytes | None, count: int, props: bytes,
                                access: bytes | None, access_count: int, bytesize: int) -> tuple[int, int]:
        """CUDA_MEM_ALLOC_NODE_PARAMS from the client's properties and access descriptions; the driver answers the
        address in it."""
        ffi = self.ffi
        descs = ffi.from_buffer(bytes(access or b"\0"))
        tail = MEM_ALLOC_NODE.pack(int(ffi.cast("uintptr_t", descs)) if access_count else 0, access_count, bytesize, 0)
        params = ffi.new("char[]", bytes(props) + tail)
        (node,) = self.add_node(self.lib.cuGraphAddMemAllocNode, graph, deps, count, params)
        return node, int.from_bytes(ffi.buffer(params, len(props) + MEM_ALLOC_NODE.size)[-8:], "little")

    def xpuGraphAddMemsetNode(self, graph: int, deps: bytes | None, count: int, dst: int, pitch: int, value: int,
                              element: int, width: int, height: int) -> tuple[int]:
        ctx = self.out("void **", "cuCtxGetCurrent", self.lib.cuCtxGetCurrent)
        params = self.ffi.from_buffer(MEMSET_NODE.pack(dst, pitch, value, element, width, height))
        return self.add_node(self.lib.cuGraphAddMemsetNode, graph, deps, count, params, ctx)

    def xpuGraphAddMemcpyNode(self, graph: int, deps: bytes | None, count: int, dst: int, dst_pitch: int,
                              src: int, src_pitch: int, width: int, height: int) -> tuple[int]:
        ctx = self.out("void **", "cuCtxGetCurrent", self.lib.cuCtxGetCurrent)
        copy = self.ffi.from_buffer(device_copy(dst, dst_pitch, src, src_pitch, width, height))
        return self.add_node(self.lib.cuGraphAddMemcpyNode, graph, deps, count, copy, ctx)


def device_copy(dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> bytes:
    """A CUDA_MEMCPY3D of one rectangle of device memory to device memory (a graph's copy node)."""
    return MEMCPY3D.pack(0, 0, 0, 0, DEVICE, 0, src, 0, src_pitch, height,
                         0, 0, 0, 0, DEVICE, 0, dst, 0, dst_pitch, height, width, height, 1)


def _handle_array(p: Param) -> bool:
    """An input array of handles (a graph's nodes), which holds the client's handles."""
    return p.pointee == "handle" and p.direction == "in" and bool(p.count)


def _stream_array(p: Param) -> bool:
    """A library's input array of streams (cusparseLtMatmul's), which holds the client's streams."""
    return p.ctype == "cudaStream_t *" and p.direction == "in" and bool(p.count)
