"""What sealing the data connection costs, apart from the rest of a session (protocol/stream.py).

    python bench/sealing.py [--n 50000] [--bulk-mib 64] [--repeats 5]

Four parts, each beside a baseline from the same run:

1. Warm AEAD steps on a small message (96 B, about a synchronous call's message), µs of CPU each:
   AES-256-GCM and ChaCha20-Poly1305 (cryptography, OpenSSL), allocating and `_into`, a cipher object made
   per message, the nonce; AES-256-GCM through gcm.c (protocol/gcm.py), a record sealed and opened as the
   stream does it.
2. The same steps after some other work (Python, a system call) and a 20 µs sleep, as each end of a round
   trip takes them after waiting for the other, beside other small steps taken the same way: whatever runs
   first after a wake-up runs several times slower, and an AEAD call has a large footprint.
3. A message sent and received over a socket pair in one process, µs of CPU per message: plain sockets,
   Sealed streams (small records through gcm.c, or all through OpenSSL), and Sealed streams whose cipher is
   an identity (what the stream's own code costs).
4. Two processes over loopback TCP, as the data connection: a small message echoed, µs per round trip, and
   --bulk-mib moved one way (1 MiB reads, as the worker reads a copy), GB/s; plain against Sealed (gcm.c for
   the small records, and OpenSSL only).

Medians over --repeats, the variants of each part interleaved so that load drift hits them alike.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305  # noqa: E402

from xpuremote.protocol import gcm, stream  # noqa: E402

SMALL = 96
MIB = 1 << 20
AAD = SMALL.to_bytes(4, "little")


def cpu_us(step: Callable[[], Any], n: int) -> float:
    """µs of this process's CPU per call of `step`."""
    start = time.process_time()
    for _ in range(n):
        step()
    return (time.process_time() - start) / n * 1e6


def other_work(pair: tuple[socket.socket, socket.socket]) -> None:
    """What an end does between two of its messages, roughly: Python work (a call's header packed and read back)
    and a system call."""
    header = {"op": "calls", "seq": 1, "reply": True, "calls": [[1, [7, 8, 4096], None]] * 4}
    for _ in range(10):
        json.loads(json.dumps(header))
    pair[0].send(b"x")
    pair[1].recv(16)


def after_sleep_us(step: Callable[[], Any], n: int, pair: tuple[socket.socket, socket.socket]) -> float:
    """Median µs of `step` run right after other work and a 20 µs sleep, as an end of a round trip runs it
    after waiting for the other."""
    took = []
    clock = time.perf_counter_ns
    for _ in range(n):
        other_work(pair)
        time.sleep(20e-6)
        start = clock()
        step()
        took.append(clock() - start)
    return statistics.median(took) / 1e3


def aead_steps() -> dict[str, Callable[[], Any]]:
    key, nonce, msg = os.urandom(32), (12345).to_bytes(12, "little"), os.urandom(SMALL)
    steps: dict[str, Callable[[], Any]] = {}
    for name, cls in (("AES-256-GCM", AESGCM), ("ChaCha20-Poly1305", ChaCha20Poly1305)):
        cipher = cls(key)
        sealed, into, plain = cipher.encrypt(nonce, msg, AAD), bytearray(SMALL + 16), bytearray(SMALL)
        steps[f"{name}: new cipher object"] = lambda cls=cls: cls(key)
        steps[f"{name}: encrypt"] = lambda c=cipher: c.encrypt(nonce, msg, AAD)
        steps[f"{name}: encrypt_into"] = lambda c=cipher, o=into: c.encrypt_into(nonce, msg, AAD, o)
        steps[f"{name}: decrypt"] = lambda c=cipher, s=sealed: c.decrypt(nonce, s, AAD)
        steps[f"{name}: decrypt_into"] = lambda c=cipher, s=sealed, p=plain: c.decrypt_into(nonce, s, AAD, p)
    native = gcm.library()
    if native is not None:
        ffi, lib = native
        context = ffi.gc(lib.xpu_gcm_new(key), lib.xpu_gcm_free)
        record = bytearray(4 + SMALL + 16)
        address = ffi.from_buffer(record)
        lib.xpu_gcm_seal(context, 12345, msg, SMALL, address)
        opened = bytearray(SMALL)
        opened_address = ffi.from_buffer(opened)
        steps["AES-256-GCM, gcm.c: seal a record"] = lambda: lib.xpu_gcm_seal(context, 12345, msg, SMALL, address)
        steps["AES-256-GCM, gcm.c: open a record read whole (open_first)"] = lambda: lib.xpu_gcm_open_first(
            context, 12345, address, len(record), SMALL, opened_address)
    count = 12345
    steps["nonce: int.to_bytes(12)"] = lambda: count.to_bytes(12, "little")
    steps["other: b''.join of two buffers"] = lambda: b"".join([msg, msg])
    steps["other: nothing (the timer's floor)"] = lambda: None
    return steps


