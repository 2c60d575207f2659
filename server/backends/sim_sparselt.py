"""cuSPARSELt on the sim device: 2:4 structured sparsity's pruning, compression and products in numpy.

The objects are what their Init named: a matrix descriptor its sizes, leading dimension, order, value type and
whether it is structured (2:4, 50%); a matmul descriptor its operations, four matrices and compute type, and its
attributes (bias, ReLU); an algorithm selection its settings (one algorithm, id 0); a plan its descriptor and
selection. The structured operand's groups of four run along the product's inner dimension k: the rows of op(A)
for a sparse A, the columns of op(B) for a sparse B, as the hardware requires.

- Pruning (cusparseLtSpMMAPrune, Prune2): CUSPARSELT_PRUNE_SPMMA_STRIP keeps the two largest magnitudes of each
  1x4 strip along k; CUSPARSELT_PRUNE_SPMMA_TILE keeps, in each 4x4 tile, the eight elements of the largest L1 norm
  with exactly two in each row and each column (all 90 such patterns scored), as cuSPARSELt's guide defines them.
  Ties go to the lower index. The check (PruneCheck, PruneCheck2) writes 0 to its device int where every strip has
  at most two non-zeros, 1 where one has more.
- Compression (cusparseLtSpMMACompress, Compress2): NOT NVIDIA's bytes. cuSPARSELt does not document its compressed
  layout, so the sim's is its own, self-consistent and of the size PyTorch allocates for it: the kept values of
  the operand oriented with k last ((p, k) for p rows of op(A), or columns of op(B)), two per strip, (p, k/2) in
  row order, in the value type; then the metadata, one 4-bit code per strip in the same order (the two kept
  positions i < j as i | j << 2), two strips a byte (the first in the low nibble). A strip with more than two
  non-zeros keeps its two largest. cusparseLtSpMMACompressedSize answers that size and a buffer of 0 bytes. Only
  a compression of this sim feeds its products: bytes compressed by NVIDIA's library read as something else.
- Products (cusparseLtMatmul, MatmulSearch): D = act(alpha op(A) op(B) + beta C + bias), the structured operand
  read from its compressed form, fp16 and bf16 computed in fp32 and rounded once, fp32, int8 in integers; the bias
  (CUSPARSELT_MATMUL_BIAS_POINTER) one value per row of D, of D's type (fp32 for integer D), ReLU with its upper
  bound and threshold. No workspace (0 bytes). Batches, GELU and vector scaling answer NOT_SUPPORTED here (a GPU
  server runs them).
"""

from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpuremote.protocol import errors, mathlibs

from .sim_blas import bf16_to_f32, f32_to_bf16

ENUMS = {**mathlibs.api(mathlibs.CUSPARSELT).ENUMS, **mathlibs.CUSPARSELT_IMPLICIT}
R_16F, R_16BF, R_32F, R_8I, R_32I = (ENUMS[f"CUDA_{t}"] for t in ("R_16F", "R_16BF", "R_32F", "R_8I", "R_32I"))
STORAGE = {R_16F: np.dtype("<f2"), R_16BF: np.dtype("<u2"), R_32F: np.dtype("<f4"), R_8I: np.dtype("i1"),
           R_32I: np.dtype("<i4")}
ORDER_ROW, ORDER_COL = ENUMS["CUSPARSE_ORDER_ROW"], ENUMS["CUSPARSE_ORDER_COL"]
OP_N, OP_T = ENUMS["CUSPARSE_OPERATION_NON_TRANSPOSE"], ENUMS["CUSPARSE_OPERATION_TRANSPOSE"]
COMPUTE_32I = ENUMS["CUSPARSE_COMPUTE_32I"]
COMPUTES = (COMPUTE_32I, ENUMS["CUSPARSE_COMPUTE_16F"], ENUMS["CUSPARSE_COMPUTE_32F"])
STRIP, TILE = ENUMS["CUSPARSELT_PRUNE_SPMMA_STRIP"], ENUMS["CUSPARSELT_PRUNE_SPMMA_TILE"]
NUM_BATCHES = ENUMS["CUSPARSELT_MAT_NUM_BATCHES"]
RELU, RELU_UPPERBOUND, RELU_THRESHOLD = (ENUMS[f"CUSPARSELT_MATMUL_ACTIVATION_{a}"]
                                         for a in ("RELU", "RELU_UPPERBOUND", "RELU_THRESHOLD"))
