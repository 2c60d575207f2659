"""The lane's records in C (server/native_lane.py): the same lanes, run by a cuda-backend session in C and in
Python (XPU_NATIVE_LANE=0), leave the same bytes and defer the same failures, refusals included: a foreign
handle, an address outside the session's memory, a number out of bounds, a handle or memory used after it
went, a record of another context. The session runs in process in a child: on the sim its libcuda is the
stand-in (xpuremote's own shim chained to a sim server, named as such); on a GPU, NVIDIA's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

# What each scenario below begins with: a cuda-backend session of this process, a batch run and answered, the
# records run in C so far, and a lane of records run with the failures it deferred
SESSION = r"""
import hashlib, json, struct, sys
from xpuremote.protocol import abi, mathlibs
from xpuremote.protocol.calls import CALLS
from xpuremote.server.backends.cuda import CudaBackend
from xpuremote.server.limits import Accounted, Limits
from xpuremote.server.session import Session

CTX = 0x7C00_0000_1000
backend = Accounted(CudaBackend(), Limits())
session = Session(backend)
session.limits = backend.limits


def batch(*calls):
    answer = session.run_batch([[CALLS[s].opcode, list(a)] for s, a in calls], True)
    assert answer["status"] == 0, answer
    return answer["outs"]


def in_c():
    return session.native.calls if session.native else 0


def lane(*records):
    data = b"".join(records)
    session.run_lane([data, len(data)])
    failures = [[name, status] for name, status, _ in session.deferred]
    session.deferred.clear()
    return failures
"""


def in_c_and_in_python(scenario: str, env: dict[str, str], *argv: str) -> tuple[dict, dict]:
    """The JSON line `scenario` prints after SESSION, its lane records run in the worker's C (XPU_NATIVE_LANE=1),
    then in Python (0)."""
    results = []
    for native in ("1", "0"):
        full = {**os.environ, **env, "XPU_NATIVE_LANE": native}
        full.pop("LD_PRELOAD", None)
        proc = subprocess.run([sys.executable, "-c", SESSION + scenario, *argv], env=full, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return results[0], results[1]


SCENARIO = r"""
OTHER_CTX, STREAM, EVENT = 0x7C00_0000_1100, 0x7C00_0000_2000, 0x7C00_0000_3000
MODULE, SAXPY = 0x7C00_0000_4000, 0x7C00_0000_4010
PTX = sys.argv[1].encode()

def op(symbol):
    return CALLS[symbol].opcode

def record(symbol, args, ctx=CTX, blob=None):
    head = abi.pack_lane_record(opcode=op(symbol), nargs=len(args), blob_at=abi.LANE_NO_BLOB if blob is None else 9,
                                blob_len=len(blob or b""), ctx=ctx)
    return head + struct.pack(f"<{len(args)}Q", *args) + (blob or b"") + bytes(-len(blob or b"") % 8)

def run(*records, ctx=CTX):  # records or (symbol, args), their failures left in session.deferred
    data = b"".join(r if isinstance(r, bytes) else record(*r, ctx=ctx) for r in records)
    session.run_lane([data, len(data)])

def saxpy(a, x, y, n, func=SAXPY, size=None):
    blob = struct.pack("<f4xQQI", a, x, y, n)
    return record("xpuLaunchKernel", [func, 1, 1, 1, n, 1, 1, 0, STREAM, 0, len(blob) if size is None else size, 0],
                  blob=blob)

def read(address, size):
    return batch(("cuMemcpyDtoH_v2", [size, address, size]))[0]

batch(("cuCtxCreate_v2", [CTX, 0, 0]))
base = int.from_bytes(batch(("cuMemAlloc_v2", [8, 1 << 16]))[0], "little")
spare = int.from_bytes(batch(("cuMemAlloc_v2", [8, 4096]))[0], "little")
batch(("cuStreamCreate", [STREAM, 1]), ("cuEventCreate", [EVENT, 2]))
memset = "cuMemsetD8Async"
# 1,000 memsets on the session's stream and the legacy one, an event record, a wait: the bytes they leave
run(*[(memset, [base + 64 * (i % 1000), i & 0xFF, 64, (STREAM, 1, 0)[i % 3]]) for i in range(1000)],
     ("cuEventRecord", [EVENT, STREAM]), ("cuStreamWaitEvent", [0, EVENT, 0]),
     *[(memset, [spare, 9, 16, STREAM])] * 2, ("cuEventRecord", [EVENT, STREAM]))  # taught, then run in C