def bulk_rate(name: str) -> float:
    """GB/s of `name`'s encrypt_into over 1 MiB."""
    cipher = (AESGCM if name == "AES-256-GCM" else ChaCha20Poly1305)(os.urandom(32))
    big, out, nonce = os.urandom(MIB), bytearray(MIB + 16), bytes(12)
    return MIB / cpu_us(lambda: cipher.encrypt_into(nonce, big, AAD, out), 64) / 1e3


class Identity:
    """A stand-in cipher that copies: what a Sealed stream costs without its AEAD (measurement only)."""

    TAG = bytes(16)

    def encrypt(self, nonce: bytes, piece: bytes, aad: Any) -> bytes:
        return piece + self.TAG

    def decrypt_into(self, nonce: bytes, data: memoryview, aad: Any, into: memoryview) -> int:
        into[:] = data[:-16]
        return len(into)


def pair_step(kind: str) -> tuple[Callable[[], Any], Any]:
    """One small message sent and received over a socket pair: plain, sealed (gcm.c), sealed through OpenSSL
    only ("openssl"), or sealed with Identity."""
    a, b = socket.socketpair()
    buffers, view = [bytes(12), os.urandom(SMALL - 12)], memoryview(bytearray(64 << 10))
    if kind == "plain":
        return (lambda: (a.sendmsg(buffers), b.recv_into(view, len(view)))), (a, b)
    keys = stream.new_keys()
    native = kind == "sealed"
    writer, reader = stream.Sealed(a, keys[0], keys[1], native), stream.Sealed(b, keys[1], keys[0], native)
    if kind == "identity":
        writer._encrypt = Identity().encrypt
        reader._open = Identity().decrypt_into
    return (lambda: (writer.sendmsg(buffers), reader.recv_into(view, len(view)))), (a, b)


def _connect(port: int, keys: list[bytes] | None, native: bool = True) -> Any:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return stream.Sealed(sock, keys[1], keys[0], native) if keys else sock


def _echo_end(port: int, keys: list[bytes] | None, n: int, native: bool) -> None:
    conn, view = _connect(port, keys, native), memoryview(bytearray(64 << 10))
    for _ in range(n):
        got = 0
        while got < SMALL:
            got += conn.recv_into(view[got:], len(view) - got)
        conn.sendmsg([view[:SMALL]])


