"""CUDA_VISIBLE_DEVICES selects and renumbers the server's devices on the client, by index or
by UUID prefix, and stops at the first entry that names no device, as CUDA does."""

from __future__ import annotations

import sys

import pytest
from conftest import start_server

# Three devices (XPU_SIM_DEVICES=3), told apart by the sim's names and UUIDs.
pytestmark = pytest.mark.sim_only(reason="three sim devices (XPU_SIM_DEVICES), their names and UUIDs")

SCRIPT = """
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
rc = cu.cuInit(0)
if rc:
    raise SystemExit(f"cuInit {rc}")
n = ctypes.c_int()
cu.cuDeviceGetCount(ctypes.byref(n))
names = []
for i in range(n.value):
    buf = ctypes.create_string_buffer(64)
    assert cu.cuDeviceGetName(buf, 64, i) == 0
    names.append(buf.value.decode().split()[3])  # "xpuremote sim device N (sm_90)"
print(",".join(names))
"""


@pytest.fixture(scope="module")
def three_devices(tmp_path_factory: pytest.TempPathFactory):
    server = start_server(tmp_path_factory.mktemp("visible"), env={"XPU_SIM_DEVICES": "3"})
    yield server
    server.stop()


@pytest.mark.parametrize("visible, expected", [
    (None, "0,1,2"),
    ("2,0", "2,0"),
    ("1", "1"),
    ("0,7,1", "0"),  # stops at the first index that names no device
    ("GPU-5349d0d002", "2"),  # a UUID prefix
])
def test_visible_devices(three_devices, run_on, visible: str | None, expected: str) -> None:
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    result = run_on([sys.executable, "-c", SCRIPT], address=three_devices.address, **env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


def test_no_visible_device_fails_init(three_devices, run_on) -> None:
    result = run_on([sys.executable, "-c", SCRIPT], address=three_devices.address, CUDA_VISIBLE_DEVICES="")
    assert "cuInit 100" in result.stderr  # CUDA_ERROR_NO_DEVICE
