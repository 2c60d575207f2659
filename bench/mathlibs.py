"""The math libraries through xpuremote: cost per forwarded call, and calls per training step.

    python bench/mathlibs.py [--out bench/results/mathlibs-sim.json] [--calls N] [--skip-workloads]

On a private `xpu-server --backend sim` over loopback:

1. cost per call: a process with the shim preloaded (as xpu-run runs a program) calls cuBLAS
   through ctypes, as a C program or PyTorch does:
   - async: cublasSgemm_v2 on 1x1 matrices N times, then one cuCtxSynchronize (the sim's numpy
     work on each GEMM counts in the server's figure); and cublasSetMathMode N times, a call
     the server only records (forwarding alone);
   - async: cusolverDnSpotrf of a 1x1 matrix N times (its info into device memory), then one
     cuCtxSynchronize;
   - async: cusparseSpMV of a 1x1 CSR matrix and two dense vectors (descriptors made once) N times, then
     one cuCtxSynchronize;
   - async: cufftExecC2C of a 2-point plan (made once with cufftPlan1d) N times, then one cuCtxSynchronize;
   - async: curandGenerateUniform of 2 floats (a Philox generator made and seeded once) N times, then one
     cuCtxSynchronize;
   - async: cusparseLtMatmul of an 8x8 2:4-structured fp32 matrix (compressed once) by a dense 8x8 one (its
     descriptors, selection and plan made once) N times, then one cuCtxSynchronize;
   - sync: cublasLtMatmulDescGetAttribute N times (a call that waits for its answer);
   - one operation's calls as PyTorch makes them, N times: a cuDNN batch norm in inference (the stream, two
     tensor descriptors made and set, the batch norm, two destroys: 8 calls) and a cuBLASLt GEMM (five
     descriptors made, seven attributes set, the heuristic, the GEMM, five destroys: 21 calls), each beside as
     many calls the shim answers in C (cuCtxGetDevice): what ctypes and the entry point cost. Medians of 5
     runs, interleaved.
   Beside each, the baseline from the same run: bare pyzmq + msgpack against an echo server,
   the same calls' wire shape (batched as the client batches, or one echo per call).
   Client CPU is the calling process's CPU time per call, server CPU the session worker's.
2. calls per training step: each bench/torch_e2e.py workload (--size small) under
   XPU_SIM_SKIP_KERNELS=1 with a trace of 3 steps after a warm-up one, the timed steps' calls divided by 3
   (and the server's count at 1 step taken from that at 3, halved): calls by library and class, round trips
   (messages that waited for an answer), the synchronizing
   operations the step asked for (PyTorch's sync debug mode's count, and the synchronize ending the step: a
   round trip beyond them is one the application did not ask for), and the calls the server ran (its
   session's count: what the client kept or answered is not among them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import TORCH_PYTHON, RawAgent, echo_server  # noqa: E402

from xpuremote.protocol import trace as trace_format  # noqa: E402
from xpuremote.protocol.calls import CALLS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("mlp_train", "cnn_train_fp32", "cnn_infer_b1", "gpt2_step_bf16", "gpt2_generate")
KERNELS = str(ROOT / "tests" / "torch_sim_kernels.py")

SHIM_AGENT = r"""
import ctypes as c, json, sys, time
n = int(sys.argv[1])
cu, blas, lt = c.CDLL("libcuda.so.1"), c.CDLL("libcublas.so.13"), c.CDLL("libcublasLt.so.13")
dnn = c.CDLL("libcudnn.so.9")
solver = c.CDLL("libcusolver.so.12")
sparse = c.CDLL("libcusparse.so.12")
fft = c.CDLL("libcufft.so.12")
rand = c.CDLL("libcurand.so.10")
lt_sparse = c.CDLL("libcusparseLt.so.0")
def ok(rc, what):
    if rc: raise SystemExit(f"{what} returned {rc}")
