"""cuBLAS, cuBLASLt and cuDNN in the client: what their replacement libraries' entry points reach.

Most calls take the generic path of the call table (handles are client-made, GEMMs are queued).
What is written here: the library handles and the local answers (versions, a handle's stream and
modes), the state they are answered from, the one-time check that the server serves the library
version the application was built against, and the handler tables. Beside it, by job:
client/descriptors.py (descriptors kept here and made on the server once per setting, answers that
depend on settings, the scalars' sizes), client/variant_packs.py (cuDNN's backend API) and
client/kept_in_c.py (the same kept in the shim's C, interpose/kept.h).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xpuremote.protocol import errors, mathlibs
from xpuremote.protocol.calls import CALLS, LIBRARY_SYMBOLS, Call

from . import marshal
from .driver import SERVER_OBJECT, Driver, handler, implements

if TYPE_CHECKING:
    from .kept_in_c import KeptInC

log = logging.getLogger("xpuremote.client")

POINTER_MODE_HOST = 0  # cublasPointerMode_t and cublasLtPointerMode_t agree on it
LT_DESC = mathlibs.api(mathlibs.CUBLASLT).ENUMS
ATTR_POINTER_MODE = LT_DESC["CUBLASLT_MATMUL_DESC_POINTER_MODE"]
ATTR_SCALE_TYPE = LT_DESC["CUBLASLT_MATMUL_DESC_SCALE_TYPE"]
DNN = mathlibs.api(mathlibs.CUDNN).ENUMS
TYPE_DESCRIPTOR = DNN["CUDNN_TYPE_BACKEND_DESCRIPTOR"]
VARIANT_PACK, PACK_UIDS, PACK_WORKSPACE = (mathlibs.CUDNN_VARIANT_PACK, mathlibs.CUDNN_UNIQUE_IDS,
                                           mathlibs.CUDNN_WORKSPACE)

# client handle -> what the local answers need: {"stream", "pointer_mode", "math_mode", "pair", ...}
STATE: dict[int, dict[str, int]] = {}
MEMO_ENTRIES = 4096  # what each of this module's memos holds; a full one starts again


def remember(memo: dict[Any, Any], key: Any, value: Any) -> Any:
    """`value`, now in `memo` under `key` (emptied first when full: a workload asks a few problems over and over)."""
    if len(memo) >= MEMO_ENTRIES:
        memo.clear()
    memo[key] = value
    return value


_served: dict[str, tuple[int, int, int] | None] = {}  # library -> the server's copy's version, asked once


def served(d: Driver, lib: mathlibs.Library) -> tuple[int, int, int] | None:
    """major, minor, patch of the library the server runs these calls on (None: it has none)."""
    if lib.name not in _served:
        (version,) = d.call(CALLS["xpuLibraryVersion"], [lib.name, 1])
        _served[lib.name] = tuple(version) if version else None
    return _served[lib.name]


def declared(lib: mathlibs.Library) -> tuple[int, int, int]:
    """The version of the headers the replacement library's calls are declared from."""
    return tuple(mathlibs.api(lib).VERSION)


def version_of(d: Driver, lib: mathlibs.Library) -> tuple[int, int, int]:
    """What the application is told: the version that runs its calls, the server's. The headers'
    when the server has none or cannot be asked (its first handle then fails, saying why): the
    version calls return a number, not a status."""
    try:
        have = served(d, lib)
    except errors.CudaError:
        have = None
    return have or declared(lib)


def check_version(d: Driver, lib: mathlibs.Library) -> None:
    """Before a library's first handle: the server's copy must share the major version of the
    headers the calls are declared from (the ABI is stable within one). An older minor serves all
    but the calls it lacks, which answer NOT_SUPPORTED on their own."""
    have, ours = served(d, lib), declared(lib)
    if have is not None and have[0] == ours[0]:
        return
    message = (f"the server cannot serve {lib.name} {ours[0]}.x, the major version this program's calls are made "
               f"for (the server has {'.'.join(map(str, have)) if have else 'none'}); install {lib.name} {ours[0]} "
               "on the server")
    log.error("%s", message)
    raise errors.library_error(lib.name, "version_mismatch", message)


def _created(call: Call, args: list[Any]) -> int:
    """The handle a shadow call just wrote through its output parameter."""
    i = next(i for i, p in enumerate(call.params) if p.pointee == "handle" and p.direction == "out")
    return int.from_bytes(marshal.read(args[i], 8), "little")


