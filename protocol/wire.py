"""The wire format: one versioned msgpack header frame, then raw frames for bulk bytes.

A message is a ZeroMQ multipart message `[header, *bulk]`. The header is a msgpack map with
`v` (PROTOCOL_VERSION) and `op`; any bytes argument larger than INLINE_MAX travels as its own
frame, referenced from the header by ExtType(BULK, index), so 64 MiB never passes through
msgpack. No pickle anywhere: a peer can only send data, never code.

Ops (client -> server):
  hello   to the daemon: {client: {pid, host, user}}          -> {worker: endpoint, session, key}
          key: the session's secret (KEY_BYTES random bytes), given to this answer only; every
          connection to the worker presents it as its ZeroMQ routing id (routing_id()), so the
          worker's ROUTER labels each message with it, and the worker serves nothing else
  status  to the daemon: {}            -> {listen, backend, curve, limits, sessions: [...], devices: [...]}
  init    to the worker: {link, measure, gpu}      -> {driver_version, devices, max_request_bytes}
          link: the client's emulated link (protocol/link.py); measure: time every message and
          call for a trace; gpu: time GPU work with events too
  calls   {seq, calls: [[opcode, args], ...], reply: bool}    -> {seq, status, outs, deferred}
          a batch of calls executed in order; only `reply` batches are answered, by the last call;
          while measuring, answers carry `timing` [[seq, server_ns, per_call_ns], ...] and `gpu`
          [[seq, gpu_ns], ...] for the messages finished since the last answer; one call of a
          batch may be `xpuLane` [records, bytes]: calls the shim queued in C (lane_record())
  probe   {busy_ns}: answer after staying awake that long (at most PROBE_BUSY_MAX_NS), for
          the wake-up probe of a trace (client/wake.py)                -> {}
  done    {token}: the host function the server stopped for has run (no answer)
  data    {}: the client has opened the session's data connection (a TCP connection to the port
          `init` answered as `data_port`, on which it sent the session's key first)   -> {}
  bye     the client is leaving; its resources are released
With a data connection (server/data.py), the last call of a `reply` batch sent there may name bytes there
instead of carrying them: ExtType(DATA, size) in an input's place says its bytes follow the message on the data
connection; ExtType(DATA_ASKED, size) in an output's place asks for that output there, and the answer
then has ExtType(DATA, size) in its place, its bytes following the answer. One input a message.
A request over the worker's `max_request_bytes` (0: no limit; all its frames counted) is refused
whole: the client splits bulk copies so that each request fits (request_budget()).
With a data connection, the client sends every batch it waits for there, and its answer comes back there:
ZeroMQ's I/O threads cost a synchronous call a thread wake-up each way on each end. Batches nobody waits
for, answers due later and the other ops stay on ZeroMQ.
On the stream a message is STREAM_HEAD (frame count, bytes after the head), each frame's length (u64),
then the frames. Its header says `after`: the seq of the last batch sent on ZeroMQ (0: none), which the
worker serves first.
With an emulated link, every message carries `sent` (its send time, CLOCK_MONOTONIC ns).
Every answer carries `op: "reply"`; a request the server cannot serve is answered with
`status` set and `error` saying why.
Server -> client, unasked:
  closing {status, error}: the session ends (the server is shutting down); every later call fails
"""

from __future__ import annotations

import hmac
import operator
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import msgpack

from xpuremote.protocol import abi

PROTOCOL_VERSION = 1
KEY_BYTES = 32  # a session's key: 256 bits from `secrets`
DONE_CHANNEL = b"+done"  # the host-function thread's connection, beside the one for calls
CHANNELS = (b"", DONE_CHANNEL)
BULK = 1  # msgpack ext type code of a reference to a bulk frame
DATA, DATA_ASKED = 2, 3  # ext type codes of bytes on the data connection, and of an output asked for there
INLINE_MAX = 64 * 1024
PROBE_BUSY_MAX_NS = 10_000_000
STREAM_HEAD = struct.Struct("<IQ")  # a message on the data connection: frame count, bytes after the head
_ONE_FRAME_HEAD = struct.Struct("<IQQ")  # the head of a message of one frame, with that frame's length
_LENGTH = struct.Struct("<Q")
HEADER_ALLOWANCE = 64 * 1024  # of a request's size limit, kept for what is not payload (header, opcodes)


