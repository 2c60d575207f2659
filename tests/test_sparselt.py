"""torch.sparse's 2:4 semi-structured sparsity through xpuremote's cuSPARSELt: the stock wheel's
`to_sparse_semi_structured` products reach xpuremote's replacement libcusparseLt.so.0, travel to the server and are
computed there, by the sim device with numpy (server/backends/sim_sparselt.py) or (XPU_TEST_BACKEND=cuda) by
NVIDIA's cuSPARSELt on the server's GPU; tests/programs/torch_sparselt_check.py compares each with the CPU's, and
tests/programs/cusparselt_api_check.py runs cuSPARSELt's own API against numpy.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, start_server
from test_fft import run_preloaded
from test_torch import run_torch
from test_torch_math import library_calls

CHECK = ROOT / "tests" / "programs" / "torch_sparselt_check.py"
API = ROOT / "tests" / "programs" / "cusparselt_api_check.py"
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 1e-5}  # relative to the result's largest value
INVALID_VALUE = 3  # CUSPARSE_STATUS_INVALID_VALUE


def assert_close(results: dict[str, Any]) -> None:
    failed = {k: v for k, v in results.items()
              if not isinstance(v, float) or not v <= next(t for key, t in TOLERANCE.items() if key in k)}
    assert not failed, json.dumps(failed, indent=1)


def run_check(server: Server) -> tuple[dict[str, Any], str]:
    proc = run_torch(server, [str(CHECK)])
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1]), proc.stderr


def test_semi_structured_products_match_the_cpu_and_reach_the_server(tmp_path: Path) -> None:
    """A 2:4-pruned fp16 and bf16 matrix made semi-structured (cuSPARSELt's compression) times a dense one, and a
    sparse linear layer with a bias, are the CPU's dense math. The server holds at most 12 handles of a kind: PyTorch
    makes a matmul descriptor (which cuSPARSELt cannot destroy) on its stack for each of the 33 products, so each
    Init of that struct must replace the object it made before. The calls are counted where they run, none failed,
    and nothing launched NVIDIA's own kernels (before, its cuSPARSELt ran in the program and the sim refused them)."""
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS}, args=("--max-handles", "12"))
    try:
        results, stderr = run_check(srv)
    finally:
        srv.stop()
    assert set(results) == {"semi_structured_fp16_times_dense", "semi_structured_bf16_times_dense",
                            "semi_structured_fp16_linear", "semi_structured_fp16_repeated"}, results
    assert_close(results)
    # 33 products of about 15 calls each (three descriptors, a matmul descriptor, a selection and its setting, a
    # plan, its workspace, the product, five destroys), four compressions of three, the handle
    assert library_calls(srv).get("cusparseLt", 0) >= 33 * 12, library_calls(srv)
    assert "not supported by xpuremote" not in stderr and "operation not supported" not in stderr, stderr[-3000:]
    assert not re.search(r"cusparseLt\w* failed", srv.log()), srv.log()[-3000:]


def test_cusparselts_own_api(shim: Path, tmp_path: Path) -> None:
    """Pruning by strips and by tiles and its check, the plan's compression, fp32 products with alpha and beta and
    a transposed operand against numpy; a struct initialised twice, a copy of a plan's struct naming the plan, a
    struct never initialised and a destroyed plan refused with CUSPARSE_STATUS_INVALID_VALUE; the server's version."""
    from xpuremote.protocol import cusparseLt_api

    srv = start_server(tmp_path)
    try:
        proc = run_preloaded(shim, srv, [str(API)])
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    major, minor, patch = cusparseLt_api.VERSION
    assert results.pop("version") == major * 1000 + minor * 100 + patch, results
    statuses = {k: results.pop(k) for k in list(results) if k.endswith(("status", "before", "after"))}
    assert statuses == {"never_initialised_status": INVALID_VALUE, "destroyed_plan_status": INVALID_VALUE,
                        "prune_check_before": 1, "prune_check_after": 0}, statuses
    assert set(results) == {"prune_strip", "prune_tile", "matmul_alpha_beta_fp32", "matmul_transposed_b_fp32"}
    assert_close({k.replace("prune", "prune_fp32"): v for k, v in results.items()})
    assert library_calls(srv).get("cusparseLt", 0) >= 30, library_calls(srv)


VERSIONS = ("import torch; from torch.sparse import to_sparse_semi_structured as s; "
            "a = torch.tensor([[1.0, 0, 2, 0] * 16] * 32).half().cuda(); print(s(a).to_dense().sum().item())")


@pytest.mark.sim_only(reason="the server's library versions are the sim's claim (XPU_SIM_LIBRARY_VERSIONS)")
def test_a_server_with_an_older_cusparselt_is_refused_at_the_handle(tmp_path: Path) -> None:
    """A server whose cuSPARSELt is of another major.minor than the headers (before 1.0 each minor is its own ABI)
    refuses the first cusparseLtInit, naming both versions; the program gets cuSPARSELt's error, not a crash."""
    from xpuremote.protocol import cusparseLt_api

    major, minor, _ = cusparseLt_api.VERSION
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS,
                                      "XPU_SIM_LIBRARY_VERSIONS": f"cusparseLt={major}.{minor - 1}.0"})
    try:
        proc = run_torch(srv, ["-c", VERSIONS])
    finally:
        srv.stop()
    assert proc.returncode != 0
    assert f"cannot serve cusparseLt {major}.{minor}" in proc.stderr, proc.stderr[-3000:]
    assert f"the server has {major}.{minor - 1}.0" in proc.stderr, proc.stderr[-3000:]
    assert "CUSPARSE_STATUS_NOT_SUPPORTED" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.sim_only(reason="the cuda backend on stand-in libraries chained to a sim server")
def test_the_same_api_through_the_cuda_backend(shim: Path, tmp_path: Path) -> None:
    """The cuda backend's path for cuSPARSELt's structs (its own aligned struct per object, given to the library by
    address and freed with the handle; the product's array of streams made its own), run on stand-in libraries
    (xpuremote's libcuda and libcusparseLt, chained to a sim server) without a GPU."""
    sim = start_server(tmp_path, backend="sim")
    cuda = start_server(tmp_path, backend="cuda", env={
        "XPU_CUDA_LIBRARY": str(shim), "XPU_SERVER": sim.address,
        "XPU_CUSPARSELT_LIBRARY": str(shim.parent / "libcusparseLt.so.0")})
    try:
        proc = run_preloaded(shim, cuda, [str(API)])
    finally:
        cuda.stop()
        sim.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    assert_close({k.replace("prune", "prune_fp32"): v for k, v in results.items()
                  if k.startswith(("prune_strip", "prune_tile", "matmul"))})
    assert results["destroyed_plan_status"] == INVALID_VALUE, results
    assert library_calls(sim).get("cusparseLt", 0) >= 30, library_calls(sim)  # the stand-in's, forwarded again
