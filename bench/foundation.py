"""Foundation benchmark: what the shim costs over the bare transport, on the sim backend (or a GPU).

    python bench/foundation.py [--out bench/results/foundation-sim.json] [--quick] [--profile DIR]
                               [--curve off|on|both] [--backend sim|cuda]

Starts its own `xpu-server --backend sim` (or cuda) and a raw pyzmq echo server on loopback, and two
long-lived agent processes:

  shim agent  Python with the shim preloaded (LD_PRELOAD, LD_LIBRARY_PATH, XPU_SERVER, as
              `xpu-run` sets them), calling the driver entry points through ctypes;
  raw agent   the same traffic with bare pyzmq + msgpack (DEALER -> ROUTER echo, same tcp
              loopback transport, same header shapes), the floor any remoting layer stands on.

A third agent, the shim again with a second server, makes the sync calls with neither end spinning
before it blocks (XPU_SPIN_US=0, --spin-us 0; protocol/spin.py): what the spin is worth, beside it.
A fourth, in a run without --curve, is the shim in a keyed session of a third server (CURVE, its data
connection sealed: protocol/stream.py): its sync calls and copies are rows of their own, beside the plain
session's in the same run (aims: 1.15x the plain sync call at most, 0.8x the plain copies at least).

The parent interleaves the two agents' repeats, so that load drift hits both alike, and prints
each figure beside its baseline:

  1. sync latency     cuCtxSynchronize x N            vs  msgpack header echoed by the echo server
  2. async throughput cuMemsetD8Async (256 B) x N,    vs  the same calls batched as the client batches
                      then one cuStreamSynchronize        them (MAX_BATCH_CALLS), never answered, then
                                                          one echo; and one message per call
  3. bulk copies      cuMemcpyHtoD_v2 / DtoH_v2       vs  the same bytes as one frame, acknowledged (H2D)
                      of 64 MiB                           or sent back by the echo server (D2H); also
                                                          beside: the same bytes over a bare TCP socket,
                                                          read straight into a buffer (the floor of a
                                                          data connection; not with CURVE)

With --curve on, every connection is encrypted with CURVE (the sim server with --key and
--allowed-keys, the shim with XPU_CLIENT_KEY/XPU_SERVER_KEY, the echo server and raw agent with
the same keys); --curve both runs the whole benchmark without, then with, and adds a table
of the figures side by side.

Medians over the repeats; results as JSON and Markdown with --out. With --profile DIR, every
phase is also run once under cProfile inside the shim agent, and the server's per-call work is
profiled in-process (session.Session on the sim backend); the top entries are printed and the
.pstats files left in DIR.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from itertools import repeat
from pathlib import Path
from typing import Any

# the shim's batching limit and the header shapes the client sends, from the client itself
from xpuremote.client.connection import MAX_BATCH_CALLS
from xpuremote.protocol import wire
from xpuremote.protocol.calls import CALLS

ROOT = Path(__file__).resolve().parent.parent
# the PyTorch interpreter of the benchmarks that run PyTorch: `make torch`'s venv, or XPU_TORCH_PYTHON's
TORCH_PYTHON = Path(os.environ.get("XPU_TORCH_PYTHON") or ROOT / ".venv-torch" / "bin" / "python")
MIB = 1 << 20
SMALL = 256  # bytes of the memset buffer
SHARE_CTX = 0x7C00_0000_1000  # the context the in-process session makes, as a client names one
TAG = "@@ "  # agents' answer lines start with this; anything else on their stdout is passed through



# ---- the raw echo server ------------------------------------------------------------------------
# A message is [header, *bulk]; the header's first byte says what to do with it:
#   E echo every frame back   N answer nothing   A echo the header only (an ack)
#   D echo the header plus `size` bytes (msgpack {"size": n} after the mode byte)   Q quit
def echo_server() -> int:
    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    keys = curve_keys("server")
    if keys:
        sock.curve_server, (sock.curve_publickey, sock.curve_secretkey) = True, keys
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    tcp = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=tcp_echo, args=(tcp,), daemon=True).start()
    print(f"endpoint tcp://127.0.0.1:{port}\ntcp-port {tcp.getsockname()[1]}", flush=True)
    blobs: dict[int, bytes] = {}
    while True:
        frames = sock.recv_multipart(copy=False)
        mode = frames[1].buffer[0]
        if mode == 0x45:  # E
            sock.send_multipart(frames, copy=False)
        elif mode == 0x4E:  # N
            pass
        elif mode == 0x41:  # A
            sock.send_multipart(frames[:2], copy=False)
        elif mode == 0x44:  # D
            size = msgpack.unpackb(frames[1].buffer[1:])["size"]
            if size not in blobs:
                blobs[size] = os.urandom(size)
            sock.send_multipart([frames[0], frames[1], blobs[size]], copy=False)
        elif mode == 0x51:  # Q
            sock.send_multipart(frames, copy=False)
            break
        del frames  # as the worker does: a 64 MiB message is freed now, not when the next one comes
    sock.close(0)
    ctx.term()
    return 0


def tcp_echo(listener: socket.socket) -> None:
    """The bare-TCP baseline's server: `U` + size: read that many bytes, answer one byte; `D` + size: send
    that many bytes; `M` + size: a msgpack message of that many bytes, echoed as the ZeroMQ echo does
    (decoded and packed again), after its size."""
    import msgpack

    blobs: dict[int, bytes] = {}
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = memoryview(bytearray(0))
        while head := conn.recv(9, socket.MSG_WAITALL):
            size = int.from_bytes(head[1:], "little")
            if head[:1] == b"M":
                answer = msgpack.packb(msgpack.unpackb(conn.recv(size, socket.MSG_WAITALL)))
                conn.sendall(len(answer).to_bytes(8, "little") + answer)
            elif head[:1] == b"U":
                if len(buf) < size:
                    buf = memoryview(bytearray(size))
                _recv_into(conn, buf[:size])
                conn.sendall(b"k")
            else:
                if size not in blobs:
                    blobs[size] = os.urandom(size)
                conn.sendall(blobs[size])
        conn.close()


def _recv_into(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        got += conn.recv_into(view[got:], len(view) - got)


def curve_keys(name: str) -> tuple[bytes, bytes] | None:
    """(public, secret) of NAME in XPU_BENCH_KEYS (the run's key directory), or None: plain TCP."""
    import zmq.auth

    folder = os.environ.get("XPU_BENCH_KEYS")
    return zmq.auth.load_certificate(os.path.join(folder, f"{name}.key_secret")) if folder else None


def make_keys(folder: Path) -> dict[str, str]:
    """Server and client keys for a CURVE run; the environment that names them to the agents."""
    from xpuremote.server.auth import keygen

    for name in ("server", "client"):
        keygen(str(folder), name)
    (folder / "allowed").mkdir()
    (folder / "allowed" / "client.key").write_bytes((folder / "client.key").read_bytes())
    return {"XPU_BENCH_KEYS": str(folder), "XPU_CLIENT_KEY": str(folder / "client.key_secret"),
            "XPU_SERVER_KEY": str(folder / "server.key")}


# ---- agents -----------------------------------------------------------------------------------------
def calls_header(seq: int, calls: list[Any], reply: bool) -> dict[str, Any]:
    """The header the client sends for a batch of calls (see protocol/wire.py)."""
    return {"v": wire.PROTOCOL_VERSION, "op": "calls", "seq": seq, "calls": calls, "reply": reply}


class RawAgent:
    """The baseline: bare pyzmq + msgpack against the echo server."""

    def __init__(self, endpoint: str, bulk: int, tcp_port: int = 0) -> None:
        import msgpack
        import zmq

        self.msgpack = msgpack
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        keys = curve_keys("client")
        if keys:
            self.sock.curve_publickey, self.sock.curve_secretkey = keys
            self.sock.curve_serverkey = curve_keys("server")[0]
        self.sock.connect(endpoint)
        self.tcp = socket.create_connection(("127.0.0.1", tcp_port)) if tcp_port else None  # the bare-TCP rows'
        if self.tcp is not None:
            self.tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.src = bytearray(os.urandom(bulk))
        self.dst = bytearray(bulk)
        self.seq = 0
        self.sync_op = CALLS["cuCtxSynchronize"].opcode
        self.memset_op = CALLS["cuMemsetD8Async"].opcode
        self.dptr = 0x3000_0000_0000
        self.sync(100)  # connected and answering

    def _echo(self) -> None:
        self.seq += 1
        packb, unpackb = self.msgpack.packb, self.msgpack.unpackb
        self.sock.send(b"E" + packb(calls_header(self.seq, [[self.sync_op, []]], True)))
        unpackb(self.sock.recv()[1:])

    def sync(self, n: int) -> float:
        sock, packb, unpackb, op = self.sock, self.msgpack.packb, self.msgpack.unpackb, self.sync_op
        t0 = time.perf_counter()
        for seq in range(self.seq + 1, self.seq + n + 1):
            sock.send(b"E" + packb(calls_header(seq, [[op, []]], True)))
            if unpackb(sock.recv()[1:])["seq"] != seq:
                raise RuntimeError("echo out of order")
        elapsed = time.perf_counter() - t0
        self.seq += n
        return elapsed

    def sync_tcp(self, n: int) -> float:
        """The sync echo on a bare TCP connection: what ZeroMQ's own threads cost a round trip."""
        conn, packb, unpackb, op = self.tcp, self.msgpack.packb, self.msgpack.unpackb, self.sync_op
        t0 = time.perf_counter()
        for seq in range(n):
            message = packb(calls_header(seq, [[op, []]], True))
            conn.sendall(b"M" + len(message).to_bytes(8, "little") + message)
            size = int.from_bytes(conn.recv(8, socket.MSG_WAITALL), "little")
            if unpackb(conn.recv(size, socket.MSG_WAITALL))["seq"] != seq:
                raise RuntimeError("echo out of order")
        return time.perf_counter() - t0

    def async_batched(self, n: int) -> float:
        """n memsets queued as the client queues them, sent MAX_BATCH_CALLS at a time, then one echo."""
        return self.batched(n, [self.memset_op, [self.dptr, n & 0xFF, SMALL, 0]])

    def batched(self, n: int, call: list[Any]) -> float:
        """n copies of `call` ([opcode, args]) queued and sent as the client batches them, then one echo."""
        sock, packb = self.sock, self.msgpack.packb
        t0 = time.perf_counter()
        pending: list[Any] = []
        for _ in repeat(None, n):
            pending.append(call)
            if len(pending) >= MAX_BATCH_CALLS:
                self.seq += 1
                sock.send(b"N" + packb(calls_header(self.seq, pending, False)))
                pending = []
        if pending:
            self.seq += 1
            sock.send(b"N" + packb(calls_header(self.seq, pending, False)))
        self._echo()
        return time.perf_counter() - t0

    def async_single(self, n: int) -> float:
        """n calls, one message each, never answered, then one echo."""
        sock, packb, op, dptr = self.sock, self.msgpack.packb, self.memset_op, self.dptr
        value = n & 0xFF
        t0 = time.perf_counter()
        for seq in range(self.seq + 1, self.seq + n + 1):
            sock.send(b"N" + packb(calls_header(seq, [[op, [dptr, value, SMALL, 0]]], False)))
        self.seq += n
        self._echo()
        return time.perf_counter() - t0

    def h2d(self, size: int) -> float:
        header = b"A" + self.msgpack.packb({"size": size})
        view = memoryview(self.src)[:size]
        t0 = time.perf_counter()
        self.sock.send_multipart([header, view], copy=False)
        self.sock.recv_multipart(copy=False)
        return time.perf_counter() - t0

    def d2h(self, size: int) -> float:
        header = b"D" + self.msgpack.packb({"size": size})
        t0 = time.perf_counter()
        self.sock.send(header)
        frames = self.sock.recv_multipart(copy=False)
        elapsed = time.perf_counter() - t0
        if len(frames[1].buffer) != size:
            raise RuntimeError("short D2H reply")
        return elapsed

    def d2h_copy(self, size: int) -> float:
        """D2H, then the bytes copied into an application buffer (as any driver must)."""
        header = b"D" + self.msgpack.packb({"size": size})
        dst = self.dst
        t0 = time.perf_counter()
        self.sock.send(header)
        frames = self.sock.recv_multipart(copy=False)
        memoryview(dst)[:size] = frames[1].buffer
        return time.perf_counter() - t0

    def h2d_tcp(self, size: int) -> float:
        t0 = time.perf_counter()
        self.tcp.sendall(b"U" + size.to_bytes(8, "little"))
        self.tcp.sendall(memoryview(self.src)[:size])
        self.tcp.recv(1)
        return time.perf_counter() - t0

    def d2h_tcp(self, size: int) -> float:
        t0 = time.perf_counter()
        self.tcp.sendall(b"D" + size.to_bytes(8, "little"))
        _recv_into(self.tcp, memoryview(self.dst)[:size])
        return time.perf_counter() - t0

    def close(self) -> None:
        if self.tcp is not None:
            self.tcp.close()
        self.sock.send(b"Q")
        self.sock.recv()
        self.sock.close(0)
        self.ctx.term()


class ShimAgent:
    """The driver through the preloaded shim, called from ctypes as a C program would."""

    def __init__(self, bulk: int) -> None:
        import ctypes

        self.ctypes = ctypes
        lib = ctypes.CDLL("libcuda.so.1")
        self.shim_path = _loaded_from("libcuda.so.1")
        c = ctypes
        u64 = c.c_uint64

        def fn(name: str, *argtypes: Any) -> Any:
            f = getattr(lib, name)
            f.restype, f.argtypes = c.c_int, list(argtypes)
            return f

        self.cuCtxSynchronize = fn("cuCtxSynchronize")
        self.cuMemsetD8Async = fn("cuMemsetD8Async", u64, c.c_ubyte, c.c_size_t, c.c_void_p)
        self.cuStreamSynchronize = fn("cuStreamSynchronize", c.c_void_p)
        self.cuMemcpyHtoD = fn("cuMemcpyHtoD_v2", u64, c.c_void_p, c.c_size_t)
        self.cuMemcpyDtoH = fn("cuMemcpyDtoH_v2", c.c_void_p, u64, c.c_size_t)
        check = self.check
        check("cuInit", fn("cuInit", c.c_uint)(0))
        dev, ctx = c.c_int(), c.c_void_p()
        check("cuDeviceGet", fn("cuDeviceGet", c.POINTER(c.c_int), c.c_int)(c.byref(dev), 0))
        check("cuDevicePrimaryCtxRetain", fn("cuDevicePrimaryCtxRetain", c.POINTER(c.c_void_p), c.c_int)(
            c.byref(ctx), dev))
        check("cuCtxSetCurrent", fn("cuCtxSetCurrent", c.c_void_p)(ctx))
        alloc = fn("cuMemAlloc_v2", c.POINTER(u64), c.c_size_t)
        small, big = u64(), u64()
        check("cuMemAlloc_v2", alloc(c.byref(small), SMALL))
        check("cuMemAlloc_v2", alloc(c.byref(big), bulk))
        self.small, self.big = small.value, big.value
        self.src = bytearray(os.urandom(bulk))
        self.dst = bytearray(bulk)
        self.src_ptr = c.addressof(c.c_char.from_buffer(self.src))
        self.dst_ptr = c.addressof(c.c_char.from_buffer(self.dst))
        self.sync(100)
        self.cudaMemcpy = None  # NVIDIA's libcudart, when the benchmark found one
        if os.environ.get("XPU_BENCH_CUDART"):
            rt = ctypes.CDLL(os.environ["XPU_BENCH_CUDART"])
            self.cudaMemcpy = rt.cudaMemcpy
            self.cudaMemcpy.restype, self.cudaMemcpy.argtypes = c.c_int, [c.c_void_p, c.c_void_p, c.c_size_t, c.c_int]
            self.small_ptr = c.c_void_p(self.small)
            self.sync_cudart(100)

    @staticmethod
    def check(name: str, rc: int) -> None:
        if rc:
            raise RuntimeError(f"{name} returned CUresult {rc}")

    def sync(self, n: int) -> float:
        f = self.cuCtxSynchronize
        bad = 0
        t0 = time.perf_counter()
        for _ in repeat(None, n):
            if f():
                bad += 1
        elapsed = time.perf_counter() - t0
        self.check("cuCtxSynchronize", bad)
        return elapsed

    def sync_cudart(self, n: int) -> float:
        """The issue's case: an 8-byte device-to-host cudaMemcpy through NVIDIA's libcudart."""
        f, small, out = self.cudaMemcpy, self.small_ptr, (self.ctypes.c_ubyte * 8)()
        bad = 0
        t0 = time.perf_counter()
        for _ in repeat(None, n):
            if f(out, small, 8, 2):  # cudaMemcpyDeviceToHost
                bad += 1
        elapsed = time.perf_counter() - t0
        self.check("cudaMemcpy", bad)
        return elapsed

    def async_batched(self, n: int) -> float:
        f, small, value = self.cuMemsetD8Async, self.small, n & 0xFF
        bad = 0
        t0 = time.perf_counter()
        for _ in repeat(None, n):
            if f(small, value, SMALL, None):
                bad += 1
        rc = self.cuStreamSynchronize(None)
        elapsed = time.perf_counter() - t0
        self.check("cuMemsetD8Async", bad)
        self.check("cuStreamSynchronize", rc)
        out = (self.ctypes.c_ubyte * SMALL)()
        self.check("cuMemcpyDtoH_v2", self.cuMemcpyDtoH(out, small, SMALL))
        if bytes(out) != bytes([value]) * SMALL:
            raise RuntimeError("cuMemsetD8Async did not set the buffer")
        return elapsed

    def h2d(self, size: int) -> float:
        t0 = time.perf_counter()
        rc = self.cuMemcpyHtoD(self.big, self.src_ptr, size)
        elapsed = time.perf_counter() - t0
        self.check("cuMemcpyHtoD_v2", rc)
        return elapsed

    def d2h(self, size: int) -> float:
        t0 = time.perf_counter()
        rc = self.cuMemcpyDtoH(self.dst_ptr, self.big, size)
        elapsed = time.perf_counter() - t0
        self.check("cuMemcpyDtoH_v2", rc)
        return elapsed

    def verify(self, size: int) -> bool:
        """The bytes that went up come back down."""
        self.src[:64] = os.urandom(64)
        self.h2d(size)
        self.dst[:size] = bytes(size)
        self.d2h(size)
        return self.dst[:size] == self.src[:size]

    def close(self) -> None:
        pass


def _cudart() -> str | None:
    """NVIDIA's libcudart 13 from the test extra's runtime wheel, if installed."""
    sys.path.insert(0, str(ROOT / "tests"))
    from toolchain import cudart_path

    return cudart_path(13)


def _loaded_from(soname: str) -> str:
    """Which file a library was loaded from (Linux), to make sure it is the shim."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if line.rstrip().endswith(soname):
                    return line.split()[-1]
    except OSError:
        pass
    return "?"


def agent(kind: str, endpoint: str, bulk: int, profile_dir: str | None, tcp_port: int) -> int:
    """Serve the parent's commands (one JSON line each) until stdin closes."""
    target: Any = RawAgent(endpoint, bulk, tcp_port) if kind == "raw" else ShimAgent(bulk)
    hello = {"ready": kind, "pid": os.getpid()}
    if kind in ("shim", "native"):
        hello["library"] = target.shim_path
    _answer(hello)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        method = getattr(target, cmd["op"])
        if cmd.get("profile") and profile_dir:
            prof = cProfile.Profile()
            result = prof.runcall(method, *cmd.get("args", []))
            prof.dump_stats(os.path.join(profile_dir, f"{kind}-{cmd['op']}.pstats"))
        else:
            result = method(*cmd.get("args", []))
        _answer({"result": result})
    target.close()
    return 0


def _answer(obj: Any) -> None:
    sys.stdout.write(TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Agent:
    """The parent's handle on an agent process."""

    def __init__(self, kind: str, args: list[str], env: dict[str, str]) -> None:
        self.kind = kind
        cmd = [sys.executable, str(Path(__file__).resolve()), "--role", kind, *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.hello = self._read()
        self.peer = 0  # the process serving this agent, for CPU accounting

    def _read(self) -> Any:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the {self.kind} agent ended (exit {self.proc.wait()})")
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])
            sys.stdout.write(f"[{self.kind}] {line}")

    def __call__(self, op: str, *args: Any, profile: bool = False) -> Any:
        self.proc.stdin.write(json.dumps({"op": op, "args": list(args), "profile": profile}) + "\n")
        self.proc.stdin.flush()
        return self._read()["result"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# ---- CPU accounting (Linux /proc; zeros elsewhere) ---------------------------------------------------
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system time of a process, all its threads."""
    try:
        fields = _stat(pid)
    except (OSError, ValueError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def session_worker(daemon_pid: int) -> int:
    """The worker process the daemon started for our one session (its only child)."""
    children = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                if int(_stat(int(entry))[1]) == daemon_pid:
                    children.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return children[0] if len(children) == 1 else 0


# ---- servers ----------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_facts(script: str, argv: list[str] | None) -> dict[str, Any]:
    """What a benchmark's result says of its run: the command that made it, the Python, the load average after."""
    return {"python": sys.version.split()[0], "load": os.getloadavg(),
            "command": shlex.join(["python", f"bench/{script}", *(sys.argv[1:] if argv is None else argv)])}


def publish(out: Path | None, result: dict[str, Any], table: str) -> None:
    """Print a benchmark's Markdown; with `out`, keep its JSON there and the Markdown beside it."""
    print(table)
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")
        out.with_suffix(".md").write_text(table)


def child_figures(cmd: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """A benchmark's measuring child, run in `env`: the JSON of its last line."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def clean_env(keys: dict[str, str] | None = None) -> dict[str, str]:
    drop = ("LD_PRELOAD", "XPU_SERVER", "XPU_CLIENT_KEY", "XPU_SERVER_KEY", "XPU_BENCH_KEYS")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **(keys or {})}


def start_server(log_path: Path, backend: str, keys: dict[str, str] | None = None, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, timeout_s: float = 30) -> tuple[subprocess.Popen, str]:
    """An xpu-server on a free loopback port (with `args` and `env` added), once it says ready."""
    address = f"tcp://127.0.0.1:{free_port()}"
    env = {**clean_env(), "XPU_LOG": "INFO", **(env or {})}
    curve = ["--key", f"{keys['XPU_BENCH_KEYS']}/server.key_secret", "--allowed-keys",
             f"{keys['XPU_BENCH_KEYS']}/allowed"] if keys else []
    with open(log_path, "w") as log:  # the server keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "xpuremote.server.daemon", "--listen", address,
                                 "--backend", backend, *curve, *args], stderr=log, env=env)
    deadline = time.monotonic() + timeout_s
    while "ready" not in log_path.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"xpu-server did not start:\n{log_path.read_text()}")
        time.sleep(0.05)
    return proc, address


def start_stand_in(log_path: Path, sim_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, dict[str, str]]:
    """The cuda backend's libcuda without a GPU: xpuremote's own shim (a stand-in, named as such), talking to
    a sim server started here. The server, and what a cuda server's environment needs to use it."""
    from xpuremote.interpose.build import ensure_shim

    sim, address = start_server(log_path, "sim", env=sim_env)
    return sim, {"XPU_CUDA_LIBRARY": str(ensure_shim()), "XPU_SERVER": address}


def start_echo_server(keys: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """The baseline's server, with the allocator settings the daemon gives its workers (if any), so
    that the comparison is of the software, not of malloc's page faults."""
    from xpuremote.server import daemon

    env = clean_env(keys)
    tunables = getattr(daemon, "WORKER_TUNABLES", "")
    env["GLIBC_TUNABLES"] = ":".join(filter(None, [tunables, env.get("GLIBC_TUNABLES")]))
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--role", "echo"],
                            stdout=subprocess.PIPE, text=True, env=env)
    line, tcp = proc.stdout.readline(), proc.stdout.readline()
    if not line.startswith("endpoint ") or not tcp.startswith("tcp-port "):
        raise RuntimeError(f"echo server did not start (exit {proc.poll()})")
    proc.tcp_port = int(tcp.split()[1])  # type: ignore[attr-defined]  # the bare-TCP baseline's
    return proc, line.split()[1]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---- the server's own share, measured in-process ------------------------------------------------------
def server_share(backend: str, n_sync: int, n_async: int, profile_dir: Path | None) -> dict[str, float]:
    """µs per call spent in session.Session (decode + execute + encode), without any transport: a
    cuCtxSynchronize and an 8-byte cuMemcpyDtoH_v2 answered, memsets in batches. On the cuda backend also the
    driver's own two calls alone, made from cffi: what is left of the session's figure is xpuremote's; the copy
    into page-locked memory; and each call after a pause, as a worker makes it between round trips."""
    import msgpack

    from xpuremote.server.limits import Accounted, Limits
    from xpuremote.server.session import Session

    if backend == "cuda":
        from xpuremote.server.backends.cuda import CudaBackend as Backend
    else:
        from xpuremote.server.backends.sim import SimBackend as Backend
    session = Session(Accounted(Backend(), Limits()))
    session.limits = session.backend.limits

    def run(*calls: tuple[str, list[Any]]) -> list[Any]:
        answer = session.run_batch([[CALLS[name].opcode, args] for name, args in calls], True)
        if answer["status"]:
            raise RuntimeError(f"the in-process session refused its set-up: {answer}")
        return answer["outs"]

    run(("cuCtxCreate_v2", [SHARE_CTX, 0, 0]))
    dptr = int.from_bytes(run(("cuMemAlloc_v2", [8, SMALL]))[0], "little")
    waited = {"sync": msgpack.packb(calls_header(1, [[CALLS["cuCtxSynchronize"].opcode, []]], True)),
              "copy": msgpack.packb(calls_header(1, [[CALLS["cuMemcpyDtoH_v2"].opcode, [8, dptr, 8]]], True))}
    batch = [[CALLS["cuMemsetD8Async"].opcode, [dptr, 7, SMALL, 0]]] * MAX_BATCH_CALLS
    async_msg = msgpack.packb(calls_header(1, batch, False))

    def answered(message: bytes) -> Callable[[], None]:
        def loop() -> None:
            for _ in repeat(None, n_sync):
                header = wire.decode([message])
                answer = session.run_batch(header["calls"], True)
                answer["seq"] = header["seq"]
                wire.encode(answer)
        return loop

    def async_loop() -> None:
        for _ in repeat(None, n_async // MAX_BATCH_CALLS):
            header = wire.decode([async_msg])
            session.run_batch(header["calls"], False)

    loops = [("sync", answered(waited["sync"]), n_sync), ("copy", answered(waited["copy"]), n_sync),
             ("async", async_loop, n_async)]
    out = {}
    if backend == "cuda":
        lib, ffi = session.backend.inner.lib, session.backend.inner.ffi
        host, pinned = ffi.new("char[8]"), ffi.new("void **")
        loops += [("driver sync", lambda: [lib.cuCtxSynchronize() for _ in repeat(None, n_sync)], n_sync),
                  ("driver copy", lambda: [lib.cuMemcpyDtoH_v2(host, dptr, 8) for _ in repeat(None, n_sync)], n_sync)]
        if lib.cuMemAllocHost_v2(pinned, 8) == 0:
            loops.append(("driver copy pinned", lambda: [lib.cuMemcpyDtoH_v2(pinned[0], dptr, 8)
                                                         for _ in repeat(None, n_sync)], n_sync))
        out["driver copy after a pause"] = paused(lambda: lib.cuMemcpyDtoH_v2(host, dptr, 8), min(n_sync, 5000))
        out["driver sync after a pause"] = paused(lib.cuCtxSynchronize, min(n_sync, 5000))
    for name, fn, calls in loops:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) / calls * 1e6
        if profile_dir is not None:
            cProfile.runctx("fn()", globals(), {"fn": fn}, str(profile_dir / f"server-{name.replace(' ', '-')}.pstats"))
    if "driver copy pinned" in out:
        lib.cuMemFreeHost(pinned[0])
    session.backend.close()
    return out


def paused(call: Callable[[], Any], n: int, pause_s: float = 100e-6) -> float:
    """Median µs of `call`, each made after the thread slept `pause_s`: as a worker makes it, between round trips
    (a tight loop keeps the driver, the GPU and its link busy; a pause may let them idle)."""
    times = []
    for _ in range(n):
        time.sleep(pause_s)
        t0 = time.perf_counter_ns()
        call()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def share_line(backend: str, share: dict[str, float]) -> str:
    """The in-process share in words (older results have no copy row)."""
    line = (f"Server share (session.Session in-process on the {backend} backend, no transport): cuCtxSynchronize "
            f"{share['sync']:.2f} µs/call, 8 B cuMemcpyDtoH_v2 {share.get('copy', float('nan')):.2f} µs/call, async "
            f"{share['async']:.2f} µs/call.")
    if "driver copy" in share:
        line += (f" The driver's own calls alone, from cffi: cuCtxSynchronize {share['driver sync']:.2f} µs, the "
                 f"copy {share['driver copy']:.2f} µs.")
    if "driver copy after a pause" in share:
        line += (f" Into page-locked memory the copy takes {share.get('driver copy pinned', float('nan')):.2f} µs; "
                 f"each made after a 100 µs pause, cuCtxSynchronize {share['driver sync after a pause']:.2f} µs and "
                 f"the copy {share['driver copy after a pause']:.2f} µs (medians of single calls).")
    return line


def top(path: Path, limit: int = 22) -> str:
    buf = io.StringIO()
    pstats.Stats(str(path), stream=buf).strip_dirs().sort_stats("tottime").print_stats(limit)
    lines = buf.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[max(start - 4, 0):])


# ---- the run -------------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    import msgpack
    import zmq

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import xpuremote.client
    from xpuremote.server import daemon

    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        thp = None
    return {"cores": os.cpu_count(), "cpu": cpu, "system": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version(),
            "msgpack": ".".join(map(str, msgpack.version)), "transparent_hugepage": thp,
            "worker_glibc_tunables": getattr(daemon, "WORKER_TUNABLES", None),
            "code": "this checkout" if Path(xpuremote.client.__file__).resolve().parent == ROOT / "client"
            else "another tree, found first on PYTHONPATH", "load_before": _loadavg()}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run(args: argparse.Namespace, curve: bool = False) -> dict[str, Any]:
    from xpuremote.interpose.build import ensure_shim

    shim = ensure_shim()
    bulk = args.bulk_mib * MIB
    tmp = Path(tempfile.mkdtemp(prefix="xpuremote-bench-"))
    keys = make_keys(tmp / "keys") if curve else None
    profile_dir = Path(args.profile).resolve() if args.profile else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    agents: list[Agent] = []
    try:
        server, address = start_server(tmp / "server.log", args.backend, keys)
        procs.append(server)
        echo, endpoint = start_echo_server(keys)
        procs.append(echo)
        extra = ["--bulk-mib", str(args.bulk_mib)] + (["--profile", str(profile_dir)] if profile_dir else [])
        raw = Agent("raw", ["--endpoint", endpoint, "--tcp-port", str(echo.tcp_port), *extra], clean_env(keys))
        raw.peer = echo.pid
        agents.append(raw)
        env = clean_env(keys)
        env["LD_PRELOAD"] = str(shim)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(shim.parent), env.get("LD_LIBRARY_PATH")]))
        env["XPU_SERVER"] = address
        cudart = _cudart()
        if cudart:
            env["XPU_BENCH_CUDART"] = cudart
        shim_agent = Agent("shim", extra, env)
        agents.append(shim_agent)
        if Path(shim_agent.hello["library"]).resolve() != shim.resolve():
            raise RuntimeError(f"the shim agent loaded {shim_agent.hello['library']}, not {shim}")
        shim_agent.peer = session_worker(server.pid)
        # the same sync calls with neither end spinning (protocol/spin.py): what the spin is worth, in this run
        blocking_server, blocking_address = start_server(tmp / "server-blocking.log", args.backend, keys,
                                                         ("--spin-us", "0"))
        procs.append(blocking_server)
        blocking = Agent("shim", extra, {**env, "XPU_SERVER": blocking_address, "XPU_SPIN_US": "0"})
        blocking.peer = session_worker(blocking_server.pid)
        agents.append(blocking)
        keyed = None  # a keyed session beside the plain one: what the keys cost, in this run
        if not curve:
            keyed_env = make_keys(tmp / "keyed")
            keyed_server, keyed_address = start_server(tmp / "server-keyed.log", args.backend, keyed_env)
            procs.append(keyed_server)
            keyed = Agent("shim", extra, {**env, **keyed_env, "XPU_SERVER": keyed_address})
            keyed.peer = session_worker(keyed_server.pid)
            agents.append(keyed)
        native = None  # on a GPU, the same calls on the machine's own driver (the agent's class does not care)
        if args.backend == "cuda":
            native = Agent("native", extra, {**clean_env(), **({"XPU_BENCH_CUDART": cudart} if cudart else {})})
            agents.append(native)

        results: dict[str, Any] = {}
        # warm-up: caches, allocator, TCP windows
        for a in (raw, shim_agent, *([native] if native else []), *([keyed] if keyed else [])):
            a("sync", min(args.sync_n, 2000))
            a("async_batched", min(args.async_n, 20000))
            a("h2d", bulk)
            a("d2h", bulk)
        raw("h2d_tcp", bulk)
        raw("d2h_tcp", bulk)
        raw("sync_tcp", min(args.sync_n, 2000))
        blocking("sync", min(args.sync_n, 2000))

        samples: dict[str, list[float]] = {}
        cpu: dict[str, list[list[float]]] = {}

        def measure(key: str, a: Agent, op: str, arg: int, units: int, figure: Any) -> None:
            """One repeat: the figure from the agent's wall time, and the CPU time that the agent and
            its server (all their threads) spent per unit (µs per call, ms per copy)."""
            before = (cpu_seconds(a.proc.pid), cpu_seconds(a.peer))
            seconds = a(op, arg)
            after = (cpu_seconds(a.proc.pid), cpu_seconds(a.peer))
            samples.setdefault(key, []).append(figure(seconds))
            scale = 1e6 / units if units > 1 else 1e3
            cpu.setdefault(key, []).append([(y - x) * scale for x, y in zip(before, after)])

        n, m = args.sync_n, args.async_n
        through_cudart = [(key, a, "sync_cudart", n, n, lambda t: t / n * 1e6) for key, a in (
            ("sync_cudart", shim_agent), ("sync_cudart_blocking", blocking))] if cudart else []
        natively: dict[str, list[tuple]] = {"sync": [], "async": [], "bulk": []}
        keys_on: dict[str, list[tuple]] = {"sync": [], "bulk": []}
        if keyed:
            keys_on["sync"] = [("sync_shim_keyed", keyed, "sync", n, n, lambda t: t / n * 1e6)] + (
                [("sync_cudart_keyed", keyed, "sync_cudart", n, n, lambda t: t / n * 1e6)] if cudart else [])
            keys_on["bulk"] = [(key, keyed, op, bulk, 1, lambda t: bulk / t / 1e9)
                               for key, op in (("h2d_shim_keyed", "h2d"), ("d2h_shim_keyed", "d2h"))]
        if native:
            natively["sync"] = [("sync_native", native, "sync", n, n, lambda t: t / n * 1e6)] + (
                [("sync_cudart_native", native, "sync_cudart", n, n, lambda t: t / n * 1e6)] if cudart else [])
            natively["async"] = [("async_native", native, "async_batched", m, m, lambda t: m / t)]
            natively["bulk"] = [(key, native, op, bulk, 1, lambda t: bulk / t / 1e9)
                                for key, op in (("h2d_native", "h2d"), ("d2h_native", "d2h"))]
        phases = [
            (args.repeats, [("sync_raw", raw, "sync", n, n, lambda t: t / n * 1e6),
                            ("sync_shim", shim_agent, "sync", n, n, lambda t: t / n * 1e6),
                            ("sync_shim_blocking", blocking, "sync", n, n, lambda t: t / n * 1e6),
                            ("sync_tcp", raw, "sync_tcp", n, n, lambda t: t / n * 1e6), *through_cudart,
                            *natively["sync"], *keys_on["sync"]]),
            (args.repeats, [("async_raw_batched", raw, "async_batched", m, m, lambda t: m / t),
                            ("async_raw_single", raw, "async_single", m, m, lambda t: m / t),
                            ("async_shim", shim_agent, "async_batched", m, m, lambda t: m / t), *natively["async"]]),
            (args.bulk_repeats, [(key, a, op, bulk, 1, lambda t: bulk / t / 1e9) for key, a, op in (
                ("h2d_raw", raw, "h2d"), ("h2d_shim", shim_agent, "h2d"), ("d2h_raw", raw, "d2h"),
                ("d2h_raw_copy", raw, "d2h_copy"), ("d2h_shim", shim_agent, "d2h"), ("h2d_tcp", raw, "h2d_tcp"),
                ("d2h_tcp", raw, "d2h_tcp"))] + natively["bulk"] + keys_on["bulk"]),
        ]
        for repeats, steps in phases:
            for r in range(repeats):  # every other repeat in reverse order: no step always follows another
                for step in steps if r % 2 == 0 else steps[::-1]:
                    measure(*step)
        results["verified"] = shim_agent("verify", bulk) and (keyed is None or keyed("verify", bulk))
        if not results["verified"]:
            raise RuntimeError("the bytes copied to the device did not come back unchanged")
        if keyed and "data connection open" not in (tmp / "server-keyed.log").read_text():
            raise RuntimeError("the keyed session had no data connection: its rows would measure ZeroMQ's")

        if profile_dir:
            shim_agent("sync", args.sync_n, profile=True)
            shim_agent("async_batched", args.async_n, profile=True)
            shim_agent("h2d", bulk, profile=True)
            shim_agent("d2h", bulk, profile=True)
        results["server_us_per_call"] = server_share(args.backend, args.sync_n, args.async_n, profile_dir)
        results["samples"] = {k: [round(x, 4) for x in v] for k, v in samples.items()}
        results["median"] = {k: statistics.median(v) for k, v in samples.items()}
        results["cpu"] = {k: {"client": statistics.median(c for c, _ in v),
                              "server": statistics.median(s for _, s in v)} for k, v in cpu.items()}
    finally:
        for a in agents:
            a.close()
        for p in procs:
            stop(p)
    if profile_dir:
        for path in sorted(profile_dir.glob("*.pstats")):
            print(f"\n==== {path.name} ====\n{top(path)}")
    return results


