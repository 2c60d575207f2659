"""CURVE: who gets in, what a refused client is told, and what the network sees.

Keys come from `xpu-server keygen`; the server admits the public keys in --allowed-keys. A
client without keys, with a key not on the list, or with the wrong server key is refused,
with a clear error on its side (at once, not at the connect timeout) and a line in the
server's log. Captured traffic can neither be replayed into a session nor read, the data connection's
included (sealed with keys the worker sends inside CURVE), and altered traffic fails cleanly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import zmq
from conftest import Server, start_server
from pyclient import CTX, PyClient, Relay, make_keys, rss, wait_for
from test_faults import PRELUDE
from test_isolation import PTX

from xpuremote.client import data
from xpuremote.client.connection import Connection
from xpuremote.protocol import errors, stream, wire
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.errors import CudaError
from xpuremote.server.backends import sim_board
from xpuremote.server.daemon import ask_status


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    made = make_keys(folder, "server", "alice", "bob", "mallory", "impostor")
    allowed = folder / "allowed"
    allowed.mkdir()
    for name in ("alice", "bob"):
        shutil.copy(folder / f"{name}.key", allowed)
    return {**made, "allowed": allowed, "server.pub": folder / "server.key", "impostor.pub": folder / "impostor.key"}


def use(monkeypatch: pytest.MonkeyPatch, client: Path | None, server: Path | None) -> None:
    for name, path in (("XPU_CLIENT_KEY", client), ("XPU_SERVER_KEY", server)):
        if path is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(path))


def test_keygen_keeps_the_secret_private(keys: dict[str, Path]) -> None:
    assert stat.S_IMODE(keys["alice"].stat().st_mode) == 0o600
    public = keys["alice"].with_suffix(".key").read_text()
    assert "public-key" in public and "secret-key" not in public
    again = make_keys  # a second keygen of the same name must not overwrite the key
    with pytest.raises(Exception):  # noqa: B017 (CalledProcessError)
        again(keys["alice"].parent, "alice")


def xpu_server(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xpuremote.server.daemon", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("name", ["../outside", "ABSOLUTE", "deeper/x", ".."])
def test_keygen_writes_only_inside_its_directory(name: str, tmp_path: Path) -> None:
    inside = tmp_path / "keys" / "here"
    name = str(tmp_path / "absolute") if name == "ABSOLUTE" else name
    done = xpu_server("keygen", str(inside), "--name", name)
    assert done.returncode != 0 and "plain file name" in done.stderr, done
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


@pytest.mark.parametrize("damage", ["not z85", "another key's secret"])
def test_a_bad_server_key_file_is_named(damage: str, keys: dict[str, Path], tmp_path: Path) -> None:
    secret = re.compile(r'secret-key = "([^"]*)"')
    other = secret.search(keys["alice"].read_text()).group(1)
    bad = tmp_path / "server.key_secret"
    bad.write_text(secret.sub(f'secret-key = "{"~" * 40 if damage == "not z85" else other}"',
                              keys["server"].read_text()))
    done = xpu_server("--listen", "tcp://127.0.0.1:0", "--backend", "sim", "--key", str(bad),
                      "--allowed-keys", str(keys["alice"].parent))
    assert done.returncode != 0 and f"the key file {bad} is bad" in done.stderr, done
    assert "cannot listen" not in done.stderr


def test_allowed_client_works_through_the_shim(keys: dict[str, Path], curve_server: Server, run_on) -> None:
    body = "ctx, ptr = setup(1 << 20)\nprint('roundtrip', roundtrip(ptr, 1 << 20), flush=True)\n"
    result = run_on([sys.executable, "-c", PRELUDE + body], timeout=60, address=curve_server.address,
                    XPU_CLIENT_KEY=str(keys["alice"]), XPU_SERVER_KEY=str(keys["server.pub"]))
    assert result.returncode == 0 and "roundtrip True" in result.stdout, result.stdout + result.stderr
    # a copy of 1 MiB goes on the data connection, sealed with the session's own keys (protocol/stream.py)
    assert wait_for(lambda: re.search(r"[1-9]\d* bytes on the data connection", curve_server.log()), 10)


@pytest.mark.parametrize("who", ["no keys", "unknown key", "wrong server key"])
def test_refused_clients_are_told_at_once(who: str, keys: dict[str, Path], curve_server: Server, run_on) -> None:
    env = {"no keys": {},
           "unknown key": {"XPU_CLIENT_KEY": str(keys["mallory"]), "XPU_SERVER_KEY": str(keys["server.pub"])},
           "wrong server key": {"XPU_CLIENT_KEY": str(keys["alice"]), "XPU_SERVER_KEY": str(keys["impostor.pub"])},
           }[who]
    body = "t = time.monotonic()\nrc = cu.cuInit(0)\nprint(f'cuInit {rc} {time.monotonic() - t:.2f}', flush=True)\n"
    before = curve_server.log().count("refused a client")
    started = curve_server.log().count("session_start")
    result = run_on([sys.executable, "-c", PRELUDE + body], timeout=60, address=curve_server.address,
                    XPU_CONNECT_TIMEOUT_S="20", **env)
    m = re.search(r"cuInit (\d+) ([\d.]+)", result.stdout)
    assert m, result.stdout + result.stderr
    assert int(m.group(1)) == errors.NO_DEVICE, result.stderr
    assert float(m.group(2)) < 5, f"refusal took {m.group(2)} s (the connect timeout is 20 s)"
    assert "refused the connection" in result.stderr and curve_server.address in result.stderr, result.stderr
    if who == "unknown key":
        assert "does not accept this client's key" in result.stderr, result.stderr
        mallory = keys["mallory"].with_suffix(".key").read_text()
        key = re.search(r'public-key = "(.+)"', mallory).group(1)
        assert wait_for(lambda: f"its key {key} is not allowed" in curve_server.log(), 5), curve_server.log()
    else:
        assert wait_for(lambda: curve_server.log().count("refused a client") > before, 5), curve_server.log()
    assert curve_server.log().count("session_start") == started, "a refused client got a session"


def test_a_worker_admits_only_its_own_client(keys: dict[str, Path], curve_server: Server,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Bob holds an allowed key, but alice's worker is alice's: bob cannot attach to it."""
    use(monkeypatch, keys["alice"], keys["server.pub"])
    alice = PyClient(curve_server.address)
    try:
        ptr = alice.alloc(4096)
        alice.write(ptr, b"A" * 4096)
        ctx = zmq.Context()
        try:
            bob = ctx.socket(zmq.DEALER)
            bob.setsockopt(zmq.LINGER, 0)
            public, secret = zmq.auth.load_certificate(str(keys["bob"]))
            bob.curve_publickey, bob.curve_secretkey = public, secret
            bob.curve_serverkey = zmq.auth.load_certificate(str(keys["server.pub"]))[0]
            monitor = bob.get_monitor_socket()
            bob.connect(alice.conn.endpoint)
            bob.send_multipart(wire.encode({"op": "calls", "seq": 1, "reply": True,
                                            "calls": [[0x1234, []]]}))
            events = []
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and zmq.EVENT_HANDSHAKE_FAILED_AUTH not in events:
                if monitor.poll(100):
                    events.append(zmq.utils.monitor.recv_monitor_message(monitor)["event"])
            assert zmq.EVENT_HANDSHAKE_FAILED_AUTH in events, events
            assert not bob.poll(500), "bob got an answer from alice's worker"
        finally:
            ctx.destroy(0)
        assert alice.read(ptr, 4096) == b"A" * 4096
    finally:
        alice.close()
    assert wait_for(lambda: "refused a client" in curve_server.log(), 5)