# A fast-lane record (protocol/records.py's lane_record): its head, the arguments (u64 each) and the blob,
# padded to 8 bytes.
_LANE_ARGS = [struct.Struct(f"<{n}Q") for n in range(abi.LANE_ARGS_MAX + 1)]
_LANE_HEAD = operator.itemgetter(*(abi.LANE_RECORD_FIELDS.index(f) for f in (
    "opcode", "nargs", "blob_at", "blob_len", "ctx", "scalars", "scalar_size")))


def lane_record(view: memoryview, at: int) -> tuple[int, int, list[Any], int]:
    """(opcode, context, arguments, where the next record begins) of the record at `at`; WireError if it is
    malformed."""
    end = len(view)
    if at + abi.LANE_RECORD.size > end:
        raise WireError(f"a lane record is cut short at byte {at}")
    opcode, count, blob_at, blob_len, ctx, scalars, scalar_size = _LANE_HEAD(abi.LANE_RECORD.unpack_from(view, at))
    at += abi.LANE_RECORD.size
    blob_past_args = blob_at != abi.LANE_NO_BLOB and blob_at >= count
    if count >= len(_LANE_ARGS) or at + 8 * count + blob_len > end or blob_past_args or scalars >> count \
            or scalar_size > 8 or bool(scalars) != bool(scalar_size):
        raise WireError(f"a lane record at byte {at - abi.LANE_RECORD.size} is malformed")
    args = list(_LANE_ARGS[count].unpack_from(view, at))
    while scalars:  # a host scalar's bytes, as the client sends them off the lane
        i = scalars.bit_length() - 1
        args[i] = args[i].to_bytes(8, "little")[:scalar_size]
        scalars ^= 1 << i
    at += 8 * count
    if blob_at != abi.LANE_NO_BLOB:
        args[blob_at] = bytes(view[at : at + blob_len])
        at += (blob_len + 7) & ~7
    return opcode, ctx, args, at


class WireError(ValueError):
    """A message that does not follow this format."""


def encode(header: dict[str, Any]) -> list[Any]:
    """Header dict -> frames; bytearray and memoryview values over INLINE_MAX, and what frame()
    marked, become frames of their own (sent as they are, without a copy). `header` gets `v`."""
    packer, bulk = _packer()
    header.setdefault("v", PROTOCOL_VERSION)
    try:
        packed = packer.pack(header)
        if len(packed) > INLINE_MAX:  # msgpack inlines bytearray and memoryview itself: look for large ones
            found: list[Any] = []
            swapped = _swap(header, found)
            if found:
                bulk[:] = found
                packed = packer.pack(swapped)
        return [packed, *bulk]
    finally:
        bulk.clear()


_PACKERS = threading.local()


def _packer() -> tuple[msgpack.Packer, list[Any]]:
    """This thread's packer and the list its `default` puts bulk frames in: a packer made per message costs
    as much as the packing (one per thread: `default` runs Python, so another thread could enter it)."""
    try:
        return _PACKERS.packer
    except AttributeError:
        pass
    bulk: list[Any] = []

    def default(obj: Any) -> Any:
        if isinstance(obj, Bulk):
            bulk.append(obj.data)
            return msgpack.ExtType(BULK, (len(bulk) - 1).to_bytes(4, "little"))
        if isinstance(obj, Data):
            return msgpack.ExtType(DATA_ASKED if obj.asked else DATA, obj.size.to_bytes(8, "little"))
        raise TypeError(f"cannot send {type(obj).__name__}")

    _PACKERS.packer = msgpack.Packer(default=default, use_bin_type=True), bulk
    return _PACKERS.packer