ok(cu.cuInit(0), "cuInit")
dev, ctx, handle, desc = c.c_int(), c.c_void_p(), c.c_void_p(), c.c_void_p()
ok(cu.cuDeviceGet(c.byref(dev), 0), "cuDeviceGet")
ok(cu.cuDevicePrimaryCtxRetain(c.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
ptrs = [c.c_uint64() for _ in range(3)]
for p in ptrs:
    ok(cu.cuMemAlloc_v2(c.byref(p), 4), "cuMemAlloc")
ok(blas.cublasCreate_v2(c.byref(handle)), "cublasCreate")
ok(lt.cublasLtMatmulDescCreate(c.byref(desc), 68, 0), "cublasLtMatmulDescCreate")  # COMPUTE_32F, R_32F
alpha, beta = c.c_float(1.0), c.c_float(0.0)
gemm = blas.cublasSgemm_v2
gemm.argtypes = [c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_int, c.c_int, c.c_void_p, c.c_uint64, c.c_int,
                 c.c_uint64, c.c_int, c.c_void_p, c.c_uint64, c.c_int]
get = lt.cublasLtMatmulDescGetAttribute
get.argtypes = [c.c_void_p, c.c_int, c.c_void_p, c.c_size_t, c.c_void_p]
value, written = c.c_int(), c.c_size_t()
a, b, out = (p.value for p in ptrs)
def gemms(k):
    for _ in range(k):
        gemm(handle, 0, 0, 1, 1, 1, c.byref(alpha), a, 1, b, 1, c.byref(beta), out, 1)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
def gets(k):
    for _ in range(k):
        get(desc, 0, c.byref(value), 4, c.byref(written))
def modes(k):
    for i in range(k):
        blas.cublasSetMathMode(handle, i & 1)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
solver_handle, solver_info = c.c_void_p(), c.c_uint64()
ok(solver.cusolverDnCreate(c.byref(solver_handle)), "cusolverDnCreate")
ok(cu.cuMemAlloc_v2(c.byref(solver_info), 4), "cuMemAlloc")
potrf = solver.cusolverDnSpotrf
potrf.argtypes = [c.c_void_p, c.c_int, c.c_int, c.c_uint64, c.c_int, c.c_uint64, c.c_int, c.c_uint64]
def potrfs(k):  # a 1x1 Cholesky factorization, its info written to device memory
    for _ in range(k):
        potrf(solver_handle, 0, 1, out, 1, a, 1, solver_info.value)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
sparse_handle, csr, vec_x, vec_y, sparse_data = c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_uint64()
ok(sparse.cusparseCreate(c.byref(sparse_handle)), "cusparseCreate")
ok(cu.cuMemAlloc_v2(c.byref(sparse_data), 64), "cuMemAlloc")  # zeros: offsets [0, 0], an empty 1x1 matrix
sd = sparse_data.value
sparse.cusparseCreateCsr.argtypes = [c.c_void_p, c.c_int64, c.c_int64, c.c_int64, c.c_uint64, c.c_uint64, c.c_uint64,
                                     c.c_int, c.c_int, c.c_int, c.c_int]
ok(sparse.cusparseCreateCsr(c.byref(csr), 1, 1, 1, sd, sd + 16, sd + 24, 2, 2, 0, 0), "cusparseCreateCsr")  # 32I
sparse.cusparseCreateDnVec.argtypes = [c.c_void_p, c.c_int64, c.c_uint64, c.c_int]
ok(sparse.cusparseCreateDnVec(c.byref(vec_x), 1, sd + 32, 0), "cusparseCreateDnVec")
ok(sparse.cusparseCreateDnVec(c.byref(vec_y), 1, sd + 40, 0), "cusparseCreateDnVec")
spmv = sparse.cusparseSpMV
spmv.argtypes = [c.c_void_p, c.c_int, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_void_p, c.c_int, c.c_int,
                 c.c_uint64]
def spmvs(k):  # y = A x of a 1x1 CSR matrix, R_32F, the default algorithm
    for _ in range(k):
        spmv(sparse_handle, 0, c.byref(alpha), csr, vec_x, c.byref(beta), vec_y, 0, 0, 0)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
fft_plan, fft_data = c.c_int(), c.c_uint64()
ok(fft.cufftPlan1d(c.byref(fft_plan), 2, 0x29, 1), "cufftPlan1d")  # CUFFT_C2C
ok(cu.cuMemAlloc_v2(c.byref(fft_data), 16), "cuMemAlloc")
exec_c2c = fft.cufftExecC2C
exec_c2c.argtypes = [c.c_int, c.c_uint64, c.c_uint64, c.c_int]
def ffts(k):  # a forward transform of 2 complex points, in place
    for _ in range(k):
        exec_c2c(fft_plan, fft_data.value, fft_data.value, -1)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
generator, rand_data = c.c_void_p(), c.c_uint64()
ok(rand.curandCreateGenerator(c.byref(generator), 161), "curandCreateGenerator")  # CURAND_RNG_PSEUDO_PHILOX4_32_10
ok(rand.curandSetPseudoRandomGeneratorSeed(generator, c.c_ulonglong(1234)), "curandSetPseudoRandomGeneratorSeed")
ok(cu.cuMemAlloc_v2(c.byref(rand_data), 8), "cuMemAlloc")
uniform = rand.curandGenerateUniform
uniform.argtypes = [c.c_void_p, c.c_uint64, c.c_size_t]
def uniforms(k):  # two floats into device memory
    for _ in range(k):
        uniform(generator, rand_data.value, 2)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
splt_handle, splt_a, splt_b, splt_c, splt_mm, splt_alg, splt_plan = (c.create_string_buffer(512) for _ in range(7))
splt_data = c.c_uint64()
ok(lt_sparse.cusparseLtInit(splt_handle), "cusparseLtInit")
ok(cu.cuMemAlloc_v2(c.byref(splt_data), 4096), "cuMemAlloc")  # compressed A, B, C/D: zeros
i64, u32 = c.c_int64, c.c_uint32
ok(lt_sparse.cusparseLtStructuredDescriptorInit(splt_handle, splt_a, i64(8), i64(8), i64(8), u32(16), 0, 2, 0), "A")
for splt_m in (splt_b, splt_c):  # CUDA_R_32F, CUSPARSE_ORDER_ROW
    ok(lt_sparse.cusparseLtDenseDescriptorInit(splt_handle, splt_m, i64(8), i64(8), i64(8), u32(16), 0, 2), "B, C")
ok(lt_sparse.cusparseLtMatmulDescriptorInit(splt_handle, splt_mm, 0, 0, splt_a, splt_b, splt_c, splt_c, 2),  # 32F
   "matmul")
ok(lt_sparse.cusparseLtMatmulAlgSelectionInit(splt_handle, splt_alg, splt_mm, 0), "alg selection")
ok(lt_sparse.cusparseLtMatmulPlanInit(splt_handle, splt_plan, splt_mm, splt_alg), "plan")
ld = splt_data.value
ok(lt_sparse.cusparseLtSpMMACompress(splt_handle, splt_plan, c.c_void_p(ld + 1024), c.c_void_p(ld), None, None),
   "compress")
splt_matmul = lt_sparse.cusparseLtMatmul
splt_matmul.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_uint64, c.c_uint64, c.c_void_p, c.c_uint64,
                        c.c_uint64, c.c_uint64, c.c_void_p, c.c_int32]
splt_alpha, splt_beta = c.c_float(1.0), c.c_float(0.0)
def lt_matmuls(k):  # D = A B of 8x8 fp32 matrices, A 2:4-structured
    for _ in range(k):
        splt_matmul(splt_handle, splt_plan, c.byref(splt_alpha), ld, ld + 1024, c.byref(splt_beta), ld + 2048,
                    ld + 2048, 0, None, 0)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
dnn_handle, x, y, device, data = c.c_void_p(), c.c_void_p(), c.c_void_p(), c.c_int(), c.c_uint64()
ok(dnn.cudnnCreate(c.byref(dnn_handle)), "cudnnCreate")
ok(cu.cuMemAlloc_v2(c.byref(data), 4096), "cuMemAlloc")
dims, strides = (c.c_int * 4)(1, 8, 2, 2), (c.c_int * 4)(32, 4, 2, 1)  # small: the sim's numpy work stays small
norm = dnn.cudnnBatchNormalizationForwardInference
norm.argtypes = [c.c_void_p, c.c_int, c.c_void_p, c.c_void_p, c.c_void_p, c.c_uint64, c.c_void_p, c.c_uint64,
                 c.c_void_p, c.c_uint64, c.c_uint64, c.c_uint64, c.c_uint64, c.c_double]
def batch_norms(k):  # as PyTorch calls cuDNN for a batch norm in inference: 8 calls
    for _ in range(k):
        dnn.cudnnSetStream(dnn_handle, None)
        for t in (x, y):
            dnn.cudnnCreateTensorDescriptor(c.byref(t))
            dnn.cudnnSetTensorNdDescriptor(t, 0, 4, dims, strides)
        d = data.value
        ok(norm(dnn_handle, 1, c.byref(alpha), c.byref(beta), x, d, y, d, y, d, d, d, d, 1e-5), "batch norm")
        dnn.cudnnDestroyTensorDescriptor(x)
        dnn.cudnnDestroyTensorDescriptor(y)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
from xpuremote.protocol.cublasLt_api import ENUMS as LT
lt_handle, matmul_data = c.c_void_p(), c.c_uint64()
ok(lt.cublasLtCreate(c.byref(lt_handle)), "cublasLtCreate")
ok(cu.cuMemAlloc_v2(c.byref(matmul_data), 1 << 16), "cuMemAlloc")
matmul = lt.cublasLtMatmul
matmul.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_uint64, c.c_void_p, c.c_uint64, c.c_void_p, c.c_void_p,
                   c.c_uint64, c.c_void_p, c.c_uint64, c.c_void_p, c.c_void_p, c.c_uint64, c.c_size_t, c.c_void_p]
