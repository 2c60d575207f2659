"""Modules, libraries, kernels and launches.

Images are read when the application hands them over but uploaded only when a kernel or a
global is first needed, and then only the entry the server's GPU runs, keyed by its content
hash. Kernel names and parameter layouts come from the image itself, so lookups and
launches never wait for the server; the server is asked only for images it must JIT.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, fatbin
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import LAUNCH_ATTRIBUTE, LAUNCH_CONFIG

from . import marshal
from .devices import c_string
from .driver import ENSURE, Driver, implements

log = logging.getLogger("xpuremote.client")


@dataclass
class Module:
    handle: int
    image_address: int  # the application's image, valid until unload (BINARY_IS_PRESERVED)
    image: bytes | None = None  # read on first need
    entry: fatbin.Entry | None = None
    kernels: dict[str, fatbin.Kernel] | None = None
    on_server: bool = False
    functions: dict[str, int] = field(default_factory=dict)  # name -> function handle


@dataclass
class Function:
    handle: int
    module: Module
    kernel: fatbin.Kernel
    on_server: bool = False


def registry(d: Driver) -> tuple[dict[int, Module], dict[int, Module], dict[int, Function]]:
    """(modules, libraries, functions-and-kernels) by handle."""
    if "modules" not in d.state:
        d.state["modules"] = ({}, {}, {})
    return d.state["modules"]


def device_sm(d: Driver) -> int:
    """The compute capability of the current context's device (libraries load before any)."""
    ctx = d.contexts.current()
    return d.devices[d.context(ctx).device if ctx else 0].sm


def parse(d: Driver, module: Module) -> None:
    """Pick the entry the server's GPU runs and read its kernels (once)."""
    with d.lock:
        if module.kernels is None:
            _parse(d, module)


def _parse(d: Driver, module: Module) -> None:
    if module.image is None:
        module.image = fatbin.image_from_pointer(module.image_address)
    sm = device_sm(d)
    entry = fatbin.select(module.image, sm)
    if entry is None:
        have = ", ".join(f"{e.kind} sm_{e.sm}" for e in fatbin.entries(module.image)) or "nothing"
        log.error("module has no code for the server's GPU (sm_%d); it has %s: rebuild with "
                  "-gencode arch=compute_%d,code=sm_%d", sm, have, sm, sm)
        raise CudaError(errors.NO_BINARY_FOR_GPU, f"no entry for sm_{sm} (has {have})")
    module.entry = entry
    if entry.kind == "elf":
        module.kernels = fatbin.kernels(entry.data)
    else:
        module.kernels = fatbin.ptx_kernels(entry.data.rstrip(b"\0").decode())


def upload(d: Driver, module: Module) -> None:
    with d.lock:  # two threads must not create the same module twice
        if module.on_server:
            return
        parse(d, module)
        data = module.entry.data
        key = hashlib.sha256(data).digest()
        d.post(CALLS["xpuModuleLoad"], [module.handle, key, data, len(data)], len(data))
        module.on_server = True


def ensure_function(d: Driver, handle: int) -> Function:
    fn = registry(d)[2].get(handle)
    if fn is None:
        raise CudaError(errors.INVALID_HANDLE, f"{handle:#x} is not a function or kernel")
    if not fn.on_server:
        with d.lock:
            if not fn.on_server:
                upload(d, fn.module)
                d.post(CALLS["xpuModuleGetFunction"], [fn.handle, fn.module.handle, fn.kernel.name])
                fn.on_server = True
    return fn


def ensure_module(d: Driver, handle: int) -> Module:
    modules, libraries, _ = registry(d)
    module = modules.get(handle) or libraries.get(handle)
    if module is None:
        raise CudaError(errors.INVALID_HANDLE, f"{handle:#x} is not a module")
    upload(d, module)
    return module


ENSURE.update({
    "CUfunction": lambda d, h: ensure_function(d, h),
    "CUkernel": lambda d, h: ensure_function(d, h),
    "CUmodule": lambda d, h: ensure_module(d, h),
})


def get_function(d: Driver, module: Module, name: str) -> int:
    parse(d, module)
    if name not in module.kernels:
        raise CudaError(errors.NOT_FOUND, f"no kernel {name!r} in the module")
    with d.lock:
        handle = module.functions.get(name)
        if handle is None:
            handle = module.functions[name] = d.new_handle()
            registry(d)[2][handle] = Function(handle, module, module.kernels[name])
    return handle


