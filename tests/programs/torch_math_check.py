"""Stock PyTorch's math on the device (cuBLAS, cuBLASLt, cuDNN) against PyTorch on the CPU; run
under xpu-run by tests/test_torch_math.py, prints one JSON line: per check, the largest
difference from the CPU's result (or the error it raised).

The CPU computes the references from the same inputs, rounded to the same dtype where the
device computes in fp16/bf16, so each difference is the device's rounding, not the test's.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch_checks import check, diff, rel, report

torch.manual_seed(0)
if os.environ.get("XPU_TEST_BACKEND") == "cuda":
    # a GPU's cuDNN computes fp32 convolutions in TF32 unless told not to (PyTorch's default): its
    # 10-bit mantissa puts these results about 1e-3 from the CPU's, past the 1e-4 fp32 checks allow
    # (matmuls are fp32 by default); the sim computes in fp32 either way
    torch.backends.cudnn.allow_tf32 = False


a, b = torch.randn(33, 17), torch.randn(17, 9)


@check("matmul_fp32")
def _() -> float:
    return diff(a.cuda() @ b.cuda(), a @ b)


for dtype in ("float16", "bfloat16"):
    @check(f"matmul_{dtype}")
    def _(dtype: str = dtype) -> float:
        ah, bh = a.to(getattr(torch, dtype)), b.to(getattr(torch, dtype))
        return rel(ah.cuda() @ bh.cuda(), ah.float() @ bh.float())


@check("matmul_transposed")
def _() -> float:
    at, bt = torch.randn(17, 33), torch.randn(9, 17)
    return diff(at.cuda().t() @ bt.cuda().t(), at.t() @ bt.t())


@check("matmul_non_contiguous")
def _() -> float:
    wide = torch.randn(33, 40)  # a column slice: leading dimension 40, not 17
    return diff(wide.cuda()[:, 5:22] @ b.cuda(), wide[:, 5:22] @ b)


@check("mv")
def _() -> float:
    m, v = torch.randn(7, 5), torch.randn(7)
    return diff(torch.mv(m.cuda().t(), v.cuda()), m.t() @ v)


@check("addmv")
def _() -> float:
    m, v, y = torch.randn(7, 5), torch.randn(5), torch.randn(7)
    return diff(torch.addmv(y.cuda(), m.cuda(), v.cuda(), beta=0.5, alpha=2), torch.addmv(y, m, v, beta=0.5, alpha=2))


@check("bmm")
def _() -> float:
    x, y = torch.randn(3, 8, 5), torch.randn(3, 5, 7)
    return diff(torch.bmm(x.cuda(), y.cuda()), torch.bmm(x, y))


@check("bmm_fp16")
def _() -> float:
    x, y = torch.randn(3, 8, 5).half(), torch.randn(3, 5, 7).half()
    return rel(torch.bmm(x.cuda(), y.cuda()), torch.bmm(x.float(), y.float()))


@check("addmm")
def _() -> float:
    bias, m1, m2 = torch.randn(9), torch.randn(16, 12), torch.randn(12, 9)
    return diff(torch.addmm(bias.cuda(), m1.cuda(), m2.cuda()), torch.addmm(bias, m1, m2))


for act in ("relu", "gelu"):
    @check(f"addmm_{act}")
    def _(act: str = act) -> float:
        bias, m1, m2 = torch.randn(9), torch.randn(16, 12), torch.randn(12, 9)
        got = torch._addmm_activation(bias.cuda(), m1.cuda(), m2.cuda(), use_gelu=act == "gelu")
        ref = torch.addmm(bias, m1, m2)
        return diff(got, F.gelu(ref, approximate="tanh") if act == "gelu" else F.relu(ref))


@check("linear_forward")
def _() -> float:
    layer, x = torch.nn.Linear(12, 7), torch.randn(5, 12)
    ref = layer(x)
    return diff(layer.cuda()(x.cuda()), ref)


x, w = torch.randn(2, 4, 9, 9), torch.randn(6, 2, 3, 3)
CONV = {"stride": 2, "padding": 1, "groups": 2}


@check("conv2d_forward")
def _() -> float:
    return diff(F.conv2d(x.cuda(), w.cuda(), **CONV), F.conv2d(x, w, **CONV))


@check("conv2d_dilated")
def _() -> float:
    w2 = torch.randn(5, 4, 3, 3)
    return diff(F.conv2d(x.cuda(), w2.cuda(), padding=2, dilation=2), F.conv2d(x, w2, padding=2, dilation=2))


@check("conv2d_channels_last")
def _() -> float:
    w2 = torch.randn(5, 4, 3, 3)
    xd, wd = (t.cuda().to(memory_format=torch.channels_last) for t in (x, w2))
    return diff(F.conv2d(xd, wd, padding=1), F.conv2d(x, w2, padding=1))


@check("conv2d_fp16")
def _() -> float:
    xh, wh = x.half(), torch.randn(5, 4, 3, 3).half()
    return rel(F.conv2d(xh.cuda(), wh.cuda(), padding=1), F.conv2d(xh.float(), wh.float(), padding=1))


def conv_grads() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    grad = torch.randn(2, 6, 5, 5)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    F.conv2d(xc, wc, **CONV).backward(grad)
    xd, wd = x.cuda().requires_grad_(), w.cuda().requires_grad_()
    F.conv2d(xd, wd, **CONV).backward(grad.cuda())
    return xd.grad, xc.grad, wd.grad, wc.grad


@check("conv2d_input_grad")
def _() -> float:
    xd, xc, _, _ = conv_grads()
    return diff(xd, xc)


@check("conv2d_weight_grad")
def _() -> float:
    _, _, wd, wc = conv_grads()
    return diff(wd, wc)


def batch_norm(device: str) -> list[torch.Tensor]:
    """Training-mode batch norm (cuDNN's legacy API), its gradients and running statistics, then
    the same in eval mode; F.batch_norm, so that no ATen kernel counts batches."""
    torch.manual_seed(1)
    x, weight, bias, grad = torch.randn(3, 4, 5, 5), torch.randn(4), torch.randn(4), torch.randn(3, 4, 5, 5)
    x, weight, bias = (t.to(device).requires_grad_() for t in (x, weight, bias))
    mean, var = torch.zeros(4, device=device), torch.ones(4, device=device)
    y = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.1, eps=1e-5)
    y.backward(grad.to(device))
    evaluated = F.batch_norm(x.detach(), mean, var, weight.detach(), bias.detach(), training=False)
    return [t.detach().cpu() for t in (y, x.grad, weight.grad, bias.grad, mean, var, evaluated)]


@check("batch_norm")
def _() -> float:
    return max(diff(d, c) for d, c in zip(batch_norm("cuda"), batch_norm("cpu")))


if __name__ == "__main__":
    report()
