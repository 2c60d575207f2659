"""torch.sparse through xpuremote's cuSPARSE: the stock wheel's sparse products reach xpuremote's replacement
libcusparse.so.12, travel to the server and are computed there, by the sim device with numpy
(server/backends/sim_sparse.py) or (XPU_TEST_BACKEND=cuda) by NVIDIA's cuSPARSE on the server's GPU;
tests/programs/torch_sparse_check.py compares each result with the CPU's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, lane_runs, start_server
from test_native_lane import in_c_and_in_python
from test_torch import run_torch
from test_torch_math import assert_close, library_calls

from xpuremote.protocol import mathlibs

SPARSE = ROOT / "tests" / "programs" / "torch_sparse_check.py"
CHECKS = {"csr_times_dense", "csr_times_dense_fp64", "csr_addmm_alpha_beta", "csr_times_transposed_dense",
          "coo_times_dense", "csr_times_vector", "csr_addmv_alpha_beta"}


def run_sparse(server: Server) -> tuple[dict[str, Any], str]:
    proc = run_torch(server, [str(SPARSE)])
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1]), proc.stderr


def test_sparse_times_dense_and_vector_match_the_cpu_and_reach_the_server(tmp_path: Path) -> None:
    """CSR and COO times a dense matrix (with alpha and beta, a transposed operand, fp64) and CSR times a vector
    are the CPU's; cuSPARSE's calls are counted where they run, none refused, and nothing asks NVIDIA's libraries'
    private tables (NVIDIA's own libcusparse, mapped beside the replacement, launched its own kernels before)."""
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS})
    try:
        results, stderr = run_sparse(srv)
    finally:
        srv.stop()
    assert set(results) >= CHECKS, results
    assert_close(results)
    # seven products: each a handle's stream, four descriptors, a buffer size, the product, three destroys
    assert library_calls(srv).get("cusparse", 0) >= 7 * 5, library_calls(srv)
    assert "private table" not in stderr and "not supported by xpuremote" not in stderr, stderr[-3000:]
    assert not re.search(r"cusparse\w* failed", srv.log()), srv.log()[-3000:]


VERSIONS = ("import torch; a = torch.eye(4).to_sparse_csr().cuda(); "
            "print((a @ torch.ones(4, 2, device='cuda')).sum().item())")


@pytest.mark.sim_only(reason="the server's library versions are the sim's claim (XPU_SIM_LIBRARY_VERSIONS)")
def test_a_server_with_an_older_cusparse_major_is_refused_at_the_handle(tmp_path: Path) -> None:
    """A server whose cuSPARSE is of another major than the headers the replacement was generated from refuses
    the first cusparseCreate, naming both versions; the program gets cuSPARSE's error, not a crash."""
    from xpuremote.protocol import cusparse_api

    major = cusparse_api.VERSION[0]
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS,
                                      "XPU_SIM_LIBRARY_VERSIONS": f"cusparse={major - 1}.5.0"})
    try:
        proc = run_torch(srv, ["-c", VERSIONS])
    finally:
        srv.stop()
    assert proc.returncode != 0
    assert f"cannot serve cusparse {major}.x" in proc.stderr, proc.stderr[-3000:]
    assert f"the server has {major - 1}.5.0" in proc.stderr, proc.stderr[-3000:]
    assert "CUSPARSE_STATUS_NOT_SUPPORTED" in proc.stderr, proc.stderr[-3000:]


