"""cuSPARSE's calls that the shim queues in C after the first (mathlibs.HANDLE_LANE): a sparse or dense descriptor's
new pointers or batch stride, a legacy matrix descriptor's settings, the handle's index conversions (Xcoo2csr,
which PyTorch calls for each product of a COO matrix) and its products (SpMV, SpMM, SDDMM) in host pointer mode.
The client makes no check of these beyond the handle and the size of alpha and beta (which C repeats): they are
queued as the generic path queues them, and the server checks each record as it checks the call. Once the first of
a kind on a handle or descriptor went through here, C queues that object's next ones of the kind, until its
destroy: an unknown object, or a destroyed one, always comes here. The handle's destroy and pointer mode are
client/mathlibs.py's; they forget there too.
"""

from __future__ import annotations

from typing import Any

from xpuremote.protocol import mathlibs
from xpuremote.protocol.calls import Call

from . import mathlibs as in_client
from .driver import Driver, implements


@implements(*(s for s in mathlibs.HANDLE_LANE if s.startswith("cusparse")))
def queued(d: Driver, call: Call, args: list[Any]) -> None:
    """Queued; C queues the object's next ones of the kind. A product's alpha and beta are bytes in the record, which
    only host pointer mode makes them: a handle in device mode is not let (a change of mode forgets it)."""
    d.forward(call, args)
    if in_client.IN_C is not None and not (call.handle_scalars and in_client.STATE[args[0]]["pointer_mode"]):
        in_client.IN_C.let(call, args[0])


@implements("cusparseDestroySpMat", "cusparseDestroyDnMat", "cusparseDestroyDnVec", "cusparseDestroyMatDescr")
def destroy(d: Driver, call: Call, args: list[Any]) -> None:
    """The descriptor's calls come here again (its number may be given to a new one)."""
    in_client.forget_in_c(call, args[0])
    d.forward(call, args)
