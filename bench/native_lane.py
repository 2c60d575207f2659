"""The worker's CPU per lane record on the cuda backend: records run in C (server/native_lane.c) against the
same records run in Python, in process, beside the driver calls alone made from cffi.

    python bench/native_lane.py [--backend cuda|stand-in] [--records N] [--out bench/results/native-lane.json]

A cuda-backend session (Accounted over CudaBackend, as a worker has it) runs lanes of `cuMemsetD8Async` records
(into one allocation, and over 1,000), lanes of `xpuLaunchKernel` records (a saxpy of n = 0, so the GPU does
nothing) and lanes of `cublasSgemm_v2` records as the shim queues them (4x4, host scalars in the record): CPU time
of this process per record. `cuda` uses NVIDIA's libcuda and cuBLAS (a GPU); `stand-in` uses xpuremote's own shim
and replacement cuBLAS chained to a sim server started here (named as such: its figures include the stand-in's
own client, the same for both ways).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CTX, STREAM, MODULE, SAXPY = 0x7C00_0000_1000, 0x7C00_0000_2000, 0x7C00_0000_4000, 0x7C00_0000_4010
BLAS, N = 0x7C00_0000_5000, 4
PER_LANE = 500
ALLOCATIONS = 1000
MANY = f"cuMemsetD8Async over {ALLOCATIONS:,} allocations"


def measure(records: int, repeats: int) -> dict[str, Any]:
    """In this process, with XPU_NATIVE_LANE as the parent set it: CPU µs per record of each kind."""
    from xpuremote.protocol import abi
    from xpuremote.protocol.calls import CALLS
    from xpuremote.server.backends.cuda import CudaBackend
    from xpuremote.server.limits import Accounted, Limits
    from xpuremote.server.session import Session

    backend = Accounted(CudaBackend(), Limits())
    session = Session(backend)
    session.limits = backend.limits

    def batch(*calls: tuple[str, list[Any]]) -> list[Any]:
        answer = session.run_batch([[CALLS[name].opcode, args] for name, args in calls], True)
        if answer["status"]:
            raise RuntimeError(f"set-up failed: {answer}")
        return answer["outs"]

    ptx = (HERE.parent / "tests" / "programs" / "saxpy.ptx").read_bytes()
    batch(("cuCtxCreate_v2", [CTX, 0, 0]))
    base = int.from_bytes(batch(("cuMemAlloc_v2", [8, 1 << 20]))[0], "little")
    batch(("cuStreamCreate", [STREAM, 1]), ("xpuModuleLoad", [MODULE, hashlib.sha256(ptx).digest(), ptx, len(ptx)]),
          ("xpuModuleGetFunction", [SAXPY, MODULE, "saxpy"]))
    memset = abi.pack_lane_record(opcode=CALLS["cuMemsetD8Async"].opcode, nargs=4, blob_at=abi.LANE_NO_BLOB, ctx=CTX)
    # name -> (a lane, its records)
    lanes = {"cuMemsetD8Async": (b"".join(memset + struct.pack("<4Q", base + 256 * (i % 4096), i & 0xFF, 256, STREAM)
                                          for i in range(PER_LANE)), PER_LANE)}
    # the same over many allocations, as PyTorch's caching allocator holds many segments
    many = [int.from_bytes(batch(("cuMemAlloc_v2", [8, 256]))[0], "little") for _ in range(ALLOCATIONS)]
    lanes[MANY] = (b"".join(memset + struct.pack("<4Q", a, i & 0xFF, 256, STREAM) for i, a in enumerate(many)),
                   ALLOCATIONS)
    blob = struct.pack("<f4xQQI", 1.0, base, base + 4096, 0)  # 28 bytes, padded to 32 in the lane
    launch = (abi.pack_lane_record(opcode=CALLS["xpuLaunchKernel"].opcode, nargs=12, blob_at=9, blob_len=len(blob),
                                   ctx=CTX)
              + struct.pack("<12Q", SAXPY, 1, 1, 1, 32, 1, 1, 0, STREAM, 0, len(blob), 0) + blob + bytes(4))
    lanes["xpuLaunchKernel"] = (launch * PER_LANE, PER_LANE)
    batch(("cublasCreate_v2", [BLAS]), ("cublasSetStream_v2", [BLAS, STREAM]))
    one = struct.unpack("<I", struct.pack("<f", 1.0))[0]
    gemm = (abi.pack_lane_record(opcode=CALLS["cublasSgemm_v2"].opcode, nargs=14, scalar_size=4,
                                 scalars=1 << 6 | 1 << 11, blob_at=abi.LANE_NO_BLOB, ctx=CTX)
            + struct.pack("<14Q", BLAS, 0, 0, N, N, N, one, base, N, base + 4096, N, one, base + 8192, N))
    lanes["cublasSgemm_v2"] = (gemm * PER_LANE, PER_LANE)
    figures: dict[str, Any] = {}
    for name, (data, count) in lanes.items():
        session.run_lane([data, len(data)])  # warm: registered, taught
        samples = []
        for _ in range(repeats):
            began = time.process_time()
            for _ in range(records // count):
                session.run_lane([data, len(data)])
            samples.append((time.process_time() - began) / (records // count * count) * 1e6)
        figures[name] = statistics.median(samples)
    if session.deferred:
        raise RuntimeError(f"records failed: {session.deferred[:3]}")
    figures["driver"] = driver_alone(backend.inner, base, records, repeats)
    figures["library"] = library_alone(backend.inner, session.handles[BLAS][1], base, records // 10, repeats)
    figures["in_c"] = session.native.calls if session.native else 0
    return figures


def driver_alone(cuda: Any, base: int, records: int, repeats: int) -> float:
    """The same memsets called straight from cffi: the driver's own cost, with cffi's call on top."""
    fn, stream = cuda.lib.cuMemsetD8Async, cuda.ffi.cast("void *", 0)
    samples = []
    for _ in range(repeats):
        began = time.process_time()
        for i in range(records):
            fn(base + 256 * (i % 4096), i & 0xFF, 256, stream)
        samples.append((time.process_time() - began) / records * 1e6)
    return statistics.median(samples)


def library_alone(cuda: Any, handle: int, base: int, records: int, repeats: int) -> float:
    """The same GEMMs called straight from cffi: the library's own cost, with cffi's call on top."""
    ffi, fn = cuda.ffi, cuda.library("cublas").cublasSgemm_v2
    one, blas = ffi.new("float *", 1.0), ffi.cast("void *", handle)
    a, b, c = (ffi.cast("void *", base + offset) for offset in (0, 4096, 8192))
    samples = []
    for _ in range(repeats):
        began = time.process_time()
        for _ in range(records):
            fn(blas, 0, 0, N, N, N, one, a, N, b, N, one, c, N)
        samples.append((time.process_time() - began) / records * 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["cuda", "stand-in"], default="stand-in")
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write JSON here and Markdown beside it")
    parser.add_argument("--measure", choices=["0", "1"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:  # the child: one way
        print(json.dumps(measure(args.records, args.repeats)))
        return 0

    from foundation import child_figures, clean_env, publish, run_facts, start_stand_in, stop

    env, servers = clean_env(), []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.backend == "stand-in":
                from xpuremote.interpose.build import LIBRARY_NAMES

                sim, stand_in = start_stand_in(Path(tmp) / "sim.log",
                                               {"XPU_SIM_KERNELS": str(HERE.parent / "tests" / "sim_kernels.py")})
                servers.append(sim)
                env |= stand_in | {"XPU_CUBLAS_LIBRARY": str(Path(stand_in["XPU_CUDA_LIBRARY"]).parent
                                                             / LIBRARY_NAMES[0])}
            rows = {}
            for way, flag in (("in C", "1"), ("in Python", "0")):
                rows[way] = child_figures([sys.executable, __file__, "--measure", flag, "--records", str(args.records),
                                           "--repeats", str(args.repeats)], {**env, "XPU_NATIVE_LANE": flag},
                                          f"the {way} run")
    finally:
        for server in servers:
            stop(server)
    result = {"backend": args.backend, "records": args.records, "repeats": args.repeats, "rows": rows,
              **run_facts("native_lane.py", argv)}
    publish(args.out, result, markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = ["# Lane records on the cuda backend: the worker's CPU per record, in C and in Python", "",
             f"`{result['command']}`", "",
             f"Backend {result['backend']}, Python {result['python']}, {result['records']:,} records a kind, medians "
             f"of {result['repeats']}; load average after {[round(x, 2) for x in result['load']]}. In process: "
             "a cuda-backend session runs the lanes.", "",
             "| record | in C, µs | in Python, µs | Python / C |", "|---|---:|---:|---:|"]
    for kind in ("cuMemsetD8Async", MANY, "xpuLaunchKernel", "cublasSgemm_v2"):
        c, py = rows["in C"][kind], rows["in Python"][kind]
        lines.append(f"| {kind} | {c:.2f} | {py:.2f} | {py / c:.1f}x |")
    lines += ["", f"The same memsets called straight from cffi (the driver's own cost with cffi's call on top): "
              f"{rows['in C']['driver']:.2f} µs; the same GEMMs: {rows['in C']['library']:.2f} µs. Records run in C: "
              f"{rows['in C']['in_c']:,} (in the Python run: {rows['in Python']['in_c']})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
