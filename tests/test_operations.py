"""Running a shared server: limits, cleanup of vanished clients, graceful shutdown, restarts,
status, metrics and the session log lines.

Each test starts its own server with the flags it needs; clients are shim programs (to die
like applications die) or the Python client library (to be many, or to look inside).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from conftest import DEVICE_NAME, Server, free_port, shim_env, start_server
from pyclient import PyClient, sessions, wait_for
from pyclient import rss as rss_of
from test_faults import COPY_UNTIL_FAILURE, alive, finish, pids_of_children, program, spawn

from xpuremote.protocol import errors, wire
from xpuremote.protocol.errors import CudaError

MIB = 1 << 20


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    """Servers a test starts (append to the list); all killed at the end, workers included."""
    started: list[Server] = []
    yield started
    for srv in started:
        for pid in pids_of_children(srv.process.pid):
            os.kill(pid, signal.SIGKILL)
        srv.stop()


def launch(servers: list[Server], tmp_path: Path, *args: str, address: str | None = None) -> Server:
    servers.append(start_server(tmp_path, args=args, address=address))
    return servers[-1]


# ---- limits ----------------------------------------------------------------------------------------
def test_memory_quota_is_per_client(servers: list[Server], tmp_path: Path) -> None:
    srv = launch(servers, tmp_path, "--mem-quota", "1M")
    a, b = PyClient(srv.address), PyClient(srv.address)
    try:
        first = a.alloc(600_000)
        with pytest.raises(CudaError) as info:
            a.alloc(600_000)
        assert info.value.code == errors.OUT_OF_MEMORY
        assert a.status_of("cuMemAllocPitch_v2", 8, 8, 4096, 200, 4) == errors.OUT_OF_MEMORY  # 800 KiB pitched
        other = b.alloc(MIB)  # b's quota is its own
        b.write(other, b"b" * MIB)
        a.post("cuMemFree_v2", first)
        again = a.alloc(MIB)  # freed memory counts no more
        a.write(again, b"a" * MIB)
        assert b.read(other, MIB) == b"b" * MIB and a.read(again, MIB) == b"a" * MIB
    finally:
        a.close()
        b.close()


def test_max_clients_refuses_the_one_too_many(servers: list[Server], tmp_path: Path) -> None:
    srv = launch(servers, tmp_path, "--max-clients", "2")
    a, b = PyClient(srv.address), PyClient(srv.address)
    try:
        with pytest.raises(CudaError) as info:
            PyClient(srv.address)
        assert "full" in str(info.value) and "--max-clients" in str(info.value), info.value
        assert "session_refused" in srv.log()
        a.close()
        assert wait_for(lambda: len(sessions(srv.address)) == 1, 5)
        c = PyClient(srv.address)  # a place is free again
        assert c.read(c.alloc(16), 16) == bytes(16)
        c.close()
    finally:
        a.close()
        b.close()


def hello_from(ctx: zmq.Context, address: str) -> dict:
    """A `hello` on a socket of its own, never followed by a connection to the worker."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    sock.send_multipart(wire.encode({"op": "hello", "client": {"user": "squatter"}}))
    assert sock.poll(30_000), "no answer to a hello"
    return wire.decode(sock.recv_multipart())


def test_hello_squatting_costs_the_squatter_only(servers: list[Server], tmp_path: Path) -> None:
    """Hellos never followed by a connection: past --max-pending-per-peer the squatter's host is
    refused with the reason, a client from another host still gets a session at once, and
    the squatter's sessions end after --connect-timeout (its places are free again)."""
    srv = launch(servers, tmp_path, "--max-clients", "6", "--max-pending-per-peer", "2", "--connect-timeout", "3")
    ctx = zmq.Context()
    try:
        answers = [hello_from(ctx, srv.address) for _ in range(5)]
        assert [a["status"] for a in answers[:2]] == [0, 0], answers
        for refused in answers[2:]:
            assert refused["status"] == errors.NOT_PERMITTED, refused
            assert "127.0.0.1" in refused["error"] and "--max-pending-per-peer" in refused["error"], refused
        port = srv.address.rsplit(":", 1)[1]
        neighbour = PyClient(f"tcp://127.0.0.2:0;127.0.0.1:{port}")  # from another (loopback) address
        try:
            assert neighbour.read(neighbour.alloc(16), 16) == bytes(16)
        finally:
            neighbour.close()
        assert wait_for(lambda: srv.log().count("no client connected within") == 2, 20), srv.log()
        # the squatter's own places are free again, once the daemon has reaped those workers
        assert wait_for(lambda: hello_from(ctx, srv.address)["status"] == 0, 10, interval=0.2)
    finally:
        ctx.destroy(0)
    assert "session_refused" in srv.log() and "Traceback" not in srv.log()


