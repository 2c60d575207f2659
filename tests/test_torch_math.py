"""PyTorch's math through xpuremote: the stock wheel's cuBLAS, cuBLASLt and cuDNN calls reach
xpuremote's replacement libraries, travel to the server and are computed there, by the sim device
with numpy or (XPU_TEST_BACKEND=cuda) by NVIDIA's libraries on the server's GPU
(tests/programs/torch_math_check.py compares each result with the CPU's).

The same program also runs against the cuda backend, whose libcuda and math libraries are
xpuremote's own (stand-ins, named as such) chained to a sim server: that exercises the cuda
backend's generic calls into NVIDIA-shaped libraries (C signatures, device addresses, scalars,
descriptor arrays) without a GPU. On a GPU machine the cuda backend loads NVIDIA's.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKEND, ROOT, TORCH_SIM_KERNELS, Server, start_chain, start_server
from test_torch import run_torch, torch_python

from xpuremote.client import call_cpu

MATH = ROOT / "tests" / "programs" / "torch_math_check.py"
TRAIN = ROOT / "tests" / "programs" / "torch_train_check.py"
E2E = ROOT / "bench" / "torch_e2e.py"
# the workloads of bench/torch_e2e.py: an MLP, a ResNet-18-like CNN, a GPT-2-like
# transformer, and an LLM's generate loop
E2E_WORKLOADS = ("mlp_train", "cnn_train_fp32", "gpt2_step_bf16", "gpt2_generate")
# largest difference from the CPU allowed per check: fp32 sums of a few dozen products, or
# relative to the result's magnitude where the device rounds to fp16/bf16
TOLERANCE = {"float16": 2e-3, "fp16": 2e-3, "bfloat16": 1.6e-2}


def tolerance(check: str) -> float:
    return next((t for key, t in TOLERANCE.items() if key in check), 1e-4)


@pytest.fixture(scope="module")
def math_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("math"), env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS})
    yield srv
    srv.stop()


def run_math(server: Server, program: Path = MATH, **env: str) -> tuple[dict[str, Any], str]:
    proc = run_torch(server, [str(program)], **env)
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1]), proc.stderr


def library_calls(server: Server) -> dict[str, int]:
    """Calls each math library's sessions made on the server, from its `session ... ended` lines."""
    counts: dict[str, int] = {}
    for found in re.findall(r"library calls:((?: \w+=\d+)+)", server.log()):
        for name, n in re.findall(r"(\w+)=(\d+)", found):
            counts[name] = counts.get(name, 0) + int(n)
    return counts


@pytest.fixture(scope="module")
def math_result(math_server: Server) -> tuple[dict[str, Any], str]:
    return run_math(math_server)


def assert_close(results: dict[str, Any]) -> None:
    failed = {k: v for k, v in results.items() if not isinstance(v, float) or not v <= tolerance(k)}
    assert not failed, json.dumps(failed, indent=1)


def test_matmul_conv_and_their_gradients_match_the_cpu(math_result: tuple[dict[str, Any], str]) -> None:
    results, _ = math_result
    expected = {"matmul_fp32", "matmul_float16", "matmul_bfloat16", "matmul_transposed", "matmul_non_contiguous",
                "mv", "addmv", "bmm", "bmm_fp16", "addmm", "addmm_relu", "addmm_gelu", "linear_forward",
                "conv2d_forward", "conv2d_dilated", "conv2d_channels_last", "conv2d_fp16", "conv2d_input_grad",
                "conv2d_weight_grad", "batch_norm"}
    assert expected <= set(results)
    assert_close(results)


def test_the_legacy_convolution_path(math_server: Server) -> None:
    """PyTorch's other cuDNN path (Conv_v7: descriptors, cudnnGet*Algorithm_v7, cudnnConvolution*)."""
    results, _ = run_math(math_server, TORCH_CUDNN_V8_API_DISABLED="1")
    convolutions = {k: v for k, v in results.items() if k.startswith("conv2d")}
    assert len(convolutions) == 6
    assert_close(convolutions)


