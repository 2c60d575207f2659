"""The cuda backend, without a GPU: its libcuda is xpuremote's own shim (a stand-in, named as
such) talking to a sim server. This exercises the backend's generic replay of every call
shape, the inventory and the hand-written requests, end to end. On a GPU machine
(XPU_TEST_BACKEND=cuda) the other test modules run the cuda backend on NVIDIA's libcuda."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import shim_env, start_chain
from pyclient import PyClient
from test_isolation import HOSTILE, SIZE, host_pointer_statuses, load
from toolchain import nvcc_lib_dir, nvcc_path

from xpuremote.protocol import errors

ROOT = Path(__file__).resolve().parent.parent
# The stand-in needs no GPU (CI runs it); on a GPU its checks are the other modules'.
pytestmark = pytest.mark.sim_only(reason="the cuda backend on a stand-in libcuda chained to a sim server")


def test_vector_add_through_the_cuda_backend(chained, run_on, tmp_path: Path) -> None:
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc is not installed")
    exe = tmp_path / "vector_add"
    subprocess.run([nvcc, "-arch=sm_90", f"-L{nvcc_lib_dir()}", "-o", str(exe), str(ROOT / "examples/vector_add.cu")],
                   check=True, capture_output=True)
    cuda, sim = chained
    result = run_on([str(exe)], address=cuda.address)
    assert result.returncode == 0, result.stderr
    assert "correct (0 wrong)" in result.stdout
    assert "xpuremote sim device 0" in result.stdout  # the inventory came through the backend


def test_driver_calls_through_the_cuda_backend(chained, run_on) -> None:
    cuda, _ = chained
    script = """
import ctypes, os
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cu.cuCtxSetCurrent(ctx) == 0
assert cu.cuMemAlloc_v2(ctypes.byref(ptr), 1 << 20) == 0
data = os.urandom(1 << 20)
assert cu.cuMemcpyHtoD_v2(ptr, data, len(data)) == 0
assert cu.cuMemsetD8_v2(ctypes.c_uint64(ptr.value + 10), 7, 5) == 0
# the fast lane's calls, which the cuda backend runs compiled (CudaBackend.runner)
stream, event = ctypes.c_void_p(), ctypes.c_void_p()
assert cu.cuStreamCreate(ctypes.byref(stream), 1) == 0 and cu.cuEventCreate(ctypes.byref(event), 0) == 0
for i in range(300):
    assert cu.cuMemsetD8Async(ctypes.c_uint64(ptr.value + 100 + i), i & 0xFF, 1, stream) == 0
assert cu.cuEventRecord(event, stream) == 0 and cu.cuStreamWaitEvent(None, event, 0) == 0
back = ctypes.create_string_buffer(len(data))
assert cu.cuMemcpyDtoH_v2(back, ptr, len(data)) == 0
expected = data[:10] + bytes([7] * 5) + data[15:100] + bytes(i & 0xFF for i in range(300)) + data[400:]
assert back.raw == expected
free, total = ctypes.c_size_t(), ctypes.c_size_t()
assert cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0 and free.value < total.value
assert cu.cuMemFree_v2(ptr) == 0
assert cu.cuCtxSynchronize() == 0
print("ok")
"""
    result = run_on([sys.executable, "-c", script], address=cuda.address)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_host_pointers_never_reach_the_driver(chained) -> None:
    """A hand-made client's 2D/3D copy struct, unified copy or launch naming the worker's own memory is
    refused by the worker: replayed, the driver (here the stand-in, which follows host pointers as
    NVIDIA's does) would read the worker's memory. Device addresses are checked before the GPU sees them."""
    cuda, _ = chained
    earlier = len(cuda.log())  # the shared server's log holds other tests' refusals
    client = PyClient(cuda.address)
    try:
        mine = client.alloc(SIZE)
        load(client)
        refused = host_pointer_statuses(client, mine)
        assert refused == dict.fromkeys(refused, errors.NOT_SUPPORTED), refused
        assert client.status_of("cuMemcpyDtoH_v2", 64, HOSTILE, 64) == errors.INVALID_VALUE
        assert client.status_of("cuMemcpyDtoH_v2", 64, mine + SIZE - 32, 64) == errors.INVALID_VALUE
        log = cuda.log()[earlier:]
        assert "cuMemcpyDtoH_v2: srcDevice" in log and "on the server's GPU" not in log
        client.write(mine, b"ok" * 32)
        assert client.read(mine, 64) == b"ok" * 32  # the session goes on
    finally:
        client.close()


def test_an_attribute_the_driver_refuses_is_refused_to_the_application(shim: Path, tmp_path: Path) -> None:
    """A driver older than cuda.h refuses the newer attributes (an H100's 580 driver: 148-161). The cuda
    backend's inventory lists what its driver refused and the client refuses them too, where it answered
    0 with success; the sim stands for such a driver with XPU_SIM_REFUSED_ATTRIBUTES."""
    cuda, sim = start_chain(tmp_path, shim, {"XPU_SIM_REFUSED_ATTRIBUTES": "148,150"})
    body = ("import ctypes\ncu = ctypes.CDLL('libcuda.so.1')\nv = ctypes.c_int(-1)\nprint(cu.cuInit(0))\n"
            "for code in (1, 148, 149, 150):\n"
            "    v.value = -1\n"
            "    print(code, cu.cuDeviceGetAttribute(ctypes.byref(v), code, 0), v.value)\n")
    try:
        for server in (sim, cuda):
            proc = subprocess.run([sys.executable, "-c", body], env=shim_env(shim, server.address),
                                  capture_output=True, text=True, timeout=120)
            lines = proc.stdout.split("\n")
            assert lines[0] == "0" and lines[1].startswith("1 0 ") and lines[1] != "1 0 0", proc.stdout + proc.stderr
            assert lines[2:5] == ["148 1 -1", "149 0 0", "150 1 -1"], proc.stdout + proc.stderr
    finally:
        cuda.stop()
        sim.stop()