BLOCKING = "the shim with neither end spinning before it blocks (XPU_SPIN_US=0, xpu-server --spin-us 0; µs/call)"
NATIVE = "native CUDA, the same calls on the GPU machine's own driver ({})"


def figures(args: argparse.Namespace, results: dict[str, Any]) -> list[dict[str, Any]]:
    m, cpu, mib = results["median"], results["cpu"], args.bulk_mib

    def row(figure: str, unit: str, shim: str, base: str, baseline_is: str, target: str, met: Any,
            cpu_unit: str, **also: str) -> dict[str, Any]:
        ratio = m[shim] / m[base]
        return {"figure": figure, "unit": unit, "shim": m[shim], "baseline": m[base],
                "baseline_is": baseline_is, "ratio": ratio, "ratio_is": "shim / baseline", "target": target,
                "met": bool(met(ratio, m[shim])),
                "also": {k: m[v] for k, v in also.items() if v in m},  # the native rows: on a GPU only
                "cpu": {"unit": cpu_unit, "shim": cpu[shim], "baseline": cpu[base]}}

    return [
        row(f"sync latency, cuCtxSynchronize x {args.sync_n}", "µs/call", "sync_shim", "sync_raw",
            "pyzmq+msgpack echo round trip", "ratio <= 1.15", lambda r, v: r <= 1.15, "µs/call",
            **{"bare TCP+msgpack echo round trip, the transport the shim's sync calls take (µs/call)": "sync_tcp",
               BLOCKING: "sync_shim_blocking", NATIVE.format("µs/call"): "sync_native"}),
        *([row(f"sync latency, libcudart 13 cudaMemcpy 8 B device to host x {args.sync_n}", "µs/call",
               "sync_cudart", "sync_raw", "pyzmq+msgpack echo round trip", "ratio <= 1.15", lambda r, v: r <= 1.15,
               "µs/call", **{"bare TCP+msgpack echo round trip (µs/call)": "sync_tcp",
                             BLOCKING: "sync_cudart_blocking", NATIVE.format("µs/call"): "sync_cudart_native"})]
          if "sync_cudart" in m else []),
        row(f"async throughput, cuMemsetD8Async {SMALL} B x {args.async_n} + 1 sync", "calls/s", "async_shim",
            "async_raw_batched", f"pyzmq+msgpack, {MAX_BATCH_CALLS} calls a message, no answers, then 1 echo",
            ">= 150,000 calls/s", lambda r, v: v >= 150_000, "µs/call",
            **{"pyzmq+msgpack, 1 call a message (calls/s)": "async_raw_single",
               NATIVE.format("calls/s"): "async_native"}),
        row(f"H2D cuMemcpyHtoD_v2 {mib} MiB", "GB/s", "h2d_shim", "h2d_raw",
            "pyzmq: one frame to the echo server, ack back", "ratio >= 0.9", lambda r, v: r >= 0.9,
            "ms/copy", **{"bare TCP, the bytes read into a buffer, one byte back (GB/s)": "h2d_tcp",
                          NATIVE.format("GB/s"): "h2d_native"}),
        row(f"D2H cuMemcpyDtoH_v2 {mib} MiB", "GB/s", "d2h_shim", "d2h_raw",
            "pyzmq: request, one frame back from the echo server", "ratio >= 0.9", lambda r, v: r >= 0.9,
            "ms/copy",
            **{"pyzmq, the frame then copied into the application's buffer (GB/s)": "d2h_raw_copy",
               "bare TCP, read straight into the application's buffer (GB/s)": "d2h_tcp",
               NATIVE.format("GB/s"): "d2h_native"}),
        *(keyed_rows(args, m, row) if "sync_shim_keyed" in m else []),
    ]