def _creator(lib: mathlibs.Library, **defaults: int) -> Callable[[Driver, Call, list[Any]], None]:
    def create(d: Driver, call: Call, args: list[Any]) -> None:
        check_version(d, lib)
        d.forward(call, args)
        handle = _created(call, args)
        state = STATE[handle] = dict(defaults)
        if lib is mathlibs.CUBLAS:  # its stream and workspace: in C if it has room (see `blas_settings`)
            state["pair"] = (IN_C.hold_blas(handle) if IN_C is not None else None) or BlasPair()

    return create


implements("cublasCreate")(_creator(mathlibs.CUBLAS, pointer_mode=0, math_mode=0, atomics_mode=0, sm_count=0))
implements("cublasLtCreate")(_creator(mathlibs.CUBLASLT))
implements("cudnnCreate")(_creator(mathlibs.CUDNN, stream=0))
implements("cusparseCreate")(_creator(mathlibs.CUSPARSE, stream=0, pointer_mode=0))


@implements("cublasDestroy", "cublasLtDestroy", "cudnnDestroy", "cublasLtMatmulDescDestroy",
            "cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceDestroy", "cudnnDestroyTensorDescriptor",
            "cudnnBackendDestroyDescriptor", "cusparseDestroy")
def destroy(d: Driver, call: Call, args: list[Any]) -> None:
    state = STATE.get(args[0])
    if IN_C is not None and call.family in HANDLE_DESTROYS:
        IN_C.forget_settings(args[0])
    if call.family == "cusparseDestroy":  # calls C queued for it (client/cusparse.py)
        forget_in_c(call, args[0])
    in_c = IN_C is not None and IN_C.releases(call, args[0])
    if in_c and state is None:  # kept in C, destroyed while C does not answer (the lane closed)
        return
    state = state or {}
    if "kept" not in state and "replay" not in state:  # a variant pack never sent, a descriptor kept: only here
        d.forward(call, args)
    STATE.pop(args[0], None)


def _state(handle: int) -> dict[str, int]:
    found = STATE.get(handle)
    if found is None:
        raise errors.CudaError(errors.INVALID_HANDLE, f"{handle:#x} is not a live handle")
    return found


def _setter(key: str) -> Callable[[Driver, Call, list[Any]], None]:
    """A handle's setting kept here for the getters. One that the library only keeps is sent only when its
    value changes: PyTorch sets the stream and the math mode before each call, nearly always to the value
    they have. With the shim, C answers a call that sets the value held, or asks it (kept.h)."""
    def set_(d: Driver, call: Call, args: list[Any]) -> None:
        if _state(args[0])[key] != args[1]:
            d.forward(call, args)
            STATE[args[0]][key] = args[1]
            if key == "pointer_mode" and "pair" in STATE[args[0]]:  # C queues no GEMM in device pointer mode
                STATE[args[0]]["pair"].pointer_mode = args[1]
            if key == "pointer_mode" and call.library == "cusparse":  # nor SpMV (cusparse.py)
                forget_in_c(call, args[0])
        if IN_C is not None:
            IN_C.setting(call, args[0], args[1])

    return set_


# A cuBLAS handle's stream and workspace: PyTorch sets both before each GEMM, nearly always to what they are.
# cublasSetStream also puts back cuBLAS's own workspace, so the pair is what counts: kept (with the shim in C,
# which answers both setters and cublasGetStream: kept.h), and the server's handle brought to it before the
# next call that names the handle (`blas_settings`).
Pair = tuple[int, tuple[int, int] | None]  # a stream, and a workspace and its bytes (None: cuBLAS's own)


@dataclasses.dataclass
class BlasPair:
    """protocol/records.py's blas_pair (C's struct xpu_blas_pair), kept here where C holds none (no shim, or no
    room there)."""
    stream: int = 0
    workspace: int = 0
    bytes: int = 0
    own: int = 1  # the workspace is cuBLAS's own
    pointer_mode: int = 0
    sent_stream: int = 0  # what the server's handle has (a new one: stream 0, its own workspace)
    sent_workspace: int = 0
    sent_bytes: int = 0
    sent_own: int = 1


@implements("cublasSetStream")
def blas_set_stream(d: Driver, call: Call, args: list[Any]) -> None:
    state = _state(args[0])
    d.session()
    _hold_pair(state, args[1], None)


@implements("cublasSetWorkspace")
def blas_set_workspace(d: Driver, call: Call, args: list[Any]) -> None:
    state = _state(args[0])
    d.session()
    _hold_pair(state, _pair(state)[0], (args[1], args[2]))