transpose, no, workspace = c.c_int(1), c.c_int(0), c.c_uint64(1 << 12)
alignment, found, heuristic = c.c_uint32(16), c.c_int(), (c.c_char * 96)()
def lt_gemms(k):  # as PyTorch makes a GEMM through cuBLASLt (a linear layer): 21 calls
    for _ in range(k):
        preference, matmul_desc, layouts = c.c_void_p(), c.c_void_p(), [c.c_void_p() for _ in range(3)]
        lt.cublasLtMatmulPreferenceCreate(c.byref(preference))
        lt.cublasLtMatmulDescCreate(c.byref(matmul_desc), LT["CUBLAS_COMPUTE_32F"], LT["CUDA_R_32F"])
        lt.cublasLtMatmulDescSetAttribute(matmul_desc, LT["CUBLASLT_MATMUL_DESC_TRANSA"], c.byref(transpose), 4)
        lt.cublasLtMatmulDescSetAttribute(matmul_desc, LT["CUBLASLT_MATMUL_DESC_TRANSB"], c.byref(no), 4)
        for layout in layouts:
            lt.cublasLtMatrixLayoutCreate(c.byref(layout), LT["CUDA_R_32F"], c.c_uint64(8), c.c_uint64(8),
                                          c.c_int64(8))
        lt.cublasLtMatmulPreferenceSetAttribute(preference, LT["CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES"],
                                                c.byref(workspace), 8)
        for name in ("A", "B", "C", "D"):
            lt.cublasLtMatmulPreferenceSetAttribute(
                preference, LT[f"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{name}_BYTES"], c.byref(alignment), 4)
        a_, b_, l_ = layouts[0], layouts[1], layouts[2]
        ok(lt.cublasLtMatmulAlgoGetHeuristic(lt_handle, matmul_desc, a_, b_, l_, l_, preference, 1, heuristic,
                                             c.byref(found)), "heuristic")
        d = matmul_data.value
        ok(matmul(lt_handle, matmul_desc, c.byref(alpha), d, a_, d + 256, b_, c.byref(beta), d + 512, l_, d + 512,
                  l_, heuristic, d + 4096, 0, None), "cublasLtMatmul")
        lt.cublasLtMatrixLayoutDestroy(layouts[0]), lt.cublasLtMatrixLayoutDestroy(layouts[1])
        lt.cublasLtMatrixLayoutDestroy(layouts[2]), lt.cublasLtMatmulDescDestroy(matmul_desc)
        lt.cublasLtMatmulPreferenceDestroy(preference)
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
def floors(calls):  # as many calls, each answered in C: what ctypes and the entry point cost
    def run(k):
        for _ in range(calls * k):
            cu.cuCtxGetDevice(c.byref(device))
    return run