def test_request_size_limit(servers: list[Server], tmp_path: Path) -> None:
    """A message over --max-request-bytes in total is refused with a reason; the client knows the limit
    and refuses a call over it itself (a frame over it would make ZeroMQ drop the connection); the
    session and the server go on."""
    srv = launch(servers, tmp_path, "--max-request-bytes", "1M")
    client = PyClient(srv.address)
    try:
        ptr = client.alloc(2 * MIB)
        client.write(ptr, b"x" * (512 << 10))  # under the limit
        conn = client.conn
        header = {"op": "calls", "seq": 99, "reply": True,
                  "calls": [[0x1, [wire.Bulk(b"y" * (600 << 10))]], [0x1, [wire.Bulk(b"z" * (600 << 10))]]]}
        with conn.lock:
            conn.sock.send_multipart(wire.encode(header))
            answer = conn._receive(None, 5)
        assert answer["status"] == errors.INVALID_VALUE and "limit" in answer["error"], answer
        assert client.read(ptr, 16) == b"x" * 16
        with pytest.raises(CudaError) as info:
            client.write(ptr, b"w" * (2 * MIB))  # one frame over the limit: refused before it is sent
        assert "--max-request-bytes" in str(info.value), info.value
        assert client.read(ptr, 16) == b"x" * 16
    finally:
        client.close()
    fresh = PyClient(srv.address)
    assert fresh.read(fresh.alloc(64), 64) == bytes(64)
    fresh.close()
    assert srv.process.poll() is None and "Traceback" not in srv.log()


def test_a_message_of_many_frames_is_bounded_whole(servers: list[Server], tmp_path: Path) -> None:
    """--max-request-bytes bounds a whole message, not each frame: 40 frames of 15 MiB under a 16 MiB
    limit once made the worker take in and keep 600 MB (and 1,000 empty frames were taken as one
    request). The message is refused with a reason, the memory given back, and the session goes on."""
    srv = launch(servers, tmp_path, "--max-request-bytes", "16M")
    client = PyClient(srv.address)
    try:
        ptr = client.alloc(MIB)
        client.write(ptr, b"k" * MIB)
        worker = next(s["worker_pid"] for s in sessions(srv.address))
        before = rss_of(worker)
        header = {"op": "calls", "seq": 99, "reply": True, "calls": [[0x1, []]]}
        conn = client.conn
        with conn.lock:
            conn.sock.send_multipart([*wire.encode(header), *[b"\0" * (15 * MIB)] * 40])
            answer = conn._receive(None, 30)
        assert answer["status"] == errors.INVALID_VALUE and "limit of 16777216" in answer["error"], answer
        grown = rss_of(worker) - before
        assert grown < 100 * MIB, f"the worker holds {grown >> 20} MiB more after the message"
        with conn.lock:  # frames no request within the limit has: each costs the worker an object
            conn.sock.send_multipart([*wire.encode(header), *[b""] * 1000])
            answer = conn._receive(None, 30)
        assert answer["status"] == errors.INVALID_VALUE and "1001 frames" in answer["error"], answer
        assert client.read(ptr, MIB) == b"k" * MIB
        with pytest.raises(CudaError) as info:  # a call no piece of which fits: refused by the client
            client.post("xpuModuleLoad", 0x7C00_0000_2000, bytes(32), memoryview(bytes(17 * MIB)), 17 * MIB)
        assert "--max-request-bytes" in str(info.value), info.value
        assert client.read(ptr, MIB) == b"k" * MIB
    finally:
        client.close()
    assert "Traceback" not in srv.log()


