"""The data connection (server/data.py, client/data.py): the bytes of large copies the application waits
for travel on a plain TCP stream beside ZeroMQ, straight from and into where they belong."""

from __future__ import annotations

import getpass
import os
import re
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq
from conftest import Server, shim_env, start_chain, start_server
from pyclient import PyClient, rss, sessions, wait_for
from test_faults import program

from xpuremote.client import connection
from xpuremote.client.connection import Connection
from xpuremote.protocol import errors, wire
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.link import NO_LINK

MIB = 1 << 20
SIZE = 8 * MIB + 4097  # over client/data.py's DATA_MIN; the cuda backend's pieces (cuda_upload.py), the last short
CTX = 0x7C00_0000_1000

COPIES = """
size, small = SIZE, 512 << 10
ctx, ptr = setup(size)
out = ctypes.create_string_buffer(size)
def both_ways(put, get, n=size, sync=False):
    data = os.urandom(n)
    check(put(data, n), "to the device")
    check(get(n), "to the host")
    if sync:
        check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    return out.raw[:n] == data
print("sync", both_ways(lambda d, n: cu.cuMemcpyHtoD_v2(c_uint64(ptr), d, c_size_t(n)),
                        lambda n: cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(n))), flush=True)
print("pageable async", both_ways(lambda d, n: cu.cuMemcpyHtoDAsync_v2(c_uint64(ptr), d, c_size_t(n), None),
                                  lambda n: cu.cuMemcpyDtoHAsync_v2(out, c_uint64(ptr), c_size_t(n), None),
                                  sync=True), flush=True)
print("unified", both_ways(lambda d, n: cu.cuMemcpy(c_uint64(ptr), d, c_size_t(n)),
                           lambda n: cu.cuMemcpy(out, c_uint64(ptr), c_size_t(n))), flush=True)
print("unified async", both_ways(lambda d, n: cu.cuMemcpyAsync(c_uint64(ptr), d, c_size_t(n), None),
                                 lambda n: cu.cuMemcpyAsync(out, c_uint64(ptr), c_size_t(n), None),
                                 sync=True), flush=True)
print("small", both_ways(lambda d, n: cu.cuMemcpyHtoD_v2(c_uint64(ptr), d, c_size_t(n)),
                         lambda n: cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(n)), small), flush=True)
pinned = c_void_p()
check(cu.cuMemAllocHost_v2(byref(pinned), c_size_t(size)), "cuMemAllocHost")
ctypes.memmove(pinned, os.urandom(size), size)
check(cu.cuMemcpyHtoDAsync_v2(c_uint64(ptr), pinned, c_size_t(size), None), "pinned cuMemcpyHtoDAsync")
check(cu.cuMemcpyDtoHAsync_v2(out, c_uint64(ptr), c_size_t(size), None), "cuMemcpyDtoHAsync")
check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
print("pinned", out.raw == ctypes.string_at(pinned, size), flush=True)
""".replace("SIZE", str(SIZE))
# on the data connection: 2 copies each of the sync, pageable, unified and unified async pairs, and the pinned
# pair's device-to-host copy (into pageable memory); the small pair and the pinned host-to-device copy go in messages
BY_DATA = 9 * SIZE


@pytest.mark.parametrize("wanted, backend, spin_us", [
    ("1", "sim", "0"), ("0", "sim", "0"), ("1", "sim", "2000"),
    pytest.param("1", "cuda", "0", marks=pytest.mark.sim_only(reason="the cuda backend on a stand-in libcuda"))],
    ids=["data-connection", "XPU_DATA_CONNECTION=0", "both ends spinning", "cuda backend"])