LANE_PROGRAM = r"""
import ctypes, json
import numpy as np

cu, sparse = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libcusparse.so.12")
ROUNDS, I32, R_32F = 3, 2, 0
P, I, V = ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p
context, stream, handle, csr, x, y = (ctypes.c_void_p() for _ in range(6))
assert cu.cuInit(0) == 0 and cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), 0) == 0
assert cu.cuCtxSetCurrent(context) == 0 and cu.cuStreamCreate(ctypes.byref(stream), 1) == 0
assert sparse.cusparseCreate(ctypes.byref(handle)) == 0 and sparse.cusparseSetStream(handle, stream) == 0
sparse.cusparseXcoo2csr.argtypes = [V, P, I, I, P, I]
sparse.cusparseCreateCsr.argtypes = [V, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, P, P, P, I, I, I, I]
sparse.cusparseCsrSetPointers.argtypes = [V, P, P, P]
sparse.cusparseCreateDnVec.argtypes = [V, ctypes.c_int64, P, I]
sparse.cusparseSpMV.argtypes = [V, I, V, V, V, V, V, I, I, P]
sparse.cusparseSetPointerMode.argtypes = [V, I]


def device(array):
    address = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(address), array.nbytes) == 0
    assert cu.cuMemcpyHtoD_v2(address, array.ctypes.data_as(ctypes.c_void_p), array.nbytes) == 0
    return address.value


def read(address, dtype, count):
    out = np.empty(count, dtype)
    assert cu.cuMemcpyDtoH_v2(out.ctypes.data_as(ctypes.c_void_p), P(address), out.nbytes) == 0
    return out


rng = np.random.default_rng(11)
results, statuses = {"coo2csr": [], "spmv": []}, {}
for _ in range(ROUNDS):  # the first through the client, the others queued in C
    rows = np.sort(rng.integers(0, 4, 9)).astype(np.int32)
    coo, ptr = device(rows), device(np.zeros(5, np.int32))
    statuses["coo2csr"] = sparse.cusparseXcoo2csr(handle, coo, 9, 4, ptr, 0)
    assert cu.cuStreamSynchronize(stream) == 0
    results["coo2csr"].append(read(ptr, np.int32, 5).tolist() == np.searchsorted(rows, np.arange(5)).tolist())
# a 3x3 CSR matrix whose values change before each product (cusparseCsrSetPointers, queued in C after the first)
offsets, columns = device(np.array([0, 2, 3, 5], np.int32)), device(np.array([0, 2, 1, 0, 2], np.int32))
dense_x = np.array([1.0, 2.0, 3.0], np.float32)
assert sparse.cusparseCreateCsr(ctypes.byref(csr), 3, 3, 5, offsets, columns, device(np.ones(5, np.float32)), I32,
                                I32, 0, R_32F) == 0
out = device(np.zeros(3, np.float32))
assert sparse.cusparseCreateDnVec(ctypes.byref(x), 3, device(dense_x), R_32F) == 0
assert sparse.cusparseCreateDnVec(ctypes.byref(y), 3, out, R_32F) == 0
alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
for _ in range(ROUNDS):
    values = rng.standard_normal(5).astype(np.float32)
    statuses["set"] = sparse.cusparseCsrSetPointers(csr, offsets, columns, device(values))
    statuses["spmv"] = sparse.cusparseSpMV(handle, 0, ctypes.byref(alpha), csr, x, ctypes.byref(beta), y, R_32F, 0, 0)
    assert cu.cuStreamSynchronize(stream) == 0
    matrix = np.zeros((3, 3), np.float32)
    matrix[[0, 0, 1, 2, 2], [0, 2, 1, 0, 2]] = values
    results["spmv"].append(bool(np.abs(read(out, np.float32, 3) - matrix @ dense_x).max() < 1e-5))
# device pointer mode: alpha and beta are device addresses, which the client sends as they are (C forgot the handle's
# products at the change); back in host mode, the first product goes through the client again
assert sparse.cusparseSetPointerMode(handle, 1) == 0
alpha_at, beta_at = device(np.array([2.0], np.float32)), device(np.array([0.0], np.float32))
statuses["spmv_device"] = sparse.cusparseSpMV(handle, 0, V(alpha_at), csr, x, V(beta_at), y, R_32F, 0, 0)
assert cu.cuStreamSynchronize(stream) == 0
results["spmv_device"] = bool(np.abs(read(out, np.float32, 3) - 2 * matrix @ dense_x).max() < 1e-5)
assert sparse.cusparseSetPointerMode(handle, 0) == 0
statuses["spmv_host"] = sparse.cusparseSpMV(handle, 0, ctypes.byref(alpha), csr, x, ctypes.byref(beta), y, R_32F, 0,
                                            0)
assert cu.cuStreamSynchronize(stream) == 0
results["spmv_host"] = bool(np.abs(read(out, np.float32, 3) - matrix @ dense_x).max() < 1e-5)
# an unknown descriptor: queued (in C with the lane), refused by the server at the next wait either way
statuses["spmv_unknown"] = sparse.cusparseSpMV(handle, 0, ctypes.byref(alpha), V(0x7E57_0010), x, ctypes.byref(beta),
                                               y, R_32F, 0, 0)
statuses["spmv_unknown_sync"] = cu.cuCtxSynchronize()
assert sparse.cusparseDestroySpMat(csr) == 0  # a destroyed descriptor's setter: the client's, failing as before
statuses["destroyed_set"] = sparse.cusparseCsrSetPointers(csr, offsets, columns, out)
statuses["destroyed_set_sync"] = cu.cuCtxSynchronize()
statuses["unknown"] = sparse.cusparseXcoo2csr(V(0x7E57_0000), coo, 9, 4, ptr, 0)
statuses["unknown_sync"] = cu.cuCtxSynchronize()
assert sparse.cusparseDestroy(handle) == 0
statuses["destroyed"] = sparse.cusparseXcoo2csr(handle, coo, 9, 4, ptr, 0)
statuses["destroyed_sync"] = cu.cuCtxSynchronize()
print(json.dumps({"results": results, "statuses": statuses}))
"""


