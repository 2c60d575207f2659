"""cuDNN's backend (graph) API on the sim device: descriptors, one engine, convolutions in numpy.

A descriptor keeps its attributes as the caller set them (decoded by element type). The sim has
one engine (global index 0) that runs operation graphs of one convolution (forward, data
gradient or filter gradient) and needs no workspace; heuristics offer it, and any other graph
is refused when its execution plan is finalized (CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN), which
is how a cuDNN caller learns that an engine does not fit. With XPU_SIM_SKIP_KERNELS=1 such graphs
are accepted and skipped instead, as kernels without a host implementation are. Tensors are read
through their dimensions and strides, so NCHW and NHWC are the same code.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpuremote.protocol import errors, mathlibs

from .sim_blas import bf16_to_f32, f32_to_bf16

log = logging.getLogger("xpuremote.server")
E = mathlibs.api(mathlibs.CUDNN).ENUMS
DESCRIPTOR_TYPES = {v: k.removeprefix("CUDNN_BACKEND_") for k, v in E.items()
                    if k.startswith("CUDNN_BACKEND_") and k.endswith("_DESCRIPTOR")}
TYPE_DESCRIPTOR, TYPE_HANDLE = E["CUDNN_TYPE_BACKEND_DESCRIPTOR"], E["CUDNN_TYPE_HANDLE"]
STORAGE = {E["CUDNN_DATA_FLOAT"]: "<f4", E["CUDNN_DATA_DOUBLE"]: "<f8", E["CUDNN_DATA_HALF"]: "<f2",
           E["CUDNN_DATA_BFLOAT16"]: "<u2"}
CONVOLUTIONS = {  # operation descriptor type -> (x, w, y attribute suffixes): what it reads and writes
    "OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR": ("FORWARD", "X", "W", "Y"),
    "OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR": ("BWD_DATA", "DX", "W", "DY"),
    "OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR": ("BWD_FILTER", "X", "DW", "DY"),
}


def fail(outcome: str, detail: str) -> errors.CudaError:
    return errors.library_error("cudnn", outcome, detail)


@dataclass
class Descriptor:
    kind: str  # e.g. TENSOR_DESCRIPTOR
    values: dict[int, tuple[int, list[Any]]] = field(default_factory=dict)  # name -> (type, elements)
    finalized: bool = False
    by_value: dict[int, bytes] = field(default_factory=dict)  # a variant pack's scalars, by data pointer index

    def get(self, name: str, default: Any = None) -> Any:
        """The one element of attribute CUDNN_ATTR_<name>, or `default`."""
        found = self.values.get(E[f"CUDNN_ATTR_{name}"])
        return found[1][0] if found and found[1] else default

    def all(self, name: str) -> list[Any]:
        found = self.values.get(E[f"CUDNN_ATTR_{name}"])
        return list(found[1]) if found else []

    def put(self, name: str, kind: str, elements: list[Any]) -> None:
        self.values[E[f"CUDNN_ATTR_{name}"]] = (E[f"CUDNN_TYPE_{kind}"], elements)


class GraphDnn:
    """The backend API's families, over the sim's `memory`."""

    def __init__(self, memory: Any, skip_unknown: bool = False) -> None:
        self.memory = memory
        self.skip_unknown = skip_unknown  # accept graphs the sim cannot run, and skip them
        self.skipped: set[str] = set()
        self.handles: dict[int, tuple[str, Any]] = {}  # the session's: client handle -> (type, object)

    def descriptor(self, handle: int, kind: str | None = None) -> Descriptor:
        found = self.handles.get(handle)
        if found is None or not isinstance(found[1], Descriptor):
            raise fail("invalid_value", f"{handle:#x} is not a backend descriptor")
        if kind and found[1].kind != kind:
            raise fail("invalid_value", f"a {found[1].kind} where a {kind} belongs")
        return found[1]

    # ---- handles -----------------------------------------------------------------------------
    def cudnnCreate(self) -> tuple[dict[str, Any]]:
        return ({"stream": None},)

    def cudnnDestroy(self, handle: dict[str, Any]) -> None:
        pass

    def cudnnSetStream(self, handle: dict[str, Any], stream: Any) -> None:
        handle["stream"] = stream

    # ---- descriptors -------------------------------------------------------------------------
    def cudnnBackendCreateDescriptor(self, kind: int) -> tuple[Descriptor]:
        if kind not in DESCRIPTOR_TYPES:
            raise fail("invalid_value", f"descriptor type {kind}")
        return (Descriptor(DESCRIPTOR_TYPES[kind]),)

    def cudnnBackendDestroyDescriptor(self, descriptor: Descriptor) -> None:
        pass

    def cudnnBackendSetAttribute(self, descriptor: Descriptor, name: int, kind: int, count: int,
                                 data: bytes | None) -> None:
        if descriptor.finalized:
            raise fail("invalid_value", "the descriptor is finalized already")
        fmt = "<" + mathlibs.cudnn_format(kind)
        size = struct.calcsize(fmt)
        if count < 0 or len(data or b"") != count * size:
            raise fail("invalid_value", f"{count} elements in {len(data or b'')} bytes")
        elements = [v if len(v) > 1 else v[0] for v in struct.iter_unpack(fmt, data or b"")]
        if kind == TYPE_DESCRIPTOR:
            elements = [self.descriptor(h) for h in elements]
        descriptor.values[name] = (kind, elements)

    def cudnnBackendGetAttribute(self, descriptor: Descriptor, name: int, kind: int,
                                 requested: int) -> tuple[int, bytes]:
        stored_kind, elements = self.derived(descriptor, name)
        if stored_kind != kind:
            raise fail("invalid_value", f"attribute {name} is of type {stored_kind}, not {kind}")
        fmt = "<" + mathlibs.cudnn_format(kind)
        chosen = elements[: max(requested, 0)]
        return len(elements), b"".join(struct.pack(fmt, *(e if isinstance(e, tuple) else (e,))) for e in chosen)

    def set_data_pointers(self, pack: Descriptor, count: int, pointers: bytes, by_value: bytes, scalars: bytes) -> None:
        """xpuCudnnSetDataPointers: a by-value scalar's bytes are kept beside its (NULL) pointer; the sim's
        graphs take none, so it logs them (tests read them there)."""
        self.cudnnBackendSetAttribute(pack, mathlibs.CUDNN_DATA_POINTERS, mathlibs.CUDNN_VOID_PTR, count, pointers)
        pack.by_value = {i: bytes(scalars[8 * i:8 * i + 8]) for i in range(count) if by_value[i]}
        log.info("variant pack: by-value scalars %s", " ".join(v.hex() for v in pack.by_value.values()))

    def execute_kept(self, handle: int, plan: int, count: int, pointers: bytes, uids: bytes, by_value: bytes,
                     scalars: bytes, workspace: int) -> None:
        """xpuCudnnExecute: a variant pack the client kept, made here and executed."""
        found = self.handles.get(handle)
        if found is None or found[0] != "cudnnHandle_t":
            raise fail("invalid_value", f"{handle:#x} is not a live cudnnHandle_t")
        pack = Descriptor("VARIANT_PACK_DESCRIPTOR")
        self.set_data_pointers(pack, count, pointers, by_value, scalars)
        self.cudnnBackendSetAttribute(pack, mathlibs.CUDNN_UNIQUE_IDS, mathlibs.CUDNN_INT64, count, uids)
        self.cudnnBackendSetAttribute(pack, mathlibs.CUDNN_WORKSPACE, mathlibs.CUDNN_VOID_PTR, 1,
                                      struct.pack("<Q", workspace))
        self.cudnnBackendFinalize(pack)
        self.cudnnBackendExecute(found[1], self.descriptor(plan, "EXECUTION_PLAN_DESCRIPTOR"), pack)

    def get_descriptors(self, descriptor: Descriptor, name: int, requested: int, handles: bytes | None) -> int:
        """GetAttribute of descriptors: fill the caller's own (`handles`) with ours; the count."""
        kind, elements = self.derived(descriptor, name)
        if kind != TYPE_DESCRIPTOR:
            raise fail("invalid_value", f"attribute {name} does not hold descriptors")
        targets = [self.descriptor(h) for (h,) in struct.iter_unpack("<Q", handles or b"")][:requested]
        for target, source in zip(targets, elements):
            if target.kind != source.kind:
                raise fail("invalid_value", f"a {target.kind} cannot receive a {source.kind}")
            target.values, target.finalized = dict(source.values), source.finalized
        return len(elements)

    def derived(self, d: Descriptor, name: int) -> tuple[int, list[Any]]:
        """An attribute as set, or what the sim's one engine answers for it."""
        if name in d.values:
            return d.values[name]
        answers: dict[str, tuple[str, list[Any]]] = {
            "ENGINEHEUR_RESULTS": ("BACKEND_DESCRIPTOR", [self.engine_config(d)] if d.finalized else []),
            "OPERATIONGRAPH_ENGINE_GLOBAL_COUNT": ("INT64", [1]),
            "EXECUTION_PLAN_WORKSPACE_SIZE": ("INT64", [0]),
            "ENGINECFG_WORKSPACE_SIZE": ("INT64", [0]),
            "ENGINECFG_SHARED_MEMORY_USED": ("INT32", [0]),
            "ENGINECFG_KNOB_CHOICES": ("BACKEND_DESCRIPTOR", []),
            "ENGINE_KNOB_INFO": ("BACKEND_DESCRIPTOR", []),
            "ENGINE_NUMERICAL_NOTE": ("NUMERICAL_NOTE", []),
            "ENGINE_BEHAVIOR_NOTE": ("BEHAVIOR_NOTE", []),
            "EXECUTION_PLAN_COMPUTED_INTERMEDIATE_UIDS": ("INT64", []),
            "EXECUTION_PLAN_RUN_ONLY_INTERMEDIATE_UIDS": ("INT64", []),
            "EXECUTION_PLAN_JSON_REPRESENTATION": ("CHAR", list(b'{"engine": "xpuremote sim"}\0')),
        }
        for attr, (kind, elements) in answers.items():
            if E.get(f"CUDNN_ATTR_{attr}") == name:
                return E[f"CUDNN_TYPE_{kind}"], [bytes([e]) if kind == "CHAR" else e for e in elements]
        raise fail("invalid_value", f"attribute {name} of a {d.kind} has not been set")

    def engine_config(self, heuristics: Descriptor) -> Descriptor:
        engine = Descriptor("ENGINE_DESCRIPTOR", finalized=True)
        engine.put("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", [heuristics.get("ENGINEHEUR_OPERATION_GRAPH")])
        engine.put("ENGINE_GLOBAL_INDEX", "INT64", [0])
        config = Descriptor("ENGINECFG_DESCRIPTOR", finalized=True)
        config.put("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", [engine])
        return config

    def cudnnBackendFinalize(self, d: Descriptor) -> None:
        if d.kind == "ENGINE_DESCRIPTOR" and d.get("ENGINE_GLOBAL_INDEX", 0) != 0:
            raise fail("not_supported", "the sim device has one engine, global index 0")
        if d.kind == "EXECUTION_PLAN_DESCRIPTOR":
            self.convolution(self.plan_graph(d))  # refuses what the sim cannot run
        d.finalized = True

    def plan_graph(self, plan: Descriptor) -> Descriptor:
        config = plan.get("EXECUTION_PLAN_ENGINE_CONFIG")
        engine = config.get("ENGINECFG_ENGINE") if config else None
        graph = engine.get("ENGINE_OPERATION_GRAPH") if engine else None
        if graph is None:
            raise fail("invalid_value", "the execution plan has no engine config with an operation graph")
        return graph

    def convolution(self, graph: Descriptor) -> Descriptor | None:
        """The graph's one convolution; None for a graph to skip (XPU_SIM_SKIP_KERNELS)."""
        ops = graph.all("OPERATIONGRAPH_OPS")
        if len(ops) == 1 and ops[0].kind in CONVOLUTIONS:
            return ops[0]
        kinds = ", ".join(op.kind for op in ops)
        if not self.skip_unknown:
            raise errors.CudaError(E["CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN"],
                                   f"the sim device runs graphs of one convolution, not [{kinds}]", "cudnn")
        if kinds not in self.skipped:
            self.skipped.add(kinds)
            log.warning("skipping cuDNN graphs of [%s] (no host implementation; XPU_SIM_SKIP_KERNELS)", kinds)
        return None

    # ---- execution ---------------------------------------------------------------------------
    def cudnnBackendExecute(self, handle: Any, plan: Descriptor, pack: Descriptor) -> None:
        op = self.convolution(self.plan_graph(plan))
        if op is None:
            return
        pointers = dict(zip(pack.all("VARIANT_PACK_UNIQUE_IDS"), pack.all("VARIANT_PACK_DATA_POINTERS")))
        prefix, *roles = CONVOLUTIONS[op.kind]
        attr = f"OPERATION_CONVOLUTION_{prefix}"
        x_desc, w_desc, y_desc = (op.get(f"{attr}_{role}") for role in roles)
        conv = Convolution.of(op.get(f"{attr}_CONV_DESC"), w_desc)
        alpha, beta = op.get(f"{attr}_ALPHA", 1.0), op.get(f"{attr}_BETA", 0.0)
        tensors = [Tensor.bound(t, pointers, self.memory) for t in (x_desc, w_desc, y_desc)]
        x, w, y = tensors
        if prefix == "FORWARD":
            out, result = y, conv.forward(x.load(), w.load())
        elif prefix == "BWD_DATA":
            out, result = x, conv.data_grad(y.load(), w.load(), x.dims)
        else:
            out, result = w, conv.filter_grad(x.load(), y.load(), w.dims)
        out.store(alpha * result + (beta * out.load() if beta else 0))


