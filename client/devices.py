"""Initialisation, versions, error strings, devices, primary contexts and contexts.

All answered from the inventory fetched at connect, except what changes server state."""

from __future__ import annotations

import logging
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import DEVPROP

from . import marshal
from .driver import Context, Driver, implements

log = logging.getLogger("xpuremote.client")
_strings: dict[str, Any] = {}  # C strings handed to the application must live forever


def c_string(text: str) -> int:
    if text not in _strings:
        _strings[text] = marshal.ffi.new("char[]", text.encode())
    return int(marshal.ffi.cast("uintptr_t", _strings[text]))


def out(call: Call, name: str, address: int, value: Any) -> None:
    """A local answer through an output parameter: NULL where the table requires one is the
    driver's INVALID_VALUE, not a success that stored nothing."""
    param = next(p for p in call.params if p.name == name)
    if not address and not param.optional:
        raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: {name} is NULL")
    marshal.put(param, address, value)


@implements("cuInit")
def cu_init(d: Driver, call: Call, args: list[Any]) -> None:
    d.connect()  # a failure to start the session is said there, once, whatever asked first
    if not d.devices:  # as the driver does when CUDA_VISIBLE_DEVICES hides every device
        raise CudaError(errors.NO_DEVICE, "no device is visible (CUDA_VISIBLE_DEVICES)")


@implements("cuDriverGetVersion")
def cu_driver_get_version(d: Driver, call: Call, args: list[Any]) -> None:
    (address,) = args
    if not address:
        raise CudaError(errors.INVALID_VALUE)
    d.connect()
    requested = d.state.get("requested_version", lambda: 0)()
    if requested > d.driver_version:
        d.say_once("version", "the application's CUDA runtime (%d) is newer than the driver of the server at %s "
                   "(%d): update the server's NVIDIA driver, or use a runtime <= %d", requested, d.server(),
                   d.driver_version, d.driver_version)
    out(call, "driverVersion", address, d.driver_version)


@implements("cuGetErrorName", "cuGetErrorString")
def cu_get_error_text(d: Driver, call: Call, args: list[Any]) -> None:
    code, address = args
    if code not in errors.NAMES:
        marshal.write(address, bytes(8)) if address else None
        raise CudaError(errors.INVALID_VALUE, f"unknown CUresult {code}")
    text = errors.name(code) if call.family == "cuGetErrorName" else errors.message(code)
    out(call, "pStr", address, c_string(text))


@implements("cuModuleGetLoadingMode")
def cu_module_get_loading_mode(d: Driver, call: Call, args: list[Any]) -> None:
    out(call, "mode", args[0], ENUMS["CU_MODULE_LAZY_LOADING"])


@implements("cuLogsRegisterCallback")
def cu_logs_register_callback(d: Driver, call: Call, args: list[Any]) -> None:
    """Accepted and never called: the server's driver log stays on the server (PyTorch registers one)."""
    _callback, _user_data, address = args
    if not address:
        raise CudaError(errors.INVALID_VALUE)
    marshal.put_u64(address, d.new_handle())


@implements("cuLogsUnregisterCallback")
def cu_logs_unregister_callback(d: Driver, call: Call, args: list[Any]) -> None:
    if not args[0]:
        raise CudaError(errors.INVALID_VALUE)


# ---- devices ---------------------------------------------------------------------------------
@implements("cuDeviceGetCount")
def cu_device_get_count(d: Driver, call: Call, args: list[Any]) -> None:
    d.session()
    out(call, "count", args[0], len(d.devices))


@implements("cuDeviceGet")
def cu_device_get(d: Driver, call: Call, args: list[Any]) -> None:
    address, ordinal = args
    d.device(ordinal)
    out(call, "device", address, ordinal)


@implements("cuDeviceGetName")
def cu_device_get_name(d: Driver, call: Call, args: list[Any]) -> None:
    address, length, dev = args
    if not address or length <= 0:
        raise CudaError(errors.INVALID_VALUE)
    marshal.write_string(address, d.device(dev).name, length)


@implements("cuDeviceGetUuid")
def cu_device_get_uuid(d: Driver, call: Call, args: list[Any]) -> None:
    address, dev = args
    marshal.write(address, d.device(dev).uuid)


@implements("cuDeviceTotalMem")
def cu_device_total_mem(d: Driver, call: Call, args: list[Any]) -> None:
    address, dev = args
    out(call, "bytes", address, d.device(dev).total_mem)