# ---- loading ----------------------------------------------------------------------------------
def load(d: Driver, address: int, image_address: int, *, library: bool = False, image: bytes | None = None) -> None:
    d.current_ctx() if not library else d.session()
    if not address or not (image_address or image):
        raise CudaError(errors.INVALID_VALUE)
    module = Module(d.new_handle(), image_address, image)
    if not library:
        parse(d, module)  # cuModuleLoad* report a bad image at once
    registry(d)[1 if library else 0][module.handle] = module
    marshal.put_u64(address, module.handle)


def read_file(path_address: int) -> bytes:
    path = marshal.read_string(path_address)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CudaError(errors.CODES["CUDA_ERROR_FILE_NOT_FOUND"], f"{path}: {exc.strerror}") from None


@implements("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary")
def cu_module_load_data(d: Driver, call: Call, args: list[Any]) -> None:
    load(d, args[0], args[1])


@implements("cuModuleLoad")
def cu_module_load(d: Driver, call: Call, args: list[Any]) -> None:
    load(d, args[0], 0, image=read_file(args[1]))


@implements("cuLibraryLoadData")
def cu_library_load_data(d: Driver, call: Call, args: list[Any]) -> None:
    load(d, args[0], args[1], library=True)


@implements("cuLibraryLoadFromFile")
def cu_library_load_from_file(d: Driver, call: Call, args: list[Any]) -> None:
    load(d, args[0], 0, library=True, image=read_file(args[1]))


def unload(d: Driver, table: dict[int, Module], handle: int) -> None:
    module = table.pop(handle, None)
    if module is None:
        raise CudaError(errors.INVALID_HANDLE, f"{handle:#x} is not loaded")
    for fh in module.functions.values():
        registry(d)[2].pop(fh, None)
        if d.lane is not None:
            d.lane.forget_kernel(fh)
    if module.on_server:
        d.post(CALLS["cuModuleUnload"], [handle])


@implements("cuModuleUnload")
def cu_module_unload(d: Driver, call: Call, args: list[Any]) -> None:
    unload(d, registry(d)[0], args[0])


@implements("cuLibraryUnload")
def cu_library_unload(d: Driver, call: Call, args: list[Any]) -> None:
    unload(d, registry(d)[1], args[0])


# ---- lookups --------------------------------------------------------------------------------
def module_of(d: Driver, handle: int, libraries: bool) -> Module:
    module = registry(d)[1 if libraries else 0].get(handle)
    if module is None:
        raise CudaError(errors.INVALID_HANDLE, f"{handle:#x} is not a {'library' if libraries else 'module'}")
    return module