def test_linear_backward_optimizer_steps_and_foreach_ops_match_the_cpu(math_server: Server, tmp_path: Path) -> None:
    """Gradients of nn.Linear, an MLP's two SGD steps (plain and with momentum) and 200 foreach additions:
    losses and parameters as on the CPU. ATen's own kernels on this path run, on the sim, as
    tests/torch_sim_kernels.py. A foreach kernel's 25 KiB of arguments fit the fast lane: all but its first
    launch skip the client core (XPU_CALL_CPU counts the core's)."""
    table = tmp_path / "calls.tsv"
    results, _ = run_math(math_server, TRAIN, XPU_CALL_CPU=str(table))
    assert {"linear_backward_weight", "linear_backward_bias", "linear_backward_input", "mlp_loss_step1",
            "mlp_loss_step2", "mlp_params_after", "mlp_momentum_params_after", "foreach_add_many"} <= set(results)
    assert_close(results)
    core = {name: calls for name, (calls, _) in call_cpu.read(table).items()}
    assert core.get("cuLaunchKernel", 0) < 100, core  # of 200 foreach launches and the rest: each kernel's first


E2E_ARGS = [str(E2E), "--run", ",".join(E2E_WORKLOADS), "--steps", "1", "--warmup", "1", "--size", "small"]
# how far a workload's loss or output checksum through xpuremote may be from the native run's on the
# same GPU: the same kernels, up to the order of atomic additions (bf16: a step's rounding)
E2E_TOLERANCE = {"gpt2_step_bf16": 2e-2}


def checksums(stdout: str) -> dict[str, float]:
    """bench/torch_e2e.py --run's checksum of each workload, in the order they ran."""
    found = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {r["workload"]: r["checksum"] for r in found}


def test_every_torch_e2e_workload_runs_to_the_end(tmp_path: Path) -> None:
    """On the sim, with kernels skipped (XPU_SIM_SKIP_KERNELS=1: values are garbage, calls are real),
    each workload's step makes only driver and library calls that xpuremote answers (one process
    runs them one after the other). On a GPU the kernels run: each checksum is the native run's."""
    # the sim's only
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS, "XPU_SIM_SKIP_KERNELS": "1"})
    try:
        proc = run_torch(srv, E2E_ARGS)
    finally:
        srv.stop()
    done = checksums(proc.stdout)
    assert proc.returncode == 0 and list(done) == list(E2E_WORKLOADS), (done, proc.stderr[-3000:])
    unanswered = sorted(set(re.findall(r"(\w+) is not supported by xpuremote", proc.stderr)))
    assert unanswered == [], unanswered
    assert "private table" not in proc.stderr and "failed" not in srv.log(), srv.log()[-3000:]
    if BACKEND != "sim":
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        native = subprocess.run([str(torch_python()), *E2E_ARGS], env=env, capture_output=True, text=True,
                                timeout=600)
        assert native.returncode == 0, native.stderr[-3000:]
        expected = checksums(native.stdout)
        off = {name: (done[name], value) for name, value in expected.items()
               if not math.isclose(done[name], value, rel_tol=E2E_TOLERANCE.get(name, 1e-3))}
        assert not off, f"(through xpuremote, native): {off}"


def test_the_wheels_library_calls_reach_the_server(math_result: tuple[dict[str, Any], str],
                                                    math_server: Server) -> None:
    """Counted where they are executed: a program whose math never left the client fails here.
    NVIDIA's own libraries (mapped too, by the wheel's path loads) never initialise: nothing asks
    the driver for their private tables."""
    _, stderr = math_result
    math_server.stop()  # its sessions' end lines are in the log once it has stopped
    counts = library_calls(math_server)
    assert counts.get("cublas", 0) >= 10 and counts.get("cublasLt", 0) >= 10 and counts.get("cudnn", 0) >= 50, counts
    assert "private table" not in stderr, stderr[-3000:]
    assert "not supported by xpuremote" not in stderr, stderr[-3000:]


