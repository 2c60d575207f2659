"""The fast lane's records, run in C where the backend's calls are C functions (the cuda backend).

Why: on an H200 the worker spent 4.2 µs of CPU on each lane record in Python, where the driver's
own call takes about 1.2 (bench/results/gpu/2026-11-26-h200): decoding the record, checking its
numbers, resolving its handles, checking its device range, then calling through cffi. That bounds
the lane at about 240k calls a second, and every launch-bound PyTorch step with it. A math library's
call (a GEMM queued by the shim's C) cost 6.7-9.4 µs of the worker's CPU with the library's own work
left out.

How (native_lane.c): the session registers each op that may run in C (its driver function, each
argument's kind and bound, its one device range), and teaches the C side each handle and each range
only after a record that named them has passed the session's own checks in Python. Whenever a handle
or a range goes away, the C side forgets all it was taught. A record the C side cannot vouch for
goes back to the session, which runs it the usual way. So a record runs in C only where the
session's Python would have run the same driver call with the same values. A math library's call
(VETTED) runs in C only where Python ran a record of the same values (host scalars' bytes apart) since
the C side last forgot: its device ranges, sized by its numbers, are then the ones Python checked. Its float and
double arguments (a cuDNN batch norm's epsilon) go in floating registers (native_lane.c's xpu_vetted_fn says why
that matches the callee's prototype). A cuDNN execution (xpuCudnnExecute, EXECUTE) is vetted the same way, and
runs as cudnnBackendExecute of one real variant pack per vetted record, made by the C side the first time.

XPU_NATIVE_LANE=0 keeps every record in Python. The library is built once per source, with the
compiler Python was built with, into the shim's cache folder; where that fails, the lane stays in
Python and the worker says so once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cffi

from xpuremote.protocol import abi
from xpuremote.protocol.cbuild import built_once, cache_root, cc

log = logging.getLogger("xpuremote.server")

SOURCE = Path(__file__).with_name("native_lane.c")
ABI = Path(abi.__file__).with_name("abi.h")  # the lane record's layout and this module's enums
CDEF = """
struct xpu_native;
struct xpu_native *xpu_native_new(void);
void xpu_native_free(struct xpu_native *n);
int xpu_native_op(struct xpu_native *n, uint32_t opcode, void *fn, uint32_t convention, uint32_t count,
                  const uint8_t *kind, const uint8_t *family, const uint64_t *max, int32_t address, int32_t length,
                  uint64_t scale, int32_t blob, int32_t blob_size);
int xpu_native_cudnn(struct xpu_native *n, const uint64_t *values, uint32_t count);
void xpu_native_forget(struct xpu_native *n);
int xpu_native_handle(struct xpu_native *n, uint64_t key, uint32_t family, uint64_t value);
void xpu_native_range(struct xpu_native *n, uint64_t low, uint64_t high);
void xpu_native_vet(struct xpu_native *n, const uint8_t *data, uint64_t len);
void xpu_native_run(struct xpu_native *n, const uint8_t *data, uint64_t len, uint64_t *at, uint64_t ctx,
                    uint64_t *ran, uint32_t *failed_op, int32_t *status, uint32_t room, uint32_t *failures);
"""
_loaded: tuple[Any, Any] | None = None
_tried = False


@dataclass(frozen=True)
class NativeOp:
    """What the C side needs of a call: its driver function and how it takes the arguments, each argument's
    kind with its largest value (a blob's: bytes) or its handle family, the device range it touches (the
    address's argument, its length's, bytes per unit; -1: none), and which argument says the blob's size."""

    function: int
    convention: int
    kinds: tuple[int, ...]
    bounds: tuple[int, ...]
    families: tuple[int, ...]  # a handle's family number; 0 for the rest
    address: int = -1
    length: int = -1
    scale: int = 0
    blob: int = -1
    blob_size: int = -1
    extra: tuple[int, ...] = ()  # an EXECUTE op's cuDNN functions and constants (abi.NATIVE_CUDNN_*'s order)


def _library() -> tuple[Any, Any] | None:
    """(ffi, lib), built on first use; None where it cannot be (said once)."""
    global _loaded, _tried
    if not _tried:
        _tried = True
        try:
            ffi = cffi.FFI()
            ffi.cdef(CDEF)
            _loaded = ffi, ffi.dlopen(str(_build()))
        except (OSError, subprocess.CalledProcessError, cffi.FFIError) as exc:
            log.warning("the fast lane's records run in Python: native_lane.c did not build or load (%s)", exc)
    return _loaded