def relayed_session(address: str, pattern: bytes, monkeypatch: pytest.MonkeyPatch) -> list[Relay]:
    """A client session whose every connection (daemon, worker, data connection) goes through a recording
    relay; it copies `pattern` to the device and back, in its messages and straight from and into its buffers.
    The relays: the daemon's, the worker's, the data connection's."""
    relays = [Relay.to(address)]
    real, real_connect = Connection._worker_endpoint, data.connect

    def through_relay(self: Connection, endpoint: str) -> str:
        relays.append(Relay.to(real(self, endpoint)))
        return relays[-1].address

    def data_through_relay(host: str, port: int, *args: object) -> data.Stream:
        relays.append(Relay(host, port))
        return real_connect("127.0.0.1", relays[-1].port, *args)

    monkeypatch.setattr(Connection, "_worker_endpoint", through_relay)
    monkeypatch.setattr(data, "connect", data_through_relay)
    client = PyClient(relays[0].address)
    try:
        assert client.conn.data is not None, "no data connection"
        ptr = client.alloc(len(pattern))
        client.write(ptr, pattern)  # over 64 KiB: a bulk frame
        assert client.read(ptr, len(pattern)) == pattern
        _copy_by_data(client, ptr, pattern)
        small = client.alloc(4096)
        client.write(small, pattern[:4096])  # inline in the msgpack header
        assert client.read(small, 4096) == pattern[:4096]
    finally:
        client.close()
    monkeypatch.setattr(Connection, "_worker_endpoint", real)
    monkeypatch.setattr(data, "connect", real_connect)
    return relays


