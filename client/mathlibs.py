"""cuBLAS, cuBLASLt and cuDNN in the client: what their replacement libraries' entry points reach.

Most calls take the generic path of the call table (handles are client-made, GEMMs are queued).
What is written here: the local answers (versions, a handle's stream and modes), the state they
are answered from, the one-time check that the server serves the library version the
application was built against, and the size of each alpha/beta (by pointer mode and data type).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import struct
import threading
from collections.abc import Callable
from typing import Any

from xpuremote.protocol import abi, errors, mathlibs, wire
from xpuremote.protocol.calls import CALLS, LIBRARY_SYMBOLS, Call, Param

from . import marshal, memory
from .driver import DRIVER, IMPLEMENTATIONS, SERVER_OBJECT, Driver, handler, implements

log = logging.getLogger("xpuremote.client")

POINTER_MODE_HOST = 0  # cublasPointerMode_t and cublasLtPointerMode_t agree on it
LT_DESC = mathlibs.api(mathlibs.CUBLASLT).ENUMS
ATTR_POINTER_MODE = LT_DESC["CUBLASLT_MATMUL_DESC_POINTER_MODE"]
ATTR_SCALE_TYPE = LT_DESC["CUBLASLT_MATMUL_DESC_SCALE_TYPE"]
DNN = mathlibs.api(mathlibs.CUDNN).ENUMS
TYPE_DESCRIPTOR = DNN["CUDNN_TYPE_BACKEND_DESCRIPTOR"]
VARIANT_PACK, PACK_UIDS, PACK_WORKSPACE = (mathlibs.CUDNN_VARIANT_PACK, mathlibs.CUDNN_UNIQUE_IDS,
                                           mathlibs.CUDNN_WORKSPACE)
DNN_ELEMENT_BYTES = {DNN[f"CUDNN_DATA_{t}"]: size for t, size in (
    ("FLOAT", 4), ("DOUBLE", 8), ("HALF", 2), ("BFLOAT16", 2), ("INT8", 1), ("INT32", 4), ("INT64", 8))}
# value of a cudaDataType_t or cublasComputeType_t -> bytes of one scalar of it
SCALAR_BYTES = {LT_DESC[name]: size for name, size in mathlibs.SCALAR_BYTES.items() if name in LT_DESC}

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


@implements("cublasDestroy", "cublasLtDestroy", "cudnnDestroy", "cublasLtMatmulDescDestroy",
            "cublasLtMatrixLayoutDestroy", "cublasLtMatmulPreferenceDestroy", "cudnnDestroyTensorDescriptor",
            "cudnnBackendDestroyDescriptor")
def destroy(d: Driver, call: Call, args: list[Any]) -> None:
    state = STATE.get(args[0])
    if IN_C is not None and call.family in HANDLE_DESTROYS:
        IN_C.forget_settings(args[0])
    in_c = IN_C is not None and call.symbol in IN_C_OPS and IN_C.release(args[0])
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
                         ("stream", "cudnnSetStream", "cudnnGetStream")):
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


@implements("cudnnCTCLoss", "cudnnGetCTCLossWorkspaceSize")
def ctc_loss(d: Driver, call: Call, args: list[Any]) -> None:
    """The _v8 forms only: the older ones read labels and lengths from host arrays whose size
    only the probabilities' descriptor says."""
    if not call.symbol.endswith("_v8"):
        raise errors.library_error("cudnn", "not_supported", f"{call.symbol} is not forwarded; PyTorch uses "
                                   f"{call.symbol}_v8 when the lengths are on the device")
    d.forward(call, args)


# ---- cuBLASLt's descriptors, and its heuristic answered once per problem ---------------------------
# PyTorch makes a GEMM's descriptors anew for each GEMM and asks cublasLtMatmulAlgoGetHeuristic every time:
# a round trip per GEMM. Its answer depends only on the handle, the descriptors' settings and the count
# asked (cuBLASLt keeps a cache of them itself), so a question asked before is answered from the first answer.
# A descriptor's setting: how it was made, and each attribute's last bytes.
HEURISTICS: dict[tuple, tuple[bytes, bytes]] = {}
LT_POINTERS = frozenset(v for k, v in LT_DESC.items()
                        if k.startswith("CUBLASLT_MATMUL_DESC_") and k.endswith("_POINTER"))


