"""The session's data connection: the bulk bytes of a synchronous copy, beside ZeroMQ.

A ZeroMQ message lands in a buffer of ZeroMQ's: a copy to the application's memory on the client,
and one into device memory on the sim, which a plain TCP stream read straight into its destination
does not need (protocol/wire.py says how a message points at bytes that travel here).

The worker listens on a port of its own beside its ZeroMQ endpoint, for sessions on tcp:// only. The
client connects, sends the session's key, then asks over ZeroMQ (`data` op); the worker takes the first
connection that presents the key and stops listening. A keyed (CURVE) session's stream is sealed
(protocol/stream.py): its key travels in the first record, and a connection whose record fails its check
presents nothing. Bytes travel in the order of the messages that name them: the inputs of a message follow
it, the outputs asked of it follow its answer. A stream that fails or stalls for DATA_TIMEOUT_S is closed;
the session goes on over ZeroMQ, and a later message that names the data connection is refused.

A message's body takes memory only as its bytes arrive (stream.buffer_for): its head's 12 bytes commit
nothing. A head that declares more than the session may send (stream.message_bound) is Overdeclared: the
worker ends the session.
"""

from __future__ import annotations

import hmac
import logging
import socket
import time
from typing import Any
from urllib.parse import urlparse

from xpuremote.protocol import stream, wire

log = logging.getLogger("xpuremote.worker")

DATA_TIMEOUT_S = 30.0  # a stream that moves no byte for this long is given up
ACCEPT_TIMEOUT_S = 5.0  # the client connected before it asked: its connection is waiting already
SKIP_CHUNK = 1 << 20
READ_AHEAD = 64 * 1024  # a short read takes up to this much: a small message comes whole in one system call


class DataError(wire.WireError):
    """The data connection failed or is not there."""


class Overdeclared(DataError):
    """A message's head declared more than the session may send: no client of ours does that."""


class Closed(DataError):
    """The client closed the stream between two messages: no answer is owed (it gave the stream up after an
    answer, or at its end)."""


def listen(bind: str) -> socket.socket | None:
    """A listening socket on the host of a tcp:// bind address (port chosen by the system), or None."""
    url = urlparse(bind)
    if url.scheme != "tcp":
        return None
    host = url.hostname or ""
    host = "" if host in ("*", "0.0.0.0") else host
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(4)
    return listener


