"""Host implementations of the few PyTorch kernels tests/programs/torch_check.py launches.

`torch.ones`, `torch.full` and `Tensor.fill_` on a contiguous tensor launch ATen's vectorised
elementwise kernel with a FillFunctor (`torch.zeros` is a memset and needs none). Its
parameters: the element count, the functor (holding the value), the output pointer.
"""

import numpy as np

from xpuremote.server.backends.sim_kernels import Launch, register

# (mangled scalar type, struct format of the value, numpy dtype); 16-byte vectors, at most 4 elements
FILL_TYPES = [("f", "f", "<f4"), ("d", "d", "<f8"), ("i", "i", "<i4"), ("l", "q", "<i8")]
FILL_KERNEL = "_ZN2at6native29vectorized_elementwise_kernelILi{}ENS0_11FillFunctorI{}EESt5arrayIPcLm1EELb0EEEviT0_T1_"


def fill(value_format: str, dtype: str):
    def run(k: Launch) -> None:
        count, value, out = k.args("i", value_format, "Q")
        k.store(out, np.full(count, value, dtype=dtype))

    return run


for mangled, value_format, dtype in FILL_TYPES:
    register(FILL_KERNEL.format(min(4, 16 // np.dtype(dtype).itemsize), mangled))(fill(value_format, dtype))
