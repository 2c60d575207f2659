"""The worker's CPU per lane record on the cuda backend: records run in C (server/native_lane.c) against the
same records run in Python, in process, beside the driver calls alone made from cffi.

    python bench/native_lane.py [--backend cuda|stand-in] [--records N] [--out bench/results/native-lane.json]

A cuda-backend session (Accounted over CudaBackend, as a worker has it) runs lanes of `cuMemsetD8Async` records
(into one allocation, and over 1,000), lanes of `xpuLaunchKernel` records (a saxpy of n = 0, so the GPU does
nothing), lanes of `cublasSgemm_v2` records as the shim queues them (4x4, host scalars in the record), of
`cudnnBatchNormalizationForwardInference` records (its scalars' bytes in the record, epsilon a double by value) and
of `xpuCudnnExecute` records (a kept variant pack of a 1x1 convolution's three pointers, by a plan of the sim's one
engine: stand-in only): CPU time of this process per record. `cuda` uses NVIDIA's libcuda, cuBLAS and cuDNN (a
GPU); `stand-in` uses xpuremote's own shim and replacement cuBLAS and cuDNN chained to a sim server started here
(named as such: its figures include the stand-in's own client, the same for both ways; the sim's own work on the
queued calls is in its process, not counted).
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
DNN, X, BN, PLAN = 0x7C00_0000_6000, 0x7C00_0000_6010, 0x7C00_0000_6020, 0x7C00_0000_6030
PER_LANE = 500
BATCH_NORM, EXECUTE = "cudnnBatchNormalizationForwardInference", "xpuCudnnExecute"
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
    lanes.update(cudnn_lanes(batch, base))
    figures: dict[str, Any] = {}
    for name, (data, count) in lanes.items():
        session.run_lane([data, len(data)])  # warm: registered, taught
        samples, kind = [], records // 10 if name in (BATCH_NORM, EXECUTE) else records  # the sim computes these
        for _ in range(repeats):
            began = time.process_time()
            for _ in range(max(kind // count, 1)):
                session.run_lane([data, len(data)])
            samples.append((time.process_time() - began) / (max(kind // count, 1) * count) * 1e6)
        figures[name] = statistics.median(samples)
    if session.deferred:
        raise RuntimeError(f"records failed: {session.deferred[:3]}")
    figures["driver"] = driver_alone(backend.inner, base, records, repeats)
    figures["library"] = library_alone(backend.inner, session.handles[BLAS][1], base, records // 10, repeats)
    figures["batch_norm_alone"] = batch_norm_alone(backend.inner, session.handles, base, records // 10, repeats)
    if EXECUTE in lanes:
        figures["execute_alone"] = execute_alone(backend.inner, session.handles, base, records // 10, repeats)
    figures["in_c"] = session.native.calls if session.native else 0
    return figures


def cudnn_lanes(batch: Any, base: int) -> dict[str, tuple[bytes, int]]:
    """Lanes of batch norms as kept.h queues them (the server's tensor descriptors, the scalars' bytes, epsilon's
    bits) and, where the sim's plan finalizes (the stand-in), of a kept variant pack's executions."""
    from xpuremote.protocol import abi, mathlibs
    from xpuremote.protocol.calls import CALLS

    enums = mathlibs.api(mathlibs.CUDNN).ENUMS
    batch(("cudnnCreate", [DNN]))
    for handle, dims in ((X, (1, 2, 2, 2)), (BN, (1, 2, 1, 1))):
        strides = (dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1)
        batch(("cudnnCreateTensorDescriptor", [handle]),
              ("cudnnSetTensorNdDescriptor", [handle, enums["CUDNN_DATA_FLOAT"], 4, struct.pack("<4i", *dims),
                                              struct.pack("<4i", *strides)]))
    one = struct.unpack("<I", struct.pack("<f", 1.0))[0]
    epsilon = struct.unpack("<Q", struct.pack("<d", 1e-5))[0]
    params = [base + 12288 + 64 * i for i in range(4)]  # scale, bias, mean, variance: two floats each
    batch(("cuMemsetD32_v2", [base + 12288, struct.unpack("<I", struct.pack("<f", 0.5))[0], 64]))
    norm = (abi.pack_lane_record(opcode=CALLS[BATCH_NORM].opcode, nargs=14, scalar_size=4, scalars=1 << 2 | 1 << 3,
                                 blob_at=abi.LANE_NO_BLOB, ctx=CTX)
            + struct.pack("<14Q", DNN, enums["CUDNN_BATCHNORM_SPATIAL"], one, 0, X, base, X, base + 4096, BN,
                          *params, epsilon))
    lanes = {BATCH_NORM: (norm * PER_LANE, PER_LANE)}
    try:
        conv_plan(batch, enums)
    except RuntimeError:  # NVIDIA's cuDNN finalizes the plans its heuristics offer
        return lanes
    pointers, uids = struct.pack("<3Q", base, base + 8192, base + 4096), struct.pack("<3q", 1, 2, 3)
    pack = mathlibs.execute_pack(pointers, uids, bytes(24), bytes(3))
    execute = (abi.pack_lane_record(opcode=CALLS[EXECUTE].opcode, nargs=5, blob_at=4, blob_len=len(pack), ctx=CTX)
               + struct.pack("<5Q", DNN, PLAN, 3, 0, 0) + pack + bytes(-len(pack) % 8))
    lanes[EXECUTE] = (execute * PER_LANE, PER_LANE)
    return lanes


def conv_plan(batch: Any, enums: dict[str, int]) -> None:
    """PLAN: a forward convolution of a 1x1 filter over a 1x1x2x4 image, an engine config of the sim's engine 0."""
    from xpuremote.protocol import mathlibs

    handles = iter(range(0x7C00_0000_7000, 0x7C00_0000_8000, 16))

    def descriptor(kind: str, *attributes: tuple[str, str, list[int]], handle: int | None = None) -> int:
        handle = handle or next(handles)
        batch(("cudnnBackendCreateDescriptor", [enums[f"CUDNN_BACKEND_{kind}_DESCRIPTOR"], handle]))
        for name, type_, values in attributes:
            fmt = "<" + mathlibs.cudnn_format(enums[f"CUDNN_TYPE_{type_}"])
            batch(("cudnnBackendSetAttribute", [handle, enums[f"CUDNN_ATTR_{name}"], enums[f"CUDNN_TYPE_{type_}"],
                                                len(values), b"".join(struct.pack(fmt, v) for v in values)]))
        batch(("cudnnBackendFinalize", [handle]))
        return handle

    tensors = [descriptor("TENSOR", ("TENSOR_DATA_TYPE", "DATA_TYPE", [enums["CUDNN_DATA_FLOAT"]]),
                          ("TENSOR_DIMENSIONS", "INT64", dims), ("TENSOR_STRIDES", "INT64", strides),
                          ("TENSOR_UNIQUE_ID", "INT64", [uid]), ("TENSOR_BYTE_ALIGNMENT", "INT64", [16]))
               for uid, dims, strides in ((1, [1, 1, 2, 4], [8, 8, 4, 1]), (2, [1, 1, 1, 1], [1, 1, 1, 1]),
                                          (3, [1, 1, 2, 4], [8, 8, 4, 1]))]
    conv = descriptor("CONVOLUTION", ("CONVOLUTION_SPATIAL_DIMS", "INT64", [2]))
    op = descriptor("OPERATION_CONVOLUTION_FORWARD", *[(f"OPERATION_CONVOLUTION_FORWARD_{role}", "BACKEND_DESCRIPTOR",
                                                        [h]) for role, h in zip(("X", "W", "Y", "CONV_DESC"),
                                                                                (*tensors, conv))])
    graph = descriptor("OPERATIONGRAPH", ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [op]),
                       ("OPERATIONGRAPH_HANDLE", "HANDLE", [DNN]))
    engine = descriptor("ENGINE", ("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", [graph]),
                        ("ENGINE_GLOBAL_INDEX", "INT64", [0]))
    config = descriptor("ENGINECFG", ("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", [engine]))
    descriptor("EXECUTION_PLAN", ("EXECUTION_PLAN_HANDLE", "HANDLE", [DNN]),
               ("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", [config]), handle=PLAN)


