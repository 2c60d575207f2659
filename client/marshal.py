"""Between C and the wire: decode the shim's argument slots, pack a call's arguments by its
table entry, and write a reply's outputs back into the application's memory."""

from __future__ import annotations

import itertools
import logging
import struct
from collections.abc import Callable
from typing import Any

import cffi

from xpuremote.protocol import errors, wire
from xpuremote.protocol.calls import Call, Param
from xpuremote.protocol.errors import CudaError

log = logging.getLogger("xpuremote.client")
ffi = cffi.FFI()
CHAR_P = ffi.typeof("char *")  # looked up once: by name, cffi parses the type on every cast


# ---- application memory --------------------------------------------------------------------
def _not_null(address: int) -> None:
    """The driver answers INVALID_VALUE where the application passes NULL for memory it needs;
    touching it here would crash the application instead."""
    if not address:
        raise CudaError(errors.INVALID_VALUE, "NULL pointer")


def read(address: int, size: int) -> bytes:
    if not size:
        return b""
    _not_null(address)
    return ffi.buffer(ffi.cast(CHAR_P, address), size)[:]


def view(address: int, size: int) -> Any:
    """The application's bytes without a copy: only for calls that finish before returning."""
    _not_null(address)
    return memoryview(ffi.buffer(ffi.cast(CHAR_P, address), size))  # wire.encode sends memoryviews


def write(address: int, data: Any) -> None:
    if data:
        _not_null(address)
        ffi.memmove(ffi.cast(CHAR_P, address), data, len(data))


def read_string(address: int) -> str:
    return ffi.string(ffi.cast(CHAR_P, address)).decode("utf-8", "replace")


def write_string(address: int, text: str, capacity: int) -> None:
    data = text.encode()[: max(capacity - 1, 0)] + b"\0"
    write(address, data)


def put(p: Param, address: int, value: Any) -> None:
    """Store one value through pointer parameter `p`, at the pointee's width."""
    if not address:
        return
    if p.pointee == "handle" and p.pointee_size > 8:  # a caller's struct (cuSPARSELt's) holds the handle
        write(address, int(value).to_bytes(8, "little") + STRUCT_HANDLE_MARK)
        return
    if p.pointee == "float":
        write(address, struct.pack("<f" if p.pointee_size == 4 else "<d", value))
    else:
        size = p.pointee_size if p.pointee in ("int", "struct") or p.pointee == "handle" and p.pointee_size else 8
        write(address, (int(value) % (1 << (8 * size))).to_bytes(size, "little"))


def put_u64(address: int, value: int) -> None:
    """Store a handle or pointer (always 64 bits)."""
    if not address:
        raise CudaError(errors.INVALID_VALUE, "NULL output pointer")
    write(address, value.to_bytes(8, "little"))


def get(p: Param, address: int) -> int:
    size = p.pointee_size if p.pointee in ("int",) else 8
    return int.from_bytes(read(address, size), "little", signed=p.signed and p.pointee == "int")


# ---- generic marshalling ---------------------------------------------------------------------
# What sizes a library scalar from a call's arguments by name: its bytes in host pointer mode, or None in
# device pointer mode (the address then travels). Set by client/descriptors.py, which knows each handle's
# pointer mode.
ScalarSizer = Callable[[Call, Param], Callable[[dict[str, Any]], "int | None"]]


def _no_scalars(call: Call, p: Param) -> Callable[[dict[str, Any]], int | None]:
    raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol}: {p.name} is a library scalar")


scalar_sizer: ScalarSizer = _no_scalars


Step = Callable[[Any, dict[str, Any], Callable[[], int], bool], tuple[Any, int]]
Packer = Callable[[list[Any], Callable[[], int], bool], tuple[list[Any], int]]
PACKERS: dict[str, Packer] = {}


