"""The fast lane: hot async calls queued by the shim in C (interpose/lane.h, client/lane.py) and run by the
server as the calls they name. NVIDIA's libcudart drives it through the shim; the server's side is also
fed records directly, well-formed and not."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Server, shim_env, start_server, with_and_without_lane
from pyclient import CTX, PyClient
from toolchain import cudart_path

from xpuremote.client import call_cpu
from xpuremote.protocol import abi, errors
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.errors import CudaError

SCRIPT = Path(__file__).resolve().parent / "programs" / "cudart_check.py"
MEMSET = CALLS["cuMemsetD8Async"]


def lane_calls(server: Server) -> list[tuple[int, int]]:
    """(calls, of them from the lane) of each session the server has ended."""
    return [(int(a), int(b)) for a, b in re.findall(r"ended: (\d+) calls \((\d+) from the fast lane", server.log())]


@pytest.mark.parametrize("lane", ["1", "0"], ids=["lane", "no-lane"])
def test_libcudart_async_calls_from_threads_arrive_in_order(tmp_path: Path, shim: Path, lane: str) -> None:
    cudart = cudart_path(13)
    if cudart is None:
        pytest.skip("the CUDA 13 runtime wheel is not installed")
    server = start_server(tmp_path)
    try:
        proc = subprocess.run([sys.executable, str(SCRIPT), cudart, "many_async"], capture_output=True, text=True,
                              timeout=300, env=shim_env(shim, server.address, XPU_LANE=lane))
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    finally:
        server.stop()
    [(calls, from_lane)] = lane_calls(server)
    if lane == "1":  # every memset, record and wait took the lane, but those made before a context was ready
        assert from_lane >= 6000 - 4 * 3, (calls, from_lane)
    else:
        assert from_lane == 0 and calls > 6000


def records(*calls: tuple[int, list[int]], ctx: int = CTX) -> bytes:
    return b"".join(abi.pack_lane_record(opcode=opcode, nargs=len(args), blob_at=abi.LANE_NO_BLOB, ctx=ctx)
                    + struct.pack(f"<{len(args)}Q", *args) for opcode, args in calls)


def post_lane(client: PyClient, data: bytes, size: int | None = None) -> None:
    client.post("xpuLane", data, len(data) if size is None else size)


def test_the_server_runs_lane_records_and_refuses_bad_ones(server: Server) -> None:
    client = PyClient(server.address)
    try:
        base = client.alloc(4096)
        post_lane(client, records(*((MEMSET.opcode, [base + 256 * i, i + 1, 256, 0]) for i in range(16))))
        assert client.read(base, 4096) == b"".join(bytes([i + 1]) * 256 for i in range(16))

        # a call a lane may not carry (it has outputs) and an address outside the session: each refused, deferred
        # under its own name, and the records around them run
        alloc = CALLS["cuMemAlloc_v2"]
        post_lane(client, records((MEMSET.opcode, [base, 0xAA, 16, 0]), (alloc.opcode, [8, 64]),
                                  (MEMSET.opcode, [0x1000, 0, 16, 0]), (MEMSET.opcode, [base + 16, 0xBB, 16, 0])))
        with pytest.raises(CudaError) as refused:
            client.read(base, 32)
        assert refused.value.code == errors.NOT_SUPPORTED and "cuMemAlloc_v2" in refused.value.detail
        assert client.read(base, 32) == b"\xaa" * 16 + b"\xbb" * 16

        # cut short, a blob past the end, a size that does not match: refused, the session goes on
        good = records((MEMSET.opcode, [base, 1, 1, 0]))  # would set the first byte, 0xAA so far
        blob_past_end = abi.pack_lane_record(opcode=MEMSET.opcode, nargs=4, blob_len=1 << 20, ctx=CTX) + bytes(32)
        for data, size in ((good[:-3], None), (blob_past_end, None), (good, len(good) + 8), (b"\x00" * 7, None)):
            post_lane(client, data, size)
            assert client.status_of("cuCtxSynchronize") == errors.INVALID_VALUE
        assert client.read(base, 2) == b"\xaa\xaa"
    finally:
        client.close()


# Context questions asked after each step of a context's life: answered in C (interpose/answers.h) while the
# lane is open, by the client with XPU_LANE=0; the two runs must print the same.
CONTEXT_QUESTIONS = r"""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
c_int, c_uint, c_void_p, byref = ctypes.c_int, ctypes.c_uint, ctypes.c_void_p, ctypes.byref

