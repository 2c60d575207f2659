"""What anyone who reaches the daemon's ports can make it hold or say: bounded.

- Idle connections to the metrics port are capped and closed by a deadline, so they cannot take the
  descriptors new sessions need (the daemon's limit lowered to 256 here, as a small host's would be).
- A hello's fields cannot write a line of their own into the log: every value is escaped.
- A refusal repeated from one source (failed CURVE handshakes, refused hellos, bad messages) is said
  once per interval, with the count of those kept quiet; another source is still said.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import re
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth
import zmq.utils.monitor
from conftest import Server, free_port, start_server
from pyclient import PyClient, make_keys, wait_for

from xpuremote.protocol import errors, wire
from xpuremote.server import metrics
from xpuremote.server.daemon import ask_status

FD_LIMIT = 256  # the daemon's hard limit of open files in the flood test: raising the soft limit cannot help
IDLE_CONNECTIONS = 500


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for srv in started:
        srv.stop()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _soft_nofile(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max open files"))
    return int(line.split()[3])


def _limited(soft: int, hard: int) -> None:  # in the daemon's process, before it runs
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_idle_metrics_connections_leave_the_daemon_its_descriptors(servers: list[Server], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon starts with a soft limit of 128 open files and a hard one of 256: it raises the soft to 256 and
    says so. 500 idle connections to its metrics port (306 once refused every new session at this limit) hold
    at most METRICS_MAX_CONNECTIONS of its descriptors; a new session still starts and works; the server
    closes every idle connection, the last METRICS_TIMEOUT_S after it opened; then the page answers again."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE_CONNECTIONS + 200:  # this process holds the idle connections' other ends
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    port = free_port()
    with monkeypatch.context() as patch:
        patch.setattr(subprocess, "Popen", functools.partial(subprocess.Popen,
                                                             preexec_fn=functools.partial(_limited, 128, FD_LIMIT)))
        servers.append(start_server(tmp_path, args=("--metrics-port", str(port))))
    srv = servers[-1]
    pid = srv.process.pid
    assert _soft_nofile(pid) == FD_LIMIT, Path(f"/proc/{pid}/limits").read_text()
    assert f"open files: the daemon may hold {FD_LIMIT} (soft limit, raised from 128; hard limit {FD_LIMIT})" \
        in srv.log(), srv.log()
    assert _scrape(port) == 200
    baseline = _fds(pid)

    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(IDLE_CONNECTIONS)]
    try:
        held = _fds(pid)
        client = PyClient(srv.address, timeout_s=10)  # its hello and the worker's start need descriptors
        try:
            ptr = client.alloc(4096)
            client.write(ptr, b"x" * 4096)
            assert client.read(ptr, 4096) == b"x" * 4096
        finally:
            client.close()
        most = max(held, _fds(pid))
        print(f"daemon descriptors: {baseline} before, at most {most} with {IDLE_CONNECTIONS} idle connections")
        assert most <= baseline + metrics.METRICS_MAX_CONNECTIONS + 8, (baseline, most)
        closed = _closed_by_peer(idle, metrics.METRICS_TIMEOUT_S + 25)
        assert closed == len(idle), f"{len(idle) - closed} idle connections still open"
    finally:
        for sock in idle:
            sock.close()
    assert wait_for(lambda: _fds(pid) <= baseline + 2, 5), (baseline, _fds(pid))
    assert _scrape(port) == 200
    assert "Traceback" not in srv.log(), srv.log()


def _scrape(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _closed_by_peer(socks: list[socket.socket], timeout_s: float) -> int:
    """How many of `socks` the other end has closed within `timeout_s`."""
    open_ = {s.fileno(): s for s in socks}
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    for fd in open_:
        poller.register(fd, select.POLLIN)
    while open_ and time.monotonic() < deadline:
        for fd, _ in poller.poll(200):
            try:
                data = open_[fd].recv(1)
            except ConnectionResetError:
                data = b""
            assert data == b"", f"the metrics port sent {data!r} to a connection that asked nothing"
            poller.unregister(fd)
            del open_[fd]
    return len(socks) - len(open_)


# ---- log lines ---------------------------------------------------------------------------------------------
FIELDS = ("user", "host", "pid")


def _hello(ctx: zmq.Context, address: str, client: dict) -> dict:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send_multipart(wire.encode({"op": "hello", "client": client}))
    assert sock.poll(30_000), "no answer to a hello"
    answer = wire.decode(sock.recv_multipart())
    sock.close()
    return answer


def test_a_hello_cannot_forge_a_log_line(servers: list[Server], tmp_path: Path) -> None:
    """Each hello field holds a newline, a tab, a NUL and a carriage return, then text that would read as a
    line of the daemon's own. The session's start, end and a refused hello of the same peer are one line each,
    their values read back as sent, no line starts with anything but the server's prefix, and `xpu-server
    status` shows the session on one row."""
    srv = start_server(tmp_path, args=("--connect-timeout", "2", "--max-pending-per-peer", "1"))
    servers.append(srv)
    client = {field: f"{field}\nxpu-server\tINFO\tforged-{field}\x00\rx" for field in FIELDS}  # no space: it was bare
    ctx = zmq.Context()
    try:
        assert _hello(ctx, srv.address, client)["status"] == 0
        refused = _hello(ctx, srv.address, client)
        assert refused["status"] == errors.NOT_PERMITTED, refused
        status = ask_status(srv.address, 5.0)
    finally:
        ctx.destroy(0)
    table = metrics.format_status(status).splitlines()
    assert len(status["sessions"]) == 1 and len(table) == 5 + len(status["devices"]) + 1, table  # one row
    assert wait_for(lambda: "session_end" in srv.log(), 10), srv.log()
    lines = srv.log().splitlines()
    assert all(line.startswith("xpu-server") for line in lines), lines
    forged = [line for line in lines if "forged" in line]
    events = [metrics.parse_kv(line.split(" ", 2)[2]) for line in forged]
    assert sorted(event for event, _ in events) == ["session_end", "session_refused", "session_start"], forged
    for _, values in events:
        assert {field: values[field] for field in FIELDS} == client, values


@pytest.mark.parametrize("text", ["plain", "", "a b", 'q"uote=d\\', "\n\r\t\x00\x1b\x7f\x85\u2028\u202e\ufeff",
                                  "José 中文 \U0001f600", "\\x41 \\u0041 \\n"])
def test_kv_values_are_one_line_and_read_back(text: str) -> None:
    line = metrics.kv("event", value=text, after="x")
    assert line.isprintable(), line
    assert metrics.parse_kv(line) == ("event", {"value": text or "-", "after": "x"})


def test_every_record_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The daemon's and workers' formatter: a message or a traceback that holds a line break stays inside its
    record (a traceback's lines indented, so none reads as a record of its own)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(metrics.OneLineFormatter("xpu-server %(levelname)s %(message)s"))
    logger = logging.getLogger("test-intake")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("refused %s", "x\nxpu-server INFO forged\x00")
        try:
            raise ValueError("bad\nxpu-server INFO forged too")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "xpu-server WARNING refused x\\nxpu-server INFO forged\\x00", lines
    assert lines[1] == "xpu-server ERROR failed" and all(line.startswith("    ") for line in lines[2:]), lines


# ---- repeated refusals -------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_repeats_say_once_per_source_and_interval_with_a_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    repeats = metrics.Repeats(logging.getLogger("test-repeats"), 60.0, 1024, clock, clock)
    with caplog.at_level(logging.INFO, "test-repeats"):
        said = [repeats.say("handshake", "10.0.0.1", f"refused {i}") for i in range(200)]
        assert said.count(True) == 1 and repeats.say("handshake", "10.0.0.2", "refused other")
        clock.now += 61
        repeats.say("handshake", "10.0.0.1", "refused again")
        repeats.say("handshake", "10.0.0.1", "kept quiet")
        clock.now += 61
        repeats.flush()
        repeats.flush()  # nothing more to say
        since = time.strftime("%H:%M:%S", time.localtime(1000.0))
        assert [r.getMessage() for r in caplog.records] == [
            "refused 0", "refused other", f"refused again (199 more since {since})", "kept quiet"]
        for i in range(3000):  # as many sources as a flood of addresses: the table stays bounded
            repeats.say("hello", f"10.1.{i >> 8}.{i & 255}", "refused hello", structured=True)
        assert len(repeats.seen) == metrics.REPEAT_SOURCES


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("keys")
    made = make_keys(folder, "server", "alice", "mallory")
    allowed = folder / "allowed"
    allowed.mkdir()
    (allowed / "alice.key").write_text((folder / "alice.key").read_text())
    return {**made, "allowed": allowed, "server.pub": folder / "server.key"}


INTERVAL_S = 3.0
REFUSED_KEY = re.compile(r"the daemon refused a client from (\S+): its key \S+ is not allowed \(CURVE authentication "
                         r"failed\)(?: \((\d+) more since \d\d:\d\d:\d\d\))?$")


def _refused_keys(log: str, address: str) -> list[int]:
    """For each line saying a refused key from `address`: how many refusals it stands for."""
    return [1 + int(m[2] or 0) for m in map(REFUSED_KEY.search, log.splitlines()) if m and m[1] == address]


def _handshake(ctx: zmq.Context, address: str, keys: dict[str, Path], source: str = "") -> None:
    """One connection with mallory's key (not allowed), until the server has refused its handshake."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(str(keys["mallory"]))
    sock.curve_serverkey = zmq.auth.load_certificate(str(keys["server.pub"]))[0]
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    sock.connect(f"tcp://{source}:0;{host}:{port}" if source else address)
    try:
        assert monitor.poll(10_000), "the handshake was not refused"
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)


def test_failed_handshakes_are_said_once_per_source_with_a_count(servers: list[Server], keys: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """200 handshakes with a key that is not allowed, from 127.0.0.1, make one line per interval (each refusal
    was a line before), which count all 200 once the interval has passed; one from 127.0.0.2 is still said at
    once. Clients without keys (a handshake ZeroMQ names no address for) are said once per interval and kind
    of failure (the mechanism mismatch; a connection closed in the handshake) too."""
    srv = start_server(tmp_path, args=("--key", str(keys["server"]), "--allowed-keys", str(keys["allowed"]),
                                       "--refusal-log-interval", str(INTERVAL_S)))
    servers.append(srv)
    ctx = zmq.Context()
    try:
        began = time.monotonic()
        for _ in range(200):
            _handshake(ctx, srv.address, keys)
        _handshake(ctx, srv.address, keys, source="127.0.0.2")
        assert wait_for(lambda: _refused_keys(srv.log(), "127.0.0.2") == [1], 5), srv.log()[-3000:]
        plain = [ctx.socket(zmq.DEALER) for _ in range(50)]  # no keys: each retries every 100 ms while open
        for sock in plain:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(srv.address)
        time.sleep(1)
        for sock in plain:
            sock.close(0)
        elapsed = time.monotonic() - began
    finally:
        ctx.destroy(0)
    assert wait_for(lambda: sum(_refused_keys(srv.log(), "127.0.0.1")) == 200, INTERVAL_S + 10), srv.log()[-3000:]
    counts = _refused_keys(srv.log(), "127.0.0.1")
    print(f"200 refused handshakes in {elapsed:.1f} s: {len(counts)} lines, counting {counts}")
    # a line at the first refusal, at most one an interval after, and one to say the count (flushed each second)
    most = 3 + elapsed / INTERVAL_S
    assert len(counts) <= most, counts
    assert any(n > 1 for n in counts), counts  # the count is said
    unnamed = collections.Counter(re.sub(r" \(\d+ more since \S+\)$", "", line)  # one source a kind of failure
                                  for line in srv.log().splitlines() if "refused a client at" in line)
    assert unnamed and max(unnamed.values()) <= most, unnamed


def test_refused_hellos_and_bad_messages_are_said_once_per_source(servers: list[Server], tmp_path: Path) -> None:
    """One peer's hellos over its limit, and its malformed messages, are each said once per interval with a
    count (one line each before); the same from another address is still said."""
    srv = start_server(tmp_path, args=("--max-pending-per-peer", "1", "--connect-timeout", "30",
                                       "--refusal-log-interval", str(INTERVAL_S)))
    servers.append(srv)
    host, port = srv.address.removeprefix("tcp://").rsplit(":", 1)
    ctx = zmq.Context()
    began = time.monotonic()
    try:
        for source in ("127.0.0.1", "127.0.0.2"):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{source}:0;{host}:{port}")
            for i in range(61):
                sock.send_multipart(wire.encode({"op": "hello", "client": {"user": f"squatter{i}"}}))
                sock.send_multipart([b"\xc1 not msgpack"])
            for _ in range(122):
                assert sock.poll(30_000), "the daemon stopped answering"
                sock.recv_multipart()
            sock.close()
    finally:
        ctx.destroy(0)
    elapsed = time.monotonic() - began
    for source in ("127.0.0.1", "127.0.0.2"):
        refused, malformed = rf"session_refused .*peer={source} ", f"malformed message to the daemon from {source}:"
        assert wait_for(lambda p=refused: sum(_said(srv.log(), p)) == 60, INTERVAL_S + 10), srv.log()
        assert wait_for(lambda p=malformed: sum(_said(srv.log(), p)) == 61, 5), srv.log()
        assert len(_said(srv.log(), refused)) <= 3 + elapsed / INTERVAL_S, srv.log()


def _said(log: str, pattern: str) -> list[int]:
    """For each line matching `pattern`: how many refusals it stands for (itself, and the count it says)."""
    counts = [re.search(r"(?: more=(\d+) since=\S+| \((\d+) more since \S+\))$", line)
              for line in log.splitlines() if re.search(pattern, line)]
    return [1 + int(m[1] or m[2]) if m else 1 for m in counts]