def test_large_copies_go_on_the_data_connection(wanted: str, backend: str, spin_us: str, shim: Path,
                                                tmp_path: Path) -> None:
    """On the cuda backend an input goes to the GPU in pieces through page-locked buffers (cuda_upload.py).
    Spinning (protocol/spin.py): the client's waits and the worker's look for a message before they block."""
    if backend == "cuda":
        srv, inner = start_chain(tmp_path, shim)
    else:
        srv, inner = start_server(tmp_path, args=("--spin-us", spin_us)), None
    try:
        env = shim_env(shim, srv.address, XPU_DATA_CONNECTION=wanted, XPU_SPIN_US=spin_us)
        result = subprocess.run(program(COPIES), env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        for line in ("sync", "pageable async", "unified", "unified async", "small", "pinned"):
            assert f"{line} True" in result.stdout, result.stdout + result.stderr
        assert wait_for(lambda: "bytes on the data connection" in srv.log(), 10), srv.log()[-2000:]
        moved = int(re.search(r"(\d+) bytes on the data connection", srv.log()).group(1))
        assert moved == (BY_DATA if wanted == "1" else 0), (moved, BY_DATA)
        assert ("data connection open" in srv.log()) == (wanted == "1")
        assert "Traceback" not in srv.log()
        if backend == "sim":  # the worker was told how long to spin
            said = rf"session \S+: waits on the data connection spin up to {spin_us} µs"
            assert re.search(said, srv.log()), srv.log()[-2000:]
        if inner is not None:  # the pieces went from page-locked memory, so the stand-in libcuda sends them
            # in messages; on its own data connection: the 5 device-to-host copies, and the pinned pair's
            # host-to-device copy, which reached the cuda backend in a message (9 more without the pieces)
            assert wait_for(lambda: "bytes on the data connection" in inner.log(), 10), inner.log()[-2000:]
            stand_in = int(re.search(r"(\d+) bytes on the data connection", inner.log()).group(1))
            assert stand_in == 6 * SIZE, (stand_in, 6 * SIZE)
    finally:
        srv.stop()
        if inner is not None:
            inner.stop()


class RawSession:
    """A session spoken to in the wire format itself, with its data connection, to send what a client
    library never would."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        hello = self.ctx.socket(zmq.DEALER)
        hello.connect(address)
        hello.send_multipart(wire.encode({"op": "hello", "client": {"pid": os.getpid(), "host": "test",
                                                                    "user": getpass.getuser()}}))
        assert hello.poll(10_000), "no answer to hello"
        answer = wire.decode(hello.recv_multipart())
        hello.close(0)
        self.key, self.session = answer["key"], answer["session"]
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.ROUTING_ID, wire.routing_id(self.key))
        self.sock.connect(answer["worker"])
        self.host = answer["worker"].removeprefix("tcp://").rsplit(":", 1)[0]
        self.zmq_seq = 0  # the last batch on ZeroMQ: a message on the data connection comes after it
        self.port = self.request({"op": "init", "link": NO_LINK.to_wire()})["data_port"]
        self.data: socket.socket | None = None
        self.seq = 0

    def request(self, header: dict) -> dict:
        self.sock.send_multipart(wire.encode(header))
        assert self.sock.poll(20_000), f"no answer to {header['op']}"
        return wire.decode(self.sock.recv_multipart(), lambda size, asked: wire.Data(size=size))

    def connect_data(self, key: bytes | None = None) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=10)
        sock.sendall(key if key is not None else self.key)
        return sock

    def calls(self, *calls: list, reply: bool | None = True, data: bytes = b"", stream: bool | None = None) -> dict:
        """A batch, sent on the data connection (as the client sends a batch it waits for, once the connection
        is open) unless `stream` says otherwise; answered where it went, if `reply` (None: a reply batch whose
        answer the caller reads itself)."""
        self.seq += 1
        header = {"op": "calls", "seq": self.seq, "calls": list(calls), "reply": reply is not False}
        if stream is None:
            stream = self.data is not None and reply
        if not stream:
            self.sock.send_multipart(wire.encode(header))
            self.zmq_seq = self.seq
            if not reply:
                return {}
            assert self.sock.poll(20_000), "no answer"
            return wire.decode(self.sock.recv_multipart())
        wire.send_buffers(self.data, wire.stream_buffers(wire.encode({**header, "after": self.zmq_seq})))
        if data:
            self.data.sendall(data)
        return self.answer_on_stream() if reply is not None else {}

    def answer_on_stream(self) -> dict:
        count, size = wire.STREAM_HEAD.unpack(self.receive(wire.STREAM_HEAD.size))
        frames = wire.stream_frames(count, memoryview(self.receive(size)))
        return wire.decode(frames, lambda size, asked: wire.Data(size=size))

    def receive(self, size: int) -> bytes:
        got = bytearray()
        while len(got) < size:
            chunk = self.data.recv(size - len(got))
            assert chunk, "the data connection ended early"
            got += chunk
        return bytes(got)

    def close(self) -> None:
        if self.data is not None:
            self.data.close()
        self.ctx.destroy(0)


def op(symbol: str, *args: object) -> list:
    return [CALLS[symbol].opcode, list(args)]


@pytest.fixture
def raw(tmp_path: Path):
    srv = start_server(tmp_path)
    session = RawSession(srv.address)
    yield srv, session
    session.close()
    srv.stop()


def test_strangers_on_the_data_port_are_refused_and_the_client_gets_in(raw: tuple[Server, RawSession]) -> None:
    """Connections that present no key, or a wrong one, before the client's own: closed and logged; the
    client's is taken, and the port closes behind it."""
    srv, s = raw
    wrong = s.connect_data(bytes(wire.KEY_BYTES))
    silent = s.connect_data(b"")
    s.data = s.connect_data()
    assert s.request({"op": "data"})["status"] == 0
    assert srv.log().count("did not present the session's key") == 2, srv.log()[-2000:]
    for stranger in (wrong, silent):
        stranger.settimeout(5)
        assert stranger.recv(1) == b""  # closed by the worker
        stranger.close()
    with pytest.raises(OSError):
        s.connect_data()  # nobody listens any more
    answer = s.request({"op": "data"})  # and asking twice is refused
    assert answer["status"] == errors.INVALID_VALUE and "no data connection" in answer["error"], answer


def _open(s: RawSession, size: int) -> int:
    """The data connection open, a context and an allocation of `size`: its address."""
    s.data = s.connect_data()
    assert s.request({"op": "data"})["status"] == 0
    answer = s.calls(op("cuCtxCreate_v2", CTX, 0, 0), op("cuMemAlloc_v2", 8, size))
    assert answer["status"] == 0, answer
    return int.from_bytes(answer["outs"][0], "little")


def _round_trip(s: RawSession, ptr: int, data: bytes) -> bytes:
    answer = s.calls(op("cuMemcpyHtoD_v2", ptr, wire.Data(size=len(data)), len(data)), data=data)
    assert answer["status"] == 0, answer
    asked = wire.Data(size=len(data), asked=True)
    answer = s.calls(op("cuMemcpyDtoH_v2", asked, ptr, len(data)))
    assert answer["status"] == 0 and type(answer["outs"][0]) is wire.Data, answer
    return s.receive(answer["outs"][0].size)


def test_bad_uses_of_the_data_connection_fail_the_call_and_keep_the_stream_in_line(
        raw: tuple[Server, RawSession]) -> None:
    srv, s = raw
    size = 2 * MIB
    ptr = _open(s, size)
    data = os.urandom(size)
    assert _round_trip(s, ptr, data) == data
    # bytes for a call that may not take them, and bytes that do not match the copy's size: refused, and the
    # bytes sent for them read and dropped, so the next copy's bytes are its own
    for call in (op("xpuModuleLoad", bytes(32), wire.Data(size=4096), 4096),
                 op("cuMemcpyHtoD_v2", ptr, wire.Data(size=4096), 8)):
        answer = s.calls(call, data=os.urandom(4096))
        assert answer["status"] == errors.INVALID_VALUE, answer
    # an output asked for on the data connection by a call nobody waits for: deferred as a failure
    answer = s.calls(op("cuMemcpyDtoH_v2", wire.Data(size=64, asked=True), ptr, 64), op("cuCtxSynchronize"))
    assert answer["deferred"] and "answered copy only" in answer["deferred"][0][2], answer
    # bytes on the data connection follow only a message sent there, and only a batch to be answered goes there
    answer = s.calls(op("cuMemcpyDtoH_v2", wire.Data(size=64, asked=True), ptr, 64), stream=False)
    assert answer["status"] == errors.INVALID_VALUE and "may not make" in answer["error"], answer
    answer = s.calls(op("cuMemsetD8_v2", ptr, 1, 8), reply=False, stream=True)
    assert answer["status"] == errors.INVALID_VALUE and "only a batch to be answered" in answer["error"], answer
    data = os.urandom(size)
    assert _round_trip(s, ptr, data) == data
    # garbage in a message on the stream, and frame lengths that do not add up to the body: each answered
    # there with an error, the stream still in line
    s.data.sendall(wire.STREAM_HEAD.pack(1, 8 + 5) + (5).to_bytes(8, "little") + b"\xc1junk")
    answer = s.answer_on_stream()
    assert answer["status"] == errors.INVALID_VALUE and "undecodable" in answer["error"], answer
    s.data.sendall(wire.STREAM_HEAD.pack(2, 16 + 4) + (9).to_bytes(8, "little") + (1).to_bytes(8, "little") + b"abcd")
    answer = s.answer_on_stream()
    assert answer["status"] == errors.INVALID_VALUE and "longer than its body" in answer["error"], answer
    # a copy into memory that is not the session's: refused before a byte lands, the bytes dropped
    answer = s.calls(op("cuMemcpyHtoD_v2", ptr + size, wire.Data(size=4096), 4096), data=bytes(4096))
    assert answer["status"] == errors.INVALID_VALUE, answer
    assert _round_trip(s, ptr, data[:4096]) == data[:4096]
    # two inputs in one message: the stream is given up, the session goes on over ZeroMQ
    two = [op("cuMemcpyHtoD_v2", ptr, wire.Data(size=8), 8), op("cuMemcpyHtoD_v2", ptr, wire.Data(size=8), 8)]
    s.calls(*two, data=bytes(16), stream=True, reply=None)
    s.data.settimeout(10)
    assert s.data.recv(1) == b""  # closed by the worker, which answers on ZeroMQ instead
    s.data = None
    assert s.sock.poll(20_000), "no answer"
    answer = wire.decode(s.sock.recv_multipart())
    assert answer["status"] == errors.INVALID_VALUE and "two values" in answer["error"], answer
    answer = s.calls(op("cuMemcpyHtoD_v2", ptr, wire.Data(size=8), 8))
    assert answer["status"] == errors.INVALID_VALUE and "may not make" in answer["error"], answer
    answer = s.calls(op("cuMemcpyHtoD_v2", ptr, b"in-frame", 8))
    assert answer["status"] == 0, answer
    answer = s.calls(op("cuMemcpyDtoH_v2", 8, ptr, 8))
    assert bytes(answer["outs"][0]) == b"in-frame", answer
    assert "Traceback" not in srv.log()


def test_messages_that_come_in_one_read_are_each_served_in_order(raw: tuple[Server, RawSession]) -> None:
    """The worker reads ahead: a message and an input that follows it, or two messages, may come in one read.
    Each is served as if it had come alone, though the second leaves the socket with nothing to poll."""
    srv, s = raw
    ptr = _open(s, 64)
    batches = []
    for i, value in enumerate((b"first-00", b"second-0")):
        s.seq += 1
        header = {"op": "calls", "seq": s.seq, "reply": True, "after": s.zmq_seq,
                  "calls": [op("cuMemcpyHtoD_v2", ptr + 8 * i, wire.Data(size=8), 8)]}
        batches.append(b"".join(bytes(b) for b in wire.stream_buffers(wire.encode(header))) + value)
    s.data.sendall(b"".join(batches))  # the second message and both inputs behind the first message's head
    assert [s.answer_on_stream()["status"] for _ in batches] == [0, 0]
    assert bytes(s.calls(op("cuMemcpyDtoH_v2", 16, ptr, 16))["outs"][0]) == b"first-00second-0"
    assert "Traceback" not in srv.log(), srv.log()[-3000:]


def test_a_data_connection_that_ends_in_the_middle_of_a_copy_fails_only_that_copy(
        raw: tuple[Server, RawSession]) -> None:
    srv, s = raw
    ptr = _open(s, 4 * MIB)
    message = {"op": "calls", "seq": 9, "reply": True, "after": s.zmq_seq,
               "calls": [op("cuMemcpyHtoD_v2", ptr, wire.Data(size=4 * MIB), 4 * MIB)]}
    wire.send_buffers(s.data, wire.stream_buffers(wire.encode(message)))
    s.data.sendall(bytes(MIB))  # a quarter of the bytes, then the stream ends
    s.data.close()
    s.data = None
    assert s.sock.poll(20_000), "no answer"  # on ZeroMQ: the stream is gone
    answer = wire.decode(s.sock.recv_multipart())
    assert answer["status"] == errors.INVALID_VALUE and answer["seq"] == 9, answer
    assert "the client closed it" in srv.log(), srv.log()[-2000:]
    answer = s.calls(op("cuMemcpyHtoD_v2", ptr, b"in-frame", 8))  # the session goes on over ZeroMQ
    assert answer["status"] == 0, answer
    assert bytes(s.calls(op("cuMemcpyDtoH_v2", 8, ptr, 8))["outs"][0]) == b"in-frame"
    assert "Traceback" not in srv.log(), srv.log()[-3000:]


def test_calls_waited_for_go_on_the_stream_in_order_with_the_batches_before_them(tmp_path: Path) -> None:
    """Each memset goes out on ZeroMQ, the copy that reads it back right after on the data connection: the
    worker serves the copy only after the batch it came after, however the two connections race."""
    srv = start_server(tmp_path)
    client = PyClient(srv.address)
    try:
        assert client.conn.data is not None
        ptr = client.alloc(64)
        for i in range(1000):
            client.post("cuMemsetD8Async", ptr, i & 0xFF, 64, 0)
            client.conn.flush()
            assert client.read(ptr, 64) == bytes([i & 0xFF]) * 64, i
        client.close()
        assert wait_for(lambda: "messages there" in srv.log(), 10), srv.log()[-2000:]
        assert int(re.search(r"(\d+) messages there", srv.log()).group(1)) >= 1000, srv.log()[-2000:]
    finally:
        srv.stop()


def _send_half_then_end(conn: Connection) -> Callable[[list[wire.Data]], None]:
    """Fault injection (the client's own stream failing mid-copy, which nothing outside can cause on
    loopback): half of the input's bytes, then the stream ends."""
    def send(values: list[wire.Data]) -> None:
        conn.data.sendall(memoryview(values[0].buffer)[: len(values[0].buffer) // 2])
        conn.data.shutdown(socket.SHUT_WR)
    return send


def test_a_stream_lost_in_a_call_fails_that_call_and_the_session_goes_on_over_zeromq(tmp_path: Path) -> None:
    srv = start_server(tmp_path)
    client = PyClient(srv.address)
    try:
        ptr = client.alloc(2 * MIB)
        data = os.urandom(2 * MIB)
        client.conn._send_data = _send_half_then_end(client.conn)
        status, _, _ = client.conn.call(CALLS["cuMemcpyHtoD_v2"], [ptr, wire.Data(data), len(data)], CTX,
                                        by_data=True)
        assert status == errors.INVALID_VALUE  # the worker's answer, which came on ZeroMQ
        assert client.conn.data is None and "data connection lost" in srv.log(), srv.log()[-2000:]
        client.write(ptr, b"in-frame")
        assert client.read(ptr, 8) == b"in-frame"
        # the next large copy goes in messages
        client.conn.call(CALLS["cuMemcpyHtoD_v2"], [ptr, wire.Data(data), len(data)], CTX, by_data=True)
        assert client.read(ptr, len(data)) == data
        assert "Traceback" not in srv.log(), srv.log()[-3000:]
    finally:
        client.close()
        srv.stop()


@pytest.mark.parametrize("limit, declared", [("1M", MIB + wire.HEADER_ALLOWANCE + 1), (None, 6 << 30)],
                         ids=["over --max-request-bytes", "6 GiB without a limit"])
def test_a_head_that_declares_more_than_the_session_may_send_ends_it(limit: str | None, declared: int,
                                                                      tmp_path: Path) -> None:
    """Twelve bytes that declare a message no client of ours sends (it splits copies to the limit, and without one
    sends a message over stream.MESSAGE_MAX on ZeroMQ): the worker takes no memory for it, tells the client why,
    logs it and ends the session. It used to allocate and zero-fill what the head declared (6 GiB: resident
    memory rising past 2.7 GiB), or, over the limit, wait for the bytes to drop them."""
    srv = start_server(tmp_path, args=("--max-request-bytes", limit) if limit else ())
    s = RawSession(srv.address)
    try:
        _open(s, 8)
        worker = _worker_of(srv, s)
        before = rss(worker)
        s.data.sendall(wire.STREAM_HEAD.pack(1, declared))
        peak = _peak_rss_until_gone(worker, before + 64 * MIB, 10)
        assert peak - before < 64 * MIB, f"the worker took {(peak - before) >> 20} MiB for a head"
        assert not _alive(worker), "the session was not ended"
        assert s.sock.poll(5_000), "no notice"
        notice = wire.decode(s.sock.recv_multipart())
        assert notice["op"] == "closing" and f"declared {declared} bytes" in notice["error"], notice
        assert re.search(rf"session {s.session}: ending it: a message on the data connection declared {declared}",
                         srv.log()), srv.log()[-2000:]
        assert "Traceback" not in srv.log(), srv.log()[-3000:]
    finally:
        s.close()
        srv.stop()


def test_a_message_takes_memory_only_as_its_bytes_arrive(tmp_path: Path) -> None:
    """Under --max-request-bytes 1G, a head that declares 1 GiB, then its bytes 8 MiB at a time: the worker holds
    what arrived (and a page or a chunk more), not what was declared. Three such heads took 3.2 GiB in 4 s, held
    for the stall timeout. The client then closes the stream: the memory is given back, the session goes on."""
    srv = start_server(tmp_path, args=("--max-request-bytes", "1G"))
    s = RawSession(srv.address)
    try:
        ptr = _open(s, 8)
        worker = _worker_of(srv, s)
        before = rss(worker)
        s.data.sendall(wire.STREAM_HEAD.pack(1, 1 << 30))
        for sent in (8 * MIB, 16 * MIB, 24 * MIB):
            s.data.sendall(os.urandom(8 * MIB))
            wait_for(lambda got=sent: rss(worker) - before >= got - 2 * MIB, 10)  # read by the worker meanwhile
            grown = rss(worker) - before
            assert grown <= sent + 16 * MIB, f"{grown >> 20} MiB held after {sent >> 20} MiB arrived"
        s.data.close()
        s.data = None
        assert s.sock.poll(20_000), "no answer"  # on ZeroMQ: the stream is gone
        answer = wire.decode(s.sock.recv_multipart())
        assert answer["status"] == errors.INVALID_VALUE and "the client closed it" in answer["error"], answer
        assert wait_for(lambda: rss(worker) - before < 16 * MIB, 10), f"{(rss(worker) - before) >> 20} MiB kept"
        assert s.calls(op("cuMemcpyHtoD_v2", ptr, b"in-frame", 8))["status"] == 0
        assert bytes(s.calls(op("cuMemcpyDtoH_v2", 8, ptr, 8))["outs"][0]) == b"in-frame"
        assert "Traceback" not in srv.log(), srv.log()[-3000:]
    finally:
        s.close()
        srv.stop()


def test_a_message_larger_than_a_head_may_declare_goes_on_zeromq(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The client sends a message over what the worker takes on the data connection (stream.MESSAGE_MAX without a
    request limit, here made 1 MiB) on ZeroMQ, the data connection kept for the next ones."""
    monkeypatch.setattr(connection, "message_bound", lambda limit, allowance: MIB)
    srv = start_server(tmp_path)
    client = PyClient(srv.address)
    try:
        ptr = client.alloc(2 * MIB)
        data = os.urandom(2 * MIB)
        client.write(ptr, data)  # 2 MiB in the message
        assert not client.conn.streamed and client.conn.data is not None
        assert client.read(ptr, len(data)) == data and client.conn.streamed  # the answer is a frame of 2 MiB
        client.close()
        assert wait_for(lambda: "messages there" in srv.log(), 10), srv.log()[-2000:]
        assert "data connection lost" not in srv.log() and "Traceback" not in srv.log(), srv.log()[-3000:]
    finally:
        srv.stop()


def _worker_of(srv: Server, s: RawSession) -> int:
    return next(w["worker_pid"] for w in sessions(srv.address) if w["session"] == s.session)


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _peak_rss_until_gone(pid: int, bound: int, timeout_s: float) -> int:
    """The process's largest resident memory, sampled until it ends, passes `bound`, or `timeout_s` passes."""
    peak, deadline = 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline and _alive(pid) and peak <= bound:
        try:
            peak = max(peak, rss(pid))
        except FileNotFoundError:
            break
        time.sleep(0.01)
    return peak
