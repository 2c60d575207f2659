"""Host implementations of the tests' own kernels, for the sim device.

tests/programs/driver_api.cu defines saxpy and fill_index (and unregistered_kernel, which is
deliberately left out: launching it must fail with an error that names it).
"""

import time

import numpy as np

from xpuremote.server.backends.sim_kernels import Launch, register


@register("saxpy")
def saxpy(k: Launch) -> None:
    """y = a * x + y for the first n elements (extern "C" saxpy(float a, const float *x, float *y, int n))."""
    a, x, y, n = k.args("f", "Q", "Q", "i")
    count = max(0, min(n, k.threads))
    xs, ys = k.array(x, count, "<f4"), k.array(y, count, "<f4")
    k.store(y, (np.float32(a) * xs + ys).astype(np.float32))


@register("fill_index")
def fill_index(k: Launch) -> None:
    """out[i] = base + i for i < n (fill_index(unsigned *out, unsigned base, int n), C++ linkage)."""
    out, base, n = k.args("Q", "I", "i")
    count = max(0, min(n, k.threads))
    k.store(out, (np.uint32(base) + np.arange(count, dtype=np.uint32)).astype(np.uint32))


@register("sleep_ms")
def sleep_ms(k: Launch) -> None:
    """A kernel that takes its time (sleep_ms(unsigned ms)): a long call to end a session in the middle of."""
    (ms,) = k.args("I")
    time.sleep(ms / 1000)
