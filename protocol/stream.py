"""The data connection's stream (server/data.py, client/data.py): sealed records, and buffers that commit
memory only as bytes arrive.

A keyed (CURVE) session's data connection is sealed: AES-256-GCM records, one key each way, made at random
by the worker for this session alone and handed to its client inside the CURVE-encrypted answer to `init`.
No key material is kept or managed anywhere else, and the keys die with the session. A record is its
plaintext length (u32, little-endian; authenticated as the record's associated data), the ciphertext, and
the 16-byte tag; its nonce is the count of records sent before it that way, so a record dropped, replayed,
reordered or altered fails the check of the one read in its place. A record that fits where the reader
wants its bytes is opened straight there (a copy fewer); if its check fails, what it wrote there is zeroed
before the failure is raised, so no altered byte stays anywhere. Records carry at most RECORD_MAX bytes, so a
large copy streams through buffers of that size at each end.

A record of up to NATIVE_MAX bytes (a synchronous call's message or answer) is sealed and opened by gcm.c, a
small AES-NI implementation of the same AES-256-GCM, whose record is byte for byte cryptography's: right after an
end has waited for the other, OpenSSL's path costs several times its warm cost (protocol/gcm.py). It checks the
tag before it decrypts anything (straight into the reader's buffer, or in place in the read buffer), so a record
that fails leaves nothing opened.
Larger records, and every record where gcm.c cannot be built, go through cryptography (OpenSSL).

Python's ssl has no pre-shared keys before 3.13, and a TLS handshake with a throwaway certificate whose
fingerprint travels over CURVE measured slower here for the same guarantees (docs/security.md).
"""

from __future__ import annotations

import functools
import mmap
import secrets
import socket
import struct
from collections.abc import Sequence
from typing import Any

from . import gcm

KEY_BYTES = 32  # AES-256
TAG = 16
RECORD_HEAD = struct.Struct("<I")  # a record's plaintext length
_HEAD = RECORD_HEAD.size
_pack, _unpack_from = RECORD_HEAD.pack, RECORD_HEAD.unpack_from
RECORD_MAX = 1 << 20  # plaintext bytes a record carries at most (256 KiB records cost the reader a third more)
_WHOLE = _HEAD + RECORD_MAX + TAG
COALESCE = 64 << 10  # a message's buffers under this size are sealed together: a small message is one record
EAGER = 1 << 20  # a buffer up to this size is allocated whole at once; a larger one commits pages as they fill
NATIVE_MAX = 2048  # records up to this size go through gcm.c: above it OpenSSL's wide code is quicker
MESSAGE_MAX = 4 << 30  # the most a message on the data connection may declare where no request limit is set


class SealBroken(ConnectionError):
    """A record that failed its check (altered, replayed, out of order, from another key) or is malformed."""


def new_keys() -> list[bytes]:
    """A session's data connection keys: [client to worker, worker to client]."""
    return [secrets.token_bytes(KEY_BYTES), secrets.token_bytes(KEY_BYTES)]


def valid_keys(keys: Any) -> bool:
    return isinstance(keys, list) and len(keys) == 2 and all(type(k) is bytes and len(k) == KEY_BYTES for k in keys)


def message_bound(max_request_bytes: int, allowance: int) -> int:
    """The most a message's head on the data connection may declare: the request limit and what is not
    payload, or MESSAGE_MAX where there is no limit (the client sends a larger message on ZeroMQ)."""
    return max_request_bytes + allowance if max_request_bytes else MESSAGE_MAX


def buffer_for(size: int) -> memoryview:
    """A writable buffer of `size` bytes whose memory is committed as it is written: a small one at once, a
    large one as anonymous pages, which the kernel backs only when bytes land in them. A peer that declares
    a size and sends less holds only what it sent, and nothing is zero-filled ahead of the bytes."""
    return memoryview(bytearray(size)) if size <= EAGER else _pages(size)


def _pages(size: int) -> memoryview:
    """Anonymous memory that the kernel backs (with zeros) page by page as it is first written."""
    return memoryview(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE))


_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)  # Linux's value; Python names it from 3.12 on


_FAILED = "a record on the data connection failed its check (altered, replayed or out of order)"


def _nonce(count: int) -> bytes:
    return count.to_bytes(12, "little")


