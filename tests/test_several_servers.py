"""Several servers, one client (docs/distributed.md, "Several servers, one client"): XPU_SERVER names two sim
servers of two devices each, and a program sees four. Calls go to the server of the context, stream, event or
memory they name; copies between the two servers' devices are staged through the client; a stream of one waits
for the other's event; peer access between them is refused with the reason. Shown with the driver API (ctypes),
NVML, stock PyTorch, and torch.distributed's NCCL backend with two ranks on each server under one torchrun.

Under XPU_TEST_BACKEND=cuda (the GPU check) the driver API test runs on two cuda servers of one machine, each
with its GPUs: what the drivers' addresses do in two worker processes is what it shows there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BACKEND, ROOT, SIM_KERNELS, Server, free_port, shim_env, start_server
from test_nccl import check_ranks, nccl_calls, nccl_in
from test_torch import torch_python

SIM_ONLY = pytest.mark.sim_only(reason="two sim servers of two devices each (XPU_SIM_DEVICES), the sim's collectives")
PROGRAMS = ROOT / "tests" / "programs"


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    tmp = tmp_path_factory.mktemp("several")
    kernels = f"{SIM_KERNELS},{ROOT / 'tests' / 'torch_sim_kernels.py'}"
    first, second = (start_server(tmp, env={"XPU_SIM_DEVICES": "2", "XPU_SIM_KERNELS": kernels}) for _ in range(2))
    yield first, second
    first.stop()
    second.stop()


def run(shim: Path, servers: str, program: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(program, env=shim_env(shim, servers, **env), capture_output=True, text=True, timeout=120)


def listed(*servers: Server) -> str:
    return ",".join(s.address for s in servers)


@pytest.mark.parametrize("blocking", ["0", "1"])
def test_driver_api_across_two_servers(two_servers: tuple[Server, Server], shim: Path, blocking: str) -> None:
    """Also with CUDA_LAUNCH_BLOCKING=1, where an asynchronous call sent to the wrong server fails at once."""
    first, second = two_servers
    result = run(shim, listed(first, second), [sys.executable, str(PROGRAMS / "several_servers_check.py")],
                 CUDA_LAUNCH_BLOCKING=blocking)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    last = seen["count"] - 1
    assert seen["count"] == seen["nvml_count"] >= 2 and seen["nvml_memory"]
    if BACKEND == "sim":  # (two cuda servers of one machine show its GPUs twice)
        assert seen["count"] == 4 and len(set(seen["uuids"])) == 4, "two sim servers are two machines: UUIDs differ"
    assert seen["dtod"] and seen["by_address"] and seen["on_streams"]
    assert seen["can_access_peer"] == 0
    assert seen["enable_peer_access"] == 217  # CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, and why:
    assert f"devices 0 and {last} are on different servers" in result.stderr
    assert second.address in result.stderr


@SIM_ONLY
def test_cuda_visible_devices_select_from_both(two_servers: tuple[Server, Server], shim: Path) -> None:
    script = ("import ctypes; cu = ctypes.CDLL('libcuda.so.1'); assert cu.cuInit(0) == 0\n"
              "n = ctypes.c_int(); cu.cuDeviceGetCount(ctypes.byref(n)); u = ctypes.create_string_buffer(16)\n"
              "import json; print(json.dumps([cu.cuDeviceGetUuid(u, i) or u.raw.hex() for i in range(n.value)]))")
    every = run(shim, listed(*two_servers), [sys.executable, "-c", script])
    assert every.returncode == 0, every.stderr[-3000:]
    uuids = json.loads(every.stdout)
    chosen = run(shim, listed(*two_servers), [sys.executable, "-c", script], CUDA_VISIBLE_DEVICES="3,0")
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    assert json.loads(chosen.stdout) == [uuids[3], uuids[0]]
    by_uuid = run(shim, listed(*two_servers), [sys.executable, "-c", script], CUDA_VISIBLE_DEVICES=f"GPU-{uuids[2]}")
    assert json.loads(by_uuid.stdout) == [uuids[2]]


@SIM_ONLY
def test_a_server_that_does_not_answer_is_named(two_servers: tuple[Server, Server], shim: Path) -> None:
    absent = f"tcp://127.0.0.1:{free_port()}"
    script = "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))"
    result = run(shim, f"{two_servers[0].address},{absent}", [sys.executable, "-c", script],
                 XPU_CONNECT_TIMEOUT_S="1")
    assert result.stdout.strip() != "0"
    assert f"no xpuremote server answered at {absent}" in result.stderr
    twice = run(shim, listed(two_servers[0], two_servers[0]), [sys.executable, "-c", script])
    assert twice.stdout.strip() != "0" and "XPU_SERVER names a server twice" in twice.stderr


@SIM_ONLY
def test_a_trace_is_not_recorded_across_servers_and_the_run_says_why(two_servers: tuple[Server, Server], shim: Path,
                                                                     tmp_path: Path) -> None:
    """A trace holds one session's messages, numbered by it, which xpu-perf models: with two servers the run goes
    on untraced, saying so, rather than writing two sessions' messages into one file."""
    script = ("import ctypes; cu = ctypes.CDLL('libcuda.so.1'); assert cu.cuInit(0) == 0\n"
              "for i in (0, 3):\n"
              "    d, c, p = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()\n"
              "    assert cu.cuDeviceGet(ctypes.byref(d), i) == 0\n"
              "    assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), d) == 0 and cu.cuCtxSetCurrent(c) == 0\n"
              "    assert cu.cuMemAlloc_v2(ctypes.byref(p), 64) == 0 and cu.cuMemsetD8_v2(p, 1, 64) == 0\n"
              "    assert cu.cuCtxSynchronize() == 0\n"
              "print('done')")
    path = tmp_path / "both.trace"
    result = run(shim, listed(*two_servers), [sys.executable, "-c", script], XPU_TRACE=str(path))
    assert result.returncode == 0 and result.stdout.strip() == "done", result.stderr[-3000:]
    assert "XPU_TRACE: no trace is recorded: this run uses 2 servers" in result.stderr, result.stderr[-3000:]
    assert not path.exists()