GELU, BIAS_POINTER = ENUMS["CUSPARSELT_MATMUL_ACTIVATION_GELU"], ENUMS["CUSPARSELT_MATMUL_BIAS_POINTER"]
VECTOR_SCALING = (ENUMS["CUSPARSELT_MATMUL_ALPHA_VECTOR_SCALING"], ENUMS["CUSPARSELT_MATMUL_BETA_VECTOR_SCALING"])
CONFIG_ID, CONFIG_MAX_ID = ENUMS["CUSPARSELT_MATMUL_ALG_CONFIG_ID"], ENUMS["CUSPARSELT_MATMUL_ALG_CONFIG_MAX_ID"]
ALG_DEFAULTS = {CONFIG_ID: 0, CONFIG_MAX_ID: 1, ENUMS["CUSPARSELT_MATMUL_SEARCH_ITERATIONS"]: 5,
                ENUMS["CUSPARSELT_MATMUL_SPLIT_K"]: 1, ENUMS["CUSPARSELT_MATMUL_SPLIT_K_MODE"]: 1,
                ENUMS["CUSPARSELT_MATMUL_SPLIT_K_BUFFERS"]: 1}
# the 4x4 patterns of eight elements with two in each row and each column: what a TILE pruning chooses among
PAIRS = [np.array([i in pair for i in range(4)]) for pair in itertools.combinations(range(4), 2)]
TILES = np.array([np.stack(rows) for rows in itertools.product(PAIRS, repeat=4)
                  if (np.stack(rows).sum(axis=0) == 2).all()], dtype=np.float64)


def refuse(outcome: str, message: str) -> errors.CudaError:
    return errors.library_error("cusparseLt", outcome, message)


@dataclass
class LtHandle:
    pass


@dataclass
class Mat:
    rows: int
    cols: int
    ld: int
    value_type: int
    order: int
    structured: bool
    attributes: dict[int, bytes] = field(default_factory=dict)


@dataclass
class Matmul:
    op_a: int
    op_b: int
    a: Mat
    b: Mat
    c: Mat
    d: Mat
    compute: int
    attributes: dict[int, bytes] = field(default_factory=dict)

    @property
    def sparse(self) -> tuple[Mat, bool, int]:
        """The structured operand, whether it is A, and its operation."""
        return (self.a, True, self.op_a) if self.a.structured else (self.b, False, self.op_b)


@dataclass
class AlgSelection:
    matmul: Matmul
    settings: dict[int, int] = field(default_factory=lambda: dict(ALG_DEFAULTS))


@dataclass
class Plan:
    matmul: Matmul
    alg: AlgSelection


