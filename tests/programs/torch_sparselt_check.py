"""Stock PyTorch's 2:4 semi-structured sparsity on the device (cuSPARSELt's compression and product) against the
same dense math on the CPU; run under xpu-run by tests/test_sparselt.py, prints one JSON line: per check, the
largest difference from the CPU's result relative to its largest value (or the error it raised).

The matrices are pruned to 2:4 on the CPU (the two largest magnitudes of every four along a row), sized as
PyTorch's cuSPARSELt path takes them without padding (multiples of 16 rows and columns for 16-bit types).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured
from torch_checks import check, rel, report

torch.manual_seed(0)
SparseSemiStructuredTensor._FORCE_CUTLASS = False  # cuSPARSELt, PyTorch's default: said, not assumed


def pruned(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """A random matrix with the two largest magnitudes of every four along each row kept."""
    dense = torch.randn(rows, cols)
    strips = dense.reshape(rows, cols // 4, 4)
    keep = strips.abs().argsort(dim=2, descending=True)[..., :2]
    mask = torch.zeros_like(strips, dtype=torch.bool).scatter_(2, keep, True)
    return (strips * mask).reshape(rows, cols).to(dtype)


@check("semi_structured_fp16_times_dense")
def _() -> float:
    a, b = pruned(64, 128, torch.float16), torch.randn(128, 32).half()
    sparse = to_sparse_semi_structured(a.cuda())
    assert type(sparse).__name__ == "SparseSemiStructuredTensorCUSPARSELT", type(sparse)
    return rel(sparse @ b.cuda(), a.float() @ b.float())


@check("semi_structured_bf16_times_dense")
def _() -> float:
    a, b = pruned(32, 64, torch.bfloat16), torch.randn(64, 48).bfloat16()
    return rel(to_sparse_semi_structured(a.cuda()) @ b.cuda(), a.float() @ b.float())


@check("semi_structured_fp16_linear")
def _() -> float:
    weight, bias, x = pruned(64, 64, torch.float16), torch.randn(64).half(), torch.randn(32, 64).half()
    out = F.linear(x.cuda(), to_sparse_semi_structured(weight.cuda()), bias.cuda())
    return rel(out, F.linear(x.float(), weight.float(), bias.float()))


@check("semi_structured_fp16_repeated")
def _() -> float:
    """The same sparse weight in 30 products: PyTorch makes a matmul descriptor (which cuSPARSELt cannot destroy),
    a selection and a plan on its stack for each."""
    a = pruned(32, 64, torch.float16)
    sparse, worst = to_sparse_semi_structured(a.cuda()), 0.0
    for _ in range(30):
        b = torch.randn(64, 16).half()
        worst = max(worst, rel(sparse @ b.cuda(), a.float() @ b.float()))
    return worst


report()