REPEATED = """
import sys, torch, torch.nn.functional as F
torch.manual_seed(0)
x, w, m = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3), torch.randn(16, 16)
mean, var, bias = torch.randn(4), torch.rand(4) + 0.5, torch.randn(16)
def trained(t):  # a training batch norm, forward and backward: the input's gradient
    v = t(x).requires_grad_()
    F.batch_norm(v, t(mean), t(var), t(mean), t(var), training=True).sum().backward()
    return v.grad


ops = {"conv2d": lambda t: F.conv2d(t(x), t(w)),
       "batch_norm": lambda t: F.batch_norm(t(x), t(mean), t(var), t(mean), t(var)),
       "batch_norm_train": trained,
       "addmm": lambda t: torch.addmm(t(bias), t(m), t(m))}
op = ops[sys.argv[1]]
for _ in range(int(sys.argv[2])):
    y = op(lambda v: v.cuda())
print(float((y.cpu() - op(lambda v: v)).abs().max()))
"""
# the library whose calls an operation makes, how many the server runs for each one more of it, and the calls that
# compute, queued in C after the first time
PER_OPERATION = {"conv2d": ("cudnn", 0, ("cudnnBackendExecute",)),
                 "batch_norm": ("cudnn", 1, ("cudnnBatchNormalizationForwardInference",)),
                 "batch_norm_train": ("cudnn", 2, ("cudnnBatchNormalizationForwardTrainingEx",
                                                   "cudnnBatchNormalizationBackwardEx")),
                 "addmm": ("cublasLt", 1, ("cublasLtMatmul",))}


@pytest.mark.parametrize("op", sorted(PER_OPERATION))
def test_an_operations_descriptors_cost_the_server_nothing_after_the_first(tmp_path: Path, op: str) -> None:
    """PyTorch makes the descriptors of an operation anew each time and destroys them after: a variant pack
    for a convolution (seven cuDNN calls), two tensor descriptors for a batch norm (six calls beside the one
    that computes), a matmul descriptor, three layouts and a preference for a cuBLASLt GEMM (thirteen beside
    it). The client keeps them: ten more operations cost the server only the calls that compute (none for a
    convolution: its execution is an internal call), their descriptor calls, a training batch norm's workspace
    sizes, and the calls that compute once their descriptors and pointers were seen, are answered or queued in C
    and never reach the client core (XPU_CALL_CPU counts the core's calls), and the results are the CPU's."""
    from xpuremote.client.kept_in_c import IN_C_OPS

    program = tmp_path / "repeated.py"
    program.write_text(REPEATED)
    library, each, computes = PER_OPERATION[op]
    served, in_core = [], []
    for n in (2, 12):
        srv, table = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS}), tmp_path / f"core-{n}.tsv"
        try:
            proc = run_torch(srv, [str(program), op, str(n)], XPU_CALL_CPU=str(table))
        finally:
            srv.stop()
        assert proc.returncode == 0 and float(proc.stdout.split()[-1]) < 1e-4, proc.stderr[-3000:]
        served.append(library_calls(srv).get(library, 0))
        in_core.append({name: calls for name, (calls, _) in call_cpu.read(table).items()
                        if name in IN_C_OPS or name in computes})
    assert served[0] > 0 and served[1] == served[0] + 10 * each, served
    assert in_core[1] == in_core[0], in_core


# On a GPU the other tests here are the cuda backend's, with NVIDIA's libcuda and math libraries.
@pytest.mark.sim_only(reason="the cuda backend on stand-in libraries chained to a sim server")
def test_the_same_math_through_the_cuda_backend(chained: tuple[Server, Server]) -> None:
    results, stderr = run_math(chained[0])
    assert_close(results)
    assert "not supported by xpuremote" not in stderr, stderr[-3000:]