def _copy_by_data(client: PyClient, ptr: int, pattern: bytes) -> None:
    """`pattern` to the device and back as the shim copies a large buffer: its bytes on the data connection,
    read and written straight from and into the buffers."""
    status, _, _ = client.conn.call(CALLS["cuMemcpyHtoD_v2"], [ptr, wire.Data(pattern), len(pattern)], CTX,
                                    by_data=True)
    assert status == 0, status
    out = bytearray(len(pattern))
    asked = wire.Data(memoryview(out), asked=True)  # written as the bytes arrive
    status, _, _ = client.conn.call(CALLS["cuMemcpyDtoH_v2"], [asked, ptr, len(pattern)], CTX, by_data=True)
    assert status == 0 and out == pattern, status


@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
def test_captured_traffic_holds_none_of_the_copied_bytes(curve: bool, keys: dict[str, Path], curve_server: Server,
                                                         server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CURVE the copied bytes appear nowhere on the wire, the data connection's included (it is sealed);
    without it (the control) they do. The copies went on the data connection, and came back unchanged."""
    pattern = secrets.token_bytes(256) * 4096  # 1 MiB: large enough for the data connection
    use(monkeypatch, keys["alice"] if curve else None, keys["server.pub"] if curve else None)
    relays = relayed_session((curve_server if curve else server).address, pattern, monkeypatch)
    capture = b"".join(r.captured() for r in relays)
    for r in relays:
        r.close()
    assert len(relays) == 3 and len(capture) > 4 * len(pattern), len(capture)
    up, down = relays[2].connections[0]  # two copies each way, as messages and straight from the buffers
    assert len(up) > 2 * len(pattern) and len(down) > 2 * len(pattern), (len(up), len(down))
    probes = [pattern[i : i + 32] for i in (0, 1000, 4064, 100_000, len(pattern) - 32)]
    found = [p in capture for p in probes]
    assert found == [not curve] * len(probes), found


@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain"])
def test_a_replayed_session_gets_nothing(curve: bool, keys: dict[str, Path], curve_server: Server, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The bytes a client sent to the daemon, sent again on a fresh TCP connection: with CURVE the
    handshake fails (the server's cookie and nonces are new each time) and no session starts;
    without CURVE (the control) the replay starts one, so the test can fail."""
    target = curve_server if curve else start_server(tmp_path)
    try:
        use(monkeypatch, keys["alice"] if curve else None, keys["server.pub"] if curve else None)
        relays = relayed_session(target.address, secrets.token_bytes(70_000), monkeypatch)
        up = bytes(relays[0].connections[0][0])
        for r in relays:
            r.close()
        started = target.log().count("session_start")
        host, port = target.address.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=3) as raw:
            for part in (up[:10], up[10:64], up[64:]):  # the ZMTP greeting's steps, then the rest
                raw.sendall(part)
                time.sleep(0.2)
            answer = _read_for(raw, 2.0)
        replayed = wait_for(lambda: target.log().count("session_start") > started, 3)
        assert replayed != curve, (answer, target.log()[-2000:])
        if curve:  # the daemon's answer is never more than its side of a failed handshake
            assert b"worker" not in answer and b"tcp://" not in answer, answer
            assert wait_for(lambda: "refused a client" in target.log(), 5)
    finally:
        if not curve:
            target.stop()


