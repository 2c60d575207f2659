"""Faults: an unreachable or dying server, garbage on the wire, dying clients, fork, version skew.

Every failure must be bounded in time and reported as a CUresult with a reason in the log;
nothing may hang, and one client's faults must never hurt the server or another client.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from conftest import ROOT, Server, free_port, shim_env, start_server
from pyclient import wait_for

from xpuremote.protocol import errors, wire
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.server.backends import sim

# A client written against the driver ABI with ctypes only: `check(rc, what)` exits on failure.
PRELUDE = """
import ctypes, os, sys, time
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")

def check(rc, what):
    if rc:
        print(f"FAIL {what}: {rc}", flush=True)
        os._exit(2)

def setup(size=4096):
    check(cu.cuInit(0), "cuInit")
    dev = c_int()
    check(cu.cuDeviceGet(byref(dev), 0), "cuDeviceGet")
    ctx = c_void_p()
    check(cu.cuCtxCreate_v2(byref(ctx), 0, dev), "cuCtxCreate")
    ptr = c_uint64()
    check(cu.cuMemAlloc_v2(byref(ptr), c_size_t(size)), "cuMemAlloc")
    return ctx, ptr.value

def roundtrip(ptr, size=4096, seed=1):
    data = bytes((i * 31 + seed) & 0xFF for i in range(size))
    check(cu.cuMemcpyHtoD_v2(c_uint64(ptr), data, c_size_t(size)), "cuMemcpyHtoD")
    out = ctypes.create_string_buffer(size)
    check(cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(size)), "cuMemcpyDtoH")
    return out.raw == data
"""


def program(body: str) -> list[str]:
    return [sys.executable, "-c", PRELUDE + body]


def pids_of_children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (the daemon's workers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Lines:
    """A child's stdout, read by a thread, with timestamps: wait for a line without blocking forever."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()

    def wait(self, pattern: str, timeout: float) -> tuple[float, str] | None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for stamp, line in self.lines:
                    if re.search(pattern, line):
                        return stamp, line
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)


def spawn(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, Lines]:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, Lines(proc)


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for a child (killing it if it overstays); its stderr."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return proc.stderr.read()


@pytest.fixture
def private_server(tmp_path: Path) -> Iterator[Server]:
    srv = start_server(tmp_path)
    yield srv
    for pid in pids_of_children(srv.process.pid):
        os.kill(pid, signal.SIGKILL)
    srv.stop()


# ---- a client that cannot start, and bad arguments: errors, never a silent success ----------------------
CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_INITIALIZED = 1, 3
CUBLAS_STATUS_NOT_INITIALIZED, NVML_ERROR_UNINITIALIZED = 1, 1


def test_a_client_that_cannot_start_fails_every_call(server: Server, shim: Path, tmp_path: Path) -> None:
    """A broken install (the client core missing beside libcuda.so.1): the client cannot start, and every
    entry point, the math libraries' and NVML's included, must say so instead of answering 0."""
    broken = tmp_path / "shim"
    shutil.copytree(shim.parent, broken)
    (broken / "libxpuremote-core.so").unlink()
    body = """
n, p, buf = c_int(-1), c_uint64(), ctypes.create_string_buffer(8)
handle = c_void_p()
print(cu.cuInit(0), cu.cuDeviceGetCount(byref(n)), cu.cuMemAlloc_v2(byref(p), c_size_t(64)),
      cu.cuMemcpyDtoH_v2(buf, c_uint64(p.value), c_size_t(8)),
      ctypes.CDLL("libcublas.so.13").cublasCreate_v2(byref(handle)),
      ctypes.CDLL("libnvidia-ml.so.1").nvmlInit_v2(), n.value, flush=True)
"""
    proc = subprocess.run(program(body), env=shim_env(broken / "libcuda.so.1", server.address), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(CUDA_ERROR_NOT_INITIALIZED)] * 4 + [
        str(CUBLAS_STATUS_NOT_INITIALIZED), str(NVML_ERROR_UNINITIALIZED), "-1"], proc.stderr
    assert proc.stderr.count("the CUDA client could not start") == 1, proc.stderr
    assert "libxpuremote-core.so" in proc.stderr and "fix:" in proc.stderr


