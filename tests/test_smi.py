"""xpu-smi against a real two-device sim server, while a CUDA program holds memory on device 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Server, shim_env
from toolchain import cudart_path

# Two devices (XPU_SIM_DEVICES=2), memory held on the second, backend "sim" in the listing.
pytestmark = pytest.mark.sim_only(reason="two sim devices (XPU_SIM_DEVICES)")

MIB = 1 << 20
HOLDER = """
import ctypes, sys
rt = ctypes.CDLL(sys.argv[1])
assert rt.cudaSetDevice(1) == 0
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(int(sys.argv[2]))) == 0
print("ready", flush=True)
sys.stdin.readline()
"""


def xpu_smi(*args: str, **env: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "xpu-smi"
    return subprocess.run([str(script), *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=60)


def listing(server: Server) -> dict[str, Any]:
    proc = xpu_smi("--server", server.address, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def used(snap: dict[str, Any]) -> list[int]:
    return [d["memory_used"] for d in snap["devices"]]


def test_lists_both_devices(two_devices: Server) -> None:
    snap = listing(two_devices)
    assert snap["backend"] == "sim"
    assert [d["index"] for d in snap["devices"]] == [0, 1]
    assert len({d["uuid"] for d in snap["devices"]}) == 2
    for d in snap["devices"]:
        assert d["memory_total"] > 0 and d["memory_used"] + d["memory_free"] == d["memory_total"]
        assert d["compute_capability"] == "9.0"
    text = xpu_smi(XPU_SERVER=two_devices.address)  # the server from the environment this time
    assert text.returncode == 0, text.stderr
    for d in snap["devices"]:
        assert d["name"] in text.stdout and f"{d['memory_total'] // MIB}MiB" in text.stdout


def test_memory_used_follows_a_clients_allocation(two_devices: Server, shim: Path) -> None:
    runtime = cudart_path(13)
    if runtime is None:
        pytest.skip("the CUDA 13 runtime wheel is not installed")
    size = 48 * MIB + 123
    before = listing(two_devices)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, runtime, str(size)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=shim_env(shim, two_devices.address))
    try:
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()
        during = listing(two_devices)
    finally:
        holder.communicate("\n", timeout=60)
    assert holder.returncode == 0
    assert used(during)[0] == used(before)[0]  # device 0 untouched
    assert used(during)[1] - used(before)[1] >= size
    held = {pid: nbytes for pid, nbytes in during["devices"][1]["processes"]}
    assert any(nbytes >= size for nbytes in held.values()), held
    deadline = time.monotonic() + 20  # the worker releases everything when its client has gone
    while used(after := listing(two_devices)) != used(before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert used(after) == used(before)


def test_unreachable_server_is_an_error() -> None:
    proc = xpu_smi("--server", "tcp://127.0.0.1:9", "--timeout", "0.5")
    assert proc.returncode == 1 and "no xpuremote server answered" in proc.stderr