class SimSparseLt:
    """The cuSPARSELt families the call table forwards, over the sim's `memory`."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory

    # ---- objects --------------------------------------------------------------------------------------
    def cusparseLtInit(self) -> tuple[LtHandle]:
        return (LtHandle(),)

    def cusparseLtDestroy(self, handle: LtHandle) -> None:
        pass

    def cusparseLtDenseDescriptorInit(self, handle: LtHandle, rows: int, cols: int, ld: int, alignment: int,
                                      value_type: int, order: int) -> tuple[Mat]:
        return (_mat(rows, cols, ld, value_type, order, False),)

    def cusparseLtStructuredDescriptorInit(self, handle: LtHandle, rows: int, cols: int, ld: int, alignment: int,
                                           value_type: int, order: int, sparsity: int) -> tuple[Mat]:
        if sparsity != ENUMS["CUSPARSELT_SPARSITY_50_PERCENT"]:
            raise refuse("invalid_value", f"sparsity {sparsity}")
        return (_mat(rows, cols, ld, value_type, order, True),)

    def cusparseLtMatDescriptorDestroy(self, mat: Mat) -> None:
        pass

    def cusparseLtMatDescSetAttribute(self, handle: LtHandle, mat: Mat, attribute: int, data: bytes,
                                      size: int) -> None:
        mat.attributes[attribute] = bytes(data or b"")

    def cusparseLtMatDescGetAttribute(self, handle: LtHandle, mat: Mat, attribute: int, size: int) -> tuple[bytes]:
        default = (1 if attribute == NUM_BATCHES else 0).to_bytes(8, "little")
        return (mat.attributes.get(attribute, default)[:size].ljust(size, b"\0"),)

    def cusparseLtMatmulDescriptorInit(self, handle: LtHandle, op_a: int, op_b: int, a: Mat, b: Mat, c: Mat,
                                       d: Mat, compute: int) -> tuple[Matmul]:
        if a is None or b is None or c is None or d is None or a.structured == b.structured \
                or c.structured or d.structured:
            raise refuse("invalid_value", "a matmul descriptor needs four matrices, one of A and B structured")
        if compute not in COMPUTES or op_a not in (OP_N, OP_T) or op_b not in (OP_N, OP_T):
            raise refuse("invalid_value", f"compute type {compute}, operations {op_a} and {op_b}")
        (m, k), (k2, n) = _shape(a, op_a), _shape(b, op_b)
        if k != k2 or (c.rows, c.cols) != (m, n) or (d.rows, d.cols) != (m, n):
            raise refuse("invalid_value", f"op(A) {m}x{k} op(B) {k2}x{n} into C {c.rows}x{c.cols}, "
                         f"D {d.rows}x{d.cols}")
        return (Matmul(op_a, op_b, a, b, c, d, compute),)

    def cusparseLtMatmulDescSetAttribute(self, handle: LtHandle, matmul: Matmul, attribute: int, data: bytes,
                                         size: int) -> None:
        matmul.attributes[attribute] = bytes(data or b"")

    def cusparseLtMatmulDescGetAttribute(self, handle: LtHandle, matmul: Matmul, attribute: int,
                                         size: int) -> tuple[bytes]:
        return (matmul.attributes.get(attribute, b"")[:size].ljust(size, b"\0"),)

    def cusparseLtMatmulAlgSelectionInit(self, handle: LtHandle, matmul: Matmul, alg: int) -> tuple[AlgSelection]:
        if matmul is None or alg != ENUMS["CUSPARSELT_MATMUL_ALG_DEFAULT"]:
            raise refuse("invalid_value", f"algorithm {alg}")
        return (AlgSelection(matmul),)

    def cusparseLtMatmulAlgSelectionDestroy(self, alg: AlgSelection) -> None:
        pass

    def cusparseLtMatmulAlgSetAttribute(self, handle: LtHandle, alg: AlgSelection, attribute: int, data: bytes,
                                        size: int) -> None:
        if attribute not in ALG_DEFAULTS or attribute == CONFIG_MAX_ID or len(data or b"") < 4:
            raise refuse("invalid_value", f"algorithm attribute {attribute} of {len(data or b'')} bytes")
        value = int.from_bytes(bytes(data)[:4], "little", signed=True)
        if attribute == CONFIG_ID and not 0 <= value < ALG_DEFAULTS[CONFIG_MAX_ID]:
            raise refuse("invalid_value", f"algorithm id {value}: the sim has one, 0")
        alg.settings[attribute] = value

    def cusparseLtMatmulAlgGetAttribute(self, handle: LtHandle, alg: AlgSelection, attribute: int,
                                        size: int) -> tuple[bytes]:
        if attribute not in alg.settings:
            raise refuse("invalid_value", f"algorithm attribute {attribute}")
        return (alg.settings[attribute].to_bytes(4, "little", signed=True)[:size].ljust(size, b"\0"),)

    def cusparseLtMatmulPlanInit(self, handle: LtHandle, matmul: Matmul, alg: AlgSelection) -> tuple[Plan]:
        if matmul is None or alg is None:
            raise refuse("invalid_value", "a plan needs a matmul descriptor and an algorithm selection")
        return (Plan(matmul, alg),)

    def cusparseLtMatmulPlanDestroy(self, plan: Plan) -> None:
        pass

    def cusparseLtMatmulGetWorkspace(self, handle: LtHandle, plan: Plan) -> tuple[int]:
        return (0,)

    # ---- memory ---------------------------------------------------------------------------------------
    def matrix(self, mat: Mat, address: int, writable: bool = False) -> np.ndarray:
        """(rows, cols) view of a dense matrix's storage."""
        storage = STORAGE[mat.value_type]
        if not mat.rows or not mat.cols:
            return np.zeros((mat.rows, mat.cols), storage)
        lead, minor = (mat.cols, mat.rows) if mat.order == ORDER_ROW else (mat.rows, mat.cols)
        span = (minor - 1) * mat.ld + lead
        flat = np.frombuffer(self.memory.view(address, span * storage.itemsize), storage)
        size = storage.itemsize
        steps = (mat.ld * size, size) if mat.order == ORDER_ROW else (size, mat.ld * size)
        return np.lib.stride_tricks.as_strided(flat, (mat.rows, mat.cols), steps, writeable=writable)

    def oriented(self, mat: Mat, sparse_a: bool, op: int, address: int, writable: bool = False) -> np.ndarray:
        """The structured operand with its groups' dimension k last: op(A), or op(B) transposed."""
        view = self.matrix(mat, address, writable)
        view = view.T if op == OP_T else view
        return view if sparse_a else view.T

    def compressed(self, mat: Mat, sparse_a: bool, op: int, address: int) -> np.ndarray:
        """The oriented operand (p, k) rebuilt from the sim's compressed form at `address`."""
        p, k = _oriented_shape(mat, sparse_a, op)
        storage = STORAGE[mat.value_type]
        groups = p * k // 4
        raw = np.frombuffer(self.memory.view(address, compressed_size(mat)), np.uint8)
        values = raw[: 2 * groups * storage.itemsize].view(storage).reshape(groups, 2)
        codes = np.repeat(raw[2 * groups * storage.itemsize:], 2)[:groups]
        codes = np.where(np.arange(groups) % 2 == 0, codes & 0xF, codes >> 4)
        out = np.zeros((groups, 4), storage)
        rows = np.arange(groups)
        out[rows, codes & 3] = values[:, 0]
        out[rows, (codes >> 2) & 3] = values[:, 1]
        return out.reshape(p, k)

    # ---- pruning and compression ----------------------------------------------------------------------
    def cusparseLtSpMMAPrune(self, handle: LtHandle, matmul: Matmul, d_in: int, d_out: int, alg: int,
                             stream: Any) -> None:
        mat, sparse_a, op = matmul.sparse
        self.prune(mat, sparse_a, op, d_in, d_out, alg)

    def cusparseLtSpMMAPrune2(self, handle: LtHandle, mat: Mat, sparse_a: int, op: int, d_in: int, d_out: int,
                              alg: int, stream: Any) -> None:
        self.prune(_structured(mat), bool(sparse_a), op, d_in, d_out, alg)

    def prune(self, mat: Mat, sparse_a: bool, op: int, d_in: int, d_out: int, alg: int) -> None:
        dense = np.array(self.oriented(mat, sparse_a, op, d_in))
        p, k = _groups_along(dense)
        magnitude = np.abs(_as_float(dense, mat.value_type)).astype(np.float64)
        if alg == STRIP:
            order = np.argsort(-magnitude.reshape(p, k // 4, 4), axis=2, kind="stable")[..., :2]
            keep = np.zeros((p, k // 4, 4), bool)
            np.put_along_axis(keep, order, True, axis=2)
        elif alg == TILE:
            if p % 4:
                raise refuse("invalid_value", f"a TILE pruning of {p} rows (a multiple of 4 is needed)")
            tiles = magnitude.reshape(p // 4, 4, k // 4, 4).transpose(0, 2, 1, 3)
            best = np.einsum("abij,tij->abt", tiles, TILES).argmax(axis=2)
            keep = TILES[best].astype(bool).transpose(0, 2, 1, 3)
        else:
            raise refuse("invalid_value", f"pruning algorithm {alg}")
        self.oriented(mat, sparse_a, op, d_out, writable=True)[...] = np.where(keep.reshape(p, k), dense, 0)

    def cusparseLtSpMMAPruneCheck(self, handle: LtHandle, matmul: Matmul, d_in: int, valid: int,
                                  stream: Any) -> None:
        mat, sparse_a, op = matmul.sparse
        self.prune_check(mat, sparse_a, op, d_in, valid)

    def cusparseLtSpMMAPruneCheck2(self, handle: LtHandle, mat: Mat, sparse_a: int, op: int, d_in: int,
                                   valid: int, stream: Any) -> None:
        self.prune_check(_structured(mat), bool(sparse_a), op, d_in, valid)

    def prune_check(self, mat: Mat, sparse_a: bool, op: int, d_in: int, valid: int) -> None:
        dense = self.oriented(mat, sparse_a, op, d_in)
        p, k = _groups_along(dense)
        wrong = (dense.reshape(p, k // 4, 4) != 0).sum(axis=2).max(initial=0) > 2
        self.memory.view(valid, 4)[:] = struct.pack("<i", int(wrong))

    def cusparseLtSpMMACompressedSize(self, handle: LtHandle, plan: Plan) -> tuple[int, int]:
        return compressed_size(plan.matmul.sparse[0]), 0

    def cusparseLtSpMMACompressedSize2(self, handle: LtHandle, mat: Mat) -> tuple[int, int]:
        return compressed_size(_structured(mat)), 0

    def cusparseLtSpMMACompress(self, handle: LtHandle, plan: Plan, d_dense: int, d_compressed: int,
                                buffer: int, stream: Any) -> None:
        mat, sparse_a, op = plan.matmul.sparse
        self.compress(mat, sparse_a, op, d_dense, d_compressed)

    def cusparseLtSpMMACompress2(self, handle: LtHandle, mat: Mat, sparse_a: int, op: int, d_dense: int,
                                 d_compressed: int, buffer: int, stream: Any) -> None:
        self.compress(_structured(mat), bool(sparse_a), op, d_dense, d_compressed)

    def compress(self, mat: Mat, sparse_a: bool, op: int, d_dense: int, d_compressed: int) -> None:
        dense = self.oriented(mat, sparse_a, op, d_dense)
        p, k = _groups_along(dense)
        strips = np.array(dense).reshape(p * k // 4, 4)
        magnitude = np.abs(_as_float(strips, mat.value_type))
        kept = np.sort(np.argsort(-magnitude, axis=1, kind="stable")[:, :2], axis=1)
        values = np.take_along_axis(strips, kept, axis=1)
        codes = (kept[:, 0] | kept[:, 1] << 2).astype(np.uint8)
        if len(codes) % 2:
            codes = np.append(codes, np.uint8(0))
        meta = codes[0::2] | codes[1::2] << 4
        out = np.frombuffer(self.memory.view(d_compressed, compressed_size(mat)), np.uint8)
        data = values.tobytes()
        out[: len(data)] = np.frombuffer(data, np.uint8)
        out[len(data):] = meta

    # ---- products -------------------------------------------------------------------------------------
    def cusparseLtMatmul(self, handle: LtHandle, plan: Plan, alpha: bytes, d_a: int, d_b: int, beta: bytes,
                         d_c: int, d_d: int, workspace: int, streams: bytes | None, count: int) -> None:
        self.product(plan.matmul, alpha, d_a, d_b, beta, d_c, d_d)

    def cusparseLtMatmulSearch(self, handle: LtHandle, plan: Plan, alpha: bytes, d_a: int, d_b: int, beta: bytes,
                               d_c: int, d_d: int, workspace: int, streams: bytes | None, count: int) -> None:
        self.product(plan.matmul, alpha, d_a, d_b, beta, d_c, d_d)  # one algorithm: the plan keeps it

    def product(self, mm: Matmul, alpha: bytes, d_a: int, d_b: int, beta: bytes, d_c: int, d_d: int) -> None:
        self.supported(mm)
        integer = mm.compute == COMPUTE_32I
        compute = np.int64 if integer else np.float32
        a = self.operand(mm.a, True, mm.op_a, d_a).astype(compute)
        b = self.operand(mm.b, False, mm.op_b, d_b).astype(compute)
        (alpha_value,), (beta_value,) = struct.unpack("<f", bytes(alpha)), struct.unpack("<f", bytes(beta))
        result = np.float32(alpha_value) * (a @ b).astype(np.float32)
        if beta_value != 0:
            result = result + np.float32(beta_value) * _as_float(np.array(self.matrix(mm.c, d_c)), mm.c.value_type)
        bias = int.from_bytes(mm.attributes.get(BIAS_POINTER, b"")[:8].ljust(8, b"\0"), "little")
        if bias:
            bias_type = mm.d.value_type if mm.d.value_type in (R_16F, R_16BF, R_32F) else R_32F
            raw = np.frombuffer(self.memory.view(bias, mm.d.rows * STORAGE[bias_type].itemsize), STORAGE[bias_type])
            result = result + _as_float(raw, bias_type)[:, None]
        result = self.activation(mm, result)
        self.matrix(mm.d, d_d, writable=True)[...] = _stored(result, mm.d.value_type)

    def operand(self, mat: Mat, is_a: bool, op: int, address: int) -> np.ndarray:
        """op(A) or op(B) as values: the structured one from its compressed form."""
        if mat.structured:
            oriented = self.compressed(mat, is_a, op, address)
            values = _as_float(oriented, mat.value_type) if mat.value_type != R_8I else oriented
            return values if is_a else values.T
        view = self.matrix(mat, address)
        values = _as_float(np.array(view), mat.value_type) if mat.value_type != R_8I else np.array(view)
        return values.T if op == OP_T else values

    def supported(self, mm: Matmul) -> None:
        for mat in (mm.a, mm.b, mm.c, mm.d):
            if int.from_bytes(mat.attributes.get(NUM_BATCHES, b"\1")[:4].ljust(4, b"\0"), "little") > 1:
                raise refuse("not_supported", "batched products on the sim")
        for attribute in (GELU, *VECTOR_SCALING):
            if int.from_bytes(mm.attributes.get(attribute, b"")[:4].ljust(4, b"\0"), "little"):
                raise refuse("not_supported", f"matmul attribute {attribute} on the sim")

    def activation(self, mm: Matmul, result: np.ndarray) -> np.ndarray:
        if not int.from_bytes(mm.attributes.get(RELU, b"")[:4].ljust(4, b"\0"), "little"):
            return result
        upper = mm.attributes.get(RELU_UPPERBOUND)
        threshold = mm.attributes.get(RELU_THRESHOLD)
        low = struct.unpack("<f", threshold[:4])[0] if threshold and len(threshold) >= 4 else 0.0
        result = np.where(result > low, result, 0).astype(np.float32)
        if upper and len(upper) >= 4:
            result = np.minimum(result, struct.unpack("<f", upper[:4])[0])
        return result


def _mat(rows: int, cols: int, ld: int, value_type: int, order: int, structured: bool) -> Mat:
    lead = cols if order == ORDER_ROW else rows
    if value_type not in STORAGE or order not in (ORDER_ROW, ORDER_COL) or min(rows, cols) < 0 or ld < max(lead, 1):
        raise refuse("invalid_value", f"a {rows}x{cols} matrix of type {value_type}, order {order}, ld {ld}")
    if structured and value_type == R_32I:
        raise refuse("not_supported", "a structured matrix of int32")
    return Mat(rows, cols, ld, value_type, order, structured)


def _structured(mat: Mat) -> Mat:
    if mat is None or not mat.structured:
        raise refuse("invalid_value", "a structured matrix descriptor is needed")
    return mat


def _shape(mat: Mat, op: int) -> tuple[int, int]:
    return (mat.cols, mat.rows) if op == OP_T else (mat.rows, mat.cols)


def _oriented_shape(mat: Mat, sparse_a: bool, op: int) -> tuple[int, int]:
    rows, cols = _shape(mat, op)
    return (rows, cols) if sparse_a else (cols, rows)


def _groups_along(oriented: np.ndarray) -> tuple[int, int]:
    p, k = oriented.shape
    if k % 4:
        raise refuse("invalid_value", f"a structured operand whose inner dimension k = {k} is no multiple of 4")
    return p, k


def compressed_size(mat: Mat) -> int:
    """Bytes of the sim's compressed form: half the values, and 4 bits of metadata per strip of four."""
    count = mat.rows * mat.cols
    if count % 4:
        raise refuse("invalid_value", f"a {mat.rows}x{mat.cols} structured matrix (strips of four)")
    return count // 2 * STORAGE[mat.value_type].itemsize + math.ceil(count // 4 / 2)


def _as_float(values: np.ndarray, value_type: int) -> np.ndarray:
    if value_type == R_16BF:
        return bf16_to_f32(np.ascontiguousarray(values))
    return values.astype(np.float32)


def _stored(values: np.ndarray, value_type: int) -> np.ndarray:
    if value_type == R_16BF:
        return f32_to_bf16(np.ascontiguousarray(values, np.float32))
    if value_type in (R_8I, R_32I):
        info = np.iinfo(STORAGE[value_type])
        return np.clip(np.rint(values), info.min, info.max).astype(STORAGE[value_type])
    return values.astype(STORAGE[value_type])