def keyed_rows(args: argparse.Namespace, m: dict[str, float],
               row: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """A keyed session's figures (CURVE, its data connection sealed) against the plain session's, same run."""
    plain, mib = "the same in a plain session (no keys), this run", args.bulk_mib
    return [
        row(f"keyed: sync latency, cuCtxSynchronize x {args.sync_n}", "µs/call", "sync_shim_keyed", "sync_shim",
            plain, "ratio <= 1.15", lambda r, v: r <= 1.15, "µs/call"),
        *([row(f"keyed: sync latency, libcudart 13 cudaMemcpy 8 B device to host x {args.sync_n}", "µs/call",
               "sync_cudart_keyed", "sync_cudart", plain, "ratio <= 1.15", lambda r, v: r <= 1.15, "µs/call")]
          if "sync_cudart_keyed" in m else []),
        row(f"keyed: H2D cuMemcpyHtoD_v2 {mib} MiB", "GB/s", "h2d_shim_keyed", "h2d_shim", plain, "ratio >= 0.8",
            lambda r, v: r >= 0.8, "ms/copy"),
        row(f"keyed: D2H cuMemcpyDtoH_v2 {mib} MiB", "GB/s", "d2h_shim_keyed", "d2h_shim", plain, "ratio >= 0.8",
            lambda r, v: r >= 0.8, "ms/copy"),
    ]


def _fmt(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}" if x < 10 else f"{x:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = "| figure | unit | shim | baseline | ratio | target | met |\n|---|---|---:|---:|---:|---|---|"
    lines = [head]
    for r in rows:
        lines.append(f"| {r['figure']} | {r['unit']} | {_fmt(r['shim'])} | {_fmt(r['baseline'])} | "
                     f"{r['ratio']:.2f}x | {r['target']} | {'yes' if r['met'] else 'NO'} |")
    lines += ["", "CPU time, medians (all threads; client = the agent process, server = the session's worker or "
              "the echo server):", "",
              "| figure | unit | shim: client | shim: server | baseline: client | baseline: server |",
              "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        c = r["cpu"]
        cells = [c[side][end] for side in ("shim", "baseline") for end in ("client", "server")]
        lines.append(f"| {r['figure']} | {c['unit']} | " + " | ".join(_fmt(x) for x in cells) + " |")
    notes = []
    for r in rows:
        notes.append(f"- {r['figure']}: baseline = {r['baseline_is']}")
        for k, v in r.get("also", {}).items():
            notes.append(f"  - also {k}: {_fmt(v)}")
    return "\n".join(lines) + "\n\n" + "\n".join(notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write JSON here, and Markdown beside it (.md)")
    parser.add_argument("--sync-n", type=int, default=20_000)
    parser.add_argument("--async-n", type=int, default=200_000)
    parser.add_argument("--bulk-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bulk-repeats", type=int, default=11)
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke test")
    parser.add_argument("--backend", choices=["sim", "cuda"], default="sim", help="the xpu-server's (default sim)")
    parser.add_argument("--profile", metavar="DIR", help="also profile each phase; .pstats files go here")
    parser.add_argument("--curve", choices=["off", "on", "both"], default="off",
                        help="encrypt every connection with CURVE; both: a run without, then one with")
    parser.add_argument("--role", choices=["echo", "raw", "shim", "native"], help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--tcp-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "echo":
        return echo_server()
    if args.role:
        return agent(args.role, args.endpoint, args.bulk_mib * MIB, args.profile, args.tcp_port)
    if args.quick:
        args.sync_n, args.async_n, args.repeats, args.bulk_repeats = 2000, 20000, 3, 3

    info = machine()
    started = time.time()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.curve]
    runs = {curve: run(args, curve) for curve in modes}
    command = "python bench/foundation.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    sections, docs = [], {}
    for curve, results in runs.items():
        rows = figures(args, results)
        md = table(rows)
        share = results["server_us_per_call"]
        title = f"CURVE {'on' if curve else 'off'}"
        print(f"\n## {title}\n\n{md}\n\n{share_line(args.backend, share)}")
        sections.append(f"## {title}\n\n{md}\n\n{share_line(args.backend, share)}")
        docs[title] = {"figures": rows, "server_us_per_call": share, "samples": results["samples"],
                       "verified": results["verified"]}
    if len(runs) == 2:
        compare = curve_table(*(figures(args, r) for r in runs.values()))
        print(f"\n## CURVE off and on\n\n{compare}")
        sections.insert(0, f"## CURVE off and on (the shim's figures)\n\n{compare}")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"command": command, "machine": info, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z",
               time.localtime(started)), "seconds": round(time.time() - started, 1),
               "parameters": {"sync_n": args.sync_n, "async_n": args.async_n, "bulk_mib": args.bulk_mib,
                              "repeats": args.repeats, "bulk_repeats": args.bulk_repeats, "curve": args.curve},
               "load_after": _loadavg()}
        if len(docs) == 1:
            doc |= next(iter(docs.values()))
        else:
            doc["runs"] = docs
        out.write_text(json.dumps(doc, indent=2) + "\n")
        m = info
        body = sections[0].split("\n\n", 1)[1] if len(sections) == 1 else "\n\n".join(sections)
        out.with_suffix(".md").write_text(
            f"# Foundation benchmark ({args.backend} backend)\n\n`{command}`\n\n"
            f"Machine: {m['cores']} cores, {m['cpu']}, {m['system']}; Python {m['python']}, "
            f"pyzmq {m['pyzmq']} (libzmq {m['libzmq']}), msgpack {m['msgpack']}. "
            f"Medians of {args.repeats} repeats ({args.bulk_repeats} for copies), the two agents "
            f"interleaved; the xpu-server, echo server and both agents share the machine (load average before "
            f"{m['load_before']}, after {doc['load_after']}). Workers and the echo server run with "
            f"GLIBC_TUNABLES={m['worker_glibc_tunables'] or '(none)'}, transparent huge pages "
            f"{m['transparent_hugepage']}.\n\n"
            f"{body}\n\nCPU times come from /proc/PID/stat at 10 ms resolution (coarse for the copies).\n")
        print(f"\nwrote {out} and {out.with_suffix('.md')}")
    return 0


def curve_table(off: list[dict[str, Any]], on: list[dict[str, Any]]) -> str:
    """The shim's figures and their baselines, without and with CURVE, side by side."""
    lines = ["| figure | unit | shim, CURVE off | shim, CURVE on | on / off | baseline off | baseline on |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for a, b in zip(off, on):
        lines.append(f"| {a['figure']} | {a['unit']} | {_fmt(a['shim'])} | {_fmt(b['shim'])} | "
                     f"{b['shim'] / a['shim']:.2f}x | {_fmt(a['baseline'])} | {_fmt(b['baseline'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