gemms(200), gets(200), modes(200), potrfs(200), spmvs(200), ffts(200), uniforms(200), batch_norms(200)  # warm
lt_gemms(200), lt_matmuls(200)
print("ready", flush=True)
runs = {"async": gemms, "async_record": modes, "async_solver": potrfs, "async_sparse": spmvs, "async_fft": ffts,
        "async_rand": uniforms, "async_sparselt": lt_matmuls,
        "sync": gets, "batch_norm": batch_norms, "batch_norm_floor": floors(8),
        "lt_gemm": lt_gemms, "lt_gemm_floor": floors(21)}
for line in sys.stdin:  # the name of what to run next
    cpu, wall = time.process_time(), time.perf_counter()
    runs[line.strip()](n)
    print(json.dumps({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}), flush=True)
"""
# an operation's calls, and as many answered in C; 5 runs each, interleaved: the sim server shares the machine
OPERATIONS = ("batch_norm", "batch_norm_floor", "lt_gemm", "lt_gemm_floor")
OPERATION_REPEATS = 5


def start_server(tmp: Path) -> tuple[subprocess.Popen, str, Path]:
    log = tmp / "server.log"
    port = _free_port()
    env = {**os.environ, "XPU_LOG": "INFO", "XPU_SIM_KERNELS": KERNELS, "XPU_SIM_SKIP_KERNELS": "1"}
    env.pop("LD_PRELOAD", None)
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "xpuremote.server.daemon", "--listen",
                                 f"tcp://127.0.0.1:{port}", "--backend", "sim"], stderr=f, env=env)
    _wait_for(lambda: "ready" in log.read_text(), "the server")
    return proc, f"tcp://127.0.0.1:{port}", log


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(test: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not test():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.05)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shim_costs(address: str, log: Path, n: int) -> dict[str, Any]:
    from xpuremote.interpose.build import ensure_shim
    from xpuremote.interpose.run import child_env

    env = child_env(str(ensure_shim().parent), address)
    agent = subprocess.Popen([sys.executable, "-c", SHIM_AGENT, str(n)], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    if agent.stdout.readline().strip() != "ready":
        raise SystemExit("the shim agent failed")
    worker = int(re.findall(r"worker_pid=(\d+)", log.read_text())[-1])
    samples: dict[str, list[dict[str, float]]] = {}
    for name in ("async", "async_record", "async_solver", "async_sparse", "async_fft", "async_rand", "async_sparselt",
                 "sync",
                 *OPERATIONS * OPERATION_REPEATS):
        before = cpu_s(worker)
        agent.stdin.write(name + "\n")
        agent.stdin.flush()
        run = json.loads(agent.stdout.readline())
        samples.setdefault(name, []).append({
            "calls_per_s": n / run["wall_s"], "us_per_call": 1e6 * run["wall_s"] / n,
            "client_cpu_us": 1e6 * run["cpu_s"] / n, "server_cpu_us": 1e6 * (cpu_s(worker) - before) / n})
    agent.stdin.close()
    agent.wait(30)
    return {name: {key: statistics.median(s[key] for s in runs) for key in runs[0]} for name, runs in samples.items()}


def raw_costs(n: int) -> dict[str, Any]:
    server = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--echo-server"], stdout=subprocess.PIPE,
                              text=True)
    endpoint = server.stdout.readline().split()[-1]
    agent = RawAgent(endpoint, 1)
    # the wire shape of the shim's cublasSgemm_v2 on 1x1 matrices: handle, ops, sizes, scalars, addresses
    gemm = [CALLS["cublasSgemm_v2"].opcode, [0x7C00_0000_0040, 0, 0, 1, 1, 1, b"\0\0\x80?", agent.dptr, 1, agent.dptr,
                                              1, b"\0\0\0\0", agent.dptr, 1]]
    try:
        cpu = time.process_time()
        wall = agent.batched(n, gemm)
        async_cpu = time.process_time() - cpu
        cpu = time.process_time()
        sync_wall = agent.sync(n)
        sync_cpu = time.process_time() - cpu
    finally:
        agent.close()
        server.wait(10)
    return {"async": {"calls_per_s": n / wall, "us_per_call": 1e6 * wall / n, "client_cpu_us": 1e6 * async_cpu / n},
            "sync": {"calls_per_s": n / sync_wall, "us_per_call": 1e6 * sync_wall / n,
                     "client_cpu_us": 1e6 * sync_cpu / n}}


# ---- calls per step ---------------------------------------------------------------------------------
def step_counts(address: str, log: Path, tmp: Path, workload: str) -> dict[str, Any]:
    """One training (or generate) step's calls: the application's, from a trace of 3 timed steps after a warm-up
    one, those within the timed steps divided by 3; and those the server ran, by the difference of its
    session's count at 3 steps and at 1, halved."""
    runs = []
    for steps in (1, 3):
        ended = len(ENDED.findall(log.read_text()))
        path = tmp / f"{workload}-{steps}.trace"
        cmd = [str(TORCH_PYTHON), "-m", "xpuremote.interpose.run", "--server", address, "--trace", str(path), "--",
               str(TORCH_PYTHON), str(ROOT / "bench" / "torch_e2e.py"), "--run", workload, "--steps", str(steps),
               "--warmup", "1", "--size", "small", "--count-syncs"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip()[-500:]}
        _wait_for(lambda ended=ended: len(ENDED.findall(log.read_text())) > ended, "the session's end")
        runs.append((json.loads(proc.stdout.strip().splitlines()[-1]), path,
                     int(ENDED.findall(log.read_text())[ended])))
    (_, _, served_1), (timed, path, served_3) = runs
    counts = _count(trace_format.read(path), *timed["window_ns"])
    steps = timed["steps"]
    return {**{key: n / steps for key, n in counts.items()}, "syncs_asked": timed["syncs_asked"] / steps,
            "server_calls": (served_3 - served_1) / 2}