class Sealed:
    """A TCP stream of AES-GCM records, with the calls of a socket that the data connection's ends make
    (sendall, sendmsg, recv_into, fileno, shutdown, close). Its reads read ahead: `pending()` says whether
    bytes wait here that the socket's poll will not announce."""

    def __init__(self, sock: socket.socket, send_key: bytes, receive_key: bytes, native: bool = True) -> None:
        """`native`: small records through gcm.c where it is built (False: all through cryptography)."""
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # only keyed sessions need it

        self.sock = sock
        sealer = AESGCM(send_key)
        self._seal, self._encrypt = sealer.encrypt_into, sealer.encrypt
        self._open = AESGCM(receive_key).decrypt_into
        self.sent = self.received = 0  # records each way: the next one's nonce
        # buffers whose pages are taken as they are used: a session of small calls holds a few of them
        self.out = _pages(_WHOLE)  # a large record being sealed
        self.raw = _pages(2 * _WHOLE)  # read, not yet opened: raw[raw_at:raw_end]
        self.raw_at = self.raw_end = 0
        self.plain = _pages(RECORD_MAX)  # opened, not yet taken: plain[plain_at:plain_end]
        self.plain_at = self.plain_end = 0
        self.fileno = sock.fileno  # the socket's own: a poller asks for it at every poll
        self._native_seal = self._native_open = self._native_first = None
        built = gcm.library() if native else None
        if built is not None:
            self._use_native(*built, send_key, receive_key)

    def _use_native(self, ffi: Any, lib: Any, send_key: bytes, receive_key: bytes) -> None:
        """gcm.c's contexts for the two keys (zeroed when freed), and the buffers it writes and reads by address."""
        contexts = [lib.xpu_gcm_new(key) for key in (send_key, receive_key)]
        if ffi.NULL in contexts:
            raise MemoryError("no memory for the data connection's keys")
        self._sealer, self._opener = (ffi.gc(context, lib.xpu_gcm_free) for context in contexts)
        self._out_address, self._raw_address = ffi.from_buffer(self.out), ffi.from_buffer(self.raw)
        self._native_seal, self._native_open = lib.xpu_gcm_seal, lib.xpu_gcm_open
        self._native_first, self._null = lib.xpu_gcm_open_first, ffi.NULL
        # a reader's buffer that cannot be written is refused, as a socket's recv_into refuses it
        self._address_of = functools.partial(ffi.from_buffer, require_writable=True)
        self._into: Any = None  # the reader's buffer of the last short read, and its address
        self._into_address: Any = None

    # ---- writing ---------------------------------------------------------------------------
    def sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        for at in range(0, len(view), RECORD_MAX):
            self._record(view[at : at + RECORD_MAX])

    def sendmsg(self, buffers: Sequence[Any]) -> int:
        """All of `buffers` (bytes-like, their len() in bytes, as wire.stream_buffers makes them), neighbours
        under COALESCE sealed together: a small message is one record, one system call."""
        total = sum(map(len, buffers))
        if total <= NATIVE_MAX and self._native_seal is not None:  # a synchronous call's message or answer
            count = self.sent
            self.sent = count + 1
            self._native_seal(self._sealer, count, b"".join(buffers), total, self._out_address)
            self.sock.sendall(self.out[: _HEAD + total + TAG])
            return total
        if total <= COALESCE:  # the common case, kept short: a synchronous call's message or answer
            head, count = _pack(total), self.sent
            self.sent = count + 1
            # one buffer: its write costs less than a scatter-gather list of two
            self.sock.sendall(head + self._encrypt(count.to_bytes(12, "little"), b"".join(buffers), head))
            return total
        small: list[Any] = []
        for buffer in buffers:
            if len(buffer) >= COALESCE:
                if small:
                    self._record(b"".join(small))
                    small = []
                self.sendall(buffer)
            else:
                small.append(buffer)
        if small:
            self.sendall(b"".join(small))
        return total

    def _record(self, piece: Any) -> None:
        n, out = len(piece), self.out
        if not n:
            return
        if n <= NATIVE_MAX and self._native_seal is not None:
            self._native_seal(self._sealer, self.sent, bytes(piece), n, self._out_address)
            self.sent += 1
            self.sock.sendall(out[: _HEAD + n + TAG])
            return
        RECORD_HEAD.pack_into(out, 0, n)
        head = RECORD_HEAD.size
        self._seal(_nonce(self.sent), piece, out[:head], out[head : head + n + TAG])
        self.sent += 1
        self.sock.sendall(out[: head + n + TAG])

    # ---- reading ---------------------------------------------------------------------------
    def recv_into(self, view: memoryview, nbytes: int = 0) -> int:
        """Up to `nbytes` (0: len(view)) checked bytes; 0 at the end of the stream between two records. The
        next record is opened straight into `view` if it fits, else into `plain`, whose rest later reads take."""
        nbytes = nbytes or len(view)
        if self.plain_at == self.plain_end:
            raw = self.raw
            if self.raw_at == self.raw_end:  # nothing read ahead: one read takes what has come (a whole message)
                n = self.sock.recv_into(raw)
                if n > _HEAD and self._native_first is not None:
                    length = self._open_first(view, n, nbytes)
                    if length:
                        return length
                elif n > _HEAD:  # a synchronous call's message or answer: a whole record, opened straight into view
                    length = _unpack_from(raw)[0]
                    whole = _HEAD + length + TAG
                    if n >= whole and 0 < length <= nbytes and length <= RECORD_MAX:
                        self._open_at(view, length, 0)
                        self.raw_at, self.raw_end = whole, n
                        return length
                if not n:
                    return 0
                self.raw_at, self.raw_end = 0, n
            if self.raw_end - self.raw_at < _HEAD:
                self._fill(_HEAD)
            at = self.raw_at
            (length,) = RECORD_HEAD.unpack_from(raw, at)
            if not 0 < length <= RECORD_MAX:
                raise SealBroken(f"a record of {length} bytes on the data connection (at most {RECORD_MAX})")
            whole = _HEAD + length + TAG
            if self.raw_end - at < whole:
                self._fill(whole)
                at = self.raw_at
            self._open_at(view if length <= nbytes else self.plain, length, at)
            self.raw_at = at + whole
            if length <= nbytes:
                return length
            self.plain_at, self.plain_end = 0, length
        n = min(nbytes, self.plain_end - self.plain_at)
        view[:n] = self.plain[self.plain_at : self.plain_at + n]
        self.plain_at += n
        return n

    def _open_first(self, view: memoryview, n: int, nbytes: int) -> int:
        """gcm.c's short path: the first record of the `n` bytes just read, if it is whole and fits view[:nbytes],
        opened straight into `view` (a reader passes the same buffer each time: its address is kept); its length,
        or 0 if the long way must take it."""
        if view is not self._into:
            self._into, self._into_address = view, self._address_of(view)
        count = self.received
        most = min(nbytes, len(view), NATIVE_MAX)  # gcm.c writes no further than this into view
        length = self._native_first(self._opener, count, self._raw_address, n, most, self._into_address)
        if length < 0:
            raise SealBroken(_FAILED)
        if length:
            self.received = count + 1
            self.raw_at, self.raw_end = _HEAD + length + TAG, n
        return length

    def _open_at(self, into: memoryview, length: int, at: int) -> None:
        """The next record, whole in raw[at:] (its length, the associated data; ciphertext; tag), opened into
        into[:length]; if its check fails, nothing opened stays there and SealBroken is raised."""
        count, raw = self.received, self.raw
        if length <= NATIVE_MAX and self._native_open is not None:  # checked, then opened in place in `raw`
            if self._native_open(self._opener, count, self._raw_address + at, length, self._null):
                into[:length] = bytes(length)  # as after OpenSSL's failure: the reader finds zeros there
                raise SealBroken(_FAILED)
            into[:length] = raw[at + _HEAD : at + _HEAD + length]
        else:
            try:
                sealed = raw[at + _HEAD : at + _HEAD + length + TAG]
                self._open(count.to_bytes(12, "little"), sealed, raw[at : at + _HEAD], into[:length])
            except Exception as exc:  # cryptography's InvalidTag: what it opened there is not kept
                into[:length] = bytes(length)
                raise SealBroken(_FAILED) from exc
        self.received = count + 1

    def pending(self) -> bool:
        return self.plain_end > self.plain_at or self.raw_end > self.raw_at

    def _fill(self, need: int) -> None:
        """At least `need` bytes in raw[raw_at:], where a record has begun: the stream may not end here."""
        while self.raw_end - self.raw_at < need:
            if self.raw_at == self.raw_end:
                self.raw_at = self.raw_end = 0
            elif self.raw_at + need > len(self.raw):  # the rest of a record to the front, where it fits
                kept = self.raw_end - self.raw_at
                self.raw[:kept] = self.raw[self.raw_at : self.raw_end]
                self.raw_at, self.raw_end = 0, kept
            n = self.sock.recv_into(self.raw[self.raw_end :])
            if not n:
                raise SealBroken("the data connection ended within a record")
            self.raw_end += n

    # ---- the socket's own (and fileno, set in __init__) ---------------------------------------
    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()
