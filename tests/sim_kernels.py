"""Host implementations of the tests' own kernels, for the sim device."""

import numpy as np  # noqa: F401

from xpuremote.server.backends.sim_kernels import Launch, register  # noqa: F401
