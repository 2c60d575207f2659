"""The trace file: what a client recorded of its run, for xpu-perf. Written by the client
(`XPU_TRACE=path`), read by the performance model.

Format, version 3 (the reader reads 1 and 2 too): the 8 bytes MAGIC, then one zstd stream of concatenated
msgpack values: a header map, then records (arrays, the first element says which kind). Times are integer
ticks of TICK_NS of CLOCK_MONOTONIC relative to the header's `epoch_ns` (the moment the
session with the server was up); time stamps are written as differences from the previous
record of the same kind, so that each fits in a few bytes; zstd then folds the repeats of a
loop together. The reader returns nanoseconds.

The header: format, version, epoch_ns; server, backend, devices; link (the emulated link the
run went over: {"rtt_us", "gbps", "on"}, "on" false when there was none); wake (the wake-up
probe of client/wake.py: {"client": [[idle_ns, extra_ns], ...], "server": [...]}, or nil when
the run went over an emulated link that adds delay); data and lane (version 2: whether the session
had a data connection, and the fast lane).

  [NAME, id, name]                          a call name, defined before its first use
  [CALL, id, cls, d_entry, dur, stream, seq, pos]
      one driver API call: `cls` an index into CLASSES; `d_entry` its entry time minus the
      previous call's; `dur` entry to return; `stream` a small number per stream handle
      (0 = none or the default stream); `seq`, `pos`: the message and the position in it of
      the last request the call queued (seq 0: the call sent nothing)
  [CALL, id, cls, d_entry, dur, stream, seq, pos, 1]
      (version 2) a call the shim queued in C, as a record of the fast lane: its times are the
      lane's own (`dur` from the lane's first look at the call to the record's append, its
      return), and `pos` is the position of the lane's records in message `seq`, which the
      records taken together share
  [MESSAGE, seq, kind, d_sent, up, n, wait, down, server, per_call]
      one message to the server: `kind` an index into KINDS; `d_sent` its send time minus
      the previous message's; `up`, `down` bytes each way (down 0 when unanswered); `wait`
      how long the sending thread waited for the answer (0 for kinds that do not wait);
      `n` calls in it, each lane record counted; `server` the server's time on it, from reading
      it to answering; `per_call` the server's time on each item of it in order, the lane's
      records taken together one item (or nil; an item it did not time is nil)
  [GPU, seq, gpu]                           (versions 1-2) the GPU time of the kernels, copies and memsets
      of message `seq`, measured with events
  [GPU_OPS, seq, [pos, op, a, b, pos, op, a, b, ...]]
      (version 3) what the server's calls of message `seq` did to the GPU's queues, in the order it ran
      them, four numbers each: `pos` the item of the message; `op` an index into GPU_OPS_NAMES:
        work         a kernel, copy, memset or graph launch: `a` its stream, `b` its GPU time in ns
                     (events around it on a GPU; on the sim, the sim's own time running it)
        record       an event recorded: `a` its stream, `b` the event
        wait         stream `a` waits for event `b`
        sync_all     the server waited for the whole context for `b` ns (cuCtxSynchronize)
        sync_stream  the server waited for stream `a` for `b` ns (cuStreamSynchronize, a synchronous copy, a
                     copy to the server's host memory)
        sync_event   the server waited for event `a` for `b` ns (cuEventSynchronize)
      a stream is a small number per stream handle as in CALL (0: the legacy default stream), an event a
      small number per event handle, both numbered by the writer
  [END, span]                               the recording ended `span` after the epoch

Messages are written when the server's times for them are known, so not in send order.
A trace cut short (the process killed) reads up to its last complete block.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import zstandard

MAGIC = b"XPUTRACE"
VERSION = 3
READS = (1, 2, 3)  # version 1 has no lane records; 1-2 a GPU time per message, not its GPU operations
NAME, CALL, MESSAGE, END, GPU, GPU_OPS = range(6)
GPU_OPS_NAMES = ("work", "record", "wait", "sync_all", "sync_stream", "sync_event")
WORK, RECORD, WAIT, SYNC_ALL, SYNC_STREAM, SYNC_EVENT = range(6)
CLASSES = ("local", "async", "shadow", "sync", "internal")
KINDS = ("async", "sync", "later")  # later: sent at once, its answer read by whoever comes next
FLUSH_RECORDS = 4096
TICK_NS = 100  # finer than any call's own cost; the noise below it would not compress


class TraceError(ValueError):
    pass


# ---- writing ------------------------------------------------------------------------------
class TraceWriter:
    """Appends records; thread-safe; compresses a block every FLUSH_RECORDS records."""

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.file: BinaryIO = open(path, "wb")  # noqa: SIM115  (closed by close())
        self.file.write(MAGIC)
        self.stream = zstandard.ZstdCompressor(level=3).stream_writer(self.file, closefd=False)
        self.epoch = time.monotonic_ns()
        self.lock = threading.Lock()
        self.records: list[list[Any]] = []
        self.names: dict[str, int] = {}
        self.streams: dict[int, int] = {0: 0}
        self.events: dict[int, int] = {}
        self.last_call = 0
        self.last_message = 0
        self.closed = False
        self.stream.write(msgpack.packb({"format": "xpuremote-trace", "version": VERSION,
                                         "epoch_ns": self.epoch, **header}))

    def call(self, name: str, cls: int, entry: int, ret: int, stream: int, seq: int, pos: int) -> None:
        with self.lock:
            self.records.append(self._call(name, cls, entry, ret, stream, seq, pos))
            self._maybe_flush()

    def lane_calls(self, calls: list[tuple[str, int, int, int, int]], seq: int, pos: int) -> None:
        """Calls queued in C, (name, cls, entry, return, stream) each, whose records went together at `pos` of
        message `seq`."""
        with self.lock:
            append, epoch = self.records.append, self.epoch
            for name, cls, entry, ret, stream in calls:
                ident = self.names.get(name)
                if ident is None:
                    ident = self._name(name)
                sid = self.streams.setdefault(stream, len(self.streams))
                entry, ret = (entry - epoch) // TICK_NS, (ret - epoch) // TICK_NS
                append([CALL, ident, cls, entry - self.last_call, ret - entry, sid, seq, pos, 1])
                self.last_call = entry
            self._maybe_flush()

    def _call(self, name: str, cls: int, entry: int, ret: int, stream: int, seq: int, pos: int) -> list[int]:
        ident = self.names.get(name)
        if ident is None:
            ident = self._name(name)
        sid = self.streams.setdefault(stream, len(self.streams))
        entry, ret = self._ticks(entry), self._ticks(ret)
        record = [CALL, ident, cls, entry - self.last_call, ret - entry, sid, seq, pos]
        self.last_call = entry
        return record

    def _name(self, name: str) -> int:
        ident = self.names[name] = len(self.names)
        self.records.append([NAME, ident, name])
        return ident

    def message(self, seq: int, kind: int, sent: int, up: int, n: int, wait: int, down: int,
                server: int | None, per_call: list[int | None] | None) -> None:
        with self.lock:
            sent = self._ticks(sent)
            self.records.append([MESSAGE, seq, kind, sent - self.last_message, up, n, wait // TICK_NS, down,
                                 _tick(server), per_call and [_tick(t) for t in per_call]])
            self.last_message = sent
            self._maybe_flush()

    def gpu(self, seq: int, ops: list[int] | int) -> None:
        """What message `seq` did on the GPU: the server's flat [pos, op, stream or event handle, value, ...]
        (GPU_OPS), or the GPU time of its work alone (a server before version 3 of this format)."""
        with self.lock:
            if isinstance(ops, int):
                self.records.append([GPU, seq, ops // TICK_NS])
            else:
                self.records.append([GPU_OPS, seq, self._gpu_ops(ops)])
            self._maybe_flush()

    def _gpu_ops(self, ops: list[int]) -> list[int]:
        """The server's handles numbered as the trace numbers them."""
        out = list(ops)
        streams, events = self.streams, self.events
        for i in range(0, len(out) - 3, 4):
            op, a, b = out[i + 1], out[i + 2], out[i + 3]
            if op == SYNC_EVENT:
                out[i + 2] = events.setdefault(a, len(events))
            elif op in (WORK, RECORD, WAIT, SYNC_STREAM):
                out[i + 2] = streams.setdefault(a, len(streams))
            if op in (RECORD, WAIT):
                out[i + 3] = events.setdefault(b, len(events))
        return out

    def _ticks(self, t_ns: int) -> int:
        return (t_ns - self.epoch) // TICK_NS

    def _maybe_flush(self) -> None:
        if len(self.records) >= FLUSH_RECORDS:
            self._flush()

    def _flush(self) -> None:
        packer = msgpack.Packer()
        self.stream.write(b"".join(packer.pack(r) for r in self.records))
        self.stream.flush(zstandard.FLUSH_BLOCK)
        self.records.clear()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.records.append([END, self._ticks(time.monotonic_ns())])
            self._flush()
            self.stream.close()
            self.file.close()


