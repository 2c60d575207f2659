"""Shared fixtures: a real xpu-server on loopback, the shim, and a way to run programs on it."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SIM_KERNELS = ",".join(str(ROOT / p) for p in ("examples/sim_kernels.py", "tests/sim_kernels.py"))
TORCH_SIM_KERNELS = f"{SIM_KERNELS},{ROOT / 'tests' / 'torch_sim_kernels.py'}"  # and PyTorch's, by name
# The backend the tests' servers run: the sim (no GPU needed), or `cuda` on a machine with a GPU,
# where tests marked sim_only are skipped.
BACKENDS = ("sim", "cuda")
BACKEND = os.environ.get("XPU_TEST_BACKEND") or "sim"
# Part of device 0's name: the sim's, or NVIDIA's (the driver names each GPU it supports "NVIDIA ...").
DEVICE_NAME = {"sim": "xpuremote sim device 0", "cuda": "NVIDIA"}.get(BACKEND, "")


def pytest_configure(config: pytest.Config) -> None:
    if BACKEND not in BACKENDS:
        raise pytest.UsageError(f"XPU_TEST_BACKEND={BACKEND!r}: the tests run against one of {', '.join(BACKENDS)}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """XPU_FAILURE_LOG names a file that each failure's report is added to as it happens: pytest writes
    them only at the end, and a run cut short at its time limit (the GPU check's suite) would not say why."""
    path = os.environ.get("XPU_FAILURE_LOG")
    if path and report.failed:
        with open(path, "a") as log:
            log.write(f"{FAILURE_HEAD}{report.nodeid} ({report.when})\n{report.longreprtext}\n")


FAILURE_HEAD = "===== failed: "


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under another backend than the sim, tests marked sim_only(reason=...) are skipped, saying why.
    XPU_TEST_FIRST names test files (comma-separated) to run first, in its order, the rest after as they were:
    a run cut at its time limit (the GPU check's suite) has run those that matter most."""
    first = {name.strip(): i for i, name in enumerate(os.environ.get("XPU_TEST_FIRST", "").split(",")) if name.strip()}
    if first:
        items.sort(key=lambda item: first.get(item.path.name, len(first)))  # a stable sort
    for item in items:
        marker = item.get_closest_marker("sim_only")
        if marker is None:
            continue
        if "reason" not in marker.kwargs:
            raise pytest.UsageError(f"{item.nodeid}: sim_only needs a reason=")
        if BACKEND != "sim":
            item.add_marker(pytest.mark.skip(reason=f"sim only: {marker.kwargs['reason']}"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    address: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_server(tmp: Path, backend: str = BACKEND, env: dict[str, str] | None = None, args: tuple[str, ...] = (),
                 address: str | None = None, timeout: float = 30) -> Server:
    """A real `xpu-server` on a free loopback port (or `address`); returns once it says `ready`.

    The sim's settings (XPU_SIM_*, the host kernels) go to a sim server only: another backend runs
    real kernels, so a test's sim settings leave it as it is."""
    address = address or f"tcp://127.0.0.1:{free_port()}"
    log_path = tmp / f"server-{address.rsplit(':', 1)[1]}-{time.monotonic_ns()}.log"
    full_env = {**os.environ, "XPU_SIM_KERNELS": SIM_KERNELS, "XPU_LOG": "INFO", **(env or {})}
    full_env.pop("LD_PRELOAD", None)
    if backend != "sim":
        full_env = {k: v for k, v in full_env.items() if not k.startswith("XPU_SIM_")}
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "xpuremote.server.daemon", "--listen", address,
                                 "--backend", backend, *args], stderr=log, env=full_env)
    deadline = time.monotonic() + timeout
    while "ready" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"xpu-server did not start:\n{log_path.read_text()}")
        time.sleep(0.05)
    return Server(address, proc, log_path)


@pytest.fixture(scope="session")
def shim() -> Path:
    from xpuremote.interpose.build import ensure_shim

    return ensure_shim()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A sim server of two devices, for one test module (the sim on a GPU too, which may have one)."""
    srv = start_server(tmp_path_factory.mktemp("two-devices"), backend="sim", env={"XPU_SIM_DEVICES": "2"})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def curve_server(keys: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with CURVE keys: its secret and the allowed clients' folder from the module's `keys` fixture."""
    srv = start_server(tmp_path_factory.mktemp("curve"), args=("--key", str(keys["server"]),
                                                                "--allowed-keys", str(keys["allowed"])))
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def chained(tmp_path_factory: pytest.TempPathFactory, shim: Path) -> Iterator[tuple[Server, Server]]:
    """(cuda, sim): a cuda-backend server whose libcuda and math libraries are xpuremote's own
    (stand-ins, named as such) talking to a sim server. The cuda backend's generic replay of every
    call shape, without a GPU; its tests are sim_only (on a GPU the other tests run it for real)."""
    cuda, sim = start_chain(tmp_path_factory.mktemp("chain"), shim)
    yield cuda, sim
    cuda.stop()
    sim.stop()


@pytest.fixture(scope="session")
def driver_env(tmp_path_factory: pytest.TempPathFactory, shim: Path) -> Iterator[dict[str, str]]:
    """The environment of a child that runs a cuda-backend session in process: on the sim, the stand-in
    libcuda (xpuremote's own shim, named as such) with a sim server behind it; on a GPU, NVIDIA's."""
    if BACKEND == "cuda":
        yield {}
        return
    sim = start_server(tmp_path_factory.mktemp("driver-env"), backend="sim", env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS})
    yield {"XPU_CUDA_LIBRARY": str(shim), "XPU_SERVER": sim.address}
    sim.stop()


