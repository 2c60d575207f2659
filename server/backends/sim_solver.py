"""cuSOLVER (dense) on the sim device: the factorizations done with numpy over the sim's memory.

Column-major as LAPACK is: element (i, j) of a matrix at `ptr` with leading dimension `ld` is at
`ptr + (i + j * ld) * size`. float, double and their complex types (the typed API's S, D, C, Z; the 64-bit
API's cudaDataType_t). Results are computed in double precision and rounded to the data type once, and are
written as LAPACK writes them, which is what PyTorch reads back:
- getrf: L (unit diagonal, not stored) and U in place, 1-based row interchanges in `ipiv`, the pivot chosen as
  the first of largest magnitude (|re| + |im| for complex, as izamax); `info` = the first zero pivot, 1-based;
- potrf: the factor in the `uplo` triangle only, the other left as it was; `info` = the order of the first
  leading minor that is not positive definite, where the factorization stops;
- geqrf: R on and above the diagonal, the Householder vectors below it and `tau` as xGEQR2/xLARFG make them
  (H = I - tau v v^H, v[0] = 1, beta = -sign(re(alpha)) |x|), so orgqr and ormqr rebuild the same Q;
- syevd/heevd: eigenvalues ascending, the vectors in A (numpy's LAPACK; a vector's sign is LAPACK's choice);
- gesvd (U, S, V^T), gesvdj and gesvda (U, S, V): numpy's SVD.
Workspaces are not needed: the size queries answer small sizes and the workspace pointers are ignored.
The cuBLAS batched solvers PyTorch routes small batches through (getrfBatched, getrsBatched, trsm, geqrfBatched,
gelsBatched) share the same code (SolvingBlas): gelsBatched as xGELS (geqrf's factors in A, the solution in C's first
n rows, Q^H C below them; a device `info` per matrix), their host `info` 0, and an argument cuBLAS refuses failing
the call with its documented status (INVALID_VALUE; NOT_SUPPORTED for gels of m < n or a transpose).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpuremote.protocol import errors, mathlibs

from .sim_blas import SimBlas

ENUMS = mathlibs.api(mathlibs.CUSOLVER).ENUMS
TYPED = {"S": np.dtype("<f4"), "D": np.dtype("<f8"), "C": np.dtype("<c8"), "Z": np.dtype("<c16")}
DATA_TYPES = {ENUMS["CUDA_R_32F"]: TYPED["S"], ENUMS["CUDA_R_64F"]: TYPED["D"], ENUMS["CUDA_C_32F"]: TYPED["C"],
              ENUMS["CUDA_C_64F"]: TYPED["Z"]}
LOWER, UPPER = 0, 1  # cublasFillMode_t
OP_N, OP_T, OP_C = 0, 1, 2  # cublasOperation_t
SIDE_LEFT = 0  # cublasSideMode_t
DIAG_UNIT = 1  # cublasDiagType_t
VECTORS = ENUMS["CUSOLVER_EIG_MODE_VECTOR"]
WORKSPACE_ELEMENTS = 1  # what the typed size queries answer; the 64-bit ones: bytes on the device, none on the host
WORKSPACE_BYTES = 64


def fail(status: str, message: str) -> errors.CudaError:
    return errors.library_error("cusolver", status, message)


# ---- the math: one matrix at a time, in double precision --------------------------------------------------------
def wide(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.complex128 if dtype.kind == "c" else np.float64)


def real_of(dtype: np.dtype) -> np.dtype:
    """The type of a complex type's singular values and eigenvalues (a real type's own)."""
    return np.dtype("<f4") if dtype in (TYPED["S"], TYPED["C"]) else np.dtype("<f8")


def lu(a: np.ndarray, pivoting: bool = True) -> tuple[np.ndarray, np.ndarray, int]:
    """xGETRF in place on a copy: (L and U, 1-based pivots, info)."""
    a = a.copy()
    m, n = a.shape
    k = min(m, n)
    pivots, info = np.arange(1, k + 1, dtype=np.int64), 0
    for j in range(k):
        if pivoting:
            column = a[j:, j]
            size = np.abs(column.real) + np.abs(column.imag) if a.dtype.kind == "c" else np.abs(column)
            p = j + int(np.argmax(size))
            pivots[j] = p + 1
            if p != j:
                a[[j, p], :] = a[[p, j], :]
        if a[j, j] == 0:
            info = info or j + 1
            continue
        a[j + 1:, j] /= a[j, j]
        a[j + 1:, j + 1:] -= np.outer(a[j + 1:, j], a[j, j + 1:])
    return a, pivots, info


def triangular_solve(t: np.ndarray, b: np.ndarray, lower: bool, unit: bool) -> np.ndarray:
    """t^-1 b for a triangular t (only its `lower` or upper triangle is read), by substitution over rows."""
    n = t.shape[0]
    x = b.astype(np.result_type(t, b), copy=True)
    order = range(n) if lower else range(n - 1, -1, -1)
    for i in order:
        others = slice(0, i) if lower else slice(i + 1, n)
        x[i] -= t[i, others] @ x[others]
        if not unit:
            x[i] /= t[i, i]
    return x


def op(a: np.ndarray, trans: int) -> np.ndarray:
    return a if trans == OP_N else a.T if trans == OP_T else a.conj().T


def lu_solve(lu_: np.ndarray, pivots: np.ndarray, b: np.ndarray, trans: int) -> np.ndarray:
    """xGETRS: op(A)^-1 b from A's LU factors and 1-based pivots."""
    b = b.astype(np.result_type(lu_, b), copy=True)
    n = lu_.shape[0]
    if trans == OP_N:
        for i in range(n):
            p = int(pivots[i]) - 1
            if p != i:
                b[[i, p]] = b[[p, i]]
        return triangular_solve(lu_, triangular_solve(lu_, b, True, True), False, False)
    t = op(lu_, trans)  # op(A) = op(U) op(L) P^T: solve op(U), then op(L), then undo the interchanges
    b = triangular_solve(t, triangular_solve(t, b, True, False), False, True)
    for i in range(n - 1, -1, -1):
        p = int(pivots[i]) - 1
        if p != i:
            b[[i, p]] = b[[p, i]]
    return b