def _tick(t_ns: int | None) -> int | None:
    return None if t_ns is None else t_ns // TICK_NS


# ---- reading ------------------------------------------------------------------------------
@dataclass
class Call:
    name: str
    cls: str
    entry: int  # ns after the epoch
    ret: int
    stream: int
    seq: int
    pos: int
    lane: bool = False  # queued in C as a lane record: its times are the lane's own


@dataclass(frozen=True)
class GpuOp:
    """One thing a message's call did to the GPU's queues (GPU_OPS in the module's docstring)."""

    pos: int  # the item of its message
    op: int  # WORK, RECORD, ...
    a: int  # a stream (an event for SYNC_EVENT)
    b: int  # ns (WORK, the syncs), or an event (RECORD, WAIT)


@dataclass
class Message:
    seq: int
    kind: str
    sent: int  # ns after the epoch
    up: int
    n: int
    wait: int
    down: int
    server: int | None
    per_call: list[int | None] | None  # per item; a lane's records are one item, None where the server did not time it
    gpu: int | None = None  # ns of GPU work, where measured
    gpu_ops: list[GpuOp] = field(default_factory=list)  # version 3: what it did to the GPU's queues, in order


@dataclass
class Trace:
    header: dict[str, Any]
    calls: list[Call] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)  # in send order
    end: int | None = None  # None: the trace was cut short

    @property
    def span_ns(self) -> int:
        """The recorded run: from the session being up to the last call's return."""
        last = max((c.ret for c in self.calls), default=0)
        return max(last, max((m.sent + m.wait for m in self.messages), default=0))

    @property
    def link(self) -> dict[str, float]:
        return self.header.get("link") or {"rtt_us": 0.0, "gbps": 0.0}


