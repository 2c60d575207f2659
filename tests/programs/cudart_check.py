"""NVIDIA's libcudart driven through ctypes, for tests/test_cudart.py (run under the shim).

    python cudart_check.py /path/to/libcudart.so.N SUBTEST

Prints one JSON object (always with "ok") and exits 0 if the sub-test passed, 1 if not.
Sub-tests: properties, roundtrip, stream, pinned, pointer_attributes, threads, errors, many_async.
"""

from __future__ import annotations

import ctypes
import json
import random
import sys
import threading
from collections.abc import Callable
from typing import Any

H2D, D2H, D2D = 1, 2, 3  # cudaMemcpyKind
ATTR_MAJOR, ATTR_MINOR = 75, 76  # cudaDevAttrComputeCapabilityMajor/Minor
ERROR_INVALID_DEVICE = 101
ERROR_NOT_READY = 600
MEMORY_TYPE_HOST, MEMORY_TYPE_DEVICE = 1, 2
# cudaDeviceProp: the same offsets in 12.x and 13.x for these fields (checked against both headers);
# major/minor are read with cudaDeviceGetAttribute as well, which does not depend on the layout.
PROP_NAME, PROP_TOTAL_GLOBAL_MEM, PROP_MAJOR, PROP_MINOR = 0, 288, 360, 364
SIZES = (1, 7, 4096, 65537, (1 << 20) + 3, 64 << 20)

vp = ctypes.c_void_p


class CudaFailed(Exception):
    pass


class Runtime:
    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        self.lib.cudaGetErrorName.restype = ctypes.c_char_p
        for name in ("cudaMemcpy", "cudaMemcpyAsync"):
            getattr(self.lib, name).argtypes = [vp, vp, ctypes.c_size_t, ctypes.c_int] + (
                [vp] if name.endswith("Async") else [])
        self.lib.cudaMemset.argtypes = [vp, ctypes.c_int, ctypes.c_size_t]
        self.lib.cudaMemsetAsync.argtypes = [vp, ctypes.c_int, ctypes.c_size_t, vp]
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t]
        self.lib.cudaMallocHost.argtypes = [ctypes.POINTER(vp), ctypes.c_size_t]
        self.lib.cudaFree.argtypes = [vp]
        self.lib.cudaFreeHost.argtypes = [vp]
        for name in ("cudaStreamSynchronize", "cudaStreamQuery", "cudaStreamDestroy", "cudaEventDestroy",
                     "cudaEventSynchronize"):
            getattr(self.lib, name).argtypes = [vp]
        self.lib.cudaEventRecord.argtypes = [vp, vp]
        self.lib.cudaEventElapsedTime.argtypes = [ctypes.POINTER(ctypes.c_float), vp, vp]
        self.lib.cudaPointerGetAttributes.argtypes = [vp, vp]

    def raw(self, name: str, *args: Any) -> int:
        return getattr(self.lib, name)(*args)

    def __call__(self, name: str, *args: Any) -> None:
        code = self.raw(name, *args)
        if code:
            raise CudaFailed(f"{name} returned {code} ({self.error_name(code)})")

    def error_name(self, code: int) -> str:
        return self.lib.cudaGetErrorName(code).decode()

    def malloc(self, size: int) -> int:
        ptr = vp()
        self("cudaMalloc", ctypes.byref(ptr), size)
        return ptr.value

    def stream(self) -> int:
        s = vp()
        self("cudaStreamCreate", ctypes.byref(s))
        return s.value

    def event(self) -> int:
        e = vp()
        self("cudaEventCreate", ctypes.byref(e))
        return e.value

    def download(self, dptr: int, size: int) -> bytes:
        buf = ctypes.create_string_buffer(size)
        self("cudaMemcpy", buf, dptr, size, D2H)
        return buf.raw

    def upload(self, dptr: int, data: bytes) -> None:
        self("cudaMemcpy", dptr, data, len(data), H2D)


def run_threads(work: Callable[[int], None], count: int) -> None:
    """work(0) ... work(count - 1), each on a thread of its own, all at once; back when all are done."""
    pool = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()


def first_difference(a: bytes, b: bytes) -> int | None:
    if a == b:
        return None
    if len(a) != len(b):
        return min(len(a), len(b))
    return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)


