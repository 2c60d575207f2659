"""Device resources and green contexts through cuda-python's driver and runtime bindings (run under the shim,
or natively on a GPU with 8-SM co-scheduling, compute capability 9.0 or later).

Checks and sections as tests/programs/checks.py says. SM counts follow from the device's own resource.
"""

from __future__ import annotations

import ctypes

from checks import XPUREMOTE, check, fails, finish, ok, section
from cuda.bindings import driver as cu
from cuda.bindings import runtime as rt

R = cu.CUresult
SM = cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
NON_BLOCKING = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
IGNORE_COSCHEDULING = cu.CUdevSmResourceSplitByCount_flags.CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING

ok(cu.cuInit(0), "cuInit")
DEVICE = ok(cu.cuDeviceGet(0), "cuDeviceGet")
PRIMARY = ok(cu.cuDevicePrimaryCtxRetain(DEVICE), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(PRIMARY), "cuCtxSetCurrent")
SMS = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, DEVICE),
         "MULTIPROCESSOR_COUNT")


def device_sms() -> cu.CUdevResource:
    return ok(cu.cuDeviceGetDevResource(DEVICE, SM), "cuDeviceGetDevResource")


def groups(n: int, count: int) -> list[int]:
    return [count] * n


@section
def resources() -> None:
    whole = device_sms()
    check(whole.type == SM and whole.sm.smCount == SMS, "the device's resource is all its SMs",
          f"{whole.sm.smCount} of {SMS}")
    check((whole.sm.minSmPartitionSize, whole.sm.smCoscheduledAlignment) == (8, 8),
          "compute capability 9.0: partitions of at least 8 SMs, in eights")
    check(ok(cu.cuCtxGetDevResource(PRIMARY, SM), "cuCtxGetDevResource").sm.smCount == SMS,
          "the primary context has every SM")
    stream = ok(cu.cuStreamCreate(0), "cuStreamCreate")
    check(ok(cu.cuStreamGetDevResource(stream, SM), "cuStreamGetDevResource").sm.smCount == SMS,
          "a stream of the primary context has every SM")
    check(ok(cu.cuStreamGetGreenCtx(stream), "cuStreamGetGreenCtx") is not None and
          int(cu.cuStreamGetGreenCtx(stream)[1]) == 0, "a primary context's stream has no green context")
    ok(cu.cuStreamDestroy(stream), "cuStreamDestroy")
    fails(cu.cuDeviceGetDevResource(DEVICE, cu.CUdevResourceType(0)), R.CUDA_ERROR_INVALID_RESOURCE_TYPE,
          "resource type INVALID")
    if XPUREMOTE:  # a real 13.1+ driver answers workqueue resources
        fails(cu.cuDeviceGetDevResource(DEVICE, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG),
              R.CUDA_ERROR_NOT_SUPPORTED, "workqueue resources are not forwarded")