@implements("cublasLtMatmulDescCreate", "cublasLtMatrixLayoutCreate", "cublasLtMatmulPreferenceCreate")
def lt_descriptor_create(d: Driver, call: Call, args: list[Any]) -> None:
    _lt_made(keep_descriptor(d, call, args), call, args[1:])


def _lt_made(state: dict[str, Any], call: Call, made: list[Any]) -> None:
    """A cuBLASLt descriptor's create, in what the client answers from: its setting, a matmul descriptor's modes."""
    state.update(made=(call.family, *made), attributes={})
    if call.family == "cublasLtMatmulDescCreate":
        state.update(pointer_mode=POINTER_MODE_HOST, scale_type=made[1])


def _lt_attribute(state: dict[str, Any], call: Call, attr: int, value: bytes) -> None:
    """An attribute set, in what the client answers from: the setting, a matmul descriptor's modes."""
    key = {ATTR_POINTER_MODE: "pointer_mode", ATTR_SCALE_TYPE: "scale_type"}.get(attr)
    if key and call.family == "cublasLtMatmulDescSetAttribute" and len(value) >= 4:
        state[key] = struct.unpack("<i", value[:4])[0]
    state["attributes"][attr] = _as_setting(call, attr, value)


@implements("cublasLtMatmulDescSetAttribute", "cublasLtMatrixLayoutSetAttribute",
            "cublasLtMatmulPreferenceSetAttribute")
def lt_descriptor_set(d: Driver, call: Call, args: list[Any]) -> None:
    desc, attr, buf, size = args
    _adopt(desc)  # one C kept: this setting is one it does not hold
    state = _state(desc)
    value = marshal.read(buf, size) if buf and size > 0 else None
    set_kept(d, call, args, attr)
    if value is None:  # the server refuses it; a setting the client cannot name is not remembered
        state.pop("made", None)
    else:
        _lt_attribute(state, call, attr, value)


def _as_setting(call: Call, attr: int, value: bytes) -> Any:
    """What of an attribute a heuristic can depend on: of a device pointer (a bias, scales), whether it is set
    and its alignment, not its address (under autocast PyTorch casts the bias anew at every step)."""
    if call.family == "cublasLtMatmulDescSetAttribute" and attr in LT_POINTERS and len(value) == 8:
        address = int.from_bytes(value, "little")
        return "pointer", min(address & -address, 256)
    return value


def _setting(handle: int) -> tuple | None:
    state = _kept_state(handle)
    if state is None or "made" not in state:
        return None
    return state["made"], tuple(sorted(state["attributes"].items()))


@implements("cublasLtMatmulAlgoGetHeuristic")
def lt_heuristic(d: Driver, call: Call, args: list[Any]) -> None:
    handle, *descriptors, requested, results, count_out = args
    settings = [_setting(h) for h in descriptors]
    key = (handle, requested, *settings)
    if handle not in STATE or None in settings or requested <= 0 or not results or not count_out:
        key = None
    found = HEURISTICS.get(key) if key else None
    if found is not None:
        d.session()  # as any call: not in a forked child, not before cuInit
        marshal.write(results, found[0])
        marshal.write(count_out, found[1])
    else:
        d.forward(call, args)
        if not key:
            return
        found = remember(HEURISTICS, key, (marshal.read(results, requested * call.params[-2].pointee_size),
                                           marshal.read(count_out, 4)))
    if IN_C is not None:  # with the shim, C answers it from now on: no Python at either end
        IN_C.learn_answer(call, args, *found)