ENDED = re.compile(r"session \S+ ended: (\d+) calls")


def _count(trace: trace_format.Trace, start_ns: int, end_ns: int) -> Counter:
    """The calls and messages of a trace between two CLOCK_MONOTONIC times (the trace's are after its epoch)."""
    start, end = start_ns - trace.header["epoch_ns"], end_ns - trace.header["epoch_ns"]
    counts: Counter = Counter()
    for call in trace.calls:
        if start <= call.entry <= end:
            library = CALLS[call.name].library if call.name in CALLS else "cuda"
            counts[f"calls_{library}"] += 1
            counts[f"class_{call.cls}"] += 1
            counts["calls"] += 1
    for m in trace.messages:
        if start <= m.sent <= end:
            counts["messages"] += 1
            counts["round_trips"] += m.kind != "async"
    return counts


def markdown(report: dict[str, Any]) -> str:
    rows = [f"# Math libraries through xpuremote ({report['when']})", "", f"Command: `{report['command']}`",
            f"Machine: {report['machine']}", "", "## Cost per forwarded call (sim backend, loopback)", "",
            "| call | through the shim | raw pyzmq + msgpack | ratio | client CPU µs/call (raw) | server CPU µs/call |",
            "|---|---|---|---|---|---|"]
    for kind, label in (("async", "cublasSgemm_v2 1x1, async (calls/s)"),
                        ("async_record", "cublasSetMathMode, async (calls/s)"),
                        ("async_solver", "cusolverDnSpotrf 1x1, async (calls/s)"),
                        ("async_sparse", "cusparseSpMV 1x1 CSR, async (calls/s)"),
                        ("async_fft", "cufftExecC2C of 2 points, async (calls/s)"),
                        ("async_rand", "curandGenerateUniform of 2 floats, async (calls/s)"),
                        ("async_sparselt", "cusparseLtMatmul 8x8 2:4 fp32, async (calls/s)"),
                        ("sync", "cublasLtMatmulDescGetAttribute, sync (µs/call)")):
        s, r = report["shim"][kind], report["raw"][kind.split("_")[0]]
        key = "calls_per_s" if kind.startswith("async") else "us_per_call"
        shim_v, raw_v = s[key], r[key]
        ratio = shim_v / raw_v
        rows.append(f"| {label} | {shim_v:,.1f} | {raw_v:,.1f} | {ratio:.2f} | {s['client_cpu_us']:.1f} "
                    f"({r['client_cpu_us']:.1f}) | {s['server_cpu_us']:.1f} |")
    if report["shim"].get("batch_norm"):
        rows += ["", "## One operation's calls, as PyTorch makes them", "",
                 f"Medians of {OPERATION_REPEATS} runs, interleaved. The baseline: as many calls answered in C "
                 "(cuCtxGetDevice), what ctypes and the entry point cost.", "",
                 "| operation | calls | µs per operation | client CPU µs | server CPU µs | baseline: client CPU µs |",
                 "|---|---|---|---|---|---|"]
        for name, label, calls in (("batch_norm", "cuDNN batch norm, inference (the stream, two tensor descriptors "
                                    "made and set, the batch norm, two destroys)", 8),
                                   ("lt_gemm", "cuBLASLt GEMM (five descriptors made, seven attributes set, the "
                                    "heuristic, the GEMM, five destroys)", 21)):
            op, floor = report["shim"][name], report["shim"][f"{name}_floor"]
            rows.append(f"| {label} | {calls} | {op['us_per_call']:.1f} | {op['client_cpu_us']:.1f} | "
                        f"{op['server_cpu_us']:.1f} | {floor['client_cpu_us']:.1f} |")
    if report.get("steps"):
        rows += ["", "## One step of each bench/torch_e2e.py workload (--size small, XPU_SIM_SKIP_KERNELS=1)", "",
                 "| workload | calls | driver | cuBLAS | cuBLASLt | cuDNN | local | async+shadow | "
                 "sync (table class) | messages | round trips | syncs PyTorch asked for | calls the server ran |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, c in report["steps"].items():
            if "error" in c:
                rows.append(f"| {name} | error: {c['error'].splitlines()[-1][:100]} |")
                continue
            def g(key: str, c: dict[str, Any] = c) -> float:
                return c.get(key, 0)

            rows.append(f"| {name} | {g('calls'):.0f} | {g('calls_cuda'):.0f} | {g('calls_cublas'):.0f} | "
                        f"{g('calls_cublasLt'):.0f} | {g('calls_cudnn'):.0f} | {g('class_local'):.0f} | "
                        f"{g('class_async') + g('class_shadow'):.0f} | {g('class_sync'):.0f} | {g('messages'):.0f} | "
                        f"{g('round_trips'):.0f} | {g('syncs_asked'):.0f} | {g('server_calls'):.0f} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON here, Markdown beside it")
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--skip-workloads", action="store_true", help="only the cost per call")
    parser.add_argument("--echo-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.echo_server:
        return echo_server()
    import platform

    with tempfile.TemporaryDirectory() as tmp:
        server, address, log = start_server(Path(tmp))
        try:
            report = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv),
                      "machine": f"{platform.platform()}, {os.cpu_count()} cpus", "calls": args.calls,
                      "shim": shim_costs(address, log, args.calls), "raw": raw_costs(args.calls), "steps": {}}
            if not args.skip_workloads:
                for name in WORKLOADS:
                    report["steps"][name] = step_counts(address, log, Path(tmp), name)
        finally:
            server.terminate()
            server.wait(10)
    text = markdown(report)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
        args.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
