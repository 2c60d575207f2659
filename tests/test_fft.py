"""cuFFT through xpuremote: the stock PyTorch wheel's torch.fft, and cuFFT's own API from a program, under xpu-run;
the plans travel to the server and the transforms run there, by the sim device with numpy or
(XPU_TEST_BACKEND=cuda) by NVIDIA's cuFFT on the server's GPU. Each result is compared with the CPU's (torch's or
numpy's).

The same torch program also runs against the cuda backend whose libcuda and libcufft are xpuremote's own
(stand-ins, named as such) chained to a sim server: the cuda backend's calls into an NVIDIA-shaped cuFFT (an int
plan handle made by the library, host arrays of sizes, a size_t answer) without a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, lane_runs, start_server
from test_native_lane import in_c_and_in_python
from test_torch import run_torch
from test_torch_math import library_calls

from xpuremote.client import call_cpu
from xpuremote.protocol import cufft_api

TORCH_FFT = ROOT / "tests" / "programs" / "torch_fft_check.py"
API = ROOT / "tests" / "programs" / "cufft_api_check.py"
# largest difference from the CPU's result relative to its largest magnitude: single precision transforms of up to
# a few hundred points, double precision, half precision (cufftXt)
TOLERANCE = {"double": 1e-12, "z2z": 1e-12, "half": 1e-2}
STATUS = cufft_api.ENUMS


def tolerance(check: str) -> float:
    return next((t for key, t in TOLERANCE.items() if key in check), 1e-5)


def run_program(server: Server, program: Path, **env: str) -> tuple[dict[str, Any], str]:
    proc = run_torch(server, [str(program)], **env)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1]), proc.stderr


def run_preloaded(shim: Path, server: Server, args: list[str]) -> subprocess.CompletedProcess:
    """A program of this Python (numpy, no torch: it starts faster) with xpuremote's libraries preloaded, as xpu-run
    runs one."""
    from xpuremote.interpose.run import child_env

    return subprocess.run([sys.executable, *args], env=child_env(str(shim.parent), server.address),
                          capture_output=True, text=True, timeout=120)


def assert_close(results: dict[str, Any]) -> None:
    failed = {k: v for k, v in results.items() if not isinstance(v, float) or not v <= tolerance(k)}
    assert not failed, json.dumps(failed, indent=1)


@pytest.fixture(scope="module")
def fft_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("fft"), env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS})
    yield srv
    srv.stop()


def test_torch_fft_matches_the_cpu_and_its_calls_reach_the_server(fft_server: Server, tmp_path: Path) -> None:
    """fft, ifft, rfft, irfft2, fftn, of complex and real input, batched and strided (cuFFT's advanced layout), in
    single and double precision: each as on the CPU. Counted where they run: the cuFFT calls reach the server, and
    nothing asks the driver for the private table NVIDIA's cuFFT would (the issue's CUFFT_INTERNAL_ERROR). A plan
    from PyTorch's plan cache is executed again without being made again (ifft's is fft's; fft_c2c's shape three
    times more): each plan created and made once, and executed once through the client (XPU_CALL_CPU), which then
    lets C queue its next executions in the fast lane: the server runs at least four cuFFT calls more than the
    client saw."""
    table = tmp_path / "calls.tsv"
    results, stderr = run_program(fft_server, TORCH_FFT, XPU_CALL_CPU=str(table))
    assert {"fft_c2c", "ifft_c2c_inverse", "rfft_r2c_batched", "irfft2_c2r", "fftn_3d", "fft_batched_middle_dim",
            "fft_of_a_slice_advanced_layout", "rfft_strided_advanced_layout", "fft2_batched_norm_ortho",
            "fft_z2z_double", "rfft_d2z_double", "irfft_z2d_double", "fft_again_from_the_plan_cache",
            "fft_of_real_input_conjugate_fill", "fftn_of_real_input_3d_mirrored"} <= set(results)
    assert_close(results)
    calls = {name: n for name, (n, _) in call_cpu.read(table).items() if name.startswith("cufft")}
    assert calls["cufftCreate"] == calls["cufftXtMakePlanMany"] == calls["cufftXtExec"], calls
    assert "private table" not in stderr and "not supported by xpuremote" not in stderr, stderr[-3000:]
    fft_server.stop()  # its sessions' end lines are in the log once it has stopped
    served = library_calls(fft_server).get("cufft", 0)
    assert served >= 40 and served >= sum(calls.values()) + 4, (served, calls)


def test_cuffts_own_api(shim: Path, tmp_path: Path) -> None:
    """cufftPlan1d/2d/3d/PlanMany (made on the server when the call is made: a size cuFFT refuses is the call's own
    CUFFT_INVALID_SIZE), the advanced and the basic layout in place, unnormalised inverses, z2z, half precision
    through cufftXt, the server's version, and a call that is not forwarded refused with CUFFT_NOT_SUPPORTED and
    named once."""
    srv = start_server(tmp_path)
    try:
        proc = run_preloaded(shim, srv, [str(API)])
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, stderr = json.loads(proc.stdout.splitlines()[-1]), proc.stderr
    statuses = {k: results.pop(k) for k in list(results) if k.endswith("status") or k == "version"}
    assert {"plan_many_advanced_c2c", "plan_many_inverse_unnormalised", "plan2d_r2c_in_place",
            "plan1d_c2r_unnormalised", "plan3d_z2z", "xt_half_c2c"} <= set(results)
    assert_close(results)
    assert statuses["plan1d_size_0_status"] == STATUS["CUFFT_INVALID_SIZE"], statuses
    assert statuses["xt_set_gpus_status"] == STATUS["CUFFT_NOT_SUPPORTED"], statuses
    assert statuses["version_status"] == 0 and statuses["version"] // 1000 == cufft_api.VERSION[0], statuses
    assert stderr.count("cufftXtSetGPUs is not supported by xpuremote") == 1, stderr[-3000:]


@pytest.mark.sim_only(reason="the cuda backend on stand-in libraries chained to a sim server")
def test_the_same_transforms_through_the_cuda_backend(shim: Path, tmp_path: Path) -> None:
    sim = start_server(tmp_path, backend="sim", env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS})
    cuda = start_server(tmp_path, backend="cuda", env={"XPU_CUDA_LIBRARY": str(shim), "XPU_SERVER": sim.address,
                                                       "XPU_CUFFT_LIBRARY": str(shim.parent / "libcufft.so.12")})
    try:
        results, stderr = run_program(cuda, TORCH_FFT)
    finally:
        cuda.stop()
        sim.stop()
    assert_close(results)
    assert "not supported by xpuremote" not in stderr, stderr[-3000:]
    assert library_calls(sim).get("cufft", 0) >= 40, library_calls(sim)  # the stand-in's calls, forwarded again


PLAN = ("import ctypes; plan = ctypes.c_int(); "
        "print(ctypes.CDLL('libcufft.so.12').cufftPlan1d(ctypes.byref(plan), 8, 0x29, 1))")  # CUFFT_C2C


@pytest.mark.sim_only(reason="the server's library versions are the sim's claim (XPU_SIM_LIBRARY_VERSIONS)")
def test_a_server_with_another_major_cufft_is_refused_at_the_plan(shim: Path, tmp_path: Path) -> None:
    """The first plan fails with CUFFT_NOT_SUPPORTED, saying what the program's calls are made for and what the
    server has."""
    major = cufft_api.VERSION[0]
    srv = start_server(tmp_path, env={"XPU_SIM_LIBRARY_VERSIONS": f"cufft={major - 1}.3.0"})
    try:
        proc = run_preloaded(shim, srv, ["-c", PLAN])
    finally:
        srv.stop()
    assert proc.returncode == 0 and proc.stdout.split() == [str(STATUS["CUFFT_NOT_SUPPORTED"])], proc.stderr[-3000:]
    assert f"cannot serve cufft {major}.x" in proc.stderr, proc.stderr[-3000:]
    assert f"the server has {major - 1}.3.0" in proc.stderr, proc.stderr[-3000:]


LANE_PROGRAM = r"""
import ctypes, json
import numpy as np