# Features xpuremote does not forward (docs/design.md, Status: managed memory, exportable memory and
# IPC, host-located pools and VMM, external semaphores, sparse arrays): the server's GPU may have them,
# but an application that believes the device would fail later, so the device says it has none.
# (Memory pools and VMM of device memory are forwarded: client/pools.py, client/vmm.py.)
NOT_FORWARDED = frozenset(ENUMS[f"CU_DEVICE_ATTRIBUTE_{name}"] for name in (
    "MANAGED_MEMORY", "CONCURRENT_MANAGED_ACCESS", "PAGEABLE_MEMORY_ACCESS",
    "PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES", "DIRECT_MANAGED_MEM_ACCESS_FROM_HOST",
    "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM", "HOST_NATIVE_ATOMIC_SUPPORTED",
    "MEMPOOL_SUPPORTED_HANDLE_TYPES", "HOST_MEMORY_POOLS_SUPPORTED", "HOST_NUMA_MEMORY_POOLS_SUPPORTED",
    "HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", "HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED",
    "GENERIC_COMPRESSION_SUPPORTED",
    "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", "HANDLE_TYPE_WIN32_HANDLE_SUPPORTED",
    "HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED", "HANDLE_TYPE_FABRIC_SUPPORTED", "IPC_EVENT_SUPPORTED",
    "GPU_DIRECT_RDMA_SUPPORTED", "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", "TIMELINE_SEMAPHORE_INTEROP_SUPPORTED",
    "SPARSE_CUDA_ARRAY_SUPPORTED", "DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED"))


@implements("cuDeviceGetAttribute")
def cu_device_get_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    address, attrib, dev = args
    device = d.device(dev)
    if not 0 < attrib <= MAX_DEVICE_ATTRIBUTE or attrib in device.refused:
        raise CudaError(errors.INVALID_VALUE, f"device attribute {attrib} (unknown to the server's driver)")
    out(call, "pi", address, 0 if attrib in NOT_FORWARDED else device.attributes.get(attrib, 0))


MAX_DEVICE_ATTRIBUTE = max(v for k, v in ENUMS.items() if k.startswith("CU_DEVICE_ATTRIBUTE_"))


def pci_bus_id(device: Any) -> str:
    """As the driver writes it: a 4-digit domain (an H100 answered "0000:00:06.0"); NVML's has 8."""
    domain, bus, dev = device.pci
    return f"{domain:04X}:{bus:02X}:{dev:02X}.0"


def _pci_address(text: str) -> tuple[int, int, int] | None:
    """(domain, bus, device) of "[domain:]bus:device[.function]", any width of hex digits."""
    parts = text.split(".")[0].split(":")
    try:
        numbers = [int(p, 16) for p in parts]
    except ValueError:
        return None
    return tuple([0] * (3 - len(numbers)) + numbers) if 2 <= len(numbers) <= 3 else None


@implements("cuDeviceGetPCIBusId")
def cu_device_get_pci_bus_id(d: Driver, call: Call, args: list[Any]) -> None:
    address, length, dev = args
    if not address or length <= 0:
        raise CudaError(errors.INVALID_VALUE)
    marshal.write_string(address, pci_bus_id(d.device(dev)), length)


@implements("cuDeviceGetByPCIBusId")
def cu_device_get_by_pci_bus_id(d: Driver, call: Call, args: list[Any]) -> None:
    address, text = args
    d.session()
    wanted = marshal.read_string(text)
    for i, device in enumerate(d.devices):
        if _pci_address(wanted) == tuple(device.pci):  # the driver's form, NVML's or no domain
            out(call, "dev", address, i)
            return
    raise CudaError(errors.INVALID_DEVICE, f"no device at PCI bus id {wanted}")


