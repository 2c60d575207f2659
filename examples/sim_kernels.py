"""Host implementations of the example kernels, for the sim device (XPU_SIM_KERNELS=this file)."""

import numpy as np

from xpuremote.server.backends.sim_kernels import Launch, register


@register("vector_add")
def vector_add(k: Launch) -> None:
    a, b, c, n = k.args("Q", "Q", "Q", "i")
    count = min(n, k.threads)  # threads past n do nothing, as in the kernel
    x, y = k.array(a, count, "<f4"), k.array(b, count, "<f4")
    k.store(c, (x + y).astype(np.float32))