def test_copies_over_the_request_limit_are_split(servers: list[Server], tmp_path: Path, shim: Path) -> None:
    """A 20 MiB copy under a 16 MiB --max-request-bytes once lost the session: the client learns the
    limit at init and splits host-to-device copies (sync, async, unified, 2D) into pieces that fit."""
    srv = launch(servers, tmp_path, "--max-request-bytes", "16M")
    body = """
size = 20 << 20
ctx, ptr = setup(size)
data = os.urandom(size)
out = ctypes.create_string_buffer(size)
check(cu.cuMemcpyHtoD_v2(c_uint64(ptr), data, c_size_t(size)), "cuMemcpyHtoD")
check(cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(size)), "cuMemcpyDtoH")
print("sync", out.raw == data, flush=True)
data = os.urandom(size)
check(cu.cuMemcpyHtoDAsync_v2(c_uint64(ptr), data, c_size_t(size), None), "cuMemcpyHtoDAsync")
check(cu.cuMemcpyDtoHAsync_v2(out, c_uint64(ptr), c_size_t(size), None), "cuMemcpyDtoHAsync")
check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
print("async", out.raw == data, flush=True)
data = os.urandom(size)
check(cu.cuMemcpy(c_uint64(ptr), data, c_size_t(size)), "cuMemcpy")
check(cu.cuMemcpy(out, c_uint64(ptr), c_size_t(size)), "cuMemcpy back")
print("unified", out.raw == data, flush=True)
data = os.urandom(size)
check(cu.cuMemcpyAsync(c_uint64(ptr), data, c_size_t(size), None), "cuMemcpyAsync")
check(cu.cuMemcpyAsync(out, c_uint64(ptr), c_size_t(size), None), "cuMemcpyAsync back")
check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
print("unified async", out.raw == data, flush=True)
for width, height in ((5 << 20, 4), (17 << 20, 1)):  # rows that fit a piece, and a row that does not
    data = os.urandom(width * height)
    params = (c_size_t * 16)(0, 0, 1, ctypes.cast(data, c_void_p).value, 0, 0, width,
                              0, 0, 2, 0, ptr, 0, width, width, height)
    check(cu.cuMemcpy2D_v2(params), "cuMemcpy2D")
    check(cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(width * height)), "cuMemcpyDtoH")
    print("2d", width, out.raw[: width * height] == data, flush=True)
print("after", roundtrip(ptr), flush=True)
"""
    result = subprocess.run(program(body), env=shim_env(shim, srv.address), capture_output=True, text=True,
                            timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for line in ("sync True", "async True", "unified True", "unified async True", f"2d {5 << 20} True",
                 f"2d {17 << 20} True", "after True"):
        assert line in result.stdout, out
    assert "lost the connection" not in out and "Traceback" not in srv.log()


def test_device_memory_is_cleared_between_clients(servers: list[Server], tmp_path: Path) -> None:
    srv = launch(servers, tmp_path)
    a = PyClient(srv.address)
    ptr = a.alloc(4 * MIB)
    a.write(ptr, b"\xa5" * (4 * MIB))
    a.post("cuMemFree_v2", ptr)
    again = a.alloc(4 * MIB)
    assert a.read(again, 4 * MIB) == bytes(4 * MIB), "a reallocation shows the bytes of a freed one"
    a.close()
    b = PyClient(srv.address)
    try:
        assert b.read(b.alloc(4 * MIB), 4 * MIB) == bytes(4 * MIB), "a new client sees an old client's bytes"
    finally:
        b.close()


# ---- cleanup ---------------------------------------------------------------------------------------
# On a GPU it waits on the GPU's nanosecond timer; the sim runs tests/sim_kernels.py's sleep_ms instead.
SLEEP_PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry sleep_ms(.param .u32 ms)
{
    .reg .pred %p;
    .reg .b32 %ms;
    .reg .b64 %now, %end;
    ld.param.u32 %ms, [ms];
    mov.u64 %now, %globaltimer;
    mul.wide.u32 %end, %ms, 1000000;
    add.u64 %end, %end, %now;
WAIT:
    nanosleep.u32 100000;
    mov.u64 %now, %globaltimer;
    setp.lt.u64 %p, %now, %end;
    @%p bra WAIT;
    ret;
}
"""


def start_a_long_call(client: PyClient, seconds: int) -> None:
    """Launch sleep_ms without waiting: the worker (on the sim) or its GPU is busy in one call."""
    module, function = 0x7C00_0000_4000, 0x7C00_0000_4010
    client.post("xpuModuleLoad", module, hashlib.sha256(SLEEP_PTX).digest(), SLEEP_PTX, len(SLEEP_PTX))
    client.post("xpuModuleGetFunction", function, module, "sleep_ms")
    assert client.status_of("cuCtxSynchronize") == errors.SUCCESS
    params = struct.pack("<I", seconds * 1000)
    client.post("xpuLaunchKernel", function, 1, 1, 1, 1, 1, 1, 0, 0, params, len(params), 0)
    client.conn.flush()
    time.sleep(0.5)  # (whether it has begun or not, the worker must not outlive what comes next)


@pytest.mark.parametrize("who", ["daemon", "client"])
def test_a_busy_worker_ends_when_its_daemon_or_client_is_gone(who: str, servers: list[Server],
                                                              tmp_path: Path) -> None:
    """The worker notices in a thread of its own, while its main thread is in a 60 s call (on the sim;
    on a GPU, while the GPU runs a 60 s kernel)."""
    srv = launch(servers, tmp_path)
    client = PyClient(srv.address)
    (worker,) = pids_of_children(srv.process.pid)
    try:
        start_a_long_call(client, 60)
        if who == "daemon":
            srv.process.kill()
        else:
            client.conn.sock.close(0)  # as when the client's process dies
        assert wait_for(lambda: not alive(worker), 15), f"the worker outlived its {who} while busy"
    finally:
        if alive(worker):
            os.kill(worker, signal.SIGKILL)
        if who == "daemon":
            client.close()


COPY_LOOP = """
ctx, ptr = setup(8 << 20)
data = os.urandom(8 << 20)
print("ready", flush=True)
while True:
    check(cu.cuMemcpyHtoD_v2(c_uint64(ptr), data, c_size_t(len(data))), "cuMemcpyHtoD")
"""


def board_directories(daemon: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"xpuremote-sim-{os.getuid()}-{daemon}*"))


# The board directory is how a sim daemon's workers share device memory figures; a GPU has its own.
@pytest.mark.sim_only(reason="the sim's board directory")
def test_the_sim_board_directory_goes_with_its_daemon(servers: list[Server], tmp_path: Path) -> None:
    """Removed when the daemon ends; one left by a daemon killed -9 is removed by the next daemon."""
    killed = launch(servers, tmp_path)
    PyClient(killed.address).alloc(MIB)  # its worker publishes what it holds there
    assert board_directories(killed.process.pid)
    for pid in [*pids_of_children(killed.process.pid), killed.process.pid]:
        os.kill(pid, signal.SIGKILL)
    killed.process.wait(10)
    assert board_directories(killed.process.pid)
    srv = launch(servers, tmp_path)
    assert not board_directories(killed.process.pid), "a dead daemon's board directory stays"
    client = PyClient(srv.address)
    client.alloc(MIB)
    client.close()
    assert board_directories(srv.process.pid)
    srv.stop()
    assert not board_directories(srv.process.pid), "the board directory outlives its daemon"


@pytest.mark.parametrize("how", ["kill -9", "SIGSTOP"])
def test_vanished_client_is_cleaned_up(how: str, shim: Path, servers: list[Server], tmp_path: Path) -> None:
    """kill -9 mid-copy: the worker ends and the memory is released within 5 s. A frozen client
    (SIGSTOP: no FIN, no heartbeat answers): within the 5 s heartbeat timeout plus a second."""
    srv = launch(servers, tmp_path)
    proc, lines = spawn(program(COPY_LOOP), shim_env(shim, srv.address))
    try:
        assert lines.wait("^ready", 30), finish(proc, 1)
        assert wait_for(lambda: any(s["memory"] >= 8 * MIB for s in sessions(srv.address)), 5), sessions(srv.address)
        (worker,) = pids_of_children(srv.process.pid)
        time.sleep(0.3)  # copies in flight
        gone = time.monotonic()
        proc.send_signal(signal.SIGKILL if how == "kill -9" else signal.SIGSTOP)
        limit = 5 if how == "kill -9" else 8
        assert wait_for(lambda: not alive(worker), limit), f"the worker outlived its client by {limit} s"
        assert wait_for(lambda: not sessions(srv.address), 1), sessions(srv.address)
        took = time.monotonic() - gone
        end = re.search(r"session_end .*peak_memory=(\d+) calls=(\d+) errors=(\d+)", srv.log())
        assert end and int(end.group(1)) >= 8 * MIB and int(end.group(2)) > 0, srv.log()
        print(f"{how}: session released {took:.2f} s after the client stopped")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()


# ---- the server goes away ---------------------------------------------------------------------------
IDLE_THEN_CALL = """
ctx, ptr = setup()
assert roundtrip(ptr)
print("ready", flush=True)
sys.stdin.readline()
t = time.monotonic()
rc = cu.cuCtxSynchronize()
print(f"failed {rc} after {time.monotonic() - t:.3f}", flush=True)
"""


def test_server_killed_every_client_fails_fast_and_a_restart_serves(shim: Path, servers: list[Server],
                                                                     tmp_path: Path) -> None:
    """kill -9 of the daemon and its workers: each client's next call fails within 5 s (two are mid
    copy, one idle), none hangs; a server started again on the same address serves new clients."""
    srv = launch(servers, tmp_path)
    busy = [spawn(program("ctx, ptr = setup()\n" + COPY_UNTIL_FAILURE), shim_env(shim, srv.address))
            for _ in range(2)]
    idle = subprocess.Popen(program(IDLE_THEN_CALL), env=shim_env(shim, srv.address), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for proc, lines in busy:
            assert lines.wait("^ready", 30), finish(proc, 1)
        assert idle.stdout.readline().strip() == "ready"
        killed = time.monotonic()
        for pid in [srv.process.pid, *pids_of_children(srv.process.pid)]:
            os.kill(pid, signal.SIGKILL)
        srv.process.wait(5)
        for proc, lines in busy:
            failed = lines.wait("^failed", 10)
            assert failed and failed[0] - killed < 5, f"no failure within 5 s:\n{finish(proc, 1)}"
            stderr = finish(proc, 5)
            assert srv.address in stderr and "lost the connection" in stderr, stderr
        idle.stdin.write("go\n")
        idle.stdin.flush()
        out, err = idle.communicate(timeout=10)
        m = re.search(r"failed (\d+) after ([\d.]+)", out)
        assert m and int(m.group(1)) != 0 and float(m.group(2)) < 5, out + err
        assert srv.address in err, err

        again = launch(servers, tmp_path, address=srv.address)
        client = PyClient(again.address)
        ptr = client.alloc(MIB)
        client.write(ptr, b"r" * MIB)
        assert client.read(ptr, MIB) == b"r" * MIB
        client.close()
    finally:
        for proc in [p for p, _ in busy] + [idle]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


GRACEFUL = """
ctx, ptr = setup(1 << 20)
out = ctypes.create_string_buffer(1 << 20)
print("ready", flush=True)
n = 0
while True:
    data = bytes([n & 0xFF]) * (1 << 20)
    rc = cu.cuMemcpyHtoD_v2(c_uint64(ptr), data, c_size_t(1 << 20))
    if rc == 0:
        rc = cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(1 << 20))
    if rc:
        print(f"stopped {rc} after {n} good copies", flush=True)
        break
    if out.raw != data:
        print("CORRUPT", flush=True)
        break
    n += 1
