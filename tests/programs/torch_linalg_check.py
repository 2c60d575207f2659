"""Stock PyTorch's torch.linalg on the device (cuSOLVER, and the cuBLAS batched solvers PyTorch routes small
batches to) against PyTorch on the CPU; run under xpu-run by tests/test_linalg.py, prints one JSON line: per
check, the largest difference from the CPU's result relative to the result's largest magnitude (or the error it
raised).

Inputs are float32 and well conditioned (a random matrix plus a multiple of the identity), so each difference is
rounding. Where a result is unique only up to signs (eigenvectors, singular vectors) the check compares what is
unique: the values, and the matrix rebuilt from the factors. The sizes pick PyTorch's paths (its heuristics in
aten/src/ATen/native/cuda/linalg/BatchLinearAlgebra.cpp, default backend), named in each check.
"""

from __future__ import annotations

import torch
from torch_checks import check, rel, report

torch.manual_seed(0)


def well_conditioned(*shape: int) -> torch.Tensor:
    n = shape[-1]
    return torch.randn(*shape) / n ** 0.5 + 2 * torch.eye(n)


def positive_definite(*shape: int) -> torch.Tensor:
    a = torch.randn(*shape)
    return a @ a.mT / shape[-1] + torch.eye(shape[-1])


def symmetric(*shape: int) -> torch.Tensor:
    a = torch.randn(*shape)
    return (a + a.mT) / 2


@check("solve")
def _() -> float:
    """One 32x32 system, 3 right-hand sides: cusolverDnSgetrf, then cusolverDnSgetrs (n <= 64, batch <= 2)."""
    a, b = well_conditioned(32, 32), torch.randn(32, 3)
    return rel(torch.linalg.solve(a.cuda(), b.cuda()), torch.linalg.solve(a, b))


@check("solve_batched")
def _() -> float:
    """Four 6x6 systems: cublasSgetrfBatched and cublasSgetrsBatched (n <= 8)."""
    a, b = well_conditioned(4, 6, 6), torch.randn(4, 6, 2)
    return rel(torch.linalg.solve(a.cuda(), b.cuda()), torch.linalg.solve(a, b))


@check("inv_batched")
def _() -> float:
    """Three 8x8 inverses: cublasSgetrfBatched, then cublasSgetrsBatched against the identity (n == k <= 16)."""
    a = well_conditioned(3, 8, 8)
    return rel(torch.linalg.inv(a.cuda()), torch.linalg.inv(a))


@check("det")
def _() -> float:
    """cusolverDnSgetrf, then the product of U's diagonal and the pivots' sign."""
    a = well_conditioned(7, 7)
    return rel(torch.linalg.det(a.cuda()), torch.linalg.det(a))


@check("cholesky")
def _() -> float:
    """One matrix: the 64-bit cusolverDnXpotrf."""
    a = positive_definite(16, 16)
    return rel(torch.linalg.cholesky(a.cuda()), torch.linalg.cholesky(a))


@check("cholesky_batched_upper")
def _() -> float:
    """Three matrices: cusolverDnSpotrfBatched."""
    a = positive_definite(3, 5, 5)
    return rel(torch.linalg.cholesky(a.cuda(), upper=True), torch.linalg.cholesky(a, upper=True))


@check("qr")
def _() -> float:
    """cusolverDnSgeqrf and cusolverDnSorgqr: Householder reflectors as LAPACK makes them, so Q and R equal the
    CPU's, signs included."""
    a = torch.randn(12, 8)
    q, r = torch.linalg.qr(a.cuda())
    q_cpu, r_cpu = torch.linalg.qr(a)
    return max(rel(q, q_cpu), rel(r, r_cpu))


@check("eigh")
def _() -> float:
    """cusolverDnXsyevd: eigenvalues, and the matrix rebuilt from the eigenvectors."""
    a = symmetric(10, 10)
    w, v = torch.linalg.eigh(a.cuda())
    w_cpu, _ = torch.linalg.eigh(a)
    rebuilt = (v.cpu() * w.cpu()) @ v.cpu().mT
    return max(rel(w, w_cpu), rel(rebuilt, a))


@check("eigh_batched")
def _() -> float:
    """Three 6x6 matrices (n <= 32): cusolverDnSsyevjBatched."""
    a = symmetric(3, 6, 6)
    w, v = torch.linalg.eigh(a.cuda())
    rebuilt = (v.cpu() * w.cpu().unsqueeze(-2)) @ v.cpu().mT
    return max(rel(w, torch.linalg.eigvalsh(a)), rel(rebuilt, a))


@check("svd")
def _() -> float:
    """cusolverDnSgesvdj (the default driver): singular values, and the matrix rebuilt from the vectors."""
    a = torch.randn(9, 6)
    u, s, vh = torch.linalg.svd(a.cuda(), full_matrices=False)
    rebuilt = (u.cpu() * s.cpu()) @ vh.cpu()
    return max(rel(s, torch.linalg.svdvals(a)), rel(rebuilt, a))


@check("svd_batched")
def _() -> float:
    """Three 5x4 matrices (m, n <= 32): cusolverDnSgesvdjBatched."""
    a = torch.randn(3, 5, 4)
    u, s, vh = torch.linalg.svd(a.cuda(), full_matrices=False)
    rebuilt = (u.cpu() * s.cpu().unsqueeze(-2)) @ vh.cpu()
    return max(rel(s, torch.linalg.svdvals(a)), rel(rebuilt, a))


@check("lstsq")
def _() -> float:
    """The gels driver: cusolverDnSgeqrf, cusolverDnSormqr (Q^T B), then a triangular solve (cuBLAS)."""
    a, b = torch.randn(20, 5), torch.randn(20, 2)
    return rel(torch.linalg.lstsq(a.cuda(), b.cuda()).solution, torch.linalg.lstsq(a, b).solution)


report()
