"""Load: 32 clients at once, each running 1,000 randomised allocate / copy / free sequences with
checksums, against one server. Zero corruption, zero cross-talk (each client's bytes carry its
own seed, so another client's bytes never checksum right); afterwards no session is left, the
device's memory is all free again (cuMemGetInfo counts every session's, as on a GPU) and the
daemon's memory is back near its baseline.

The clients are threads of this process, each with its own session through the Python client
library (`xpuremote.client.connection`, what the shim drives): 32 shim processes would spend
the test's time starting interpreters rather than making calls.
"""

from __future__ import annotations

import os
import random
import threading
import time
import zlib
from pathlib import Path

import pytest
from conftest import start_server
from pyclient import PyClient, rss, sessions, wait_for

# It ends asserting free == total device-wide, true of the sim, which counts allocations only: a
# GPU's free memory also leaves out its contexts' own. (test_hostile runs its clients on every backend.)
pytestmark = pytest.mark.sim_only(reason="free == total device-wide holds on the sim only")

CLIENTS = 32
SEQUENCES = int(os.environ.get("XPU_LOAD_SEQUENCES", "1000"))


def run_client(address: str, seed: int, results: dict[int, str]) -> None:
    rng = random.Random(seed)
    client = PyClient(address, timeout_s=60)
    try:
        held: list[tuple[int, int, int]] = []  # (pointer, size, crc of what it should hold)
        for _ in range(SEQUENCES):
            size = rng.choice((rng.randint(1, 4096), rng.randint(4096, 96 << 10)))
            data = rng.randbytes(size)
            ptr = client.alloc(size)
            client.post("cuMemcpyHtoD_v2", ptr, data, size, size=size)
            if rng.random() < 0.3:  # a device-to-device copy into a second buffer, then read that one
                other = client.alloc(size)
                client.post("cuMemcpyDtoD_v2", other, ptr, size)
                client.post("cuMemFree_v2", ptr)
                ptr = other
            if rng.random() < 0.2:  # a memset of a random range, mirrored on the host
                start = rng.randrange(size)
                count = rng.randint(1, size - start)
                value = rng.randrange(256)
                client.post("cuMemsetD8_v2", ptr + start, value, count)
                data = data[:start] + bytes([value]) * count + data[start + count :]
            back = client.read(ptr, size)
            if zlib.crc32(back) != zlib.crc32(data):
                results[seed] = f"corrupt: {size} bytes at {ptr:#x}"
                return
            if rng.random() < 0.25 and len(held) < 8:
                held.append((ptr, size, zlib.crc32(data)))  # kept a while, checked again later
            else:
                client.post("cuMemFree_v2", ptr)
            if held and rng.random() < 0.1:
                old, old_size, crc = held.pop(rng.randrange(len(held)))
                if zlib.crc32(client.read(old, old_size)) != crc:
                    results[seed] = f"a held buffer changed: {old_size} bytes at {old:#x}"
                    return
                client.post("cuMemFree_v2", old)
        for ptr, _, _ in held:
            client.post("cuMemFree_v2", ptr)
        client.mem_info()  # a sync call: every free has been done
        results[seed] = "ok"
    except Exception as exc:  # noqa: BLE001 (reported per client)
        results[seed] = f"{type(exc).__name__}: {exc}"
    finally:
        client.close()


def test_32_clients_1000_sequences_each(tmp_path: Path) -> None:
    srv = start_server(tmp_path)
    try:
        sessions(srv.address)  # the daemon looks up its devices once: part of its baseline
        baseline = rss(srv.process.pid)
        results: dict[int, str] = {}
        threads = [threading.Thread(target=run_client, args=(srv.address, seed, results)) for seed in range(CLIENTS)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        elapsed = time.monotonic() - start
        bad = {seed: r for seed, r in results.items() if r != "ok"}
        assert len(results) == CLIENTS and not bad, bad
        assert wait_for(lambda: not sessions(srv.address), 10), sessions(srv.address)
        assert srv.log().count("session_end") == CLIENTS, srv.log()[-3000:]
        probe = PyClient(srv.address)
        free, total = probe.mem_info()
        probe.close()
        assert free == total, f"{total - free} bytes of device memory still allocated"
        grown = rss(srv.process.pid) - baseline
        assert grown < 32 << 20, f"the daemon grew by {grown >> 20} MiB"
        assert "Traceback" not in srv.log() and "internal error" not in srv.log()
        print(f"{CLIENTS} clients x {SEQUENCES} sequences in {elapsed:.1f} s; daemon RSS {grown >> 10:+d} KiB")
    finally:
        srv.stop()
