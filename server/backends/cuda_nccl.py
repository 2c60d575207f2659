"""NCCL on a GPU server: NVIDIA's libnccl.so.2, through the generic path but for communicator creation.

ncclCommInitRank waits for every peer of the communicator; a rank whose peers never come would keep its worker
in NCCL's bootstrap for good. So a communicator is made non-blocking (the application's config, or NCCL's
defaults, with `blocking` 0) and the worker polls ncclCommGetAsyncError until it is ready, failed, or
XPU_NCCL_TIMEOUT_S has passed, when it aborts it and says so. Each session has a worker process of its own, so
the wait holds no other session. The collectives then go to NVIDIA's library as they are: on the server's
stream, their data between the servers' GPUs over whatever NCCL picks there.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from xpuremote.protocol import errors, mathlibs
from xpuremote.protocol.calls import Call

from .sim_rendezvous import POLL_MAX_S, POLL_MIN_S, timeout_s

OWN = ("ncclCommInitRank", "ncclCommInitRankConfig")
ENUMS = mathlibs.api(mathlibs.NCCL).ENUMS
SUCCESS, IN_PROGRESS = ENUMS["ncclSuccess"], ENUMS["ncclInProgress"]
CONFIG_BYTES = mathlibs.api(mathlibs.NCCL).TYPES["ncclConfig_t *"][4]
CONFIG_HEAD = struct.Struct("<QIIi")  # size, magic, version, blocking
CONFIG_MAGIC = 0xCAFEBEEF  # NCCL_API_MAGIC
UNDEF_INT = -(2**31)  # NCCL_CONFIG_UNDEF_INT


def default_config() -> bytes:
    """NCCL_CONFIG_INITIALIZER of the header the table was generated from: every field undefined (NCCL's
    default), the strings NULL."""
    major, minor, patch = mathlibs.api(mathlibs.NCCL).VERSION
    fields = bytearray(struct.pack("<i", UNDEF_INT) * (CONFIG_BYTES // 4))
    fields[:CONFIG_HEAD.size] = CONFIG_HEAD.pack(CONFIG_BYTES, CONFIG_MAGIC, major * 10000 + minor * 100 + patch,
                                                 UNDEF_INT)
    for at in (32, 48):  # netName, commName
        fields[at:at + 8] = bytes(8)
    return bytes(fields)


def non_blocking(config: bytes | None) -> bytes:
    """The config NCCL gets: the application's (or the defaults), made non-blocking."""
    data = bytearray(config if config else default_config())
    size = struct.unpack_from("<Q", data)[0]
    if size < CONFIG_HEAD.size:
        raise errors.library_error("nccl", "invalid_value", f"ncclConfig_t of {size} bytes has no `blocking`")
    struct.pack_into("<i", data, 16, 0)
    return bytes(data)


def version(ffi: Any, lib: Any) -> list[int]:
    """major, minor, patch of the server's libnccl (ncclGetVersion's NCCL_VERSION code)."""
    code = ffi.new("int *")
    status = lib.ncclGetVersion(code)
    if status != SUCCESS:
        raise errors.library_error("nccl", "internal", f"ncclGetVersion failed ({status})")
    value = code[0]
    if value < 10000:  # NCCL_VERSION before 2.9: X*1000 + Y*100 + Z
        return [value // 1000, value % 1000 // 100, value % 100]
    return [value // 10000, value % 10000 // 100, value % 100]


def init_rank(backend: Any, call: Call, args: list[Any]) -> list[Any]:
    """ncclCommInitRank(Config) that gives up after XPU_NCCL_TIMEOUT_S (see the module's docstring)."""
    ffi, lib = backend.ffi, backend.library("nccl")
    nranks, comm_id, rank = args[1], bytes(args[2]), args[3]
    config = non_blocking(args[4] if call.family == "ncclCommInitRankConfig" else None)
    made = ffi.new("uint64_t *")
    unique = ffi.new("xpu_struct128 *", {"b": comm_id})[0]
    buffer = ffi.new("char[]", config)
    status = lib.ncclCommInitRankConfig(made, nranks, unique, rank, buffer)
    if status not in (SUCCESS, IN_PROGRESS):
        backend.check(status, "ncclCommInitRankConfig", "nccl")
    comm = ffi.cast("void *", made[0])
    wait(backend, lib, comm, f"rank {rank} of {nranks}")
    return [int(made[0])]


def wait(backend: Any, lib: Any, comm: Any, who: str) -> None:
    """Until the communicator is ready; a failure or the timeout aborts it, with an error that says why."""
    state = backend.ffi.new("int *", IN_PROGRESS)
    limit = timeout_s()
    began, nap = time.monotonic(), POLL_MIN_S
    while True:
        status = lib.ncclCommGetAsyncError(comm, state)
        if status != SUCCESS or state[0] != IN_PROGRESS:
            break
        if time.monotonic() - began > limit:
            lib.ncclCommAbort(comm)
            raise errors.library_error("nccl", "timeout", f"{who}: its peers did not all join within {limit:g} s "
                                       "(XPU_NCCL_TIMEOUT_S sets the wait; each server must reach the root "
                                       "rank's server: docs/distributed.md)")
        time.sleep(nap)
        nap = min(nap * 2, POLL_MAX_S * 5)
    failed = status if status != SUCCESS else state[0]
    if failed != SUCCESS:
        lib.ncclCommAbort(comm)
        backend.check(failed, f"ncclCommInitRankConfig ({who})", "nccl")
