"""cuSOLVER (dense) in the client: its handles, their settings, and the workspace sizes it was asked before.

The factorizations take the generic path of the call table (queued on the handle's stream; their `info` is
device memory). What is written here:
- the handle (made after the version check, as cuBLAS's is) and its stream, which cusolverDnGetStream answers;
- the objects made for one call's settings: a cusolverDnParams_t (its algorithm per function), a syevjInfo_t or
  gesvdjInfo_t (tolerance, sweeps, sorting). PyTorch makes one anew for each factorization, so they are kept by
  what they hold, not by which one they are;
- the workspace-size queries (`*_bufferSize`), a round trip each, asked before every factorization PyTorch
  makes: the answer depends only on the arguments (the handle, sizes, types, modes, which pointers are NULL,
  the settings above), never on the data, so the first answer for the same arguments answers the rest;
- under the shim, a handle's typed factorizations and solves (mathlibs.HANDLE_LANE) are queued in C
  (interpose/kept.h) after the first of each went through here, until the handle is destroyed: an unknown handle,
  or a destroyed one, always comes here. The server checks them as it checks the first.
"""

from __future__ import annotations

from typing import Any

from xpuremote.protocol import errors, mathlibs
from xpuremote.protocol.calls import CALLS, Call

from . import marshal
from . import mathlibs as in_client
from .driver import Driver, implements
from .mathlibs import STATE, _creator, _getter, _property, _setter, _state, remember, version_of

SETTINGS = ("cusolverDnParams_t", "syevjInfo_t", "gesvdjInfo_t")  # made for a call's settings (see above)
SIZES: dict[tuple, tuple[bytes, ...]] = {}  # the arguments of a size query -> its answer, each output's bytes

implements("cusolverDnCreate")(_creator(mathlibs.CUSOLVER, stream=0))
implements("cusolverDnSetStream")(_setter("stream"))
implements("cusolverDnGetStream")(_getter(lambda handle: _state(handle)["stream"]))


@implements("cusolverDnCreateParams", "cusolverDnCreateSyevjInfo", "cusolverDnCreateGesvdjInfo")
def create_settings(d: Driver, call: Call, args: list[Any]) -> None:
    d.forward(call, args)
    STATE[int.from_bytes(marshal.read(args[0], 8), "little")] = {}


@implements("cusolverDnDestroy", "cusolverDnDestroyParams", "cusolverDnDestroySyevjInfo",
            "cusolverDnDestroyGesvdjInfo")
def destroy(d: Driver, call: Call, args: list[Any]) -> None:
    if call.family == "cusolverDnDestroy":  # its number may be given out again
        in_client.forget_in_c(call, args[0])
    d.forward(call, args)
    STATE.pop(args[0], None)


@implements(*(s for s in mathlibs.HANDLE_LANE if s.startswith("cusolverDn")))
def queued(d: Driver, call: Call, args: list[Any]) -> None:
    """A typed factorization or solve: queued; C queues this handle's next ones of the kind."""
    d.forward(call, args)
    in_client.let_in_c(call, args[0])


@implements("cusolverDnSetAdvOptions", "cusolverDnXsyevjSetTolerance", "cusolverDnXsyevjSetMaxSweeps",
            "cusolverDnXsyevjSetSortEig", "cusolverDnXgesvdjSetTolerance", "cusolverDnXgesvdjSetMaxSweeps",
            "cusolverDnXgesvdjSetSortEig")
def set_setting(d: Driver, call: Call, args: list[Any]) -> None:
    """A setting of a settings object, kept as what it holds (SetAdvOptions: an algorithm per function)."""
    key = (call.family, *args[1:-1])
    _state(args[0])[key] = args[-1]
    d.forward(call, args)


def size_key(call: Call, args: list[Any]) -> tuple:
    """What a size query's answer depends on: its arguments, a device pointer by whether it is NULL, a
    settings object by what it holds."""
    key: list[Any] = [call.symbol]
    for p, value in zip(call.params, args, strict=True):
        if p.direction != "in":
            continue
        if p.ctype in SETTINGS:
            key.append(tuple(sorted(STATE.get(value, {}).items())) if value else None)
        elif p.is_address:
            key.append(bool(value))
        else:
            key.append(value)
    return tuple(key)


def buffer_size(d: Driver, call: Call, args: list[Any]) -> None:
    outputs = [(i, p) for i, p in enumerate(call.params) if p.direction == "out"]
    if any(not args[i] for i, _ in outputs):
        raise errors.library_error("cusolver", "invalid_value", f"{call.symbol}: NULL output")
    key = size_key(call, args)
    answer = SIZES.get(key)
    if answer is None:
        d.forward(call, args)
        answer = remember(SIZES, key, tuple(marshal.read(args[i], p.pointee_size) for i, p in outputs))
    else:
        for (i, _), value in zip(outputs, answer, strict=True):
            marshal.write(args[i], value)


implements(*sorted({c.family for c in CALLS.values()
                    if c.library == "cusolver" and c.family.endswith("_bufferSize") and c.cls == "sync"}))(buffer_size)


@implements("cusolverGetVersion")
def get_version(d: Driver, call: Call, args: list[Any]) -> None:
    """CUSOLVER_VERSION's form (major * 1000 + minor * 100 + patch) of the version that runs the calls."""
    if not args[0]:
        raise errors.library_error("cusolver", "invalid_value", f"{call.symbol}: NULL output")
    major, minor, patch = version_of(d, mathlibs.CUSOLVER)
    marshal.put(call.params[0], args[0], major * 1000 + minor * 100 + patch)


implements("cusolverGetProperty")(_property)
