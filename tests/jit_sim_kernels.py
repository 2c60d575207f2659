"""Host twins (numpy) of the kernels tests/test_nvrtc.py compiles at run time: its NVRTC program's `scale_add`, and
the PyTorch jiterator kernels it launches (a `_create_jit_fn` op and torch.special.chebyshev_polynomial_t).

A jiterator kernel `<name>_vectorized<vec>_kernel(int N, Array<char*, n> data, compute_t scalar_val, extra...)`
has its output first in `data`, then its inputs; `scalar_val` is the CPU scalar operand of a binary op given one
(PyTorch then compiles the kernel with one pointer less; the twins here take it as the right operand), and each
extra argument of `_create_jit_fn` is a double. Layouts checked by dumping the parameters of known launches.

The sim loads this file without entering it in sys.modules: no `from __future__ import annotations` here.
"""

import struct

import numpy as np

from xpuremote.server.backends.sim_kernels import Launch, register

F32 = "<f4"
VECS = (1, 2, 4, 8)


@register("scale_add")
def scale_add(k: Launch) -> None:
    """out[i] = a * x[i] + y[i] for i < n."""
    x, y, out, a, n = k.args("Q", "Q", "Q", "f", "i")
    k.store(out, (np.float32(a) * k.array(x, n, F32) + k.array(y, n, F32)).astype(F32))


def jiterator_operands(k: Launch) -> tuple[int, list[int], float, tuple[float, ...]]:
    """(element count, [output, inputs...] addresses, scalar_val, the extra arguments) of a jiterator launch."""
    count_param, data_param, scalar_param, *extra = k.kernel.params
    count = struct.unpack_from("<i", k.params, count_param.offset)[0]
    data = list(struct.unpack_from(f"<{data_param.size // 8}Q", k.params, data_param.offset))
    scalar = struct.unpack_from("<f", k.params, scalar_param.offset)[0]
    return count, data, scalar, tuple(struct.unpack_from("<d", k.params, p.offset)[0] for p in extra)


def my_op(k: Launch) -> None:
    """tests/test_nvrtc.py's jitted `-x + alpha * y`."""
    count, (out, x, y), _, (alpha,) = jiterator_operands(k)
    k.store(out, (-k.array(x, count, F32) + np.float32(alpha) * k.array(y, count, F32)).astype(F32))


def chebyshev_t(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """ATen's chebyshev_polynomial_t_forward: T_n(x), n truncated to an integer; 0 for n < 0."""
    n = np.trunc(n).astype(np.int64)
    previous, current = np.ones_like(x), x.copy()
    out = np.where(n == 0, previous, current)
    for degree in range(2, int(n.max(initial=0)) + 1):
        previous, current = current, 2 * x * current - previous
        out = np.where(n == degree, current, out)
    return np.where(n < 0, 0, out)


def chebyshev(k: Launch) -> None:
    count, data, scalar, _ = jiterator_operands(k)
    x = k.array(data[1], count, F32).astype(np.float64)
    n = k.array(data[2], count, F32).astype(np.float64) if len(data) == 3 else np.full(count, scalar)
    k.store(data[0], chebyshev_t(x, n).astype(F32))


for vec in VECS:
    register(f"my_op_vectorized{vec}_kernel")(my_op)
    register(f"chebyshev_polynomial_t_forward_vectorized{vec}_kernel")(chebyshev)
