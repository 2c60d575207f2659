"""NVIDIA's libcudart's stream-ordered allocator under the shim (tests/test_memory_pools.py): 200 allocations
of 256 B to 2 MiB with cudaMallocAsync, each filled on the stream and read back, freed, and the same again
(reuse). Prints one JSON line: what it found, and the monotonic times (ns) around each round of allocations,
which the test lays over the run's trace.

    python malloc_async_check.py LIBCUDART [quota]

`quota`: one allocation within the server's 8 MiB quota, one beyond it (answered at once; its error comes at
the next synchronisation, and its free is quiet), then one within it again.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time
from typing import Any

MIB = 1 << 20
SIZES = [1 << (8 + i % 14) for i in range(200)]  # 256 B .. 2 MiB
rt = ctypes.CDLL(sys.argv[1])
stream = ctypes.c_void_p()


def ok(status: int, what: str) -> None:
    if status:
        raise SystemExit(f"{what}: cudaError {status}")


def alloc(size: int) -> tuple[int, int]:
    """(status, address) of cudaMallocAsync on the stream."""
    ptr = ctypes.c_void_p()
    status = rt.cudaMallocAsync(ctypes.byref(ptr), ctypes.c_size_t(size), stream)
    return status, ptr.value or 0


def round_of_allocations() -> tuple[list[int], list[int]]:
    """Allocated, filled and freed on the stream, read back in between: (addresses, [start, end] ns of the
    allocations and fills, which wait for nothing)."""
    began = time.monotonic_ns()
    ptrs = []
    for i, size in enumerate(SIZES):
        status, ptr = alloc(size)
        ok(status, f"cudaMallocAsync {size}")
        ok(rt.cudaMemsetAsync(ctypes.c_void_p(ptr), i % 251, ctypes.c_size_t(size), stream), "cudaMemsetAsync")
        ptrs.append(ptr)
    ended = time.monotonic_ns()
    ok(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
    return ptrs, [began, ended]


def values_kept(ptrs: list[int]) -> bool:
    """Each allocation's first and last 64 bytes hold its own fill."""
    buf = ctypes.create_string_buffer(64)
    for i, (ptr, size) in enumerate(zip(ptrs, SIZES)):
        for at in (ptr, ptr + size - 64):
            ok(rt.cudaMemcpy(buf, ctypes.c_void_p(at), ctypes.c_size_t(64), 2), "cudaMemcpy DtoH")
            if buf.raw != bytes([i % 251]) * 64:
                return False
    return True


def free_all(ptrs: list[int]) -> None:
    for ptr in ptrs:
        ok(rt.cudaFreeAsync(ctypes.c_void_p(ptr), stream), "cudaFreeAsync")
    ok(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")


def main() -> dict[str, Any]:
    ok(rt.cudaSetDevice(0), "cudaSetDevice")
    ok(rt.cudaStreamCreate(ctypes.byref(stream)), "cudaStreamCreate")
    if sys.argv[2:] == ["quota"]:
        return quota()
    status, first = alloc(MIB)  # the pool's first: the server reserves its addresses
    ok(status, "the first cudaMallocAsync")
    ok(rt.cudaFreeAsync(ctypes.c_void_p(first), stream), "cudaFreeAsync")
    ptrs, window = round_of_allocations()
    spans = sorted((p, p + s) for p, s in zip(ptrs, SIZES))
    found = {"values": values_kept(ptrs), "disjoint": all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))}
    free_all(ptrs)
    again, window_again = round_of_allocations()
    found |= {"values_again": values_kept(again), "reused": again == ptrs, "windows": [window, window_again]}
    free_all(again)
    found["too_large"] = alloc(1 << 50)[0]  # more than the device holds: refused at once
    return found


def quota() -> dict[str, Any]:
    within, kept = alloc(2 * MIB)
    beyond, lost = alloc(16 * MIB)
    synchronized = rt.cudaStreamSynchronize(stream)
    freed = rt.cudaFreeAsync(ctypes.c_void_p(lost), stream)
    after = rt.cudaStreamSynchronize(stream)
    status, ptr = alloc(4 * MIB)
    ok(rt.cudaMemsetAsync(ctypes.c_void_p(ptr), 7, ctypes.c_size_t(4 * MIB), stream), "cudaMemsetAsync")
    buf = ctypes.create_string_buffer(64)
    ok(rt.cudaMemcpy(buf, ctypes.c_void_p(ptr + 4 * MIB - 64), ctypes.c_size_t(64), 2), "cudaMemcpy DtoH")
    return {"within": within, "beyond": beyond, "synchronize": synchronized, "free": freed, "after": after,
            "again": status, "value": buf.raw == b"\x07" * 64}


if __name__ == "__main__":
    print(json.dumps(main()))
