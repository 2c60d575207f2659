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

import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, start_server
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
    times more): the client's calls (XPU_CALL_CPU) hold at least four executions more than plans, each plan created
    and made once."""
    table = tmp_path / "calls.tsv"
    results, stderr = run_program(fft_server, TORCH_FFT, XPU_CALL_CPU=str(table))
    assert {"fft_c2c", "ifft_c2c_inverse", "rfft_r2c_batched", "irfft2_c2r", "fftn_3d", "fft_batched_middle_dim",
            "fft_of_a_slice_advanced_layout", "rfft_strided_advanced_layout", "fft2_batched_norm_ortho",
            "fft_z2z_double", "rfft_d2z_double", "irfft_z2d_double", "fft_again_from_the_plan_cache",
            "fft_of_real_input_conjugate_fill", "fftn_of_real_input_3d_mirrored"} <= set(results)
    assert_close(results)
    calls = {name: n for name, (n, _) in call_cpu.read(table).items() if name.startswith("cufft")}
    assert calls["cufftCreate"] == calls["cufftXtMakePlanMany"] <= calls["cufftXtExec"] - 4, calls
    assert "private table" not in stderr and "not supported by xpuremote" not in stderr, stderr[-3000:]
    fft_server.stop()  # its sessions' end lines are in the log once it has stopped
    assert library_calls(fft_server).get("cufft", 0) >= 40, library_calls(fft_server)


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