first = read(base, 64000)
# refused, each deferred under its name, the records around them run: a foreign stream, an address outside,
# a value out of a byte's bounds, a range that runs past the allocation's end
run((memset, [base, 1, 16, 0]), (memset, [base, 2, 16, 0x7C00_0000_9990]), (memset, [0x1000, 3, 16, 0]),
     (memset, [base + 16, 256, 16, 0]), (memset, [base + 65536 - 8, 4, 16, 0]), (memset, [base + 32, 5, 16, 0]))
refusals = [[name, status] for name, status, _ in session.deferred]
session.deferred.clear()
second = read(base, 48)
# what went: the event destroyed, the spare memory freed; then a record of another context
batch(("cuEventDestroy_v2", [EVENT]), ("cuMemFree_v2", [spare]))
run((memset, [spare, 6, 16, STREAM]), ("cuEventRecord", [EVENT, STREAM]), (memset, [base, 7, 16, STREAM]))
after = [[name, status] for name, status, _ in session.deferred]  # before a batch's answer takes them
session.deferred.clear()
batch(("cuCtxCreate_v2", [OTHER_CTX, 0, 0]))
run((memset, [base + 48, 8, 16, 0]), ctx=OTHER_CTX)
after += [[name, status] for name, status, _ in session.deferred]
session.deferred.clear()
third = read(base, 64)
# launches: y = 2 + 10 * 3x with x = 1 (a kernel's arguments as the lane's blob); refused: a foreign kernel,
# a size that is not the blob's
batch(("xpuModuleLoad", [MODULE, hashlib.sha256(PTX).digest(), PTX, len(PTX)]),
      ("xpuModuleGetFunction", [SAXPY, MODULE, "saxpy"]))
x, y = base + 4096, base + 8192
run(("cuMemsetD32Async", [x, 0x3F800000, 256, STREAM]), ("cuMemsetD32Async", [y, 0x40000000, 256, STREAM]),
     *[saxpy(3.0, x, y, 256) for _ in range(10)], saxpy(3.0, x, y, 256, func=0x7C00_0000_4990),
     saxpy(3.0, x, y, 256, size=8))
launches = [[name, status] for name, status, _ in session.deferred]
session.deferred.clear()
ys = struct.unpack("<256f", read(y, 1024))
# more handles than the C side keeps (it empties its table and is taught again): the legacy stream's
# records still run there afterwards
events = [0x7C00_0010_0000 + 16 * i for i in range(600)]
batch(*[("cuEventCreate", [e, 2]) for e in events])
run(*[("cuEventRecord", [e, 1]) for e in events])
before = native.calls if (native := session.native) else 0
run(*[(memset, [base + 64 * i, 9, 64, 1]) for i in range(100)])
after_full = (native.calls if native else 0) - before
# memsets over 300 allocations (PyTorch's caching allocator holds many segments): taught once each, then in C
many = [int.from_bytes(batch(("cuMemAlloc_v2", [8, 256]))[0], "little") for _ in range(300)]
run(*[(memset, [a, i & 0xFF, 256, STREAM]) for i, a in enumerate(many)])
native = session.native
before = native.calls if native else 0
run(*[(memset, [a, (i + 1) & 0xFF, 256, STREAM]) for i, a in enumerate(reversed(many))])
many_in_c = (native.calls if native else 0) - before
many_bytes = hashlib.sha256(b"".join(read(a, 256) for a in many)).hexdigest()
print(json.dumps({"after_full": after_full, "many_in_c": many_in_c, "many": many_bytes, "first": first.hex(),
                  "refusals": refusals, "second": second.hex(), "after": after, "third": third.hex(),
                  "launches": launches, "y": sorted(set(ys)), "lane_calls": session.lane_calls,
                  "in_c": native.calls if native else 0}))