@dataclass
class Tensor:
    """Elements of a data type at a device address, laid out by dimensions and strides."""

    dims: list[int]
    strides: list[int]
    dtype: int
    address: int
    memory: Any

    def __post_init__(self) -> None:
        if self.dtype not in STORAGE or len(self.dims) != len(self.strides) or not self.address:
            raise fail("not_supported" if self.dtype not in STORAGE else "invalid_value",
                       f"tensor of data type {self.dtype}, dims {self.dims}, strides {self.strides}")

    @classmethod
    def bound(cls, d: Descriptor, pointers: dict[int, int], memory: Any) -> Tensor:
        """A backend tensor descriptor with the variant pack's address for its unique id."""
        uid = d.get("TENSOR_UNIQUE_ID")
        if uid not in pointers:
            raise fail("invalid_value", f"the variant pack has no data pointer for tensor {uid}")
        dtype = d.get("TENSOR_DATA_TYPE", E["CUDNN_DATA_FLOAT"])
        return cls(d.all("TENSOR_DIMENSIONS"), d.all("TENSOR_STRIDES"), dtype, pointers[uid], memory)

    def view(self) -> np.ndarray:
        storage = np.dtype(STORAGE[self.dtype])
        span = 1 + sum((n - 1) * s for n, s in zip(self.dims, self.strides))
        flat = np.frombuffer(self.memory.view(self.address, span * storage.itemsize), storage)
        return np.lib.stride_tricks.as_strided(flat, self.dims, [s * storage.itemsize for s in self.strides],
                                               writeable=True)

    def load(self) -> np.ndarray:
        raw = self.view()
        wide = np.float64 if self.dtype == E["CUDNN_DATA_DOUBLE"] else np.float32
        return bf16_to_f32(raw) if self.dtype == E["CUDNN_DATA_BFLOAT16"] else raw.astype(wide)

    def store(self, values: np.ndarray) -> None:
        out = self.view()
        out[...] = f32_to_bf16(values) if self.dtype == E["CUDNN_DATA_BFLOAT16"] else values.astype(out.dtype)


