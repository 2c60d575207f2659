"""cuFFT's own API from a program (ctypes into libcufft.so.12, device memory from the driver API), against numpy on
the CPU; run with xpuremote's libraries preloaded by tests/test_fft.py. Prints one JSON line: per check, the largest
difference from numpy's result relative to its largest magnitude, or the status a call returned.

What torch.fft does not reach: cufftPlan1d/2d/3d/PlanMany, an in-place r2c in the basic layout (its real rows
padded), the unnormalised c2r of cufftExecC2R, half precision through cufftXtMakePlanMany, a size refused when the
plan is made, the version, a call that is not forwarded.
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np

CU, FFT = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libcufft.so.12")
C2C, R2C, C2R, Z2Z = 0x29, 0x2A, 0x2C, 0x69  # cufftType
FORWARD, INVERSE = -1, 1
C_16F = 6  # cudaDataType CUDA_C_16F
results: dict[str, float | int] = {}
rng = np.random.default_rng(0)


def plan_of(status: int, plan: ctypes.c_int) -> int:
    if status:
        raise RuntimeError(f"plan: cuFFT status {status}")
    return plan.value


def ints(*values: int, kind: type = ctypes.c_int) -> ctypes.Array:
    return (kind * len(values))(*values)


def rel(device: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(device - expected).max() / np.abs(expected).max())


def run(status: int) -> None:
    if status:
        raise RuntimeError(f"cuFFT status {status}")
    ok(CU.cuCtxSynchronize(), "cuCtxSynchronize")


def ok(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what}: CUresult {status}")


class Device:
    """An array's bytes in device memory."""

    def __init__(self, array: np.ndarray) -> None:
        self.nbytes, address = array.nbytes, ctypes.c_uint64()
        ok(CU.cuMemAlloc_v2(ctypes.byref(address), self.nbytes), "cuMemAlloc")
        self.ptr = ctypes.c_void_p(address.value)
        ok(CU.cuMemcpyHtoD_v2(address, np.ascontiguousarray(array).ctypes.data_as(ctypes.c_void_p), self.nbytes),
           "cuMemcpyHtoD")

    def read(self, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, dtype)
        ok(CU.cuMemcpyDtoH_v2(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(self.ptr.value), out.nbytes),
           "cuMemcpyDtoH")
        return out


def advanced_c2c() -> None:
    """3 transforms of 16, each every other element (istride 2) of 40 (idist); out packed."""
    data = (rng.standard_normal(120) + 1j * rng.standard_normal(120)).astype(np.complex64)
    x, y = Device(data), Device(np.zeros(48, np.complex64))
    plan = ctypes.c_int()
    handle = plan_of(FFT.cufftPlanMany(ctypes.byref(plan), 1, ints(16), ints(16), 2, 40, ints(16), 1, 16, C2C, 3),
                     plan)
    logical = data.reshape(3, 40)[:, :32:2]
    run(FFT.cufftExecC2C(handle, x.ptr, y.ptr, FORWARD))
    results["plan_many_advanced_c2c"] = rel(y.read(np.complex64, (3, 16)), np.fft.fft(logical))
    run(FFT.cufftExecC2C(handle, x.ptr, y.ptr, INVERSE))
    results["plan_many_inverse_unnormalised"] = rel(y.read(np.complex64, (3, 16)), 16 * np.fft.ifft(logical))
    FFT.cufftDestroy(handle)


def r2c_in_place() -> None:
    """cufftPlan2d's basic layout in place: each real row of 10 padded to 2 * (10 / 2 + 1) = 12."""
    real = rng.standard_normal((8, 10)).astype(np.float32)
    padded = np.zeros((8, 12), np.float32)
    padded[:, :10] = real
    x = Device(padded)
    plan = ctypes.c_int()
    handle = plan_of(FFT.cufftPlan2d(ctypes.byref(plan), 8, 10, R2C), plan)
    run(FFT.cufftExecR2C(handle, x.ptr, x.ptr))
    spectrum = x.read(np.complex64, (8, 6))
    results["plan2d_r2c_in_place"] = rel(spectrum, np.fft.rfft2(real))
    FFT.cufftDestroy(handle)