"""


# y = a * x + y for the first n elements, one thread each (tests/sim_kernels.py is the sim's saxpy)
SAXPY_PTX = (Path(__file__).parent / "programs" / "saxpy.ptx").read_text()


def test_the_lane_in_c_does_what_the_lane_in_python_does(driver_env: dict[str, str]) -> None:
    in_c, in_python = in_c_and_in_python(SCENARIO, driver_env, SAXPY_PTX)
    assert in_c.pop("after_full") == 99 and in_python.pop("after_full") == 0  # a lane's first record: Python
    assert in_c.pop("many_in_c") == 299 and in_python.pop("many_in_c") == 0  # all but the first: all stay taught
    ran_in_c = in_c.pop("in_c")
    assert ran_in_c >= 990 and in_python.pop("in_c") == 0, ran_in_c  # each ran where it was meant to
    assert in_c == in_python
    expected = b"".join(bytes([i & 0xFF]) * 64 for i in range(1000))
    assert bytes.fromhex(in_c["first"]) == expected
    assert in_c["refusals"] == [["cuMemsetD8Async", 400], ["cuMemsetD8Async", 1], ["cuMemsetD8Async", 1],
                                ["cuMemsetD8Async", 1]]
    assert bytes.fromhex(in_c["second"]) == bytes([1]) * 16 + expected[16:32] + bytes([5]) * 16
    assert in_c["after"] == [["cuMemsetD8Async", 1], ["cuEventRecord", 400]]
    assert bytes.fromhex(in_c["third"])[:16] == bytes([7]) * 16
    assert in_c["launches"] == [["xpuLaunchKernel", 400], ["xpuLaunchKernel", 1]]
    assert in_c["y"] == [32.0]


# cuBLAS GEMMs as the shim's C queues them (host scalars' bytes in their slots), run by a cuda-backend session
# whose cuBLAS is the stand-in (xpuremote's own replacement library, named as such) on the sim, or NVIDIA's
LIBRARY_SCENARIO = r"""
BLAS, N = 0x7C00_0000_5000, 4

def matrix(values):
    address = int.from_bytes(batch(("cuMemAlloc_v2", [8, 4 * N * N]))[0], "little")
    data = struct.pack(f"<{N * N}f", *values)
    batch(("cuMemcpyHtoD_v2", [address, data, len(data)]))
    return address

def gemm(alpha, c, handle=BLAS):  # c = alpha * a @ b + 0.5 * c, as kept.h queues cublasSgemm_v2
    args = [handle, 0, 0, N, N, N, struct.unpack("<I", struct.pack("<f", alpha))[0], a, N, b, N,
            struct.unpack("<I", struct.pack("<f", 0.5))[0], c, N]
    head = abi.pack_lane_record(opcode=CALLS["cublasSgemm_v2"].opcode, nargs=len(args), scalar_size=4,
                                scalars=1 << 6 | 1 << 11, blob_at=abi.LANE_NO_BLOB, ctx=CTX)
    return head + struct.pack(f"<{len(args)}Q", *args)

