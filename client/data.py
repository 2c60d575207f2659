"""The client's end of the session's data connection (server/data.py): the bytes of a synchronous copy of
DATA_MIN bytes or more go on a plain TCP stream, from and into the application's memory, instead of in a
ZeroMQ message (which lands in a buffer of its own, one more copy on each end).

Opened after `init` when the worker offers it, unless XPU_DATA_CONNECTION=0; an emulated link delays what
goes here as it does ZeroMQ's messages (protocol/link.py: a message and the bytes that follow it). With CURVE
it is sealed (protocol/stream.py) with the keys the worker sent in its CURVE-encrypted answer, and not
opened without them. A connection that fails later, a record that fails its check included, is closed; the
session goes on without it.

A call the application waits for goes there too, as a message, and its answer comes back there: a round
trip on a plain stream skips ZeroMQ's I/O threads, a thread wake-up each way on each end
(client/connection.py).
"""

from __future__ import annotations

import logging
import os
import socket

from xpuremote.protocol import stream, wire

log = logging.getLogger("xpuremote.client")

DATA_MIN = 1 << 20  # smaller copies go in their message: a data connection's bytes cost a system call more
SCRATCH = 64 * 1024  # what one read of an answer takes at most
TIMEOUT_S = 30.0  # as long as the worker waits for a stalled stream


def wanted() -> bool:
    return os.environ.get("XPU_DATA_CONNECTION", "1") != "0"


Stream = socket.socket | stream.Sealed


def connect(host: str, port: int, key: bytes, timeout_s: float, seal: list[bytes] | None = None) -> Stream:
    """A connection to the worker's data port that has presented the session's key; sealed with `seal`'s keys
    ([client to worker, worker to client]) if given, the key then in its first record."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = stream.Sealed(sock, seal[0], seal[1]) if seal else sock
        conn.sendall(key)
        wire.set_stall_timeout(sock, TIMEOUT_S)
    except OSError:
        sock.close()
        raise
    return conn


def pending(sock: Stream | None) -> bool:
    """Whether a sealed stream holds bytes already read, which a poll of its socket would not announce."""
    return type(sock) is stream.Sealed and sock.pending()


def receive_message(sock: Stream, scratch: memoryview | None = None) -> list[memoryview]:
    """An answer the worker sent here (wire.stream_buffers). With `scratch` (nothing follows the answer), one
    read takes as much as fits there: a small answer comes in one system call."""
    if scratch is None:
        head = bytearray(wire.STREAM_HEAD.size)
        receive_into(sock, memoryview(head))
        count, size = wire.STREAM_HEAD.unpack(head)
        body = stream.buffer_for(size)  # memory taken as the bytes arrive, whatever the head declared
        receive_into(sock, body)
        return wire.stream_frames(count, body)
    got = 0
    while got < wire.STREAM_HEAD.size:
        # the whole scratch, not a slice of it, at first: a sealed stream keeps the address of the buffer it reads into
        got += _received(sock.recv_into(scratch[got:] if got else scratch, len(scratch) - got))
    count, size = wire.STREAM_HEAD.unpack_from(scratch)
    end = wire.STREAM_HEAD.size + size
    if got > end:
        raise wire.WireError(f"{got - end} bytes more than the answer on the data connection")
    body = stream.buffer_for(size)
    body[: got - wire.STREAM_HEAD.size] = scratch[wire.STREAM_HEAD.size : got]
    receive_into(sock, body[got - wire.STREAM_HEAD.size :])
    return wire.stream_frames(count, body)


def receive_into(sock: Stream, view: memoryview) -> None:
    got, size = 0, len(view)
    while got < size:
        got += _received(sock.recv_into(view[got:], size - got))


def _received(n: int) -> int:
    if not n:
        raise ConnectionError("the server closed the data connection")
    return n
