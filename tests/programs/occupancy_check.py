"""Occupancy questions through the shim, as libcudart's occupancy helpers and PyTorch ask them (ctypes).

    occupancy_check.py PTX ASKS SEARCHES SET

ASKS times cuOccupancyMaxActiveBlocksPerMultiprocessor at 256 threads, SEARCHES times
cuOccupancyMaxPotentialBlockSize; SET=1 then sets an attribute that may change the answers and asks again.
Every answer must be the same; after the module's unload the question must fail. Prints the blocks per SM,
the search's grid and block, and the status after the unload.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

cu = ctypes.CDLL("libcuda.so.1")
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


def ok(status: int, what: str) -> None:
    assert status == 0, f"{what}: status {status}"


def blocks(fn: ctypes.c_void_p) -> tuple[int, int]:
    out = ctypes.c_int(-1)
    return cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(out), fn, 256, ctypes.c_size_t(0)), out.value


def search(fn: ctypes.c_void_p) -> tuple[int, int, int]:
    grid, block = ctypes.c_int(-1), ctypes.c_int(-1)
    status = cu.cuOccupancyMaxPotentialBlockSize(ctypes.byref(grid), ctypes.byref(block), fn, None,
                                                 ctypes.c_size_t(0), 0)
    return status, grid.value, block.value


def main() -> None:
    ptx = Path(sys.argv[1]).read_bytes() + b"\0"
    asks, searches, set_attribute = map(int, sys.argv[2:5])
    ctx, module, fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    ok(cu.cuInit(0), "cuInit")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ok(cu.cuModuleLoadData(ctypes.byref(module), ptx), "cuModuleLoadData")
    ok(cu.cuModuleGetFunction(ctypes.byref(fn), module, b"saxpy"), "cuModuleGetFunction")
    answers = [blocks(fn) for _ in range(asks)]
    assert len(set(answers)) == 1 and answers[0][0] == 0 and answers[0][1] > 0, answers
    found = [search(fn) for _ in range(searches)]
    assert len(set(found)) == 1 and found[0][0] == 0 and found[0][2] > 0, found
    if set_attribute:
        ok(cu.cuFuncSetAttribute(fn, MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024), "cuFuncSetAttribute")
        assert blocks(fn) == answers[0]
    ok(cu.cuModuleUnload(module), "cuModuleUnload")
    print(answers[0][1], found[0][1], found[0][2], blocks(fn)[0])


if __name__ == "__main__":
    main()
