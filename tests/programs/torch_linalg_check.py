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


def symmetric(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    a = torch.randn(*shape, dtype=dtype)
    return (a + a.mH) / 2


def complex_well_conditioned(*shape: int) -> torch.Tensor:
    n = shape[-1]
    return torch.randn(*shape, dtype=torch.complex64) / n ** 0.5 + 2 * torch.eye(n)


def crel(device: torch.Tensor, cpu: torch.Tensor) -> float:
    """rel() of complex results: the largest complex difference relative to the result's largest magnitude."""
    difference = (device.cpu().to(torch.complex128) - cpu.to(torch.complex128)).abs().max().item()
    return difference / max(cpu.abs().max().item(), 1e-30)


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
    """cusolverDnSgetrf, then the product of U's diagonal and the pivots' sign (rows 0 and 1 swapped: the pivoting
    swaps them back, an odd permutation, so the sign is -1)."""
    a = well_conditioned(7, 7)[[1, 0, 2, 3, 4, 5, 6]]
    return rel(torch.linalg.det(a.cuda()), torch.linalg.det(a))


@check("det_batched")
def _() -> float:
    """Three 5x5 matrices: cublasSgetrfBatched, then one product per matrix (a reduction with three outputs); their
    rows as they are, two swapped (sign -1), three rotated (an even permutation, +1)."""
    a = well_conditioned(3, 5, 5)
    a[1], a[2] = a[1, [1, 0, 2, 3, 4]], a[2, [1, 2, 0, 3, 4]]
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


# ---- complex64: the C functions, ATen's complex kernels around them (conj, triu, fills, products)
@check("solve_complex")
def _() -> float:
    """cusolverDnCgetrf and cusolverDnCgetrs (n <= 64, batch <= 2)."""
    a, b = complex_well_conditioned(12, 12), torch.randn(12, 2, dtype=torch.complex64)
    return crel(torch.linalg.solve(a.cuda(), b.cuda()), torch.linalg.solve(a, b))


@check("solve_batched_complex")
def _() -> float:
    """cublasCgetrfBatched and cublasCgetrsBatched."""
    a, b = complex_well_conditioned(4, 6, 6), torch.randn(4, 6, 2, dtype=torch.complex64)
    return crel(torch.linalg.solve(a.cuda(), b.cuda()), torch.linalg.solve(a, b))


@check("det_complex")
def _() -> float:
    """cusolverDnCgetrf, the jitted product of complex<float>, times the pivots' sign (-1: rows swapped) cast to
    complex."""
    a = complex_well_conditioned(7, 7)[[0, 1, 3, 2, 4, 5, 6]]
    return crel(torch.linalg.det(a.cuda()), torch.linalg.det(a))


@check("qr_complex")
def _() -> float:
    """cusolverDnCgeqrf and cusolverDnCungqr, reflectors as LAPACK makes them: Q and R equal the CPU's."""
    a = torch.randn(12, 8, dtype=torch.complex64)
    q, r = torch.linalg.qr(a.cuda())
    q_cpu, r_cpu = torch.linalg.qr(a)
    return max(crel(q, q_cpu), crel(r, r_cpu))


@check("eigh_complex")
def _() -> float:
    """A Hermitian matrix: cusolverDnXsyevd of CUDA_C_32F (heevd); eigenvalues, and the matrix rebuilt."""
    a = symmetric(10, 10, dtype=torch.complex64)
    w, v = torch.linalg.eigh(a.cuda())
    rebuilt = (v.cpu() * w.cpu()) @ v.cpu().mH
    return max(rel(w, torch.linalg.eigvalsh(a)), crel(rebuilt, a))


@check("svd_complex")
def _() -> float:
    """cusolverDnCgesvdj: singular values, and the matrix rebuilt from the vectors."""
    a = torch.randn(9, 6, dtype=torch.complex64)
    u, s, vh = torch.linalg.svd(a.cuda(), full_matrices=False)
    rebuilt = (u.cpu() * s.cpu()) @ vh.cpu()
    return max(rel(s, torch.linalg.svdvals(a)), crel(rebuilt, a))


@check("lstsq_complex")
def _() -> float:
    """cusolverDnCgeqrf, cusolverDnCunmqr (Q^H B), then cublasCtrsm."""
    a, b = torch.randn(20, 5, dtype=torch.complex64), torch.randn(20, 2, dtype=torch.complex64)
    return crel(torch.linalg.lstsq(a.cuda(), b.cuda()).solution, torch.linalg.lstsq(a, b).solution)


report()
