"""The wire format: one versioned msgpack header frame, then raw frames for bulk bytes.

A message is a ZeroMQ multipart message `[header, *bulk]`. The header is a msgpack map with
`v` (PROTOCOL_VERSION) and `op`; any bytes argument larger than INLINE_MAX travels as its own
frame, referenced from the header by ExtType(BULK, index), so 64 MiB never passes through
msgpack. No pickle anywhere: a peer can only send data, never code.

Ops (client -> server):
  hello   to the daemon: {client: {pid, host, user}}          -> {worker: endpoint, session}
  init    to the worker: {}                                   -> {driver_version, devices}
  calls   {seq, calls: [[opcode, args], ...], reply: bool}    -> {seq, status, outs, deferred}
          a batch of calls executed in order; only `reply` batches are answered, by the last call
  bye     the client is leaving; its resources are released
Every answer carries `op: "reply"`; a request the server cannot serve is answered with
`status` set and `error` saying why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
BULK = 1  # msgpack ext type code of a reference to a bulk frame
INLINE_MAX = 64 * 1024


class WireError(ValueError):
    """A message that does not follow this format."""


def encode(header: dict[str, Any]) -> list[Any]:
    """Header dict -> frames; bytes-like values over INLINE_MAX become frames of their own."""
    bulk: list[Any] = []

    def default(obj: Any) -> Any:
        if isinstance(obj, (memoryview, bytearray)):
            if len(obj) <= INLINE_MAX:
                return bytes(obj)
            bulk.append(obj)
            return msgpack.ExtType(BULK, (len(bulk) - 1).to_bytes(4, "little"))
        raise TypeError(f"cannot send {type(obj).__name__}")

    header = {"v": PROTOCOL_VERSION, **header}
    return [msgpack.packb(header, default=default, use_bin_type=True), *bulk]


def bulk(data: Any) -> Any:
    """Mark bytes so that encode() sends them as a frame when they are large."""
    return data if len(data) <= INLINE_MAX else memoryview(data)


def decode(frames: Sequence[Any]) -> dict[str, Any]:
    """Frames -> header dict with bulk references replaced by the frames' buffers."""
    if not frames:
        raise WireError("empty message")
    rest = frames[1:]

    def ext_hook(code: int, data: bytes) -> Any:
        if code != BULK or len(data) != 4:
            raise WireError(f"unknown ext type {code}")
        index = int.from_bytes(data, "little")
        if index >= len(rest):
            raise WireError(f"bulk frame {index} missing (message has {len(rest)})")
        frame = rest[index]
        return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)

    try:
        header = msgpack.unpackb(_bytes(frames[0]), ext_hook=ext_hook, raw=False, strict_map_key=False)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several types for garbage
        raise WireError(f"undecodable header: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("header is not a map")
    if header.get("v") != PROTOCOL_VERSION:
        raise WireError(f"protocol version {header.get('v')!r}, this end speaks {PROTOCOL_VERSION}")
    if not isinstance(header.get("op"), str):
        raise WireError("header has no op")
    return header


def _bytes(frame: Any) -> Any:
    return frame.buffer if hasattr(frame, "buffer") else frame