def _swap(obj: Any, found: list[Any]) -> Any:
    """`obj` with each bytearray or memoryview over INLINE_MAX replaced by a reference to the frame
    it is appended to `found` for; containers are copied only where something was replaced."""
    kind = type(obj)
    if kind is memoryview or kind is bytearray:
        if len(obj) <= INLINE_MAX:
            return obj
        found.append(obj)
        return msgpack.ExtType(BULK, (len(found) - 1).to_bytes(4, "little"))
    if kind is dict:
        out = None
        for key, value in obj.items():
            new = _swap(value, found)
            if new is not value:
                out = out if out is not None else dict(obj)
                out[key] = new
        return obj if out is None else out
    if kind is list or kind is tuple:
        seq = None
        for i, value in enumerate(obj):
            new = _swap(value, found)
            if new is not value:
                seq = seq if seq is not None else list(obj)
                seq[i] = new
        return obj if seq is None else seq
    return obj


class Bulk:
    """Bytes marked by frame(): msgpack packs bytes, bytearray and memoryview inline itself, so
    only a wrapper it does not know reaches encode()'s `default`, at no cost to other values."""

    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data


class Data:
    """A value on the data connection: `buffer` holds an input's bytes, or is where an asked output's
    go; a decoded reference has only its size."""

    __slots__ = ("buffer", "size", "asked")

    def __init__(self, buffer: Any = None, asked: bool = False, size: int = 0) -> None:
        self.buffer, self.asked = buffer, asked
        self.size = len(buffer) if buffer is not None else size


def frame(data: Any) -> Any:
    """Any bytes-like data, as a frame of its own when it is over INLINE_MAX. Sent without a copy:
    the data must not change until the message has gone."""
    return data if len(data) <= INLINE_MAX else Bulk(data)


