"""torch.linalg through xpuremote: the stock wheel's cuSOLVER calls (and the cuBLAS batched solvers PyTorch routes
small batches to) reach xpuremote's replacement libcusolver.so.12, travel to the server and are computed there, by
the sim with numpy (server/backends/sim_solver.py) or (XPU_TEST_BACKEND=cuda) by NVIDIA's cuSOLVER on the GPU.
tests/programs/torch_linalg_check.py compares each result with the CPU's; the checks' sizes pick PyTorch's paths
under its default backend (`preferred_linalg_library` is left as it is).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, lane_runs, start_server
from test_native_lane import in_c_and_in_python
from test_torch import run_torch
from test_torch_math import library_calls, run_math

from xpuremote.protocol import mathlibs

LINALG = ROOT / "tests" / "programs" / "torch_linalg_check.py"
KERNELS = f"{TORCH_SIM_KERNELS},{ROOT / 'tests' / 'torch_sim_kernels_linalg.py'}"
CHECKS = {"solve", "solve_batched", "inv_batched", "det", "det_batched", "cholesky", "cholesky_batched_upper", "qr",
          "eigh", "eigh_batched", "svd", "svd_batched", "lstsq"}
COMPLEX_CHECKS = {"solve_complex", "solve_batched_complex", "det_complex", "qr_complex", "eigh_complex", "svd_complex",
                  "lstsq_complex"}
# cuBLAS's geqrfBatched and gelsBatched, S, C, D and Z
BATCHED_QR_CHECKS = {f"{op}_batched{suffix}" for op in ("qr", "lstsq")
                     for suffix in ("", "_complex", "_double", "_complex_double")}
DOUBLE_CHECKS = {f"{name}_double" for name in CHECKS} | {f"{name}_double" for name in COMPLEX_CHECKS}
TOLERANCE = 1e-5  # relative: float32 rounding of 6..32-element sums
DOUBLE_TOLERANCE = 1e-10  # float64's rounding is ~1e-15: a result computed or kept in float32 anywhere is ~1e-7 off


@pytest.fixture(scope="module")
def linalg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("linalg"), env={"XPU_SIM_KERNELS": KERNELS})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def linalg_result(linalg_server: Server) -> tuple[dict[str, Any], str]:
    return run_math(linalg_server, LINALG)


def test_linalg_ops_match_the_cpu(linalg_result: tuple[dict[str, Any], str]) -> None:
    """solve, inv of a batch, det (one matrix and a batch), cholesky (one matrix and a batch), qr, eigh, svd (one and
    a batch), lstsq as on the CPU: LU, Cholesky, QR with LAPACK's reflectors, eigen and singular values, and the
    matrices rebuilt from them. det's and lstsq's ATen kernels around the library calls run too (on the sim: a
    jitted product reduction, compiled by NVRTC in the program, integer pivots' sign, a residual's square)."""
    assert_within(linalg_result[0], CHECKS)


def test_complex_linalg_ops_match_the_cpu(linalg_result: tuple[dict[str, Any], str]) -> None:
    """complex64: solve (cuSOLVER's, and cuBLAS's batched), det, qr (Q and R signs included), eigh of a Hermitian
    matrix, svd and lstsq, through the C functions and ATen's complex kernels around them."""
    assert_within(linalg_result[0], COMPLEX_CHECKS)


def test_batched_qr_and_lstsq_match_the_cpu(linalg_result: tuple[dict[str, Any], str]) -> None:
    """qr and lstsq of a batch of four 8x8 / 8x3 matrices, which PyTorch sends to cuBLAS's geqrfBatched and
    gelsBatched (m <= 256 and at least max(2, m / 16) matrices), in float32, complex64, float64 and complex128: Q and
    R equal the CPU's (LAPACK's reflectors and tau), and the least-squares solutions too."""
    assert_within(linalg_result[0], BATCHED_QR_CHECKS)


def test_double_linalg_ops_match_the_cpu(linalg_result: tuple[dict[str, Any], str]) -> None:
    """float64 and complex128: every check of the two tests above (solve, inv, det, cholesky, qr, eigh, svd, lstsq)
    through the D and Z functions and ATen's double-precision kernels around them (copies, fills, triu/tril, det's
    product and sign, conj, the residuals' squares and sums), to float64's precision."""
    assert_within(linalg_result[0], DOUBLE_CHECKS)


