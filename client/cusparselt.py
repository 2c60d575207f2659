"""cuSPARSELt in the client: its structs the caller allocates, and what is answered here.

cuSPARSELt's handle, matrix descriptors, matmul descriptor, algorithm selection and plan are structs of 512 bytes
that the caller allocates (often on its stack) and passes by address; they are no pointers a library hands out.
Each Init makes the object on the server under a client handle and writes that handle into the caller's struct
(then a mark: client/marshal.py's `struct_handle`); every other call reads it from the struct it is given, so the
server resolves it as any handle, and a copy of the struct names the same object. The struct's address is not
the identity: the caller may copy it, and a stack struct's address is reused by every call of its function.

A struct initialised again while it holds a live object of its kind (PyTorch's `_cslt_sparse_mm` makes a matmul
descriptor on its stack at every product, and cuSPARSELt has no destroy for one; `_cslt_compress` never destroys
its matrix descriptor) is sent with the handle it held: the server ends that object and makes the new one under
the same handle, as the struct's new contents replace the old in NVIDIA's library. So a program that re-uses its
storage holds one server object per struct, not one per Init. The price: two copies of one struct are one object,
and initialising either again changes both (NVIDIA's copies would part).

Answered here: the version (the server's copy's) and its property; refused here: a product whose matmul descriptor
scales by a vector (CUSPARSELT_MATMUL_ALPHA_VECTOR_SCALING), whose alpha is then a device vector, not the host float
the call's row sends. A server whose cuSPARSELt is of another major.minor than the headers (0.x: each minor is its own
ABI) is refused at cusparseLtInit, naming both.
"""

from __future__ import annotations

import logging
from typing import Any

from xpuremote.protocol import errors, mathlibs
from xpuremote.protocol.calls import Call

from . import marshal
from .driver import Driver, implements
from .mathlibs import _property, declared, served, version_of

log = logging.getLogger("xpuremote.client")
LIB = mathlibs.CUSPARSELT
ENUMS = {**mathlibs.api(LIB).ENUMS, **mathlibs.CUSPARSELT_IMPLICIT}
VECTOR_SCALING = (ENUMS["CUSPARSELT_MATMUL_ALPHA_VECTOR_SCALING"], ENUMS["CUSPARSELT_MATMUL_BETA_VECTOR_SCALING"])
STORAGE_KEPT = 4096  # structs whose handle is kept for their next Init; a full table starts again

LIVE: dict[int, str] = {}  # client handle -> its struct type
STORAGE: dict[tuple[int, str], int] = {}  # (a struct's address, its type) -> the handle its last Init made there
PLAN_MATMUL: dict[int, int] = {}  # plan -> the matmul descriptor it was made from
SCALED: set[int] = set()  # matmul descriptors that scale by a vector


def refuse(outcome: str, message: str) -> errors.CudaError:
    return errors.library_error(LIB.name, outcome, message)


def check_version(d: Driver) -> None:
    """The server's cuSPARSELt must be the headers' major.minor: before 1.0 each minor changes the ABI."""
    have, ours = served(d, LIB), declared(LIB)
    if have is not None and tuple(have[:2]) == tuple(ours[:2]):
        return
    said = ".".join(map(str, have)) if have else "none"
    message = (f"the server cannot serve cusparseLt {ours[0]}.{ours[1]}, the version this program's calls are made "
               f"for (the server has {said}); install cusparseLt {'.'.join(map(str, ours))} on the server")
    log.error("%s", message)
    raise refuse("version_mismatch", message)


def _made_index(call: Call) -> int:
    return next(i for i, p in enumerate(call.params) if p.direction == "out" and p.pointee == "handle")


def _kind(call: Call, i: int) -> str:
    return call.params[i].ctype.replace("const ", "").rstrip(" *")


@implements("cusparseLtInit", "cusparseLtDenseDescriptorInit", "cusparseLtStructuredDescriptorInit",
            "cusparseLtMatmulDescriptorInit", "cusparseLtMatmulAlgSelectionInit", "cusparseLtMatmulPlanInit")
def init(d: Driver, call: Call, args: list[Any]) -> None:
    """An object made in the caller's struct: under the handle the struct held, where it held a live one of its
    kind (the server replaces that object), or a new one."""
    if call.family == "cusparseLtInit":
        check_version(d)
    i = _made_index(call)
    if not args[i]:
        raise refuse("invalid_value", f"{call.symbol}: {call.params[i].name} is NULL")
    kind = _kind(call, i)
    held = STORAGE.get((args[i], kind))
    handle = held if held is not None and LIVE.get(held) == kind else d.new_handle()
    wire_args, size = marshal.pack(call, d.translate(call, args), lambda: handle, True)
    d.post(call, wire_args, size)
    if len(STORAGE) >= STORAGE_KEPT:
        STORAGE.clear()
    LIVE[handle], STORAGE[(args[i], kind)] = kind, handle
    SCALED.discard(handle)
    if call.family == "cusparseLtMatmulPlanInit":
        PLAN_MATMUL[handle] = marshal.struct_handle(call, call.params[2], args[2])


@implements("cusparseLtDestroy", "cusparseLtMatDescriptorDestroy", "cusparseLtMatmulAlgSelectionDestroy",
            "cusparseLtMatmulPlanDestroy")
def destroy(d: Driver, call: Call, args: list[Any]) -> None:
    handle = marshal.struct_handle(call, call.params[0], args[0])
    d.forward(call, args)
    LIVE.pop(handle, None)
    PLAN_MATMUL.pop(handle, None)


@implements("cusparseLtMatmulDescSetAttribute")
def set_matmul_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    """Forwarded; a vector scaling kept, which makes the product's alpha and beta device vectors."""
    d.forward(call, args)
    handle, attribute, data, size = marshal.struct_handle(call, call.params[1], args[1]), args[2], args[3], args[4]
    if attribute in VECTOR_SCALING and data and size >= 4 and int.from_bytes(marshal.read(data, 4), "little"):
        SCALED.add(handle)


@implements("cusparseLtMatmul", "cusparseLtMatmulSearch")
def matmul(d: Driver, call: Call, args: list[Any]) -> None:
    plan = marshal.struct_handle(call, call.params[1], args[1])
    if PLAN_MATMUL.get(plan) in SCALED:
        raise refuse("not_supported", f"{call.symbol} with CUSPARSELT_MATMUL_ALPHA/BETA_VECTOR_SCALING (alpha or "
                     "beta a device vector) is not forwarded")
    d.forward(call, args)


@implements("cusparseLtGetVersion")
def get_version(d: Driver, call: Call, args: list[Any]) -> None:
    """CUSPARSELT_VERSION's form: major * 1000 + minor * 100 + patch, of the server's copy."""
    marshal.struct_handle(call, call.params[0], args[0])
    if not args[1]:
        raise refuse("invalid_value", f"{call.symbol}: version is NULL")
    major, minor, patch = version_of(d, LIB)
    marshal.put(call.params[1], args[1], major * 1000 + minor * 100 + patch)


implements("cusparseLtGetProperty")(_property)