def test_null_pointers_are_invalid_value_and_lose_nothing(run_on) -> None:
    """NULL where the driver needs memory: CUDA_ERROR_INVALID_VALUE, no crash, no lost batch."""
    body = """
ctx, ptr = setup()
check(cu.cuMemsetD8Async(c_uint64(ptr), 7, c_size_t(64), None), "queued memset")
pitch, out = c_size_t(), c_uint64()
got = [cu.cuPointerGetAttribute(None, 1, c_uint64(ptr)),  # CU_POINTER_ATTRIBUTE_CONTEXT
       cu.cuMemcpy2D_v2(None), cu.cuMemcpy2DAsync_v2(None, None), cu.cuMemcpy3D_v2(None),
       cu.cuMemcpyDtoH_v2(None, c_uint64(ptr), c_size_t(8)),
       cu.cuMemcpyHtoDAsync_v2(c_uint64(ptr), None, c_size_t(8), None),
       cu.cuMemcpy(None, c_uint64(ptr), c_size_t(8)),
       cu.cuMemAllocPitch_v2(None, byref(pitch), c_size_t(64), c_size_t(4), 4),
       cu.cuMemAllocPitch_v2(byref(out), None, c_size_t(64), c_size_t(4), 4),
       cu.cuMemGetInfo_v2(None, None)]
buf = ctypes.create_string_buffer(64)
check(cu.cuMemcpyDtoH_v2(buf, c_uint64(ptr), c_size_t(64)), "read back")
least = c_int(1)
check(cu.cuCtxGetStreamPriorityRange(byref(least), None), "priority range with one NULL (allowed)")
print(*got, buf.raw == bytes([7]) * 64, roundtrip(ptr), flush=True)
"""
    proc = run_on(program(body), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    *codes, memset_landed, roundtrip_ok = proc.stdout.split()
    assert codes == [str(CUDA_ERROR_INVALID_VALUE)] * 10, proc.stderr
    assert memset_landed == roundtrip_ok == "True", proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_the_device_claims_no_feature_that_is_not_forwarded(run_on) -> None:
    """The sim (like an H100) has managed memory; xpuremote does not forward it, nor exportable memory,
    so the device must not claim them: an application that believed it would fail later. Memory pools
    and VMM are forwarded: the device says so."""
    assert sim.DEVICE_ATTRIBUTES["MANAGED_MEMORY"] == sim.DEVICE_ATTRIBUTES["MEMORY_POOLS_SUPPORTED"] == 1
    names = ("MANAGED_MEMORY", "CONCURRENT_MANAGED_ACCESS", "IPC_EVENT_SUPPORTED", "MEMPOOL_SUPPORTED_HANDLE_TYPES",
             "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", "MEMORY_POOLS_SUPPORTED",
             "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", "WARP_SIZE")
    codes = [ENUMS[f"CU_DEVICE_ATTRIBUTE_{name}"] for name in names]
    body = f"""
check(cu.cuInit(0), "cuInit")
values = []
for code in {codes}:
    v = c_int(-1)
    check(cu.cuDeviceGetAttribute(byref(v), code, 0), f"attribute {{code}}")
    values.append(v.value)
print(*values)
"""
    proc = run_on(program(body), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["0"] * 5 + ["1", "1", "32"], proc.stdout  # what is forwarded tells its value


# ---- (a) nobody listening ----------------------------------------------------------------------------
def test_unreachable_server_fails_fast_and_names_the_address(run_on) -> None:
    address = f"tcp://127.0.0.1:{free_port()}"  # closed: nothing listens there
    body = """
t = time.monotonic()
rc = cu.cuInit(0)
count = c_int(-1)
rc2 = cu.cuDeviceGetCount(byref(count))
print(f"cuInit {rc} {time.monotonic() - t:.2f} then {rc2}", flush=True)
"""
    start = time.monotonic()
    result = run_on(program(body), timeout=30, address=address, XPU_CONNECT_TIMEOUT_S="2")
    elapsed = time.monotonic() - start
    assert result.returncode == 0, result.stderr
    m = re.search(r"cuInit (\d+) ([\d.]+) then (\d+)", result.stdout)
    assert m, result.stdout + result.stderr
    assert int(m.group(1)) != 0, "cuInit succeeded with no server"
    assert int(m.group(3)) == errors.NOT_INITIALIZED, "a call after a failed cuInit must say NOT_INITIALIZED"
    assert float(m.group(2)) < 5 and elapsed < 10, f"cuInit took {m.group(2)} s, the process {elapsed:.1f} s"
    assert address in result.stderr, f"the error does not name {address}:\n{result.stderr}"


# A client that copies until a call fails, then says how it failed.
COPY_UNTIL_FAILURE = """
out = ctypes.create_string_buffer(4096)
print("ready", flush=True)
while True:
    t = time.monotonic()
    rc = cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(4096))
    if rc:
        print(f"failed {rc} after {time.monotonic() - t:.3f}", flush=True)
        break
    time.sleep(0.005)
"""


# ---- (b) the server dies under a running client --------------------------------------------------------
def test_server_killed_mid_run_fails_the_next_call(shim: Path, private_server: Server) -> None:
    body = """
ctx, ptr = setup()
assert roundtrip(ptr)
""" + COPY_UNTIL_FAILURE + """
t = time.monotonic()
rc = cu.cuCtxSynchronize()
print(f"then {rc} after {time.monotonic() - t:.3f}", flush=True)
rc = cu.cuMemsetD8_v2(c_uint64(ptr), 1, c_size_t(16))
print(f"async {rc}", flush=True)
"""
    proc, lines = spawn(program(body), shim_env(shim, private_server.address))
    try:
        assert lines.wait("^ready", 30), finish(proc, 1)
        workers = pids_of_children(private_server.process.pid)
        assert workers, "the daemon has no worker for the client"
        time.sleep(0.3)  # let it loop on synchronous calls
        killed = time.monotonic()
        os.kill(private_server.process.pid, signal.SIGKILL)
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        private_server.process.wait(5)
        failed = lines.wait("^failed", 15)
        assert failed, f"no call failed within 15 s of the server's death:\n{finish(proc, 1)}"
        assert failed[0] - killed < 10, f"the first failure came {failed[0] - killed:.1f} s after the kill"
        rc = int(failed[1].split()[1])
        assert rc != 0
        then = lines.wait("^then", 10)
        assert then, "the call after the failure did not return"
        code, took = int(then[1].split()[1]), float(then[1].split()[3])
        assert code != 0 and took < 1, f"the next call returned {code} after {took} s"
        assert lines.wait(r"^async [1-9]\d*", 10), "an async call after the failure did not fail"
        stderr = finish(proc, 10)
        assert proc.returncode == 0, stderr
        assert private_server.address in stderr, f"the error does not name the server:\n{stderr}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_frozen_server_fails_the_call_in_flight(shim: Path, private_server: Server) -> None:
    """A server that stops answering but keeps its TCP connections open (SIGSTOP here; a hung
    host or a partition in life): ZeroMQ heartbeats must fail the call, not leave it waiting."""
    body = """
ctx, ptr = setup()
""" + COPY_UNTIL_FAILURE
    proc, lines = spawn(program(body), shim_env(shim, private_server.address))
    stopped = []
    try:
        assert lines.wait("^ready", 30), finish(proc, 1)
        for pid in [private_server.process.pid, *pids_of_children(private_server.process.pid)]:
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        frozen = time.monotonic()
        failed = lines.wait("^failed", 20)
        assert failed, f"the call did not fail within 20 s of the server freezing:\n{finish(proc, 1)}"
        assert failed[0] - frozen < 10, f"the call failed {failed[0] - frozen:.1f} s after the freeze"
        stderr = finish(proc, 10)
        assert private_server.address in stderr, stderr
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- (c) garbage on the wire ---------------------------------------------------------------------------
def pack(header: Any) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def ext(index: int) -> msgpack.ExtType:
    return msgpack.ExtType(wire.BULK, index.to_bytes(4, "little"))


HELLO = {"v": wire.PROTOCOL_VERSION, "op": "hello", "client": {"pid": 1, "host": "test", "user": "garbage"}}
MALFORMED: dict[str, list[bytes]] = {
    "empty frame": [b""],
    "non-msgpack bytes": [b"\xc1\xc1 this is not msgpack \xc1"],
    "truncated msgpack": [pack(HELLO)[:-5]],
    "trailing bytes": [pack(HELLO) + b"\x00\x01"],
    "wrong protocol version": [pack({**HELLO, "v": wire.PROTOCOL_VERSION + 41})],
    "no protocol version": [pack({k: v for k, v in HELLO.items() if k != "v"})],
    "header not a map": [pack([1, 2, 3])],
    "op not a string": [pack({"v": wire.PROTOCOL_VERSION, "op": 7})],
    "unknown op": [pack({"v": wire.PROTOCOL_VERSION, "op": "frobnicate"})],
    "bulk reference to a missing frame": [pack({**HELLO, "data": ext(3)})],
    "bulk reference of a bad length": [pack({**HELLO, "data": msgpack.ExtType(wire.BULK, b"\x00")})],
    "unknown ext type": [pack({**HELLO, "data": msgpack.ExtType(42, b"xx")})],
    "array claiming 4G elements": [b"\xdd\xff\xff\xff\xff"],
    "map claiming 4G entries": [b"\xdf\xff\xff\xff\xff"],
    "bytes claiming 4 GiB": [b"\x81\xa1v\xc6\xff\xff\xff\xff"],
    "100000 levels of nesting": [b"\x91" * 100_000 + b"\xc0"],
    "garbage in several frames": [b"\xc1", b"x" * 100_000, b""],
}


def dealer(ctx: zmq.Context, endpoint: str, key: bytes | None = None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    if key is not None:  # a worker serves only connections that present its session's key
        sock.setsockopt(zmq.ROUTING_ID, wire.routing_id(key))
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    return sock


def ask(sock: zmq.Socket, frames: list[Any], what: str) -> dict[str, Any]:
    sock.send_multipart(frames)
    try:
        return wire.decode(sock.recv_multipart())
    except zmq.Again:
        raise AssertionError(f"no answer within 5 s to: {what}") from None


def op(symbol: str) -> int:
    return CALLS[symbol].opcode


class Worker:
    """A raw session with a worker: `calls(...)` sends one batch with reply=true."""

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.seq = 0

    def calls(self, items: Any, what: str, frames: tuple[bytes, ...] = ()) -> dict[str, Any]:
        self.seq += 1
        header = {"v": wire.PROTOCOL_VERSION, "op": "calls", "seq": self.seq, "calls": items, "reply": True}
        answer = ask(self.sock, [pack(header), *frames], what)
        if answer.get("seq") is not None:
            assert answer["seq"] == self.seq, f"{what}: answer to batch {answer['seq']}, expected {self.seq}"
        return answer

    def ok(self, items: Any, what: str) -> list[Any]:
        answer = self.calls(items, what)
        assert answer["status"] == 0, f"{what}: {answer}"
        return answer["outs"]


CTX = 0x7C00_0000_1000
STREAM = 0x7C00_0000_2000
EVENT = 0x7C00_0000_3000


def garbage_calls(ptr: int) -> dict[str, Any]:
    """Batches that must each be answered with an error status (the value, or None for any)."""
    inv, unsupported, handle, oom = errors.INVALID_VALUE, errors.NOT_SUPPORTED, errors.INVALID_HANDLE, None
    alloc, dtoh, htod = op("cuMemAlloc_v2"), op("cuMemcpyDtoH_v2"), op("cuMemcpyHtoD_v2")
    return {
        "calls not a list": ("cuMemAlloc", inv),
        "calls empty": ([], inv),
        "a call not a list": ([5], inv),
        "a call of one element": ([[alloc]], inv),
        "arguments not a list": ([[alloc, "8, 16"]], inv),
        "unknown opcode": ([[0x7FFF_FFF1, []]], unsupported),
        "opcode a string": ([["cuMemAlloc_v2", [8, 16]]], unsupported),
        "opcode negative": ([[-1, []]], unsupported),
        "too few arguments": ([[alloc, [8]]], inv),
        "too many arguments": ([[alloc, [8, 16, 32]]], inv),
        "size a string": ([[alloc, [8, "16"]]], inv),
        "size a float": ([[alloc, [8, 16.5]]], inv),
        "size a bool": ([[alloc, [8, True]]], inv),
        "size None": ([[alloc, [8, None]]], inv),
        "size a list": ([[alloc, [8, [16]]]], inv),
        "size negative": ([[alloc, [8, -16]]], inv),
        "size zero": ([[alloc, [8, 0]]], inv),
        "cuMemAlloc of 2**62": ([[alloc, [8, 2**62]]], errors.OUT_OF_MEMORY),
        "cuMemAlloc of 2**64-1": ([[alloc, [8, 2**64 - 1]]], oom),
        "output size 2**60": ([[dtoh, [2**60, ptr, 16]]], inv),
        "output size negative": ([[dtoh, [-1, ptr, 16]]], inv),
        "output size a string": ([[dtoh, ["16", ptr, 16]]], inv),
        "copy of 2**60 bytes": ([[dtoh, [16, ptr, 2**60]]], inv),
        "copy past the allocation": ([[dtoh, [16, ptr + 4090, 16]]], inv),
        "copy from a wild address": ([[dtoh, [16, 0x1000, 16]]], inv),
        "input shorter than its count": ([[htod, [ptr, b"abc", 16]]], inv),
        "input longer than its count": ([[htod, [ptr, b"x" * 32, 16]]], inv),
        "input an integer": ([[htod, [ptr, 5, 16]]], inv),
        "input a list": ([[htod, [ptr, [1, 2], 2]]], inv),
        "memset of 2**40 bytes": ([[op("cuMemsetD8_v2"), [ptr, 1, 2**40]]], inv),
        "memset of 2**60 words": ([[op("cuMemsetD32_v2"), [ptr, 1, 2**60]]], inv),
        "memset value out of range": ([[op("cuMemsetD8_v2"), [ptr, 2**40, 1]]], inv),
        "2D memset 2**40 rows, pitch 0": ([[op("cuMemsetD2D8_v2"), [ptr, 0, 1, 1, 2**40]]], inv),
        "2D memset 2**40 rows": ([[op("cuMemsetD2D32_v2"), [ptr, 4096, 1, 1, 2**40]]], inv),
        "2D copy to host, 2**40 rows": ([[op("xpuMemcpy2DToHost"), [16, ptr, 0, 1, 2**40, 0]]], inv),
        "2D copy on device, 2**40 rows": ([[op("xpuMemcpy2DDevice"), [ptr, 64, ptr, 64, 64, 2**40, 0]]], inv),
        "free of a wild pointer": ([[op("cuMemFree_v2"), [0x1234_5678]]], inv),
        "sync of an unknown stream": ([[op("cuStreamSynchronize"), [0xDEAD_BEE0]]], handle),
        "stream handle a string": ([[op("cuStreamSynchronize"), ["stream"]]], handle),
        "stream handle negative": ([[op("cuStreamSynchronize"), [-5]]], handle),
        "context used as a stream": ([[op("cuStreamSynchronize"), [CTX]]], handle),
        "stream used as an event": ([[op("cuEventSynchronize"), [STREAM]]], handle),
        "current context unknown": ([[op("cuCtxSetCurrent"), [0x7C00_0000_0BAD]]], handle),
        "destroy an unknown event": ([[op("cuEventDestroy_v2"), [0x7C00_0000_0BAD]]], handle),
        "shadow handle reused": ([[op("cuStreamCreate"), [STREAM, 0]]], inv),
        "shadow handle zero": ([[op("cuStreamCreate"), [0, 0]]], inv),
        "shadow handle a string": ([[op("cuStreamCreate"), ["s", 0]]], inv),
        "shadow handle a float": ([[op("cuEventCreate"), [1.5, 0]]], inv),
        "elapsed time of unrecorded events": ([[op("cuEventElapsedTime_v2"), [4, EVENT, EVENT]]], None),
        "device out of range": ([[op("cuCtxCreate_v2"), [0x7C00_0000_5000, 0, 99]]], errors.INVALID_DEVICE),
        "device negative": ([[op("cuCtxCreate_v2"), [0x7C00_0000_6000, 0, -1]]], errors.INVALID_DEVICE),
        "device beyond int": ([[op("cuCtxCreate_v2"), [0x7C00_0000_7000, 0, 2**40]]], inv),
        "a good call, then a bad last one": ([[op("cuCtxSynchronize"), []], [alloc, [8, -1]]], inv),
        "1000 bad calls": ([[0x7FFF_FFF1, []]] * 1000, unsupported),
    }


def test_garbage_to_the_daemon_is_answered(private_server: Server) -> None:
    ctx = zmq.Context()
    try:
        sock = dealer(ctx, private_server.address)
        for what, frames in MALFORMED.items():
            answer = ask(sock, frames, what)
            assert answer["status"] != 0 and answer.get("error"), f"{what}: {answer}"
        for what, header in {"calls": {"op": "calls", "seq": 1, "calls": [], "reply": True},
                             "init": {"op": "init"}, "bye": {"op": "bye"}}.items():
            answer = ask(sock, wire.encode(header), what)
            assert answer["status"] == errors.INVALID_VALUE, f"{what}: {answer}"
            assert "hello" in answer["error"], f"{what}: {answer}"
        assert not pids_of_children(private_server.process.pid), "garbage started a worker"
        answer = ask(sock, wire.encode({"op": "hello", "client": "not a map"}), "hello with a bad client")
        assert answer["status"] == 0, answer  # tolerated: the client's description is informational
        answer = ask(sock, [pack(HELLO)], "a proper hello after the garbage")
        assert answer["status"] == 0 and answer["worker"].startswith("tcp://"), answer
    finally:
        ctx.destroy(0)
    assert private_server.process.poll() is None, "the daemon died"
    assert "Traceback" not in private_server.log(), private_server.log()


def test_garbage_to_a_worker_is_answered_and_the_server_keeps_serving(
        private_server: Server, run_on: Any) -> None:
    ctx = zmq.Context()
    try:
        hello = ask(dealer(ctx, private_server.address), [pack(HELLO)], "hello")
        assert hello["status"] == 0, hello
        worker = Worker(dealer(ctx, hello["worker"], hello["key"]))
        inventory = ask(worker.sock, wire.encode({"op": "init"}), "init")
        assert inventory["status"] == 0 and inventory["devices"], inventory
        for what, frames in MALFORMED.items():
            answer = ask(worker.sock, frames, what)
            assert answer["status"] != 0 and answer.get("error"), f"{what}: {answer}"
        answer = ask(worker.sock, wire.encode({"op": "hello", "client": {}}), "hello to a worker")
        assert answer["status"] != 0, answer

        # a context, a stream, an event and an allocation to aim the bad calls at
        worker.ok([[op("cuCtxCreate_v2"), [CTX, 0, 0]], [op("cuCtxSetCurrent"), [CTX]],
                   [op("cuStreamCreate"), [STREAM, 0]], [op("cuEventCreate"), [EVENT, 0]]], "set-up")
        (raw,) = worker.ok([[op("cuMemAlloc_v2"), [8, 4096]]], "cuMemAlloc")
        ptr = int.from_bytes(raw, "little")
        for what, (items, expected) in garbage_calls(ptr).items():
            answer = worker.calls(items, what)
            assert answer["status"] != 0, f"{what}: accepted: {answer}"
            if expected is not None:
                assert answer["status"] == expected, f"{what}: {errors.name(answer['status'])}: {answer}"

        # bulk references in a batch: to a frame that is missing, and to one that is there
        data = bytes(range(256)) * 16
        missing = worker.calls([[op("cuMemcpyHtoD_v2"), [ptr, ext(0), 4096]]], "bulk frame missing")
        assert missing["status"] != 0 and "missing" in missing.get("error", ""), missing
        missing = worker.calls([[op("cuMemcpyHtoD_v2"), [ptr, ext(1), 4096]]], "bulk frame 1 of 1", (data,))
        assert missing["status"] != 0, missing
        answer = worker.calls([[op("cuMemcpyHtoD_v2"), [ptr, ext(0), 4096]]], "a proper bulk frame", (data,))
        assert answer["status"] == 0, answer

        # async failures come back with the next answered batch
        seq = worker.seq = worker.seq + 1
        header = {"op": "calls", "seq": seq, "calls": [[op("cuMemFree_v2"), [0x4242]]], "reply": False}
        worker.sock.send_multipart(wire.encode(header))
        answer = worker.calls([[op("cuCtxSynchronize"), []]], "sync after a failed async call")
        assert answer["status"] == 0 and answer.get("deferred"), answer
        assert answer["deferred"][0][0] == "cuMemFree_v2" and answer["deferred"][0][1] == errors.INVALID_VALUE

        # the same session still computes right answers
        (back,) = worker.ok([[op("cuMemcpyDtoH_v2"), [4096, ptr, 4096]]], "DtoH after the garbage")
        assert bytes(back) == data
        big = os.urandom(3 << 20)
        (raw,) = worker.ok([[op("cuMemAlloc_v2"), [8, len(big)]]], "cuMemAlloc 3 MiB")
        big_ptr = int.from_bytes(raw, "little")
        worker.seq += 1
        batch = [[op("cuMemcpyHtoD_v2"), [big_ptr, memoryview(big), len(big)]],
                 [op("cuMemcpyDtoH_v2"), [len(big), big_ptr, len(big)]]]
        header = {"op": "calls", "seq": worker.seq, "calls": batch, "reply": True}
        answer = ask(worker.sock, wire.encode(header), "a 3 MiB round trip in bulk frames")
        assert answer["status"] == 0 and bytes(answer["outs"][0]) == big
        worker.ok([[op("cuMemsetD2D8_v2"), [ptr, 64, 0x5A, 64, 64]]], "a proper 2D memset")
        (back,) = worker.ok([[op("cuMemcpyDtoH_v2"), [4096, ptr, 4096]]], "DtoH after the 2D memset")
        assert bytes(back) == b"\x5a" * 4096

        # another client, through the shim and cuda-python, on the same server
        check = ROOT / "tests" / "programs" / "cuda_python_check.py"
        result = run_on([sys.executable, str(check)], timeout=60, address=private_server.address)
        assert result.returncode == 0 and "ALL OK" in result.stdout, (
            result.stdout[-3000:] + result.stderr[-3000:])

        bye = ask(worker.sock, wire.encode({"op": "bye"}), "bye")
        assert bye["status"] == 0, bye
        assert wait_for(lambda: re.search(rf"session {hello['session']} ended", private_server.log()), 5), \
            private_server.log()
    finally:
        ctx.destroy(0)
    assert private_server.process.poll() is None, "the daemon died"
    assert "Traceback" not in private_server.log(), private_server.log()


# ---- (d) the client dies -------------------------------------------------------------------------------
def test_killed_client_ends_its_worker(shim: Path, private_server: Server) -> None:
    body = """
ctx, ptr = setup(1 << 20)
assert roundtrip(ptr, 1 << 20)
print("ready", flush=True)
time.sleep(120)
"""
    proc, lines = spawn(program(body), shim_env(shim, private_server.address))
    try:
        assert lines.wait("^ready", 30), finish(proc, 1)
        match = re.search(rf"session_start session=(\S+) .*pid={proc.pid} ", private_server.log())
        assert match, private_server.log()
        session = match.group(1)
        workers = pids_of_children(private_server.process.pid)
        assert len(workers) == 1, workers
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
        assert wait_for(lambda: not alive(workers[0]), 5), "the worker outlived its client by 5 s"
        assert wait_for(lambda: f"session {session} ended" in private_server.log(), 2), private_server.log()
        assert re.search(rf"session {session} ended: \d+ calls \(\d+ from the fast lane", private_server.log())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- (e) fork ------------------------------------------------------------------------------------------
def test_forked_child_gets_an_error_and_the_parent_keeps_working(run_on) -> None:
    body = """
ctx, ptr = setup()
assert roundtrip(ptr, seed=3)
pid = os.fork()
if pid == 0:
    t = time.monotonic()
    results = []
    count = c_int(-1)
    results.append(cu.cuDeviceGetCount(byref(count)))
    child_ptr = c_uint64()
    results.append(cu.cuMemAlloc_v2(byref(child_ptr), c_size_t(64)))
    out = ctypes.create_string_buffer(16)
    results.append(cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(16)))
    results.append(cu.cuCtxSynchronize())
    results.append(cu.cuInit(0))
    print(f"child {' '.join(map(str, results))} in {time.monotonic() - t:.2f}", flush=True)
    sys.exit(0)  # a normal exit: atexit handlers and finalizers run in the child
deadline = time.monotonic() + 15
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    assert roundtrip(ptr, seed=int(time.monotonic() * 1000) & 0xFF), "parent broken while the child runs"
    time.sleep(0.01)
else:
    os.kill(pid, 9)
    print("child hung", flush=True)
    os._exit(3)
print(f"child status {status} signalled {os.WIFSIGNALED(status)}", flush=True)
for seed in range(5):
    assert roundtrip(ptr, seed=seed), "parent broken after the child"
check(cu.cuCtxSynchronize(), "parent cuCtxSynchronize")
print("parent ok", flush=True)
"""
    result = run_on(program(body), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    m = re.search(r"child ([\d ]+) in ([\d.]+)", result.stdout)
    assert m, result.stdout + result.stderr
    codes = [int(c) for c in m.group(1).split()]
    assert all(codes), f"a driver call succeeded in the forked child: {codes}"
    assert set(codes) == {errors.NOT_INITIALIZED}, [errors.name(c) for c in codes]
    assert float(m.group(2)) < 5
    assert "child status 0 signalled False" in result.stdout, result.stdout + result.stderr
    assert "parent ok" in result.stdout
    assert "fork" in result.stderr, f"the child's cuInit does not say why it failed:\n{result.stderr}"


# ---- (f) a runtime newer than the server's driver ------------------------------------------------------
def test_runtime_newer_than_the_server_driver(run_on) -> None:
    body = """
gpa = cu.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(c_void_p), c_int, c_uint64, ctypes.POINTER(c_int)]
fn, status = c_void_p(), c_int(-1)
check(gpa(b"cuDriverGetVersion", byref(fn), 99999, 0, byref(status)), "cuGetProcAddress_v2")
assert status.value == 0 and fn.value, (status.value, fn.value)
check(cu.cuInit(0), "cuInit")
version = c_int()
check(ctypes.CFUNCTYPE(c_int, ctypes.POINTER(c_int))(fn.value)(byref(version)), "cuDriverGetVersion")
again = c_int()
check(cu.cuDriverGetVersion(byref(again)), "cuDriverGetVersion again")
print(f"version {version.value} {again.value}", flush=True)
"""
    result = run_on(program(body), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    m = re.search(r"version (\d+) (\d+)", result.stdout)
    assert m, result.stdout + result.stderr
    server_version = int(m.group(1))
    assert server_version == int(m.group(2)) and 12000 <= server_version < 99999
    lines = [line for line in result.stderr.splitlines() if "99999" in line]
    assert len(lines) == 1, f"expected one line about the version skew:\n{result.stderr}"
    line = lines[0]
    assert str(server_version) in line and "server" in line and "driver" in line, line
    assert "runtime" in line and "update" in line, line


COUNT = ("import ctypes; cuda = ctypes.CDLL('libcuda.so.1'); n = ctypes.c_int(); "
         "print(cuda.cuInit(0), cuda.cuDeviceGetCount(ctypes.byref(n)), n.value >= 1)")


def test_xpu_log_calls_names_every_call_and_a_bad_level_is_said(run_on) -> None:
    """XPU_LOG=CALLS: each call as it starts, with its arguments (how a crash's last calls are
    found); a level that is not one is said, and the default kept."""
    traced = run_on([sys.executable, "-c", COUNT], timeout=60, XPU_LOG="CALLS")
    assert traced.stdout.split() == ["0", "0", "True"], traced.stderr[-3000:]
    assert re.search(r"^xpuremote: CALLS cuInit\(0,\)$", traced.stderr, re.M), traced.stderr[-3000:]
    assert re.search(r"^xpuremote: CALLS cuDeviceGetCount\(\d+,\)$", traced.stderr, re.M), traced.stderr[-3000:]
    bad = run_on([sys.executable, "-c", COUNT], timeout=60, XPU_LOG="loud")
    assert bad.stdout.split() == ["0", "0", "True"], bad.stderr[-3000:]
    assert "XPU_LOG=LOUD is not one of CALLS, DEBUG, INFO, WARNING, ERROR; using WARNING" in bad.stderr, bad.stderr
    assert "CALLS" not in bad.stderr.replace("not one of CALLS", "")