def scalar_sizer(call: Call, p: Param) -> Callable[[dict[str, Any]], int | None]:
    """What sizes alpha/beta from the call's arguments by name: their bytes in host pointer mode, None in device
    pointer mode (the address travels). What it depends on is found once per parameter."""
    kind = p.count.partition(":")[2]
    if call.library == "cudnn":  # host values: scaling factors double for double data, else float
        if call.params[call.names.index(kind)].kind == "handle":
            return lambda values: abi.DNN_SCALAR_BYTES.get((_kept_state(values[kind]) or {}).get("data_type"), 4)

        def element(values: dict[str, Any]) -> int:  # one element of a cudnnDataType_t
            if values[kind] not in DNN_ELEMENT_BYTES:
                raise errors.library_error("cudnn", "not_supported", f"{call.symbol}: {p.name} of data type "
                                           f"{values[kind]}")
            return DNN_ELEMENT_BYTES[values[kind]]
        return element
    owner_name = "handle" if call.library == "cublas" else "computeDesc"

    def scalar(values: dict[str, Any]) -> int | None:
        owner = _state(values[owner_name])
        if owner["pointer_mode"] != POINTER_MODE_HOST:
            return None
        if not kind:
            return p.pointee_size
        code = owner["scale_type"] if kind == "computeDesc" else values[kind]
        if code not in SCALAR_BYTES:
            raise errors.CudaError(errors.NOT_SUPPORTED, f"{call.symbol}: scalars of type {code}")
        return SCALAR_BYTES[code]
    return scalar


marshal.scalar_sizer = scalar_sizer


@implements("cudnnCreateTensorDescriptor")
def create_tensor_descriptor(d: Driver, call: Call, args: list[Any]) -> None:
    keep_descriptor(d, call, args)


@implements("cudnnSetTensorNdDescriptor", "cudnnSetTensor4dDescriptor", "cudnnSetTensor4dDescriptorEx")
def set_tensor_descriptor(d: Driver, call: Call, args: list[Any]) -> None:
    """Kept (see `keep_descriptor`); its data type kept for the size of the scalars of calls that use it, and
    its whole setting for the answers that depend on it alone (see `memo`)."""
    state = _adopt(args[0])
    if state is None or "replay" not in state:  # not a descriptor of this client's: the server says so
        return d.forward(call, args)
    set_tensor(d, state, call, args)


def set_tensor(d: Driver, state: dict[str, Any], call: Call, args: list[Any]) -> None:
    wire_args = keep_setter(d, state, call, args, "shape")
    state.update(data_type=args[call.names.index("dataType")], setting=(call.symbol, _hashable(wire_args[1:])))


MEMO: dict[tuple, int] = {}
SIZES = ("cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
         "cudnnGetBatchNormalizationTrainingExReserveSpaceSize", "cudnnGetBatchNormalizationBackwardExWorkspaceSize")


@implements(*SIZES)
def memo(d: Driver, call: Call, args: list[Any]) -> None:
    """A size that depends only on the arguments and the descriptors' settings, asked again at every
    training step for descriptors made anew: answered from the first answer for the same settings (with the
    shim, by C after this first time). A descriptor whose setting the client has not seen (or a reused handle) is
    asked of the server."""
    *ins, out = args
    key: list[Any] = [call.symbol]
    for p, a in zip(call.params[:-1], ins):
        if p.kind == "handle" and p.ctype != "cudnnHandle_t" and a:
            setting = (_kept_state(a) or {}).get("setting")
            if setting is None:
                return d.forward(call, args)
            a = setting
        key.append(a)
    found = MEMO.get(tuple(key))
    if found is None:
        d.forward(call, args)
        found = remember(MEMO, tuple(key), marshal.get(call.params[-1], out))
    else:
        marshal.put(call.params[-1], out, found)
    if IN_C is not None:
        IN_C.learn_answer(call, args, found.to_bytes(call.params[-1].pointee_size, "little"))


@implements("cudnnBackendCreateDescriptor")
def backend_create(d: Driver, call: Call, args: list[Any]) -> None:
    if args[0] == VARIANT_PACK and args[1]:  # kept here until it executes (see `backend_execute`)
        d.session()
        handle = d.new_handle()
        marshal.put_u64(args[1], handle)
        STATE[handle] = {"descriptor_type": VARIANT_PACK, "kept": {}, "finalized": False}
        return
    d.forward(call, args)
    STATE[_created(call, args)] = {"descriptor_type": args[0]}


