"""NCCL in the client: what xpuremote's libnccl.so.2 reaches beside the generic path.

Communicators live on the server: ncclCommInitRank waits there for the communicator's peers and answers the
server's handle; collectives and point-to-point calls take the generic path, queued like kernels, so their data
never crosses the client's link. What is written here: the unique id and the config, which the application
passes by value or with host strings in them; the answers NCCL gives from what a communicator was made with
(its size, rank, device); and the version, the server's copy's.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import errors, mathlibs
from xpuremote.protocol.calls import CALLS, Call

from . import marshal
from .driver import Driver, implements
from .mathlibs import check_version, version_of

log = logging.getLogger("xpuremote.client")

NCCL = mathlibs.NCCL
UNIQUE_ID_BYTES = 128
# ncclConfig_t as this NCCL's header lays it out: size, magic, version, blocking, ..., netName at 32, commName at 48
CONFIG_BYTES = mathlibs.api(NCCL).TYPES["ncclConfig_t *"][4]
CONFIG_BLOCKING, CONFIG_STRINGS = 16, {"netName": 32, "commName": 48}
NO_COLOR = -1  # NCCL_SPLIT_NOCOLOR


@dataclass
class Comm:
    """What the client answers of a communicator: NCCL's CommCount, UserRank, CuDevice and GetAsyncError."""
    nranks: int
    rank: int
    device: int  # the application's ordinal, current at the communicator's creation
    error: int = 0


COMMS: dict[int, Comm] = {}


def _nccl_version(version: tuple[int, int, int]) -> int:
    """NCCL_VERSION(X, Y, Z) of nccl.h: X*10000 + Y*100 + Z since 2.9."""
    major, minor, patch = version
    return major * 1000 + minor * 100 + patch if major <= 2 and minor <= 8 else major * 10000 + minor * 100 + patch


def _started(d: Driver) -> None:
    """NVIDIA's NCCL starts the CUDA runtime, and so the driver, at its first call that needs a device: so does
    this one (a program's first CUDA call may be NCCL's), and one that finds no server is told why there is none."""
    if d.conn is None:
        try:
            d.connect()
        except errors.CudaError as exc:
            raise errors.library_error("nccl", "not_initialized", exc.detail) from None


@implements("ncclGetVersion")
def get_version(d: Driver, call: Call, args: list[Any]) -> None:
    if not args[0]:
        raise errors.library_error("nccl", "invalid_value", "ncclGetVersion: NULL version")
    _started(d)
    marshal.put(call.params[0], args[0], _nccl_version(version_of(d, NCCL)))


@implements("ncclGetUniqueId")
def get_unique_id(d: Driver, call: Call, args: list[Any]) -> None:
    """Made by the server (the root rank's): its bytes name the communicator there, and the application passes
    them to every rank as they are."""
    if not args[0]:
        raise errors.library_error("nccl", "invalid_value", "ncclGetUniqueId: NULL uniqueId")
    _started(d)
    check_version(d, NCCL)
    d.forward(call, args)


INIT_FAILURES = {
    "ncclTimeout": "ncclTimeout: not every rank joined within the server's XPU_NCCL_TIMEOUT_S (each rank must call "
                   "it with the same unique id and size, on servers that reach each other; the server's log names "
                   "the ranks missing)",
    "ncclRemoteError": "ncclRemoteError: a peer left, or its server process ended, before every rank had joined",
    "ncclInvalidArgument": "ncclInvalidArgument: the unique id, size or rank was refused (a rank that joined "
                           "twice, sizes that differ, an id not from ncclGetUniqueId; the server's log says which)",
}


@implements("ncclCommInitRank", "ncclCommInitRankConfig")
def init_rank(d: Driver, call: Call, args: list[Any]) -> None:
    """Waits on the server for the communicator's peers. The unique id goes as its bytes; a config as a copy the
    server may read: its host strings left out, and blocking, since this call waits for the communicator anyway."""
    out, nranks, rank = args[0], args[1], args[3]
    if not out:
        raise errors.library_error("nccl", "invalid_value", f"{call.symbol}: NULL comm")
    _started(d)
    check_version(d, NCCL)
    wire = list(args)
    wire[2] = marshal.read(args[2], UNIQUE_ID_BYTES)
    keep = None
    if call.family == "ncclCommInitRankConfig" and args[4]:
        keep = marshal.ffi.new("char[]", _config(args[4]))
        wire[4] = int(marshal.ffi.cast("uintptr_t", keep))
    device = d.context(0).device if d.contexts.current() else 0
    try:
        d.forward(call, wire)
    except errors.CudaError as exc:  # NCCL's own message is a status name: the reason is said here
        log.error("%s (rank %d of %d) failed: %s", call.symbol, rank, nranks, INIT_FAILURES.get(
            errors.status_name(exc.code, "nccl"), f"{exc} (the server's log says why)"))
        raise
    handle = int.from_bytes(marshal.read(out, 8), "little")
    COMMS[handle] = Comm(nranks, rank, device)
    log.info("NCCL communicator %#x: rank %d of %d on device %d", handle, rank, nranks, device)