def _bulk_end(port: int, keys: list[bytes] | None, size: int) -> None:
    conn = _connect(port, keys)
    conn.sendall(memoryview(bytearray(os.urandom(MIB)) * (size // MIB)))
    (conn.sock if keys else conn).recv(1)


def _accepted(target: Any, *args: Any) -> tuple[socket.socket, multiprocessing.Process]:
    listener = socket.create_server(("127.0.0.1", 0))
    proc = multiprocessing.Process(target=target, args=(listener.getsockname()[1], *args))
    proc.start()
    sock, _ = listener.accept()
    listener.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, proc


def echo_us(n: int, sealed: bool, native: bool = True) -> float:
    keys = stream.new_keys() if sealed else None
    sock, proc = _accepted(_echo_end, keys, n, native)
    conn: Any = stream.Sealed(sock, keys[0], keys[1], native) if keys else sock
    buffers, view = [bytes(12), os.urandom(SMALL - 12)], memoryview(bytearray(64 << 10))
    start = time.perf_counter()
    for _ in range(n):
        conn.sendmsg(buffers)
        got = 0
        while got < SMALL:
            got += conn.recv_into(view[got:], len(view) - got)
    took = time.perf_counter() - start
    proc.join()
    sock.close()
    return took / n * 1e6


def bulk_gbs(size: int, sealed: bool) -> float:
    keys = stream.new_keys() if sealed else None
    sock, proc = _accepted(_bulk_end, keys, size)
    conn: Any = stream.Sealed(sock, keys[0], keys[1]) if keys else sock
    into, got = memoryview(bytearray(size)), 0
    start = time.perf_counter()
    while got < size:
        got += conn.recv_into(into[got:], min(MIB, size - got))
    took = time.perf_counter() - start
    sock.send(b"k")
    proc.join()
    sock.close()
    return size / took / 1e9


def medians(runs: dict[str, list[float]]) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--bulk-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n, repeats = args.n, args.repeats
    print(f"load average {os.getloadavg()[0]:.2f} at the start, {os.cpu_count()} CPUs, "
          f"python {sys.version.split()[0]}, {SMALL} B messages")
    steps = aead_steps()
    warm: dict[str, list[float]] = {}
    cold: dict[str, list[float]] = {}
    pair = socket.socketpair()
    for _ in range(repeats):
        for name, step in steps.items():
            warm.setdefault(name, []).append(cpu_us(step, n))
            cold.setdefault(name, []).append(after_sleep_us(step, max(200, n // 25), pair))
    print("\n| step | warm, µs of CPU | after other work and a 20 µs sleep, µs |\n|---|---:|---:|")
    for name, w in medians(warm).items():
        print(f"| {name} | {w:.2f} | {statistics.median(cold[name]):.2f} |")
    for name in ("AES-256-GCM", "ChaCha20-Poly1305"):
        print(f"| {name}: encrypt_into 1 MiB | {bulk_rate(name):.1f} GB/s | |")

    pairs: dict[str, list[float]] = {}
    for r in range(repeats):
        kinds = ("plain", "sealed", "openssl", "identity")
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            step, socks = pair_step(kind)
            pairs.setdefault(kind, []).append(cpu_us(step, n))
            for s in socks:
                s.close()
    p = medians(pairs)
    print("\n| a message over a socket pair, one process | µs of CPU | over plain |\n|---|---:|---:|")
    for kind, label in (("plain", "plain sockets"), ("identity", "Sealed, identity cipher (the stream's own code)"),
                        ("openssl", "Sealed (AES-256-GCM), all records through OpenSSL"),
                        ("sealed", "Sealed (AES-256-GCM), small records through gcm.c")):
        print(f"| {label} | {p[kind]:.2f} | +{p[kind] - p['plain']:.2f} |")

    trips: dict[str, list[float]] = {"plain": [], "openssl": [], "gcm.c": []}
    moves: dict[bool, list[float]] = {False: [], True: []}
    for r in range(repeats):
        for kind in trips if r % 2 == 0 else list(trips)[::-1]:
            trips[kind].append(echo_us(max(1000, n // 10), kind != "plain", kind == "gcm.c"))
        for sealed in (False, True) if r % 2 == 0 else (True, False):
            moves[sealed].append(bulk_gbs(args.bulk_mib * MIB, sealed))
    t, m = medians(trips), medians({str(k): v for k, v in moves.items()})
    print("\n| two processes, loopback TCP | plain | sealed, OpenSSL only | sealed, gcm.c for small records |"
          "\n|---|---:|---:|---:|")
    print(f"| round trip of a {SMALL} B message, µs | {t['plain']:.1f} | {t['openssl']:.1f} "
          f"({t['openssl'] / t['plain']:.2f}x) | {t['gcm.c']:.1f} ({t['gcm.c'] / t['plain']:.2f}x) |")
    print(f"| {args.bulk_mib} MiB one way, GB/s | {m['False']:.2f} | {m['True']:.2f} ({m['True'] / m['False']:.2f}x) "
          "| (the same: large records) |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
