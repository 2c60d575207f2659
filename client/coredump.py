"""GPU coredump settings, kept by the client: process-wide and per context, read back as set.

A coredump would be written by the server's driver, on the server's machine, where the application
cannot read it; so settings that would make one (ENABLE_ON_EXCEPTION, ENABLE_USER_TRIGGER) are refused
with NOT_SUPPORTED, said once, and the rest (file, pipe, contents) are kept for the questions.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from xpuremote.protocol import errors
from xpuremote.protocol.calls import Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError

from . import marshal
from .driver import Driver, implements

# CUcoredumpSettings in cuda.h's order (only the first has an explicit value, so the table knows only it)
(ENABLE_ON_EXCEPTION, TRIGGER_HOST, LIGHTWEIGHT, ENABLE_USER_TRIGGER, FILE, PIPE, FLAGS) = range(
    ENUMS["CU_COREDUMP_ENABLE_ON_EXCEPTION"], ENUMS["CU_COREDUMP_ENABLE_ON_EXCEPTION"] + 7)
BOOLS = (ENABLE_ON_EXCEPTION, TRIGGER_HOST, LIGHTWEIGHT, ENABLE_USER_TRIGGER)
STRINGS = (FILE, PIPE)
MAKE_DUMPS = (ENABLE_ON_EXCEPTION, ENABLE_USER_TRIGGER)
STRING_BYTES = 1024  # up to 1023 characters and the NUL


def size_of(attrib: int) -> int:
    if attrib in BOOLS:
        return 1
    if attrib in STRINGS:
        return STRING_BYTES
    if attrib == FLAGS:
        return 4
    raise CudaError(errors.INVALID_VALUE, f"coredump attribute {attrib}")


def defaults() -> dict[int, Any]:
    host, pid = socket.gethostname(), os.getpid()
    values: dict[int, Any] = {attrib: attrib == TRIGGER_HOST for attrib in BOOLS}
    values[FILE] = b""  # the driver (580.159) reads its file as empty until one is set, though it names dumps so
    values[PIPE] = f"corepipe.cuda.{host}.{pid}".encode()
    values[FLAGS] = 0
    return values


def settings(d: Driver, ctx: int | None) -> dict[int, Any]:
    """The process's settings, or a context's (which start as the process's when first set)."""
    every = d.state.setdefault("coredump", {})
    if None not in every:
        every[None] = defaults()
    if ctx is not None and ctx not in every:
        every[ctx] = dict(every[None])
    return every[ctx]


def scope(d: Driver, call: Call) -> int | None:
    return None if call.family.endswith("Global") else d.current_ctx()


@implements("cuCoredumpGetAttribute", "cuCoredumpGetAttributeGlobal")
def cu_coredump_get_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    attrib, value, size_address = args
    size = size_of(attrib)
    if not size_address:
        raise CudaError(errors.INVALID_VALUE, "size is NULL")
    if value:
        if marshal.get(call.params[2], size_address) < size:
            raise CudaError(errors.INVALID_VALUE, f"coredump attribute {attrib} needs {size} bytes")
        current = settings(d, scope(d, call))[attrib]
        data = current + b"\0" if attrib in STRINGS else int(current).to_bytes(size, "little")
        marshal.write(value, data)
    marshal.put(call.params[2], size_address, size)


@implements("cuCoredumpSetAttribute", "cuCoredumpSetAttributeGlobal")
def cu_coredump_set_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    attrib, value, size_address = args
    size = size_of(attrib)
    if not value or not size_address:
        raise CudaError(errors.INVALID_VALUE, "value or size is NULL")
    given = marshal.get(call.params[2], size_address)
    if attrib in STRINGS:
        text = marshal.read(value, min(max(given, 1), STRING_BYTES)).split(b"\0", 1)[0]
        settings(d, scope(d, call))[attrib] = text
        return
    if given < size:
        raise CudaError(errors.INVALID_VALUE, f"coredump attribute {attrib} takes {size} bytes")
    number = int.from_bytes(marshal.read(value, size), "little")
    if attrib in MAKE_DUMPS and number:
        d.say_once("coredump", "GPU coredumps are not supported by xpuremote: the server's driver would write "
                   "them on the server's machine")
        raise CudaError(errors.NOT_SUPPORTED, "GPU coredumps")
    settings(d, scope(d, call))[attrib] = bool(number) if attrib in BOOLS else number
