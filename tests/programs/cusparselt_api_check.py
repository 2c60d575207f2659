"""cuSPARSELt's own API from a program (ctypes into libcusparseLt.so.0, device memory from the driver API), against
numpy on the CPU; run with xpuremote's libraries preloaded by tests/test_sparselt.py. Prints one JSON line: per
check, the largest difference from numpy's result relative to its largest magnitude, or a status or value.

What PyTorch does not reach: pruning (strips and tiles) and its check, the plan's compression, fp32, alpha and
beta, a transposed dense operand, a struct initialised twice and a copy of one, a struct never initialised.
"""

from __future__ import annotations

import ctypes
import itertools
import json

import numpy as np

CU, LT = ctypes.CDLL("libcuda.so.1"), ctypes.CDLL("libcusparseLt.so.0")
R_32F, ORDER_COL, ORDER_ROW, OP_N, OP_T, COMPUTE_32F = 0, 1, 2, 0, 1, 2
TILE, STRIP = 0, 1
results: dict[str, float | int] = {}
rng = np.random.default_rng(0)
M, K, N = 32, 64, 16


def ok(status: int, what: str) -> None:
    if status:
        raise RuntimeError(f"{what}: status {status}")


class Device:
    def __init__(self, array: np.ndarray) -> None:
        self.nbytes, address = array.nbytes, ctypes.c_uint64()
        ok(CU.cuMemAlloc_v2(ctypes.byref(address), self.nbytes), "cuMemAlloc")
        self.ptr = ctypes.c_void_p(address.value)
        ok(CU.cuMemcpyHtoD_v2(address, np.ascontiguousarray(array).ctypes.data_as(ctypes.c_void_p), self.nbytes),
           "cuMemcpyHtoD")

    def read(self, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        out = np.empty(shape, dtype)
        ok(CU.cuCtxSynchronize(), "cuCtxSynchronize")
        ok(CU.cuMemcpyDtoH_v2(out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(self.ptr.value), out.nbytes),
           "cuMemcpyDtoH")
        return out


def struct() -> ctypes.Array:
    return ctypes.create_string_buffer(512)


def rel(device: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(device - expected).max() / np.abs(expected).max())


def strip_pruned(a: np.ndarray) -> np.ndarray:
    """The two largest magnitudes of every four along each row kept."""
    out = np.zeros_like(a)
    for r, g in itertools.product(range(a.shape[0]), range(0, a.shape[1], 4)):
        for c in np.argsort(-np.abs(a[r, g:g + 4]), kind="stable")[:2]:
            out[r, g + c] = a[r, g + c]
    return out


def tile_pruned(a: np.ndarray) -> np.ndarray:
    """In each 4x4 tile, the eight elements of the largest L1 norm with two in each row and each column."""
    rows = [c for c in itertools.combinations(range(4), 2)]
    patterns = [p for p in itertools.product(rows, repeat=4)
                if all(sum(col in r for r in p) == 2 for col in range(4))]
    out = np.zeros_like(a)
    for r0, c0 in itertools.product(range(0, a.shape[0], 4), range(0, a.shape[1], 4)):
        tile = np.abs(a[r0:r0 + 4, c0:c0 + 4])
        best = max(patterns, key=lambda p: sum(tile[i, j] for i, row in enumerate(p) for j in row))
        for i, row in enumerate(best):
            for j in row:
                out[r0 + i, c0 + j] = a[r0 + i, c0 + j]
    return out


def main() -> None:
    ok(CU.cuInit(0), "cuInit")
    device, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(CU.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    ok(CU.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
    ok(CU.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    handle, sparse, dense_b, dense_bt, dense_c = struct(), struct(), struct(), struct(), struct()
    results["never_initialised_status"] = LT.cusparseLtDestroy(struct())
    ok(LT.cusparseLtInit(handle), "cusparseLtInit")
    version = ctypes.c_int()
    ok(LT.cusparseLtGetVersion(handle, ctypes.byref(version)), "cusparseLtGetVersion")
    results["version"] = version.value
    i64, u32 = ctypes.c_int64, ctypes.c_uint32
    ok(LT.cusparseLtStructuredDescriptorInit(handle, sparse, i64(M), i64(K), i64(K), u32(16), R_32F, ORDER_ROW, 0),
       "structured")
    ok(LT.cusparseLtDenseDescriptorInit(handle, dense_b, i64(K), i64(N), i64(K), u32(16), R_32F, ORDER_COL), "B")
    ok(LT.cusparseLtDenseDescriptorInit(handle, dense_bt, i64(N), i64(K), i64(K), u32(16), R_32F, ORDER_ROW), "Bt")
    ok(LT.cusparseLtDenseDescriptorInit(handle, dense_c, i64(M), i64(N), i64(N), u32(16), R_32F, ORDER_ROW), "C")
    a = rng.standard_normal((M, K)).astype(np.float32)
    matmul = struct()
    for _ in range(2):  # a struct initialised again: its object replaced, not leaked
        ok(LT.cusparseLtMatmulDescriptorInit(handle, matmul, OP_N, OP_N, sparse, dense_b, dense_c, dense_c,
                                             COMPUTE_32F), "matmul descriptor")
    # pruning: strips in place through the matmul descriptor, tiles through the matrix descriptor
    d_a, d_tiles, valid = Device(a), Device(a), Device(np.zeros(2, np.int32))
    ok(LT.cusparseLtSpMMAPruneCheck(handle, matmul, d_a.ptr, valid.ptr, None), "prune check")
    ok(LT.cusparseLtSpMMAPrune(handle, matmul, d_a.ptr, d_a.ptr, STRIP, None), "prune")
    ok(LT.cusparseLtSpMMAPruneCheck2(handle, sparse, 1, OP_N, d_a.ptr, ctypes.c_void_p(valid.ptr.value + 4), None),
       "prune check 2")
    checked = valid.read(np.int32, (2,))
    results["prune_check_before"], results["prune_check_after"] = int(checked[0]), int(checked[1])
    pruned = d_a.read(np.float32, (M, K))
    results["prune_strip"] = rel(pruned, strip_pruned(a))
    ok(LT.cusparseLtSpMMAPrune2(handle, sparse, 1, OP_N, d_tiles.ptr, d_tiles.ptr, TILE, None), "prune tile")
    results["prune_tile"] = rel(d_tiles.read(np.float32, (M, K)), tile_pruned(a))
    # the plan, its compression, the product with alpha and beta
    alg, plan, copy = struct(), struct(), struct()
    ok(LT.cusparseLtMatmulAlgSelectionInit(handle, alg, matmul, 0), "alg selection")
    ok(LT.cusparseLtMatmulPlanInit(handle, plan, matmul, alg), "plan")
    size, buffer_size, workspace = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
    ok(LT.cusparseLtMatmulGetWorkspace(handle, plan, ctypes.byref(workspace)), "workspace")
    ok(LT.cusparseLtSpMMACompressedSize(handle, plan, ctypes.byref(size), ctypes.byref(buffer_size)), "size")
    compressed = Device(np.zeros(size.value, np.uint8))
    ok(LT.cusparseLtSpMMACompress(handle, plan, d_a.ptr, compressed.ptr, None, None), "compress")
    b, c = rng.standard_normal((K, N)).astype(np.float32), rng.standard_normal((M, N)).astype(np.float32)
    d_b, d_c, d_d = Device(b.T.copy()), Device(c), Device(np.zeros((M, N), np.float32))  # B column-major
    alpha, beta = ctypes.c_float(2.0), ctypes.c_float(0.5)
    stream = (ctypes.c_void_p * 1)(None)
    ctypes.memmove(copy, plan, 512)  # a copy of the plan's struct names the same plan
    ok(LT.cusparseLtMatmul(handle, copy, ctypes.byref(alpha), compressed.ptr, d_b.ptr, ctypes.byref(beta), d_c.ptr,
                           d_d.ptr, None, stream, 1), "matmul")
    expected = 2 * pruned @ b + 0.5 * c
    results["matmul_alpha_beta_fp32"] = rel(d_d.read(np.float32, (M, N)), expected)
    # B given as its transpose in row order, op(B) = T
    matmul_t, alg_t, plan_t = struct(), struct(), struct()
    ok(LT.cusparseLtMatmulDescriptorInit(handle, matmul_t, OP_N, OP_T, sparse, dense_bt, dense_c, dense_c,
                                         COMPUTE_32F), "matmul descriptor T")
    ok(LT.cusparseLtMatmulAlgSelectionInit(handle, alg_t, matmul_t, 0), "alg selection T")
    ok(LT.cusparseLtMatmulPlanInit(handle, plan_t, matmul_t, alg_t), "plan T")
    d_e = Device(np.zeros((M, N), np.float32))
    ok(LT.cusparseLtMatmul(handle, plan_t, ctypes.byref(alpha), compressed.ptr, d_b.ptr, ctypes.byref(beta),
                           d_c.ptr, d_e.ptr, None, None, 0), "matmul T")
    results["matmul_transposed_b_fp32"] = rel(d_e.read(np.float32, (M, N)), expected)
    for destroy, obj in ((LT.cusparseLtMatmulPlanDestroy, plan), (LT.cusparseLtMatmulPlanDestroy, plan_t),
                         (LT.cusparseLtMatmulAlgSelectionDestroy, alg), (LT.cusparseLtMatmulAlgSelectionDestroy, alg_t),
                         *((LT.cusparseLtMatDescriptorDestroy, m) for m in (sparse, dense_b, dense_bt, dense_c))):
        ok(destroy(obj), "destroy")
    results["destroyed_plan_status"] = LT.cusparseLtMatmulGetWorkspace(handle, plan, ctypes.byref(workspace))
    ok(LT.cusparseLtDestroy(handle), "cusparseLtDestroy")


main()
print(json.dumps(results))