def pack(call: Call, args: list[Any], new_handle: Callable[[], int], snapshot: bool) -> tuple[list[Any], int]:
    """Wire arguments for `call`; (args, bytes carried). Shadow outputs get a fresh client handle,
    written to the application at once. `snapshot` copies input buffers (async calls), otherwise
    they are sent straight from the application's memory."""
    packer = PACKERS.get(call.symbol)
    if packer is None:
        packer = PACKERS[call.symbol] = _packer(call)
    return packer(args, new_handle, snapshot)


def _packer(call: Call) -> Packer:
    """pack() for one call: what each pointer parameter needs found once (per call it cost a cuBLAS GEMM's
    client about 2 µs)."""
    steps = [(i, _step(call, p)) for i, p in enumerate(call.params) if p.kind == "ptr" and not p.is_address]
    if not steps:  # nothing to read or size: the arguments are the wire arguments
        return lambda args, new_handle, snapshot: (list(args), 0)
    sized = _sized_outputs(call)
    if sized is not None:
        return _output_packer(call, sized)
    names = call.names

    def packed(args: list[Any], new_handle: Callable[[], int], snapshot: bool) -> tuple[list[Any], int]:
        values, out, carried = dict(zip(names, args)), list(args), 0
        for i, step in steps:
            out[i], n = step(args[i], values, new_handle, snapshot)
            carried += n
        return out, carried
    return packed


Sized = tuple[int, int, tuple[int, ...], bool]


def _sized_outputs(call: Call) -> list[Sized] | None:
    """Where every pointer `call` passes is an output its arguments size (a copy to the host, a query): for
    each, (its position, the constant of its size, the positions of the arguments that multiply it, whether
    NULL is an error). None otherwise."""
    sized = []
    for i, p in enumerate(call.params):
        if p.kind != "ptr" or p.is_address:
            continue
        if p.direction != "out" or p.count in ("*", "str") or p.pointee == "handle" and call.cls == "shadow":
            return None
        factors = (p.pointee_size, ()) if p.count is None else p.factors
        if factors is None:
            return None
        where = tuple(call.names.index(name) for name in factors[1])
        sized.append((i, factors[0], where, call.library == "cuda" and not p.optional))
    return sized


def _output_packer(call: Call, sized: list[Sized]) -> Packer:
    """pack() for a call whose pointers are sized outputs: each goes as its size (None for NULL), found from the
    arguments by position (the generic steps' map of names cost a small copy to the host about 1 µs)."""
    def packed(args: list[Any], new_handle: Callable[[], int], snapshot: bool) -> tuple[list[Any], int]:
        out = list(args)
        for i, size, where, required in sized:
            for j in where:
                size *= int(args[j])
            if not args[i]:
                if required and size:
                    raise CudaError(errors.INVALID_VALUE, f"{call.symbol}: {call.params[i].name} is NULL")
                size = None
            out[i] = size
        return out, 0
    return packed