def cholesky(a: np.ndarray, uplo: int) -> tuple[np.ndarray, int]:
    """xPOTRF: (a with its `uplo` triangle replaced by the factor, as far as it got; info)."""
    n = a.shape[0]
    full = np.tril(a) + np.tril(a, -1).conj().T if uplo == LOWER else np.triu(a) + np.triu(a, 1).conj().T
    factor = np.zeros_like(full)
    info = 0
    for j in range(n):
        d = full[j, j].real - np.sum(np.abs(factor[j, :j]) ** 2)
        if not d > 0:
            info = j + 1
            factor[j, j] = d
            break
        factor[j, j] = np.sqrt(d)
        factor[j + 1:, j] = (full[j + 1:, j] - factor[j + 1:, :j] @ factor[j, :j].conj()) / factor[j, j]
    done = info - 1 if info else n  # LAPACK stops at the failing column: the ones before it are written
    rows, cols = np.tril_indices(n)
    keep = cols < done
    rows, cols = rows[keep], cols[keep]
    out = a.copy()
    if uplo == LOWER:
        out[rows, cols] = factor[rows, cols]
    else:
        out[cols, rows] = factor[rows, cols].conj()
    return out, info


def cholesky_factor(a: np.ndarray, uplo: int) -> np.ndarray:
    """The lower factor L (A = L L^H) of a potrf result."""
    return np.tril(a) if uplo == LOWER else np.triu(a).conj().T


def householder(x: np.ndarray) -> tuple[complex, float | complex, np.ndarray]:
    """xLARFG of the column x: (beta, tau, v below its leading 1)."""
    alpha, rest = x[0], x[1:]
    xnorm = float(np.linalg.norm(rest)) if rest.size else 0.0
    if xnorm == 0 and alpha.imag == 0:
        return alpha, 0 * alpha, np.zeros_like(rest)
    beta = -np.copysign(np.sqrt(abs(alpha) ** 2 + xnorm ** 2), alpha.real)
    tau = (beta - alpha.real) / beta - 1j * alpha.imag / beta if np.iscomplexobj(x) else (beta - alpha) / beta
    return beta, tau, rest / (alpha - beta)