batch(("cuCtxCreate_v2", [CTX, 0, 0]), ("cublasCreate_v2", [BLAS]))
a, b, c = matrix(range(N * N)), matrix([0.5] * (N * N)), matrix([1.0] * (N * N))
d, spare = matrix([0.0] * (N * N)), matrix([0.0] * (N * N))
failures = lane(*[gemm(1.0 + i, c) for i in range(6)])  # the first vetted in Python, the rest of the same values in C
ran = [in_c()]
failures += lane(gemm(1.0, d), gemm(1.0, 0x7C00_DEAD_0000), gemm(1.0, c, handle=spare))  # new values: Python
ran.append(in_c())
batch(("cuMemFree_v2", [spare]))  # memory went: nothing vetted holds
failures += lane(gemm(7.0, c), gemm(8.0, c))
ran.append(in_c())
result = struct.unpack(f"<{N * N}f", batch(("cuMemcpyDtoH_v2", [4 * N * N, c, 4 * N * N]))[0])
print(json.dumps({"ran": ran, "failures": failures, "c": [round(v, 2) for v in result]}))
"""


def test_library_calls_run_in_c_where_python_ran_the_same_values(driver_env: dict[str, str], shim: Path) -> None:
    """A cuBLAS call in the lane (a GEMM with its scalars' bytes) runs in C only where the session's Python ran a
    record of the same values since the C side last forgot (VETTED): the same results and the same refusals with
    the lane in C and in Python, the scalars read from each record; new values, a foreign address, a foreign
    handle and any freed memory send a record back to Python."""
    from xpuremote.interpose.build import LIBRARY_NAMES

    env = {**driver_env, "XPU_CUBLAS_LIBRARY": str(shim.parent / LIBRARY_NAMES[0])} if driver_env else driver_env
    results = dict(zip("10", in_c_and_in_python(LIBRARY_SCENARIO, env), strict=True))
    assert results["1"].pop("ran") == [5, 5, 6] and results["0"].pop("ran") == [0, 0, 0]
    assert results["1"] == results["0"]
    assert [name for name, _ in results["1"]["failures"]] == ["cublasSgemm_v2"] * 2, results
    row = [0.5 * sum(4 * j + i for j in range(4)) for i in range(4)]  # column-major a, b all 0.5
    c = [1.0] * 4
    for alpha in (1, 2, 3, 4, 5, 6, 7, 8):
        c = [alpha * r + 0.5 * v for r, v in zip(row, c)]
    assert results["1"]["c"][4:] == [round(v, 2) for _ in range(3) for v in c], results


# cuDNN's lane records as the shim's C queues them (kept.h: batch norms with the server's tensor descriptors and
# their scalars' bytes, executions of kept variant packs), run by a cuda-backend session whose cuDNN is the stand-in
# (xpuremote's own replacement library, named as such) chained to a sim
DNN_SCENARIO = r"""
E = mathlibs.api(mathlibs.CUDNN).ENUMS
DNN, FOREIGN = 0x7C00_0000_5000, 0x7C00_DEAD_0000
X, BN, SPARE = 0x7C00_0000_5100, 0x7C00_0000_5110, 0x7C00_0000_5120  # tensor descriptors

def alloc(values):
    address = int.from_bytes(batch(("cuMemAlloc_v2", [8, 4 * len(values)]))[0], "little")
    data = struct.pack(f"<{len(values)}f", *values)
    batch(("cuMemcpyHtoD_v2", [address, data, len(data)]))
    return address

def bits(value, size=4):
    return int.from_bytes(struct.pack("<f" if size == 4 else "<d", value), "little")

def record(symbol, args, scalars=(), blob=None):
    head = abi.pack_lane_record(opcode=CALLS[symbol].opcode, nargs=len(args), scalar_size=4 if scalars else 0,
                                scalars=sum(1 << i for i in scalars), blob_at=abi.LANE_NO_BLOB if blob is None else 4,
                                blob_len=len(blob or b""), ctx=CTX)
    return head + struct.pack(f"<{len(args)}Q", *args) + (blob or b"") + bytes(-len(blob or b"") % 8)

def tensor(handle, dims):
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    batch(("cudnnCreateTensorDescriptor", [handle]),
          ("cudnnSetTensorNdDescriptor", [handle, E["CUDNN_DATA_FLOAT"], len(dims), struct.pack("<4i", *dims),
                                          struct.pack("<4i", *strides)]))

batch(("cuCtxCreate_v2", [CTX, 0, 0]), ("cudnnCreate", [DNN]))
tensor(X, [2, 2, 1, 2])
tensor(BN, [1, 2, 1, 1])
tensor(SPARE, [1, 2, 1, 1])
x, y, dy, dx = alloc([1, 2, 4, 8, -1, 3, 5, 0]), alloc([0] * 8), alloc([1, -1, 2, 0, 1, 1, -2, 3]), alloc([0] * 8)
scale, bias, mean, var = alloc([2, 0.5]), alloc([1, -1]), alloc([1, 2]), alloc([0.5, 3])
running_mean, running_var, saved_mean, saved_inv = alloc([0, 0]), alloc([1, 1]), alloc([0, 0]), alloc([0, 0])
d_scale, d_bias, spare = alloc([0, 0]), alloc([0, 0]), alloc([0] * 8)
SPATIAL, BN_ONLY = E["CUDNN_BATCHNORM_SPATIAL"], E["CUDNN_BATCHNORM_OPS_BN"]

def infer(alpha=1.0, eps=0.25, x_desc=X, source=x, handle=DNN):  # y = alpha * bn(x), epsilon by value
    return record("cudnnBatchNormalizationForwardInference",
                  [handle, SPATIAL, bits(alpha), bits(0.0), x_desc, source, X, y, BN, scale, bias, mean, var,
                   bits(eps, 8)], scalars=(2, 3))

def train(factor=0.375, eps=0.125):  # two doubles by value: exponentialAverageFactor, epsilon
    return record("cudnnBatchNormalizationForwardTrainingEx",
                  [DNN, SPATIAL, BN_ONLY, bits(1.0), bits(0.0), X, x, 0, 0, X, y, BN, scale, bias, bits(factor, 8),
                   running_mean, running_var, bits(eps, 8), saved_mean, saved_inv, 0, 0, 0, 0, 0], scalars=(3, 4))

def backward(eps=0.125):
    return record("cudnnBatchNormalizationBackwardEx",
                  [DNN, SPATIAL, BN_ONLY, bits(1.0), bits(0.0), bits(1.0), bits(0.5), X, x, 0, 0, X, dy, 0, 0, X, dx,
                   BN, scale, bias, d_scale, d_bias, bits(eps, 8), saved_mean, saved_inv, 0, 0, 0, 0, 0],
                  scalars=(3, 4, 5, 6))

def read(address, count):
    return [round(v, 4) for v in struct.unpack(f"<{count}f", batch(("cuMemcpyDtoH_v2", [4 * count, address,
                                                                                        4 * count]))[0])]

ran, failures, results = [], [], {}
failures += lane(*[infer(alpha=1.0 + i) for i in range(4)])  # the first vetted in Python, the rest in C
results["inferred"] = read(y, 8)
ran.append(in_c())
failures += lane(*[r for _ in range(3) for r in (train(), backward())])  # each op's first in Python
results["trained"] = [read(a, n) for a, n in ((y, 8), (running_mean, 2), (running_var, 2), (saved_mean, 2),
                                              (saved_inv, 2), (dx, 8), (d_scale, 2), (d_bias, 2))]
ran.append(in_c())
# refused in Python as they were before: a foreign tensor descriptor, an address outside; new values run there
failures += lane(infer(x_desc=FOREIGN), infer(source=0xDEAD_0000), infer(eps=0.5), infer(handle=FOREIGN))
ran.append(in_c())
batch(("cudnnDestroyTensorDescriptor", [SPARE]))  # a handle went: nothing vetted holds
failures += lane(infer(eps=0.5), infer(eps=0.5, alpha=3.0))
results["after"] = read(y, 8)
ran.append(in_c())
if sys.argv[1] == "0":  # NVIDIA's cuDNN: it finalizes the plans its heuristics offer, not one of the sim's engine
    print(json.dumps({"ran": ran, "failures": failures, **results}))
    sys.exit(0)

# a convolution's execution: y = 2 x, by a plan of the sim's one engine, its variant pack kept by the client
def descriptor(kind, handle, *attributes):
    batch(("cudnnBackendCreateDescriptor", [E[f"CUDNN_BACKEND_{kind}_DESCRIPTOR"], handle]))
    for name, kind_, values in attributes:
        fmt = "<" + mathlibs.cudnn_format(E[f"CUDNN_TYPE_{kind_}"])
        data = b"".join(struct.pack(fmt, v) for v in values)
        batch(("cudnnBackendSetAttribute", [handle, E[f"CUDNN_ATTR_{name}"], E[f"CUDNN_TYPE_{kind_}"], len(values),
                                            data]))
    batch(("cudnnBackendFinalize", [handle]))

PLAN, T = 0x7C00_0000_6000, [0x7C00_0000_6010 + 16 * i for i in range(8)]
for uid, handle, dims in ((1, T[0], [1, 1, 2, 4]), (2, T[1], [1, 1, 1, 1]), (3, T[2], [1, 1, 2, 4])):
    strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1]
    descriptor("TENSOR", handle, ("TENSOR_DATA_TYPE", "DATA_TYPE", [E["CUDNN_DATA_FLOAT"]]),
               ("TENSOR_DIMENSIONS", "INT64", dims), ("TENSOR_STRIDES", "INT64", strides),
               ("TENSOR_UNIQUE_ID", "INT64", [uid]))