def _pair(state: dict[str, Any]) -> Pair:
    """The stream and workspace the application set last on a cuBLAS handle (its state)."""
    pair = state["pair"]
    return pair.stream, None if pair.own else (pair.workspace, pair.bytes)


def _hold_pair(state: dict[str, Any], stream: int, workspace: tuple[int, int] | None) -> None:
    """A cuBLAS handle's pair set (where C does not answer: a trace, a capture, no shim)."""
    pair = state["pair"]
    pair.stream, pair.own = stream, int(workspace is None)
    if workspace is not None:
        pair.workspace, pair.bytes = workspace


def blas_settings(d: Driver, handle: int) -> int:
    """The server's cuBLAS handle given the stream and workspace the application set last, if they differ (what the
    server's handle has is in the pair too: C queues a GEMM's settings itself, kept.h's xpu_kept_blas_sync)."""
    state = STATE.get(handle)
    if state is None or "pair" not in state:
        return handle
    pair = state["pair"]
    want, sent = _pair(state), (pair.sent_stream, None if pair.sent_own else (pair.sent_workspace, pair.sent_bytes))
    if want != sent:
        if want[0] != sent[0] or want[1] is None:
            d.post(CALLS["cublasSetStream_v2"], [handle, want[0]])
        if want[1] is not None and (want[1] != sent[1] or want[0] != sent[0]):
            d.post(CALLS["cublasSetWorkspace_v2"], [handle, *want[1]])
        pair.sent_stream, pair.sent_own = want[0], int(want[1] is None)
        pair.sent_workspace, pair.sent_bytes = want[1] or (0, 0)
    return handle


SERVER_OBJECT["cublasHandle_t"] = blas_settings


def _getter(value: Callable[[int], int]) -> Callable[[Driver, Call, list[Any]], None]:
    def get(d: Driver, call: Call, args: list[Any]) -> None:
        if not args[1]:
            raise errors.CudaError(errors.INVALID_VALUE, f"{call.symbol}: NULL output")
        marshal.put(call.params[1], args[1], value(args[0]))

    return get


implements("cublasGetStream")(_getter(lambda handle: _pair(_state(handle))[0]))
HANDLE_DESTROYS = ("cublasDestroy", "cudnnDestroy")  # of the handles whose settings these are
# the settings C answers (kept.h): setter -> getter, as the libraries export them
SETTERS = {"cublasSetAtomicsMode": "cublasGetAtomicsMode", "cublasSetMathMode": "cublasGetMathMode",
           "cublasSetPointerMode_v2": "cublasGetPointerMode_v2", "cublasSetSmCountTarget": "cublasGetSmCountTarget",
           "cudnnSetStream": "cudnnGetStream"}
for _key, _set, _get in (("pointer_mode", "cublasSetPointerMode", "cublasGetPointerMode"),
                         ("math_mode", "cublasSetMathMode", "cublasGetMathMode"),
                         ("atomics_mode", "cublasSetAtomicsMode", "cublasGetAtomicsMode"),
                         ("sm_count", "cublasSetSmCountTarget", "cublasGetSmCountTarget"),
                         ("stream", "cudnnSetStream", "cudnnGetStream"),
                         ("stream", "cusparseSetStream", "cusparseGetStream"),
                         ("pointer_mode", "cusparseSetPointerMode", "cusparseGetPointerMode")):
    implements(_set)(_setter(_key))
    implements(_get)(_getter(lambda handle, key=_key: _state(handle)[key]))


@implements("cublasSdot", "cublasDdot", "cublasCdotu", "cublasCdotc", "cublasZdotu", "cublasZdotc", "cublasDotEx")
def dot(d: Driver, call: Call, args: list[Any]) -> None:
    """Forwarded with the result as a device address: in host pointer mode it would be the
    application's memory, which the server cannot write."""
    if _state(args[0])["pointer_mode"] == POINTER_MODE_HOST:
        raise errors.library_error("cublas", "not_supported", f"{call.symbol} into host memory (pointer mode "
                                   "CUBLAS_POINTER_MODE_HOST) is not forwarded; use CUBLAS_POINTER_MODE_DEVICE")
    d.forward(call, args)


