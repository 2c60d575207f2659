"""A CuPy-style runtime kernel, as tests/test_nvrtc.py runs it under xpu-run: compiled here by NVRTC to a cubin or
to PTX, or to LTO-IR that nvJitLink links to a cubin (both host-only compilers, run locally), then loaded with
cuModuleLoadData and launched through the driver API, all with ctypes. Prints one JSON line per way: the image's
size and the largest difference from the result computed here.

    python nvrtc_check.py NVIDIA_LIB_DIR [cubin] [ptx] [jitlink]
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

lib_dir = Path(sys.argv[1])
nvrtc = ctypes.CDLL(str(lib_dir / "libnvrtc.so.13"))
cuda = ctypes.CDLL("libcuda.so.1")
SOURCE = b'''
extern "C" __global__ void scale_add(const float *x, const float *y, float *out, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
'''

def ok(status: int, what: str) -> None:
    if status != 0:
        raise SystemExit(f"{what} failed: {status}")

def compile_(options: list[bytes]) -> ctypes.c_void_p:
    prog = ctypes.c_void_p()
    ok(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), SOURCE, b"scale_add.cu", 0, None, None), "nvrtcCreateProgram")
    opts = (ctypes.c_char_p * len(options))(*options)
    status = nvrtc.nvrtcCompileProgram(prog, len(options), opts)
    if status:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise SystemExit(f"nvrtcCompileProgram: {status}: {log.value.decode()}")
    return prog


def get(prog: ctypes.c_void_p, kind: str) -> bytes:
    size = ctypes.c_size_t()
    ok(getattr(nvrtc, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size)), f"nvrtcGet{kind}Size")
    buf = ctypes.create_string_buffer(size.value)
    ok(getattr(nvrtc, f"nvrtcGet{kind}")(prog, buf), f"nvrtcGet{kind}")
    return buf.raw


def build(mode: str) -> bytes:
    if mode == "cubin":
        image = get(compile_([b"--gpu-architecture=sm_90"]), "CUBIN")
    elif mode == "ptx":
        image = get(compile_([b"--gpu-architecture=compute_90"]), "PTX")
    else:
        ltoir = get(compile_([b"--gpu-architecture=sm_90", b"-dlto", b"--relocatable-device-code=true"]), "LTOIR")
        jit = ctypes.CDLL(str(lib_dir / "libnvJitLink.so.13"))
        handle = ctypes.c_void_p()
        opts = (ctypes.c_char_p * 2)(b"-arch=sm_90", b"-lto")
        ok(jit.nvJitLinkCreate(ctypes.byref(handle), 2, opts), "nvJitLinkCreate")
        ok(jit.nvJitLinkAddData(handle, 3, ltoir, len(ltoir), b"scale_add"), "nvJitLinkAddData")  # INPUT_LTOIR
        ok(jit.nvJitLinkComplete(handle), "nvJitLinkComplete")
        size = ctypes.c_size_t()
        ok(jit.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size)), "nvJitLinkGetLinkedCubinSize")
        buf = ctypes.create_string_buffer(size.value)
        ok(jit.nvJitLinkGetLinkedCubin(handle, buf), "nvJitLinkGetLinkedCubin")
        image = buf.raw
    return image


def run(image: bytes) -> float:
    """The largest difference of the kernel's result from the one computed here."""
    n = 1000
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    ok(cuda.cuModuleLoadData(ctypes.byref(mod), image), "cuModuleLoadData")
    ok(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"scale_add"), "cuModuleGetFunction")
    x = (ctypes.c_float * n)(*[i * 0.5 for i in range(n)])
    y = (ctypes.c_float * n)(*[1.0 - i for i in range(n)])
    ptrs = [ctypes.c_uint64() for _ in range(3)]
    for p in ptrs:
        ok(cuda.cuMemAlloc_v2(ctypes.byref(p), 4 * n), "cuMemAlloc")
    ok(cuda.cuMemcpyHtoD_v2(ptrs[0], x, 4 * n), "cuMemcpyHtoD")
    ok(cuda.cuMemcpyHtoD_v2(ptrs[1], y, 4 * n), "cuMemcpyHtoD")
    a, count = ctypes.c_float(3.0), ctypes.c_int(n)
    args = (ctypes.c_void_p * 5)(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in (*ptrs, a, count)])
    ok(cuda.cuLaunchKernel(fn, (n + 255) // 256, 1, 1, 256, 1, 1, 0, None, args, None), "cuLaunchKernel")
    out = (ctypes.c_float * n)()
    ok(cuda.cuMemcpyDtoH_v2(out, ptrs[2], 4 * n), "cuMemcpyDtoH")
    return max(abs(out[i] - (3.0 * x[i] + y[i])) for i in range(n))


ok(cuda.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ok(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
for mode in sys.argv[2:]:
    image = build(mode)
    print(json.dumps({"mode": mode, "image_bytes": len(image), "max_error": run(image)}), flush=True)
