"""cuBLAS and cuBLASLt on the sim device: the math done with numpy over the sim's memory.

Column-major as cuBLAS is: a stored matrix of `rows` x `cols` has element (i, j) at
`ptr + (i + j * ld) * size`. fp16, bf16, fp32 and fp64 data; fp16/bf16/fp32 are computed in
fp32 (cuBLAS' CUBLAS_COMPUTE_32F), fp64 in fp64. Results are rounded to the output type once,
as a GPU's epilogue does; they match a GPU's to the accumulation order, not bit for bit.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpuremote.protocol import errors, mathlibs

ENUMS = mathlibs.api(mathlibs.CUBLASLT).ENUMS
R_32F, R_64F, R_16F, R_16BF = (ENUMS[f"CUDA_R_{t}"] for t in ("32F", "64F", "16F", "16BF"))
STORAGE = {R_32F: np.dtype("<f4"), R_64F: np.dtype("<f8"), R_16F: np.dtype("<f2"), R_16BF: np.dtype("<u2")}
OP_N = 0  # cublasOperation_t: N, T, C (conjugate transpose: a plain transpose for real data)
LT = {name: ENUMS[f"CUBLASLT_{name}"] for name in (
    "MATMUL_DESC_TRANSA", "MATMUL_DESC_TRANSB", "MATMUL_DESC_EPILOGUE", "MATMUL_DESC_BIAS_POINTER",
    "MATMUL_DESC_BIAS_DATA_TYPE", "MATMUL_DESC_COMPUTE_TYPE", "MATMUL_DESC_SCALE_TYPE", "MATMUL_DESC_POINTER_MODE",
    "MATRIX_LAYOUT_TYPE", "MATRIX_LAYOUT_ROWS", "MATRIX_LAYOUT_COLS", "MATRIX_LAYOUT_LD", "MATRIX_LAYOUT_ORDER",
    "MATRIX_LAYOUT_BATCH_COUNT", "MATRIX_LAYOUT_STRIDED_BATCH_OFFSET", "EPILOGUE_DEFAULT", "EPILOGUE_RELU",
    "EPILOGUE_BIAS", "EPILOGUE_GELU", "ORDER_COL")}
HEURISTIC = struct.Struct("<64sQif16x")  # cublasLtMatmulHeuristicResult_t: algo, workspace, state, waves


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    return (raw.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # to nearest, ties to even
    return np.where(np.isnan(values), 0x7FC0, rounded).astype(np.uint16)


@dataclass
class BlasHandle:
    stream: Any = None
    pointer_mode: int = 0
    workspace: tuple[int, int] = (0, 0)


@dataclass
class Attributes:
    """A cuBLASLt descriptor: its attributes as the bytes the application set."""

    values: dict[int, bytes] = field(default_factory=dict)

    def get(self, attr: int, fmt: str, default: int) -> int:
        raw = self.values.get(attr)
        return struct.unpack_from(fmt, raw)[0] if raw and len(raw) >= struct.calcsize(fmt) else default


class SimBlas:
    """The cuBLAS and cuBLASLt families the call table forwards, over the sim's `memory`."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory

    # ---- memory as matrices -----------------------------------------------------------------
    def matrix(self, ptr: int, dtype: int, rows: int, cols: int, ld: int, batch: int = 1, stride: int = 0,
               writable: bool = False) -> np.ndarray:
        """(batch, rows, cols) view of column-major matrices in device memory (storage dtype)."""
        storage = STORAGE.get(dtype)
        if storage is None:
            raise errors.library_error("cublas", "not_supported", f"data type {dtype} on the sim device")
        if min(rows, cols, batch) < 0 or (rows and ld < rows):
            raise errors.library_error("cublas", "invalid_value", f"{rows}x{cols} matrix with ld {ld}")
        if not rows or not cols or not batch:
            return np.zeros((batch, rows, cols), storage)
        span = (batch - 1) * stride + (cols - 1) * ld + rows
        flat = np.frombuffer(self.memory.view(ptr, span * storage.itemsize), storage)
        size = storage.itemsize
        view = np.lib.stride_tricks.as_strided(flat, (batch, rows, cols), (stride * size, size, ld * size),
                                               writeable=writable)
        return view

    def load(self, ptr: int, dtype: int, rows: int, cols: int, ld: int, batch: int = 1, stride: int = 0,
             trans: int = OP_N) -> np.ndarray:
        """op(matrix) in the compute type (fp64 for fp64 data, else fp32)."""
        raw = self.matrix(ptr, dtype, *((rows, cols) if trans == OP_N else (cols, rows)), ld, batch, stride)
        values = bf16_to_f32(raw) if dtype == R_16BF else raw.astype(np.float64 if dtype == R_64F else np.float32)
        return values if trans == OP_N else values.transpose(0, 2, 1)

    def store(self, values: np.ndarray, ptr: int, dtype: int, ld: int, stride: int = 0) -> None:
        batch, rows, cols = values.shape
        out = self.matrix(ptr, dtype, rows, cols, ld, batch, stride, writable=True)
        out[...] = f32_to_bf16(values) if dtype == R_16BF else values.astype(STORAGE[dtype])

    def scalar(self, value: Any, dtype: int) -> float:
        """alpha/beta: the bytes themselves (host pointer mode) or a device address."""
        fmt = {R_32F: "<f", R_64F: "<d", R_16F: "<e"}.get(dtype, "<f")
        raw = bytes(self.memory.read(value, struct.calcsize(fmt))) if isinstance(value, int) else bytes(value)
        if len(raw) != struct.calcsize(fmt):
            raise errors.library_error("cublas", "invalid_value", f"a scalar of {len(raw)} bytes")
        return struct.unpack(fmt, raw)[0]

    def gemm(self, ta: int, tb: int, m: int, n: int, k: int, alpha: float, a: tuple, b: tuple, beta: float,
             c: tuple, d: tuple | None = None, batch: int = 1) -> np.ndarray:
        """D = alpha op(A) op(B) + beta C, for (ptr, dtype, ld, stride) operands; returns D before storing."""
        op_a = self.load(a[0], a[1], m, k, a[2], batch, a[3], ta)
        op_b = self.load(b[0], b[1], k, n, b[2], batch, b[3], tb)
        result = alpha * np.matmul(op_a, op_b)
        if beta != 0:
            result = result + beta * self.load(c[0], c[1], m, n, c[2], batch, c[3])
        return result

    # ---- cuBLAS ------------------------------------------------------------------------------
    def cublasCreate(self) -> tuple[BlasHandle]:
        return (BlasHandle(),)

    def cublasDestroy(self, handle: BlasHandle) -> None:
        pass

    def cublasSetStream(self, handle: BlasHandle, stream: Any) -> None:
        handle.stream = stream

    def cublasSetWorkspace(self, handle: BlasHandle, workspace: int, size: int) -> None:
        handle.workspace = (workspace, size)

    def cublasSetPointerMode(self, handle: BlasHandle, mode: int) -> None:
        handle.pointer_mode = mode

    def cublasSetMathMode(self, handle: BlasHandle, mode: int) -> None:
        """Tensor-core and TF32 choices: the sim computes in full fp32 whatever they are."""

    cublasSetAtomicsMode = cublasSetSmCountTarget = cublasSetMathMode

    def _gemm(self, ta: int, tb: int, m: int, n: int, k: int, alpha: Any, a: tuple, b: tuple, beta: Any,
              c: tuple, scalar_type: int, batch: int = 1) -> None:
        alpha, beta = self.scalar(alpha, scalar_type), self.scalar(beta, scalar_type)
        self.store(self.gemm(ta, tb, m, n, k, alpha, a, b, beta, c, batch=batch), c[0], c[1], c[2], c[3])

    def cublasSgemm(self, h: BlasHandle, ta: int, tb: int, m: int, n: int, k: int, alpha: Any, A: int, lda: int,
                    B: int, ldb: int, beta: Any, C: int, ldc: int) -> None:
        self._gemm(ta, tb, m, n, k, alpha, (A, R_32F, lda, 0), (B, R_32F, ldb, 0), beta, (C, R_32F, ldc, 0), R_32F)

    def cublasDgemm(self, h: BlasHandle, ta: int, tb: int, m: int, n: int, k: int, alpha: Any, A: int, lda: int,
                    B: int, ldb: int, beta: Any, C: int, ldc: int) -> None:
        self._gemm(ta, tb, m, n, k, alpha, (A, R_64F, lda, 0), (B, R_64F, ldb, 0), beta, (C, R_64F, ldc, 0), R_64F)

    def cublasSgemmStridedBatched(self, h: BlasHandle, ta: int, tb: int, m: int, n: int, k: int, alpha: Any,
                                  A: int, lda: int, sa: int, B: int, ldb: int, sb: int, beta: Any, C: int, ldc: int,
                                  sc: int, batch: int) -> None:
        self._gemm(ta, tb, m, n, k, alpha, (A, R_32F, lda, sa), (B, R_32F, ldb, sb), beta, (C, R_32F, ldc, sc),
                   R_32F, batch)

    def cublasDgemmStridedBatched(self, h: BlasHandle, ta: int, tb: int, m: int, n: int, k: int, alpha: Any,
                                  A: int, lda: int, sa: int, B: int, ldb: int, sb: int, beta: Any, C: int, ldc: int,
                                  sc: int, batch: int) -> None:
        self._gemm(ta, tb, m, n, k, alpha, (A, R_64F, lda, sa), (B, R_64F, ldb, sb), beta, (C, R_64F, ldc, sc),
                   R_64F, batch)

    def cublasSgemmEx(self, h: BlasHandle, ta: int, tb: int, m: int, n: int, k: int, alpha: Any, A: int, at: int,
                      lda: int, B: int, bt: int, ldb: int, beta: Any, C: int, ct: int, ldc: int) -> None:
        self._gemm(ta, tb, m, n, k, alpha, (A, at, lda, 0), (B, bt, ldb, 0), beta, (C, ct, ldc, 0), R_32F)

    def cublasGemmEx(self, h: BlasHandle, ta: int, tb: int, m: int, n: int, k: int, alpha: Any, A: int, at: int,
                     lda: int, B: int, bt: int, ldb: int, beta: Any, C: int, ct: int, ldc: int, compute: int,
                     algo: int) -> None:
        self._gemm(ta, tb, m, n, k, alpha, (A, at, lda, 0), (B, bt, ldb, 0), beta, (C, ct, ldc, 0),
                   _scalar_type(compute))

    def cublasGemmStridedBatchedEx(self, h: BlasHandle, ta: int, tb: int, m: int, n: int, k: int, alpha: Any,
                                   A: int, at: int, lda: int, sa: int, B: int, bt: int, ldb: int, sb: int, beta: Any,
                                   C: int, ct: int, ldc: int, sc: int, batch: int, compute: int, algo: int) -> None:
        self._gemm(ta, tb, m, n, k, alpha, (A, at, lda, sa), (B, bt, ldb, sb), beta, (C, ct, ldc, sc),
                   _scalar_type(compute), batch)

    def _gemv(self, dtype: int, trans: int, m: int, n: int, alpha: Any, A: int, lda: int, x: int, incx: int,
              beta: Any, y: int, incy: int) -> None:
        if incx <= 0 or incy <= 0:
            raise errors.library_error("cublas", "not_supported", "gemv with non-positive increments on the sim")
        rows_y, rows_x = (m, n) if trans == OP_N else (n, m)
        # a vector with increment inc is a 1 x len matrix with leading dimension inc
        vec_x = self.load(x, dtype, 1, rows_x, incx)[0, 0]
        matrix = self.load(A, dtype, m, n, lda)[0]
        result = self.scalar(alpha, dtype) * ((matrix if trans == OP_N else matrix.T) @ vec_x)
        beta = self.scalar(beta, dtype)
        if beta != 0:
            result = result + beta * self.load(y, dtype, 1, rows_y, incy)[0, 0]
        self.store(result.reshape(1, 1, rows_y), y, dtype, incy)

    def cublasSgemv(self, h: BlasHandle, trans: int, m: int, n: int, alpha: Any, A: int, lda: int, x: int,
                    incx: int, beta: Any, y: int, incy: int) -> None:
        self._gemv(R_32F, trans, m, n, alpha, A, lda, x, incx, beta, y, incy)

    def cublasDgemv(self, h: BlasHandle, trans: int, m: int, n: int, alpha: Any, A: int, lda: int, x: int,
                    incx: int, beta: Any, y: int, incy: int) -> None:
        self._gemv(R_64F, trans, m, n, alpha, A, lda, x, incx, beta, y, incy)

    # ---- cuBLASLt ----------------------------------------------------------------------------
    def cublasLtCreate(self) -> tuple[BlasHandle]:
        return (BlasHandle(),)

    def cublasLtDestroy(self, handle: BlasHandle) -> None:
        pass

    def cublasLtMatmulDescCreate(self, compute: int, scale: int) -> tuple[Attributes]:
        desc = Attributes()
        desc.values[LT["MATMUL_DESC_COMPUTE_TYPE"]] = struct.pack("<i", compute)
        desc.values[LT["MATMUL_DESC_SCALE_TYPE"]] = struct.pack("<i", scale)
        return (desc,)

    def cublasLtMatrixLayoutCreate(self, dtype: int, rows: int, cols: int, ld: int) -> tuple[Attributes]:
        layout = Attributes()
        for name, fmt, value in (("TYPE", "<i", dtype), ("ROWS", "<Q", rows), ("COLS", "<Q", cols), ("LD", "<q", ld)):
            layout.values[LT[f"MATRIX_LAYOUT_{name}"]] = struct.pack(fmt, value)
        return (layout,)

    def cublasLtMatmulPreferenceCreate(self) -> tuple[Attributes]:
        return (Attributes(),)

    def _destroy(self, desc: Attributes) -> None:
        pass

    cublasLtMatmulDescDestroy = cublasLtMatrixLayoutDestroy = cublasLtMatmulPreferenceDestroy = _destroy

    def _set(self, desc: Attributes, attr: int, buf: bytes, size: int) -> None:
        desc.values[attr] = bytes(buf)

    cublasLtMatmulDescSetAttribute = cublasLtMatrixLayoutSetAttribute = cublasLtMatmulPreferenceSetAttribute = _set

    def _get(self, desc: Attributes, attr: int, size: int) -> tuple[bytes | None, int]:
        value = desc.values.get(attr)
        if value is None:
            raise errors.library_error("cublas", "invalid_value", f"attribute {attr} has not been set")
        return (value[:size] if size else None), len(value)

    cublasLtMatmulDescGetAttribute = cublasLtMatrixLayoutGetAttribute = cublasLtMatmulPreferenceGetAttribute = _get

    def cublasLtMatmulAlgoGetHeuristic(self, handle: BlasHandle, desc: Attributes, a: Attributes, b: Attributes,
                                       c: Attributes, d: Attributes, preference: Attributes,
                                       requested: int) -> tuple[bytes, int]:
        """One algorithm, needing no workspace: the sim has one way to multiply."""
        if requested < 1:
            raise errors.library_error("cublas", "invalid_value", "requestedAlgoCount < 1")
        self._layout(a)  # refuses what cublasLtMatmul would
        return HEURISTIC.pack(b"sim", 0, 0, 1.0), 1

    def cublasLtMatmulAlgoConfigGetAttribute(self, algo: bytes, attr: int, size: int) -> tuple[bytes | None, int]:
        """The sim's one algorithm has no configuration: every attribute reads as 0."""
        return (bytes(size) if size else None), 4

    def cublasLtMatmulAlgoConfigSetAttribute(self, algo: bytes, attr: int, buf: bytes, size: int) -> tuple[bytes]:
        """Accepted and ignored, for the same reason; the algorithm comes back as it went."""
        return (bytes(algo),)

    def _layout(self, layout: Attributes) -> tuple[int, int, int, int, int, int]:
        """(dtype, rows, cols, ld, batch, stride) of a column-major layout."""
        if layout.get(LT["MATRIX_LAYOUT_ORDER"], "<i", LT["ORDER_COL"]) != LT["ORDER_COL"]:
            raise errors.library_error("cublas", "not_supported", "only column-major layouts on the sim device")
        return (layout.get(LT["MATRIX_LAYOUT_TYPE"], "<i", R_32F), layout.get(LT["MATRIX_LAYOUT_ROWS"], "<Q", 0),
                layout.get(LT["MATRIX_LAYOUT_COLS"], "<Q", 0), layout.get(LT["MATRIX_LAYOUT_LD"], "<q", 0),
                layout.get(LT["MATRIX_LAYOUT_BATCH_COUNT"], "<i", 1),
                layout.get(LT["MATRIX_LAYOUT_STRIDED_BATCH_OFFSET"], "<q", 0))

    def cublasLtMatmul(self, handle: BlasHandle, desc: Attributes, alpha: Any, A: int, a_desc: Attributes, B: int,
                       b_desc: Attributes, beta: Any, C: int, c_desc: Attributes, D: int, d_desc: Attributes,
                       algo: bytes | None, workspace: int, workspace_bytes: int, stream: Any) -> None:
        ta, tb = desc.get(LT["MATMUL_DESC_TRANSA"], "<i", OP_N), desc.get(LT["MATMUL_DESC_TRANSB"], "<i", OP_N)
        at, a_rows, a_cols, lda, batch, sa = self._layout(a_desc)
        bt, _, _, ldb, _, sb = self._layout(b_desc)
        ct, m, n, ldc, _, sc = self._layout(c_desc)
        dt, _, _, ldd, _, sd = self._layout(d_desc)
        k = a_cols if ta == OP_N else a_rows
        scale = desc.get(LT["MATMUL_DESC_SCALE_TYPE"], "<i", R_32F)
        alpha, beta = self.scalar(alpha, scale), self.scalar(beta, scale)
        result = self.gemm(ta, tb, m, n, k, alpha, (A, at, lda, sa), (B, bt, ldb, sb), beta, (C, ct, ldc, sc),
                           batch=batch)
        self.store(self.epilogue(desc, result, dt), D, dt, ldd, sd)

    def epilogue(self, desc: Attributes, result: np.ndarray, out_type: int) -> np.ndarray:
        kind = desc.get(LT["MATMUL_DESC_EPILOGUE"], "<i", LT["EPILOGUE_DEFAULT"])
        known = LT["EPILOGUE_DEFAULT"] | LT["EPILOGUE_BIAS"] | LT["EPILOGUE_RELU"] | LT["EPILOGUE_GELU"]
        if kind & ~known or (kind & LT["EPILOGUE_RELU"] and kind & LT["EPILOGUE_GELU"]):
            raise errors.library_error("cublas", "not_supported", f"epilogue {kind} on the sim device")
        if kind & LT["EPILOGUE_BIAS"]:
            bias_type = desc.get(LT["MATMUL_DESC_BIAS_DATA_TYPE"], "<i", out_type)
            bias_ptr = desc.get(LT["MATMUL_DESC_BIAS_POINTER"], "<Q", 0)
            rows = result.shape[1]
            result = result + self.load(bias_ptr, bias_type, rows, 1, rows)[0]  # one value per row, every column
        if kind & LT["EPILOGUE_RELU"]:
            result = np.maximum(result, 0)
        if kind & LT["EPILOGUE_GELU"]:  # the tanh approximation, as cuBLASLt computes it
            result = 0.5 * result * (1 + np.tanh(0.7978845608028654 * (result + 0.044715 * result**3)))
        return result


def _scalar_type(compute: int) -> int:
    """The data type of alpha/beta for a cublasComputeType_t."""
    size = {ENUMS[n]: s for n, s in mathlibs.SCALAR_BYTES.items() if n.startswith("CUBLAS_COMPUTE") and n in ENUMS}
    return {2: R_16F, 4: R_32F, 8: R_64F}[size.get(compute, 4)]