@implements("cudnnBackendFinalize")
def backend_finalize(d: Driver, call: Call, args: list[Any]) -> None:
    """Waits for its answer (finalizing an engine's plan may fail, and callers rely on hearing it),
    except a variant pack's, made and finalized before every execution: kept here, or queued (a failure
    surfaces at the next call that waits, as an execution's would)."""
    _kept(args[0])  # one C keeps is taken over
    pack = STATE.get(args[0], {})
    if "kept" in pack and not pack["finalized"]:
        pack["finalized"] = True
    elif pack.get("descriptor_type") == VARIANT_PACK:
        _send_pack(d, args[0])
        d.post(call, list(args))
    else:
        d.forward(call, args)


# ---- descriptors kept here, made on the server once per setting ---------------------------------------
# PyTorch makes a descriptor for each use and destroys it after: a cuDNN tensor descriptor for each tensor of a
# batch norm, cuBLASLt's matmul descriptor, three layouts and a preference for each GEMM: up to fourteen calls
# for one that computes. Such a descriptor holds only its setting. So the client makes, sets and destroys them
# here, and a call that names one names the server's descriptor made for the same setting, made once (and
# replayed there as the application made its own). The last SERVER_DESCRIPTORS settings used are kept.
DESCRIPTORS = {"cudnnTensorDescriptor_t": "cudnnDestroyTensorDescriptor",  # kind -> its destroy
               "cublasLtMatmulDesc_t": "cublasLtMatmulDescDestroy",
               "cublasLtMatrixLayout_t": "cublasLtMatrixLayoutDestroy",
               "cublasLtMatmulPreference_t": "cublasLtMatmulPreferenceDestroy"}
SERVER_DESCRIPTORS = 4096
MADE: dict[tuple, tuple[int, str]] = {}  # a setting -> (the server's descriptor made for it, its kind); LRU order
_made_lock = threading.Lock()


def keep_descriptor(d: Driver, call: Call, args: list[Any]) -> dict[str, Any]:
    """A create kept: a client handle written to the application, the call kept to be made on the server."""
    d.session()
    if not args[0]:
        raise errors.CudaError(errors.INVALID_VALUE, f"{call.symbol}: {call.params[0].name} is NULL")
    handle = d.new_handle()
    marshal.put_u64(args[0], handle)
    STATE[handle] = state = {"replay": {"": (call, [handle, *args[1:]], 0)}, "kind": _kind(call)}
    return state


def _kind(create: Call) -> str:
    """The type of the descriptor a create makes (DESCRIPTORS' keys)."""
    return create.params[0].ctype.rstrip(" *")


def set_kept(d: Driver, call: Call, args: list[Any], slot: Any) -> None:
    """A setter of a kept descriptor: kept, replacing the last one of its slot (an attribute, or the shape)."""
    state = STATE.get(args[0])
    if state is None or "replay" not in state:  # not a descriptor of this client's: the server says so
        return d.forward(call, args)
    keep_setter(d, state, call, args, slot)


def keep_setter(d: Driver, state: dict[str, Any], call: Call, args: list[Any], slot: Any) -> list[Any]:
    """The setter's call kept in a kept descriptor's state: its wire arguments."""
    wire_args, size = marshal.pack(call, args, d.new_handle, True)
    state["replay"][slot] = (call, wire_args, size)
    state.pop("key", None)
    return wire_args