def properties(rt: Runtime) -> dict[str, Any]:
    count = ctypes.c_int()
    rt("cudaGetDeviceCount", ctypes.byref(count))
    prop = ctypes.create_string_buffer(4096)  # larger than either version's struct
    rt("cudaGetDeviceProperties", prop, 0)
    major, minor = ctypes.c_int(), ctypes.c_int()
    rt("cudaDeviceGetAttribute", ctypes.byref(major), ATTR_MAJOR, 0)
    rt("cudaDeviceGetAttribute", ctypes.byref(minor), ATTR_MINOR, 0)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    rt("cudaMemGetInfo", ctypes.byref(free), ctypes.byref(total))
    raw = prop.raw

    def field(offset: int, size: int) -> int:
        return int.from_bytes(raw[offset : offset + size], "little", signed=size == 4)

    return {
        "count": count.value,
        "name": raw[PROP_NAME : PROP_NAME + 256].split(b"\0", 1)[0].decode(),
        "major": major.value,
        "minor": minor.value,
        "prop_major": field(PROP_MAJOR, 4),
        "prop_minor": field(PROP_MINOR, 4),
        "total_global_mem": field(PROP_TOTAL_GLOBAL_MEM, 8),
        "mem_info_total": total.value,
        "mem_info_free": free.value,
    }


def roundtrip(rt: Runtime) -> dict[str, Any]:
    """cudaMalloc / cudaMemcpy both ways / cudaMemset / cudaFree, byte for byte, per size."""
    rng = random.Random(1)
    results = {}
    for size in SIZES:
        data = rng.randbytes(size)
        dptr = rt.malloc(size)
        rt.upload(dptr, data)
        back = rt.download(dptr, size)
        rt("cudaMemset", dptr, 0xA5, size)
        filled = rt.download(dptr, size)
        rt("cudaFree", dptr)
        results[str(size)] = {"copy_mismatch_at": first_difference(data, back),
                              "memset_mismatch_at": first_difference(b"\xa5" * size, filled)}
    return {"sizes": results}


def stream(rt: Runtime) -> dict[str, Any]:
    """Async copies both ways, cudaMemsetAsync, device-to-device copies, events, cudaStreamQuery."""
    size = (1 << 20) + 5
    data = random.Random(2).randbytes(size)
    s = rt.stream()
    start, stop = rt.event(), rt.event()
    a, b = rt.malloc(size), rt.malloc(size)
    src, back, d2d, d2d_async, memset = (ctypes.create_string_buffer(size) for _ in range(5))
    ctypes.memmove(src, data, size)
    rt("cudaEventRecord", start, s)
    rt("cudaMemcpyAsync", a, src, size, H2D, s)
    rt("cudaMemcpyAsync", back, a, size, D2H, s)
    rt("cudaEventRecord", stop, s)
    rt("cudaStreamSynchronize", s)
    query = rt.raw("cudaStreamQuery", s)
    rt("cudaEventSynchronize", stop)
    ms = ctypes.c_float(-1)
    rt("cudaEventElapsedTime", ctypes.byref(ms), start, stop)
    rt("cudaMemcpy", b, a, size, D2D)  # synchronous device-to-device
    rt("cudaMemcpy", d2d, b, size, D2H)
    rt("cudaMemsetAsync", b, 0, size, s)
    rt("cudaMemcpyAsync", b, a, 4097, D2D, s)  # a partial device-to-device copy over the zeros
    rt("cudaMemcpyAsync", d2d_async, b, size, D2H, s)
    rt("cudaMemsetAsync", a, 0x3C, size - 1, s)
    rt("cudaMemcpyAsync", memset, a, size, D2H, s)
    rt("cudaStreamSynchronize", s)
    for ptr in (a, b):
        rt("cudaFree", ptr)
    rt("cudaEventDestroy", start)
    rt("cudaEventDestroy", stop)
    rt("cudaStreamDestroy", s)
    return {
        "async_mismatch_at": first_difference(data, back.raw),
        "d2d_mismatch_at": first_difference(data, d2d.raw),
        "d2d_async_mismatch_at": first_difference(data[:4097] + bytes(size - 4097), d2d_async.raw),
        "memset_async_mismatch_at": first_difference(b"\x3c" * (size - 1) + data[-1:], memset.raw),
        "stream_query": query,
        "elapsed_ms": ms.value,
    }


def pinned(rt: Runtime) -> dict[str, Any]:
    """cudaMallocHost memory as the source and destination of async copies."""
    size = 3 * 4096 + 11
    data = random.Random(3).randbytes(size)
    host_in, host_out = vp(), vp()
    rt("cudaMallocHost", ctypes.byref(host_in), size)
    rt("cudaMallocHost", ctypes.byref(host_out), size)
    ctypes.memmove(host_in, data, size)
    ctypes.memset(host_out, 0, size)
    s = rt.stream()
    dptr = rt.malloc(size)
    rt("cudaMemcpyAsync", dptr, host_in, size, H2D, s)
    rt("cudaMemcpyAsync", host_out, dptr, size, D2H, s)
    rt("cudaStreamSynchronize", s)
    back = ctypes.string_at(host_out, size)
    rt("cudaFree", dptr)
    rt("cudaStreamDestroy", s)
    rt("cudaFreeHost", host_in)
    rt("cudaFreeHost", host_out)
    return {"mismatch_at": first_difference(data, back)}


