"""The shim's table of descriptors and answers (interpose/kept.h), driven through the core's cffi module: which
library ops C answers or queues, and what the core tells C as it learns it."""

from __future__ import annotations

import functools
import struct
from typing import Any

from xpuremote.protocol import abi, mathlibs
from xpuremote.protocol.calls import CALLS, LIBRARY_SYMBOLS, Call

from . import memory
from .descriptors import LT_POINTERS, SIZES, _kind, _lt_attribute, _lt_made, set_tensor
from .driver import DRIVER, IMPLEMENTATIONS, _translations
from .mathlibs import ATTR_POINTER_MODE, ATTR_SCALE_TYPE, PACK_UIDS, PACK_WORKSPACE, SETTERS, VARIANT_PACK, remember

# ---- descriptors kept in C (interpose/kept.h) --------------------------------------------------------------
# With the shim, a tensor descriptor's create, its three setters and its destroy, cuBLASLt's descriptors'
# creates, attribute setters and destroys, and a variant pack's create, attributes, finalize and destroy are
# answered in C, and the descriptor is a record there: read when a call names it (as the state `keep_descriptor`,
# the setters and `backend_create` here make), taken over by this module for anything else. The roles, a
# record's kinds and its layout are protocol/records.py's (abi.KEPT_*, abi.KEPT_KIND_*, abi.KEPT_RECORD_*).
HANDLE_ROLES = (abi.KEPT_SETTING, abi.KEPT_GETTING, abi.KEPT_BLAS_STREAM, abi.KEPT_BLAS_WORKSPACE,
                abi.KEPT_BLAS_GET_STREAM)  # a library handle's calls
TENSOR, PACK = abi.KEPT_KIND_TENSOR, abi.KEPT_KIND_PACK
LT_KINDS = {"MatmulDesc": abi.KEPT_KIND_LT_MATMUL, "MatrixLayout": abi.KEPT_KIND_LT_LAYOUT,
            "MatmulPreference": abi.KEPT_KIND_LT_PREFERENCE}
IN_C_OPS = {  # symbol -> (role, kind: a record's kind; a getter's, the bytes it writes)
    "cudnnCreateTensorDescriptor": (abi.KEPT_CREATE, TENSOR), "cudnnSetTensorNdDescriptor": (abi.KEPT_SET_ND, TENSOR),
    "cudnnSetTensor4dDescriptor": (abi.KEPT_SET_4D, TENSOR),
    "cudnnSetTensor4dDescriptorEx": (abi.KEPT_SET_4D_EX, TENSOR),
    "cudnnDestroyTensorDescriptor": (abi.KEPT_DESTROY, TENSOR),
    **{f"cublasLt{name}{verb}": (role, kind) for name, kind in LT_KINDS.items()
       for verb, role in (("Create", abi.KEPT_LT_CREATE), ("SetAttribute", abi.KEPT_LT_SET),
                          ("Destroy", abi.KEPT_LT_DESTROY))},
    **{f"cudnnBackend{verb}": (role, PACK) for verb, role in (
        ("CreateDescriptor", abi.KEPT_PACK_CREATE), ("SetAttribute", abi.KEPT_PACK_SET),
        ("Finalize", abi.KEPT_PACK_FINALIZE), ("DestroyDescriptor", abi.KEPT_PACK_DESTROY))},
    **{symbol: (abi.KEPT_SETTING, 0) for symbol in SETTERS},
    **{symbol: (abi.KEPT_GETTING, CALLS[symbol].params[1].pointee_size) for symbol in SETTERS.values()},
    "cublasSetStream_v2": (abi.KEPT_BLAS_STREAM, 0), "cublasSetWorkspace_v2": (abi.KEPT_BLAS_WORKSPACE, 0),
    "cublasGetStream_v2": (abi.KEPT_BLAS_GET_STREAM, 0),
    "cublasLtMatmulAlgoGetHeuristic": (abi.KEPT_HEURISTIC, 0),
    "cudnnGetVersion": (abi.KEPT_CONSTANT, 0), "cublasLtGetVersion": (abi.KEPT_CONSTANT, 0),
    "cudnnBackendExecute": (abi.KEPT_PACK_EXECUTE, PACK),
    **{symbol: (abi.KEPT_SIZE, 0) for symbol in SIZES}}
