"""cuSPARSE on the sim device: the generic API's products computed with numpy over the sim's memory.

A descriptor is what its creation named: sizes, index and value types, and the device addresses of its arrays
(read when an operation runs, as cuSPARSE reads them). CSR, CSC and COO sparse matrices, with strided batches;
dense matrices of either order, with strided batches; dense vectors. SpMM (C = alpha op(A) op(B) + beta C),
SpMV (y = alpha op(A) x + beta y) and SDDMM (C = alpha (op(A) op(B)) at C's pattern + beta C) of real and complex
fp32/fp64 data, and fp16/bf16 data computed in fp32. The legacy API's Xcoo2csr (PyTorch's COO products convert
their row indices with it). Results match a GPU's to the summation order, not bit for bit. SpGEMM, the
triangular solves and the rest of the legacy API are forwarded to a GPU server only: here they answer
NOT_SUPPORTED.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpuremote.protocol import errors, mathlibs

from .sim_blas import bf16_to_f32, f32_to_bf16

ENUMS = mathlibs.api(mathlibs.CUSPARSE).ENUMS
R_16F, R_16BF, R_32F, R_64F, C_32F, C_64F = (ENUMS[f"CUDA_{t}"] for t in ("R_16F", "R_16BF", "R_32F", "R_64F",
                                                                           "C_32F", "C_64F"))
STORAGE = {R_32F: np.dtype("<f4"), R_64F: np.dtype("<f8"), R_16F: np.dtype("<f2"), R_16BF: np.dtype("<u2"),
           C_32F: np.dtype("<c8"), C_64F: np.dtype("<c16")}
COMPUTE = {R_32F: np.float32, R_64F: np.float64, R_16F: np.float32, R_16BF: np.float32, C_32F: np.complex64,
           C_64F: np.complex128}
SCALAR_FORMATS = {R_32F: "<f", R_64F: "<d", R_16F: "<e", C_32F: "<2f", C_64F: "<2d"}
INDEX = {ENUMS["CUSPARSE_INDEX_16U"]: np.dtype("<u2"), ENUMS["CUSPARSE_INDEX_32I"]: np.dtype("<i4"),
         ENUMS["CUSPARSE_INDEX_64I"]: np.dtype("<i8")}
CSR, CSC, COO = (ENUMS[f"CUSPARSE_FORMAT_{f}"] for f in ("CSR", "CSC", "COO"))
OP_N, OP_T, OP_C = (ENUMS[f"CUSPARSE_OPERATION_{o}"] for o in ("NON_TRANSPOSE", "TRANSPOSE", "CONJUGATE_TRANSPOSE"))
ORDER_COL, ORDER_ROW = ENUMS["CUSPARSE_ORDER_COL"], ENUMS["CUSPARSE_ORDER_ROW"]


def refuse(outcome: str, message: str) -> errors.CudaError:
    return errors.library_error("cusparse", outcome, message)


@dataclass
class SparseHandle:
    stream: Any = None
    pointer_mode: int = 0


@dataclass
class SpMat:
    """A sparse matrix as its creation named it: `major` holds CSR's row offsets, CSC's column offsets or COO's
    row indices; `minor` the column (CSR, COO) or row (CSC) indices."""

    format: int
    rows: int
    cols: int
    nnz: int
    major: int
    minor: int
    values: int
    major_type: int
    minor_type: int
    base: int
    value_type: int
    batch: int = 1
    major_stride: int = 0  # elements between batches: offsets (CSR/CSC) or indices (COO)
    minor_stride: int = 0  # elements between batches of the indices and values
    attributes: dict[int, bytes] = field(default_factory=dict)


@dataclass
class DnMat:
    rows: int
    cols: int
    ld: int
    values: int
    value_type: int
    order: int
    batch: int = 1
    stride: int = 0


@dataclass
class DnVec:
    size: int
    values: int
    value_type: int


@dataclass
class MatDescr:
    """The legacy API's matrix descriptor: its settings, kept."""

    settings: dict[str, int] = field(default_factory=dict)