@dataclass
class Convolution:
    """N-d cross-correlation (or convolution, with the filter flipped), grouped by channel counts."""

    stride: list[int]
    pad: list[int]
    dilation: list[int]
    flip: bool
    groups_of: int  # input channels per group: the filter's second dimension

    @classmethod
    def of(cls, d: Descriptor, w: Descriptor) -> Convolution:
        spatial = d.get("CONVOLUTION_SPATIAL_DIMS", 2)
        pre, post = d.all("CONVOLUTION_PRE_PADDINGS"), d.all("CONVOLUTION_POST_PADDINGS")
        if post and post != pre:
            raise fail("not_supported", "asymmetric padding on the sim device")
        return cls(d.all("CONVOLUTION_FILTER_STRIDES") or [1] * spatial, pre or [0] * spatial,
                   d.all("CONVOLUTION_DILATIONS") or [1] * spatial,
                   d.get("CONVOLUTION_CONV_MODE", E["CUDNN_CROSS_CORRELATION"]) == E["CUDNN_CONVOLUTION"],
                   w.all("TENSOR_DIMENSIONS")[1])

    def windows(self, x: np.ndarray, kernel: list[int], out: list[int]) -> np.ndarray:
        """(N, C, *out, *kernel) view of the padded input under every filter position."""
        padded = np.pad(x, [(0, 0), (0, 0), *[(p, p) for p in self.pad]])
        lead, spatial = padded.strides[:2], padded.strides[2:]
        return np.lib.stride_tricks.as_strided(
            padded, (*x.shape[:2], *out, *kernel),
            (*lead, *[s * t for s, t in zip(spatial, self.stride)], *[s * d for s, d in zip(spatial, self.dilation)]))

    def filters(self, w: np.ndarray) -> np.ndarray:
        return w[(slice(None), slice(None), *[slice(None, None, -1)] * (w.ndim - 2))] if self.flip else w

    def groups(self, channels: int) -> int:
        return channels // self.groups_of

    def out_shape(self, x_shape: tuple[int, ...], kernel: list[int]) -> list[int]:
        return [(n + 2 * p - d * (k - 1) - 1) // s + 1
                for n, p, d, k, s in zip(x_shape[2:], self.pad, self.dilation, kernel, self.stride)]

    def forward(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        kernel = list(w.shape[2:])
        win = self.windows(x, kernel, self.out_shape(x.shape, kernel))
        g = self.groups(x.shape[1])
        return np.concatenate([np.einsum(_spec(w.ndim - 2, "fwd"), part_x, part_w) for part_x, part_w in
                               zip(np.split(win, g, axis=1), np.split(self.filters(w), g, axis=0))], axis=1)

    def filter_grad(self, x: np.ndarray, dy: np.ndarray, w_dims: list[int]) -> np.ndarray:
        win = self.windows(x, w_dims[2:], list(dy.shape[2:]))
        g = self.groups(x.shape[1])
        grad = np.concatenate([np.einsum(_spec(dy.ndim - 2, "wgrad"), part_x, part_dy) for part_x, part_dy in
                               zip(np.split(win, g, axis=1), np.split(dy, g, axis=1))], axis=0)
        return self.filters(grad)

    def data_grad(self, dy: np.ndarray, w: np.ndarray, x_dims: list[int]) -> np.ndarray:
        """The adjoint of forward: each filter tap scatters dy back to the inputs it read."""
        n, channels = x_dims[:2]
        padded = np.zeros((n, channels, *[d + 2 * p for d, p in zip(x_dims[2:], self.pad)]), dy.dtype)
        g = self.groups(channels)
        w = self.filters(w)
        for tap in np.ndindex(*w.shape[2:]):
            where = tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                          for t, d, s, o in zip(tap, self.dilation, self.stride, dy.shape[2:]))
            for group, (part_dy, part_w) in enumerate(zip(np.split(dy, g, axis=1), np.split(w, g, axis=0))):
                channels_of = slice(group * self.groups_of, (group + 1) * self.groups_of)
                contribution = np.einsum("nk...,kc->nc...", part_dy, part_w[(slice(None), slice(None), *tap)])
                padded[(slice(None), channels_of, *where)] += contribution
        return padded[(slice(None), slice(None), *[slice(p, p + d) for p, d in zip(self.pad, x_dims[2:])])]


def _spec(spatial: int, which: str) -> str:
    """einsum subscripts for `spatial` dimensions: windows (n c o... k...) against filters or gradients."""
    out, ker = "pqr"[:spatial], "uvw"[:spatial]
    return {"fwd": f"nc{out}{ker},fc{ker}->nf{out}", "wgrad": f"nc{out}{ker},nf{out}->fc{ker}"}[which]
