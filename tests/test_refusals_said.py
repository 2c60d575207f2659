"""A server that cannot be reached, or that refuses this client, is said on stderr once, whatever asked first.

NVIDIA's runtime asks the driver's version (cuDriverGetVersion) before cuInit and gives up when that fails:
PyTorch then says only "Found no NVIDIA driver", a program gets cudaErrorInsufficientDriver, and xpuremote
used to say why only from cuInit, which they never reach. Here a program built with nvcc against NVIDIA's
libcudart 12 and 13 wheels, and PyTorch (NVML first, then the runtime), run under `xpu-run --server`
against: nothing listening at the address, a CURVE server and no key, a CURVE server and a key it does not
allow. Their stderr holds one xpuremote line, with the address, the reason and its fix. A math library, NVML
or the driver's version asked first says it too; a working session says nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import ROOT, Build, Server, free_port, shim_env
from pyclient import make_keys
from test_torch import torch_python
from toolchain import cudart_path

PROGRAM = ROOT / "tests" / "programs" / "runtime_start.cpp"
KEY_FIX = "fix: give this client a key the server allows: XPU_CLIENT_KEY="
TIMEOUT = {"XPU_CONNECT_TIMEOUT_S": "1"}  # nothing listening: each try waits this long


@dataclass
class Case:
    address: str
    env: dict[str, str]
    reason: str
    fix: str


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    made = make_keys(folder, "server", "alice", "mallory")
    (folder / "allowed").mkdir()
    shutil.copy(folder / "alice.key", folder / "allowed")
    return {**made, "allowed": folder / "allowed", "server.pub": folder / "server.key"}


def make_case(name: str, keys: dict[str, Path], curve: Server) -> Case:
    if name == "no server":
        address = f"tcp://127.0.0.1:{free_port()}"  # closed: nothing listens there
        return Case(address, {}, f"no xpuremote server answered at {address} within 1 s",
                    "fix: start xpu-server there, or name another with --server / XPU_SERVER")
    refused = f"the server at {curve.address} refused the connection: "
    if name == "no key":
        return Case(curve.address, {}, refused + "the server requires CURVE keys and this client has none", KEY_FIX)
    return Case(curve.address, {"XPU_CLIENT_KEY": str(keys["mallory"]), "XPU_SERVER_KEY": str(keys["server.pub"])},
                refused + "the server does not accept this client's key", KEY_FIX)


@pytest.fixture(params=["no server", "no key", "unknown key"])
def case(request: pytest.FixtureRequest, keys: dict[str, Path], curve_server: Server) -> Case:
    return make_case(request.param, keys, curve_server)


@pytest.fixture(scope="module")
def programs(build: Build) -> dict[int, Path]:
    """runtime_start.cpp linked against NVIDIA's libcudart of each major (the wheels)."""
    built = {}
    for major in (12, 13):
        lib = cudart_path(major)
        if lib is None:
            pytest.skip(f"the CUDA {major} runtime wheel is not installed")
        folder = str(Path(lib).parent)
        built[major] = build(f"runtime_start_{major}", ["-x", "c++", "-cudart", "none", str(PROGRAM), f"-L{folder}",
                                                        f"-l:libcudart.so.{major}", "-Xlinker", f"-rpath,{folder}"])
    return built


def xpu_run(python: str, address: str, command: list[str], **env: str) -> subprocess.CompletedProcess:
    """`command` under `python`'s xpu-run, as a user runs it, with only the keys `env` names."""
    full = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "XPU_CLIENT_KEY", "XPU_SERVER_KEY")}
    return subprocess.run([python, "-m", "xpuremote.interpose.run", "--server", address, "--", *command],
                          env={**full, **TIMEOUT, **env}, capture_output=True, text=True, timeout=120)


def said(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("xpuremote:")]


def assert_said_once(case: Case, proc: subprocess.CompletedProcess) -> None:
    """One xpuremote line, an error naming the address, the reason and the fix."""
    lines = said(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("xpuremote: ERROR"), proc.stderr[-3000:]
    assert case.reason in lines[0] and case.fix in lines[0], lines[0]


@pytest.mark.parametrize("major", [12, 13])
def test_a_runtime_program_is_told_why(case: Case, programs: dict[int, Path], major: int) -> None:
    proc = xpu_run(sys.executable, case.address, [str(programs[major])], **case.env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cudaGetDeviceCount cudaSuccess" not in proc.stdout and "cudaMalloc cuda" in proc.stdout, proc.stdout
    assert_said_once(case, proc)


TORCH_BODY = """
import torch
print("available", torch.cuda.is_available(), flush=True)
try:
    torch.zeros(1, device="cuda")
except RuntimeError as exc:
    print("zeros failed:", str(exc).splitlines()[0], flush=True)
"""


@pytest.fixture(scope="module")
def torch() -> str:
    return str(torch_python())


def test_pytorch_is_told_why(case: Case, torch: str) -> None:
    """NVML asks first (PYTORCH_NVML_BASED_CUDA_CHECK), then the runtime, twice."""
    proc = xpu_run(torch, case.address, [torch, "-c", TORCH_BODY], PYTORCH_NVML_BASED_CUDA_CHECK="1", **case.env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "available False" in proc.stdout and "zeros failed" in proc.stdout, proc.stdout
    assert_said_once(case, proc)


FIRSTS = {"cublasCreate": 'ctypes.CDLL("libcublas.so.13").cublasCreate_v2(ctypes.byref(handle))',
          "cudnnCreate": 'ctypes.CDLL("libcudnn.so.9").cudnnCreate(ctypes.byref(handle))',
          "nvmlInit": 'ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2()',
          "cuDriverGetVersion": 'ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))',
          "cuInit": 'ctypes.CDLL("libcuda.so.1").cuInit(0)'}


@pytest.mark.parametrize("first", list(FIRSTS))
def test_whichever_library_asks_first_says_it(first: str, keys: dict[str, Path], curve_server: Server,
                                              shim: Path) -> None:
    """Each of the others asks again after it, and fails as it must, with nothing more said."""
    case = make_case("no key", keys, curve_server)
    order = [first, *(name for name in FIRSTS if name != first)]
    body = ("import ctypes\nhandle, version = ctypes.c_void_p(), ctypes.c_int()\n"
            + "".join(f"print({name!r}, {FIRSTS[name]}, flush=True)\n" for name in order))
    env = shim_env(shim, case.address, **TIMEOUT)
    for name in ("XPU_CLIENT_KEY", "XPU_SERVER_KEY"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", body], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answers = dict(line.split() for line in proc.stdout.splitlines())
    # NOT_INITIALIZED from the libraries, NVML's DRIVER_NOT_LOADED, the driver's NO_DEVICE
    assert answers == {"cublasCreate": "1", "cudnnCreate": "1001", "nvmlInit": "9", "cuDriverGetVersion": "100",
                       "cuInit": "100"}, proc.stdout
    assert_said_once(case, proc)


def test_a_working_session_says_nothing(keys: dict[str, Path], curve_server: Server, programs: dict[int, Path]) -> None:
    proc = xpu_run(sys.executable, curve_server.address, [str(programs[13])], XPU_CLIENT_KEY=str(keys["alice"]),
                   XPU_SERVER_KEY=str(keys["server.pub"]))
    assert proc.returncode == 0 and "cudaGetDeviceCount cudaSuccess 1" in proc.stdout, proc.stdout + proc.stderr
    assert "cudaMalloc cudaSuccess" in proc.stdout, proc.stdout
    assert not said(proc.stderr), proc.stderr