@implements("cuDeviceComputeCapability")
def cu_device_compute_capability(d: Driver, call: Call, args: list[Any]) -> None:
    major, minor, dev = args
    sm = d.device(dev).sm
    out(call, "major", major, sm // 10)
    out(call, "minor", minor, sm % 10)


PROPERTY_ATTRIBUTES = ("MAX_THREADS_PER_BLOCK", "MAX_BLOCK_DIM_X", "MAX_BLOCK_DIM_Y", "MAX_BLOCK_DIM_Z",
                       "MAX_GRID_DIM_X", "MAX_GRID_DIM_Y", "MAX_GRID_DIM_Z", "MAX_SHARED_MEMORY_PER_BLOCK",
                       "TOTAL_CONSTANT_MEMORY", "WARP_SIZE", "MAX_PITCH", "MAX_REGISTERS_PER_BLOCK",
                       "CLOCK_RATE", "TEXTURE_ALIGNMENT")


@implements("cuDeviceGetProperties")
def cu_device_get_properties(d: Driver, call: Call, args: list[Any]) -> None:
    address, dev = args
    attrs = d.device(dev).attributes
    values = [attrs.get(ENUMS[f"CU_DEVICE_ATTRIBUTE_{a}"], 0) for a in PROPERTY_ATTRIBUTES]
    marshal.write(address, DEVPROP.pack(*values))


@implements("cuDeviceCanAccessPeer")
def cu_device_can_access_peer(d: Driver, call: Call, args: list[Any]) -> None:
    address, dev, peer = args
    d.device(dev), d.device(peer)
    out(call, "canAccessPeer", address, 0)  # peer access is not forwarded (cuCtxEnablePeerAccess says why)


@implements("cuDeviceGetP2PAttribute")
def cu_device_get_p2p_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    """No attribute holds between two devices without peer access: 0, as NVIDIA's driver answers for them."""
    address, _attribute, src, dst = args
    d.device(src), d.device(dst)
    if src == dst:
        raise CudaError(errors.INVALID_DEVICE, "cuDeviceGetP2PAttribute of a device with itself")
    out(call, "value", address, 0)


@implements("cuCtxEnablePeerAccess")
def cu_ctx_enable_peer_access(d: Driver, call: Call, args: list[Any]) -> None:
    """Refused with the reason: between two servers' devices there is no peer access to give (copies between
    them are staged through the client); within one server it is not forwarded yet."""
    mine, peer = d.context(0).device, d.context(args[0]).device
    if d.devices[mine].server != d.devices[peer].server:
        why = (f"devices {mine} and {peer} are on different servers ({d.sessions[d.devices[mine].server].address}, "
               f"{d.sessions[d.devices[peer].server].address}): a kernel on one cannot reach the other's memory; "
               "copies between them work, staged through the client")
    else:
        why = f"peer access between devices {mine} and {peer} of one server is not forwarded yet"
    d.say_once(f"peer {mine} {peer}", "cuCtxEnablePeerAccess refused: %s", why)
    raise CudaError(errors.PEER_ACCESS_UNSUPPORTED, why)


@implements("cuCtxDisablePeerAccess")
def cu_ctx_disable_peer_access(d: Driver, call: Call, args: list[Any]) -> None:
    d.context(args[0])
    raise CudaError(ENUMS["CUDA_ERROR_PEER_ACCESS_NOT_ENABLED"], "peer access was never enabled")


@implements("cuDeviceGetExecAffinitySupport")
def cu_device_get_exec_affinity_support(d: Driver, call: Call, args: list[Any]) -> None:
    address, _type, dev = args
    d.device(dev)
    out(call, "pi", address, 0)


# ---- primary contexts ---------------------------------------------------------------------------
def primary(d: Driver, dev: int) -> Any:
    d.device(dev)
    return d.primaries[dev]


def retain_primary(d: Driver, dev: int) -> int:
    """Retain the primary context of `dev`, creating it on the server the first time."""
    with d.lock:
        primary(d, dev)  # checks the ordinal
        p = d.ensure_primary(dev)
        p.retains += 1
        return p.handle


@implements("cuDevicePrimaryCtxRetain")
def cu_device_primary_ctx_retain(d: Driver, call: Call, args: list[Any]) -> None:
    address, dev = args
    if not address:
        raise CudaError(errors.INVALID_VALUE)
    out(call, "pctx", address, retain_primary(d, dev))


@implements("cuDevicePrimaryCtxRelease")
def cu_device_primary_ctx_release(d: Driver, call: Call, args: list[Any]) -> None:
    release_primary(d, args[0])


def release_primary(d: Driver, dev: int) -> None:
    with d.lock:
        p = primary(d, dev)
        if p.retains == 0:
            raise CudaError(errors.INVALID_CONTEXT, f"primary context of device {dev} is not retained")
        p.retains -= 1
        if p.retains == 0:
            d.contexts.release(p.handle)


@implements("cuDevicePrimaryCtxReset")
def cu_device_primary_ctx_reset(d: Driver, call: Call, args: list[Any]) -> None:
    (dev,) = args
    with d.lock:
        p = primary(d, dev)
        d.contexts.release(p.handle)
        p.retains, p.flags = 0, 0
        if p.on_server:
            d.post(call, [d.devices[dev].server_index])


@implements("cuDevicePrimaryCtxGetState")
def cu_device_primary_ctx_get_state(d: Driver, call: Call, args: list[Any]) -> None:
    dev, flags, active = args
    p = primary(d, dev)
    out(call, "flags", flags, p.flags)
    out(call, "active", active, int(p.retains > 0))


@implements("cuDevicePrimaryCtxSetFlags")
def cu_device_primary_ctx_set_flags(d: Driver, call: Call, args: list[Any]) -> None:
    dev, flags = args
    primary(d, dev).flags = flags


# ---- contexts ----------------------------------------------------------------------------------
@implements("cuCtxCreate")
def cu_ctx_create(d: Driver, call: Call, args: list[Any]) -> None:
    address, flags, dev = args[0], args[-2], args[-1]  # every variant ends with (flags, dev)
    if not address:
        raise CudaError(errors.INVALID_VALUE)
    device = d.device(dev)
    handle = d.new_handle()
    d.ctxs[handle] = Context(dev, flags, ident=len(d.ctxs) + 1)
    d.post(CALLS["cuCtxCreate_v2"], [handle, flags, device.server_index])
    d.contexts.push(handle)
    out(call, "pctx", address, handle)


@implements("cuCtxDestroy")
def cu_ctx_destroy(d: Driver, call: Call, args: list[Any]) -> None:
    (handle,) = args
    ctx = d.ctxs.get(handle)
    if ctx is None or ctx.primary or ctx.green:
        raise CudaError(errors.INVALID_CONTEXT, f"{handle:#x} is not a context made by cuCtxCreate")
    destroy_context(d, call, handle)


def destroy_context(d: Driver, call: Call, handle: int) -> None:
    """A context (a green context's too) gone: out of the lane, its storage released, off this thread's
    stack if current, forgotten, and the destroy sent."""
    if d.lane is not None:
        d.lane.context(handle, ready=False)
    d.contexts.release(handle)
    if d.contexts.current() == handle:
        d.contexts.pop()
    del d.ctxs[handle]
    d.post(call, [handle])


@implements("cuCtxPushCurrent")
def cu_ctx_push_current(d: Driver, call: Call, args: list[Any]) -> None:
    (handle,) = args
    d.context(handle)
    d.contexts.push(handle)


@implements("cuCtxPopCurrent")
def cu_ctx_pop_current(d: Driver, call: Call, args: list[Any]) -> None:
    (address,) = args
    handle = d.current_ctx()
    d.contexts.pop()
    out(call, "pctx", address, handle)


@implements("cuCtxGetCurrent")
def cu_ctx_get_current(d: Driver, call: Call, args: list[Any]) -> None:
    d.session()
    out(call, "pctx", args[0], d.contexts.current())


@implements("cuCtxSetCurrent")
def cu_ctx_set_current(d: Driver, call: Call, args: list[Any]) -> None:
    (handle,) = args
    d.session()
    if handle and handle not in d.ctxs:
        raise CudaError(errors.INVALID_CONTEXT, f"{handle:#x} is not a context")
    d.contexts.set_current(handle)


@implements("cuCtxGetDevice")
def cu_ctx_get_device(d: Driver, call: Call, args: list[Any]) -> None:
    handle = args[1] if len(args) > 1 else 0
    out(call, "device", args[0], d.context(handle).device)


@implements("cuCtxGetFlags")
def cu_ctx_get_flags(d: Driver, call: Call, args: list[Any]) -> None:
    out(call, "flags", args[0], d.flags(d.context(0)))


@implements("cuCtxSetFlags")
def cu_ctx_set_flags(d: Driver, call: Call, args: list[Any]) -> None:
    ctx: Context = d.context(0)
    if ctx.primary:
        d.primaries[ctx.device].flags = args[0]
    else:
        ctx.flags = args[0]


@implements("cuCtxGetId")
def cu_ctx_get_id(d: Driver, call: Call, args: list[Any]) -> None:
    handle, address = args
    out(call, "ctxId", address, d.context(handle).ident)


@implements("cuCtxGetApiVersion")
def cu_ctx_get_api_version(d: Driver, call: Call, args: list[Any]) -> None:
    handle, address = args
    d.context(handle)
    out(call, "version", address, 3020)  # contexts made through the current (v2) API