"""


def test_sigterm_shuts_down_gracefully(shim: Path, servers: list[Server], tmp_path: Path) -> None:
    """SIGTERM: no new sessions; the batch in flight finishes; each client is told the server is
    shutting down (its next call fails with CUDA_ERROR_DEINITIALIZED and says so); the server exits 0."""
    srv = launch(servers, tmp_path)
    clients = [spawn(program(GRACEFUL), shim_env(shim, srv.address)) for _ in range(2)]
    try:
        for proc, lines in clients:
            assert lines.wait("^ready", 30), finish(proc, 1)
        time.sleep(0.5)
        srv.process.send_signal(signal.SIGTERM)
        assert srv.process.wait(15) == 0, srv.log()
        for proc, lines in clients:
            stopped = lines.wait("^stopped|CORRUPT", 10)
            assert stopped and "CORRUPT" not in stopped[1], finish(proc, 1)
            assert int(stopped[1].split()[1]) == errors.DEINITIALIZED, stopped[1]
            stderr = finish(proc, 5)
            assert "shutting down" in stderr and srv.address in stderr, stderr
        log = srv.log()
        assert "shutdown sessions=2" in log and log.count("session_end") == 2, log
        assert "Traceback" not in log and "killing it" not in log, log
    finally:
        for proc, _ in clients:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with pytest.raises(CudaError):
        PyClient(srv.address, timeout_s=1)  # nobody accepts new sessions


# ---- operability -----------------------------------------------------------------------------------
def test_status_metrics_and_session_log_lines(servers: list[Server], tmp_path: Path) -> None:
    port = free_port()
    srv = launch(servers, tmp_path, "--metrics-port", str(port))
    client = PyClient(srv.address)
    try:
        ptr = client.alloc(3 * MIB)
        client.write(ptr, b"s" * (3 * MIB))
        client.status_of("cuMemFree_v2", 0x1234)  # one error
        session = client.conn.session
        assert wait_for(lambda: any(s["memory"] == 3 * MIB and s["errors"] == 1 for s in sessions(srv.address)), 5)

        out = subprocess.run([sys.executable, "-m", "xpuremote.server.daemon", "status", "--listen", srv.address],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        row = next(line for line in out.stdout.splitlines() if line.startswith(session))
        assert "3.0 MiB" in row and f":{os.getpid()}" in row, out.stdout
        assert DEVICE_NAME in out.stdout, out.stdout

        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        memory = re.search(rf'xpu_session_memory_bytes{{session="{session}",[^}}]*}} (\d+)', text)
        assert memory and int(memory.group(1)) == 3 * MIB, text
        assert re.search(rf'xpu_session_errors_total{{session="{session}",[^}}]*}} 1\b', text), text
        calls = re.search(rf'xpu_session_calls_total{{session="{session}",[^}}]*}} (\d+)', text)
        assert calls and int(calls.group(1)) >= 3, text
        assert "xpu_sessions 1" in text and "xpu_sessions_started_total 1" in text, text
    finally:
        client.close()
    assert wait_for(lambda: "session_end" in srv.log(), 5), srv.log()
    start = re.search(rf"session_start session={session} user=\S+ host=\S+ pid={os.getpid()} ", srv.log())
    end = re.search(rf"session_end session={session} user=\S+ host=\S+ pid={os.getpid()} key=- duration_s=\S+ "
                    rf"peak_memory={3 * MIB} calls=\d+ errors=1 exit=0", srv.log())
    assert start and end, srv.log()


def test_status_of_a_server_that_is_not_there() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-m", "xpuremote.server.daemon", "status", "--listen", address,
                          "--timeout", "1"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and address in out.stderr, out.stderr


def scrape(port: int, host: str = "127.0.0.1", token: str | None = None) -> int:
    """The HTTP status of GET /metrics."""
    request = urllib.request.Request(f"http://{host}:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert b"xpu_sessions" in answer.read()
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_metrics_need_the_bearer_token_when_one_is_set(servers: list[Server], tmp_path: Path) -> None:
    token_file = tmp_path / "metrics.token"
    token_file.write_text("s3cret-Token\n")
    port = free_port()
    srv = launch(servers, tmp_path, "--metrics-port", str(port), "--metrics-token", str(token_file))
    assert scrape(port) == 401 and scrape(port, token="wrong") == 401
    assert scrape(port, token="s3cret-Token") == 200
    assert "without the bearer token" in srv.log()


def test_metrics_listen_on_loopback_unless_told(servers: list[Server], tmp_path: Path) -> None:
    port = free_port()
    srv = launch(servers, tmp_path, "--metrics-port", str(port), address=f"tcp://127.0.0.3:{free_port()}")
    assert f"metrics on http://127.0.0.1:{port}/metrics" in srv.log()  # not the daemon's own address
    port = free_port()
    launch(servers, tmp_path, "--metrics-port", str(port), "--metrics-bind", "127.0.0.2")
    assert scrape(port, host="127.0.0.2") == 200
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_garbage_to_the_metrics_port_and_unknown_paths(servers: list[Server], tmp_path: Path) -> None:
    port = free_port()
    srv = launch(servers, tmp_path, "--metrics-port", str(port))
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/nothing", timeout=5)
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(srv.address)
        sock.send_multipart(wire.encode({"op": "status"}))
        assert sock.poll(5000)
        answer = wire.decode(sock.recv_multipart())
        assert answer["status"] == 0 and answer["sessions"] == [] and answer["devices"], answer
    finally:
        ctx.destroy(0)