def ask(step):
    cur, dev, flags, active = c_void_p(), c_int(-1), c_uint(), c_int()
    answers = [cu.cuCtxGetCurrent(byref(cur)), cu.cuCtxGetDevice(byref(dev)), dev.value]
    dev.value = -1
    answers += [cu.cuCtxGetDevice_v2(byref(dev), c_void_p(0)), dev.value]
    for d in (0, 1, 2):
        flags.value, active.value = 99, 99
        answers += [cu.cuDevicePrimaryCtxGetState(d, byref(flags), byref(active)), flags.value, active.value]
    answers += [cu.cuCtxGetDevice(None), cu.cuDevicePrimaryCtxGetState(0, None, byref(active))]
    print(step, cur.value is not None, answers, flush=True)

def check(rc, what):
    if rc:
        sys.exit(f"{what} failed: {rc}")

ask("before cuInit")
check(cu.cuInit(0), "cuInit")
ask("after cuInit")
primary, ctx, popped = c_void_p(), c_void_p(), c_void_p()
check(cu.cuDevicePrimaryCtxSetFlags(1, 4), "cuDevicePrimaryCtxSetFlags")
check(cu.cuDevicePrimaryCtxRetain(byref(primary), 1), "cuDevicePrimaryCtxRetain")
ask("primary 1 retained, not current")
check(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
ask("primary 1 current")
check(cu.cuCtxCreate_v2(byref(ctx), 0, 0), "cuCtxCreate")
ask("a context of device 0 pushed")
dev = c_int(-1)
print("of the primary", cu.cuCtxGetDevice_v2(byref(dev), primary), dev.value, flush=True)
check(cu.cuCtxPopCurrent_v2(byref(popped)), "cuCtxPopCurrent")
ask("popped")
check(cu.cuCtxDestroy_v2(ctx), "cuCtxDestroy")
print("of the destroyed", cu.cuCtxGetDevice_v2(byref(dev), ctx), flush=True)
check(cu.cuCtxSetFlags(8), "cuCtxSetFlags")
ask("primary 1 flags set through its context")
check(cu.cuDevicePrimaryCtxRelease_v2(1), "cuDevicePrimaryCtxRelease")
ask("primary 1 released")
check(cu.cuDevicePrimaryCtxRetain(byref(primary), 0), "cuDevicePrimaryCtxRetain")
check(cu.cuDevicePrimaryCtxReset_v2(0), "cuDevicePrimaryCtxReset")
ask("primary 0 reset")
check(cu.cuCtxSetCurrent(None), "cuCtxSetCurrent")
ask("none current")
"""


def test_context_questions_answered_in_c_match_the_clients_answers(two_devices: Server, shim: Path) -> None:
    runs = {}
    for lane in ("1", "0"):
        proc = subprocess.run([sys.executable, "-c", CONTEXT_QUESTIONS], capture_output=True, text=True, timeout=120,
                              env=shim_env(shim, two_devices.address, XPU_LANE=lane))
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        runs[lane] = proc.stdout
    assert runs["1"] == runs["0"], (runs["1"], runs["0"])
    lines = runs["1"].splitlines()
    assert len(lines) == 12 and "of the primary 0 1" in runs["1"], runs["1"]
    assert lines[3].startswith("primary 1 current True [0, 0, 1, 0, 1, 0, 0, 0, 0, 4, 1, 101"), lines[3]


def test_the_clients_cpu_per_call_counts_what_reaches_the_core(tmp_path: Path, shim: Path, server: Server) -> None:
    """XPU_CALL_CPU (bench/client_cpu.py's source): each entry point the core ran, with its calls and their CPU;
    the memsets the lane took in C are not among them, nor does the accounting close the lane."""
    cudart = cudart_path(13)
    if cudart is None:
        pytest.skip("the CUDA 13 runtime wheel is not installed")
    table = tmp_path / "cpu-%p.tsv"
    proc = subprocess.run([sys.executable, str(SCRIPT), cudart, "many_async"], capture_output=True, text=True,
                          timeout=300, env=shim_env(shim, server.address, XPU_CALL_CPU=str(table)))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    [written] = tmp_path.glob("cpu-*.tsv")
    assert written.name[4:-4].isdigit()  # %p: the process id
    spent = call_cpu.read(written)
    assert spent["cuMemAlloc_v2"][0] >= 4 and spent["cuMemAlloc_v2"][1] > 0, spent
    assert set(spent) <= set(CALLS), set(spent) - set(CALLS)
    memsets = sum(n for name, (n, _) in spent.items() if name.startswith("cuMemset"))
    assert memsets <= 4 * 3, spent  # of 6,000: the lane took them but those made before a context was ready
    rows = list(spent.values())
    assert rows == sorted(rows, key=lambda row: -row[1])  # dearest first


# Device-to-device copies, graph launches and a default stream's capture question: queued or answered in C
# while the lane is open, by the client with XPU_LANE=0; the two runs must print the same.
GRAPHS_AND_COPIES = r"""
import ctypes, struct, sys
cu = ctypes.CDLL("libcuda.so.1")
c_int, c_void_p, byref = ctypes.c_int, ctypes.c_void_p, ctypes.byref
N = 256

def check(rc, what):
    if rc:
        sys.exit(f"{what} failed: {rc}")

def alloc():
    p = c_void_p()
    check(cu.cuMemAlloc_v2(byref(p), 4 * N), "cuMemAlloc")
    return p

def read(p):
    host = ctypes.create_string_buffer(4 * N)
    check(cu.cuMemcpyDtoH_v2(host, p, 4 * N), "cuMemcpyDtoH")
    return sorted(set(struct.unpack(f"<{N}I", host.raw)))

def capturing(stream):
    status = c_int(-1)
    return cu.cuStreamIsCapturing(stream, byref(status)), status.value

ctx, stream, graph, graph_exec = c_void_p(), c_void_p(), c_void_p(), c_void_p()
check(cu.cuInit(0), "cuInit")
check(cu.cuDevicePrimaryCtxRetain(byref(ctx), 0), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
x, y, z = alloc(), alloc(), alloc()
check(cu.cuStreamCreate(byref(stream), 1), "cuStreamCreate")
print("default streams", [capturing(c_void_p(s)) for s in (0, 1, 2)], "a stream", capturing(stream))
check(cu.cuMemsetD32Async(x, 5, N, None), "cuMemsetD32Async")
check(cu.cuMemcpyDtoDAsync_v2(z, x, 4 * N, None), "cuMemcpyDtoDAsync")
check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
print("copied", read(z))
check(cu.cuStreamBeginCapture_v2(stream, 2), "cuStreamBeginCapture")
print("capturing", capturing(stream), "the default stream", capturing(None))
check(cu.cuMemsetD32Async(x, 7, N, stream), "cuMemsetD32Async in the capture")
check(cu.cuMemcpyDtoDAsync_v2(y, x, 4 * N, stream), "cuMemcpyDtoDAsync in the capture")
check(cu.cuStreamEndCapture(stream, byref(graph)), "cuStreamEndCapture")
check(cu.cuGraphInstantiateWithFlags(byref(graph_exec), graph, 0), "cuGraphInstantiate")
for i in range(5):
    check(cu.cuMemsetD32Async(y, i, N, stream), "cuMemsetD32Async between launches")
    check(cu.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")
check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
print("launched", read(y), read(x))
check(cu.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")
print("a destroyed instantiation", cu.cuGraphLaunch(graph_exec, stream), cu.cuStreamSynchronize(stream))
"""


def test_copies_graph_launches_and_capture_questions_take_the_lane(tmp_path: Path, shim: Path,
                                                                     server: Server) -> None:
    """cuMemcpyDtoDAsync takes the lane; a graph's launches do once the client has seen its instantiation has no
    host copies, until it is destroyed; cuStreamIsCapturing of a default stream is answered in C. The core sees
    only the first launch and the questions it must answer (a stream of the application's, a capture)."""
    runs = with_and_without_lane(GRAPHS_AND_COPIES, server.address, tmp_path, shim, timeout=120)
    lines = runs["1"][0].splitlines()
    assert lines[0] == "default streams [(0, 0), (0, 0), (0, 0)] a stream (0, 0)", lines
    assert lines[1] == "copied [5]" and lines[2] == "capturing (0, 1) the default stream (0, 0)", lines
    assert lines[3] == "launched [7] [7]", lines
    assert lines[4].startswith("a destroyed instantiation 0 ") and not lines[4].endswith(" 0"), lines
    in_c, by_core = runs["1"][1], runs["0"][1]
    # the first launch, and the destroyed instantiation's: forgotten by C at the destroy
    assert by_core["cuGraphLaunch"][0] == 6 and in_c["cuGraphLaunch"][0] == 2, (in_c, by_core)
    # the copy outside the capture took the lane; the one in it, the client's way (a capture is the client's)
    assert by_core["cuMemcpyDtoDAsync_v2"][0] == 2 and in_c["cuMemcpyDtoDAsync_v2"][0] == 1, (in_c, by_core)
    # asked 6 times: of the application's stream (twice) and in the capture (twice) the core answers
    assert by_core["cuStreamIsCapturing"][0] == 6 and in_c["cuStreamIsCapturing"][0] == 3, (in_c, by_core)
