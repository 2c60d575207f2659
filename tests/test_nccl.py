"""NCCL through xpuremote, which does not serve it yet: two ranks of torch.distributed's "nccl" backend on a
two-device sim server fail with an error that says so, and neither dies with a signal.

NCCL calls NVML functions through pointers it got from dlsym without checking them: one that xpuremote's
libnvidia-ml.so.1 lacked (nvmlDeviceGetCudaComputeCapability) was a call to address 0, a segmentation
fault in both ranks. The stock PyTorch wheel carries NCCL (tests/test_torch.py says how it is found).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, Server, start_server
from test_torch import torch_python

pytestmark = pytest.mark.sim_only(reason="two sim devices (XPU_SIM_DEVICES)")

PROGRAM = ROOT / "tests" / "programs" / "nccl_two_ranks.py"


@pytest.fixture(scope="module")
def two_device_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("nccl-server"), backend="sim", env={"XPU_SIM_DEVICES": "2"})
    yield srv
    srv.stop()


def nccl_in(python: Path) -> None:
    probe = subprocess.run([str(python), "-c", "import torch.cuda.nccl as n; print(n.version())"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"{python}'s torch has no NCCL: {probe.stderr.strip()[-300:]}")


def test_two_nccl_ranks_fail_clearly_without_a_signal(two_device_server: Server, tmp_path: Path) -> None:
    python = torch_python()
    nccl_in(python)
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    ranks = [subprocess.Popen([str(python), "-m", "xpuremote.interpose.run", "--server", two_device_server.address,
                               "--", str(python), str(PROGRAM), str(rank), str(tmp_path / "store")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    outputs = [rank.communicate(timeout=240) for rank in ranks]
    for rank, (proc, (_out, err)) in enumerate(zip(ranks, outputs)):
        assert proc.returncode >= 0, f"rank {rank} died with {signal.Signals(-proc.returncode).name}:\n{err[-3000:]}"
        assert proc.returncode not in (0, 128 + signal.SIGSEGV), f"rank {rank}: exit {proc.returncode}\n{err[-3000:]}"
        assert "NCCL is not supported through xpuremote yet" in err, err[-3000:]
        assert "RuntimeError" in err and "NCCL" in err.split("RuntimeError", 1)[1], err[-3000:]