@section
def split_by_count() -> None:
    whole = device_sms()
    _, found, count, rest = cu.cuDevSmResourceSplitByCount(0, whole, 0, 2)
    check(count == SMS // 8 and not found, "discovery: as many groups of 8 as fit", f"{count}")
    err, found, count, rest = cu.cuDevSmResourceSplitByCount(3, whole, 0, 2)
    check(err == R.CUDA_SUCCESS and [g.sm.smCount for g in found] == groups(3, 8) and count == 3,
          "3 groups of 8 (2 rounded up)", f"{err} {[g.sm.smCount for g in found]}")
    check(rest.sm.smCount == SMS - 24, "the remainder holds the rest", f"{rest.sm.smCount}")
    _, found, count, _ = cu.cuDevSmResourceSplitByCount(SMS, whole, 0, 20)
    check([g.sm.smCount for g in found[:count]] == groups(SMS // 24, 24), "minCount 20 rounds up to 24",
          f"{count}: {[g.sm.smCount for g in found[:count]]}")
    _, found, count, _ = cu.cuDevSmResourceSplitByCount(0, whole, IGNORE_COSCHEDULING, 1)
    check(count == SMS // 2, "without co-scheduling, groups of 2", f"{count}")
    fails(cu.cuDevSmResourceSplitByCount(1, whole, 0, SMS + 1), R.CUDA_ERROR_INVALID_VALUE, "minCount > SMs")


@section
def structured_split() -> None:
    whole = device_sms()
    first, second = cu.CU_DEV_SM_RESOURCE_GROUP_PARAMS(), cu.CU_DEV_SM_RESOURCE_GROUP_PARAMS()
    first.smCount, first.coscheduledSmCount = 4, 2
    err, found, rest = cu.cuDevSmResourceSplit(2, whole, 0, [first, second])
    check(err == R.CUDA_SUCCESS and [g.sm.smCount for g in found] == [4, (SMS - 4) // 8 * 8],
          "4 SMs in twos, then the rest discovered in eights", f"{err} {[g.sm.smCount for g in found or []]}")
    check(found and found[0].sm.smCoscheduledAlignment == 2, "the first group is co-scheduled in twos")
    check(rest.sm.smCount == SMS - 4 - (SMS - 4) // 8 * 8, "the remainder", f"{rest.sm.smCount}")
    bad = cu.CU_DEV_SM_RESOURCE_GROUP_PARAMS()
    bad.smCount = 3
    fails(cu.cuDevSmResourceSplit(1, whole, 0, [bad]), R.CUDA_ERROR_INVALID_VALUE, "an odd SM count")
    big = cu.CU_DEV_SM_RESOURCE_GROUP_PARAMS()
    big.smCount = SMS // 16 * 8 + 8
    fails(cu.cuDevSmResourceSplit(2, whole, 0, [big, big]), R.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
          "two groups of more than half the SMs")


def green_context(n_groups: int) -> tuple[cu.CUgreenCtx, cu.CUcontext]:
    whole = device_sms()
    _, found, _, _ = cu.cuDevSmResourceSplitByCount(n_groups, whole, 0, 8)
    desc = ok(cu.cuDevResourceGenerateDesc(found, n_groups), "cuDevResourceGenerateDesc")
    green = ok(cu.cuGreenCtxCreate(desc, DEVICE, 0), "cuGreenCtxCreate")
    return green, ok(cu.cuCtxFromGreenCtx(green), "cuCtxFromGreenCtx")


@section
def descriptors() -> None:
    whole = device_sms()
    _, one, _, _ = cu.cuDevSmResourceSplitByCount(1, whole, 0, 8)
    _, two, _, _ = cu.cuDevSmResourceSplitByCount(1, whole, 0, 8)
    fails(cu.cuDevResourceGenerateDesc([one[0], two[0]], 2), R.CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
          "resources of two splits in one descriptor")
    desc = ok(cu.cuDevResourceGenerateDesc([whole], 1), "a descriptor of the whole device")
    fails(cu.cuGreenCtxCreate(desc, DEVICE, 7), R.CUDA_ERROR_INVALID_VALUE, "unknown green context flags")


@section
def green_contexts() -> None:
    green, ctx = green_context(2)
    check(ok(cu.cuGreenCtxGetDevResource(green, SM), "cuGreenCtxGetDevResource").sm.smCount == 16,
          "the green context has its 16 SMs")
    check(ok(cu.cuCtxGetDevResource(ctx, SM), "cuCtxGetDevResource of its context").sm.smCount == 16,
          "so has its context")
    check(ok(cu.cuGreenCtxGetId(green), "cuGreenCtxGetId") > 0, "a green context has an id")
    fails(cu.cuGreenCtxStreamCreate(green, 0, 0), R.CUDA_ERROR_INVALID_VALUE, "a blocking green stream")
    stream = ok(cu.cuGreenCtxStreamCreate(green, NON_BLOCKING, 0), "cuGreenCtxStreamCreate")
    check(int(ok(cu.cuStreamGetGreenCtx(stream), "cuStreamGetGreenCtx")) == int(green),
          "the stream's green context")
    check(ok(cu.cuStreamGetDevResource(stream, SM), "cuStreamGetDevResource").sm.smCount == 16,
          "the stream has the green context's SMs")
    pair = ok(cu.cuStreamGetCtx_v2(stream), "cuStreamGetCtx_v2")
    check(int(pair[0]) == int(PRIMARY) and int(pair[1]) == int(green),
          "cuStreamGetCtx_v2: the primary context and the green context")
    dptr = ok(cu.cuMemAlloc(64), "cuMemAlloc")
    ok(cu.cuMemsetD8Async(dptr, 0x5A, 64, stream), "cuMemsetD8Async on a green stream")
    event = ok(cu.cuEventCreate(0), "cuEventCreate")
    ok(cu.cuGreenCtxRecordEvent(green, event), "cuGreenCtxRecordEvent")
    ok(cu.cuGreenCtxWaitEvent(green, event), "cuGreenCtxWaitEvent")
    ok(cu.cuEventSynchronize(event), "cuEventSynchronize")
    buf = ctypes.create_string_buffer(64)
    ok(cu.cuMemcpyDtoH(buf, dptr, 64), "cuMemcpyDtoH")
    check(buf.raw == b"\x5a" * 64, "the green stream's memset landed")
    ok(cu.cuCtxPushCurrent(ctx), "cuCtxPushCurrent of the green context")
    check(int(ok(cu.cuCtxGetDevice(), "cuCtxGetDevice")) == int(DEVICE), "its device")
    inner = ok(cu.cuStreamCreate(NON_BLOCKING), "cuStreamCreate in the green context")
    check(int(ok(cu.cuStreamGetGreenCtx(inner), "cuStreamGetGreenCtx")) == int(green),
          "a stream made while it is current belongs to it")
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize in the green context")
    ok(cu.cuCtxPopCurrent(), "cuCtxPopCurrent")
    fails(cu.cuCtxDestroy(ctx), R.CUDA_ERROR_INVALID_CONTEXT, "cuCtxDestroy of a green context's context")
    for s in (stream, inner):
        ok(cu.cuStreamDestroy(s), "cuStreamDestroy")
    ok(cu.cuEventDestroy(event), "cuEventDestroy")
    ok(cu.cuMemFree(dptr), "cuMemFree")
    ok(cu.cuGreenCtxDestroy(green), "cuGreenCtxDestroy")
    fails(cu.cuGreenCtxGetDevResource(green, SM), R.CUDA_ERROR_INVALID_CONTEXT, "a destroyed green context")
    check(ok(cu.cuDevicePrimaryCtxGetState(DEVICE), "cuDevicePrimaryCtxGetState")[1] == 1,
          "the primary context stays active")
    for _ in range(20):  # many come and go (their handles on the server go with them)
        green, _ = green_context(1)
        ok(cu.cuGreenCtxDestroy(green), "cuGreenCtxDestroy")


@section
def runtime() -> None:
    whole = rt.cudaDeviceGetDevResource(0, rt.cudaDevResourceType.cudaDevResourceTypeSm)
    check(whole[0] == rt.cudaError_t.cudaSuccess and whole[1].sm.smCount == SMS, "cudaDeviceGetDevResource")
    err, found, count, _ = rt.cudaDevSmResourceSplitByCount(2, whole[1], 0, 8)
    check(err == rt.cudaError_t.cudaSuccess and count == 2, "cudaDevSmResourceSplitByCount", f"{err}")
    err, desc = rt.cudaDevResourceGenerateDesc(found, 2)
    check(err == rt.cudaError_t.cudaSuccess, "cudaDevResourceGenerateDesc", f"{err}")
    err, ctx = rt.cudaGreenCtxCreate(desc, 0, 0)
    check(err == rt.cudaError_t.cudaSuccess, "cudaGreenCtxCreate", f"{err}")
    err, res = rt.cudaExecutionCtxGetDevResource(ctx, rt.cudaDevResourceType.cudaDevResourceTypeSm)
    check(err == rt.cudaError_t.cudaSuccess and res.sm.smCount == 16, "cudaExecutionCtxGetDevResource", f"{err}")
    err, stream = rt.cudaExecutionCtxStreamCreate(ctx, 1, 0)
    check(err == rt.cudaError_t.cudaSuccess, "cudaExecutionCtxStreamCreate", f"{err}")
    check(rt.cudaStreamDestroy(stream)[0] == rt.cudaError_t.cudaSuccess, "cudaStreamDestroy")
    check(rt.cudaExecutionCtxSynchronize(ctx)[0] == rt.cudaError_t.cudaSuccess, "cudaExecutionCtxSynchronize")
    # the runtime asks the driver's private context checks whether ctx is a green context's, then destroys it
    # as the green context: the two are one handle
    check(rt.cudaExecutionCtxDestroy(ctx)[0] == rt.cudaError_t.cudaSuccess, "cudaExecutionCtxDestroy")
    err, primary = rt.cudaDeviceGetExecutionCtx(0)
    check(err == rt.cudaError_t.cudaSuccess and rt.cudaExecutionCtxDestroy(primary)[0] != rt.cudaError_t.cudaSuccess,
          "a primary context is not destroyed as an execution context")


finish()
