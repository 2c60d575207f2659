"""cuFFT in the client: what its replacement library's entry points reach beside the generic path.

A plan (`cufftHandle`, an int) is client-made like the other libraries' handles (marshal's small handles): its
creation is queued, and the calls that make it (cufftMakePlan*, cufftXtMakePlanMany) wait for the server, which
says whether cuFFT takes the sizes and layout and how large a work area the plan needs. cufftPlan1d/2d/3d and
cufftPlanMany are sent as a cufftCreate and the cufftMakePlan* of the same arguments, so their failure is the
call's own, as it is with NVIDIA's library. Transforms and a plan's settings are queued. Under the shim, a plan's
transforms, stream and work area are queued in C (interpose/kept.h) after the first of each kind went through here,
until the plan is destroyed: an unknown plan, or a destroyed one, always comes here.
"""

from __future__ import annotations

from typing import Any

from xpuremote.protocol import errors, mathlibs
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.errors import CudaError

from . import marshal
from . import mathlibs as in_client
from .driver import Driver, implements
from .mathlibs import _property, check_version, version_of

# cufftPlan* -> the call that makes the plan cufftCreate made: the same arguments after the plan, and the work
# area's size
MADE_BY = {"cufftPlan1d": "cufftMakePlan1d", "cufftPlan2d": "cufftMakePlan2d", "cufftPlan3d": "cufftMakePlan3d",
           "cufftPlanMany": "cufftMakePlanMany"}


def _connected(d: Driver) -> None:
    """NVIDIA's cuFFT starts the runtime, and so the driver, at its first plan: so does this one."""
    if d.conn is None:
        try:
            d.connect()
        except CudaError as exc:
            raise CudaError(errors.NOT_INITIALIZED, exc.detail) from None


@implements("cufftCreate")
def create(d: Driver, call: Call, args: list[Any]) -> None:
    """A plan: first the check that the server's cuFFT is of the major version these calls are made for."""
    _connected(d)
    check_version(d, mathlibs.CUFFT)
    d.forward(call, args)


@implements(*MADE_BY)
def plan(d: Driver, call: Call, args: list[Any]) -> None:
    """cufftPlan*: a plan created and made, the making waited for; a plan that could not be made is destroyed."""
    create(d, CALLS["cufftCreate"], [args[0]])
    handle = int.from_bytes(marshal.read(args[0], 4), "little")
    size = marshal.ffi.new("size_t *")
    try:
        d.forward(CALLS[MADE_BY[call.family]], [handle, *args[1:], int(marshal.ffi.cast("uintptr_t", size))])
    except CudaError:
        d.forward(CALLS["cufftDestroy"], [handle])
        raise


@implements("cufftGetVersion")
def get_version(d: Driver, call: Call, args: list[Any]) -> None:
    """CUFFT_VERSION's form, of the server's copy (the library that runs the calls): major * 1000 + minor * 100 +
    patch."""
    if not args[0]:
        raise CudaError(errors.INVALID_VALUE, "cufftGetVersion: NULL output")
    major, minor, patch = version_of(d, mathlibs.CUFFT)
    marshal.put(call.params[0], args[0], major * 1000 + minor * 100 + patch)


implements("cufftGetProperty")(_property)


@implements(*(s for s in mathlibs.HANDLE_LANE if s.startswith("cufft")))
def queued(d: Driver, call: Call, args: list[Any]) -> None:
    """A transform, or the stream or work area PyTorch sets before each: queued; C queues this plan's next ones of
    the kind (the server checks them as it checks this)."""
    d.forward(call, args)
    in_client.let_in_c(call, args[0])


@implements("cufftDestroy")
def destroy(d: Driver, call: Call, args: list[Any]) -> None:
    """The plan's transforms come here again (its number may be given to a new plan)."""
    in_client.forget_in_c(call, args[0])
    d.forward(call, args)