def _step(call: Call, p: Param) -> Step:
    """What one pointer parameter sends: its bytes, a string, a library scalar, a new handle, or the size
    of an output."""
    null = f"{call.symbol}: {p.name} is NULL"
    required = call.library == "cuda" and not p.optional and p.count != "*"  # NULL may be an error

    def checked(a: Any, values: dict[str, Any]) -> None:
        if not a and required and (p.is_string or p.byte_count(values) != 0):
            raise CudaError(errors.INVALID_VALUE, null)

    if p.direction in ("in", "inout"):  # an inout buffer goes up as it is, and comes back
        if p.by_reference:
            def referred(a: Any, values: dict[str, Any], new_handle: Any, snapshot: bool) -> tuple[Any, int]:
                return struct_handle(call, p, a), 0
            return referred
        if p.is_scalar:
            size = scalar_sizer(call, p)

            def scalar(a: Any, values: dict[str, Any], new_handle: Any, snapshot: bool) -> tuple[Any, int]:
                checked(a, values)
                n = size(values) if a else None
                return (None if not a else a if n is None else read(a, n)), n or 0
            return scalar
        if p.is_string:
            def string(a: Any, values: dict[str, Any], new_handle: Any, snapshot: bool) -> tuple[Any, int]:
                checked(a, values)
                return (read_string(a) if a else None), 0
            return string

        def given(a: Any, values: dict[str, Any], new_handle: Any, snapshot: bool) -> tuple[Any, int]:
            checked(a, values)
            if not a:
                return None, 0
            n = p.byte_count(values)
            return wire.frame(read(a, n) if snapshot or n <= wire.INLINE_MAX else view(a, n)), n
        return given
    if p.pointee == "handle" and call.cls == "shadow":
        def made(a: Any, values: dict[str, Any], new_handle: Callable[[], int], snapshot: bool) -> tuple[Any, int]:
            if not a:
                raise CudaError(errors.INVALID_VALUE, null)
            handle = new_handle() if p.pointee_size >= 8 else next(SMALL_HANDLES)
            put(p, a, handle)
            return handle, 0
        return made
    if p.count == "*":
        return lambda a, values, new_handle, snapshot: (1 if a else None, 0)

    def output(a: Any, values: dict[str, Any], new_handle: Any, snapshot: bool) -> tuple[Any, int]:
        checked(a, values)
        return (p.byte_count(values) if a else None), 0
    return output


# A handle in a caller's struct (cuSPARSELt's handle, descriptors and plans: 512 bytes the caller allocates) is the
# client's handle, then this mark: a struct no Init of this process wrote is refused, not sent as a handle.
STRUCT_HANDLE_MARK = b"xpuLt\x00\x01\x00"


def struct_handle(call: Call, p: Param, address: int) -> int:
    """The client handle the caller's struct at `address` holds (written there by the call that made it)."""
    if not address:
        raise errors.library_error(call.library, "invalid_value", f"{call.symbol}: {p.name} is NULL")
    data = bytes(read(address, 16))
    if data[8:] != STRUCT_HANDLE_MARK:
        raise errors.library_error(call.library, "invalid_value", f"{call.symbol}: {p.name} was not initialised "
                                   f"(no {p.ctype.replace('const ', '').rstrip(' *')} made by this process is there)")
    return int.from_bytes(data[:8], "little")


# An integer handle (cuFFT's cufftHandle, an int) is client-made too: small positive numbers, which no other handle of
# a session is (the client's start at driver.CLIENT_HANDLE_BASE, the server's at session.SERVER_HANDLE_BASE).
SMALL_HANDLES = itertools.count(1)


def unpack(call: Call, args: list[Any], outs: list[Any]) -> None:
    """Write the reply's outputs through the application's output pointers: outputs checked() has passed, none
    longer than the call asked for."""
    targets = OUTPUTS.get(call.symbol)
    if targets is None:  # no bound for an output the server sizes, nothing for a handle the client made (-1)
        targets = OUTPUTS[call.symbol] = [-1 if rule in (FREE, MADE) else i for i, rule, _ in _rules(call)]
    for i, data in zip(targets, outs):
        if i >= 0 and args[i] and isinstance(data, (bytes, memoryview)):
            write(args[i], data)


OUTPUTS: dict[str, list[int]] = {}  # a call's output parameters, by position


# ---- what an answer may hold -----------------------------------------------------------------------
# The client trusts no answer's shape: a compromised server, a man in the middle of a plain session or a server
# bug could otherwise write past the application's buffer. Each output parameter has a rule, and a size:
SCALAR = 0  # one value (a pointer, an int, a struct): exactly its size in bytes
COPY = 1  # a copy's bytes: exactly as many as the call's wire argument there asks for
UP_TO = 2  # an array the library fills up to the size asked for (dimensions, algorithms, an attribute's bytes):
# at most that, in whole elements of its size
FREE = 3  # sized by the server ("*"): only an implementation that bounds what it writes reads it
MADE = 4  # a handle the client made and wrote itself: the answer holds nothing
Rule = tuple[int, int, int]  # (the output's position, its rule, its size)
RULES: dict[str, list[Rule]] = {}  # a call's outputs, with their rules