def assert_within(results: dict[str, Any], checks: set[str]) -> None:
    """Each check's relative difference within its type's rounding (a `_double` name: float64 or complex128)."""
    assert checks <= set(results), sorted(checks - set(results))
    failed = {k: results[k] for k in checks if not isinstance(results[k], float)
              or not results[k] <= (DOUBLE_TOLERANCE if k.endswith("_double") else TOLERANCE)}
    assert not failed, failed


def test_cusolver_calls_reach_the_server(linalg_server: Server, linalg_result: tuple[dict[str, Any], str]) -> None:
    """The factorizations are cuSOLVER calls forwarded at its own API (none computed by the client), and PyTorch's
    workspace-size queries before each are answered by the client after the first of each kind."""
    counts = library_calls(linalg_server)
    assert counts.get("cusolver", 0) >= 10, counts
    assert counts.get("cublas", 0) >= 2, counts  # getrfBatched and getrsBatched of the small batches


@pytest.mark.sim_only(reason="the cuda backend on stand-in libraries chained to a sim server")
def test_the_same_linalg_through_the_cuda_backend(tmp_path: Path, shim: Path) -> None:
    """The cuda backend's replay of cuSOLVER's and cuBLAS's calls, without a GPU: a cuda-backend server whose
    libcuda, libcublas and libcusolver are xpuremote's own stand-ins (named as such) talking to a sim server.
    Every check matches the CPU, and the factorizations reach the sim through the cuda backend."""
    sim = start_server(tmp_path, backend="sim", env={"XPU_SIM_KERNELS": KERNELS})
    stand_ins = {f"XPU_{lib.name.upper()}_LIBRARY": str(shim.parent / lib.soname)
                 for lib in (mathlibs.CUBLAS, mathlibs.CUBLASLT, mathlibs.CUSOLVER)}
    cuda = start_server(tmp_path, backend="cuda", env={"XPU_CUDA_LIBRARY": str(shim), "XPU_SERVER": sim.address,
                                                       **stand_ins})
    try:
        results, _ = run_math(cuda, LINALG)
    finally:
        cuda.stop()
        sim.stop()
    assert_within(results, CHECKS | COMPLEX_CHECKS | BATCHED_QR_CHECKS | DOUBLE_CHECKS)
    assert library_calls(sim).get("cusolver", 0) >= 10, library_calls(sim)


@pytest.mark.sim_only(reason="XPU_SIM_LIBRARY_VERSIONS makes the sim serve an older cuSOLVER")
def test_an_older_cusolver_on_the_server_is_refused_naming_both_versions(tmp_path: Any) -> None:
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": KERNELS, "XPU_SIM_LIBRARY_VERSIONS": "cusolver=11.7.1"})
    try:
        proc = run_torch(srv, ["-c", "import torch; a = torch.eye(3, device='cuda'); torch.linalg.cholesky(a)"])
    finally:
        srv.stop()
    assert proc.returncode != 0
    assert "cusolver 12.x" in proc.stderr and "11.7.1" in proc.stderr, proc.stderr[-3000:]