class SimSparse:
    """The cuSPARSE families the call table forwards, over the sim's `memory`."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory

    # ---- memory ----------------------------------------------------------------------------------
    def array(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        if count <= 0:
            return np.zeros(0, dtype)
        return np.frombuffer(self.memory.view(ptr, count * dtype.itemsize), dtype)

    def dense(self, m: DnMat, writable: bool = False) -> np.ndarray:
        """(batch, rows, cols) view of a dense matrix's storage."""
        storage = _storage(m.value_type)
        lead = m.rows if m.order == ORDER_COL else m.cols
        if min(m.rows, m.cols, m.batch) < 0 or m.ld < max(lead, 1) or m.order not in (ORDER_COL, ORDER_ROW):
            raise refuse("invalid_value", f"a {m.rows}x{m.cols} dense matrix with ld {m.ld}, order {m.order}")
        if not m.rows or not m.cols:
            return np.zeros((m.batch, m.rows, m.cols), storage)
        minor = m.cols if m.order == ORDER_COL else m.rows
        span = (m.batch - 1) * m.stride + (minor - 1) * m.ld + lead
        flat = self.array(m.values, storage, span)
        size = storage.itemsize
        steps = (size, m.ld * size) if m.order == ORDER_COL else (m.ld * size, size)
        return np.lib.stride_tricks.as_strided(flat, (m.batch, m.rows, m.cols), (m.stride * size, *steps),
                                               writeable=writable)

    def load(self, m: DnMat, compute: type) -> np.ndarray:
        raw = self.dense(m)
        return (bf16_to_f32(raw) if m.value_type == R_16BF else raw).astype(compute)

    def store(self, m: DnMat, values: np.ndarray) -> None:
        out = self.dense(m, writable=True)
        out[...] = _stored(values, m.value_type)

    def vector(self, v: DnVec, compute: type) -> np.ndarray:
        raw = self.array(v.values, _storage(v.value_type), v.size)
        return (bf16_to_f32(raw) if v.value_type == R_16BF else raw).astype(compute)

    def sparse(self, a: SpMat, compute: type) -> np.ndarray:
        """(batch, rows, cols) dense copy of a sparse matrix (duplicate entries add up, as in a product)."""
        out = np.zeros((a.batch, a.rows, a.cols), compute)
        for b in range(a.batch):
            rows, cols, values = self.entries(a, b)
            np.add.at(out[b], (rows, cols), values.astype(compute))
        return out

    def entries(self, a: SpMat, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Batch b's (row, column, value) of each stored entry, indices zero-based."""
        major_type, minor_type = _index(a.major_type), _index(a.minor_type)
        raw = self.array(a.values + b * a.minor_stride * _storage(a.value_type).itemsize, _storage(a.value_type),
                         a.nnz)
        values = bf16_to_f32(raw) if a.value_type == R_16BF else raw
        minor = self.array(a.minor + b * a.minor_stride * minor_type.itemsize, minor_type, a.nnz).astype(np.int64)
        if a.format == COO:
            major = self.array(a.major + b * a.major_stride * major_type.itemsize, major_type, a.nnz).astype(np.int64)
            rows, cols = major - a.base, minor - a.base
        else:
            lines = a.rows if a.format == CSR else a.cols
            offsets = self.array(a.major + b * a.major_stride * major_type.itemsize, major_type, lines + 1)
            counts = np.diff(offsets.astype(np.int64))
            if (counts < 0).any() or offsets[-1] - offsets[0] > a.nnz:
                raise refuse("invalid_value", f"offsets of a {a.rows}x{a.cols} matrix of {a.nnz} entries")
            start = int(offsets[0]) - a.base
            line = np.repeat(np.arange(lines), counts)
            minor, values = minor[start:start + len(line)] - a.base, values[start:start + len(line)]
            rows, cols = (line, minor) if a.format == CSR else (minor, line)
        if len(rows) and (rows.min() < 0 or rows.max() >= a.rows or cols.min() < 0 or cols.max() >= a.cols):
            raise refuse("invalid_value", f"an index outside the {a.rows}x{a.cols} sparse matrix")
        return rows, cols, values

    def scalar(self, handle: SparseHandle, value: Any, compute_type: int) -> complex | float:
        """alpha/beta: the bytes themselves (host pointer mode) or a device address."""
        fmt = SCALAR_FORMATS.get(compute_type)
        if fmt is None:
            raise refuse("not_supported", f"compute type {compute_type} on the sim device")
        size = struct.calcsize(fmt)
        raw = bytes(self.memory.read(value, size)) if isinstance(value, int) else bytes(value or b"")
        if len(raw) != size:
            raise refuse("invalid_value", f"a scalar of {len(raw)} bytes for compute type {compute_type}")
        parts = struct.unpack(fmt, raw)
        return complex(*parts) if len(parts) == 2 else parts[0]

    # ---- the handle ----------------------------------------------------------------------------
    def cusparseCreate(self) -> tuple[SparseHandle]:
        return (SparseHandle(),)

    def cusparseDestroy(self, handle: SparseHandle) -> None:
        pass

    def cusparseSetStream(self, handle: SparseHandle, stream: Any) -> None:
        handle.stream = stream

    def cusparseSetPointerMode(self, handle: SparseHandle, mode: int) -> None:
        handle.pointer_mode = mode

    # ---- descriptors ---------------------------------------------------------------------------
    def cusparseCreateCsr(self, rows: int, cols: int, nnz: int, offsets: int, columns: int, values: int,
                          offset_type: int, index_type: int, base: int, value_type: int) -> tuple[SpMat]:
        return (_made(SpMat(CSR, rows, cols, nnz, offsets, columns, values, offset_type, index_type, base,
                            value_type)),)

    def cusparseCreateCsc(self, rows: int, cols: int, nnz: int, offsets: int, row_indices: int, values: int,
                          offset_type: int, index_type: int, base: int, value_type: int) -> tuple[SpMat]:
        return (_made(SpMat(CSC, rows, cols, nnz, offsets, row_indices, values, offset_type, index_type, base,
                            value_type)),)

    def cusparseCreateCoo(self, rows: int, cols: int, nnz: int, row_indices: int, col_indices: int, values: int,
                          index_type: int, base: int, value_type: int) -> tuple[SpMat]:
        return (_made(SpMat(COO, rows, cols, nnz, row_indices, col_indices, values, index_type, index_type, base,
                            value_type)),)

    cusparseCreateConstCsr, cusparseCreateConstCsc = cusparseCreateCsr, cusparseCreateCsc
    cusparseCreateConstCoo = cusparseCreateCoo

    def cusparseDestroySpMat(self, mat: SpMat) -> None:
        pass

    def _set_pointers(self, mat: SpMat, major: int, minor: int, values: int) -> None:
        mat.major, mat.minor, mat.values = major, minor, values

    cusparseCsrSetPointers = cusparseCscSetPointers = cusparseCooSetPointers = _set_pointers

    def cusparseCsrSetStridedBatch(self, mat: SpMat, count: int, offsets_stride: int, stride: int) -> None:
        mat.batch, mat.major_stride, mat.minor_stride = _batch(count), offsets_stride, stride

    def cusparseCooSetStridedBatch(self, mat: SpMat, count: int, stride: int) -> None:
        mat.batch, mat.major_stride, mat.minor_stride = _batch(count), stride, stride

    def cusparseSpMatSetAttribute(self, mat: SpMat, attribute: int, data: bytes, size: int) -> None:
        """Fill mode and diagonal type: what a triangular solve reads; a product ignores them."""
        mat.attributes[attribute] = bytes(data or b"")

    def cusparseSpMatGetSize(self, mat: SpMat) -> tuple[int, int, int]:
        return mat.rows, mat.cols, mat.nnz

    def cusparseCreateDnMat(self, rows: int, cols: int, ld: int, values: int, value_type: int,
                            order: int) -> tuple[DnMat]:
        _storage(value_type)
        return (DnMat(rows, cols, ld, values, value_type, order),)

    cusparseCreateConstDnMat = cusparseCreateDnMat

    def cusparseDestroyDnMat(self, mat: DnMat) -> None:
        pass

    def cusparseDnMatSetStridedBatch(self, mat: DnMat, count: int, stride: int) -> None:
        mat.batch, mat.stride = _batch(count), stride

    def cusparseCreateDnVec(self, size: int, values: int, value_type: int) -> tuple[DnVec]:
        _storage(value_type)
        if size < 0:
            raise refuse("invalid_value", f"a dense vector of {size} elements")
        return (DnVec(size, values, value_type),)

    cusparseCreateConstDnVec = cusparseCreateDnVec

    def cusparseDestroyDnVec(self, vec: DnVec) -> None:
        pass

    # ---- products ------------------------------------------------------------------------------
    def _no_buffer(self, *args: Any) -> tuple[int]:
        """The sim computes without a workspace."""
        return (0,)

    cusparseSpMM_bufferSize = cusparseSpMV_bufferSize = cusparseSDDMM_bufferSize = _no_buffer

    def _nothing(self, *args: Any) -> None:
        """A preprocessing step: nothing to prepare on the sim."""

    cusparseSpMM_preprocess = cusparseSDDMM_preprocess = _nothing

    def cusparseSpMM(self, handle: SparseHandle, op_a: int, op_b: int, alpha: Any, a: SpMat, b: DnMat, beta: Any,
                     c: DnMat, compute_type: int, alg: int, buffer: int) -> None:
        compute = _compute(compute_type)
        alpha, beta = self.scalar(handle, alpha, compute_type), self.scalar(handle, beta, compute_type)
        product = _op(self.sparse(a, compute), op_a) @ _op(self.load(b, compute), op_b)
        if product.shape[1:] != (c.rows, c.cols) or c.batch not in (1, product.shape[0]):
            raise refuse("invalid_value", f"SpMM: op(A) op(B) is {product.shape[1]}x{product.shape[2]} in "
                         f"{product.shape[0]} batches, C {c.rows}x{c.cols} in {c.batch}")
        result = alpha * product
        if beta != 0:
            result = result + beta * self.load(c, compute)
        self.store(c, np.broadcast_to(result, (c.batch, c.rows, c.cols)))

    def cusparseSpMV(self, handle: SparseHandle, op_a: int, alpha: Any, a: SpMat, x: DnVec, beta: Any, y: DnVec,
                     compute_type: int, alg: int, buffer: int) -> None:
        compute = _compute(compute_type)
        alpha, beta = self.scalar(handle, alpha, compute_type), self.scalar(handle, beta, compute_type)
        if a.batch != 1:
            raise refuse("not_supported", "SpMV of a batched sparse matrix")
        matrix = _op(self.sparse(a, compute), op_a)[0]
        if matrix.shape != (y.size, x.size):
            raise refuse("invalid_value", f"SpMV: op(A) is {matrix.shape[0]}x{matrix.shape[1]}, x has {x.size} "
                         f"elements, y {y.size}")
        result = alpha * (matrix @ self.vector(x, compute))
        if beta != 0:
            result = result + beta * self.vector(y, compute)
        self.array(y.values, _storage(y.value_type), y.size)[...] = _stored(result, y.value_type)

    def cusparseSDDMM(self, handle: SparseHandle, op_a: int, op_b: int, alpha: Any, a: DnMat, b: DnMat, beta: Any,
                      c: SpMat, compute_type: int, alg: int, buffer: int) -> None:
        """C's stored values = alpha (op(A) op(B)) at C's entries + beta C's values."""
        if c.format not in (CSR, COO):
            raise refuse("not_supported", "SDDMM into a CSC matrix on the sim device")
        compute = _compute(compute_type)
        alpha, beta = self.scalar(handle, alpha, compute_type), self.scalar(handle, beta, compute_type)
        product = _op(self.load(a, compute), op_a) @ _op(self.load(b, compute), op_b)
        storage = _storage(c.value_type)
        for batch in range(c.batch):
            rows, cols, values = self.entries(c, batch)
            result = alpha * product[min(batch, product.shape[0] - 1)][rows, cols]
            if beta != 0:
                result = result + beta * values.astype(compute)
            at = c.values + batch * c.minor_stride * storage.itemsize
            start = 0 if c.format == COO else self._first_entry(c, batch)
            self.array(at + start * storage.itemsize, storage, len(rows))[...] = _stored(result, c.value_type)

    def _first_entry(self, c: SpMat, batch: int) -> int:
        major_type = _index(c.major_type)
        return int(self.array(c.major + batch * c.major_stride * major_type.itemsize, major_type, 1)[0]) - c.base

    # ---- the legacy API ------------------------------------------------------------------------
    def cusparseCreateMatDescr(self) -> tuple[MatDescr]:
        return (MatDescr(),)

    def cusparseDestroyMatDescr(self, descr: MatDescr) -> None:
        pass

    def cusparseSetMatType(self, descr: MatDescr, value: int) -> None:
        descr.settings["type"] = value

    def cusparseSetMatFillMode(self, descr: MatDescr, value: int) -> None:
        descr.settings["fill"] = value

    def cusparseSetMatDiagType(self, descr: MatDescr, value: int) -> None:
        descr.settings["diag"] = value

    def cusparseSetMatIndexBase(self, descr: MatDescr, value: int) -> None:
        descr.settings["base"] = value

    def cusparseXcoo2csr(self, handle: SparseHandle, rows_ptr: int, nnz: int, m: int, offsets_ptr: int,
                         base: int) -> None:
        """CSR row offsets from sorted COO row indices (int32)."""
        if nnz < 0 or m < 0:
            raise refuse("invalid_value", f"Xcoo2csr of {nnz} entries, {m} rows")
        rows = self.array(rows_ptr, np.dtype("<i4"), nnz).astype(np.int64) - base
        if len(rows) and (rows.min() < 0 or rows.max() >= m or (np.diff(rows) < 0).any()):
            raise refuse("invalid_value", "Xcoo2csr: row indices unsorted or outside the matrix")
        offsets = np.searchsorted(rows, np.arange(m + 1), side="left") + base
        self.array(offsets_ptr, np.dtype("<i4"), m + 1)[...] = offsets


def _storage(value_type: int) -> np.dtype:
    storage = STORAGE.get(value_type)
    if storage is None:
        raise refuse("not_supported", f"data type {value_type} on the sim device")
    return storage


def _compute(compute_type: int) -> type:
    compute = COMPUTE.get(compute_type)
    if compute is None:
        raise refuse("not_supported", f"compute type {compute_type} on the sim device")
    return compute


def _index(index_type: int) -> np.dtype:
    found = INDEX.get(index_type)
    if found is None:
        raise refuse("invalid_value", f"index type {index_type}")
    return found


def _made(mat: SpMat) -> SpMat:
    """A sparse matrix descriptor checked as cuSPARSE checks it at its creation."""
    _storage(mat.value_type)
    _index(mat.major_type)
    _index(mat.minor_type)
    if min(mat.rows, mat.cols, mat.nnz) < 0 or mat.base not in (0, 1):
        raise refuse("invalid_value", f"a {mat.rows}x{mat.cols} sparse matrix of {mat.nnz} entries, base {mat.base}")
    return mat


def _batch(count: int) -> int:
    if count < 1:
        raise refuse("invalid_value", f"a batch of {count}")
    return count


def _op(values: np.ndarray, op: int) -> np.ndarray:
    """op() of a (batch, rows, cols) stack: as it is, transposed or conjugate-transposed."""
    if op == OP_N:
        return values
    if op not in (OP_T, OP_C):
        raise refuse("invalid_value", f"operation {op}")
    flipped = values.transpose(0, 2, 1)
    return flipped.conj() if op == OP_C else flipped


def _stored(values: np.ndarray, value_type: int) -> np.ndarray:
    """Values in a matrix's storage type: rounded once, as a GPU's epilogue does."""
    if value_type == R_16BF:
        return f32_to_bf16(np.asarray(values, np.float32))
    storage = _storage(value_type)
    return np.asarray(values if storage.kind == "c" else np.real(values)).astype(storage)
