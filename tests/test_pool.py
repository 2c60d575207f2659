"""The GPU pool on a Ray cluster this module starts (loopback only): three sim servers of two
devices each join it with `xpu-server --pool`, programs lease devices with `xpu-run --pool`
through Ray Client, and `xpu-smi --pool` lists it all."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import zmq.auth
from conftest import Server, free_port, start_server
from pyclient import make_keys

from xpuremote.server.pool import start_local_head

pytest.importorskip("ray", reason="the pool's tests need Ray (the test extra installs it)")
pytestmark = pytest.mark.sim_only(reason="three sim servers of two devices each (XPU_SIM_DEVICES)")

SERVERS, DEVICES = 3, 2
# Ray's health checks, fast enough that a server killed -9 leaves the pool within seconds
HEALTH_CHECKS = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "4"}
# The program a lease runs: which server and devices it was given, what the driver shows it
# (one device, the PCI bus of the leased one: the sim puts device i on bus 0x10 + i), then it
# holds the lease until its release file appears.
APP = """
import ctypes, os, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
count, dev, bus = ctypes.c_int(), ctypes.c_int(), ctypes.create_string_buffer(32)
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0 and cuda.cuDeviceGetPCIBusId(bus, 32, dev) == 0
print("leased", os.environ["XPU_SERVER"], os.environ["CUDA_VISIBLE_DEVICES"], count.value, bus.value.decode(),
      flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
"""


@dataclass
class Cluster:
    head: subprocess.Popen
    gcs: str  # what servers join with
    client: str  # what clients lease through (Ray Client)
    tmp: Path
    servers: list[Server] = field(default_factory=list)

    def join(self) -> Server:
        return start_server(self.tmp, "sim", env={"XPU_SIM_DEVICES": str(DEVICES)}, args=("--pool", self.gcs),
                            timeout=180)


@dataclass
class Client:
    process: subprocess.Popen
    release_file: Path
    out: Path
    err: Path

    def leased(self) -> tuple[str, str, int, str] | None:
        """(server, leased devices, devices the program sees, the PCI bus of its device 0)."""
        words = self.out.read_text().split()
        return (words[1], words[2], int(words[3]), words[4]) if words[:1] == ["leased"] else None

    def release(self) -> int:
        self.release_file.touch()
        return self.process.wait(60)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return value


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("pool")
    port, client_port = free_port(), free_port()
    head = start_local_head(port, client_port, tmp / "head.log", HEALTH_CHECKS)
    c = Cluster(head, f"127.0.0.1:{port}", f"ray://127.0.0.1:{client_port}", tmp)
    try:
        for _ in range(SERVERS):  # one after the other: Ray nodes starting at once on one host race for ports
            c.servers.append(c.join())
        yield c
    finally:
        for srv in c.servers:
            srv.stop()
        head.terminate()
        head.wait(60)


def client(cluster: Cluster, name: str, *args: str) -> Client:
    tmp = cluster.tmp
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "xpuremote.interpose.run", "--pool", cluster.client, *args, "--",
                                 sys.executable, "-c", APP, str(tmp / f"{name}.release")], stdout=o, stderr=e,
                                env={**os.environ, "XPU_LOG": "INFO"})  # xpu-run says when it holds the lease
    return Client(proc, tmp / f"{name}.release", out, err)


def smi(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "xpuremote.client.smi", "--pool", cluster.client, *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def pool_state(cluster: Cluster) -> dict[str, Any]:
    return json.loads(smi(cluster, "--json").stdout)


def holders(state: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {(s["endpoint"], str(d["index"])): int(d["holder"]["pid"])
            for s in state["servers"] for d in s["devices"] if d["holder"]}


def test_six_clients_get_six_devices_a_seventh_waits_and_a_killed_one_lets_go(cluster: Cluster) -> None:
    clients = [client(cluster, f"c{i}") for i in range(SERVERS * DEVICES)]
    grants = [wait_for(f"client {i}'s lease", c.leased) for i, c in enumerate(clients)]
    # each its own device, the only one it sees, and the driver's device 0 is the leased one
    assert len({(server, device) for server, device, _, _ in grants}) == 6, grants
    assert all(count == 1 and bus == f"0000:{0x10 + int(device):02x}:00.0" for _, device, count, bus in grants), grants
    state = pool_state(cluster)
    assert (len(state["servers"]), state["gpus"], state["leased"], state["queue"]) == (3, 6, 6, [])
    assert holders(state) == {(g[0], g[1]): c.process.pid for g, c in zip(grants, clients)}

    seventh = client(cluster, "c6")
    wait_for("the seventh to queue", lambda: "waiting for 1 free GPU" in seventh.err.read_text())
    listing = smi(cluster).stdout
    assert "6 leased, 1 waiting" in listing and f"pid {seventh.process.pid}: 1 GPU(s), waiting" in listing, listing
    assert seventh.leased() is None
    assert clients[0].release() == 0
    assert wait_for("the seventh's lease", seventh.leased)[:2] == grants[0][:2], "it got the device let go"

    # killed -9: its program dies with it, and Ray ends its lease (Ray Client's grace, 5 s, then
    # the cleanup); the eighth, queued, gets the device
    eighth = client(cluster, "c7")
    wait_for("the eighth to queue", lambda: "waiting for 1 free GPU" in eighth.err.read_text())
    program = int(subprocess.run(["pgrep", "-P", str(clients[1].process.pid)], capture_output=True,
                                 text=True).stdout.split()[0])
    killed = time.monotonic()
    clients[1].process.send_signal(signal.SIGKILL)
    wait_for("the eighth's lease", lambda: "xpu-run: leased device(s)" in eighth.err.read_text(), 30)
    freed_s = time.monotonic() - killed
    assert wait_for("the eighth's program", eighth.leased)[:2] == grants[1][:2]
    print(f"a client killed -9: its device leased again after {freed_s:.1f} s")
    assert freed_s < 10
    assert not Path(f"/proc/{program}").exists(), "the program died with its xpu-run"
    for c in (*clients[2:], seventh, eighth):
        assert c.release() == 0


def test_requests_the_pool_cannot_meet_fail_before_the_program_starts(cluster: Cluster) -> None:
    too_many = client(cluster, "too-many", "--gpus", "3")
    assert too_many.process.wait(60) == 1
    assert "no server in the pool has 3 devices (3 servers, the largest has 2)" in too_many.err.read_text()
    holding = [client(cluster, f"h{i}", "--gpus", "2") for i in range(SERVERS)]
    for h in holding:
        assert wait_for("a two-device lease", h.leased)[1:3] == ("0,1", 2)
    late = client(cluster, "late", "--lease-timeout", "3")
    assert late.process.wait(60) == 1
    assert "1 GPU(s) were not free within 3 s (3 servers, 6 GPUs)" in late.err.read_text()
    assert late.out.read_text() == "", "the program never ran"
    for h in holding:
        assert h.release() == 0


def test_a_spread_lease_takes_devices_of_several_servers(cluster: Cluster) -> None:
    """--gpus 3 --spread, when no server has 3 devices: Ray packs them on two servers, and the program gets both
    (XPU_SERVER lists them) and sees the three devices as one list, the ones xpu-smi --pool shows it holding;
    more devices than the pool has fail at once."""
    too_many = client(cluster, "spread-too-many", "--gpus", str(SERVERS * DEVICES + 1), "--spread")
    assert too_many.process.wait(60) == 1
    assert f"the pool has {SERVERS * DEVICES} devices in all" in too_many.err.read_text()
    spread = client(cluster, "spread", "--gpus", "3", "--spread")
    servers, visible, count, _bus = wait_for("the spread lease", spread.leased)
    named = servers.split(",")
    assert count == 3 and len(named) == 2, (servers, visible, count)
    shown = {(named[int(i) // DEVICES], str(int(i) % DEVICES)) for i in visible.split(",")}  # DEVICES each
    held = {where for where, pid in holders(pool_state(cluster)).items() if pid == spread.process.pid}
    assert shown == held and len(held) == 3
    assert spread.release() == 0


def test_a_spread_grant_names_its_devices_in_the_programs_one_list() -> None:
    """What xpu-run hands a program from a spread lease, without a cluster: CUDA_VISIBLE_DEVICES indexes the one
    list of every named server's devices (the first server's all come first), keys go one per server, and a
    lease mixing keyed and plain servers is refused."""
    from xpuremote.client.pool import Grant, Held, PoolError

    grant = Grant([Held("tcp://a:1", [1, 3], "", 4), Held("tcp://b:1", [0], "", 2)], None, [])
    assert grant.endpoint == "tcp://a:1,tcp://b:1" and grant.visible_devices() == "1,3,4"
    assert grant.server_keys() == []
    keyed = Grant([Held("tcp://a:1", [0], "KA", 1), Held("tcp://b:1", [1], "KB", 2)], None, [])
    assert keyed.server_keys() == ["KA", "KB"] and keyed.visible_devices() == "0,2"
    with pytest.raises(PoolError, match="mix CURVE keys and plain TCP"):
        Grant([Held("tcp://a:1", [0], "KA", 1), Held("tcp://b:1", [0], "", 1)], None, []).server_keys()


def test_a_server_with_keys_hands_out_its_public_key_and_its_keys_still_apply(cluster: Cluster,
                                                                             tmp_path: Path) -> None:
    keys = make_keys(tmp_path, "server", "alice")
    (tmp_path / "allowed").mkdir()
    shutil.copy(tmp_path / "alice.key", tmp_path / "allowed")
    holding = [client(cluster, f"k{i}", "--gpus", "2") for i in range(SERVERS)]  # the plain servers, all held
    for h in holding:
        wait_for("a two-device lease", h.leased)
    curve = start_server(cluster.tmp, "sim", env={"XPU_SIM_DEVICES": str(DEVICES)}, timeout=180,
                         args=("--pool", cluster.gcs, "--key", str(keys["server"]), "--allowed-keys",
                               str(tmp_path / "allowed")))
    try:
        alice = client(cluster, "alice", "--key", str(keys["alice"]))
        assert wait_for("alice's lease", alice.leased)[0] == curve.address, "through CURVE, with the pool's key"
        listing = smi(cluster, "--json").stdout
        public, secret = zmq.auth.load_certificate(keys["server"])
        assert public.decode() in listing and secret.decode() not in listing
        stranger = client(cluster, "stranger")  # no key of its own: its program cannot connect
        assert stranger.process.wait(120) != 0 and stranger.leased() is None
        assert "XPU_CLIENT_KEY" in stranger.err.read_text()
        assert alice.release() == 0
    finally:
        curve.stop()
        for h in holding:
            h.release()


def test_a_server_killed_leaves_the_pool_and_one_restarted_rejoins(cluster: Cluster) -> None:
    clients = [client(cluster, f"s{i}") for i in range(SERVERS * DEVICES)]
    grants = [wait_for(f"client {i}'s lease", c.leased) for i, c in enumerate(clients)]
    victim = cluster.servers.pop(0)
    victim.process.send_signal(signal.SIGKILL)
    orphans = [c for c, g in zip(clients, grants) if g[0] == victim.address]
    notice = f"the server {victim.address} left the pool"
    for c in orphans:  # their xpu-run sees the lease's actor die and gives the lease back
        wait_for("the orphan's notice", lambda c=c: notice in c.err.read_text(), 60)
    state = pool_state(cluster)
    assert (len(state["servers"]), state["gpus"], state["leased"], state["queue"]) == (2, 4, 4, [])
    assert victim.address not in {s["endpoint"] for s in state["servers"]}
    cluster.servers.append(cluster.join())
    state = pool_state(cluster)
    assert (len(state["servers"]), state["gpus"], state["leased"]) == (3, 6, 4)
    for c in clients:
        assert c.release() == 0