def c2r_batched() -> None:
    spectrum = (rng.standard_normal((2, 9)) + 1j * rng.standard_normal((2, 9))).astype(np.complex64)
    spectrum[:, 0] = spectrum[:, 0].real  # hermitian: real DC and Nyquist bins
    spectrum[:, -1] = spectrum[:, -1].real
    x, y = Device(spectrum), Device(np.zeros((2, 16), np.float32))
    plan = ctypes.c_int()
    handle = plan_of(FFT.cufftPlan1d(ctypes.byref(plan), 16, C2R, 2), plan)
    run(FFT.cufftExecC2R(handle, x.ptr, y.ptr))
    results["plan1d_c2r_unnormalised"] = rel(y.read(np.float32, (2, 16)), 16 * np.fft.irfft(spectrum, 16))
    FFT.cufftDestroy(handle)


def z2z_3d() -> None:
    data = rng.standard_normal((4, 6, 8)) + 1j * rng.standard_normal((4, 6, 8))
    x, y = Device(data), Device(np.zeros_like(data))
    plan = ctypes.c_int()
    handle = plan_of(FFT.cufftPlan3d(ctypes.byref(plan), 4, 6, 8, Z2Z), plan)
    run(FFT.cufftExecZ2Z(handle, x.ptr, y.ptr, FORWARD))
    results["plan3d_z2z"] = rel(y.read(np.complex128, (4, 6, 8)), np.fft.fftn(data))
    FFT.cufftDestroy(handle)


def half_xt() -> None:
    """Half precision (complex32) through cufftXtMakePlanMany and cufftXtExec, 2 transforms of 32."""
    data = (rng.standard_normal((2, 32)) + 1j * rng.standard_normal((2, 32))).astype(np.complex64)
    halves = data.view(np.float32).astype(np.float16)
    x, y = Device(halves), Device(np.zeros_like(halves))
    plan, size = ctypes.c_int(), ctypes.c_size_t()
    plan_of(FFT.cufftCreate(ctypes.byref(plan)), plan)
    n = ints(32, kind=ctypes.c_longlong)
    status = FFT.cufftXtMakePlanMany(plan, 1, n, None, ctypes.c_longlong(1), ctypes.c_longlong(1), C_16F, None,
                                     ctypes.c_longlong(1), ctypes.c_longlong(1), C_16F, ctypes.c_longlong(2),
                                     ctypes.byref(size), C_16F)
    plan_of(status, plan)
    run(FFT.cufftXtExec(plan, x.ptr, y.ptr, FORWARD))
    result = y.read(np.float16, halves.shape).astype(np.float32).view(np.complex64)
    expected = np.fft.fft(halves.astype(np.float32).view(np.complex64))
    results["xt_half_c2c"] = rel(result, expected)
    FFT.cufftDestroy(plan)


def refusals() -> None:
    plan = ctypes.c_int()
    results["plan1d_size_0_status"] = FFT.cufftPlan1d(ctypes.byref(plan), 0, C2C, 1)
    version = ctypes.c_int()
    results["version_status"] = FFT.cufftGetVersion(ctypes.byref(version))
    results["version"] = version.value
    plan_of(FFT.cufftCreate(ctypes.byref(plan)), plan)
    results["xt_set_gpus_status"] = FFT.cufftXtSetGPUs(plan, 2, ints(0, 1))
    FFT.cufftDestroy(plan)


FFT.cufftXtExec.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
device, context = ctypes.c_int(), ctypes.c_void_p()
ok(CU.cuInit(0), "cuInit")
ok(CU.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
ok(CU.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
ok(CU.cuCtxSetCurrent(context), "cuCtxSetCurrent")
for check in (advanced_c2c, r2c_in_place, c2r_batched, z2z_3d, half_xt, refusals):
    print(f"check {check.__name__}", file=sys.stderr, flush=True)
    check()
print(json.dumps(results))
