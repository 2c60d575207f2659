"""Stock PyTorch's torch.fft on the device (cuFFT) against PyTorch on the CPU; run under xpu-run by
tests/test_fft.py, prints one JSON line: per check, the largest difference from the CPU's result relative to
the result's largest magnitude (or the error it raised).

Each check's transform is the one its name says: c2c (fft, ifft, fftn of complex input, the batched ones), r2c
(rfft; fft and fftn of real input, whose other half ATen fills by conjugate symmetry), c2c and c2r (irfft2), in
single and double precision.
"""

from __future__ import annotations

import torch
from torch_checks import check, rel, report

torch.manual_seed(0)


def complex_randn(*shape: int, dtype: torch.dtype = torch.complex64) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


x1 = complex_randn(64)
x3 = complex_randn(6, 8, 10)
real = torch.randn(8, 100)
half_spectrum = complex_randn(4, 16, 9)


@check("fft_c2c")
def _() -> float:
    return rel(torch.fft.fft(x1.cuda()), torch.fft.fft(x1))


@check("ifft_c2c_inverse")
def _() -> float:
    return rel(torch.fft.ifft(x1.cuda()), torch.fft.ifft(x1))


@check("rfft_r2c_batched")
def _() -> float:
    return rel(torch.fft.rfft(real.cuda()), torch.fft.rfft(real))


@check("irfft2_c2r")
def _() -> float:
    return rel(torch.fft.irfft2(half_spectrum.cuda()), torch.fft.irfft2(half_spectrum))


@check("fftn_3d")
def _() -> float:
    return rel(torch.fft.fftn(x3.cuda()), torch.fft.fftn(x3))


@check("fft_of_real_input_conjugate_fill")
def _() -> float:
    return rel(torch.fft.fft(real.cuda()), torch.fft.fft(real))


@check("fftn_of_real_input_3d_mirrored")
def _() -> float:
    x = torch.randn(2, 5, 6, 7)
    return rel(torch.fft.fftn(x.cuda(), dim=(-3, -2, -1)), torch.fft.fftn(x, dim=(-3, -2, -1)))


@check("fft_batched_middle_dim")
def _() -> float:
    """A transform along a middle dimension: the batch is strided around it (cuFFT's advanced layout)."""
    x = complex_randn(4, 16, 3)
    return rel(torch.fft.fft(x.cuda(), dim=1), torch.fft.fft(x, dim=1))


@check("fft_of_a_slice_advanced_layout")
def _() -> float:
    """A slice: each transform 16 of a row's 20 elements (inembed, idist 20)."""
    x = complex_randn(4, 20)
    return rel(torch.fft.fft(x.cuda()[:, :16]), torch.fft.fft(x[:, :16]))


@check("rfft_strided_advanced_layout")
def _() -> float:
    """Every other element (istride 2) of a real slice."""
    x = torch.randn(6, 20)
    return rel(torch.fft.rfft(x.cuda()[:, 2:18:2]), torch.fft.rfft(x[:, 2:18:2]))


@check("fft2_batched_norm_ortho")
def _() -> float:
    x = complex_randn(5, 12, 10)
    return rel(torch.fft.fft2(x.cuda(), norm="ortho"), torch.fft.fft2(x, norm="ortho"))


@check("fft_z2z_double")
def _() -> float:
    x = complex_randn(3, 40, dtype=torch.complex128)
    return rel(torch.fft.fft(x.cuda()), torch.fft.fft(x))


@check("rfft_d2z_double")
def _() -> float:
    x = torch.randn(6, 30, dtype=torch.float64)
    return rel(torch.fft.rfft(x.cuda()), torch.fft.rfft(x))


@check("irfft_z2d_double")
def _() -> float:
    x = complex_randn(6, 16, dtype=torch.complex128)
    return rel(torch.fft.irfft(x.cuda()), torch.fft.irfft(x))


@check("fft_again_from_the_plan_cache")
def _() -> float:
    """fft_c2c's shape three times more: PyTorch's cuFFT plan cache gives its plan again, only executed."""
    for _ in range(3):
        device = torch.fft.fft(x1.cuda())
    return rel(device, torch.fft.fft(x1))


report()