cu, fft = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libcufft.so.12")
C2C, R2C, C2R, Z2Z, D2Z, Z2D = 0x29, 0x2A, 0x2C, 0x69, 0x6A, 0x6C
N, BATCH, ROUNDS = 16, 2, 3
context, stream = ctypes.c_void_p(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cu.cuCtxSetCurrent(context) == 0 and cu.cuStreamCreate(ctypes.byref(stream), 1) == 0


def device(array):
    address = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(address), array.nbytes) == 0
    assert cu.cuMemcpyHtoD_v2(address, array.ctypes.data_as(ctypes.c_void_p), array.nbytes) == 0
    return ctypes.c_void_p(address.value)


def read(address, dtype, count):
    out = np.empty(count, dtype)
    assert cu.cuMemcpyDtoH_v2(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(address.value), out.nbytes) == 0
    return out


rng = np.random.default_rng(7)
results, statuses = {}, {}
for name, kind, src, dst, direction, n_in, n_out in (
        ("C2C", C2C, np.complex64, np.complex64, -1, N, N),
        ("R2C", R2C, np.float32, np.complex64, None, N, N // 2 + 1),
        ("C2R", C2R, np.complex64, np.float32, None, N // 2 + 1, N),
        ("Z2Z", Z2Z, np.complex128, np.complex128, 1, N, N),
        ("D2Z", D2Z, np.float64, np.complex128, None, N, N // 2 + 1),
        ("Z2D", Z2D, np.complex128, np.float64, None, N // 2 + 1, N)):
    data = rng.standard_normal(n_in * BATCH)
    if np.dtype(src).kind == "c":
        data = data + 1j * rng.standard_normal(n_in * BATCH)
    data = data.astype(src)
    plan = ctypes.c_int()
    assert fft.cufftPlan1d(ctypes.byref(plan), N, kind, BATCH) == 0
    x, y = device(data), device(np.zeros(n_out * BATCH, dst))
    execute = getattr(fft, "cufftExec" + name)
    for _ in range(ROUNDS):  # the first through the client, the others queued in C; the stream set first, as PyTorch
        extra = () if direction is None else (direction,)
        statuses[name] = fft.cufftSetStream(plan, stream) or execute(plan, x, y, *extra)
    assert cu.cuStreamSynchronize(stream) == 0 and cu.cuCtxSynchronize() == 0
    results[name] = [data.tolist() if np.dtype(src).kind != "c" else [data.real.tolist(), data.imag.tolist()],
                     read(y, dst, n_out * BATCH).tolist() if np.dtype(dst).kind != "c"
                     else [read(y, dst, n_out * BATCH).real.tolist(), read(y, dst, n_out * BATCH).imag.tolist()]]
    if name == "C2C":
        assert fft.cufftDestroy(plan) == 0  # a destroyed plan's transform: the client's, failing as before
        statuses["destroyed"] = fft.cufftExecC2C(plan, x, y, -1)
        statuses["destroyed_sync"] = cu.cuCtxSynchronize()
        statuses["unknown"] = fft.cufftExecC2C(12345, x, y, -1)
        statuses["unknown_sync"] = cu.cuCtxSynchronize()
print(json.dumps({"results": results, "statuses": statuses}))
"""


@pytest.mark.sim_only(reason="counts the sim's library calls per session; the client's side is the same on any "
                      "backend")
def test_a_plans_transforms_are_queued_in_c_after_the_first(shim: Path, tmp_path: Path) -> None:
    """cufftExecC2C, R2C, C2R, Z2Z, D2Z and Z2D, each three times on its plan after its cufftSetStream, as PyTorch
    calls them: the first through the client, which then lets C queue that plan's next ones of the kind in the fast
    lane (interpose/kept.h's HANDLE_CALL). With the
    lane and without, the same transforms (as numpy's) and statuses, and the same calls reach the server; with it the
    client sees one transform of each kind, and the server runs the others from the lane. A destroyed plan's
    transform and an unknown plan's go through the client, and fail as they do without the lane."""
    lanes = lane_runs(LANE_PROGRAM, tmp_path, shim, "cufft")
    out, runs = lanes.out, lanes.runs
    for name, (given, got) in out["results"].items():
        given = np.array(given[0]) + 1j * np.array(given[1]) if len(given) == 2 else np.array(given)
        got = np.array(got[0]) + 1j * np.array(got[1]) if len(got) == 2 else np.array(got)
        expected = {"C2C": lambda a: np.fft.fft(a), "Z2Z": lambda a: len(a[0]) * np.fft.ifft(a),
                    "R2C": np.fft.rfft, "D2Z": np.fft.rfft, "C2R": lambda a: np.fft.irfft(a, 16) * 16,
                    "Z2D": lambda a: np.fft.irfft(a, 16) * 16}[name](given.reshape(2, -1)).ravel()
        assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max(), name
    statuses = out["statuses"]
    assert all(statuses[k] == 0 for k in out["results"]), statuses
    assert statuses["destroyed"] == 0 and statuses["destroyed_sync"] != 0, statuses  # queued; its failure deferred
    assert statuses["unknown"] == 0 and statuses["unknown_sync"] != 0, statuses
    in_c, by_core = runs["1"][1], runs["0"][1]
    for name in out["results"]:
        expected = 3 + 2 if name == "C2C" else 3  # the destroyed and the unknown plan's too
        assert by_core[f"cufftExec{name}"][0] == expected, (name, by_core)
        assert in_c[f"cufftExec{name}"][0] == expected - 2, (name, in_c)
    assert by_core["cufftSetStream"][0] == 6 * 3 and in_c["cufftSetStream"][0] == 6, (by_core, in_c)
    served = lanes.served
    lane = lanes.from_lane
    assert len(served) == 2 and served[0] == served[1], served
    assert lane[0] >= lane[1] + 12, lane  # the run with the lane (first) ran 12 transforms from it


# cuFFT's transforms as the shim's C queues them (kept.h's HANDLE_CALL: the plan and the arguments as they are), run by
# a cuda-backend session whose cuFFT is the stand-in (xpuremote's own replacement library, named as such) on the sim,
# or NVIDIA's
NATIVE_SCENARIO = r"""
import numpy as np

PLAN, N, BATCH = 7, 16, 2


def device(data):
    address = int.from_bytes(batch(("cuMemAlloc_v2", [8, data.nbytes]))[0], "little")
    batch(("cuMemcpyHtoD_v2", [address, data.tobytes(), data.nbytes]))
    return address


def record(symbol, *args):
    call = CALLS[symbol]
    head = abi.pack_lane_record(opcode=call.opcode, nargs=len(args), blob_at=abi.LANE_NO_BLOB, ctx=CTX)
    return head + struct.pack(f"<{len(args)}Q", *(a & (2**64 - 1) for a in args))


batch(("cuCtxCreate_v2", [CTX, 0, 0]), ("cufftCreate", [PLAN]))
batch(("cufftMakePlan1d", [PLAN, N, 0x29, BATCH, 8]))
data = (np.arange(N * BATCH) % 5 + 1j * (np.arange(N * BATCH) % 3)).astype(np.complex64)
x, y = device(data), device(np.zeros(N * BATCH, np.complex64))
failures = lane(*[record("cufftExecC2C", PLAN, x, y, -1) for _ in range(4)])
ran = [in_c()]
out = np.frombuffer(batch(("cuMemcpyDtoH_v2", [data.nbytes, y, data.nbytes]))[0], np.complex64)
failures += lane(record("cufftExecC2C", PLAN, y, x, 1), record("cufftExecC2C", PLAN + 1, x, y, -1))
ran.append(in_c())
batch(("cufftDestroy", [PLAN]))
failures += lane(record("cufftExecC2C", PLAN, x, y, -1))
ran.append(in_c())
print(json.dumps({"ran": ran, "failures": failures,
                  "error": float(np.abs(out - np.fft.fft(data.reshape(BATCH, N)).ravel()).max())}))
"""


def test_a_plans_transforms_run_in_c_where_python_ran_the_same_values(driver_env: dict[str, str], shim: Path) -> None:
    """A transform record runs in the worker's C (server/native_lane.c, VETTED) once the session's Python ran one of
    the same values: its plan taught as the library's own number, cuFFT's FORWARD (-1) passed as the int it is. The
    same results and failures in C and in Python; new values and an unknown plan go to Python, and so does a
    destroyed plan's (C forgets at the destroy), each refused as before."""
    env = {**driver_env, "XPU_CUFFT_LIBRARY": str(shim.parent / "libcufft.so.12")} if driver_env else driver_env
    results = dict(zip("10", in_c_and_in_python(NATIVE_SCENARIO, env), strict=True))
    assert results["1"].pop("ran") == [3, 3, 3] and results["0"].pop("ran") == [0, 0, 0], results
    assert results["1"] == results["0"]
    assert [name for name, _ in results["1"]["failures"]] == ["cufftExecC2C"] * 2, results
    assert results["1"]["error"] < 1e-4, results