class DataConnection:
    def __init__(self, sock: socket.socket, sealed: stream.Sealed | None = None) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wire.set_stall_timeout(sock, DATA_TIMEOUT_S)
        self.sock: socket.socket | stream.Sealed | None = sealed or sock
        self.sealed = sealed is not None
        self.moved = 0  # bytes of copies read and written
        self.messages = 0  # messages read there
        self.head = memoryview(bytearray(wire.STREAM_HEAD.size))
        self.ahead = memoryview(bytearray(READ_AHEAD))  # bytes read beyond what was asked: ahead[at:end]
        self.ahead_at = self.ahead_end = 0

    @classmethod
    def accept(cls, listener: socket.socket, key: bytes, session: str,
               seal: list[bytes] | None = None) -> DataConnection:
        """The first connection to `listener` that presents `key` (in a sealed record, with `seal`: the keys
        [client to worker, worker to client]); others are logged and closed."""
        deadline = time.monotonic() + ACCEPT_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            listener.settimeout(left)
            try:
                sock, peer = listener.accept()
            except OSError:
                break
            sock.settimeout(min(left, 1.0))
            sealed = stream.Sealed(sock, seal[1], seal[0]) if seal else None
            try:
                presented = _read_exactly(sealed or sock, len(key))
            except OSError:  # a record that fails its check too
                presented = b""
            if hmac.compare_digest(presented, key):
                return cls(sock, sealed)
            log.warning("session %s: a data connection from %s did not present the session's key", session, peer)
            sock.close()
        raise DataError("no data connection presented the session's key")

    def value(self, size: int, asked: bool, incoming: list[Incoming]) -> Any:
        """What a message's reference to this connection decodes to (wire.decode's `data`)."""
        if self.sock is None:
            raise DataError("the data connection is closed")
        if asked:
            return Asked(size)
        if incoming:  # its bytes may not line up with what this end would read: the stream is given up
            self.fail("a message sent two values on it; one is the most")
        value = Incoming(self, size)
        incoming.append(value)
        return value

    def read_message(self, max_bytes: int) -> tuple[list[memoryview], str | None]:
        """A message the client sent here (wire.stream_buffers): its frames, and why it is refused or None.
        Overdeclared if its head declares more than `max_bytes` (0: no limit) allows; DataError if it does
        not follow the format."""
        self._read(self.head, between=True)
        self.messages += 1
        count, size = wire.STREAM_HEAD.unpack(self.head)
        bound = stream.message_bound(max_bytes, wire.HEADER_ALLOWANCE)
        if size > bound:
            self.close()
            raise Overdeclared(f"a message on the data connection declared {size} bytes, over the {bound} "
                               f"this session may send ({'--max-request-bytes' if max_bytes else 'no limit set'})")
        try:
            body = stream.buffer_for(size)  # its memory is taken as its bytes arrive
        except (MemoryError, OSError):
            self.fail(f"a message of {size} bytes does not fit in memory")
        self._read(body)
        try:
            return wire.stream_frames(count, body), None
        except wire.WireError as exc:  # its length was read whole: the stream is still in line
            return [], str(exc)

    def send_message(self, frames: list[Any]) -> None:
        """An answer to a message that came here."""
        buffers = wire.stream_buffers(frames)
        try:
            wire.send_buffers(self._live(), buffers)
        except OSError as exc:
            self.fail(f"writing: {exc}")

    def read_into(self, view: memoryview) -> None:
        self._read(view)
        self.moved += len(view)

    def buffered(self) -> bool:
        """Whether bytes were read ahead: the next message may have come whole, with nothing left to poll."""
        return self.ahead_end > self.ahead_at or self.sealed and self.sock is not None and self.sock.pending()

    def _read(self, view: memoryview, between: bool = False) -> None:
        """Exactly len(view) bytes: what was read ahead first; a short rest read ahead again (the rest of a
        message, or the inputs that follow it), a long one straight into `view`. `between`: a message's head,
        where the stream may end (Closed)."""
        got, size = min(len(view), self.ahead_end - self.ahead_at), len(view)
        if got:
            view[:got] = self.ahead[self.ahead_at : self.ahead_at + got]
            self.ahead_at += got
        try:
            while got < size:
                short = size - got < READ_AHEAD
                n = self._live().recv_into(self.ahead if short else view[got:], READ_AHEAD if short else size - got)
                if not n:
                    self.fail("the client closed it", Closed if between and got == 0 else DataError)
                if short:
                    take = min(n, size - got)
                    view[got : got + take] = self.ahead[:take]
                    self.ahead_at, self.ahead_end = take, n
                    n = take
                got += n
        except OSError as exc:
            self.fail(f"reading: {exc}")

    def skip(self, size: int) -> None:
        """Read and drop `size` bytes: an input the call never took (it failed first)."""
        scratch = memoryview(bytearray(min(size, SKIP_CHUNK)))
        while size > 0:
            chunk = min(size, len(scratch))
            self.read_into(scratch[:chunk])
            size -= chunk

    def send(self, data: Any) -> None:
        try:
            self._live().sendall(data)
        except OSError as exc:
            self.fail(f"writing: {exc}")
        self.moved += len(data)

    def settle(self, incoming: list[Incoming]) -> None:
        """After a message: what its inputs left unread is read and dropped, so the next lines up (on a
        stream given up meanwhile there is nothing to line up)."""
        if self.sock is None:
            return
        for value in incoming:
            if value.left:
                value.skip_rest()

    def fail(self, why: str, kind: type[DataError] = DataError) -> None:
        self.close()
        raise kind(f"data connection lost ({why}); it is closed, ZeroMQ carries the session on")

    def _live(self) -> socket.socket:
        if self.sock is None:
            raise DataError("the data connection is closed")
        return self.sock

    def close(self) -> None:
        self.ahead_at = self.ahead_end = 0
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class Incoming:
    """A call's input bytes that follow its message on the data connection: read once, straight into
    where they go (readinto), or as a buffer of their own (read)."""

    def __init__(self, conn: DataConnection, size: int) -> None:
        self.conn, self.size, self.left = conn, size, size

    def __len__(self) -> int:
        return self.size

    def readinto(self, view: memoryview) -> None:
        if len(view) != self.size or self.left != self.size:
            raise DataError(f"{self.size} bytes on the data connection, read once and whole")
        self.read_part(view)

    def read_part(self, view: memoryview) -> None:
        """The next len(view) bytes: a large input taken in pieces, each passed on while the next arrives."""
        if len(view) > self.left:
            raise DataError(f"{len(view)} bytes asked of an input with {self.left} left")
        self.left -= len(view)
        self.conn.read_into(view)

    def read(self) -> memoryview:
        data = stream.buffer_for(self.size)  # taken as the bytes arrive, as a message's body
        self.readinto(data)
        return data

    def skip_rest(self) -> None:
        left, self.left = self.left, 0
        self.conn.skip(left)


class Asked:
    """An output the client asked for on the data connection: `size` bytes, sent after the answer."""

    def __init__(self, size: int) -> None:
        self.size = size


def _read_exactly(sock: socket.socket | stream.Sealed, size: int) -> bytes:
    data, got = memoryview(bytearray(size)), 0
    while got < size:
        n = sock.recv_into(data[got:], size - got)
        if not n:
            break
        got += n
    return bytes(data[:got])
