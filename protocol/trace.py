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
A trace cut short (the process killed) reads up to its last complete record; a damaged zstd stream, up to the
damage (as far as the piece of CHUNK bytes before it).

Reading: protocol/trace_reader.c reads the records straight into columns (built once per cache by cbuild.py, its
record kinds and tick from this module's constants), and read() returns a Trace whose calls and messages are made
from them only when something walks them (Calls, Messages: lists made on first use), with the messages' columns
as numpy arrays in Trace.columns for the performance model, which predicts from them without a Message object.
Where the C cannot be built or numpy is missing (said once), or XPU_TRACE_NATIVE=0, the Python reader reads the
same Trace (tests/test_trace_reader.py holds the two equal), without columns. Anything malformed is a TraceError.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial, wraps
from itertools import accumulate, chain, compress, islice
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
CHUNK = 1 << 20  # bytes read, decompressed or unpacked at a time

log = logging.getLogger("xpuremote.trace")


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
        calls, messages = self.calls, self.messages
        last = calls.last_return() if isinstance(calls, Calls) else max((c.ret for c in calls), default=0)
        answered = messages.last_answer() if isinstance(messages, Messages) else \
            max((m.sent + m.wait for m in messages), default=0)
        return max(last, answered)

    @property
    def link(self) -> dict[str, float]:
        return self.header.get("link") or {"rtt_us": 0.0, "gbps": 0.0}

    @property
    def columns(self) -> Columns | None:
        """The messages as the C reader read them, as numpy arrays (None where the Python reader read the trace, or
        `messages` is no longer the list the reader gave). They follow no change made to a Message in place."""
        messages = self.messages
        return messages.columns if isinstance(messages, Messages) else None


@dataclass
class Columns:
    """A trace's messages as columns, in send order as Trace.messages: numpy arrays, times in ns. Where the format
    allows nil, a mask says which are (their value 0). Message i's items of per_call are item[items_start[i]:
    items_start[i + 1]], its GPU operations the rows ops_start[i]:ops_start[i + 1] of `ops` (pos, op, a, b)."""

    seq: Any
    kind: Any  # an index into KINDS (int8)
    sent: Any
    up: Any
    n: Any
    wait: Any
    down: Any
    server: Any
    server_nil: Any
    per_call_nil: Any
    items_start: Any
    item: Any
    item_nil: Any
    ops_start: Any
    ops: Any  # (operations, 4) int64
    gpu: Any  # Message.gpu: the work's time where it has operations, else the GPU record's (versions 1-2)
    gpu_nil: Any

    def __len__(self) -> int:
        return len(self.seq)


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
def read(path: str | Path, native: bool = True) -> Trace:
    """The trace at `path`: read into columns in C (trace_reader.c) where it builds and `native`, else in Python;
    the two give equal Traces. Anything malformed is a TraceError."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise TraceError(f"{path} is not an xpuremote trace")
        data = _decompressed(f)
    try:
        header, offset = _header(data)
        if not isinstance(header, dict) or header.get("version") not in READS:
            version = header.get("version") if isinstance(header, dict) else None
            raise TraceError(f"{path}: trace format version {version!r}, this reader knows "
                             f"{', '.join(map(str, READS))}")
        lib = library() if native else None
        if lib is not None:
            return _read_columns(lib, header, data, offset, str(path))
        trace = Trace(header)
        _fill(trace, _batches(data, offset))
    except TraceError as exc:
        raise exc if str(exc).startswith(str(path)) else TraceError(f"{path}: {exc}") from None
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as exc:
        raise TraceError(f"{path}: a malformed record ({type(exc).__name__}: {exc})") from None
    trace.messages.sort(key=attrgetter("sent"))
    return trace


def _decompressed(f: BinaryIO) -> bytes:
    """The records' stream, as far as it can be decompressed (damaged: what came before, CHUNK by CHUNK)."""
    start = f.tell()
    try:
        return zstandard.ZstdDecompressor().decompressobj().decompress(f.read())  # at once: one copy, not two
    except zstandard.ZstdError:
        f.seek(start)
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    out = []
    while chunk := f.read(CHUNK):
        try:
            out.append(decompressor.decompress(chunk))
        except zstandard.ZstdError:
            break
    return b"".join(out)


def _unpacker() -> msgpack.Unpacker:
    # tuples, not lists: records of numbers only, which the garbage collector stops following once it has seen them
    return msgpack.Unpacker(raw=False, strict_map_key=False, use_list=False)


def _header(data: bytes) -> tuple[Any, int]:
    """The stream's first value (None if it has none), its arrays as lists; and where the records begin."""
    unpacker, view = _unpacker(), memoryview(data)
    for at in range(0, len(data), CHUNK):
        unpacker.feed(view[at:at + CHUNK])
        try:
            return _lists(unpacker.unpack()), unpacker.tell()
        except msgpack.OutOfData:
            continue
    return None, len(data)


def _batches(data: bytes, offset: int) -> Iterator[list[Any]]:
    """The records after `offset`, as many as each piece of the stream completes (a list each)."""
    unpacker, view = _unpacker(), memoryview(data)
    for at in range(offset, len(data), CHUNK):
        unpacker.feed(view[at:at + CHUNK])
        yield list(unpacker)


class Lazy(list):  # noqa: FURB189  (a list, for all who take it as one)
    """A list whose items are made on first use, but for their number, known before: a trace of 10^6 calls is
    predicted without making its calls. Iterating makes them as it goes, MADE_AT_ONCE at a time (any() stops
    early); anything else makes them all. Made with the garbage collector off, as read() reads."""

    def __init__(self, n: int, items: Iterable[Any]) -> None:
        super().__init__()
        self._n = n
        self._items: Iterator[Any] | None = iter(items)

    @without_gc  # it makes many objects, none of them garbage (read()'s reason)
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
                i += 1
            elif self._items is None:
                return
            elif not self._more():
                self._items = None
                return

    @without_gc
    def _more(self) -> int:
        """Makes up to MADE_AT_ONCE more items; how many."""
        before = list.__len__(self)
        list.extend(self, islice(self._items, MADE_AT_ONCE))
        return list.__len__(self) - before


MADE_AT_ONCE = 1024  # items an iteration makes at a time: few past where any() stops, the collector off for them


def _made_first(name: str) -> Any:
    method = getattr(list, name)

    def made(self: Lazy, *args: Any, **kwargs: Any) -> Any:
        self._make()
        for other in args:  # list's own methods read another Lazy's items as they are: made or not
            if isinstance(other, Lazy):
                other._make()
        return method(self, *args, **kwargs)

    made.__name__ = name
    return made


for _name in ("__getitem__", "__setitem__", "__delitem__", "__contains__", "__reversed__", "__eq__", "__ne__",
              "__lt__", "__le__", "__gt__", "__ge__", "__add__", "__iadd__", "__mul__", "__imul__", "__rmul__",
              "__repr__", "__reduce_ex__", "append", "extend", "insert", "pop", "remove", "index", "count", "sort",
              "reverse", "copy", "clear"):
    setattr(Lazy, _name, _made_first(_name))


class Calls(Lazy):
    """A trace's calls as read, made on first use; the last one's return known before."""

    def __init__(self, n: int, items: Iterable[Call], last_return: int) -> None:
        super().__init__(n, items)
        self._last = last_return

    def last_return(self) -> int:
        return self._last if self._items is not None else max((c.ret for c in self), default=0)


class Messages(Lazy):
    """A trace's messages as the C reader read them (`columns`), made into Message objects on first use; when the
    last answer came (max of sent + wait) known before."""

    def __init__(self, columns: Columns, items: Iterable[Message], last_answer: int) -> None:
        super().__init__(len(columns), items)
        self.columns = columns
        self._last = last_answer

    def last_answer(self) -> int:
        return self._last if self._items is not None else max((m.sent + m.wait for m in self), default=0)


def _calls(records: list[list[Any]], names: dict[int, str]) -> Iterator[Call]:
    last = 0
    for rec in records:
        last += rec[3]
        entry = last * TICK_NS
        yield Call(names[rec[1]], CLASSES[rec[2]], entry, entry + rec[4] * TICK_NS, rec[5], rec[6], rec[7],
                   len(rec) > 8 and bool(rec[8]))


def _ns(ticks: int | None) -> int | None:
    return None if ticks is None else ticks * TICK_NS


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
    if unknown := set(map(itemgetter(1), calls)) - names.keys():  # checked here, not when the calls are made
        raise TraceError(f"calls named by number {min(unknown)}, which no NAME record defines")
    if set(map(itemgetter(2), calls)) - set(range(len(CLASSES))):
        raise TraceError("a CALL record of an unknown class")
    last = max(map(add, accumulate(map(itemgetter(3), calls)), map(itemgetter(4), calls)), default=0)
    trace.calls = Calls(len(calls), _calls(calls, names), last * TICK_NS)
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


_KIND_NUMBERS = range(len(KINDS))


def _others(trace: Trace, records: Iterator[list[Any]], names: dict[int, str], gpu: dict[int, int],
            ops: dict[int, list[int]]) -> None:
    last_message = trace.messages[-1].sent // TICK_NS if trace.messages else 0
    for rec in records:
        kind = rec[0]
        if kind == NAME:
            names[rec[1]] = rec[2]
        elif kind == MESSAGE:
            _, seq, mkind, d_sent, up, n, wait, down, server, per_call = rec
            if mkind not in _KIND_NUMBERS:
                raise TraceError("a MESSAGE record of an unknown kind")
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


# ---- reading into columns, in C (trace_reader.c) --------------------------------------------------------------
SOURCE = Path(__file__).with_name("trace_reader.c")
MODULE = "_xpuremote_trace_reader"
# each column of struct xpu_trace_columns: its numpy type and the count that sizes it
C_COLUMNS = {
    **dict.fromkeys(("name_id", "name_at", "name_len"), ("int64", "names")),
    **dict.fromkeys(("call_name", "call_entry", "call_ret", "call_stream", "call_seq", "call_pos"), ("int64", "calls")),
    **dict.fromkeys(("call_cls", "call_lane"), ("int8", "calls")),
    **dict.fromkeys(("msg_seq", "msg_sent", "msg_up", "msg_n", "msg_wait", "msg_down", "msg_server", "msg_items"),
                    ("int64", "messages")),
    **dict.fromkeys(("msg_kind", "msg_server_nil", "msg_items_nil"), ("int8", "messages")),
    "item": ("int64", "items"), "item_nil": ("int8", "items"),
    **dict.fromkeys(("gpu_seq", "gpu_ns"), ("int64", "gpus")),
    **dict.fromkeys(("ops_seq", "ops_n"), ("int64", "op_records")),
    "ops": ("int64", "ops"),
}
C_TYPES = {"int64": "int64_t *", "int8": "int8_t *"}


@functools.cache
def library() -> tuple[Any, Any] | None:
    """(ffi, lib), built on first use; None where it cannot be (said once): the Python reader runs."""
    if os.environ.get("XPU_TRACE_NATIVE", "1") == "0":
        return None
    try:
        import numpy  # noqa: F401  (the columns are numpy's)

        from .cbuild import cffi_module  # here: the client, which writes traces, need not import it

        module = cffi_module(MODULE, SOURCE, macros=_macros())
    except Exception as exc:  # no numpy, or a missing compiler, headers or setuptools
        log.warning("traces are read in Python, slower: protocol/trace_reader.c did not build or load (%s)", exc)
        return None
    return module.ffi, module.lib


def _macros() -> list[tuple[str, str]]:
    """The numbers trace_reader.c shares with Python, from where they are defined here."""
    kinds = ("NAME", "CALL", "MESSAGE", "END", "GPU", "GPU_OPS")
    return [*((f"XPU_REC_{k}", str(globals()[k])) for k in kinds), ("XPU_TICK_NS", str(TICK_NS)),
            ("XPU_N_CLASSES", str(len(CLASSES))), ("XPU_N_KINDS", str(len(KINDS)))]


def _read_columns(lib: tuple[Any, Any], header: dict[str, Any], data: bytes, offset: int, path: str) -> Trace:
    """The trace whose records are data[offset:], read by trace_reader.c into columns: a count, then a fill."""
    import numpy as np

    ffi, c = lib
    buffer = ffi.from_buffer(data)
    start = ffi.cast("const uint8_t *", buffer) + offset
    counts = ffi.new("struct xpu_trace_counts *")
    _check(c.xpu_trace_read(start, len(data) - offset, counts, ffi.NULL), counts, ffi, offset, path)
    col = {name: np.empty(getattr(counts, n) * (4 if name == "ops" else 1), dtype)
           for name, (dtype, n) in C_COLUMNS.items()}
    out = ffi.new("struct xpu_trace_columns *")
    buffers = [ffi.from_buffer(array) for array in col.values()]  # alive until the fill returns
    for name, b in zip(col, buffers, strict=True):
        setattr(out, name, ffi.cast(C_TYPES[col[name].dtype.name], b))
    _check(c.xpu_trace_read(start, counts.used, counts, out), counts, ffi, offset, path)  # its whole records
    names = {ident: bytes(data[offset + at:offset + at + n]).decode()
             for ident, at, n in zip(col["name_id"].tolist(), col["name_at"].tolist(), col["name_len"].tolist(),
                                     strict=True)}
    _named(col["call_name"], names, path)
    columns = _message_columns(col)
    answered = int((columns.sent + columns.wait).max()) if len(columns) else 0
    last = int(col["call_ret"].max()) if len(col["call_ret"]) else 0
    return Trace(header, Calls(int(counts.calls), _calls_of(col, names), last),
                 Messages(columns, _messages_of(columns), answered), int(counts.end) if counts.has_end else None)


def _check(rc: int, counts: Any, ffi: Any, offset: int, path: str) -> None:
    if rc != 0:
        raise TraceError(f"{path}: record {counts.record} of the trace (byte {offset + counts.error_at} of its "
                         f"stream): {ffi.string(counts.error).decode()}")


def _named(idents: Any, names: dict[int, str], path: str) -> None:
    """Refuses calls whose name no NAME record defines."""
    import numpy as np

    if not len(idents):
        return
    defined = np.fromiter(names, np.int64, len(names))
    low, high = int(idents.min()), int(idents.max())
    if low >= 0 and high < 4 * len(names) + 1024:  # as written: numbers 0.. (a table is faster than np.isin)
        table = np.zeros(high + 1, bool)
        table[defined[(defined >= 0) & (defined <= high)]] = True
        if table[idents].all():
            return
    elif np.isin(idents, defined).all():
        return
    missing = np.setdiff1d(idents, defined)
    raise TraceError(f"{path}: calls named by number {missing[0]}, which no NAME record defines")


def _ranges(starts: Any, counts: Any) -> Any:
    """The indices starts[0]..+counts[0], starts[1]..+counts[1], ... as one array."""
    import numpy as np

    ends = np.cumsum(counts)
    return np.repeat(starts - (ends - counts), counts) + np.arange(ends[-1] if len(ends) else 0)


def _message_columns(col: dict[str, Any]) -> Columns:
    """The messages in send order (a stable sort, as list.sort), each with its per_call items and its GPU operations
    (its GPU_OPS records' in the order read) next to one another."""
    import numpy as np

    sent, n_items = col["msg_sent"], col["msg_items"]
    if np.all(sent[1:] >= sent[:-1]):  # written in send order: as they are
        order, item_index = slice(None), slice(None)
    else:
        order = np.argsort(sent, kind="stable")
        item_index = _ranges((np.cumsum(n_items) - n_items)[order], n_items[order])
    seq = col["msg_seq"][order]
    rows, op_count = _op_rows(seq, col["ops_seq"], col["ops_n"])
    ops = col["ops"].reshape(-1, 4)
    ops = ops if rows is None else ops[rows]
    ops_start = np.concatenate(([0], np.cumsum(op_count)))
    gpu, gpu_nil = _gpu(seq, ops, ops_start, op_count, col["gpu_seq"], col["gpu_ns"])
    return Columns(seq=seq, kind=col["msg_kind"][order], sent=sent[order], up=col["msg_up"][order],
                   n=col["msg_n"][order], wait=col["msg_wait"][order], down=col["msg_down"][order],
                   server=col["msg_server"][order], server_nil=col["msg_server_nil"][order].astype(bool),
                   per_call_nil=col["msg_items_nil"][order].astype(bool),
                   items_start=np.concatenate(([0], np.cumsum(n_items[order]))), item=col["item"][item_index],
                   item_nil=col["item_nil"][item_index].astype(bool), ops_start=ops_start, ops=ops, gpu=gpu,
                   gpu_nil=gpu_nil)


def _op_rows(seq: Any, record_seq: Any, record_n: Any) -> tuple[Any, Any]:
    """Each message's GPU operations, its GPU_OPS records' taken together in the order read: the rows of them
    among all records' (in file order), message after message (None: all of them as they are); and how many each
    message has."""
    import numpy as np

    if len(record_seq) and np.all(record_seq[1:] > record_seq[:-1]):  # a record a message, in the order of seq
        k = np.minimum(np.searchsorted(record_seq, seq), len(record_seq) - 1)
        found = record_seq[k] == seq
        mine = seq[found]
        if len(mine) == len(record_seq) and np.all(mine[1:] > mine[:-1]):  # each a message's, in message order
            return None, np.where(found, record_n[k], 0)
    by_seq = np.argsort(record_seq, kind="stable")  # the records sorted by message, each's in the order read
    uniq, first = np.unique(record_seq[by_seq], return_index=True)
    if not len(uniq):
        return np.zeros(0, np.int64), np.zeros(len(seq), np.int64)
    counted = np.concatenate(([0], np.cumsum(record_n[by_seq])))  # rows before each sorted record
    k = np.minimum(np.searchsorted(uniq, seq), len(uniq) - 1)
    found = uniq[k] == seq
    first_row = counted[first[k]]
    count = np.where(found, counted[np.append(first[1:], len(by_seq))[k]] - first_row, 0)
    file_start = np.cumsum(record_n) - record_n  # each record's first row in file order
    rows_by_seq = _ranges(file_start[by_seq], record_n[by_seq])
    return rows_by_seq[_ranges(first_row, count)], count


def _gpu(seq: Any, ops: Any, ops_start: Any, op_count: Any, gpu_seq: Any, gpu_ns: Any) -> tuple[Any, Any]:
    """Message.gpu of each message, and where it is None: its work's GPU time where it has operations, else its
    last GPU record's (versions 1-2)."""
    import numpy as np

    work = np.concatenate(([0], np.cumsum(np.where(ops[:, 1] == WORK, ops[:, 3], 0))))
    gpu = work[ops_start[1:]] - work[ops_start[:-1]]
    has = op_count > 0
    if len(gpu_seq):
        uniq, last = np.unique(gpu_seq[::-1], return_index=True)  # the last record of each message wins
        k = np.minimum(np.searchsorted(uniq, seq), len(uniq) - 1)
        recorded = ~has & (uniq[k] == seq)
        gpu = np.where(recorded, gpu_ns[::-1][last[k]], gpu)
        has |= recorded
    return np.where(has, gpu, 0), ~has


def _calls_of(col: dict[str, Any], names: dict[int, str]) -> Iterator[Call]:
    """The calls from their columns, when first iterated."""
    cols = [col[k].tolist() for k in ("call_entry", "call_ret", "call_stream", "call_seq", "call_pos")]
    yield from map(Call, map(names.__getitem__, col["call_name"].tolist()), map(CLASSES.__getitem__,
                   col["call_cls"].tolist()), *cols, map(bool, col["call_lane"].tolist()))


def _messages_of(c: Columns) -> Iterator[Message]:
    """The Message objects of the columns (as the Python reader makes them), when first iterated."""
    items, starts = _nils(c.item, c.item_nil), c.items_start.tolist()
    per_call = [None if nil else items[a:b] for nil, a, b in zip(c.per_call_nil.tolist(), starts, starts[1:])]
    flat, rows = c.ops.ravel().tolist(), c.ops_start.tolist()
    ops = [GpuOps(tuple(flat[4 * a:4 * b])) if b > a else [] for a, b in zip(rows, rows[1:])]
    yield from map(Message, c.seq.tolist(), map(KINDS.__getitem__, c.kind.tolist()), c.sent.tolist(),
                   c.up.tolist(), c.n.tolist(), c.wait.tolist(), c.down.tolist(), _nils(c.server, c.server_nil),
                   per_call, _nils(c.gpu, c.gpu_nil), ops)


def _nils(values: Any, nil: Any) -> list[int | None]:
    out = values.tolist()
    if nil.any():
        out = [None if n else v for v, n in zip(out, nil.tolist())]
    return out