def pointer_attributes(rt: Runtime) -> dict[str, Any]:
    dptr = rt.malloc(1000)
    host = vp()
    rt("cudaMallocHost", ctypes.byref(host), 1000)
    out = {}
    for label, ptr in (("device", dptr), ("device_inner", dptr + 100), ("pinned", host.value)):
        attrs = ctypes.create_string_buffer(256)
        rt("cudaPointerGetAttributes", attrs, ptr)
        raw = attrs.raw
        out[label] = {
            "ptr": ptr,
            "type": int.from_bytes(raw[0:4], "little"),
            "device": int.from_bytes(raw[4:8], "little", signed=True),
            "device_pointer": int.from_bytes(raw[8:16], "little"),
            "host_pointer": int.from_bytes(raw[16:24], "little"),
        }
    rt("cudaFree", dptr)
    rt("cudaFreeHost", host)
    return out


def threads(rt: Runtime) -> dict[str, Any]:
    """8 threads, each with its own allocations, copies and checks."""
    failures: list[str] = []
    rounds = [0] * 8

    def work(index: int) -> None:
        rng = random.Random(100 + index)
        try:
            for _ in range(25):
                size = rng.choice((1, 13, 4096, 70001, 300000))
                data = rng.randbytes(size)
                dptr = rt.malloc(size)
                rt.upload(dptr, data)
                back = rt.download(dptr, size)
                rt("cudaFree", dptr)
                if back != data:
                    failures.append(f"thread {index}: {size} bytes differ at {first_difference(data, back)}")
                    return
                rounds[index] += 1
        except Exception as exc:  # reported, not raised: the main thread checks
            failures.append(f"thread {index}: {exc}")

    run_threads(work, 8)
    return {"failures": failures, "rounds": rounds}


def errors(rt: Runtime) -> dict[str, Any]:
    dptr = rt.malloc(4096)
    rt("cudaFree", dptr)
    data = bytes(4096)
    copy_after_free = rt.raw("cudaMemcpy", dptr, data, len(data), H2D)
    rt.raw("cudaGetLastError")
    set_device = rt.raw("cudaSetDevice", 99)
    rt.raw("cudaGetLastError")
    # the runtime still works afterwards
    probe = rt.malloc(16)
    rt.upload(probe, b"0123456789abcdef")
    still_works = rt.download(probe, 16) == b"0123456789abcdef"
    rt("cudaFree", probe)
    return {
        "copy_after_free": copy_after_free,
        "copy_after_free_name": rt.error_name(copy_after_free),
        "set_device_99": set_device,
        "set_device_99_name": rt.error_name(set_device),
        "still_works": still_works,
    }


def many_async(rt: Runtime) -> dict[str, Any]:
    """Thousands of small async memsets from 4 threads, each on its own stream and region, ordered by events
    against the legacy and the per-thread stream: the calls the shim queues in C (its fast lane)."""
    rt.lib.cudaStreamWaitEvent.argtypes = [vp, vp, ctypes.c_uint]
    slot, slots, rounds = 256, 64, 500
    failures: list[str] = []

    def work(index: int) -> None:
        try:
            s, e = rt.stream(), rt.event()
            base = rt.malloc(slot * slots)
            expected = bytearray(slot * slots)
            for i in range(rounds):
                at, value = (i * 7) % slots, (index * 31 + i) & 0xFF
                stream = (s, 0, 2)[i % 3]  # its own, the legacy one, cudaStreamPerThread
                rt("cudaMemsetAsync", base + at * slot, value, slot, stream)
                rt("cudaEventRecord", e, stream)
                rt("cudaStreamWaitEvent", (0, 2, s)[i % 3], e, 0)
                expected[at * slot:(at + 1) * slot] = bytes([value]) * slot
            rt("cudaDeviceSynchronize")
            found = rt.download(base, len(expected))
            if found != expected:
                failures.append(f"thread {index}: differs at byte {first_difference(bytes(expected), found)}")
            rt("cudaFree", base)
        except Exception as exc:  # reported, not raised: the main thread checks
            failures.append(f"thread {index}: {exc}")

    run_threads(work, 4)
    return {"failures": failures, "calls": 4 * rounds * 3}


SUBTESTS: dict[str, Callable[[Runtime], dict[str, Any]]] = {
    f.__name__: f for f in (properties, roundtrip, stream, pinned, pointer_attributes, threads, errors, many_async)}


def problems(result: Any) -> bool:
    """Whether a result reports a byte mismatch or a failed thread, at any depth."""
    if isinstance(result, dict):
        return any((k.endswith("mismatch_at") and v is not None) or (k == "failures" and v) or problems(v)
                   for k, v in result.items())
    return False


def main() -> int:
    path, name = sys.argv[1], sys.argv[2]
    try:
        result = SUBTESTS[name](Runtime(path))
        result = {"ok": not problems(result), **result}
    except CudaFailed as exc:
        result = {"ok": False, "error": str(exc)}
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