@implements("cuModuleGetFunction")
def cu_module_get_function(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle, name = args
    marshal.put_u64(address, get_function(d, module_of(d, handle, False), marshal.read_string(name)))


@implements("cuLibraryGetKernel")
def cu_library_get_kernel(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle, name = args
    marshal.put_u64(address, get_function(d, module_of(d, handle, True), marshal.read_string(name)))


@implements("cuLibraryGetModule")
def cu_library_get_module(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle = args
    module = module_of(d, handle, True)
    registry(d)[0].setdefault(module.handle, module)
    marshal.put_u64(address, module.handle)


@implements("cuModuleGetFunctionCount", "cuLibraryGetKernelCount")
def cu_get_kernel_count(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle = args
    module = module_of(d, handle, call.family == "cuLibraryGetKernelCount")
    parse(d, module)
    marshal.put(call.params[0], address, len(module.kernels))


@implements("cuKernelGetFunction")
def cu_kernel_get_function(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle = args
    fn = function(d, handle)
    marshal.put_u64(address, fn.handle)  # one handle serves as CUkernel and CUfunction


@implements("cuKernelGetLibrary", "cuFuncGetModule")
def cu_kernel_get_library(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle = args
    marshal.put_u64(address, function(d, handle).module.handle)


@implements("cuKernelGetName", "cuFuncGetName")
def cu_kernel_get_name(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle = args
    if not address or not handle:  # documented: either NULL is CUDA_ERROR_INVALID_VALUE, not a bad handle
        raise CudaError(errors.INVALID_VALUE)
    marshal.put_u64(address, c_string(function(d, handle).kernel.name))


@implements("cuKernelGetParamInfo", "cuFuncGetParamInfo")
def cu_get_param_info(d: Driver, call: Call, args: list[Any]) -> None:
    handle, index, offset, size = args
    params = function(d, handle).kernel.params
    if index >= len(params):
        raise CudaError(errors.INVALID_VALUE, f"parameter {index} of {len(params)}")
    marshal.put(call.params[2], offset, params[index].offset)
    marshal.put(call.params[3], size, params[index].size)


@implements("cuFuncIsLoaded")
def cu_func_is_loaded(d: Driver, call: Call, args: list[Any]) -> None:
    address, handle = args
    function(d, handle)
    marshal.put(call.params[0], address, 1)  # CU_FUNCTION_LOADING_STATE_LOADED


@implements("cuFuncLoad")
def cu_func_load(d: Driver, call: Call, args: list[Any]) -> None:
    ensure_function(d, args[0])


def function(d: Driver, handle: int) -> Function:
    fn = registry(d)[2].get(handle)
    if fn is None:
        raise CudaError(errors.INVALID_HANDLE, f"{handle:#x} is not a function or kernel")
    return fn


@implements("cuModuleGetGlobal", "cuLibraryGetGlobal")
def cu_get_global(d: Driver, call: Call, args: list[Any]) -> None:
    dptr, size, handle, name = args
    module = module_of(d, handle, call.family == "cuLibraryGetGlobal")
    upload(d, module)
    target = CALLS["cuModuleGetGlobal_v2"]
    address, nbytes = d.call(target, [8, 8, module.handle, marshal.read_string(name)])
    marshal.put(call.params[0], dptr, int.from_bytes(address, "little"))
    marshal.put(call.params[1], size, int.from_bytes(nbytes, "little"))


# ---- launches: arguments packed here, sent without waiting ---------------------------------------


def pack_params(fn: Function, kernel_params: int, extra: int) -> bytes:
    """The kernel's argument buffer, from kernelParams (pointers per parameter) or `extra`."""
    if kernel_params:
        params = fn.kernel.params
        pointers = struct.unpack(f"<{len(params)}Q", marshal.read(kernel_params, 8 * len(params))) if params else ()
        buf = bytearray(max((p.offset + p.size for p in params), default=0))
        for p, ptr in zip(params, pointers):
            buf[p.offset : p.offset + p.size] = marshal.read(ptr, p.size)
        return bytes(buf)
    if extra:
        return extra_buffer(extra)
    if fn.kernel.params:
        raise CudaError(errors.INVALID_VALUE, f"{fn.kernel.name} takes parameters but none were given")
    return b""


def extra_buffer(extra: int) -> bytes:
    """Walk CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE / _END pairs."""
    pointer = size = None
    for i in range(0, 64, 2):
        key, value = struct.unpack("<QQ", marshal.read(extra + 8 * i, 16))
        if key == 0:  # CU_LAUNCH_PARAM_END
            break
        if key == 1:
            pointer = value
        elif key == 2:
            size = int.from_bytes(marshal.read(value, 8), "little")
    if pointer is None or size is None:
        raise CudaError(errors.INVALID_VALUE, "extra lacks CU_LAUNCH_PARAM_BUFFER_POINTER or _SIZE")
    return marshal.read(pointer, size)


def launch(d: Driver, call: Call, handle: int, grid: tuple, block: tuple, shared: int, stream: int,
           kernel_params: int, extra: int, attributes: bytes = b"") -> None:
    fn = ensure_function(d, handle)
    params = pack_params(fn, kernel_params, extra)
    if call.per_thread and not stream:
        stream = 2
    if attributes:  # cluster dimensions, priorities, programmatic events...: cuLaunchKernelEx's
        count = len(attributes) // LAUNCH_ATTRIBUTE.size
        d.post(CALLS["xpuLaunchKernelEx"], [fn.handle, *grid, *block, shared, stream, params, len(params),
                                            attributes, count], len(params) + len(attributes))
        return
    d.post(CALLS["xpuLaunchKernel"], [fn.handle, *grid, *block, shared, stream, params, len(params), 0], len(params))
    if d.lane is not None and call.lane == "launch" and kernel_params and not extra:  # the next launches take it
        d.lane.kernel(handle, fn.handle, [(p.offset, p.size) for p in fn.kernel.params], len(params))


def launch_config(config: int) -> tuple[tuple, tuple, int, int, bytes]:
    """A CUlaunchConfig: grid, block, shared memory bytes, stream and its attributes' bytes."""
    if not config:
        raise CudaError(errors.INVALID_VALUE, "the launch config is NULL")
    raw = marshal.read(config, LAUNCH_CONFIG.size)
    gx, gy, gz, bx, by, bz, shared, stream, attrs, count = LAUNCH_CONFIG.unpack(raw)
    if count and not attrs:
        raise CudaError(errors.INVALID_VALUE, f"{count} launch attributes at NULL")
    return (gx, gy, gz), (bx, by, bz), shared, stream, marshal.read(attrs, count * LAUNCH_ATTRIBUTE.size)


@implements("cuLaunchKernel")
def cu_launch_kernel(d: Driver, call: Call, args: list[Any]) -> None:
    f, gx, gy, gz, bx, by, bz, shared, stream, kernel_params, extra = args
    launch(d, call, f, (gx, gy, gz), (bx, by, bz), shared, stream, kernel_params, extra)


@implements("cuLaunchCooperativeKernel")
def cu_launch_cooperative_kernel(d: Driver, call: Call, args: list[Any]) -> None:
    f, gx, gy, gz, bx, by, bz, shared, stream, kernel_params = args
    launch(d, call, f, (gx, gy, gz), (bx, by, bz), shared, stream, kernel_params, 0)


@implements("cuLaunchKernelEx")
def cu_launch_kernel_ex(d: Driver, call: Call, args: list[Any]) -> None:
    config, f, kernel_params, extra = args
    grid, block, shared, stream, attributes = launch_config(config)
    launch(d, call, f, grid, block, shared, stream, kernel_params, extra, attributes)


@implements("cuOccupancyMaxActiveClusters")
def cu_occupancy_max_active_clusters(d: Driver, call: Call, args: list[Any]) -> None:
    clusters, f, config = args
    if not clusters:
        raise CudaError(errors.INVALID_VALUE, "numClusters is NULL")
    grid, block, shared, _stream, attributes = launch_config(config)
    fn = ensure_function(d, f)
    count = len(attributes) // LAUNCH_ATTRIBUTE.size
    (found,) = d.call(CALLS["xpuOccupancyMaxActiveClusters"], [4, fn.handle, *grid, *block, shared,
                                                               attributes or None, count])
    marshal.write(clusters, found)


# ---- occupancy: answers that depend only on the function, the question and the function's settings ---
# PyTorch asks them before launches (a round trip each; a block-size search asks one per block size). They
# are answered from the first answer for the same question, until any setting that could change them is
# made (an attribute or cache preference of a function or kernel, the context's cache preference).
ANSWERS: dict[tuple, bytes] = {}
ANSWERS_KEPT = 4096  # then the memory starts again (a program that loads modules over and over)
QUESTIONS = ("cuOccupancyMaxActiveBlocksPerMultiprocessor", "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags",
             "cuOccupancyAvailableDynamicSMemPerBlock", "cuFuncGetAttribute")


@implements(*QUESTIONS)
def function_question(d: Driver, call: Call, args: list[Any]) -> None:
    out, *question = args
    function = next(a for p, a in zip(call.params, args) if p.ctype == "CUfunction")
    key = (call.family, *question)
    found = ANSWERS.get(key) if out and function in registry(d)[2] else None
    if found is not None:
        d.session()  # as any call: not in a forked child, not before cuInit
        marshal.write(out, found)
        return
    d.forward(call, args)
    if out:
        if len(ANSWERS) >= ANSWERS_KEPT:
            ANSWERS.clear()
        ANSWERS[key] = marshal.read(out, call.params[0].pointee_size)


@implements("cuFuncSetAttribute", "cuFuncSetCacheConfig", "cuKernelSetAttribute", "cuKernelSetCacheConfig",
            "cuCtxSetCacheConfig")
def function_setting(d: Driver, call: Call, args: list[Any]) -> None:
    ANSWERS.clear()
    d.forward(call, args)


def per_block(d: Driver, handle: int, block: int, shared: int, flags: int) -> int:
    out = marshal.ffi.new("int *")
    function_question(d, CALLS["cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"],
                      [int(marshal.ffi.cast("uintptr_t", out)), handle, block, shared, flags])
    return out[0]


# ---- occupancy: the search the driver does, over the server's per-block answers -------------------
@implements("cuOccupancyMaxPotentialBlockSize", "cuOccupancyMaxPotentialBlockSizeWithFlags")
def cu_occupancy_max_potential_block_size(d: Driver, call: Call, args: list[Any]) -> None:
    min_grid, block_out, handle, to_smem, smem, limit, *flags = args
    ensure_function(d, handle)
    device = d.devices[d.context(0).device]
    sms = device.attributes.get(ENUMS["CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"], 1)
    max_threads = marshal.ffi.new("int *")
    function_question(d, CALLS["cuFuncGetAttribute"], [int(marshal.ffi.cast("uintptr_t", max_threads)),
                                                       ENUMS["CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"], handle])
    top = max_threads[0]
    if limit > 0:
        top = min(top, limit)
    dynamic = marshal.ffi.cast("size_t (*)(int)", to_smem) if to_smem else None
    best = (0, 0, 0)  # threads resident per SM, block size, blocks per SM
    for block in range(top - top % 32 or top, 0, -32):
        shared = dynamic(block) if dynamic else smem
        blocks = per_block(d, handle, block, shared, flags[0] if flags else 0)
        if blocks * block > best[0]:
            best = (blocks * block, block, blocks)
    marshal.put(call.params[0], min_grid, best[2] * sms)
    marshal.put(call.params[1], block_out, best[1])