def server_descriptor(d: Driver, handle: int) -> int:
    """The server's descriptor for a kept one's setting, made there the first time it is named."""
    state = _kept_state(handle)
    if state is None or "replay" not in state:
        return handle  # not kept here: the server says what it is
    key = state.get("key")
    if key is None:
        key = state["key"] = (state["kind"], *sorted((str(slot), call.symbol, _hashable(wire_args[1:]))
                                                     for slot, (call, wire_args, _) in state["replay"].items()))
    with _made_lock:
        found = MADE.pop(key, None)
        if found is None:
            found = (d.new_handle(), state["kind"])
            for call, wire_args, size in _replay(state).values():  # the create first: inserted first
                d.post(call, [found[0], *wire_args[1:]], size)
            STATE[found[0]] = {k: v for k, v in state.items() if k in ("data_type", "pointer_mode", "scale_type")}
            while len(MADE) >= SERVER_DESCRIPTORS:  # the least recently used goes
                gone, kind = MADE.pop(next(iter(MADE)))
                d.post(CALLS[DESCRIPTORS[kind]], [gone])
                STATE.pop(gone, None)
                if IN_C is not None:
                    IN_C.serve(None, gone)
        MADE[key] = found
    if IN_C is not None and "record" in state:  # a setting C keeps: C names it so in the calls it queues
        IN_C.serve(state["record"][1], found[0])
    return found[0]


@implements("cudnnDeriveBNTensorDescriptor", "cudnnSetTensorNdDescriptorEx")
def derive_descriptor(d: Driver, call: Call, args: list[Any]) -> None:
    """Sets a descriptor on the server (from another's setting, or by a setter not kept here): that descriptor
    becomes the server's own."""
    own_descriptor(d, args[0])
    d.forward(call, args)


@implements("cudnnDeriveNormTensorDescriptor")
def derive_norm_descriptors(d: Driver, call: Call, args: list[Any]) -> None:
    own_descriptor(d, args[0])
    own_descriptor(d, args[1])
    d.forward(call, args)


def own_descriptor(d: Driver, handle: int) -> None:
    """A kept descriptor made on the server as itself, under its own handle, as the application made it."""
    state = _adopt(handle) or {}
    for call, wire_args, size in state.pop("replay", {}).values():
        d.post(call, [handle, *wire_args[1:]], size)
    state.pop("key", None)


def _hashable(values: list[Any]) -> tuple:
    return tuple(bytes(v.data) if isinstance(v, wire.Bulk) else v for v in values)


SERVER_OBJECT.update(dict.fromkeys(DESCRIPTORS, server_descriptor))


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

    def forget_settings(self, handle: int) -> None:
        self.lib.xpu_kept_setting(handle, 0, -1, 0)
        self.lib.xpu_kept_blas(handle, 0)

    def hold_blas(self, handle: int) -> Any:
        """Where C holds a new cuBLAS handle's stream and workspace (a struct xpu_blas_pair), answering its
        setters from now on until the handle is destroyed; None: no room there."""
        held = self.lib.xpu_kept_blas(handle, 1)
        return None if held == self.ffi.NULL else held

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


IN_C: KeptInC | None = None  # set by the shim (interpose/entry.py)


def _replay(state: dict[str, Any]) -> dict[str, tuple[Call, list[Any], int]]:
    """The calls that make a kept descriptor, as the application made them (one C keeps: from its record)."""
    return state["replay"] if state["replay"] is not None else IN_C.replay(state)


def _kept_state(handle: int) -> dict[str, Any] | None:
    """A handle's state: this module's, or that of a descriptor C keeps."""
    state = STATE.get(handle)
    return state if state is not None or IN_C is None else IN_C.state(handle)


def _adopt(handle: int) -> dict[str, Any] | None:
    """The state of a handle, a descriptor that C kept until now taken over."""
    state = STATE.get(handle)
    if state is None and IN_C is not None:
        state = IN_C.adopt(handle)
        if state is not None:
            STATE[handle] = state
    return state


# ---- cuDNN's variant packs: kept here, sent with their execution --------------------------------------
# PyTorch (cudnn-frontend) makes, fills, finalizes, executes and destroys a variant pack for every convolution
# it runs: seven calls, each a message's call for the client and the server. A pack is kept instead (in C with
# the shim, the execution reading it there) and goes as one xpuCudnnExecute, which the server runs as those calls.
# A pack used any other way is taken over from C and sent as it was made (`_send_pack`), and from then on its
# calls go to the server.