descriptor("CONVOLUTION", T[3])
descriptor("OPERATION_CONVOLUTION_FORWARD", T[4], *[(f"OPERATION_CONVOLUTION_FORWARD_{role}", "BACKEND_DESCRIPTOR",
                                                       [h]) for role, h in zip(("X", "W", "Y", "CONV_DESC"), T)])
descriptor("OPERATIONGRAPH", T[5], ("OPERATIONGRAPH_OPS", "BACKEND_DESCRIPTOR", [T[4]]),
           ("OPERATIONGRAPH_HANDLE", "HANDLE", [DNN]))
descriptor("ENGINE", T[6], ("ENGINE_OPERATION_GRAPH", "BACKEND_DESCRIPTOR", [T[5]]),
           ("ENGINE_GLOBAL_INDEX", "INT64", [0]))
descriptor("ENGINECFG", T[7], ("ENGINECFG_ENGINE", "BACKEND_DESCRIPTOR", [T[6]]))
descriptor("EXECUTION_PLAN", PLAN, ("EXECUTION_PLAN_HANDLE", "HANDLE", [DNN]),
           ("EXECUTION_PLAN_ENGINE_CONFIG", "BACKEND_DESCRIPTOR", [T[7]]))
filt, image, out = alloc([2.0]), alloc([1, 2, 3, 4, 5, 6, 7, 8]), alloc([0] * 8)