def qr(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """xGEQRF: (R and the reflectors in place, tau)."""
    a = a.copy()
    m, n = a.shape
    k = min(m, n)
    taus = np.zeros(k, a.dtype)
    for j in range(k):
        beta, tau, v = householder(a[j:, j])
        a[j, j], a[j + 1:, j], taus[j] = beta, v, tau
        w = np.concatenate(([1], v)).astype(a.dtype)
        rest = a[j:, j + 1:]
        rest -= np.conj(tau) * np.outer(w, w.conj() @ rest)
    return a, taus


def apply_q(reflectors: np.ndarray, taus: np.ndarray, c: np.ndarray, adjoint: bool) -> np.ndarray:
    """Q c or Q^H c, Q = H(1) ... H(k) from geqrf's reflectors (below the diagonal of `reflectors`)."""
    c = c.astype(np.result_type(reflectors, c), copy=True)
    k = taus.size
    order = range(k) if adjoint else range(k - 1, -1, -1)
    for i in order:
        w = np.concatenate(([1], reflectors[i + 1:, i])).astype(c.dtype)
        tau = np.conj(taus[i]) if adjoint else taus[i]
        c[i:] -= tau * np.outer(w, w.conj() @ c[i:])
    return c


def least_squares(a: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """xGELS of a full-rank m >= n system, not transposed: (A's geqrf, C with the solution in its first n rows and
    the rest of Q^H C below it, info). info = i where R's i-th diagonal element (1-based) is exactly zero, and then C
    holds Q^H C, unsolved."""
    n = a.shape[1]
    factors, taus = qr(a)
    c = apply_q(factors, taus, c, True)
    zeros = np.flatnonzero(np.diagonal(factors)[:n] == 0)
    if zeros.size:
        return factors, c, int(zeros[0]) + 1
    c[:n] = triangular_solve(factors[:n, :n], c[:n], False, False)
    return factors, c, 0


def eigh(a: np.ndarray, uplo: int) -> tuple[np.ndarray, np.ndarray]:
    return np.linalg.eigh(a, UPLO="L" if uplo == LOWER else "U")


# ---- handles and settings ---------------------------------------------------------------------------------------
@dataclass
class SolverHandle:
    stream: Any = None


@dataclass
class Settings:
    """A cusolverDnParams_t, syevjInfo_t or gesvdjInfo_t: what was set on it."""

    values: dict[tuple, Any] = field(default_factory=dict)


class SimSolver:
    """The cuSOLVER calls the call table forwards, over the sim's `memory`."""

    def __init__(self, memory: Any) -> None:
        self.memory = memory

    # ---- memory as matrices -------------------------------------------------------------------------------------
    def load(self, ptr: int, dtype: np.dtype, rows: int, cols: int, ld: int) -> np.ndarray:
        """A column-major matrix as a (rows, cols) array in double precision."""
        if min(rows, cols) < 0 or (rows and ld < rows):
            raise fail("invalid_value", f"{rows}x{cols} matrix with leading dimension {ld}")
        if not rows or not cols:
            return np.zeros((rows, cols), wide(dtype))
        if not ptr:
            raise fail("invalid_value", f"a NULL {rows}x{cols} matrix")
        span = (cols - 1) * ld + rows
        flat = np.frombuffer(self.memory.read(ptr, span * dtype.itemsize), dtype)
        return np.lib.stride_tricks.as_strided(flat, (rows, cols), (dtype.itemsize, ld * dtype.itemsize)) \
            .astype(wide(dtype))

    def store(self, ptr: int, dtype: np.dtype, values: np.ndarray, ld: int) -> None:
        rows, cols = values.shape
        if not rows or not cols:
            return
        span = (cols - 1) * ld + rows
        flat = np.frombuffer(self.memory.view(ptr, span * dtype.itemsize), dtype)
        out = np.lib.stride_tricks.as_strided(flat, (rows, cols), (dtype.itemsize, ld * dtype.itemsize),
                                              writeable=True)
        out[...] = values.astype(dtype) if dtype.kind == "c" else values.real.astype(dtype)

    def vector(self, ptr: int, dtype: np.dtype, count: int) -> np.ndarray:
        return np.frombuffer(self.memory.read(ptr, count * dtype.itemsize), dtype).astype(wide(dtype))

    def put_vector(self, ptr: int, dtype: np.dtype, values: np.ndarray) -> None:
        if values.size:
            self.memory.write(ptr, (values if dtype.kind == "c" else values.real).astype(dtype).tobytes())

    def put_ints(self, ptr: int, values: Any, dtype: str = "<i4") -> None:
        values = np.asarray(values, dtype)
        if ptr and values.size:
            self.memory.write(ptr, values.tobytes())

    def pointers(self, array: int, count: int) -> list[int]:
        """An array of `count` device pointers, itself in device memory."""
        return list(struct.unpack(f"<{count}Q", self.memory.read(array, 8 * count))) if count else []

    @staticmethod
    def data_type(value: int) -> np.dtype:
        found = DATA_TYPES.get(value)
        if found is None:
            raise fail("not_supported", f"data type {value} on the sim device")
        return found

    # ---- handles ------------------------------------------------------------------------------------------------
    def cusolverDnCreate(self) -> tuple[SolverHandle]:
        return (SolverHandle(),)

    def cusolverDnDestroy(self, handle: SolverHandle) -> None:
        pass

    def cusolverDnSetStream(self, handle: SolverHandle, stream: Any) -> None:
        handle.stream = stream  # the sim runs each call as it arrives, in stream order

    def _settings(self) -> tuple[Settings]:
        return (Settings(),)

    cusolverDnCreateParams = cusolverDnCreateSyevjInfo = cusolverDnCreateGesvdjInfo = _settings

    def _drop(self, settings: Settings) -> None:
        pass

    cusolverDnDestroyParams = cusolverDnDestroySyevjInfo = cusolverDnDestroyGesvdjInfo = _drop

    def cusolverDnSetAdvOptions(self, params: Settings, function: int, algo: int) -> None:
        params.values[("algo", function)] = algo

    def _set(name: str) -> Any:  # noqa: N805 - builds methods
        def set_(self: SimSolver, settings: Settings, value: Any) -> None:
            settings.values[(name,)] = value
        return set_

    cusolverDnXsyevjSetTolerance = cusolverDnXgesvdjSetTolerance = _set("tolerance")
    cusolverDnXsyevjSetMaxSweeps = cusolverDnXgesvdjSetMaxSweeps = _set("max_sweeps")
    cusolverDnXsyevjSetSortEig = cusolverDnXgesvdjSetSortEig = _set("sort")

    def _residual(self, handle: SolverHandle, settings: Settings) -> tuple[float]:
        return (0.0,)  # numpy's decompositions are converged

    def _sweeps(self, handle: SolverHandle, settings: Settings) -> tuple[int]:
        return (1,)

    cusolverDnXsyevjGetResidual = cusolverDnXgesvdjGetResidual = _residual
    cusolverDnXsyevjGetSweeps = cusolverDnXgesvdjGetSweeps = _sweeps

    # ---- workspace sizes ----------------------------------------------------------------------------------------
    def typed_size(self, *args: Any) -> tuple[int]:
        return (WORKSPACE_ELEMENTS,)

    def sizes_64(self, *args: Any) -> tuple[int, int]:
        return (WORKSPACE_BYTES, 0)

    # ---- LU -----------------------------------------------------------------------------------------------------
    def getrf(self, dtype: np.dtype, m: int, n: int, a: int, lda: int, ipiv: int, info: int,
              pivot_type: str = "<i4") -> None:
        factors, pivots, status = lu(self.load(a, dtype, m, n, lda), pivoting=bool(ipiv))
        self.store(a, dtype, factors, lda)
        self.put_ints(ipiv, pivots, pivot_type)
        self.put_ints(info, [status])

    def getrs(self, dtype: np.dtype, trans: int, n: int, nrhs: int, a: int, lda: int, ipiv: int, b: int, ldb: int,
              info: int, pivot_type: str = "<i4") -> None:
        pivots = np.frombuffer(self.memory.read(ipiv, n * np.dtype(pivot_type).itemsize), pivot_type)
        x = lu_solve(self.load(a, dtype, n, n, lda), pivots, self.load(b, dtype, n, nrhs, ldb), trans)
        self.store(b, dtype, x, ldb)
        self.put_ints(info, [0])

    def cusolverDnXgetrf(self, h: SolverHandle, params: Settings, m: int, n: int, type_a: int, a: int, lda: int,
                         ipiv: int, compute: int, work: int, work_bytes: int, host: Any, host_bytes: int,
                         info: int) -> None:
        self.getrf(self.data_type(type_a), m, n, a, lda, ipiv, info, "<i8")

    def cusolverDnXgetrs(self, h: SolverHandle, params: Settings, trans: int, n: int, nrhs: int, type_a: int, a: int,
                         lda: int, ipiv: int, type_b: int, b: int, ldb: int, info: int) -> None:
        self.getrs(self.data_type(type_a), trans, n, nrhs, a, lda, ipiv, b, ldb, info, "<i8")

    # ---- Cholesky -----------------------------------------------------------------------------------------------
    def potrf(self, dtype: np.dtype, uplo: int, n: int, a: int, lda: int, info: int) -> None:
        factored, status = cholesky(self.load(a, dtype, n, n, lda), uplo)
        self.store(a, dtype, factored, lda)
        self.put_ints(info, [status])

    def potrs(self, dtype: np.dtype, uplo: int, n: int, nrhs: int, a: int, lda: int, b: int, ldb: int,
              info: int) -> None:
        factor = cholesky_factor(self.load(a, dtype, n, n, lda), uplo)
        y = triangular_solve(factor, self.load(b, dtype, n, nrhs, ldb), True, False)
        self.store(b, dtype, triangular_solve(factor.conj().T, y, False, False), ldb)
        self.put_ints(info, [0])

    def potri(self, dtype: np.dtype, uplo: int, n: int, a: int, lda: int, info: int) -> None:
        """A^-1 from its Cholesky factor, written to the `uplo` triangle."""
        stored = self.load(a, dtype, n, n, lda)
        factor = cholesky_factor(stored, uplo)
        inverse_l = triangular_solve(factor, np.eye(n, dtype=factor.dtype), True, False)
        inverse = inverse_l.conj().T @ inverse_l
        mask = np.tril(np.ones((n, n), bool)) if uplo == LOWER else np.triu(np.ones((n, n), bool))
        self.store(a, dtype, np.where(mask, inverse, stored), lda)
        self.put_ints(info, [0])

    def potrf_batched(self, dtype: np.dtype, uplo: int, n: int, arrays: int, lda: int, info: int,
                      batch: int) -> None:
        statuses = []
        for a in self.pointers(arrays, batch):
            factored, status = cholesky(self.load(a, dtype, n, n, lda), uplo)
            self.store(a, dtype, factored, lda)
            statuses.append(status)
        self.put_ints(info, statuses)

    def potrs_batched(self, dtype: np.dtype, uplo: int, n: int, nrhs: int, a_arrays: int, lda: int, b_arrays: int,
                      ldb: int, info: int, batch: int) -> None:
        for a, b in zip(self.pointers(a_arrays, batch), self.pointers(b_arrays, batch), strict=True):
            self.potrs(dtype, uplo, n, nrhs, a, lda, b, ldb, 0)
        self.put_ints(info, [0])

    def cusolverDnXpotrf(self, h: SolverHandle, params: Settings, uplo: int, n: int, type_a: int, a: int, lda: int,
                         compute: int, work: int, work_bytes: int, host: Any, host_bytes: int, info: int) -> None:
        self.potrf(self.data_type(type_a), uplo, n, a, lda, info)

    def cusolverDnXpotrs(self, h: SolverHandle, params: Settings, uplo: int, n: int, nrhs: int, type_a: int, a: int,
                         lda: int, type_b: int, b: int, ldb: int, info: int) -> None:
        self.potrs(self.data_type(type_a), uplo, n, nrhs, a, lda, b, ldb, info)

    # ---- QR -----------------------------------------------------------------------------------------------------
    def geqrf(self, dtype: np.dtype, m: int, n: int, a: int, lda: int, tau: int, info: int) -> None:
        factors, taus = qr(self.load(a, dtype, m, n, lda))
        self.store(a, dtype, factors, lda)
        self.put_vector(tau, dtype, taus)
        self.put_ints(info, [0])

    def orgqr(self, dtype: np.dtype, m: int, n: int, k: int, a: int, lda: int, tau: int, info: int) -> None:
        """The first n columns of Q from k reflectors."""
        if not m >= n >= k >= 0:
            raise fail("invalid_value", f"orgqr of m={m}, n={n}, k={k}")
        reflectors = self.load(a, dtype, m, n, lda)
        q = apply_q(reflectors[:, :k], self.vector(tau, dtype, k), np.eye(m, n, dtype=reflectors.dtype), False)
        self.store(a, dtype, q, lda)
        self.put_ints(info, [0])

    def ormqr(self, dtype: np.dtype, side: int, trans: int, m: int, n: int, k: int, a: int, lda: int, tau: int,
              c: int, ldc: int, info: int) -> None:
        """op(Q) C (left) or C op(Q) (right)."""
        order = m if side == SIDE_LEFT else n
        reflectors = self.load(a, dtype, order, k, lda)
        taus = self.vector(tau, dtype, k)
        values = self.load(c, dtype, m, n, ldc)
        adjoint = trans != OP_N
        if side == SIDE_LEFT:
            result = apply_q(reflectors, taus, values, adjoint)
        else:  # C op(Q) = (op(Q)^H C^H)^H
            result = apply_q(reflectors, taus, values.conj().T, not adjoint).conj().T
        self.store(c, dtype, result, ldc)
        self.put_ints(info, [0])

    def cusolverDnXgeqrf(self, h: SolverHandle, params: Settings, m: int, n: int, type_a: int, a: int, lda: int,
                         type_tau: int, tau: int, compute: int, work: int, work_bytes: int, host: Any,
                         host_bytes: int, info: int) -> None:
        self.geqrf(self.data_type(type_a), m, n, a, lda, tau, info)

    # ---- symmetric eigen ----------------------------------------------------------------------------------------
    def syevd(self, dtype: np.dtype, jobz: int, uplo: int, n: int, a: int, lda: int, w: int, info: int,
              batch: int = 1) -> None:
        real = real_of(dtype)
        stride = lda * n * dtype.itemsize
        for i in range(batch):
            values, vectors = eigh(self.load(a + i * stride, dtype, n, n, lda), uplo)
            self.put_vector(w + i * n * real.itemsize, real, values)
            if jobz == VECTORS:
                self.store(a + i * stride, dtype, vectors, lda)
        self.put_ints(info, [0] * batch)

    def cusolverDnXsyevd(self, h: SolverHandle, params: Settings, jobz: int, uplo: int, n: int, type_a: int, a: int,
                         lda: int, type_w: int, w: int, compute: int, work: int, work_bytes: int, host: Any,
                         host_bytes: int, info: int) -> None:
        self.syevd(self.data_type(type_a), jobz, uplo, n, a, lda, w, info)

    def cusolverDnXsyevBatched(self, h: SolverHandle, params: Settings, jobz: int, uplo: int, n: int, type_a: int,
                               a: int, lda: int, type_w: int, w: int, compute: int, work: int, work_bytes: int,
                               host: Any, host_bytes: int, info: int, batch: int) -> None:
        self.syevd(self.data_type(type_a), jobz, uplo, n, a, lda, w, info, batch)

    # ---- SVD ----------------------------------------------------------------------------------------------------
    def svd(self, dtype: np.dtype, vectors: bool, full: bool, m: int, n: int, a: int, lda: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.dtype]:
        """(U, S, V^H, the real type) of a matrix; U and V^H empty without vectors."""
        real = real_of(dtype)
        values = self.load(a, dtype, m, n, lda)
        if not vectors:
            return np.empty((0, 0)), np.linalg.svd(values, compute_uv=False), np.empty((0, 0)), real
        u, s, vh = np.linalg.svd(values, full_matrices=full)
        return u, s, vh, real

    def gesvd(self, dtype: np.dtype, jobu: int, jobvt: int, m: int, n: int, a: int, lda: int, s: int, u: int,
              ldu: int, vt: int, ldvt: int, info: int) -> None:
        jobs = chr(jobu & 0xFF).upper(), chr(jobvt & 0xFF).upper()
        if any(j not in "ASON" for j in jobs) or jobs == ("O", "O"):
            raise fail("invalid_value", f"gesvd jobu={jobs[0]!r} jobvt={jobs[1]!r}")
        k = min(m, n)
        uu, ss, vh, real = self.svd(dtype, jobs != ("N", "N"), "A" in jobs, m, n, a, lda)
        self.put_vector(s, real, ss)
        for job, ptr, ld, part in ((jobs[0], u, ldu, uu[:, :m if jobs[0] == "A" else k]),
                                   (jobs[1], vt, ldvt, vh[:n if jobs[1] == "A" else k, :])):
            if job in "AS":
                self.store(ptr, dtype, part, ld)
            elif job == "O":
                self.store(a, dtype, part, lda)
        self.put_ints(info, [0])

    def gesvdj(self, dtype: np.dtype, jobz: int, econ: int, m: int, n: int, a: int, lda: int, s: int, u: int,
               ldu: int, v: int, ldv: int, info: int) -> None:
        uu, ss, vh, real = self.svd(dtype, jobz == VECTORS, not econ, m, n, a, lda)
        self.put_vector(s, real, ss)
        if jobz == VECTORS:
            self.store(u, dtype, uu, ldu)
            self.store(v, dtype, vh.conj().T, ldv)
        self.put_ints(info, [0])

    def gesvdj_batched(self, dtype: np.dtype, jobz: int, m: int, n: int, a: int, lda: int, s: int, u: int, ldu: int,
                       v: int, ldv: int, info: int, batch: int) -> None:
        k, size, real = min(m, n), dtype.itemsize, real_of(dtype)
        for i in range(batch):
            self.gesvdj(dtype, jobz, 0, m, n, a + i * lda * n * size, lda, s + i * k * real.itemsize,
                        u + i * ldu * m * size, ldu, v + i * ldv * n * size, ldv, 0)
        self.put_ints(info, [0] * batch)

    def gesvda(self, dtype: np.dtype, jobz: int, rank: int, m: int, n: int, a: int, lda: int, stride_a: int, s: int,
               stride_s: int, u: int, ldu: int, stride_u: int, v: int, ldv: int, stride_v: int, info: int,
               residual: int | None, batch: int) -> tuple[bytes | None]:
        """The `rank` largest singular triplets of each of a strided batch; the residuals' norms (0) if asked."""
        size = dtype.itemsize
        for i in range(batch):
            uu, ss, vh, real = self.svd(dtype, jobz == VECTORS, False, m, n, a + i * stride_a * size, lda)
            self.put_vector(s + i * stride_s * real.itemsize, real, ss[:rank])
            if jobz == VECTORS:
                self.store(u + i * stride_u * size, dtype, uu[:, :rank], ldu)
                self.store(v + i * stride_v * size, dtype, vh[:rank].conj().T, ldv)
        self.put_ints(info, [0] * batch)
        return (bytes(8 * batch) if residual is not None else None,)

    def cusolverDnXgesvd(self, h: SolverHandle, params: Settings, jobu: int, jobvt: int, m: int, n: int, type_a: int,
                         a: int, lda: int, type_s: int, s: int, type_u: int, u: int, ldu: int, type_vt: int, vt: int,
                         ldvt: int, compute: int, work: int, work_bytes: int, host: Any, host_bytes: int,
                         info: int) -> None:
        self.gesvd(self.data_type(type_a), jobu, jobvt, m, n, a, lda, s, u, ldu, vt, ldvt, info)


def _typed(letter: str) -> dict[str, Any]:
    """The typed API's methods for one data type, each the shared implementation with its dtype."""
    dtype = TYPED[letter]
    sy, orth = ("he", "un") if letter in "CZ" else ("sy", "or")

    def getrf(self, h, m, n, a, lda, work, ipiv, info):  # noqa: ANN001, ANN202
        self.getrf(dtype, m, n, a, lda, ipiv, info)

    def getrs(self, h, trans, n, nrhs, a, lda, ipiv, b, ldb, info):  # noqa: ANN001, ANN202
        self.getrs(dtype, trans, n, nrhs, a, lda, ipiv, b, ldb, info)

    def potrf(self, h, uplo, n, a, lda, work, lwork, info):  # noqa: ANN001, ANN202
        self.potrf(dtype, uplo, n, a, lda, info)

    def potrs(self, h, uplo, n, nrhs, a, lda, b, ldb, info):  # noqa: ANN001, ANN202
        self.potrs(dtype, uplo, n, nrhs, a, lda, b, ldb, info)

    def potri(self, h, uplo, n, a, lda, work, lwork, info):  # noqa: ANN001, ANN202
        self.potri(dtype, uplo, n, a, lda, info)

    def potrf_batched(self, h, uplo, n, arrays, lda, info, batch):  # noqa: ANN001, ANN202
        self.potrf_batched(dtype, uplo, n, arrays, lda, info, batch)

    def potrs_batched(self, h, uplo, n, nrhs, a, lda, b, ldb, info, batch):  # noqa: ANN001, ANN202
        self.potrs_batched(dtype, uplo, n, nrhs, a, lda, b, ldb, info, batch)

    def geqrf(self, h, m, n, a, lda, tau, work, lwork, info):  # noqa: ANN001, ANN202
        self.geqrf(dtype, m, n, a, lda, tau, info)

    def orgqr(self, h, m, n, k, a, lda, tau, work, lwork, info):  # noqa: ANN001, ANN202
        self.orgqr(dtype, m, n, k, a, lda, tau, info)

    def ormqr(self, h, side, trans, m, n, k, a, lda, tau, c, ldc, work, lwork, info):  # noqa: ANN001, ANN202
        self.ormqr(dtype, side, trans, m, n, k, a, lda, tau, c, ldc, info)

    def syevd(self, h, jobz, uplo, n, a, lda, w, work, lwork, info):  # noqa: ANN001, ANN202
        self.syevd(dtype, jobz, uplo, n, a, lda, w, info)

    def syevj_batched(self, h, jobz, uplo, n, a, lda, w, work, lwork, info, params, batch):  # noqa: ANN001, ANN202
        self.syevd(dtype, jobz, uplo, n, a, lda, w, info, batch)

    def gesvd(self, h, jobu, jobvt, m, n, a, lda, s, u, ldu, vt, ldvt, work, lwork, rwork, info):  # noqa: ANN001, ANN202
        self.gesvd(dtype, jobu, jobvt, m, n, a, lda, s, u, ldu, vt, ldvt, info)

    def gesvdj(self, h, jobz, econ, m, n, a, lda, s, u, ldu, v, ldv, work, lwork, info, params):  # noqa: ANN001, ANN202
        self.gesvdj(dtype, jobz, econ, m, n, a, lda, s, u, ldu, v, ldv, info)

    def gesvdj_batched(self, h, jobz, m, n, a, lda, s, u, ldu, v, ldv, work, lwork, info, params,  # noqa: ANN001, ANN202
                       batch):
        self.gesvdj_batched(dtype, jobz, m, n, a, lda, s, u, ldu, v, ldv, info, batch)

    def gesvda(self, h, jobz, rank, m, n, a, lda, sa, s, ss, u, ldu, su, v, ldv, sv, work, lwork, info,  # noqa: ANN001, ANN202
               residual, batch):
        return self.gesvda(dtype, jobz, rank, m, n, a, lda, sa, s, ss, u, ldu, su, v, ldv, sv, info, residual, batch)

    prefix = f"cusolverDn{letter}"
    methods = {"getrf": getrf, "getrs": getrs, "potrf": potrf, "potrs": potrs, "potri": potri,
               "potrfBatched": potrf_batched, "potrsBatched": potrs_batched, "geqrf": geqrf, f"{orth}gqr": orgqr,
               f"{orth}mqr": ormqr, f"{sy}evd": syevd, f"{sy}evjBatched": syevj_batched, "gesvd": gesvd,
               "gesvdj": gesvdj, "gesvdjBatched": gesvdj_batched, "gesvdaStridedBatched": gesvda}
    return {prefix + name: method for name, method in methods.items()}


for _letter in TYPED:
    for _name, _method in _typed(_letter).items():
        setattr(SimSolver, _name, _method)
for _call in mathlibs.api(mathlibs.CUSOLVER).FUNCTIONS:
    if _call.endswith("_bufferSize"):
        setattr(SimSolver, _call, SimSolver.sizes_64 if _call.startswith("cusolverDnX") else SimSolver.typed_size)


class SolvingBlas(SimBlas):
    """cuBLAS on the sim with the batched solvers PyTorch calls for small batches (torch.linalg.inv and solve of a
    batch, lu_factor, the triangular solves of lstsq, qr and lstsq of a batch): getrfBatched, getrsBatched, trsm,
    trsmBatched, geqrfBatched and gelsBatched, real and complex types."""

    solver: SimSolver

    def __init__(self, memory: Any) -> None:
        super().__init__(memory)
        self.solver = SimSolver(memory)

    def typed_scalar(self, value: Any, dtype: np.dtype) -> Any:
        """alpha of the typed API (complex for C and Z): its bytes (host pointer mode) or a device address."""
        raw = bytes(self.memory.read(value, dtype.itemsize)) if isinstance(value, int) else bytes(value)
        if len(raw) != dtype.itemsize:
            raise errors.library_error("cublas", "invalid_value", f"a scalar of {len(raw)} bytes, not {dtype.itemsize}")
        return np.frombuffer(raw, dtype, 1)[0]


def _blas(letter: str) -> dict[str, Any]:
    dtype = TYPED[letter]

    def getrf_batched(self, h, n, arrays, lda, pivots, info, batch):  # noqa: ANN001, ANN202
        """`pivots`: n per matrix, one after another; NULL: no pivoting."""
        solver = self.solver
        statuses = []
        for i, a in enumerate(solver.pointers(arrays, batch)):
            factors, found, status = lu(solver.load(a, dtype, n, n, lda), pivoting=bool(pivots))
            solver.store(a, dtype, factors, lda)
            if pivots:
                solver.put_ints(pivots + 4 * n * i, found)
            statuses.append(status)
        solver.put_ints(info, statuses)

    def getrs_batched(self, h, trans, n, nrhs, a_arrays, lda, pivots, b_arrays, ldb, batch):  # noqa: ANN001, ANN202
        """The host `info` (the call's output): 0, or -i for a bad argument i, as cuBLAS says."""
        solver = self.solver
        for i, (a, b) in enumerate(zip(solver.pointers(a_arrays, batch), solver.pointers(b_arrays, batch),
                                       strict=True)):
            found = np.frombuffer(self.memory.read(pivots + 4 * n * i, 4 * n), "<i4") if pivots \
                else np.arange(1, n + 1)
            x = lu_solve(solver.load(a, dtype, n, n, lda), found, solver.load(b, dtype, n, nrhs, ldb), trans)
            solver.store(b, dtype, x, ldb)
        return (0,)

    def trsm(self, h, side, uplo, trans, diag, m, n, alpha, a, lda, b, ldb):  # noqa: ANN001, ANN202
        self.trsm_one(dtype, side, uplo, trans, diag, m, n, self.typed_scalar(alpha, dtype), a, lda, b, ldb)

    def trsm_batched(self, h, side, uplo, trans, diag, m, n, alpha, a_arrays, lda, b_arrays, ldb,  # noqa: ANN001, ANN202
                     batch):
        scale = self.typed_scalar(alpha, dtype)
        for a, b in zip(self.solver.pointers(a_arrays, batch), self.solver.pointers(b_arrays, batch), strict=True):
            self.trsm_one(dtype, side, uplo, trans, diag, m, n, scale, a, lda, b, ldb)

    def geqrf_batched(self, h, m, n, a_arrays, lda, tau_arrays, batch):  # noqa: ANN001, ANN202
        """geqrf of each matrix: R and the reflectors in place, min(m, n) `tau` per matrix; the host `info`: 0."""
        check_batched_sizes("geqrfBatched", m, n, batch, lda)
        solver = self.solver
        for a, tau in zip(solver.pointers(a_arrays, batch), solver.pointers(tau_arrays, batch), strict=True):
            factors, taus = qr(solver.load(a, dtype, m, n, lda))
            solver.store(a, dtype, factors, lda)
            solver.put_vector(tau, dtype, taus)
        return (0,)

    def gels_batched(self, h, trans, m, n, nrhs, a_arrays, lda, c_arrays, ldc, dev_info, batch):  # noqa: ANN001, ANN202
        """Least squares of full-rank m >= n systems; the host `info`: 0 (bad arguments fail the call)."""
        check_batched_sizes("gelsBatched", m, n, batch, lda, nrhs, ldc)
        if trans != OP_N or m < n:
            raise errors.library_error("cublas", "not_supported",
                                       f"gelsBatched of trans={trans}, m={m}, n={n} (only m >= n, not transposed)")
        solver = self.solver
        statuses = []
        for a, c in zip(solver.pointers(a_arrays, batch), solver.pointers(c_arrays, batch), strict=True):
            factors, solution, status = least_squares(solver.load(a, dtype, m, n, lda),
                                                      solver.load(c, dtype, m, nrhs, ldc))
            solver.store(a, dtype, factors, lda)
            solver.store(c, dtype, solution, ldc)
            statuses.append(status)
        solver.put_ints(dev_info, statuses)
        return (0,)

    return {f"cublas{letter}getrfBatched": getrf_batched, f"cublas{letter}getrsBatched": getrs_batched,
            f"cublas{letter}trsm": trsm, f"cublas{letter}trsmBatched": trsm_batched,
            f"cublas{letter}geqrfBatched": geqrf_batched, f"cublas{letter}gelsBatched": gels_batched}


def check_batched_sizes(call: str, m: int, n: int, batch: int, lda: int, nrhs: int = 0, ldc: int | None = None
                        ) -> None:
    """cuBLAS's INVALID_VALUE cases of geqrfBatched and gelsBatched: negative sizes, leading dimensions < max(1, m)."""
    if min(m, n, nrhs, batch) < 0 or lda < max(1, m) or (ldc is not None and ldc < max(1, m)):
        raise errors.library_error("cublas", "invalid_value", f"{call} of m={m}, n={n}, nrhs={nrhs}, lda={lda}, "
                                   f"ldc={ldc}, batchSize={batch}")


def _trsm_one(self: SolvingBlas, dtype: np.dtype, side: int, uplo: int, trans: int, diag: int, m: int, n: int,
              alpha: Any, a: int, lda: int, b: int, ldb: int) -> None:
    """B = alpha op(A)^-1 B (left) or alpha B op(A)^-1 (right), A triangular."""
    solver = self.solver
    order = m if side == SIDE_LEFT else n
    t = op(solver.load(a, dtype, order, order, lda), trans)
    lower = (uplo == LOWER) == (trans == OP_N)  # a transpose turns a lower triangle into an upper one
    values = alpha * solver.load(b, dtype, m, n, ldb)
    if side == SIDE_LEFT:
        x = triangular_solve(t, values, lower, diag == DIAG_UNIT)
    else:  # X op(A) = B  <=>  op(A)^T X^T = B^T
        x = triangular_solve(t.T, values.T, not lower, diag == DIAG_UNIT).T
    solver.store(b, dtype, x, ldb)


SolvingBlas.trsm_one = _trsm_one  # type: ignore[attr-defined]
for _letter in TYPED:
    for _name, _method in _blas(_letter).items():
        setattr(SolvingBlas, _name, _method)
