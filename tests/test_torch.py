"""The stock PyTorch CUDA wheel from the package index, unmodified, through xpu-run on a server (the sim,
or a GPU's under XPU_TEST_BACKEND=cuda).

The wheel lives in a venv of its own (`make torch`: about 2.8 GB downloaded, a minute to
install); XPU_TORCH_PYTHON names another interpreter that has it. The program
(tests/programs/torch_check.py) runs under that interpreter's own `xpu-run`, as a user would,
with PYTORCH_NVML_BASED_CUDA_CHECK=1 so that torch.cuda also counts devices through NVML.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKEND, ROOT, SIM_KERNELS, Server, start_server

from xpuremote.client.connection import Connection
from xpuremote.protocol.nvml import uuid_text

SCRIPT = ROOT / "tests" / "programs" / "torch_check.py"
MIB = 1 << 20


def torch_python() -> Path:
    python = Path(os.environ.get("XPU_TORCH_PYTHON") or ROOT / ".venv-torch" / "bin" / "python")
    if not python.exists():
        pytest.skip(f"no PyTorch interpreter at {python}: run `make torch` (the stock CUDA wheel, ~2.8 GB) "
                    "or set XPU_TORCH_PYTHON")
    probe = subprocess.run([str(python), "-c", "import torch, xpuremote.interpose.run; print(torch.version.cuda)"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0 or probe.stdout.strip() in ("", "None"):
        pytest.skip(f"{python} has no CUDA build of torch with xpuremote: {probe.stderr.strip()[-300:]}")
    return python


@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    kernels = f"{SIM_KERNELS},{ROOT / 'tests' / 'torch_sim_kernels.py'}"  # private: no other sessions' memory
    srv = start_server(tmp_path_factory.mktemp("torch-server"), env={"XPU_SIM_KERNELS": kernels})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def two_device_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("torch-server-2"), env={"XPU_SIM_DEVICES": "2"})
    yield srv
    srv.stop()


def run_torch(server: Server, args: list[str], **env: str) -> subprocess.CompletedProcess:
    python = torch_python()
    full_env = {**os.environ, **env}
    full_env.pop("LD_PRELOAD", None)
    cmd = [str(python), "-m", "xpuremote.interpose.run", "--server", server.address, "--", str(python), *args]
    return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def inventory(torch_server: Server) -> dict[str, Any]:
    conn = Connection(torch_server.address, 10.0, 50.0)
    try:
        return conn.inventory
    finally:
        conn.close()


@pytest.fixture(scope="module")
def result(torch_server: Server) -> dict[str, Any]:
    proc = run_torch(torch_server, [str(SCRIPT)], PYTORCH_NVML_BASED_CUDA_CHECK="1")
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode})\nstderr:\n{proc.stderr[-4000:]}"
    found = json.loads(lines[-1])
    # a check that failed reports its error in its own section, for its own test to show
    assert proc.returncode == 0, f"{json.dumps(found, indent=1)}\nstderr:\n{proc.stderr[-4000:]}"
    found["stderr"] = proc.stderr
    return found


def test_available_with_the_servers_devices(result: dict[str, Any], inventory: dict[str, Any]) -> None:
    assert result["cuda"] and result["cuda"].split(".")[0] in ("12", "13"), result["cuda"]
    assert result["available"] is True
    assert result["count"] == len(inventory["devices"]) == result["nvml"]["driver_device_count"]


def test_device_properties_are_the_servers(result: dict[str, Any], inventory: dict[str, Any]) -> None:
    device = inventory["devices"][0]
    props = result["properties"]
    assert props["name"] == device["name"]
    assert props["total_memory"] == device["total_mem"]
    assert (props["major"], props["minor"]) == (device["sm"] // 10, device["sm"] % 10)
    assert props["capability"] == [device["sm"] // 10, device["sm"] % 10]
    assert props["multi_processor_count"] > 0


def test_host_device_host_round_trips_are_bit_exact(result: dict[str, Any]) -> None:
    assert result["round_trips"] == {"1": True, "1000": True, str(3 * MIB + 5): True, "int64": True}


def test_empty_on_device_and_device_to_device_copy(result: dict[str, Any]) -> None:
    r = result["copy"]
    assert r["empty_device"] == "cuda:0" and r["empty_shape"] == [64, 1024] and r["empty_ptr"] != 0
    assert r["distinct"] and r["copy_equal"]


def test_zeros_is_a_memset_and_fills_launch_a_kernel(result: dict[str, Any]) -> None:
    assert result["fills"] == {"zeros": True, "ones": True, "full": True, "fill_int64": True}


def test_no_driver_call_went_unanswered(result: dict[str, Any]) -> None:
    """Every driver call and private-table slot the wheel made on these paths is implemented."""
    assert "not supported by xpuremote" not in result["stderr"]
    assert "does not implement" not in result["stderr"]
    assert "failed" not in result["stderr"], result["stderr"][-2000:]


def test_pinned_memory_and_non_blocking_copies(result: dict[str, Any]) -> None:
    assert result["pinned"] == {"is_pinned": True, "equal": True}


def test_streams_and_events(result: dict[str, Any]) -> None:
    r = result["streams"]
    assert r["equal"] and r["event_done"] and r["stream_done"] and r["side_is_not_default"]
    assert r["elapsed_ms"] >= 0


def test_threads_and_dataloader_pin_memory(result: dict[str, Any]) -> None:
    assert result["threads"] == {"failures": [], "alive": 0, "loader_equal": True, "loader_pinned": True}


def test_memory_statistics_agree_with_the_server(result: dict[str, Any], inventory: dict[str, Any]) -> None:
    m = result["memory"]
    assert m["total"] == inventory["devices"][0]["total_mem"]
    held = m["held"]
    assert held["allocated"] == m["size"]  # the caching allocator's own count
    assert m["size"] <= held["reserved"] <= held["mem_get_info_used"]
    # the driver's free memory and NVML's used memory are both the server's, device-wide
    assert held["nvml_used"] == held["mem_get_info_used"] == m["total"] - m["free_holding"]
    assert m["free_before"] - m["free_holding"] >= m["size"]
    assert m["free_after"] == m["free_before"]  # empty_cache gave the block back to the server
    assert m["allocated_after"] == 0


def test_nvml_queries_of_torch_cuda(result: dict[str, Any], inventory: dict[str, Any]) -> None:
    n = result["nvml"]
    for key in ("utilization", "memory_usage", "temperature", "power_draw", "clock_rate"):
        assert isinstance(n[key], int) and n[key] >= 0, key
    assert n["clock_rate"] > 0
    assert n["uuids"] == [uuid_text(bytes(d["uuid"])) for d in inventory["devices"]]
    # the session's worker holds the 4 MiB block (and whatever else the allocator keeps)
    assert "GPU:0" in n["processes"] and "process" in n["processes"], n["processes"]


def test_cuda_graph_capture_and_replay(result: dict[str, Any]) -> None:
    """torch.cuda.CUDAGraph: the capture happens on the server, runs nothing, and replays with new inputs."""
    assert result["cuda_graph"] == {"capturing_inside": True, "capturing_after": False,
                                    "untouched_by_capture": True, "replays": [True, True]}


VISIBLE = """
import json, torch
block = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
free, total = torch.cuda.mem_get_info()
print(json.dumps({"count": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
                  "used": total - free, "nvml_used": torch.cuda.device_memory_used(0)}))
