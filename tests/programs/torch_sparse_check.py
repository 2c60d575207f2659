"""Stock PyTorch's sparse products on the device (cuSPARSE's SpMM and SpMV) against PyTorch on the CPU; run under
xpu-run by tests/test_sparse.py, prints one JSON line: per check, the largest difference from the CPU's result
(or the error it raised). The COO matrices are coalesced on the CPU, so the device takes them as they are (a
coalesce on the device is ATen's own sort kernels, not cuSPARSE); a CSC matrix PyTorch converts to CSR with its
own scans before cuSPARSE sees it, so there is none here.
"""

from __future__ import annotations

import torch
from torch_checks import check, diff, report

torch.manual_seed(0)


def sparse_like(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A dense matrix with about two thirds of its entries zero, some rows empty."""
    dense = torch.randn(rows, cols, dtype=dtype)
    dense[dense.abs() < 1.0] = 0
    dense[rows // 3] = 0
    return dense


a, b, v = sparse_like(13, 11), torch.randn(11, 7), torch.randn(11)


@check("csr_times_dense")
def _() -> float:
    return diff(a.to_sparse_csr().cuda() @ b.cuda(), a @ b)


@check("csr_times_dense_fp64")
def _() -> float:
    a64, b64 = a.double(), b.double()
    return diff(torch.sparse.mm(a64.to_sparse_csr().cuda(), b64.cuda()), a64 @ b64)


@check("csr_addmm_alpha_beta")
def _() -> float:
    c = torch.randn(13, 7)
    return diff(torch.addmm(c.cuda(), a.to_sparse_csr().cuda(), b.cuda(), beta=0.5, alpha=2.0), 0.5 * c + 2.0 * a @ b)


@check("csr_times_transposed_dense")
def _() -> float:
    bt = torch.randn(7, 11)
    return diff(a.to_sparse_csr().cuda() @ bt.cuda().t(), a @ bt.t())


@check("coo_times_dense")
def _() -> float:
    return diff(torch.sparse.mm(a.to_sparse().coalesce().cuda(), b.cuda()), a @ b)


@check("csr_times_vector")
def _() -> float:
    return diff(a.to_sparse_csr().cuda() @ v.cuda(), a @ v)


@check("csr_addmv_alpha_beta")
def _() -> float:
    y = torch.randn(13)
    return diff(torch.addmv(y.cuda(), a.to_sparse_csr().cuda(), v.cuda(), beta=-1.0, alpha=0.25), -y + 0.25 * a @ v)


report()