def batch_norm_alone(cuda: Any, handles: dict[int, Any], base: int, records: int, repeats: int) -> float:
    """The same batch norms called straight from cffi: the library's own cost, with cffi's call on top."""
    ffi, fn = cuda.ffi, cuda.library("cudnn").cudnnBatchNormalizationForwardInference
    one, zero = ffi.new("float *", 1.0), ffi.new("float *", 0.0)
    dnn, x, bn = (ffi.cast("void *", handles[h][1]) for h in (DNN, X, BN))
    data = [ffi.cast("void *", base + offset) for offset in (0, 4096, *(12288 + 64 * i for i in range(4)))]
    samples = []
    for _ in range(repeats):
        began = time.process_time()
        for _ in range(records):
            fn(dnn, 1, one, zero, x, data[0], x, data[1], bn, *data[2:], 1e-5)
        samples.append((time.process_time() - began) / records * 1e6)
    return statistics.median(samples)


def execute_alone(cuda: Any, handles: dict[int, Any], base: int, records: int, repeats: int) -> float:
    """cudnnBackendExecute of one variant pack of the same pointers, made once, called straight from cffi: the
    library's own cost of an execution, with cffi's call on top."""
    from xpuremote.protocol import mathlibs

    ffi, lib = cuda.ffi, cuda.library("cudnn")
    made = ffi.new("void **")
    if lib.cudnnBackendCreateDescriptor(mathlibs.CUDNN_VARIANT_PACK, made):
        raise RuntimeError("cudnnBackendCreateDescriptor failed")
    pack = made[0]
    try:
        for name, kind, count, values in (
                (mathlibs.CUDNN_DATA_POINTERS, mathlibs.CUDNN_VOID_PTR, 3, ffi.new("uint64_t[]", [base, base + 8192,
                                                                                             base + 4096])),
                (mathlibs.CUDNN_UNIQUE_IDS, mathlibs.CUDNN_INT64, 3, ffi.new("int64_t[]", [1, 2, 3])),
                (mathlibs.CUDNN_WORKSPACE, mathlibs.CUDNN_VOID_PTR, 1, ffi.new("uint64_t[]", [0]))):
            if lib.cudnnBackendSetAttribute(pack, name, kind, count, values):
                raise RuntimeError("cudnnBackendSetAttribute failed")
        if lib.cudnnBackendFinalize(pack):
            raise RuntimeError("cudnnBackendFinalize failed")
        dnn, plan = ffi.cast("void *", handles[DNN][1]), ffi.cast("void *", handles[PLAN][1])
        fn = lib.cudnnBackendExecute
        samples = []
        for _ in range(repeats):
            began = time.process_time()
            for _ in range(records):
                fn(dnn, plan, pack)
            samples.append((time.process_time() - began) / records * 1e6)
        return statistics.median(samples)
    finally:
        lib.cudnnBackendDestroyDescriptor(pack)


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
                shim = Path(stand_in["XPU_CUDA_LIBRARY"]).parent
                env |= stand_in | {"XPU_CUBLAS_LIBRARY": str(shim / LIBRARY_NAMES[0]),
                                   "XPU_CUDNN_LIBRARY": str(shim / LIBRARY_NAMES[2])}
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
    for kind in ("cuMemsetD8Async", MANY, "xpuLaunchKernel", "cublasSgemm_v2", BATCH_NORM, EXECUTE):
        if kind not in rows["in C"]:
            lines.append(f"| {kind} | not measured: no plan of the sim's engine here | | |")
            continue
        c, py = rows["in C"][kind], rows["in Python"][kind]
        lines.append(f"| {kind} | {c:.2f} | {py:.2f} | {py / c:.1f}x |")
    lines += ["", f"The same memsets called straight from cffi (the driver's own cost with cffi's call on top): "
              f"{rows['in C']['driver']:.2f} µs; the same GEMMs: {rows['in C']['library']:.2f} µs; the same batch "
              f"norms: {rows['in C']['batch_norm_alone']:.2f} µs"
              + (f"; the same executions of one pack made once: {rows['in C']['execute_alone']:.2f} µs"
                 if "execute_alone" in rows["in C"] else "")
              + f". Records run in C: {rows['in C']['in_c']:,} (in the "
              f"Python run: {rows['in Python']['in_c']}). The cuDNN records are a tenth as many as the others (the "
              "sim behind the stand-in computes them)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
