"""The host-only compilers under xpu-run: NVRTC and nvJitLink run in the program's process (they need no GPU), and
what they build goes to the server as any module image does (cuModuleLoadData). On the sim a compiled kernel runs
as its numpy twin, registered by name (tests/jit_sim_kernels.py); on a GPU (XPU_TEST_BACKEND=cuda) it runs itself.
Both compilers ask the driver for a private table they go on without: said at INFO, not as a failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, start_server
from test_torch import run_torch, torch_python

JIT_SIM_KERNELS = f"{TORCH_SIM_KERNELS},{ROOT / 'tests' / 'jit_sim_kernels.py'}"
NVRTC = ROOT / "tests" / "programs" / "nvrtc_check.py"
MODES = ("cubin", "ptx", "jitlink")
# a private table the program was told xpuremote lacks, as if it needed it (interpose/entry.py's unknown_table)
UNKNOWN_TABLE = re.compile(r"asked for private table [-0-9a-f]+, which xpuremote does not implement")

JITERATOR = """
import json, torch
torch.manual_seed(0)
x, y = torch.randn(1000), torch.randn(1000)
code = "template <typename T> T my_op(T x, T y, T alpha) { return -x + alpha * y; }"
my_op = torch.cuda.jiterator._create_jit_fn(code, alpha=1.0)
t = torch.linspace(-1.5, 1.5, 64)
n = torch.arange(64.0) % 9
results = {
    "create_jit_fn": (my_op(x.cuda(), y.cuda(), alpha=2.5).cpu() - (-x + 2.5 * y)).abs().max().item(),
    "chebyshev_scalar_n": (torch.special.chebyshev_polynomial_t(t.cuda(), 5).cpu()
                           - torch.special.chebyshev_polynomial_t(t, 5)).abs().max().item(),
    "chebyshev_tensor_n": (torch.special.chebyshev_polynomial_t(t.cuda(), n.cuda()).cpu()
                           - torch.special.chebyshev_polynomial_t(t, n)).abs().max().item(),
}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def jit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("jit"), env={"XPU_SIM_KERNELS": JIT_SIM_KERNELS})
    yield srv
    srv.stop()


def test_jiterator_ops_compile_here_and_run_on_the_server(jit_server: Server) -> None:
    """PyTorch's jiterator compiles a `_create_jit_fn` op and torch.special.chebyshev_polynomial_t with NVRTC at
    their first call (a CPU scalar operand and a tensor one are two kernels); their results are the CPU's."""
    proc = run_torch(jit_server, ["-c", JITERATOR])
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, f"exit {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
    results = json.loads(lines[-1])
    assert set(results) == {"create_jit_fn", "chebyshev_scalar_n", "chebyshev_tensor_n"}, results
    assert all(v <= 1e-4 for v in results.values()), results
    assert not UNKNOWN_TABLE.search(proc.stderr), proc.stderr[-3000:]


def test_runtime_kernels_built_by_nvrtc_and_nvjitlink_load_and_run(jit_server: Server) -> None:
    """A CuPy-style kernel three ways: NVRTC's cubin, NVRTC's PTX (the server's driver, or the sim, takes PTX too),
    and NVRTC's LTO-IR linked by nvJitLink; each loaded with cuModuleLoadData and launched through the driver API."""
    python = torch_python()  # the venv whose NVIDIA wheels hold libnvrtc.so.13 and libnvJitLink.so.13
    lib_dir = next(python.parent.parent.glob("lib/python3*/site-packages/nvidia/cu13/lib"))
    proc = run_torch(jit_server, [str(NVRTC), str(lib_dir), *MODES])
    assert proc.returncode == 0, f"exit {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
    results = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert [r["mode"] for r in results] == list(MODES), proc.stdout
    assert all(r["image_bytes"] > 0 and r["max_error"] <= 1e-5 for r in results), results
    assert not UNKNOWN_TABLE.search(proc.stderr), proc.stderr[-3000:]