def test_the_sims_batched_qr_and_least_squares_follow_lapack_and_cublas() -> None:
    """In process, without PyTorch: the sim's cublasDgelsBatched solves each system as numpy's lstsq does and leaves
    the rest of Q^T C below the solution (whose squared norms are the residuals); a matrix whose R has an exactly
    zero diagonal element gets its position (1-based) in the device `info` and C left as Q^T C, unsolved, as xGELS
    leaves it; cublasDgeqrfBatched's reflectors and tau rebuild each matrix (Q R = A). Arguments cuBLAS refuses fail
    the call with its documented statuses."""
    from xpuremote.protocol import errors
    from xpuremote.server.backends.sim import Memory
    from xpuremote.server.backends.sim_solver import SolvingBlas, apply_q

    memory = Memory(1 << 20)
    blas = SolvingBlas(memory)
    rng = np.random.default_rng(0)
    m, n, nrhs = 6, 3, 2
    a = rng.standard_normal((3, m, n))
    a[2, :, 1] = 0  # rank deficient: R[1, 1] is exactly zero
    c = rng.standard_normal((3, m, nrhs))

    def matrices(values: np.ndarray) -> tuple[list[int], int]:
        """Each matrix column-major in its own buffer, and the device array of their addresses."""
        buffers = [memory.alloc(v.nbytes) for v in values]
        for buffer, v in zip(buffers, values, strict=True):
            memory.write(buffer, np.asfortranarray(v).tobytes(order="F"))
        array = memory.alloc(8 * len(buffers))
        memory.write(array, struct.pack(f"<{len(buffers)}Q", *buffers))
        return buffers, array

    def read(buffer: int, shape: tuple[int, int]) -> np.ndarray:
        return np.frombuffer(bytes(memory.read(buffer, 8 * shape[0] * shape[1])), "<f8").reshape(shape, order="F")

    a_buffers, a_array = matrices(a)
    c_buffers, c_array = matrices(c)
    info = memory.alloc(4 * 3)
    assert blas.cublasDgelsBatched(None, 0, m, n, nrhs, a_array, m, c_array, m, info, 3) == (0,)
    assert list(np.frombuffer(bytes(memory.read(info, 12)), "<i4")) == [0, 0, 2]
    for i in range(2):
        solution, residuals, _, _ = np.linalg.lstsq(a[i], c[i], rcond=None)
        found = read(c_buffers[i], (m, nrhs))
        np.testing.assert_allclose(found[:n], solution, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose((found[n:] ** 2).sum(axis=0), residuals, rtol=1e-12)
    q, _ = np.linalg.qr(a[2], mode="complete")
    unsolved = read(c_buffers[2], (m, nrhs))  # Q^T C; Q's columns are unique up to sign
    np.testing.assert_allclose(np.abs(unsolved), np.abs(q.T @ c[2]), atol=1e-12)

    qr_buffers, qr_array = matrices(a[:2])
    tau_buffers, tau_array = matrices(np.zeros((2, n, 1)))
    assert blas.cublasDgeqrfBatched(None, m, n, qr_array, m, tau_array, 2) == (0,)
    for i in range(2):
        factors, taus = read(qr_buffers[i], (m, n)), read(tau_buffers[i], (n, 1))[:, 0]
        np.testing.assert_allclose(apply_q(factors, taus, np.triu(factors), False), a[i], atol=1e-12)

    refusals = [(blas.cublasSgelsBatched, (None, 0, 2, 3, 1, a_array, 2, c_array, 2, info, 1), "not_supported"),
                (blas.cublasSgelsBatched, (None, 1, m, n, 1, a_array, m, c_array, m, info, 1), "not_supported"),
                (blas.cublasSgelsBatched, (None, 0, m, n, 1, a_array, m, c_array, m - 1, info, 1), "invalid_value"),
                (blas.cublasSgeqrfBatched, (None, m, n, a_array, m - 1, tau_array, 1), "invalid_value"),
                (blas.cublasSgeqrfBatched, (None, m, n, a_array, m, tau_array, -1), "invalid_value")]
    for call, args, outcome in refusals:
        with pytest.raises(errors.CudaError) as refused:
            call(*args)
        assert refused.value.code == mathlibs.status_code(mathlibs.CUBLAS, outcome), (call.__name__, args)


LANE_PROGRAM = r"""
import ctypes, json
import numpy as np

cu, solver = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libcusolver.so.12")
N, ROUNDS, LOWER, OP_N = 4, 3, 0, 0
context, stream, handle = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cu.cuCtxSetCurrent(context) == 0 and cu.cuStreamCreate(ctypes.byref(stream), 1) == 0
assert solver.cusolverDnCreate(ctypes.byref(handle)) == 0 and solver.cusolverDnSetStream(handle, stream) == 0
P, I = ctypes.c_uint64, ctypes.c_int
for t in "SD":  # the handle travels as the pointer it is, device memory as numbers
    for name, args in (("getrf", [I, I, P, I, P, P, P]), ("getrs", [I, I, I, P, I, P, P, I, P]),
                       ("potrf", [I, I, P, I, P, I, P]), ("potrs", [I, I, I, P, I, P, I, P])):
        getattr(solver, f"cusolverDn{t}{name}").argtypes = [ctypes.c_void_p, *args]


def device(array):
    address = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(address), max(array.nbytes, 8)) == 0
    upload(address.value, array)
    return address.value


def upload(address, array):
    assert cu.cuMemcpyHtoD_v2(P(address), array.ctypes.data_as(ctypes.c_void_p), array.nbytes) == 0


def read(address, dtype, count):
    out = np.empty(count, dtype)
    assert cu.cuMemcpyDtoH_v2(out.ctypes.data_as(ctypes.c_void_p), P(address), out.nbytes) == 0
    return out


rng = np.random.default_rng(5)
results, statuses = {}, {}
for t, dtype in (("S", np.float32), ("D", np.float64)):
    a = rng.standard_normal((N, N)) + N * np.eye(N)
    for kind, matrix in (("getrf", a), ("potrf", a @ a.T)):
        fortran = np.asfortranarray(matrix, dtype)
        A, B = device(fortran.ravel("K")), device(np.zeros(N, dtype))
        ipiv, info, lwork = device(np.zeros(N, np.int32)), device(np.zeros(1, np.int32)), ctypes.c_int()
        size = getattr(solver, f"cusolverDn{t}{kind}_bufferSize")
        assert size(handle, *((N, N) if kind == "getrf" else (LOWER, N)), P(A), N, ctypes.byref(lwork)) == 0
        work = device(np.zeros(max(lwork.value, 1), dtype))
        solved = []
        for r in range(ROUNDS):  # the first of each through the client, the others queued in C
            b = rng.standard_normal(N)
            upload(A, fortran.ravel("K"))
            upload(B, b.astype(dtype))
            if kind == "getrf":
                status = getattr(solver, f"cusolverDn{t}getrf")(handle, N, N, A, N, work, ipiv, info) \
                    or getattr(solver, f"cusolverDn{t}getrs")(handle, OP_N, N, 1, A, N, ipiv, B, N, info)
            else:
                status = getattr(solver, f"cusolverDn{t}potrf")(handle, LOWER, N, A, N, work, lwork.value, info) \
                    or getattr(solver, f"cusolverDn{t}potrs")(handle, LOWER, N, 1, A, N, B, N, info)
            assert cu.cuStreamSynchronize(stream) == 0 and status == 0, status
            got = read(B, dtype, N)
            solved.append(float(np.abs(got - np.linalg.solve(matrix, b)).max()) < 1e-3)
            assert read(info, np.int32, 1)[0] == 0
        results[t + kind] = solved
    # a refused size after the handle took the lane: queued in C, failing at the next wait as without the lane
    statuses[t + "negative"] = getattr(solver, f"cusolverDn{t}getrf")(handle, -1, N, A, N, work, ipiv, info)
    statuses[t + "negative_sync"] = cu.cuCtxSynchronize()
assert solver.cusolverDnDestroy(handle) == 0  # a destroyed handle's factorization: the client's, failing as before
statuses["destroyed"] = solver.cusolverDnSgetrf(handle, N, N, A, N, work, ipiv, info)
statuses["destroyed_sync"] = cu.cuCtxSynchronize()
statuses["unknown"] = solver.cusolverDnSgetrf(ctypes.c_void_p(0x7E57_0000), N, N, A, N, work, ipiv, info)
statuses["unknown_sync"] = cu.cuCtxSynchronize()
print(json.dumps({"results": results, "statuses": statuses}))
"""


@pytest.mark.sim_only(reason="counts the sim's library calls per session; the client's side is the same on any "
                      "backend")
def test_a_handles_factorizations_are_queued_in_c_after_the_first(shim: Path, tmp_path: Path) -> None:
    """cusolverDn?getrf + ?getrs and ?potrf + ?potrs of float and double, three rounds each on one handle, as
    torch.linalg's solve and cholesky call them: the first of each through the client, which then lets C queue the
    handle's next ones of the kind in the fast lane (interpose/kept.h's HANDLE_CALL). With the lane and without, the
    same solutions (numpy's) and statuses, and the same calls reach the server; with it the client sees one of each
    kind. A refused size is queued in C and fails at the next wait as it does without the lane; a destroyed and an
    unknown handle's factorization go through the client and fail as before."""
    lanes = lane_runs(LANE_PROGRAM, tmp_path, shim, "cusolver")
    out, runs = lanes.out, lanes.runs
    assert out["results"] == {k: [True] * 3 for k in ("Sgetrf", "Spotrf", "Dgetrf", "Dpotrf")}, out
    statuses = out["statuses"]
    for key in ("Snegative", "Dnegative", "destroyed", "unknown"):
        assert statuses[key] == 0 and statuses[key + "_sync"] != 0, statuses  # queued; the failure deferred
    in_c, by_core = runs["1"][1], runs["0"][1]
    for t in "SD":
        for kind in ("getrs", "potrf", "potrs"):
            assert by_core[f"cusolverDn{t}{kind}"][0] == 3 and in_c[f"cusolverDn{t}{kind}"][0] == 1, (kind, in_c)
    assert by_core["cusolverDnDgetrf"][0] == 3 + 1 and in_c["cusolverDnDgetrf"][0] == 1, in_c  # the refused size
    assert by_core["cusolverDnSgetrf"][0] == 3 + 3 and in_c["cusolverDnSgetrf"][0] == 1 + 2, in_c
    served = lanes.served
    lane = lanes.from_lane
    assert len(served) == 2 and served[0] == served[1], served
    assert lane[0] >= lane[1] + 2 * 2 * 2 * 2 + 2, lane  # the run with the lane (first) ran 18 from it


# cuSOLVER's factorizations as the shim's C queues them (kept.h's HANDLE_CALL: the handle and the arguments as they
# are), run by a cuda-backend session whose cuSOLVER is the stand-in (xpuremote's own replacement library, named as
# such) on the sim, or NVIDIA's
NATIVE_SCENARIO = r"""
import numpy as np

HANDLE, N = 0x7C00_0000_5000, 4


def device(data):
    address = int.from_bytes(batch(("cuMemAlloc_v2", [8, max(data.nbytes, 8)]))[0], "little")
    upload(address, data)
    return address


def upload(address, data):
    batch(("cuMemcpyHtoD_v2", [address, data.tobytes(), data.nbytes]))


def record(symbol, *args):
    call = CALLS[symbol]
    head = abi.pack_lane_record(opcode=call.opcode, nargs=len(args), blob_at=abi.LANE_NO_BLOB, ctx=CTX)
    return head + struct.pack(f"<{len(args)}Q", *(a & (2**64 - 1) for a in args))


batch(("cuCtxCreate_v2", [CTX, 0, 0]), ("cusolverDnCreate", [HANDLE]))
matrix = np.arange(N * N, dtype=np.float64).reshape(N, N) % 7 + N * np.eye(N)
A, B = device(matrix.ravel("F")), device(np.zeros(N))
ipiv, info = device(np.zeros(N, np.int32)), device(np.zeros(1, np.int32))
lwork = int.from_bytes(batch(("cusolverDnDgetrf_bufferSize", [HANDLE, N, N, A, N, 4]))[0], "little", signed=True)
work = device(np.zeros(max(lwork, 1)))
clear = record("cuMemsetD32Async", info, 0, 1, 0)  # a lane's first record runs in Python (its context is set)
ran, errors, failures = [], [], []
for r in range(3):  # the first round in Python, the others of the same values in C
    b = np.arange(N, dtype=np.float64) + r
    upload(A, matrix.ravel("F"))
    upload(B, b)
    failures += lane(clear, record("cusolverDnDgetrf", HANDLE, N, N, A, N, work, ipiv, info),
                     record("cusolverDnDgetrs", HANDLE, 0, N, 1, A, N, ipiv, B, N, info))
    ran.append(in_c())
    got = np.frombuffer(batch(("cuMemcpyDtoH_v2", [N * 8, B, N * 8]))[0], np.float64)
    errors.append(float(np.abs(got - np.linalg.solve(matrix, b)).max()))
failures += lane(clear, record("cusolverDnDgetrf", HANDLE, -1, N, A, N, work, ipiv, info),
                 record("cusolverDnDgetrf", HANDLE + 8, N, N, A, N, work, ipiv, info))
ran.append(in_c())
batch(("cusolverDnDestroy", [HANDLE]))
failures += lane(clear, record("cusolverDnDgetrf", HANDLE, N, N, A, N, work, ipiv, info))
ran.append(in_c())
print(json.dumps({"ran": ran, "failures": failures, "solved": max(errors) < 1e-9}))
"""


def test_a_handles_factorizations_run_in_c_where_python_ran_the_same_values(driver_env: dict[str, str],
                                                                             shim: Path) -> None:
    """A factorization's and a solve's records run in the worker's C (server/native_lane.c, VETTED) once the
    session's Python ran ones of the same values. The same solutions and failures in C and in Python; a refused size
    and an unknown handle go to Python, and so does a destroyed handle's (C forgets at the destroy), each refused as
    before."""
    env = {**driver_env, "XPU_CUSOLVER_LIBRARY": str(shim.parent / mathlibs.CUSOLVER.soname)} if driver_env \
        else driver_env
    results = dict(zip("10", in_c_and_in_python(NATIVE_SCENARIO, env), strict=True))
    assert results["1"].pop("ran") == [0, 2, 4, 4, 4] and results["0"].pop("ran") == [0] * 5, results
    assert results["1"] == results["0"]
    # the unknown and the destroyed handle's; a refused size too where the library refuses it at once (NVIDIA's; the
    # stand-in's sim defers it to the stand-in's next wait)
    assert {name for name, _ in results["1"]["failures"]} == {"cusolverDnDgetrf"}, results
    assert len(results["1"]["failures"]) >= 2, results
    assert results["1"]["solved"], results