def decode(frames: Sequence[Any], data: Callable[[int, bool], Any] | None = None) -> dict[str, Any]:
    """Frames -> header dict with bulk references replaced by the frames' buffers, and references to
    the data connection by `data(size, asked)` (an end without one refuses them)."""
    if not frames:
        raise WireError("empty message")
    rest = frames[1:]

    def ext_hook(code: int, payload: bytes) -> Any:
        if code in (DATA, DATA_ASKED) and len(payload) == 8:
            if data is None:
                raise WireError("a reference to the data connection, which this message may not make")
            return data(int.from_bytes(payload, "little"), code == DATA_ASKED)
        if code != BULK or len(payload) != 4:
            raise WireError(f"unknown ext type {code}")
        index = int.from_bytes(payload, "little")
        if index >= len(rest):
            raise WireError(f"bulk frame {index} missing (message has {len(rest)})")
        frame = rest[index]
        return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)

    try:
        header = msgpack.unpackb(_bytes(frames[0]), ext_hook=ext_hook, raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several types for garbage
        raise WireError(f"undecodable header: {type(exc).__name__}: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a map")
    if header.get("v") != PROTOCOL_VERSION:
        raise WireError(f"protocol version {header.get('v')!r}, this end speaks {PROTOCOL_VERSION}")
    if not isinstance(header.get("op"), str):
        raise WireError("header has no op")
    return header


def routing_id(key: bytes, channel: bytes = b"") -> bytes:
    """What a connection of the session with `key` sets as its ZeroMQ routing id."""
    return bytes(key) + channel


def presents(identity: bytes, key: bytes) -> bool:
    """Whether a message's routing id (as the worker's ROUTER saw it) is one of the session's;
    the key is compared in constant time."""
    head, channel = identity[:KEY_BYTES], identity[KEY_BYTES:]
    return hmac.compare_digest(head, key) and channel in CHANNELS


def size_of(frames: Sequence[Any]) -> int:
    """Bytes a message puts on the wire (its frames; ZeroMQ's framing is a few bytes more)."""
    return sum(len(f) for f in frames)


def _bytes(frame: Any) -> Any:
    return frame.buffer if hasattr(frame, "buffer") else frame


def payload_size(args: Sequence[Any]) -> int:
    """Bytes that a call's wire arguments carry (bytes-like values, marked or not, and strings)."""
    size = 0
    for a in args:
        if isinstance(a, Bulk):
            a = a.data
        if isinstance(a, (bytes, bytearray, memoryview, str)):
            size += len(a)
    return size


def request_budget(max_request_bytes: int) -> int:
    """Payload bytes one request may carry under the server's limit (0: no limit)."""
    if not max_request_bytes:
        return 0
    return max(max_request_bytes - HEADER_ALLOWANCE, max_request_bytes // 2)


def receive(sock: Any, max_bytes: int = 0, max_frames: int = 0) -> tuple[list[Any], str | None]:
    """One message from a ROUTER socket, `[identity, *frames]`, frame by frame without copies;
    (the frames kept, why the message is refused or None). Past `max_bytes` in its frames or
    `max_frames` frames (0: no bound), the rest is read and dropped at once: the process keeps the
    identity and what came within bounds. (ZeroMQ hands over a message only once all of it has
    arrived, and its MAXMSGSIZE bounds each frame, not a message.)"""
    frames = [sock.recv(copy=False)]
    last, count, size, over = frames[0], 0, 0, False
    while last.more:
        last = sock.recv(copy=False)
        count, size = count + 1, size + len(last)
        over = over or bool(max_frames and count > max_frames) or bool(max_bytes and size > max_bytes)
        if not over or len(frames) == 1:  # the first frame is kept anyway: it says who the sender is
            frames.append(last)
    if max_frames and count > max_frames:
        return frames, f"a message of {count} frames: the server takes at most {max_frames}"
    if max_bytes and size > max_bytes:
        return frames, f"request of {size} bytes is over the server's limit of {max_bytes} bytes"
    return frames, None


# ---- messages on the data connection ------------------------------------------------------------------
def stream_buffers(frames: Sequence[Any]) -> list[Any]:
    """A message as the buffers to write on the data connection: its head, the frames' lengths, the frames."""
    if len(frames) == 1 and type(frames[0]) is bytes:  # a header alone, as most messages are
        return [_ONE_FRAME_HEAD.pack(1, 8 + len(frames[0]), len(frames[0])), frames[0]]
    views = [memoryview(f).cast("B") for f in frames]
    sizes = [len(v) for v in views]
    return [STREAM_HEAD.pack(len(views), 8 * len(views) + sum(sizes)), struct.pack(f"<{len(views)}Q", *sizes), *views]


def send_buffers(sock: socket.socket, buffers: list[memoryview]) -> None:
    """Write all of `buffers` (scatter-gather: a small message is one system call)."""
    while buffers:
        sent = sock.sendmsg(buffers)
        while buffers and sent >= len(buffers[0]):
            sent -= len(buffers[0])
            buffers = buffers[1:]
        if buffers and sent:
            buffers = [buffers[0][sent:], *buffers[1:]]


def stream_frames(count: int, body: memoryview) -> list[memoryview]:
    """The frames of a message's body (after its head), checked against the lengths it declares."""
    table = 8 * count
    if table > len(body):
        raise WireError(f"a message of {count} frames in {len(body)} bytes")
    if count == 1:
        if _LENGTH.unpack_from(body)[0] != len(body) - 8:
            raise WireError("a message's frame does not fill its body")
        return [body[8:]]
    at, frames = table, []
    for length in struct.unpack_from(f"<{count}Q", body):
        if at + length > len(body):
            raise WireError("a message's frames are longer than its body")
        frames.append(body[at : at + length])
        at += length
    if at != len(body):
        raise WireError("a message's body is longer than its frames")
    return frames


def set_stall_timeout(sock: socket.socket, seconds: float) -> None:
    """Blocking reads and writes on `sock` that fail (EAGAIN) after moving no byte for `seconds`: one
    system call each, where Python's own timeout polls before every call."""
    sock.settimeout(None)
    value = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
