"""torch.sparse through xpuremote's cuSPARSE: the stock wheel's sparse products reach xpuremote's replacement
libcusparse.so.12, travel to the server and are computed there, by the sim device with numpy
(server/backends/sim_sparse.py) or (XPU_TEST_BACKEND=cuda) by NVIDIA's cuSPARSE on the server's GPU;
tests/programs/torch_sparse_check.py compares each result with the CPU's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, start_server
from test_torch import run_torch
from test_torch_math import assert_close, library_calls

SPARSE = ROOT / "tests" / "programs" / "torch_sparse_check.py"
CHECKS = {"csr_times_dense", "csr_times_dense_fp64", "csr_addmm_alpha_beta", "csr_times_transposed_dense",
          "coo_times_dense", "csr_times_vector", "csr_addmv_alpha_beta"}


def run_sparse(server: Server) -> tuple[dict[str, Any], str]:
    proc = run_torch(server, [str(SPARSE)])
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1]), proc.stderr


def test_sparse_times_dense_and_vector_match_the_cpu_and_reach_the_server(tmp_path: Path) -> None:
    """CSR and COO times a dense matrix (with alpha and beta, a transposed operand, fp64) and CSR times a vector
    are the CPU's; cuSPARSE's calls are counted where they run, none refused, and nothing asks NVIDIA's libraries'
    private tables (NVIDIA's own libcusparse, mapped beside the replacement, launched its own kernels before)."""
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS})
    try:
        results, stderr = run_sparse(srv)
    finally:
        srv.stop()
    assert set(results) >= CHECKS, results
    assert_close(results)
    # seven products: each a handle's stream, four descriptors, a buffer size, the product, three destroys
    assert library_calls(srv).get("cusparse", 0) >= 7 * 5, library_calls(srv)
    assert "private table" not in stderr and "not supported by xpuremote" not in stderr, stderr[-3000:]
    assert not re.search(r"cusparse\w* failed", srv.log()), srv.log()[-3000:]


VERSIONS = ("import torch; a = torch.eye(4).to_sparse_csr().cuda(); "
            "print((a @ torch.ones(4, 2, device='cuda')).sum().item())")


@pytest.mark.sim_only(reason="the server's library versions are the sim's claim (XPU_SIM_LIBRARY_VERSIONS)")
def test_a_server_with_an_older_cusparse_major_is_refused_at_the_handle(tmp_path: Path) -> None:
    """A server whose cuSPARSE is of another major than the headers the replacement was generated from refuses
    the first cusparseCreate, naming both versions; the program gets cuSPARSE's error, not a crash."""
    from xpuremote.protocol import cusparse_api

    major = cusparse_api.VERSION[0]
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS,
                                      "XPU_SIM_LIBRARY_VERSIONS": f"cusparse={major - 1}.5.0"})
    try:
        proc = run_torch(srv, ["-c", VERSIONS])
    finally:
        srv.stop()
    assert proc.returncode != 0
    assert f"cannot serve cusparse {major}.x" in proc.stderr, proc.stderr[-3000:]
    assert f"the server has {major - 1}.5.0" in proc.stderr, proc.stderr[-3000:]
    assert "CUSPARSE_STATUS_NOT_SUPPORTED" in proc.stderr, proc.stderr[-3000:]