@SIM_ONLY
def test_torch_across_two_servers(two_servers: tuple[Server, Server]) -> None:
    python = torch_python()
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    result = subprocess.run([str(python), "-m", "xpuremote.interpose.run", "--server", listed(*two_servers), "--",
                             str(python), str(PROGRAMS / "torch_several_servers.py")],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"count": 4, "peer": False, "moved": True, "matmul": True, "waited": 3072.0}


@SIM_ONLY
def test_nccl_two_ranks_on_each_server(two_servers: tuple[Server, Server], tmp_path: Path) -> None:
    """torchrun --nproc-per-node 4 under one xpu-run naming both servers: ranks 0 and 1 on the first server's
    devices, 2 and 3 on the second's (LOCAL_RANK indexes the one list); every collective and the DDP step agree
    across the ranks and with one process, and each server ran its two ranks' NCCL calls."""
    python = torch_python()
    nccl_in(python)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    torchrun = [str(python), "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    result = subprocess.run([str(python), "-m", "xpuremote.interpose.run", "--server", listed(*two_servers), "--",
                             *torchrun, str(PROGRAMS / "nccl_ranks.py"), "env", str(tmp_path)],
                            env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    check_ranks([json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)])
    for server in two_servers:  # two sessions of each server made NCCL calls, at least 17 a rank
        counts = [n for n in nccl_calls(server, 2) if n]
        assert len(counts) >= 2 and all(n >= 17 for n in counts[-2:]), counts


@SIM_ONLY
def test_xpu_smi_numbers_both_servers_devices_as_one_list(two_servers: tuple[Server, Server]) -> None:
    smi = Path(sys.executable).parent / "xpu-smi"
    result = subprocess.run([str(smi), "--server", listed(*two_servers), "--json"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    snaps = json.loads(result.stdout)["servers"]
    assert [s["server"] for s in snaps] == [s.address for s in two_servers]
    assert [d["index"] for s in snaps for d in s["devices"]] == [0, 1, 2, 3]
