"""How the failure of an asynchronous call reaches the application (docs/client-core.md, "Failures of asynchronous
calls"): the status it carries, which later calls return it and when it is cleared, and CUDA_LAUNCH_BLOCKING=1.

The failures are the sim's refusals: cublasCgemm_v2, which it does not implement, and PyTorch kernels it has no
host implementation of (a normal distribution's, the sparse bmm's search_end_matrix_indices)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, SIM_KERNELS, Server, shim_env, start_server
from test_torch import run_torch

from xpuremote.protocol import errors, mathlibs

pytestmark = pytest.mark.sim_only(reason="the failures are the sim's refusals (a call it does not implement, "
                                  "kernels it has no host implementation of); a GPU runs them")

CUBLAS_NOT_SUPPORTED = mathlibs.status_code(mathlibs.CUBLAS, "not_supported")

# a complex GEMM the sim refuses, then the waits: a context synchronize (as a program that leaves its result
# unchecked makes it) and two stream synchronizes
GEMM_PROGRAM = r"""
import ctypes
from xpuremote.interpose.build import LIBRARY_NAMES

cuda, blas = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL(LIBRARY_NAMES[0])
context, handle, N = ctypes.c_void_p(), ctypes.c_void_p(), 4
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cuda.cuCtxSetCurrent(context) == 0 and blas.cublasCreate_v2(ctypes.byref(handle)) == 0


def alloc(size):
    address = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(address), size) == 0
    return ctypes.c_uint64(address.value)


a, b, c = alloc(8 * N * N), alloc(8 * N * N), alloc(8 * N * N)
alpha, beta = (ctypes.c_float * 2)(1.0, 0.0), (ctypes.c_float * 2)(0.0, 0.0)
print(blas.cublasCgemm_v2(handle, 0, 0, N, N, N, alpha, a, N, b, N, beta, c, N))
print(cuda.cuCtxSynchronize())
print(cuda.cuStreamSynchronize(None))
print(cuda.cuStreamSynchronize(None))
"""

# a kernel the sim lacks (randn's), then a copy to the host; a sparse bmm whose kernel the sim lacks, followed by
# PyTorch's own unchecked cudaDeviceSynchronize: each op, and where it raised
TORCH_PROGRAM = r"""
import torch


def attempt(what, op):
    try:
        op()
        print(what, "returned")
    except Exception as exc:
        print(what, "raised:", str(exc).splitlines()[0])


x = torch.ones(8, device="cuda")
attempt("randn", lambda: globals().update(y=torch.randn(8, device="cuda")))
attempt("copy", lambda: y.cpu())
indices = torch.tensor([[0, 0, 1], [0, 1, 2], [1, 0, 3]]).t()
sparse = torch.sparse_coo_tensor(indices, torch.tensor([1.0, 2.0, 3.0]), (2, 3, 4)).coalesce().cuda()
attempt("bmm", lambda: print("bmm sum", torch.bmm(sparse, torch.ones(2, 4, 5).cuda()).cpu().sum().item()))
attempt("after", lambda: print("after sum", (x * 2).cpu().sum().item()))
attempt("again", lambda: print("again sum", (x * 2).cpu().sum().item()))
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    kernels = f"{SIM_KERNELS},{ROOT / 'tests' / 'torch_sim_kernels.py'}"
    srv = start_server(tmp_path_factory.mktemp("deferred"), env={"XPU_SIM_KERNELS": kernels})
    yield srv
    srv.stop()


def run_gemm(shim: Path, sim: Server, **env: str) -> tuple[list[int], str]:
    proc = subprocess.run([sys.executable, "-c", GEMM_PROGRAM], capture_output=True, text=True, timeout=60,
                          env=shim_env(shim, sim.address, **env))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return [int(line) for line in proc.stdout.split()], proc.stderr


@pytest.mark.parametrize("lane", ["1", "0"])
def test_a_refused_gemm_reports_cublas_not_supported_once(shim: Path, sim: Server, lane: str) -> None:
    """cublasCgemm_v2 queued in C (a lane record) or by the client: its failure is cuBLAS's NOT_SUPPORTED (a lane
    record's was CUDA's 801 read as CUBLAS_STATUS_801); a driver call gets CUDA_ERROR_NOT_SUPPORTED, not
    LAUNCH_FAILED; the synchronize that returned it is the last to (a refusal is not sticky: a program that
    checks every result sees it once)."""
    before = sim.log().count("cublasCgemm_v2 (lane) failed")
    statuses, stderr = run_gemm(shim, sim, XPU_LANE=lane)
    assert statuses == [0, errors.NOT_SUPPORTED, 0, 0], (statuses, stderr)
    assert "an earlier cublasCgemm_v2 failed: CUBLAS_STATUS_NOT_SUPPORTED" in stderr, stderr
    assert stderr.count("an earlier cublasCgemm_v2 failed") == 1, stderr  # said once on stderr
    in_lane = sim.log().count("cublasCgemm_v2 (lane) failed") - before
    assert in_lane == (lane == "1"), sim.log()[-2000:]


def test_under_launch_blocking_the_refused_call_returns_its_own_status(shim: Path, sim: Server) -> None:
    """CUDA_LAUNCH_BLOCKING=1: the GEMM is sent and waited for, so it returns CUBLAS_STATUS_NOT_SUPPORTED itself and
    nothing is left for the waits after it; the client says so once at start-up."""
    statuses, stderr = run_gemm(shim, sim, CUDA_LAUNCH_BLOCKING="1", XPU_LOG="INFO")
    assert statuses == [CUBLAS_NOT_SUPPORTED, 0, 0, 0], (statuses, stderr)
    assert stderr.count("CUDA_LAUNCH_BLOCKING=1: every asynchronous call") == 1, stderr


def test_pytorch_raises_where_a_refusal_is_checked(sim: Server) -> None:
    """PyTorch: a missing kernel's launch fails at the next copy to the host. The sparse bmm follows its failed
    kernel with a cudaDeviceSynchronize it does not check, as on NVIDIA's driver: the runtime keeps that failure
    as the thread's last error, and PyTorch's next launch check raises it (before, the failure was given to a
    cuSPARSE call as cuSPARSE's, or vanished). A later op runs. Under CUDA_LAUNCH_BLOCKING=1 each op raises at
    its own failing launch, the debugging step PyTorch's message suggests."""
    lines = run_torch(sim, ["-c", TORCH_PROGRAM]).stdout.splitlines()
    assert lines[:2] == ["randn returned", "copy raised: CUDA error: operation not supported"], lines
    assert lines[2:4] == ["bmm sum 0.0", "bmm returned"], lines  # the kernel that failed wrote nothing
    # the runtime kept the unchecked synchronize's failure as its last error: PyTorch's next launch check reads it
    assert lines[4:] == ["after raised: CUDA error: operation not supported", "again sum 16.0", "again returned"], lines

    lines = run_torch(sim, ["-c", TORCH_PROGRAM], CUDA_LAUNCH_BLOCKING="1").stdout.splitlines()
    assert lines[:3] == ["randn raised: CUDA error: operation not supported", "copy raised: name 'y' is not defined",
                         "bmm raised: CUDA error: operation not supported"], lines
    assert lines[3:] == ["after sum 16.0", "after returned", "again sum 16.0", "again returned"], lines