def _build() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + ABI.read_bytes() + repr(cc()).encode()).hexdigest()[:16]
    target = cache_root() / f"native-lane-{digest}.so"

    def make() -> None:
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            built = Path(tmp) / target.name
            subprocess.run([*cc(), "-shared", "-fPIC", "-O2", f"-I{ABI.parent}", str(SOURCE), "-o", str(built)],
                           check=True, capture_output=True)
            os.replace(built, target)
    return built_once(target, make)


class NativeLane:
    """One session's C side: its registered ops, and the handles and ranges it was taught."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib
        # what the C side calls when it frees its state (a variant pack's destroy): held until then
        self.kept: list[Any] = []
        self.state = ffi.gc(lib.xpu_native_new(), lambda state, kept=self.kept: lib.xpu_native_free(state))
        self.ops: dict[int, NativeOp | None] = {}  # opcode -> its op, or None: it runs in Python
        self.marks: tuple[int, int] = (-1, -1)  # the session's removals when the C side was last emptied
        self.defaults: list[tuple[int, int, int]] = []  # (handle, family, object) every session has
        self.at, self.ran = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        room = abi.NATIVE_FAILURES
        self.failed_op, self.status = ffi.new("uint32_t[]", room), ffi.new("int32_t[]", room)
        self.failures = ffi.new("uint32_t *")
        self.calls = 0  # records run here

    @classmethod
    def load(cls) -> NativeLane | None:
        if os.environ.get("XPU_NATIVE_LANE", "1") == "0":
            return None
        loaded = _library()
        return cls(*loaded) if loaded else None

    def register(self, opcode: int, op: NativeOp, keep: Any = None) -> None:
        """The C side runs `opcode`'s records from now on, where it takes the op's shape; `keep` (the library its
        functions are in) stays loaded while the C side may call them."""
        status = 0
        if op.extra:
            status = self.lib.xpu_native_cudnn(self.state, self.ffi.new("uint64_t[]", list(op.extra)), len(op.extra))
        status = status or self.lib.xpu_native_op(
            self.state, opcode, self.ffi.cast("void *", op.function), op.convention, len(op.kinds), bytes(op.kinds),
            bytes(op.families), self.ffi.new("uint64_t[]", list(op.bounds) or [0]), op.address, op.length, op.scale,
            op.blob, op.blob_size)
        self.ops[opcode] = op if status == 0 else None
        if status == 0 and keep is not None:
            self.kept.append(keep)

    def forget(self, marks: tuple[int, int], defaults: list[tuple[int, int, int]]) -> None:
        """Everything taught goes (a handle or a range went away); the handles every session has stay."""
        self.lib.xpu_native_forget(self.state)
        self.marks, self.defaults = marks, defaults
        for key, family, value in defaults:
            self.lib.xpu_native_handle(self.state, key, family, value)

    def teach_handle(self, key: int, family: int, value: int) -> None:
        if self.lib.xpu_native_handle(self.state, key, family, value):  # the table was full and emptied
            for default in self.defaults:
                self.lib.xpu_native_handle(self.state, *default)

    def teach_range(self, low: int, high: int) -> None:
        if low < high:
            self.lib.xpu_native_range(self.state, low, high)

    def vet(self, record: Any) -> None:
        """A record of a VETTED or EXECUTE op that Python ran: one of the same values may run in C from now on."""
        self.lib.xpu_native_vet(self.state, self.ffi.from_buffer("uint8_t[]", record), len(record))

    def run(self, data: Any, at: int, ctx: int) -> tuple[int, int, list[tuple[int, int]]]:
        """(where it stopped, records run, each failure's (opcode, status)): at the end, at a record for
        Python, or after abi.NATIVE_FAILURES failures."""
        self.at[0], self.ran[0] = at, 0
        buffer = self.ffi.from_buffer("uint8_t[]", data)
        self.lib.xpu_native_run(self.state, buffer, len(data), self.at, ctx, self.ran, self.failed_op, self.status,
                                abi.NATIVE_FAILURES, self.failures)
        self.calls += self.ran[0]
        return self.at[0], self.ran[0], [(self.failed_op[i], self.status[i]) for i in range(self.failures[0])]
