"""Stock PyTorch's torch.linalg on the device (cuSOLVER, and the cuBLAS batched solvers PyTorch routes small
batches to) against PyTorch on the CPU; run under xpu-run by tests/test_linalg.py, prints one JSON line: per
check, the largest difference from the CPU's result relative to the result's largest magnitude (or the error it
raised).

Each check runs in float32 (its plain name) and, as listed, in complex64 (`_complex`), float64 (`_double`) and
complex128 (`_complex_double`): the S, C, D and Z functions and ATen's kernels of each type around them. Inputs are
well conditioned (a random matrix plus a multiple of the identity), so each difference is rounding. Where a result is
unique only up to signs (eigenvectors, singular vectors) the check compares what is unique: the values, and the
matrix rebuilt from the factors. The sizes pick PyTorch's paths (its heuristics in
aten/src/ATen/native/cuda/linalg/BatchLinearAlgebra.cpp, default backend); each check names the library calls
PyTorch 2.15's wheel makes (besides workspace-size queries), {S,C,D,Z} standing for the type's letter.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch_checks import check, report

torch.manual_seed(0)
SUFFIXES = {torch.float32: "", torch.complex64: "_complex", torch.float64: "_double",
            torch.complex128: "_complex_double"}
ALL = tuple(SUFFIXES)


def well_conditioned(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    n = shape[-1]
    return torch.randn(*shape, dtype=dtype) / n ** 0.5 + 2 * torch.eye(n, dtype=dtype)


def positive_definite(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    a = torch.randn(*shape, dtype=dtype)
    return a @ a.mH / shape[-1] + torch.eye(shape[-1], dtype=dtype)


def symmetric(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    a = torch.randn(*shape, dtype=dtype)
    return (a + a.mH) / 2


def rel(device: torch.Tensor, cpu: torch.Tensor) -> float:
    """The largest (complex) difference relative to the result's largest magnitude, in double precision."""
    difference = (device.detach().cpu().to(torch.complex128) - cpu.to(torch.complex128)).abs().max().item()
    return difference / max(cpu.abs().max().item(), 1e-30)


def least_squares(a: torch.Tensor, b: torch.Tensor) -> float:
    """The solution, and the residuals (the squared norms of Q^H B's rows below n, which gels leaves there) against
    the CPU's gels driver (its default, gelsy, gives none)."""
    device, cpu = torch.linalg.lstsq(a.cuda(), b.cuda()), torch.linalg.lstsq(a, b, driver="gels")
    return max(rel(device.solution, cpu.solution), rel(device.residuals, cpu.residuals))

def checks(name: str, dtypes: tuple[torch.dtype, ...]) -> Callable[[Callable[[torch.dtype], float]], None]:
    """Run the check once per type, named with the type's suffix."""
    def run(fn: Callable[[torch.dtype], float]) -> None:
        for dtype in dtypes:
            check(name + SUFFIXES[dtype])(lambda dtype=dtype: fn(dtype))

    return run


@checks("solve", ALL)
def _(dtype: torch.dtype) -> float:
    """One 32x32 system, 3 right-hand sides: cusolverDn{S,C,D,Z}getrf, then cusolverDn{S,C,D,Z}getrs."""
    a, b = well_conditioned(32, 32, dtype=dtype), torch.randn(32, 3, dtype=dtype)
    return rel(torch.linalg.solve(a.cuda(), b.cuda()), torch.linalg.solve(a, b))


@checks("solve_batched", ALL)
def _(dtype: torch.dtype) -> float:
    """Four 6x6 systems: cublas{S,C,D,Z}getrfBatched and cublas{S,C,D,Z}getrsBatched."""
    a, b = well_conditioned(4, 6, 6, dtype=dtype), torch.randn(4, 6, 2, dtype=dtype)
    return rel(torch.linalg.solve(a.cuda(), b.cuda()), torch.linalg.solve(a, b))


@checks("inv_batched", (torch.float32, torch.float64))
def _(dtype: torch.dtype) -> float:
    """Three 8x8 inverses: cublas{S,D}getrfBatched, then cublas{S,D}getrsBatched against the identity."""
    a = well_conditioned(3, 8, 8, dtype=dtype)
    return rel(torch.linalg.inv(a.cuda()), torch.linalg.inv(a))


@checks("det", ALL)
def _(dtype: torch.dtype) -> float:
    """cusolverDn{S,C,D,Z}getrf, then the product of U's diagonal (a jitted reduction) and the pivots' sign (rows 0
    and 1 swapped: the pivoting swaps them back, an odd permutation, so the sign is -1), cast to the type."""
    a = well_conditioned(7, 7, dtype=dtype)[[1, 0, 2, 3, 4, 5, 6]]
    return rel(torch.linalg.det(a.cuda()), torch.linalg.det(a))


@checks("det_batched", (torch.float32, torch.float64))
def _(dtype: torch.dtype) -> float:
    """Three 5x5 matrices: cublas{S,D}getrfBatched, then one product per matrix (a reduction with three outputs); their
    rows as they are, two swapped (sign -1), three rotated (an even permutation, +1)."""
    a = well_conditioned(3, 5, 5, dtype=dtype)
    a[1], a[2] = a[1, [1, 0, 2, 3, 4]], a[2, [1, 2, 0, 3, 4]]
    return rel(torch.linalg.det(a.cuda()), torch.linalg.det(a))


