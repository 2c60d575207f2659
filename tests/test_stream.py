"""The data connection's stream (protocol/stream.py): sealed records carry any bytes in order and refuse
anything else; a buffer for a declared size takes memory only as bytes land in it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from xpuremote.protocol import gcm, stream
from xpuremote.protocol.stream import NATIVE_MAX, RECORD_MAX, SealBroken, Sealed

MIB = 1 << 20


def _pair() -> tuple[Sealed, Sealed]:
    """A writer and a reader, sealed with the same fresh keys, over a socket pair."""
    a, b = socket.socketpair()
    keys = stream.new_keys()
    return Sealed(a, keys[0], keys[1]), Sealed(b, keys[1], keys[0])


def _records(*pieces: bytes) -> list[bytes]:
    """Each piece sealed as one record (the first, second... of a stream), as the wire carries them."""
    writer, reader = _pair()
    out = []
    for piece in pieces:
        writer.sendall(piece)
        out.append(reader.sock.recv(len(piece) + 64))
    return out


def _reader_of(wire_bytes: bytes, keys: list[bytes], native: bool = True) -> Sealed:
    """A reader of `wire_bytes`, then the end of the stream (fed by a thread: they may not fit the socket)."""
    a, b = socket.socketpair()

    def feed() -> None:
        a.sendall(wire_bytes)
        a.close()

    threading.Thread(target=feed, daemon=True).start()
    return Sealed(b, keys[1], keys[0], native)


def _read_all(reader: Sealed, size: int, step: int) -> bytes:
    out, got = memoryview(bytearray(size)), 0
    while got < size:
        n = reader.recv_into(out[got:], min(step, size - got))
        assert n, "the stream ended early"
        got += n
    return bytes(out)


@pytest.mark.parametrize("step", [7, 64 << 10, 3 * MIB], ids=["tiny reads", "64 KiB reads", "whole reads"])
def test_bytes_come_through_whole_and_in_order(step: int) -> None:
    """Messages as scatter-gather lists (small ones sealed together) and a copy of several records, read in
    pieces smaller and larger than a record."""
    writer, reader = _pair()
    message = [b"head", os.urandom(100), os.urandom(70 << 10)]
    copy = os.urandom(3 * MIB + 5)
    sent = b"".join(message) + copy
    thread = threading.Thread(target=lambda: (writer.sendmsg(message), writer.sendall(copy)))
    thread.start()
    assert _read_all(reader, len(sent), step) == sent
    thread.join()
    assert writer.sent == reader.received == 2 + 4  # a record for the small buffers, one for the large; 4 for the copy
    writer.sock.close()
    assert reader.recv_into(memoryview(bytearray(8))) == 0  # the end, between two records


def test_replayed_reordered_foreign_and_cut_records_are_refused() -> None:
    keys = stream.new_keys()
    writer = Sealed(socket.socketpair()[0], keys[0], keys[1])
    first, second = (b"first record", b"second record")
    records = []
    for piece in (first, second):
        a, b = socket.socketpair()
        writer.sock = a
        writer.sendall(piece)
        records.append(b.recv(100))
    assert _read_all(_reader_of(records[0] + records[1], keys), len(first + second), 100) == first + second
    for wire_bytes in (records[0] + records[0], records[1]):  # replayed, out of order
        reader = _reader_of(wire_bytes, keys)
        with pytest.raises(SealBroken, match="failed its check"):
            _read_all(reader, len(first + second), 100)
    with pytest.raises(SealBroken, match="failed its check"):  # sealed with other keys
        _read_all(_reader_of(records[0], stream.new_keys()), len(first), 100)
    with pytest.raises(SealBroken, match="ended within a record"):
        _read_all(_reader_of(records[0][:-1], keys), len(first), 100)
    too_long = stream.RECORD_HEAD.pack(RECORD_MAX + 1)  # refused from its head, before any of it is read
    with pytest.raises(SealBroken, match="at most"):
        _read_all(_reader_of(too_long, keys), 8, 8)


@pytest.mark.parametrize(("size", "native"), [(MIB, True), (100, True), (100, False)],
                         ids=["a record read in pieces", "a record read whole at once", "the same through OpenSSL"])
def test_an_altered_record_leaves_nothing_where_it_was_opened(size: int, native: bool) -> None:
    """A record opened straight into the reader's buffer, one bit of it flipped: its check fails, and the
    buffer holds zeros where the record would have gone, not the altered plaintext. A small record (a call's
    message) comes in one read and takes the short path, opened by gcm.c or by cryptography; a large one is
    read in pieces."""
    keys = stream.new_keys()
    a, b = socket.socketpair()
    writer = Sealed(a, keys[0], keys[1], native)
    piece = os.urandom(size)
    thread = threading.Thread(target=writer.sendall, args=(piece,))
    thread.start()
    wire_bytes = bytearray()
    while len(wire_bytes) < len(piece) + 20:
        wire_bytes += b.recv(1 << 20)
    thread.join()
    wire_bytes[min(1000, size // 2)] ^= 1
    reader = _reader_of(bytes(wire_bytes), keys, native)
    into = memoryview(bytearray(b"\xaa" * len(piece)))
    with pytest.raises(SealBroken):
        reader.recv_into(into)
    assert into == bytes(len(piece))


def test_gcm_c_seals_and_opens_as_cryptography_does() -> None:
    """gcm.c, which seals and opens the small records, against cryptography's AESGCM (OpenSSL): the same bytes on
    the wire for lengths on each side of AES's 16-byte blocks and of gcm.c's four-block steps, up to NATIVE_MAX
    (messages and plain writes), and each end opens what the other sealed, in order."""
    assert gcm.library() is not None, "gcm.c did not build or load here"
    sizes = [1, 15, 16, 17, 63, 64, 65, 100, 257, 1000, NATIVE_MAX - 1, NATIVE_MAX]
    for native in (True, False):
        keys, (a, b) = stream.new_keys(), socket.socketpair()
        writer, aead = Sealed(a, keys[0], keys[1], native), AESGCM(keys[0])
        pieces, records = [os.urandom(size) for size in sizes], []
        for count, piece in enumerate(pieces):
            writer.sendmsg([piece[:3], piece[3:]]) if count % 2 else writer.sendall(piece)
            head = stream.RECORD_HEAD.pack(len(piece))
            record = head + aead.encrypt(count.to_bytes(12, "little"), piece, head)
            got = b""
            while len(got) < len(record):
                got += b.recv(len(record) - len(got))
            assert got == record, f"a {len(piece)}-byte record ({'gcm.c' if native else 'OpenSSL'})"
            records.append(got)
        sent = b"".join(pieces)
        assert _read_all(_reader_of(b"".join(records), keys, not native), len(sent), 64 << 10) == sent


MEASURE = """
import os, sys
from xpuremote.protocol import stream
def rss():
    return next(int(line.split()[1]) << 10 for line in open("/proc/self/status") if line.startswith("VmRSS:"))
chunk = os.urandom(1 << 20)
before = rss()
buffer = stream.buffer_for(1 << 30)
declared = rss() - before
for at in range(0, 8 << 20, 1 << 20):
    buffer[at : at + (1 << 20)] = chunk
print(declared, rss() - before)
"""


def test_a_buffer_takes_memory_as_bytes_land_in_it() -> None:
    """1 GiB declared, 8 MiB written (in a process of its own, whose memory nothing else moves): resident
    memory grows by about what was written, not what was declared (no zero-fill ahead of the bytes)."""
    done = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    declared, written = map(int, done.stdout.split())
    assert declared < 4 * MIB and 8 * MIB <= written < 16 * MIB, (declared >> 20, written >> 20)
    small = stream.buffer_for(100)
    assert len(small) == 100 and bytes(small) == bytes(100)
