"""Math library descriptors in the client: cuBLASLt's matmul descriptors, layouts and preferences and cuDNN's
tensor descriptors, kept here (or in C, client/kept_in_c.py) and made on the server once per setting; cuBLASLt's
heuristic and cuDNN's sizes answered from the first answer for the same settings."""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any

from xpuremote.protocol import abi, errors, mathlibs, wire
from xpuremote.protocol.calls import CALLS, Call, Param

from . import marshal
from . import mathlibs as base
from .driver import SERVER_OBJECT, Driver, implements
from .mathlibs import ATTR_POINTER_MODE, ATTR_SCALE_TYPE, DNN, LT_DESC, POINTER_MODE_HOST, STATE, _state, remember

DNN_ELEMENT_BYTES = {DNN[f"CUDNN_DATA_{t}"]: size for t, size in (
    ("FLOAT", 4), ("DOUBLE", 8), ("HALF", 2), ("BFLOAT16", 2), ("INT8", 1), ("INT32", 4), ("INT64", 8))}
# value of a cudaDataType_t or cublasComputeType_t -> bytes of one scalar of it
SCALAR_BYTES = {LT_DESC[name]: size for name, size in mathlibs.SCALAR_BYTES.items() if name in LT_DESC}

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
    if base.IN_C is not None:  # with the shim, C answers it from now on: no Python at either end
        base.IN_C.learn_answer(call, args, *found)


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
    owner_name = "computeDesc" if call.library == "cublasLt" else "handle"

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
    if base.IN_C is not None:
        base.IN_C.learn_answer(call, args, found.to_bytes(call.params[-1].pointee_size, "little"))


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
    """The server's descriptor for a kept one's setting, made there the first time it is named. A device address
    among its attributes (a GEMM's bias) names it by its alignment only, as a heuristic does: under autocast
    PyTorch casts the bias anew at every step, and the server's descriptor is moved to the new address instead."""
    state = _kept_state(handle)
    if state is None or "replay" not in state:
        return handle  # not kept here: the server says what it is
    key = state.get("key")
    if key is None:
        key = state["key"] = (state["kind"], *sorted((str(slot), call.symbol, _named(call, wire_args))
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
                if base.IN_C is not None:
                    base.IN_C.serve(None, gone)
        else:
            _move_addresses(d, state, found[0])
        MADE[key] = found
        if base.IN_C is None:  # the addresses it holds there (with the shim, C knows them: kept.h's `sent`)
            STATE.setdefault(found[0], {})["addresses"] = {slot: _hashable(args[2:3]) for slot, (call, args, _)
                                                           in _replay(state).items() if _is_address(call, args)}
    if base.IN_C is not None:  # a setting C keeps: C names it so in the calls it queues, and moves its addresses
        base.IN_C.serve(state["record"][1] if "record" in state else None, found[0])
    return found[0]


def _is_address(call: Call, wire_args: list[Any]) -> bool:
    return call.family == "cublasLtMatmulDescSetAttribute" and wire_args[1] in LT_POINTERS and wire_args[3] == 8


def _named(call: Call, wire_args: list[Any]) -> tuple:
    """A replayed call's arguments as they name a server's descriptor: a device address by its alignment."""
    if _is_address(call, wire_args):
        return wire_args[1], _as_setting(call, wire_args[1], _hashable(wire_args[2:3])[0]), wire_args[3]
    return _hashable(wire_args[1:])


def _move_addresses(d: Driver, state: dict[str, Any], server: int) -> None:
    """The server's descriptor `server`, made for this setting, to the addresses the descriptor holds now. With
    the shim C may have moved it since (kept.h, xpu_kept_moves), so then every address is sent again."""
    had = STATE.get(server, {}).get("addresses", {}) if base.IN_C is None else {}
    for slot, (call, wire_args, size) in _replay(state).items():
        if _is_address(call, wire_args) and had.get(slot) != _hashable(wire_args[2:3]):
            d.post(call, [server, *wire_args[1:]], size)


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


def _replay(state: dict[str, Any]) -> dict[str, tuple[Call, list[Any], int]]:
    """The calls that make a kept descriptor, as the application made them (one C keeps: from its record)."""
    return state["replay"] if state["replay"] is not None else base.IN_C.replay(state)


def _kept_state(handle: int) -> dict[str, Any] | None:
    """A handle's state: this module's, or that of a descriptor C keeps."""
    state = STATE.get(handle)
    return state if state is not None or base.IN_C is None else base.IN_C.state(handle)


def _adopt(handle: int) -> dict[str, Any] | None:
    """The state of a handle, a descriptor that C kept until now taken over."""
    state = STATE.get(handle)
    if state is None and base.IN_C is not None:
        state = base.IN_C.adopt(handle)
        if state is not None:
            STATE[handle] = state
    return state