def _kept(handle: int, adopt: bool = True) -> dict[str, Any] | None:
    """A variant pack kept here, or in C (taken over, unless it is only read for its execution)."""
    pack = STATE.get(handle)
    if pack is None and IN_C is not None:
        pack = IN_C.pack(handle, adopt)
        if adopt and pack is not None:
            STATE[handle] = pack
    return pack if pack is not None and "kept" in pack else None


def _send_pack(d: Driver, handle: int) -> None:
    """A kept pack made on the server as the application made it: created, its attributes set, finalized."""
    pack = _kept(handle)
    if pack is None:
        return
    kept = pack.pop("kept")
    d.post(CALLS["cudnnBackendCreateDescriptor"], [VARIANT_PACK, handle])
    for name, (attribute_type, count, raw) in kept.items():
        _post_attribute(d, handle, name, attribute_type, count, raw)
    if pack.pop("finalized"):
        d.post(CALLS["cudnnBackendFinalize"], [handle])


def _send_packs(d: Driver, handles: bytes) -> None:
    """Kept packs among an array of descriptors: the server must have them."""
    for (handle,) in struct.iter_unpack("<Q", handles):
        _send_pack(d, handle)


def _execution(d: Driver, pack: dict[str, Any]) -> list[Any] | None:
    """xpuCudnnExecute's arguments after the handle and plan, for a finalized pack of data pointers, as many
    unique ids and at most a workspace; None for any other."""
    kept = pack["kept"]
    pointers, uids = kept.get(mathlibs.CUDNN_DATA_POINTERS), kept.get(PACK_UIDS)
    workspace = kept.get(PACK_WORKSPACE, (0, 1, bytes(8)))
    if not pack["finalized"] or pointers is None or uids is None or pointers[1] != uids[1] or workspace[1] != 1 \
            or len(kept) != 2 + (PACK_WORKSPACE in kept):
        return None
    count, raw = pointers[1], pointers[2]
    flags, scalars = _by_value_scalars(d, raw) or (bytes(count), bytes(8 * count))
    if IN_C is not None:  # C queues the next execution itself: it knows device memory, and these scalars
        IN_C.watch_device(memory.maps(d)[0])
        if any(flags):
            IN_C.learn_scalars(raw, flags)
    return [count, int.from_bytes(workspace[2], "little"), mathlibs.execute_pack(raw, uids[2], scalars, flags)]


@implements("cudnnBackendExecute")
def backend_execute(d: Driver, call: Call, args: list[Any]) -> None:
    handle, plan, pack_handle = args
    pack = _kept(pack_handle, adopt=False)  # C keeps it on for its destroy
    if pack is not None:
        sent = _execution(d, pack)
        if sent is not None:
            count, workspace, data = sent
            d.post(CALLS["xpuCudnnExecute"], [handle, plan, count, workspace, wire.frame(data)], len(data))
            return
        _send_pack(d, pack_handle)
    d.forward(call, args)


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
implements("cublasGetProperty", "cublasLtGetProperty", "cudnnGetProperty")(_property)


@implements("cudnnGetLastErrorString")
def last_error_string(d: Driver, call: Call, args: list[Any]) -> None:
    message, capacity = args
    if message and capacity:
        marshal.write_string(message, "", capacity)  # failures are logged on stderr as they happen


def handlers() -> list[list[Callable[[Any], int]]]:
    """One handler list per library (protocol.mathlibs.LIBRARIES order), indexed by the op numbers
    of its replacement's entry points."""
    return [[handler(CALLS[s]) for s in LIBRARY_SYMBOLS[lib.name]] for lib in mathlibs.LIBRARIES]


# ---- cuDNN's backend API: attribute arrays sized by their element type ------------------------------



def _elements_bytes(attribute_type: int, count: int) -> int:
    if count < 0:
        raise errors.library_error("cudnn", "invalid_value", f"an element count of {count}")
    return count * struct.calcsize("<" + mathlibs.cudnn_format(attribute_type))