def checked(call: Call, asked: list[Any], outs: Any) -> list[Any]:
    """`outs`, the outputs a server answered `call` with, where each is what the call's wire arguments `asked`
    for: bytes of the size asked (None where the application passed NULL: nothing is written there), or the
    data connection's value already received into the application's buffer. Otherwise nothing is written,
    the mismatch is logged and the call fails with CUDA_ERROR_UNKNOWN (a library's internal error): the
    application's arguments were right, the fault is below it (INVALID_VALUE would blame its code); the data
    connection answers a wrong size so too, and the code is not sticky, so the context goes on."""
    rules = RULES.get(call.symbol)
    if rules is None:
        rules = _rules(call)
    if type(outs) is not list or len(outs) != len(rules):
        raise refused(call, f"{shape(outs)} where {len(rules)} outputs were asked for")
    if rules:
        for (i, rule, size), data in zip(rules, outs):
            if type(data) is bytes or type(data) is memoryview:  # most outputs: a length compare
                if rule == SCALAR:
                    if len(data) == size:
                        continue
                elif rule == COPY and len(data) == asked[i]:
                    continue
            _check(call, i, rule, size, asked[i], data)
    return outs


def _check(call: Call, i: int, rule: int, size: int, want: Any, data: Any) -> None:
    """Whether one output that is not a scalar of the right size may be written; CudaError if not."""
    if want is None or rule == FREE:  # NULL (nothing is written there), or the server's to size
        return
    if rule == MADE:
        if data is not None:
            raise refused(call, f"{call.params[i].name} is {shape(data)}, where the client made the handle")
        return
    if data is want and type(want) is wire.Data:  # received into the application's buffer already
        return
    if rule != SCALAR:
        size = _size_of(want)
    if type(data) is bytes or type(data) is memoryview:
        n = len(data)
        if n == size or rule == UP_TO and n < size and n % _element(call, i) == 0:
            return
    raise refused(call, f"{call.params[i].name} is {shape(data)}, {size} bytes were asked for")


def refused(call: Call, what: str) -> CudaError:
    """The error of a call whose answer is refused, logged: it may be an attack, or a server's bug."""
    log.error("%s: the server's answer is refused, nothing of it written: %s", call.symbol, what)
    return CudaError(errors.UNKNOWN, f"{call.symbol}: the server's answer is refused: {what}")


def _rules(call: Call) -> list[Rule]:
    found = RULES.get(call.symbol)
    if found is None:
        found = RULES[call.symbol] = [_rule(call, i, p) for i, p in enumerate(call.params) if p.direction != "in"]
    return found


def _rule(call: Call, i: int, p: Param) -> Rule:
    if p.count == "*":
        return i, FREE, 0
    if p.pointee == "handle" and call.cls == "shadow":
        return i, MADE, 0
    if p.count is None:
        return i, SCALAR, p.pointee_size
    if not p.factors[1]:  # a constant count (a value of 8 bytes): one value
        return i, SCALAR, p.factors[0]
    return i, COPY if "Memcpy" in call.family else UP_TO, 0


def _element(call: Call, i: int) -> int:
    p = call.params[i]
    return 1 if p.pointee == "void" else max(p.pointee_size, 1)


def _size_of(want: Any) -> int:
    """The bytes an output's wire argument asks for: a size, a value on the data connection, an inout's bytes."""
    if type(want) is int:
        return want
    if type(want) is wire.Data:
        return want.size
    return len(want.data if type(want) is wire.Bulk else want)


def shape(value: Any) -> str:
    """A peer's value, said by its type and its size (or an integer's value), never its contents: they may be
    anything, and end up in a log."""
    if type(value) is int:
        return str(value)
    try:
        return f"{type(value).__name__} of {len(value)}"
    except TypeError:
        return type(value).__name__