def execute(pointers=None, handle=DNN, scalar=None):  # a by-value scalar's bytes as a fourth element, unused by it
    pointers = pointers or [image, filt, out]
    uids, scalars, flags = [1, 2, 3], bytes(8 * len(pointers)), bytes(len(pointers))
    if scalar is not None:
        pointers, uids = [*pointers, 0], [*uids, 99]
        scalars, flags = scalars + struct.pack("<f4x", scalar), flags + b"\1"
    pack = mathlibs.execute_pack(struct.pack(f"<{len(pointers)}Q", *pointers), struct.pack(f"<{len(uids)}q", *uids),
                                 scalars, flags)
    return record("xpuCudnnExecute", [handle, PLAN, len(pointers), 0, 0], blob=pack)

failures += lane(*[execute() for _ in range(4)], *[execute(scalar=0.125) for _ in range(3)])
ran.append(in_c())
batch(("cuMemcpyHtoD_v2", [image, struct.pack("<8f", *range(8, 0, -1)), 32]))
failures += lane(execute(), execute())  # the same pack again, other data (a lane's first record: Python)
results["convolved"] = read(out, 8)
ran.append(in_c())
failures += lane(execute([image, 0xDEAD_0000, out]), execute(handle=X), execute([image, filt, spare]))
ran.append(in_c())
batch(("cuMemFree_v2", [spare]))  # memory went: nothing vetted holds
failures += lane(execute(), execute(), execute([image, filt, spare]))  # the last vetted, then its memory went
ran.append(in_c())
print(json.dumps({"ran": ran, "failures": failures, **results}))
"""


def test_cudnn_calls_run_in_c_where_python_ran_the_same_values(driver_env: dict[str, str], shim: Path) -> None:
    """cuDNN's lane records (batch norms, with epsilon and the average factor as doubles by value, in floating
    registers; variant-pack executions, made once per vetted record in C) run in C after Python ran one of the same
    values, counted: the same results and refusals both ways. A foreign tensor descriptor or cuDNN handle, an address
    outside, new values, a destroyed descriptor or freed memory send a record back to Python, which refuses the bad
    ones as it did. On the sim through the stand-in libcudnn; on a GPU NVIDIA's, the batch norms only (the
    executions need a plan of the sim's one engine)."""
    from xpuremote.interpose.build import LIBRARY_NAMES

    stand_in = bool(driver_env)
    env = {**driver_env, "XPU_CUDNN_LIBRARY": str(shim.parent / LIBRARY_NAMES[2])} if stand_in else {}
    results = dict(zip("10", in_c_and_in_python(DNN_SCENARIO, env, str(int(stand_in))), strict=True))
    # inference 3 of 4; training and backward 2 of 3 each; none of the refused; after the destroy 1 of 2;
    # executions 3 of 4 and 2 of 3 (a by-value scalar's pack is another record); the same again, 1 of 2 (a lane's
    # first record: Python); none refused; 1 of 3 after the free
    ran = [3, 7, 7, 8, 13, 14, 14, 15] if stand_in else [3, 7, 7, 8]
    assert results["1"].pop("ran") == ran, results["1"]
    assert results["0"].pop("ran") == [0] * len(ran)
    assert results["1"] == results["0"]  # the refusals' statuses included: Python's, as the session defers them
    channel_0 = [2 * (v - 1) / math.sqrt(0.5 + 0.25) + 1 for v in (1, 2)]  # gamma (x - mean) / sqrt(var + eps) + beta
    assert results["1"]["inferred"][:2] == [round(4 * v, 4) for v in channel_0]  # alpha 4, the last record's
    if not stand_in:
        return
    refused = ["cudnnBatchNormalizationForwardInference"] * 3 + ["xpuCudnnExecute"] * 3  # a foreign tensor
    # descriptor, x outside the session's memory, a foreign cuDNN handle; a data pointer outside, a tensor descriptor
    # for the cuDNN handle, a data pointer into freed memory
    assert [name for name, status in results["1"]["failures"] if status] == refused, results["1"]["failures"]
    assert results["1"]["convolved"] == [16.0, 14.0, 12.0, 10.0, 8.0, 6.0, 4.0, 2.0]
