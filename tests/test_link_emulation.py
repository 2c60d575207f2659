"""The emulated link (protocol/link.py, XPU_LINK_RTT_US / XPU_LINK_GBPS): the session over it is the session
that runs without it, its data connection and fast lane in use, and every channel's messages are delayed.

Times are asserted as lower bounds only (what the link must add at least), never as upper bounds: a loaded
machine only ever makes a run slower.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import Server, shim_env, start_server
from pyclient import wait_for
from test_faults import program

from xpuremote.client.connection import Connection
from xpuremote.protocol import wire
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.link import LinkSpec

MIB = 1 << 20
CTX = 0x7C00_0000_1000
ENDED = re.compile(r"session (\S+) ended: (\d+) calls \((\d+) from the fast lane, in (\d+) lanes\).*?(\d+) bytes on "
                   r"the data connection, (\d+) messages there")
HELD = re.compile(r"session (\S+): the emulated link held (\d+) messages from ZeroMQ and (\d+) from the data "
                  r"connection")

# Memsets queued in C (the lane) and sent by the flusher on ZeroMQ, then a copy the application waits for on the
# data connection, which must see them: the worker serves a message there after the batches it names as `after`.
ORDERED = """
size = 2 << 20
ctx, ptr = setup(size)
out = ctypes.create_string_buffer(size)
for value in range(1, 9):
    check(cu.cuMemsetD8Async(c_uint64(ptr), value, c_size_t(size), None), "cuMemsetD8Async")
    time.sleep(0.003)  # past the batch window: the flusher sends the lane's batch on ZeroMQ
    check(cu.cuMemcpyDtoH_v2(out, c_uint64(ptr), c_size_t(size)), "cuMemcpyDtoH")
    if out.raw != bytes([value]) * size:
        print("FAIL the copy did not see the memset before it", value, flush=True)
        raise SystemExit(2)
print("copies", roundtrip(ptr, size), flush=True)
"""


def ended(server: Server, session: str | None = None) -> dict[str, int]:
    """The counters of the session's end in the server's log (the only session's, without `session`), and the
    messages its emulated link held."""
    found: dict[str, int] = {}

    def look() -> bool:
        text = server.log()
        ends = [m for m in ENDED.finditer(text) if session in (None, m[1])]
        if not ends:
            return False
        end = ends[-1]
        found.update(calls=int(end[2]), lane_calls=int(end[3]), lanes=int(end[4]), data_bytes=int(end[5]),
                     data_messages=int(end[6]))
        for held in HELD.finditer(text):
            if held[1] == end[1]:
                found.update(held_zmq=int(held[2]), held_data=int(held[3]))
        return True

    assert wait_for(look, 10), server.log()[-3000:]
    return found


@pytest.mark.parametrize("rtt_us", ["0", "1000"])
def test_an_emulated_link_keeps_the_lane_and_the_data_connection(shim: Path, tmp_path: Path, rtt_us: str) -> None:
    """Over an emulated link (even one of 0 µs), the lane queues the memsets in C and the data connection carries
    the copies and the calls waited for, as without one; the link holds messages of both channels; and a copy
    on the data connection sees the memsets the flusher sent before it on ZeroMQ."""
    server = start_server(tmp_path)
    try:
        proc = subprocess.run(program(ORDERED), capture_output=True, text=True, timeout=120,
                              env=shim_env(shim, server.address, XPU_LINK_RTT_US=rtt_us))
        assert proc.returncode == 0 and "copies True" in proc.stdout, proc.stdout + proc.stderr[-3000:]
        counts = ended(server)
    finally:
        server.stop()
    assert counts["lane_calls"] >= 8 and counts["lanes"] >= 8, counts
    assert counts["data_messages"] >= 10 and counts["data_bytes"] >= 10 * (2 << 20), counts
    assert counts["held_data"] >= 10 and counts["held_zmq"] >= 8, counts


def session(server: Server, link: LinkSpec) -> Connection:
    conn = Connection(server.address, 10.0, 50.0, link)
    conn.post(CALLS["cuCtxCreate_v2"], [CTX, 0, 0], None)
    return conn


def test_a_sync_call_takes_a_round_trip_on_the_data_connection(server: Server) -> None:
    """Each cuCtxSynchronize over an emulated RTT of 2 ms goes on the data connection and takes at least the
    2 ms: half of it to the worker, half back."""
    conn = session(server, LinkSpec(rtt_us=2000.0))
    sync, n = CALLS["cuCtxSynchronize"], 10
    try:
        assert conn.data is not None, "the data connection stays on over an emulated link"
        conn.call(sync, [], CTX)
        began = time.monotonic()
        for _ in range(n):
            status, _, _ = conn.call(sync, [], CTX)
            assert status == 0
        took = time.monotonic() - began
    finally:
        conn.close()
    assert took >= n * 2e-3, f"{n} round trips over 2 ms took {took * 1e3:.1f} ms"
    counts = ended(server, conn.session)
    assert counts["data_messages"] >= n + 1 and counts["held_data"] >= n + 1, counts


def test_a_large_copy_on_the_data_connection_takes_its_bytes_at_the_links_rate(server: Server) -> None:
    """8 MiB to the device and back at an emulated 1 Gbit/s go on the data connection, their bytes correct, and
    each copy takes at least its bytes' time on the link (67 ms)."""
    conn = session(server, LinkSpec(gbps=1.0))
    size = 8 * MIB
    data = bytes(range(256)) * (size // 256)
    on_wire = size * 8 / 1e9
    try:
        assert conn.data is not None
        ptr = int.from_bytes(conn.call(CALLS["cuMemAlloc_v2"], [8, size], CTX)[1][0], "little")
        began = time.monotonic()
        up = conn.call(CALLS["cuMemcpyHtoD_v2"], [ptr, wire.Data(memoryview(data)), size], CTX, by_data=True)
        up_s = time.monotonic() - began
        out = bytearray(size)
        began = time.monotonic()
        down = conn.call(CALLS["cuMemcpyDtoH_v2"], [wire.Data(memoryview(out), asked=True), ptr, size], CTX,
                         by_data=True)
        down_s = time.monotonic() - began
    finally:
        conn.close()
    assert up[0] == 0 and down[0] == 0 and out == data
    assert up_s >= on_wire and down_s >= on_wire, f"{up_s * 1e3:.1f} and {down_s * 1e3:.1f} ms for {size} bytes"
    counts = ended(server, conn.session)
    assert counts["data_bytes"] >= 2 * size, counts


def test_a_malformed_link_setting_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="XPU_LINK_RTT_US and XPU_LINK_GBPS must be non-negative"):
        LinkSpec.from_env({"XPU_LINK_RTT_US": "-5"})
    with pytest.raises(ValueError, match="XPU_LINK_RTT_US and XPU_LINK_GBPS must be non-negative"):
        LinkSpec.from_env({"XPU_LINK_GBPS": "nan"})
    assert LinkSpec.from_env({"XPU_LINK_GBPS": "0"}) == LinkSpec(0.0, 0.0, True)