QUEUED_AS = {"cudnnBackendExecute": "xpuCudnnExecute"}  # a call C queues in the lane as another
# a pack record's attributes in its order (abi.PACK_ATTRIBUTE_*): (name, element type)
PACK_ORDER = tuple((name, mathlibs.CUDNN_PACK_ATTRIBUTES[name]) for _, name in sorted({
    abi.PACK_ATTRIBUTE_UNIQUE_IDS: PACK_UIDS, abi.PACK_ATTRIBUTE_DATA_POINTERS: mathlibs.CUDNN_DATA_POINTERS,
    abi.PACK_ATTRIBUTE_WORKSPACE: PACK_WORKSPACE}.items()))
ANSWERING_ROLES = (abi.KEPT_HEURISTIC, abi.KEPT_CONSTANT, abi.KEPT_PACK_EXECUTE, abi.KEPT_SIZE)
IN_C_CALLS = {(role, kind): CALLS[symbol] for symbol, (role, kind) in IN_C_OPS.items()  # the descriptors' calls
              if role not in (*HANDLE_ROLES, *ANSWERING_ROLES)}


def _op(symbol: str) -> tuple[int, int]:
    """A library call's (library, op) numbers, as C names it."""
    library = CALLS[symbol].library
    return mathlibs.LIBRARIES.index(mathlibs.BY_NAME[library]), LIBRARY_SYMBOLS[library].index(symbol)


SETTING_OPS = {setter: (_op(setter), _op(getter)) for setter, getter in SETTERS.items()}


def library_lane() -> list[tuple[str, int]]:
    """The library calls C queues in the lane, with their role: those the table lets in a lane that the client
    forwards as they are (not the setters C answers otherwise, nor a call the client implements: asked once every
    module is loaded)."""
    roles = ((abi.KEPT_BLAS_CALL, "blas_lane"), (abi.KEPT_LT_CALL, "lt_lane"), (abi.KEPT_DNN_CALL, "dnn_lane"))
    return [(s, next(role for role, lane in roles if getattr(CALLS[s], lane) is not None))
            for s in (*LIBRARY_SYMBOLS["cublas"], *LIBRARY_SYMBOLS["cublasLt"], *LIBRARY_SYMBOLS["cudnn"])
            if CALLS[s].in_lane and s not in IN_C_OPS and CALLS[s].family not in IMPLEMENTATIONS]


def handle_lane() -> list[str]:
    """The calls of a client-made handle C queues in the lane once the client lets the handle take it
    (Call.handle_lane: cuFFT's transforms, cuRAND's generations, cuSOLVER's typed factorizations and solves,
    cuSPARSE's descriptor setters and index conversions)."""
    return [s for lib in ("cufft", "curand", "cusolver", "cusparse") for s in LIBRARY_SYMBOLS[lib]
            if CALLS[s].handle_lane is not None and not _translations(CALLS[s])]  # sent as they are, by the client


IN_C_DECODERS = {kind: call.from_slots for (role, kind), call in IN_C_CALLS.items()
                 if role == abi.KEPT_LT_CREATE}


