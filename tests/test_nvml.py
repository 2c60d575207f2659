"""xpuremote's libnvidia-ml.so.1 on a two-device sim server: what PyTorch's NVML calls get.

The program reads it with ctypes and with the cuda backend's NVML reader (the code that reads
NVIDIA's NVML on a GPU server), so that reader is exercised here too, against a stand-in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Server, shim_env

from xpuremote.client.connection import Connection
from xpuremote.interpose.build import NVML_NAME
from xpuremote.protocol import nvml

# Two devices (XPU_SIM_DEVICES=2), the sim's PCI addresses and device 0 idle: tests/test_torch.py
# covers the NVML that PyTorch reads on a GPU server.
pytestmark = pytest.mark.sim_only(reason="two sim devices (XPU_SIM_DEVICES) at the sim's PCI addresses")

SCRIPT = ROOT / "tests" / "programs" / "nvml_check.py"
SIZE = 24 * (1 << 20) + 7


@pytest.fixture(scope="module")
def result(two_devices: Server, shim: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(shim.parent / NVML_NAME), str(SIZE)],
                          env=shim_env(shim, two_devices.address), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_devices_are_the_servers(result: dict[str, Any], two_devices: Server) -> None:
    conn = Connection(two_devices.address)
    try:
        devices = conn.inventory["devices"]
    finally:
        conn.close()
    assert result["count_before_init"] == nvml.UNINITIALIZED
    assert result["init"] == result["count_status"] == nvml.SUCCESS
    assert result["count"] == len(devices) == 2
    assert result["uuids"] == [nvml.uuid_text(bytes(d["uuid"])) for d in devices]
    assert result["by_uuid"] == [0, 1]
    assert result["by_pci"] == [True, True]
    assert result["bad_index"] == nvml.INVALID_ARGUMENT
    assert result["error_string_7"] == "Insufficient Size"
    assert result["shutdown"] == nvml.SUCCESS


def test_memory_and_processes_follow_the_allocation(result: dict[str, Any]) -> None:
    dev0, dev1 = result["status"]
    assert dev0["memory_used"] == 0 and dev0["processes"] == []
    assert dev1["memory_used"] >= SIZE
    assert dev1["memory_used"] + dev1["memory_free"] == dev1["memory_total"]
    (pid, held), = dev1["processes"]  # one session holds memory: this program's worker
    assert held == dev1["memory_used"] and pid != result["pid"]  # NVML reports the server's processes
    for status in (dev0, dev1):
        assert status["clock_sm_mhz"] > 0 and status["temperature_c"] is not None