@pytest.mark.sim_only(reason="counts the sim's library calls per session; the client's side is the same on any "
                      "backend")
def test_a_handles_conversions_products_and_a_descriptors_pointers_are_queued_in_c_after_the_first(
        shim: Path, tmp_path: Path) -> None:
    """cusparseXcoo2csr three times on one handle, as PyTorch calls it before each product of a COO matrix, and
    cusparseCsrSetPointers three times on one descriptor, each followed by an SpMV: the first of each through the
    client, which then lets C queue that handle's or descriptor's next ones in the fast lane (interpose/kept.h's
    HANDLE_CALL; SpMV's alpha and beta as their bytes). With the lane and without, the same results (numpy's; each
    product sees the values set just before it) and statuses, and the same calls reach the server; with it the
    client sees one of each. An SpMV in device pointer mode, and the first back in host mode, go through the client
    (C forgot the handle's products at each change); an unknown descriptor's SpMV is queued and fails at the next
    wait, with the lane and without. A destroyed descriptor's setter, an unknown and a destroyed handle's conversion
    go through the client and fail as before."""
    lanes = lane_runs(LANE_PROGRAM, tmp_path, shim, "cusparse")
    out, runs = lanes.out, lanes.runs
    assert out["results"] == {"coo2csr": [True] * 3, "spmv": [True] * 3, "spmv_device": True, "spmv_host": True}, out
    statuses = out["statuses"]
    assert statuses["coo2csr"] == statuses["set"] == statuses["spmv"] == 0, statuses
    assert statuses["spmv_device"] == statuses["spmv_host"] == 0, statuses
    for key in ("spmv_unknown", "destroyed_set", "unknown", "destroyed"):
        assert statuses[key] == 0 and statuses[key + "_sync"] != 0, statuses  # queued; the failure deferred
    in_c, by_core = runs["1"][1], runs["0"][1]
    assert by_core["cusparseXcoo2csr"][0] == 3 + 2 and in_c["cusparseXcoo2csr"][0] == 1 + 2, in_c
    assert by_core["cusparseCsrSetPointers"][0] == 3 + 1 and in_c["cusparseCsrSetPointers"][0] == 1 + 1, in_c
    # three in host mode, one in device mode, one back in host mode, one of an unknown descriptor
    assert by_core["cusparseSpMV"][0] == 3 + 3 and in_c["cusparseSpMV"][0] == 1 + 2, in_c
    served = lanes.served
    lane = lanes.from_lane
    assert len(served) == 2 and served[0] == served[1], served
    assert lane[0] >= lane[1] + 7, lane  # the run with the lane (first) ran 7 from it