class KeptInC:
    """The shim's table of descriptors, through the core's cffi module."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi, self.lib = ffi, lib
        self.copies: dict[int, tuple[int, dict[str, Any]]] = {}  # handle -> (generation, state): one per slot
        # a record's content (all but its generation) -> what it answers: PyTorch makes the same descriptors anew
        # for every operation, and reading a record's setting costs 5-10 µs (a GEMM names five)
        self.parsed: dict[bytes, dict[str, Any]] = {}
        self.packs: dict[bytes, dict[str, Any]] = {}  # a pack's bytes -> what its execution reads
        self.pack_at = ffi.offsetof("struct xpu_kept_record", "pack")

    def mark(self) -> None:
        for symbol, (role, kind) in IN_C_OPS.items():
            call = CALLS[symbol]
            made = len(call.params) - 1 if role == abi.KEPT_LT_CREATE else 0  # a cuBLASLt create's setting
            self.lib.xpu_kept_mark(*_op(symbol), role, kind, made, CALLS[QUEUED_AS.get(symbol, symbol)].opcode)
        names = [name for name, _ in PACK_ORDER]
        self.lib.xpu_kept_pack_names(self.ffi.new("int64_t[]", [VARIANT_PACK, *names, *(t for _, t in PACK_ORDER)]))
        self.lib.xpu_kept_lt_names(self.ffi.new("uint32_t[]", sorted(LT_POINTERS)), len(LT_POINTERS), ATTR_SCALE_TYPE,
                                   ATTR_POINTER_MODE)
        for symbol, role in library_lane():  # queued in the lane by C
            call = CALLS[symbol]
            self.lib.xpu_kept_mark(*_op(symbol), role, 0, 0, call.opcode)
            if role == abi.KEPT_BLAS_CALL:  # the handle's stream and workspace before it
                self.lib.xpu_kept_lane(*_op(symbol), len(call.params), *call.blas_lane, 0, -1, 0)
            elif role == abi.KEPT_LT_CALL:  # its descriptors named by the server's ones for their settings
                descriptors, scalars, scale_from, blob, blob_size = call.lt_lane
                self.lib.xpu_kept_lane(*_op(symbol), len(call.params), scalars, scale_from, 0, descriptors, blob,
                                       blob_size)
            else:  # a cuDNN call: its tensor descriptors so named, any other descriptor NULL
                descriptors, scalars, scale_from = call.dnn_lane
                self.lib.xpu_kept_lane(*_op(symbol), len(call.params), scalars, scale_from, 0, descriptors, -1, 0)
        for symbol in handle_lane():  # queued in the lane by C where the handle was let take it (`let`)
            call = CALLS[symbol]
            self.lib.xpu_kept_mark(*_op(symbol), abi.KEPT_HANDLE_CALL, 0, 0, call.opcode)
            self.lib.xpu_kept_lane(*_op(symbol), len(call.params), call.handle_scalars, call.handle_lane, 0, 0, -1, 0)
        for symbol in SIZES:  # the arguments of a size question: its descriptors' by their settings
            call = CALLS[symbol]
            descriptors = sum(1 << i for i, p in enumerate(call.params) if i and p.kind == "handle")
            self.lib.xpu_kept_lane(*_op(symbol), len(call.params), 0, -1, 0, descriptors, -1, 0)

    def serve(self, raw: bytes | None, server: int) -> None:
        """The server's descriptor `server` has the kept setting `raw` (a record, its generation 0), or (None) it
        is gone: C names it in the cuBLASLt calls it queues (kept.h's xpu_kept_lt_call)."""
        setting = self.ffi.from_buffer("struct xpu_kept_record *", raw) if raw is not None else self.ffi.NULL
        self.lib.xpu_kept_serve(setting, server)

    def constant(self, call: Call, value: int) -> None:
        self.lib.xpu_kept_constant(*_op(call.symbol), value)

    def learn_scalars(self, pointers: bytes, by_value: bytes) -> None:
        """The host addresses among these data pointers that hold by-value scalars: C reads their bytes itself at
        the next execution that names them."""
        addresses = [a for (a,), flag in zip(struct.iter_unpack("<Q", pointers), by_value) if flag]
        self.lib.xpu_kept_scalars_at(self.ffi.new("uint64_t[]", addresses), len(addresses))

    def watch_device(self, devices: memory.RangeMap) -> None:
        """C knows the session's device memory from now on (a pack's pointers all inside it are all device
        addresses), told again at each change."""
        if devices.on_change is None:
            devices.on_change = functools.partial(self.device_ranges, devices)
            self.device_ranges(devices)

    def device_ranges(self, devices: memory.RangeMap) -> None:
        ranges = [v for base in devices.bases for v in (base, base + max(devices.ranges[base].size, 1))]
        self.lib.xpu_kept_device_ranges(self.ffi.new("uint64_t[]", ranges or [0]), len(ranges) // 2)

    def learn_answer(self, call: Call, args: list[Any], answer: bytes, count: bytes = b"") -> None:
        """C answers the same question (the handle, the descriptors' settings, the other arguments) from now on:
        a heuristic's results and count, a size."""
        slots = self.ffi.new("uint64_t[]", [a & 0xFFFF_FFFF_FFFF_FFFF for a in args])
        self.lib.xpu_kept_learn(*_op(call.symbol), slots, answer, len(answer),
                                int.from_bytes(count, "little", signed=True))

    def state(self, handle: int) -> dict[str, Any] | None:
        """The descriptor's state if C keeps it, made once per setting: its key and the answers it gives; the
        calls that make it on the server (`replay`) only when they are needed (see `_replay`)."""
        copy = self.copies.get(handle)
        if copy is not None and copy[0] == self.lib.xpu_kept_read(handle, self.ffi.NULL, 0):
            return copy[1]  # unchanged since it was read: a call names a descriptor several times
        record = self.ffi.new("struct xpu_kept_record *")
        generation = self.lib.xpu_kept_read(handle, record, 0)
        if generation < 0 or record.kind == PACK:  # a pack where a descriptor is named: the server says so
            return None
        record.generation = 0  # what is left is the setting
        state = self._answers(handle, record)
        self.copies[handle] = (generation, state)
        return state

    def adopt(self, handle: int) -> dict[str, Any] | None:
        """The descriptor's state, taken over from C: its calls come here from now on."""
        record = self.ffi.new("struct xpu_kept_record *")
        self.copies.pop(handle, None)
        if self.lib.xpu_kept_read(handle, record, 1) < 0:
            return None
        return self._as_made(handle, record)

    def pack(self, handle: int, adopt: bool) -> dict[str, Any] | None:
        """A variant pack C keeps, as `backend_create` keeps one: taken over, or only read for its execution
        (then shared: PyTorch executes the same packs step after step)."""
        record = self.ffi.new("struct xpu_kept_record *")
        if self.lib.xpu_kept_read(handle, record, 0) < 0 or record.kind != PACK:
            return None
        if adopt and self.lib.xpu_kept_read(handle, record, 1) < 0:
            return None
        raw = self.ffi.buffer(record)[self.pack_at:]
        if adopt:
            return self._pack(raw)
        found = self.packs.get(raw)
        if found is None:
            found = remember(self.packs, raw, self._pack(raw))
        return found

    def _pack(self, raw: bytes) -> dict[str, Any]:
        """A pack record's `struct xpu_kept_pack` bytes as `backend_create` keeps a pack."""
        finalized, attributes, *counts = abi.KEPT_PACK.unpack_from(raw)[:2 + abi.KEPT_PACK_ATTRIBUTES]
        size, at = 8 * abi.KEPT_PACK_ELEMENTS, abi.KEPT_PACK_OFFSETS["value"]
        kept = {name: (element, counts[a], raw[at + a * size:at + a * size + 8 * counts[a]])
                for a, (name, element) in enumerate(PACK_ORDER) if attributes >> a & 1}
        return {"descriptor_type": VARIANT_PACK, "kept": kept, "finalized": bool(finalized)}

    def setting(self, call: Call, handle: int, value: int) -> None:
        """`handle`'s setter `call` holds `value` now: C answers a call that sets it again."""
        for op in SETTING_OPS.get(call.symbol, ()):
            self.lib.xpu_kept_setting(handle, *op, value & 0xFFFF_FFFF_FFFF_FFFF)

    def let(self, call: Call, handle: int, multiple: int = 1) -> None:
        """C queues `call` naming `handle` from now on, where its count argument is a multiple of `multiple` (the
        client's checks of it passed for such counts), until `forget`."""
        if call.handle_lane is not None:
            self.lib.xpu_kept_let(*_op(call.symbol), handle & 0xFFFF_FFFF_FFFF_FFFF, multiple)

    def forget(self, call: Call, handle: int) -> None:
        """Every call of `handle`'s library naming it goes through the client again (`call`: one of that library's)."""
        self.lib.xpu_kept_let(*_op(call.symbol), handle & 0xFFFF_FFFF_FFFF_FFFF, 0)

    def forget_settings(self, handle: int) -> None:
        self.lib.xpu_kept_setting(handle, 0, -1, 0)
        self.lib.xpu_kept_blas(handle, 0)

    def hold_blas(self, handle: int) -> Any:
        """Where C holds a new cuBLAS handle's stream and workspace (a struct xpu_blas_pair), answering its
        setters from now on until the handle is destroyed; None: no room there."""
        held = self.lib.xpu_kept_blas(handle, 1)
        return None if held == self.ffi.NULL else held

    def releases(self, call: Call, handle: int) -> bool:
        """A destroy of a descriptor C kept, or the core adopted: C frees its slot."""
        return call.symbol in IN_C_OPS and self.release(handle)

    def release(self, handle: int) -> bool:
        """A destroyed descriptor's slot freed: True if it was one of C's."""
        self.copies.pop(handle, None)
        return bool(self.lib.xpu_kept_release(handle))

    def replay(self, state: dict[str, Any]) -> dict[str, tuple[Call, list[Any], int]]:
        handle, raw = state["record"]
        return self._as_made(handle, self.ffi.from_buffer("struct xpu_kept_record *", raw))["replay"]

    def _answers(self, handle: int, record: Any) -> dict[str, Any]:
        """What a call naming the descriptor needs: the key of its setting and the answers that depend on it."""
        raw = bytes(self.ffi.buffer(record))  # its generation zeroed: the setting alone
        parsed = self.parsed.get(raw)
        if parsed is None:
            parsed = remember(self.parsed, raw, self._parse(record))
        return {**parsed, "replay": None, "record": (handle, raw)}

    def _parse(self, record: Any) -> dict[str, Any]:
        if record.kind == TENSOR:
            raw = bytes(self.ffi.buffer(record.ints))
            kind = _kind(IN_C_CALLS[(abi.KEPT_CREATE, TENSOR)])
            state = {"kind": kind, "key": (kind, record.setter, raw), "setting": (record.setter, raw)}
            if record.setter:  # the data type: the first int of an Nd or 4dEx setting, the second of a 4d one
                state["data_type"] = record.ints[1 if record.setter == abi.KEPT_SET_4D else 0]
        else:
            attributes = self._attributes(record)
            state = self._lt(record, attributes)
            state["key"] = (state["kind"], state["made"], tuple(attributes))
        return state

    def _as_made(self, handle: int, record: Any) -> dict[str, Any]:
        """The descriptor's whole state, as this module keeps one: with the calls that made it."""
        if record.kind == PACK:
            return self._pack(self.ffi.buffer(record)[self.pack_at:])
        create = IN_C_CALLS[(abi.KEPT_CREATE, TENSOR) if record.kind == TENSOR else (abi.KEPT_LT_CREATE, record.kind)]
        state = {"replay": {"": (create, [handle, *self._made(record)], 0)}, "kind": _kind(create)}
        if record.kind == TENSOR and record.setter:
            call, ints = IN_C_CALLS[(record.setter, 0)], record.ints
            if call.symbol == "cudnnSetTensorNdDescriptor":
                address = int(self.ffi.cast("uintptr_t", ints))
                args = [handle, ints[0], ints[1], address + 4 * 2, address + 4 * (2 + abi.KEPT_DIMS)]
            else:
                args = [handle, *ints[0:len(call.params) - 1]]
            set_tensor(DRIVER, state, call, args)
        elif record.kind:
            attributes = self._attributes(record)
            state.update(self._lt(record, attributes))
            call = IN_C_CALLS[(abi.KEPT_LT_SET, record.kind)]
            for name, value in attributes:
                state["replay"][name] = (call, [handle, name, value, len(value)], len(value))
        return state

    def _lt(self, record: Any, attributes: list[tuple[int, bytes]]) -> dict[str, Any]:
        """A cuBLASLt descriptor's setting (its record's `attributes` read once by the caller) as
        `lt_descriptor_create` and `lt_descriptor_set` keep it."""
        create, setter = IN_C_CALLS[(abi.KEPT_LT_CREATE, record.kind)], IN_C_CALLS[(abi.KEPT_LT_SET, record.kind)]
        state = {"kind": _kind(create)}
        _lt_made(state, create, self._made(record))
        for name, value in attributes:
            _lt_attribute(state, setter, name, value)
        return state

    @staticmethod
    def _made(record: Any) -> list[Any]:
        """A create's arguments after its output, as the application passed them."""
        if record.kind == TENSOR:
            return []
        create = IN_C_CALLS[(abi.KEPT_LT_CREATE, record.kind)]
        return IN_C_DECODERS[record.kind]([0, *record.made])[1:len(create.params)]

    def _attributes(self, record: Any) -> list[tuple[int, bytes]]:
        return [(a.name, bytes(self.ffi.buffer(a.value, a.size))) for a in record.attribute[0:record.attributes]]


