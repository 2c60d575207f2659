"""Host implementations of kernels, for the sim backend.

The sim device cannot run GPU code. A test or an example registers a Python function under a
kernel's name (mangled, or the plain function name) and the sim runs that instead:

    from xpuremote.server.backends.sim_kernels import register

    @register("vector_add")
    def vector_add(k):
        a, b, c, n = k.args("Q", "Q", "Q", "i")
        x, y = k.array(a, n, "<f4"), k.array(b, n, "<f4")
        k.store(c, (x + y).astype("<f4"))

`XPU_SIM_KERNELS=module_or_file.py[,...]` makes a server import such registrations.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xpuremote.protocol.fatbin import Kernel

KernelImpl = Callable[["Launch"], None]
_registry: dict[str, KernelImpl] = {}
_loaded: set[str] = set()


@dataclass
class Launch:
    kernel: Kernel
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    params: bytes
    memory: Any  # sim.Memory

    @property
    def threads(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2] * self.block[0] * self.block[1] * self.block[2]

    def args(self, *formats: str) -> tuple[Any, ...]:
        """Decode the kernel's parameters with struct formats, one per parameter, in order."""
        if len(formats) != len(self.kernel.params):
            raise ValueError(f"{self.kernel.name} has {len(self.kernel.params)} parameters, "
                             f"{len(formats)} formats given")
        return tuple(struct.unpack_from("<" + f, self.params, p.offset)[0] for f, p in zip(formats, self.kernel.params))

    def array(self, address: int, count: int, dtype: str) -> Any:
        import numpy as np

        itemsize = np.dtype(dtype).itemsize
        return np.frombuffer(self.memory.read(address, count * itemsize), dtype=dtype)

    def store(self, address: int, array: Any) -> None:
        self.memory.write(address, array.tobytes())


def register(*names: str) -> Callable[[KernelImpl], KernelImpl]:
    def decorate(fn: KernelImpl) -> KernelImpl:
        for name in names or (fn.__name__,):
            _registry[name] = fn
        return fn

    return decorate


def demangle(name: str) -> str:
    """The function name of an Itanium-mangled kernel name (`_Z10vector_addPKfS0_Pfi` -> vector_add)."""
    m = re.match(r"_Z(?:N\d+\w*?)?(\d+)", name)
    if not m:
        return name
    length = int(m.group(1))
    return name[m.end() : m.end() + length]


def find(name: str) -> KernelImpl | None:
    return _registry.get(name) or _registry.get(demangle(name))


def load_plugins(spec: str) -> None:
    """Import each comma-separated module name or .py file, once."""
    for item in filter(None, (s.strip() for s in spec.split(","))):
        if item in _loaded:
            continue
        if item.endswith(".py"):
            path = Path(item)
            module_spec = importlib.util.spec_from_file_location(f"xpuremote_sim_kernels_{path.stem}", path)
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"cannot load sim kernels from {item}")
            module_spec.loader.exec_module(importlib.util.module_from_spec(module_spec))
        else:
            importlib.import_module(item)
        _loaded.add(item)