@implements("cusparseXcsrgeam2Nnz", "cusparseXbsrsv2_zeroPivot", "cusparseXbsrsm2_zeroPivot")
def sparse_host_result(d: Driver, call: Call, args: list[Any]) -> None:
    """An `int *` result that cuSPARSE writes where the handle's pointer mode says: forwarded in host mode (the
    answer comes back); in device mode the server would be given an address of this process."""
    if _state(args[0])["pointer_mode"] != POINTER_MODE_HOST:
        raise errors.library_error("cusparse", "not_supported", f"{call.symbol} in CUSPARSE_POINTER_MODE_DEVICE is "
                                   "not forwarded; use CUSPARSE_POINTER_MODE_HOST")
    d.forward(call, args)


@implements("cudnnCTCLoss", "cudnnGetCTCLossWorkspaceSize")
def ctc_loss(d: Driver, call: Call, args: list[Any]) -> None:
    """The _v8 forms only: the older ones read labels and lengths from host arrays whose size
    only the probabilities' descriptor says."""
    if not call.symbol.endswith("_v8"):
        raise errors.library_error("cudnn", "not_supported", f"{call.symbol} is not forwarded; PyTorch uses "
                                   f"{call.symbol}_v8 when the lengths are on the device")
    d.forward(call, args)


IN_C: KeptInC | None = None  # the shim's table of descriptors (client/kept_in_c.py), set by interpose/entry.py


def let_in_c(call: Call, handle: int, multiple: int = 1) -> None:
    """Under the shim, C queues `call` naming `handle` from now on (KeptInC.let); nothing without it."""
    if IN_C is not None:
        IN_C.let(call, handle, multiple)


def forget_in_c(call: Call, handle: int) -> None:
    """Under the shim, every call of `handle`'s library naming it comes to the client again (KeptInC.forget)."""
    if IN_C is not None:
        IN_C.forget(call, handle)


# ---- versions: the server's copy's (the library that runs the calls) --------------------------------
def _number(version: tuple[int, int, int]) -> int:
    major, minor, patch = version
    return major * 10000 + minor * 100 + patch


def _version_of(lib: mathlibs.Library) -> Callable[[Driver, Call, list[Any]], int]:
    def version(d: Driver, call: Call, args: list[Any]) -> int:
        number = _number(version_of(d, lib))
        if IN_C is not None:  # the session's for good: C answers it from now on (PyTorch asks before each cuDNN op)
            IN_C.constant(call, number)
        return number

    return version


def _cudart_version(d: Driver, call: Call, args: list[Any]) -> int:
    return mathlibs.api(mathlibs.BY_NAME[call.library]).CUDART_VERSION


def _property(d: Driver, call: Call, args: list[Any]) -> None:
    kind, out = args  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
    if not 0 <= kind < 3 or not out:
        raise errors.CudaError(errors.INVALID_VALUE, f"{call.symbol}: property {kind}")
    marshal.put(call.params[1], out, version_of(d, mathlibs.BY_NAME[call.library])[kind])


@implements("cublasGetVersion")
def cublas_get_version(d: Driver, call: Call, args: list[Any]) -> None:
    marshal.put(call.params[1], args[1], _number(version_of(d, mathlibs.CUBLAS)))


implements("cublasLtGetVersion")(_version_of(mathlibs.CUBLASLT))
implements("cudnnGetVersion")(_version_of(mathlibs.CUDNN))
implements("cublasGetCudartVersion", "cublasLtGetCudartVersion", "cudnnGetCudartVersion")(_cudart_version)
implements("cublasGetProperty", "cublasLtGetProperty", "cudnnGetProperty", "cusparseGetProperty")(_property)


@implements("cusparseGetVersion")
def cusparse_get_version(d: Driver, call: Call, args: list[Any]) -> None:
    """CUSPARSE_VERSION's form: major * 1000 + minor * 100 + patch."""
    _state(args[0])
    major, minor, patch = version_of(d, mathlibs.CUSPARSE)
    marshal.put(call.params[1], args[1], major * 1000 + minor * 100 + patch)


@implements("cudnnGetLastErrorString")
def last_error_string(d: Driver, call: Call, args: list[Any]) -> None:
    message, capacity = args
    if message and capacity:
        marshal.write_string(message, "", capacity)  # failures are logged on stderr as they happen


def handlers() -> list[list[Callable[[Any], int]]]:
    """One handler list per library (protocol.mathlibs.LIBRARIES order), indexed by the op numbers
    of its replacement's entry points."""
    return [[handler(CALLS[s]) for s in LIBRARY_SYMBOLS[lib.name]] for lib in mathlibs.LIBRARIES]


from . import curand, cusolver, cusparse, cusparselt, descriptors, fft, nccl, variant_packs  # noqa: E402, F401  (their calls' handlers; they read this module's state)