"""


@pytest.mark.sim_only(reason="two sim devices (XPU_SIM_DEVICES)")
def test_cuda_visible_devices_maps_nvml_by_uuid(two_device_server: Server) -> None:
    """CUDA_VISIBLE_DEVICES=1: torch's device 0 is the server's device 1, for CUDA and for NVML
    (which numbers all devices; torch maps between the two by UUID)."""
    proc = run_torch(two_device_server, ["-c", VISIBLE], CUDA_VISIBLE_DEVICES="1", PYTORCH_NVML_BASED_CUDA_CHECK="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    conn = Connection(two_device_server.address)
    try:
        names = [d["name"] for d in conn.inventory["devices"]]
    finally:
        conn.close()
    assert found["count"] == 1 and found["name"] == names[1]
    assert found["nvml_used"] == found["used"] >= 16 << 20


RANDOM = """
import torch
x = torch.randn(1000, device="cuda")  # asks for the stream's capture state, then launches a kernel
torch.cuda.synchronize()
print(x.shape[0], torch.cuda.is_current_stream_capturing(), x.mean().item(), x.std().item())
"""


def test_random_numbers_with_kernels_skipped(tmp_path: Path) -> None:
    """XPU_SIM_SKIP_KERNELS=1 lets a program run past kernels the sim cannot execute (garbage
    values), to find the driver calls it makes: torch.randn's are all answered. On a GPU the
    kernels run: the numbers are a standard normal sample."""
    srv = start_server(tmp_path, env={"XPU_SIM_SKIP_KERNELS": "1"})  # the sim's only
    try:
        proc = run_torch(srv, ["-c", RANDOM])
    finally:
        srv.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, capturing, mean, std = proc.stdout.split()
    assert [count, capturing] == ["1000", "False"], proc.stdout
    assert "not supported by xpuremote" not in proc.stderr, proc.stderr[-3000:]
    if BACKEND == "sim":
        assert "skipping kernel" in srv.log() and "normal" in srv.log()
    else:  # a mean 6 standard errors from 0, a deviation 20% from 1: not 1,000 draws of N(0, 1)
        assert abs(float(mean)) < 0.2 and abs(float(std) - 1) < 0.2, proc.stdout


COMPILE = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda().eval()
compiled = torch.compile(model, mode="reduce-overhead")  # Triton's kernels, replayed as a CUDA graph
x = torch.randn(32, 64, device="cuda")
with torch.inference_mode():
    for _ in range(4):
        y = compiled(x)
torch.cuda.synchronize()
print(tuple(y.shape))
"""


@pytest.mark.sim_only(reason="the sim skips the kernels (XPU_SIM_SKIP_KERNELS); on a GPU gpu-check's e2e runs them")
def test_torch_compile_loads_tritons_kernels_and_replays_a_graph(tmp_path: Path) -> None:
    """Triton finds the shim's libcuda, its launcher links against it, its modules load through the
    lazy upload, and reduce-overhead mode captures the step once and replays it."""
    srv = start_server(tmp_path, env={"XPU_SIM_SKIP_KERNELS": "1"})
    try:
        proc = run_torch(srv, ["-c", COMPILE], XPU_LOG="CALLS", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    finally:
        srv.stop()
    assert proc.returncode == 0 and proc.stdout.split() == ["(32,", "10)"], proc.stderr[-3000:]
    calls = [line.split()[2].split("(")[0] for line in proc.stderr.splitlines() if line.startswith("xpuremote: CALLS")]
    assert "cuStreamBeginCapture_v2" in calls and calls.count("cuGraphLaunch") >= 2, sorted(set(calls))
    assert re.search(r"skipping kernel triton_", srv.log()), srv.log()[-2000:]
    assert "not supported by xpuremote" not in proc.stderr