@implements("cudnnBackendSetAttribute")
def backend_set_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    descriptor, name, attribute_type, count, array = args
    size = _elements_bytes(attribute_type, count)
    if size and not array:
        raise errors.library_error("cudnn", "invalid_value", "NULL arrayOfElements")
    raw = marshal.read(array, size) if size else b""
    pack = _kept(descriptor)
    if pack is not None and mathlibs.CUDNN_PACK_ATTRIBUTES.get(name) == attribute_type and not pack["finalized"]:
        pack["kept"][name] = (attribute_type, count, raw)
        return
    _send_pack(d, descriptor)
    if attribute_type == TYPE_DESCRIPTOR:
        _send_packs(d, raw)
    _post_attribute(d, descriptor, name, attribute_type, count, raw)


def _post_attribute(d: Driver, descriptor: int, name: int, attribute_type: int, count: int, raw: bytes) -> None:
    size = len(raw)
    pointers = name == mathlibs.CUDNN_DATA_POINTERS and attribute_type == mathlibs.CUDNN_VOID_PTR
    if pointers and (scalars := _by_value_scalars(d, raw)):
        d.post(CALLS["xpuCudnnSetDataPointers"], [descriptor, count, wire.frame(raw), *map(wire.frame, scalars)],
               size)
        return
    d.post(CALLS["cudnnBackendSetAttribute"],
           [descriptor, name, attribute_type, count, wire.frame(raw) if size else None], size)


# a variant pack's pointers -> the device memory map's `changes` when they were all found in it (or NULL)
ON_DEVICE: dict[bytes, int] = {}


def _by_value_scalars(d: Driver, pointers: bytes) -> tuple[bytes, bytes] | None:
    """A variant pack's pointer outside device memory, readable here, is a by-value scalar's (cudnn-frontend
    passes attention scales so): which ones, and their bytes, 8 each (the widest scalar), for the server to
    hold where its cuDNN reads them. None where there is none."""
    devices = memory.maps(d)[0]
    if ON_DEVICE.get(pointers) == devices.changes:  # PyTorch's caching allocator gives a step the same addresses
        return None
    flags, scalars = bytearray(len(pointers) // 8), bytearray(len(pointers))
    on_device = True
    for i, (address,) in enumerate(struct.iter_unpack("<Q", pointers)):
        if not address or devices.find(address) is not None:
            continue
        on_device = False
        if (found := memory.host_bytes(address, 8)) is not None:
            flags[i], scalars[8 * i:8 * i + len(found)] = 1, found
    if on_device:
        remember(ON_DEVICE, pointers, devices.changes)
        return None
    return (bytes(flags), bytes(scalars)) if any(flags) else None



@implements("cudnnBackendGetAttribute")
def backend_get_attribute(d: Driver, call: Call, args: list[Any]) -> None:
    """Descriptor-valued attributes fill descriptors the caller made beforehand: those go to the
    server as handles (xpuCudnnGetDescriptors); other values come back as bytes."""
    descriptor, name, attribute_type, requested, count_out, array = args
    size = _elements_bytes(attribute_type, requested) if array else 0  # NULL: a question of the count
    _send_pack(d, descriptor)
    if attribute_type == TYPE_DESCRIPTOR:
        raw = marshal.read(array, size) if size else b""
        _send_packs(d, raw)
        handles = wire.frame(raw) if size else None
        (count,) = d.call(CALLS["xpuCudnnGetDescriptors"], [descriptor, name, size // 8, handles, 1])
        if count_out:
            marshal.write(count_out, count)
        return
    count, data = d.call(call, [descriptor, name, attribute_type, requested, 8, size or None])
    if count_out:  # NULL is allowed (the stock PyTorch passes it)
        marshal.write(count_out, count)
    # cuDNN writes the elements the attribute holds, up to the request: callers size their arrays by
    # an earlier count and may still request more (the stock PyTorch's numerical notes)
    held = max(0, min(requested, int.from_bytes(count, "little", signed=True)))
    marshal.write(array, data[:_elements_bytes(attribute_type, held)] if data else None)