# The server's versions are the sim's claim here (XPU_SIM_LIBRARY_VERSIONS); a GPU server has the
# ones it has (a GPU check found the stock PyTorch's cuBLAS 13.1 there, older than these headers).
VERSIONS = ("import ctypes, torch; x = torch.ones(4, 4).cuda(); print((x @ x).sum().item()); "
            "lib, v = ctypes.CDLL('libcublas.so.13'), ctypes.c_int(); "
            "print([lib.cublasGetProperty(k, ctypes.byref(v)) or v.value for k in range(3)])")


@pytest.mark.sim_only(reason="the server's library versions are the sim's claim (XPU_SIM_LIBRARY_VERSIONS)")
@pytest.mark.parametrize("served", ["older minor", "other major"])
def test_the_servers_library_version_is_what_the_program_gets(tmp_path: Path, served: str) -> None:
    """A server whose cuBLAS has an older minor serves it, and the program is told that version; one
    with another major is refused at the first handle, saying what to install."""
    from xpuremote.protocol import cublas_api

    major = cublas_api.VERSION[0]
    version = [major, 0, 7] if served == "older minor" else [major - 1, 9, 0]
    srv = start_server(tmp_path, env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS,
                                      "XPU_SIM_LIBRARY_VERSIONS": "cublas=" + ".".join(map(str, version))})
    try:
        proc = run_torch(srv, ["-c", VERSIONS])
    finally:
        srv.stop()
    if served == "older minor":
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == ["64.0", *f"[{version[0]}, {version[1]}, {version[2]}]".split()], proc.stdout
    else:
        assert proc.returncode != 0
        assert f"cannot serve cublas {major}.x" in proc.stderr, proc.stderr[-3000:]
        assert f"the server has {major - 1}.9.0" in proc.stderr, proc.stderr[-3000:]


SDPA = """
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
q = torch.randn(2, 2, 64, 32, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for scale in (None, 0.25, 0.25, 0.5, 0.5):  # the same plan again: by then, its executions are queued in C
        y = F.scaled_dot_product_attention(q, q, q, is_causal=True, scale=scale)
torch.cuda.synchronize()
print("ok", tuple(y.shape))
"""


@pytest.mark.sim_only(reason="the cuda backend on stand-in libraries chained to a sim server")
def test_attention_through_cudnn_sends_its_by_value_scale(shim: Path, tmp_path: Path) -> None:
    """cuDNN attention (PyTorch's choice for bf16 on sm_90) names its scale by value: a host pointer in the
    variant pack. The client sends the scalar's bytes and the cuda backend puts them where NVIDIA's cuDNN
    reads them; refused before, which an H100 reported only at the next cuBLASLt call (gpt2_step_bf16). Once
    the core has seen a pack's pointers, C queues its executions itself, reading the scalar's bytes as they are at
    each one (XPU_CALL_CPU counts the executions the core saw)."""
    cuda, sim = start_chain(tmp_path, shim, {"XPU_SIM_SKIP_KERNELS": "1"})
    program = tmp_path / "sdpa.py"
    program.write_text(SDPA)
    table = tmp_path / "core.tsv"
    try:
        proc = run_torch(cuda, [str(program)], XPU_CALL_CPU=str(table))
    finally:
        cuda.stop()
        sim.stop()
    assert proc.returncode == 0 and "ok (2, 2, 64, 32)" in proc.stdout, proc.stderr[-3000:]
    executions = call_cpu.read(table).get("cudnnBackendExecute", (0, 0))[0]
    assert "by-value" not in cuda.log() and "failed" not in cuda.log(), cuda.log()[-3000:]
    said = re.findall(r"by-value scalars ([0-9a-f ]+)", sim.log())  # 8 bytes each, a float32 in the first 4
    scalars = [struct.unpack("<f", bytes.fromhex(h)[:4])[0] for h in " ".join(said).split()]
    assert [v for v in (32 ** -0.5, 0.25, 0.5) if v not in [pytest.approx(s) for s in scalars]] == [], scalars
    assert 0 < executions < 5, executions