def start_chain(tmp: Path, shim: Path, sim_env: dict[str, str] | None = None) -> tuple[Server, Server]:
    """(cuda, sim) as `chained` has them, for a test that needs its own (and its sim settings)."""
    from xpuremote.interpose.build import LIBRARY_NAMES

    sim = start_server(tmp, backend="sim", env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS, **(sim_env or {})})
    stand_ins = {f"XPU_{name.upper()}_LIBRARY": str(shim.parent / soname)
                 for name, soname in zip(("cublas", "cublasLt", "cudnn"), LIBRARY_NAMES)}
    cuda = start_server(tmp, backend="cuda", env={"XPU_CUDA_LIBRARY": str(shim), "XPU_SERVER": sim.address,
                                                  **stand_ins})
    return cuda, sim


def shim_env(shim: Path, address: str, **extra: str) -> dict[str, str]:
    """The environment xpu-run gives a program: the shim preloaded and first on the library path."""
    env = dict(os.environ)
    env["LD_PRELOAD"] = str(shim)
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(shim.parent), env.get("LD_LIBRARY_PATH")]))
    env["XPU_SERVER"] = address
    env.update(extra)
    return env


def with_and_without_lane(program: str, address: str, tmp: Path, shim: Path,
                          timeout: float = 60) -> dict[str, tuple[str, dict[str, tuple[int, int]]]]:
    """`program` (Python source) run under the shim with the lane and the answers in C (XPU_LANE=1) and without
    (0): for each, its output, the same in both, and the calls that reached the core (XPU_CALL_CPU)."""
    from xpuremote.client import call_cpu

    runs = {}
    for lane in ("1", "0"):
        table = tmp / f"cpu-{lane}.tsv"
        proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=timeout,
                              env=shim_env(shim, address, XPU_LANE=lane, XPU_CALL_CPU=str(table)))
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        runs[lane] = proc.stdout, call_cpu.read(table)
    assert runs["1"][0] == runs["0"][0], runs
    return runs


@dataclass
class LaneRuns:
    """with_and_without_lane on a server of its own: the program's last line (JSON) and its runs; for each run, in
    order (the lane's first), the calls of `library` the server ran and those of its lane records."""

    out: dict
    runs: dict[str, tuple[str, dict[str, tuple[int, int]]]]
    served: list[int]
    from_lane: list[int]


def lane_runs(program: str, tmp: Path, shim: Path, library: str) -> LaneRuns:
    srv = start_server(tmp)
    try:
        runs = with_and_without_lane(program, srv.address, tmp, shim)
    finally:
        srv.stop()
    log = srv.log()
    return LaneRuns(json.loads(runs["1"][0].splitlines()[-1]), runs,
                    [int(n) for n in re.findall(rf"library calls: .*?\b{library}=(\d+)", log)],
                    [int(n) for n in re.findall(r"\((\d+) from the fast lane", log)])


@pytest.fixture
def run_on(shim: Path, server: Server):
    """run_on([cmd...], **env) -> CompletedProcess of a program using the shared server."""

    def run(cmd: list[str], timeout: float = 120, address: str | None = None,
            **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=shim_env(shim, address or server.address, **env), capture_output=True,
                              text=True, timeout=timeout)

    return run


Build = Callable[[str, list[str]], Path]


@pytest.fixture(scope="session")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """build(output_name, nvcc_args) -> the output file, compiled once per session."""
    from toolchain import nvcc_path

    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc is not installed (pip install nvidia-cuda-nvcc)")
    if shutil.which("g++") is None:
        pytest.skip("nvcc needs a host C++ compiler (g++)")
    out_dir = tmp_path_factory.mktemp("nvcc")
    done: dict[str, Path] = {}

    def compile_(name: str, args: list[str]) -> Path:
        if name not in done:
            out = out_dir / name
            proc = subprocess.run([nvcc, *args, "-o", str(out)], capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, f"nvcc {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}"
            done[name] = out
        return done[name]

    return compile_


def assert_all_ok(result: subprocess.CompletedProcess, at_least: int, all_forwarded: bool = True) -> None:
    """A check program (tests/programs/checks.py) passed every check, ran at least `at_least` of them, and
    left no traceback or internal error on stderr (nor, if `all_forwarded`, a call xpuremote said it does
    not forward)."""
    failures = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert result.returncode == 0 and not failures and "ALL OK" in result.stdout, (
        "\n".join(failures) or result.stdout[-4000:]) + "\n--- stderr ---\n" + result.stderr[-4000:]
    checks = sum(line.startswith("ok ") for line in result.stdout.splitlines())
    assert checks >= at_least, f"only {checks} checks ran"
    unwanted = "Traceback|internal error" + ("|not supported by xpuremote" if all_forwarded else "")
    assert not re.search(unwanted, result.stderr), result.stderr[-4000:]