@checks("cholesky", (torch.float32, torch.float64))
def _(dtype: torch.dtype) -> float:
    """One matrix: the 64-bit cusolverDnXpotrf (CUDA_R_32F, CUDA_R_64F)."""
    a = positive_definite(16, 16, dtype=dtype)
    return rel(torch.linalg.cholesky(a.cuda()), torch.linalg.cholesky(a))


@checks("cholesky_batched_upper", (torch.float32, torch.float64))
def _(dtype: torch.dtype) -> float:
    """Three matrices: cusolverDn{S,D}potrfBatched."""
    a = positive_definite(3, 5, 5, dtype=dtype)
    return rel(torch.linalg.cholesky(a.cuda(), upper=True), torch.linalg.cholesky(a, upper=True))


@checks("qr", ALL)
def _(dtype: torch.dtype) -> float:
    """The 64-bit cusolverDnXgeqrf, then cusolverDn{S,C,D,Z}{or,un}gqr: Householder reflectors as LAPACK makes
    them, so Q and R equal the CPU's, signs included."""
    a = torch.randn(12, 8, dtype=dtype)
    q, r = torch.linalg.qr(a.cuda())
    q_cpu, r_cpu = torch.linalg.qr(a)
    return max(rel(q, q_cpu), rel(r, r_cpu))


@checks("qr_batched", ALL)
def _(dtype: torch.dtype) -> float:
    """Four 8x8 matrices: cublas{S,C,D,Z}geqrfBatched (m <= 256 and a batch of at least max(2, m / 16)), then
    cusolverDn{S,C,D,Z}{or,un}gqr per matrix; Q and R equal the CPU's."""
    a = torch.randn(4, 8, 8, dtype=dtype)
    q, r = torch.linalg.qr(a.cuda())
    q_cpu, r_cpu = torch.linalg.qr(a)
    return max(rel(q, q_cpu), rel(r, r_cpu))


@checks("eigh", ALL)
def _(dtype: torch.dtype) -> float:
    """cusolverDnXsyevBatched of one matrix (a Hermitian one for the complex types): eigenvalues, and the matrix
    rebuilt from the eigenvectors."""
    a = symmetric(10, 10, dtype=dtype)
    w, v = torch.linalg.eigh(a.cuda())
    rebuilt = (v.cpu() * w.cpu()) @ v.cpu().mH
    return max(rel(w, torch.linalg.eigvalsh(a)), rel(rebuilt, a))


@checks("eigh_batched", (torch.float32, torch.float64))
def _(dtype: torch.dtype) -> float:
    """Three 6x6 matrices: cusolverDnXsyevBatched."""
    a = symmetric(3, 6, 6, dtype=dtype)
    w, v = torch.linalg.eigh(a.cuda())
    rebuilt = (v.cpu() * w.cpu().unsqueeze(-2)) @ v.cpu().mT
    return max(rel(w, torch.linalg.eigvalsh(a)), rel(rebuilt, a))


@checks("svd", ALL)
def _(dtype: torch.dtype) -> float:
    """One 9x6 matrix (m, n <= 32): cusolverDn{S,C,D,Z}gesvdjBatched with its gesvdjInfo_t settings; singular
    values, and the matrix rebuilt from the vectors."""
    a = torch.randn(9, 6, dtype=dtype)
    u, s, vh = torch.linalg.svd(a.cuda(), full_matrices=False)
    rebuilt = (u.cpu() * s.cpu()) @ vh.cpu()
    return max(rel(s, torch.linalg.svdvals(a)), rel(rebuilt, a))


@checks("svd_batched", (torch.float32, torch.float64))
def _(dtype: torch.dtype) -> float:
    """Three 5x4 matrices: cusolverDn{S,D}gesvdjBatched."""
    a = torch.randn(3, 5, 4, dtype=dtype)
    u, s, vh = torch.linalg.svd(a.cuda(), full_matrices=False)
    rebuilt = (u.cpu() * s.cpu().unsqueeze(-2)) @ vh.cpu()
    return max(rel(s, torch.linalg.svdvals(a)), rel(rebuilt, a))


@checks("lstsq", ALL)
def _(dtype: torch.dtype) -> float:
    """One 20x5 system (a batch of fewer than max(2, m / 16)): cusolverDnXgeqrf, cusolverDn{S,C,D,Z}{or,un}mqr
    (Q^H B), then cublas{S,C,D,Z}trsmBatched."""
    return least_squares(torch.randn(20, 5, dtype=dtype), torch.randn(20, 2, dtype=dtype))


@checks("lstsq_batched", ALL)
def _(dtype: torch.dtype) -> float:
    """Four 8x3 systems, 2 right-hand sides (m <= 256, a batch of at least max(2, m / 16), m >= n):
    cublas{S,C,D,Z}gelsBatched."""
    return least_squares(torch.randn(4, 8, 3, dtype=dtype), torch.randn(4, 8, 2, dtype=dtype))



report()