def read(path: str | Path) -> Trace:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise TraceError(f"{path} is not an xpuremote trace")
        values = _values(f)
        header = next(values, None)
        if not isinstance(header, dict) or header.get("version") not in READS:
            version = header.get("version") if isinstance(header, dict) else None
            raise TraceError(f"{path}: trace format version {version!r}, this reader knows "
                             f"{', '.join(map(str, READS))}")
        trace = Trace(header)
        _fill(trace, values)
    trace.messages.sort(key=lambda m: m.sent)
    return trace


def _ns(ticks: int | None) -> int | None:
    return None if ticks is None else ticks * TICK_NS


def _values(f: BinaryIO) -> Iterator[Any]:
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    while chunk := f.read(1 << 16):
        try:
            unpacker.feed(decompressor.decompress(chunk))
        except zstandard.ZstdError:
            return  # damaged: keep what came before
        yield from unpacker


def _fill(trace: Trace, values: Iterator[Any]) -> None:
    names: dict[int, str] = {}
    gpu: dict[int, int] = {}
    ops: dict[int, list[GpuOp]] = {}
    last_call = last_message = 0
    for rec in values:
        kind = rec[0]
        if kind == NAME:
            names[rec[1]] = rec[2]
        elif kind == CALL:
            _, ident, cls, d_entry, dur, stream, seq, pos, *lane = rec
            last_call += d_entry
            entry = last_call * TICK_NS
            trace.calls.append(Call(names[ident], CLASSES[cls], entry, entry + dur * TICK_NS, stream, seq, pos,
                                    bool(lane and lane[0])))
        elif kind == MESSAGE:
            _, seq, mkind, d_sent, up, n, wait, down, server, per_call = rec
            last_message += d_sent
            trace.messages.append(Message(seq, KINDS[mkind], last_message * TICK_NS, up, n, wait * TICK_NS, down,
                                          _ns(server), per_call and [_ns(t) for t in per_call]))
        elif kind == GPU:
            gpu[rec[1]] = rec[2] * TICK_NS
        elif kind == GPU_OPS:
            flat = rec[2]
            ops.setdefault(rec[1], []).extend(GpuOp(*flat[i : i + 4]) for i in range(0, len(flat) - 3, 4))
        elif kind == END:
            trace.end = rec[1] * TICK_NS
        else:
            raise TraceError(f"unknown record kind {kind}")
    for m in trace.messages:
        m.gpu_ops = ops.get(m.seq, [])
        m.gpu = sum(o.b for o in m.gpu_ops if o.op == WORK) if m.gpu_ops else gpu.get(m.seq)