@pytest.mark.parametrize("way", [0, 1], ids=["client to worker", "worker to client"])
def test_a_byte_altered_on_the_sealed_data_connection_fails_that_copy_cleanly(
        way: int, keys: dict[str, Path], curve_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """One bit flipped 1.5 MiB into what a keyed session's data connection carries one way, inside a 3 MiB copy:
    the copy fails, saying why; the end that saw it logs it; no byte of the altered record or after it lands (the
    device's memory, or the application's buffer, holds the copy's checked records, zeros where the altered one
    was opened, and what it held before); and the session goes on over ZeroMQ (CURVE), its next copies right."""
    use(monkeypatch, keys["alice"], keys["server.pub"])
    real_connect, relays = data.connect, []

    def tampered(host: str, port: int, *args: object) -> data.Stream:
        relays.append(Relay(host, port, flip=(way, 3 << 19)))
        return real_connect("127.0.0.1", relays[-1].port, *args)

    monkeypatch.setattr(data, "connect", tampered)
    client = PyClient(curve_server.address)
    size, pattern = 3 << 20, secrets.token_bytes(3 << 20)
    try:
        assert type(client.conn.data) is stream.Sealed, client.conn.data
        ptr = client.alloc(size)
        if way == 0:
            status, _, _ = client.conn.call(CALLS["cuMemcpyHtoD_v2"], [ptr, wire.Data(pattern), size], CTX,
                                            by_data=True)
            assert status == errors.INVALID_VALUE, status
            assert wait_for(lambda: "a record on the data connection failed its check" in curve_server.log(), 5)
            landed, before = client.read(ptr, size), bytes(size)  # over ZeroMQ now
        else:
            client.write(ptr, pattern)
            landed = bytearray(b"\xaa" * size)
            before = bytes(landed)
            with pytest.raises(CudaError, match="lost with the data connection: a record on the data connection "
                                                "failed its check"):
                asked = wire.Data(memoryview(landed), asked=True)
                client.conn.call(CALLS["cuMemcpyDtoH_v2"], [asked, ptr, size], CTX, by_data=True)
        assert client.conn.data is None
        # records of the copy land at multiples of RECORD_MAX: the checked ones, then the altered one's zeros
        record = stream.RECORD_MAX
        altered = next((at for at in range(0, size, record) if landed[at : at + record] != pattern[at : at + record]),
                       size)
        end = altered + record
        assert altered < size and landed[altered:end] == bytes(end - altered), altered
        assert landed[end:] == before[end:], f"bytes not the copy's landed after the altered record, at {altered}"
        client.write(ptr, pattern[::-1])
        assert client.read(ptr, size) == pattern[::-1]
    finally:
        client.close()
        for relay in relays:
            relay.close()
    assert "Traceback" not in curve_server.log()


def _read_for(sock: socket.socket, seconds: float) -> bytes:
    data, deadline = b"", time.monotonic() + seconds
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def test_plain_server_beyond_loopback_warns(tmp_path: Path) -> None:
    srv = start_server(tmp_path, address=f"tcp://0.0.0.0:{_free()}")
    try:
        assert "without CURVE keys" in srv.log(), srv.log()
    finally:
        srv.stop()


def test_curve_key_files_missing_is_a_clear_client_error(monkeypatch: pytest.MonkeyPatch, curve_server: Server,
                                                          tmp_path: Path) -> None:
    monkeypatch.setenv("XPU_CLIENT_KEY", str(tmp_path / "nope.key_secret"))
    monkeypatch.setenv("XPU_SERVER_KEY", str(tmp_path / "nope.key"))
    with pytest.raises(CudaError) as info:
        Connection(curve_server.address, 5)
    assert "CURVE keys" in str(info.value)


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_xpu_run_passes_the_keys(keys: dict[str, Path], curve_server: Server, shim: Path) -> None:
    body = "ctx, ptr = setup()\nprint('roundtrip', roundtrip(ptr), flush=True)\n"
    env = {k: v for k, v in os.environ.items() if k not in ("XPU_CLIENT_KEY", "XPU_SERVER_KEY", "LD_PRELOAD")}
    result = subprocess.run([sys.executable, "-m", "xpuremote.interpose.run", "--server", curve_server.address,
                             "--key", str(keys["alice"]), "--server-key", str(keys["server.pub"]), "--",
                             sys.executable, "-c", PRELUDE + body], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "roundtrip True" in result.stdout, result.stdout + result.stderr


# ---- the size of a message, counted whole --------------------------------------------------------
def test_the_daemon_keeps_no_message_of_many_frames(tmp_path: Path) -> None:
    """ZeroMQ's MAXMSGSIZE bounds each frame: a `status` of 300 frames of 1 MiB, unauthenticated, once
    made the daemon answer it and keep 300 MB. It is refused (answered, logged with the peer), its
    memory given back, and the daemon still serves."""
    srv = start_server(tmp_path)
    ctx = zmq.Context()
    try:
        before = rss(srv.process.pid)
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(srv.address)
        sock.send_multipart([*wire.encode({"op": "status"}), *[b"\0" * (1 << 20)] * 300])
        assert sock.poll(30_000), "the daemon did not answer"
        answer = wire.decode(sock.recv_multipart())
        assert answer["status"] == errors.INVALID_VALUE and "301 frames" in answer["error"], answer
        assert wait_for(lambda: "refused a message from 127.0.0.1" in srv.log(), 5), srv.log()
        grown = rss(srv.process.pid) - before
        assert grown < 100 << 20, f"the daemon holds {grown >> 20} MiB more after the message"
        assert ask_status(srv.address, 5.0)["sessions"] == []
        client = PyClient(srv.address)
        assert client.read(client.alloc(64), 64) == bytes(64)
        client.close()
    finally:
        ctx.destroy(0)
        srv.stop()
    assert "Traceback" not in srv.log()


# ---- a session's key ---------------------------------------------------------------------------------
INTRUDER = """import json, os, sys, zmq
from xpuremote.protocol import curve
from xpuremote.protocol import wire
from xpuremote.protocol.calls import CALLS
endpoint, ptr = sys.argv[1], int(sys.argv[2])
ctx = zmq.Context()
answers = {}
for who, routing_id in (("no key", None), ("a wrong key", os.urandom(32))):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if routing_id:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    curve.secure(sock, curve.client_keys())
    sock.connect(endpoint)
    for seq, (symbol, args) in enumerate([("cuMemcpyDtoH_v2", [64, ptr, 64]),
                                          ("cuMemcpyHtoD_v2", [ptr, b"X" * 64, 64])], 1):
        call = [[CALLS[symbol].opcode, args]]
        sock.send_multipart(wire.encode({"op": "calls", "seq": seq, "reply": True, "calls": call}))
        answer = wire.decode(sock.recv_multipart()) if sock.poll(3000) else None
        answers[f"{symbol} with {who}"] = answer and {k: repr(v) for k, v in answer.items()}
print(json.dumps(answers))
ctx.destroy(0)  # the intruder's connections go away
"""


@pytest.mark.parametrize("curve", [False, True], ids=["plain", "curve"])
def test_another_process_cannot_use_or_end_a_session_without_its_key(
        curve: bool, keys: dict[str, Path], curve_server: Server, server: Server,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process that learns a worker's endpoint (in CURVE mode: even one holding the
    victim's own CURVE key) gets nothing from it without the session's key: its calls are
    refused and logged once, the victim's memory stays, and its leaving does not end the session."""
    target = curve_server if curve else server
    use(monkeypatch, keys["alice"] if curve else None, keys["server.pub"] if curve else None)
    victim = PyClient(target.address)
    try:
        pattern = secrets.token_bytes(64)
        ptr = victim.alloc(64)
        victim.write(ptr, pattern)
        session = victim.conn.session
        result = subprocess.run([sys.executable, "-c", INTRUDER, victim.conn.endpoint, str(ptr)],
                                capture_output=True, text=True, timeout=60, env=dict(os.environ))
        assert result.returncode == 0, result.stderr
        answers = json.loads(result.stdout)
        assert len(answers) == 4, answers
        for what, answer in answers.items():
            assert answer is None or (answer["status"] != "0" and answer.get("outs") in (None, "[]")), (what, answer)
            assert session not in json.dumps(answer) and repr(pattern) not in json.dumps(answer), (what, answer)
        assert victim.read(ptr, 64) == pattern
        # the intruder's connections are gone; the session is not
        assert not wait_for(lambda: f"session {session} ended" in target.log(), 3), target.log()[-2000:]
        assert victim.read(ptr, 64) == pattern and victim.read(victim.alloc(16), 16) == bytes(16)
        refusals = re.findall(rf"session {session}: refused .*", target.log())
        assert len(refusals) == 1 and "127.0.0.1" in refusals[0], refusals  # once per source
    finally:
        victim.close()


def test_per_key_limits_in_curve_mode(keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CURVE the peer is the key: bob's squatting hellos are refused past his pending limit,
    alice (same host, another key) still gets her sessions, up to her own limit of live ones."""
    srv = start_server(tmp_path, args=("--key", str(keys["server"]), "--allowed-keys", str(keys["allowed"]),
                                       "--max-pending-per-peer", "1", "--max-clients-per-peer", "2"))
    ctx = zmq.Context()
    alice: list[PyClient] = []
    try:
        use(monkeypatch, keys["bob"], keys["server.pub"])
        bob = [_curve_hello(ctx, srv.address) for _ in range(2)]
        assert bob[0]["status"] == 0 and bob[1]["status"] == errors.NOT_PERMITTED, bob
        assert "--max-pending-per-peer" in bob[1]["error"], bob[1]
        use(monkeypatch, keys["alice"], keys["server.pub"])
        alice += [PyClient(srv.address), PyClient(srv.address)]
        assert all(a.read(a.alloc(16), 16) == bytes(16) for a in alice)
        with pytest.raises(CudaError) as info:
            PyClient(srv.address)
        assert "--max-clients-per-peer" in str(info.value), info.value
    finally:
        for a in alice:
            a.close()
        ctx.destroy(0)
        srv.stop()


def _curve_hello(ctx: zmq.Context, address: str) -> dict:
    """A hello with the CURVE keys of the environment, never followed by a connection to the worker."""
    from xpuremote.protocol import curve

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    curve.secure(sock, curve.client_keys())
    sock.connect(address)
    sock.send_multipart(wire.encode({"op": "hello", "client": {"user": "squatter"}}))
    assert sock.poll(30_000), "no answer to a hello"
    return wire.decode(sock.recv_multipart())


# ---- the sim's board directory ----------------------------------------------------------------------
# Only a sim daemon makes one (its workers' shared device memory figures).
@pytest.mark.sim_only(reason="the sim's board directory")
def test_the_sim_board_follows_no_link_planted_in_tmp(tmp_path: Path) -> None:
    """Another local user who makes the board directory first, with a link inside to a file of the
    server's user (root's /etc/shadow, say), must not get that file written. The planted name is the one
    older servers used for the daemon's own board file: xpuremote-sim-UID-PARENT_PID/DAEMON_PID."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    srv = start_server(tmp_path)
    planted = Path(tempfile.gettempdir()) / f"xpuremote-sim-{os.getuid()}-{os.getpid()}"
    made = not planted.exists()
    planted.mkdir(exist_ok=True)
    (planted / str(srv.process.pid)).symlink_to(victim)
    try:
        client = PyClient(srv.address)
        client.alloc(1 << 20)
        assert client.mem_info()[0] < client.mem_info()[1]
        assert ask_status(srv.address, 5.0)["devices"]  # the daemon opens a board of its own for this
        client.close()
    finally:
        srv.stop()
        (planted / str(srv.process.pid)).unlink(missing_ok=True)
        if made:
            shutil.rmtree(planted, ignore_errors=True)
    assert victim.read_bytes() == b"precious"


@pytest.mark.sim_only(reason="the sim's board directory")
def test_a_sim_board_directory_that_is_not_private_is_refused(tmp_path: Path) -> None:
    open_to_all = tmp_path / "open"
    open_to_all.mkdir(mode=0o777)
    open_to_all.chmod(0o777)
    link = tmp_path / "link"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link.symlink_to(private)
    for directory in (open_to_all, link):
        with pytest.raises(PermissionError, match="not a private directory"):
            sim_board.Board(directory)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (private / str(os.getpid())).symlink_to(victim)  # where the board file goes: replaced, not followed
    board = sim_board.Board(private)
    board.publish(0, 1234)
    assert board.used(0) == 1234 and victim.read_bytes() == b"precious"
    board.close()


# ---- small holes -------------------------------------------------------------------------------------
def test_garbage_module_images_are_refused_as_the_driver_would(server: Server) -> None:
    """Bytes that are no module image answer CUDA_ERROR_INVALID_IMAGE, code for another GPU
    CUDA_ERROR_NO_BINARY_FOR_GPU; the session goes on (the sim, like an H100, is sm_90)."""
    ptx = PTX.decode()
    images = {
        b"garbage that is text": errors.INVALID_IMAGE,
        bytes(range(256)) * 4: errors.INVALID_IMAGE,
        ptx.replace(".version 8.0", "").encode(): errors.INVALID_IMAGE,  # no .version: not PTX
        b"\x7fELF\x02" + bytes(300): errors.INVALID_IMAGE,  # not a CUDA cubin (e_machine)
        ptx.replace("sm_90", "sm_100").encode(): errors.NO_BINARY_FOR_GPU,
    }
    client = PyClient(server.address)
    try:
        for i, (image, expected) in enumerate(images.items()):
            module = 0x7C00_0000_8000 + 16 * i
            client.post("xpuModuleLoad", module, hashlib.sha256(image).digest(), image, len(image))
            assert client.status_of("cuCtxSynchronize") == expected, image[:40]
        client.post("xpuModuleLoad", 0x7C00_0000_9000, hashlib.sha256(PTX).digest(), PTX, len(PTX))
        assert client.status_of("cuCtxSynchronize") == errors.SUCCESS
    finally:
        client.close()