def _config(address: int) -> bytes:
    """The application's ncclConfig_t as the server gets it: as many bytes as its `size` says (an application
    built against an older NCCL has a shorter one), the rest zero, no host pointers, blocking."""
    (size,) = struct.unpack("<Q", marshal.read(address, 8))
    if not 16 <= size <= 1 << 16:
        raise errors.library_error("nccl", "invalid_value", f"ncclConfig_t of {size} bytes: made without "
                                   "NCCL_CONFIG_INITIALIZER?")
    data = bytearray(marshal.read(address, min(size, CONFIG_BYTES)).ljust(CONFIG_BYTES, b"\0"))
    for name, at in CONFIG_STRINGS.items():
        if at + 8 <= size and any(data[at:at + 8]):
            log.info("ncclConfig_t.%s is not sent to the server (NCCL's environment there says it)", name)
            data[at:at + 8] = bytes(8)
    if size >= CONFIG_BLOCKING + 4:
        data[CONFIG_BLOCKING:CONFIG_BLOCKING + 4] = struct.pack("<i", 1)
    return bytes(data)


@implements("ncclCommSplit")
def split(d: Driver, call: Call, args: list[Any]) -> None:
    """Waits on the server for the parent's ranks; the new communicator's size and rank are asked there once.
    A rank that asked for no color gets NULL, as NCCL answers it."""
    parent, color, out = _comm(call, args[0]), args[1], args[3]
    if not out:
        raise errors.library_error("nccl", "invalid_value", "ncclCommSplit: NULL newcomm")
    wire, keep = list(args), None
    if args[4]:
        keep = marshal.ffi.new("char[]", _config(args[4]))
        wire[4] = int(marshal.ffi.cast("uintptr_t", keep))
    d.forward(call, wire)
    if color == NO_COLOR:
        marshal.put_u64(out, 0)
        return
    handle = int.from_bytes(marshal.read(out, 8), "little")
    count, rank = (_ask(d, name, handle) for name in ("ncclCommCount", "ncclCommUserRank"))
    COMMS[handle] = Comm(count, rank, parent.device)
    log.info("NCCL communicator %#x split from %#x: rank %d of %d", handle, args[0], rank, count)


def _ask(d: Driver, symbol: str, handle: int) -> int:
    """One of a communicator's numbers, asked of the server."""
    answer = marshal.ffi.new("int *")
    d.forward(CALLS[symbol], [handle, int(marshal.ffi.cast("uintptr_t", answer))])
    return int(answer[0])


@implements("ncclCommDestroy", "ncclCommAbort")
def destroy(d: Driver, call: Call, args: list[Any]) -> None:
    _comm(call, args[0])
    try:
        d.forward(call, args)
    finally:
        COMMS.pop(args[0], None)


def _comm(call: Call, handle: int) -> Comm:
    found = COMMS.get(handle)
    if found is None:
        raise errors.library_error("nccl", "invalid_value", f"{call.symbol}: {handle:#x} is not a live communicator")
    return found


def _answer(field: str) -> Any:
    def answer(d: Driver, call: Call, args: list[Any]) -> None:
        comm = _comm(call, args[0])
        if not args[1]:
            raise errors.library_error("nccl", "invalid_value", f"{call.symbol}: NULL output")
        marshal.put(call.params[1], args[1], getattr(comm, field))
    return answer


# A collective's failure surfaces at the application's next wait, as a kernel's does; GetAsyncError answers what
# the client knows without a round trip (PyTorch's watchdog asks it again and again).
implements("ncclCommCount")(_answer("nranks"))
implements("ncclCommUserRank")(_answer("rank"))
implements("ncclCommCuDevice")(_answer("device"))
implements("ncclCommGetAsyncError")(_answer("error"))