# cuSPARSE's conversions as the shim's C queues them (kept.h's HANDLE_CALL: the handle and the arguments as they are),
# run by a cuda-backend session whose cuSPARSE is the stand-in (xpuremote's own replacement library, named as such) on
# the sim, or NVIDIA's
NATIVE_SCENARIO = r"""
import numpy as np

HANDLE = 0x7C00_0000_6000


def device(data):
    address = int.from_bytes(batch(("cuMemAlloc_v2", [8, data.nbytes]))[0], "little")
    batch(("cuMemcpyHtoD_v2", [address, data.tobytes(), data.nbytes]))
    return address


def record(symbol, *args, scalars=0):
    call = CALLS[symbol]
    head = abi.pack_lane_record(opcode=call.opcode, nargs=len(args), blob_at=abi.LANE_NO_BLOB, ctx=CTX,
                                scalars=scalars, scalar_size=4 if scalars else 0)
    return head + struct.pack(f"<{len(args)}Q", *(a & (2**64 - 1) for a in args))


batch(("cuCtxCreate_v2", [CTX, 0, 0]), ("cusparseCreate", [HANDLE]))
rows = np.array([0, 0, 1, 3, 3, 3], np.int32)
coo, ptr = device(rows), device(np.zeros(5, np.int32))
clear = record("cuMemsetD32Async", ptr, 0, 5, 0)  # a lane's first record runs in Python (its context is set)
ran, converted, failures = [], [], []
for _ in range(3):  # the first in Python, the others of the same values in C
    failures += lane(clear, record("cusparseXcoo2csr", HANDLE, coo, 6, 4, ptr, 0))
    ran.append(in_c())
    converted.append(np.frombuffer(batch(("cuMemcpyDtoH_v2", [20, ptr, 20]))[0], np.int32).tolist())
# y = alpha A x of the 4x4 CSR matrix of those row offsets (values 1..6), alpha's bytes in its slot as C puts them
CSR, X, Y = HANDLE + 0x100, HANDLE + 0x200, HANDLE + 0x300
columns, values = device(np.array([0, 3, 1, 0, 2, 3], np.int32)), device(np.arange(1, 7, dtype=np.float32))
x, y = device(np.array([1, 2, 3, 4], np.float32)), device(np.zeros(4, np.float32))
batch(("cusparseCreateCsr", [CSR, 4, 4, 6, ptr, columns, values, 2, 2, 0, 0]), ("cusparseCreateDnVec", [X, 4, x, 0]),
      ("cusparseCreateDnVec", [Y, 4, y, 0]))
scalar = lambda v: int.from_bytes(struct.pack("<f", v), "little")
spmv = lambda alpha, matrix=CSR: record("cusparseSpMV", HANDLE, 0, scalar(alpha), matrix, X, scalar(0.0), Y, 0, 0, 0,
                                        scalars=0b100100)
products, zero = [], record("cuMemsetD32Async", y, 0, 4, 0)
for alpha in (2.0, 2.0, 2.0, 3.0):  # the first in Python, then in C: of the same values (a scalar's bytes apart)
    failures += lane(zero, spmv(alpha))
    ran.append(in_c())
    products.append(np.frombuffer(batch(("cuMemcpyDtoH_v2", [16, y, 16]))[0], np.float32).tolist())
failures += lane(zero, spmv(2.0, matrix=CSR + 8))  # an unknown descriptor
ran.append(in_c())
failures += lane(clear, record("cusparseXcoo2csr", HANDLE, coo, 6, 4, ptr, 1),
                 record("cusparseXcoo2csr", HANDLE + 8, coo, 6, 4, ptr, 0))
ran.append(in_c())
batch(("cusparseDestroy", [HANDLE]))
failures += lane(clear, record("cusparseXcoo2csr", HANDLE, coo, 6, 4, ptr, 0))
ran.append(in_c())
print(json.dumps({"ran": ran, "failures": failures, "converted": converted, "products": products}))
"""


def test_a_handles_conversions_run_in_c_where_python_ran_the_same_values(driver_env: dict[str, str],
                                                                         shim: Path) -> None:
    """An Xcoo2csr record, and an SpMV's with alpha and beta as their bytes, run in the worker's C
    (server/native_lane.c, VETTED) once the session's Python ran one of the same values (an SpMV's alpha apart, as a
    GEMM's). The same results and failures in C and in Python; new values, an unknown handle and an unknown
    descriptor go to Python, and so does a destroyed handle's (C forgets at the destroy), the unknown and destroyed
    ones refused as before."""
    env = {**driver_env, "XPU_CUSPARSE_LIBRARY": str(shim.parent / mathlibs.CUSPARSE.soname)} if driver_env \
        else driver_env
    results = dict(zip("10", in_c_and_in_python(NATIVE_SCENARIO, env), strict=True))
    assert results["1"].pop("ran") == [0, 1, 2, 2, 3, 4, 5, 5, 5, 5] and results["0"].pop("ran") == [0] * 10, results
    assert results["1"] == results["0"]
    assert results["1"]["converted"] == [[0, 2, 3, 3, 6]] * 3, results
    matrix = np.zeros((4, 4), np.float32)
    matrix[[0, 0, 1, 3, 3, 3], [0, 3, 1, 0, 2, 3]] = np.arange(1, 7)
    expected = [(alpha * matrix @ np.arange(1, 5)).tolist() for alpha in (2, 2, 2, 3)]
    assert results["1"]["products"] == expected, results
    assert [name for name, _ in results["1"]["failures"]] == ["cusparseSpMV", "cusparseXcoo2csr", "cusparseXcoo2csr"], \
        results
