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

import gc
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial, wraps
from itertools import accumulate, chain, compress
from operator import add, attrgetter, itemgetter, mul, not_, sub
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, TypeVar

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


T = TypeVar("T")


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


class GpuOp(NamedTuple):
    """One thing a message's call did to the GPU's queues (GPU_OPS in the module's docstring). A tuple: a trace
    holds millions, made at a third of a frozen dataclass's cost."""

    pos: int  # the item of its message
    op: int  # WORK, RECORD, ...
    a: int  # a stream (an event for SYNC_EVENT)
    b: int  # ns (WORK, the syncs), or an event (RECORD, WAIT)


@dataclass(slots=True)  # a trace holds many: made faster, and with no __dict__ each
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
        calls = self.calls
        last = calls.last_return() if isinstance(calls, Calls) else max((c.ret for c in calls), default=0)
        return max(last, max((m.sent + m.wait for m in self.messages), default=0))

    @property
    def link(self) -> dict[str, float]:
        return self.header.get("link") or {"rtt_us": 0.0, "gbps": 0.0}


def without_gc(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, run with the garbage collector off: it makes millions of objects, none of them garbage, which the
    collector would otherwise walk through each time a few hundred more were made (it doubled a read)."""

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()

    return run


@without_gc
def read(path: str | Path) -> Trace:
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise TraceError(f"{path} is not an xpuremote trace")
        batches = _batches(f)
        first = next(batches, [])
        header = _lists(first[0]) if first else None
        if not isinstance(header, dict) or header.get("version") not in READS:
            version = header.get("version") if isinstance(header, dict) else None
            raise TraceError(f"{path}: trace format version {version!r}, this reader knows "
                             f"{', '.join(map(str, READS))}")
        trace = Trace(header)
        _fill(trace, chain([first[1:]], batches))
    trace.messages.sort(key=attrgetter("sent"))
    return trace


class Lazy(list):  # noqa: FURB189  (a list, for all who take it as one)
    """A list whose items are made on first use, but for their number, known before: a trace of 10^6 calls is
    predicted without making its calls. Iterating makes them as it goes (any() stops early); anything else
    makes them all."""

    def __init__(self, n: int, items: Iterable[Any]) -> None:
        super().__init__()
        self._n = n
        self._items: Iterator[Any] | None = iter(items)

    def _make(self) -> None:
        if self._items is not None:
            items, self._items = self._items, None
            super().extend(items)

    def __len__(self) -> int:
        return self._n if self._items is not None else super().__len__()

    def __iter__(self) -> Iterator[Any]:
        return super().__iter__() if self._items is None else self._iterate()

    def _iterate(self) -> Iterator[Any]:
        i = 0
        while True:
            if i < list.__len__(self):
                yield list.__getitem__(self, i)
            elif self._items is None:
                return
            else:
                item = next(self._items, _END)
                if item is _END:
                    self._items = None
                    return
                list.append(self, item)
                yield item
            i += 1


_END = object()


def _made_first(name: str) -> Any:
    method = getattr(list, name)

    def made(self: Lazy, *args: Any, **kwargs: Any) -> Any:
        self._make()
        return method(self, *args, **kwargs)

    made.__name__ = name
    return made


for _name in ("__getitem__", "__setitem__", "__delitem__", "__contains__", "__reversed__", "__eq__", "__ne__",
              "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__iadd__", "__mul__", "__imul__", "__rmul__",
              "__repr__", "__reduce_ex__", "append", "extend", "insert", "pop", "remove", "index", "count", "sort",
              "reverse", "copy", "clear"):
    setattr(Lazy, _name, _made_first(_name))


class Calls(Lazy):
    """A trace's calls as read, made from their records on first use; the last one's return known before."""

    def __init__(self, records: list[list[Any]], names: dict[int, str]) -> None:
        super().__init__(len(records), _calls(records, names))
        self._last = max(map(add, accumulate(map(itemgetter(3), records)), map(itemgetter(4), records)), default=0)

    def last_return(self) -> int:
        return self._last * TICK_NS if self._items is not None else max((c.ret for c in self), default=0)


def _calls(records: list[list[Any]], names: dict[int, str]) -> Iterator[Call]:
    last = 0
    for rec in records:
        last += rec[3]
        entry = last * TICK_NS
        yield Call(names[rec[1]], CLASSES[rec[2]], entry, entry + rec[4] * TICK_NS, rec[5], rec[6], rec[7],
                   len(rec) > 8 and bool(rec[8]))


def _ns(ticks: int | None) -> int | None:
    return None if ticks is None else ticks * TICK_NS


def _batches(f: BinaryIO) -> Iterator[list[Any]]:
    """The values, as many as each piece of the file completes (a list each; the first one holds at least one)."""
    # tuples, not lists: records of numbers only, which the garbage collector stops following once it has seen them
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, use_list=False)
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    while chunk := f.read(1 << 20):
        try:
            unpacker.feed(decompressor.decompress(chunk))
        except zstandard.ZstdError:
            return  # damaged: keep what came before
        if batch := list(unpacker):
            yield batch


def _lists(value: Any) -> Any:
    """The header as written: its arrays as lists."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    return [_lists(v) for v in value] if isinstance(value, tuple) else value


_new_op = partial(tuple.__new__, GpuOp)  # a GpuOp without a Python frame


class GpuOps(Lazy):
    """A message's GPU operations as read: `flat`, the records' numbers (pos, op, a, b, pos, ...), made into GpuOps
    on first use."""

    def __init__(self, flat: Sequence[int]) -> None:  # one a message: Lazy.__init__'s work without its calls
        four = iter(flat)
        self._n, self._items, self.flat = len(flat) // 4, map(_new_op, zip(four, four, four, four)), flat


def _fill(trace: Trace, batches: Iterator[list[Any]]) -> None:
    names: dict[int, str] = {}
    gpu: dict[int, int] = {}
    ops: dict[int, list[int]] = {}  # seq -> its GPU_OPS records' numbers, four an operation
    calls: list[list[Any]] = []
    for batch in batches:
        # the calls, most records, are kept as they are (Calls makes them); the others taken one by one
        is_call = list(map(CALL.__eq__, map(itemgetter(0), batch)))
        calls += compress(batch, is_call)
        _others(trace, compress(batch, map(not_, is_call)), names, gpu, ops)
    trace.calls = Calls(calls, names)
    work = dict(zip(ops, _work(list(ops.values())), strict=True))
    for m in trace.messages:
        flat = ops.get(m.seq)
        m.gpu_ops = GpuOps(flat) if flat else []
        m.gpu = work[m.seq] if flat else gpu.get(m.seq)


def _work(flats: list[list[int]]) -> list[int]:
    """The GPU time of each list's work operations (their b), in C's loops rather than Python's."""
    every = list(chain.from_iterable(flats))
    cumulative = list(accumulate(map(mul, every[3::4], map(WORK.__eq__, every[1::4])), initial=0))
    ends = list(accumulate(len(flat) // 4 for flat in flats))
    return list(map(sub, map(cumulative.__getitem__, ends), map(cumulative.__getitem__, [0, *ends[:-1]])))


def _others(trace: Trace, records: Iterator[list[Any]], names: dict[int, str], gpu: dict[int, int],
            ops: dict[int, list[int]]) -> None:
    last_message = trace.messages[-1].sent // TICK_NS if trace.messages else 0
    for rec in records:
        kind = rec[0]
        if kind == NAME:
            names[rec[1]] = rec[2]
        elif kind == MESSAGE:
            _, seq, mkind, d_sent, up, n, wait, down, server, per_call = rec
            last_message += d_sent
            if per_call is not None:
                per_call = list(map(TICK_NS.__mul__, per_call)) if None not in per_call else list(map(_ns, per_call))
            trace.messages.append(Message(seq, KINDS[mkind], last_message * TICK_NS, up, n, wait * TICK_NS, down,
                                          _ns(server), per_call))
        elif kind == GPU:
            gpu[rec[1]] = rec[2] * TICK_NS
        elif kind == GPU_OPS:
            flat, seq = rec[2], rec[1]
            flat = flat[: len(flat) // 4 * 4]
            ops[seq] = ops[seq] + flat if seq in ops else flat
        elif kind == END:
            trace.end = rec[1] * TICK_NS
        else:
            raise TraceError(f"unknown record kind {kind}")
