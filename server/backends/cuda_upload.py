"""A large input from the data connection to the GPU in pieces: the network's next piece arrives while the
copy engine takes the last one from page-locked memory.

Read whole into a buffer and then copied, a 64 MiB upload ran at 0.61x raw pyzmq on an H100: the fresh
buffer's page faults and the driver's own staging of pageable memory came on top of the network.
"""

from __future__ import annotations

import mmap
from typing import Any

from ..data import Incoming

PIECE = 4 << 20
PORTABLE = 0x1  # CU_MEMHOSTREGISTER_PORTABLE: page-locked for every context


class Upload:
    """Two page-locked pieces, registered with the driver. A context's destruction takes the registration
    with it: the next upload registers them again, and until it can, the driver stages them as pageable
    memory (slower, still right)."""

    def __init__(self, ffi: Any, lib: Any, check: Any) -> None:
        self.ffi, self.lib, self.check = ffi, lib, check
        self.memory = mmap.mmap(-1, 2 * PIECE)
        self.pieces = [memoryview(self.memory)[i * PIECE:(i + 1) * PIECE] for i in range(2)]
        self.base = ffi.from_buffer(self.memory)

    def __call__(self, dst: int, incoming: Incoming, stream: int) -> None:
        """cuMemcpyHtoD(Async) of `incoming` to `dst`, ordered on `stream` (0: the legacy stream), finished
        when it returns, as the driver finishes a copy from pageable memory."""
        lib, handle = self.lib, self.ffi.cast("void *", stream)
        self.register()
        size = len(incoming)
        try:
            for i, offset in enumerate(range(0, size, PIECE)):
                n = min(PIECE, size - offset)
                incoming.read_part(self.pieces[i % 2][:n])  # while the previous piece is copied
                self.check(lib.cuStreamSynchronize(handle), "cuStreamSynchronize")  # its buffer is free now
                source = self.ffi.cast("void *", self.base + (i % 2) * PIECE)
                self.check(lib.cuMemcpyHtoDAsync_v2(dst + offset, source, n, handle), "cuMemcpyHtoDAsync")
        finally:  # no piece is still being read when the next upload writes its buffer
            self.check(lib.cuStreamSynchronize(handle), "cuStreamSynchronize")

    def register(self) -> None:
        flags = self.ffi.new("unsigned int *")
        if self.lib.cuMemHostGetFlags(flags, self.base) != 0:  # not registered (yet, or any more)
            self.lib.cuMemHostRegister_v2(self.base, 2 * PIECE, PORTABLE)  # if refused: pageable, still right
