"""The replay compiled: model.replay's loop in C (perfmodel/replay.c) over arrays made once per list of messages.

A sweep replays the same messages hundreds of times over different networks; in Python each replay of a trace of
10^6 calls takes about a second. Here the messages become numpy arrays once (Replayer), the GPU's streams and
events numbered densely, and each replay is one call into C. model.replay stays the reference: both do the same
arithmetic in the same order, so they give the same Prediction (tests/test_perf_speed.py). The arrays are made
from the trace's columns where its reader has them (trace.columns, protocol/trace_reader.c), else from its Message
objects: the same arithmetic from either, the same arrays bit for bit.

Built once per cache (protocol/cbuild.py) with this Python's compiler, as protocol/gcm.py is; where it cannot be
built or loaded, `library()` is None (said once) and the Python replay runs. XPU_PERF_NATIVE=0 makes it run too.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import os
from collections.abc import Iterator, Sequence
from itertools import chain, repeat
from operator import attrgetter
from pathlib import Path
from typing import Any

try:
    import numpy as np
except ImportError:  # numpy comes with the plot extra; without it the Python replay runs
    np = None

from xpuremote.protocol import trace as fmt
from xpuremote.protocol.cbuild import cffi_module

from .model import SYNCS, Breakdown, Machines, Msg, Network, Prediction, Transport, Wake, replay

log = logging.getLogger("xpuremote.perfmodel")

SOURCE = Path(__file__).with_name("replay.c")
MODULE = "_xpuremote_replay"
COLUMNS = ("sent", "kind", "up", "down", "server", "wait", "blocked", "gpu_start", "offset", "op", "a", "ev", "b")
C_TYPES = {"float64": "double[]", "int8": "int8_t[]", "int32": "int32_t[]", "int64": "int64_t[]"}
KINDS = {"async": 0, "sync": 1}  # any other kind (later) is 2: answered, its answer read by whoever comes next
_python = False  # python_replay() in force


@functools.cache
def library() -> tuple[Any, Any] | None:
    """(ffi, lib), built on first use; None where it cannot be."""
    if os.environ.get("XPU_PERF_NATIVE", "1") == "0":
        return None
    if np is None:
        log.warning("xpu-perf replays in Python, slower: numpy is not installed (pip install numpy)")
        return None
    try:
        # no fused multiply-adds: the same roundings as the Python replay
        module = cffi_module(MODULE, SOURCE, macros=_macros(), flags=("-O2", "-ffp-contract=off"))
    except Exception as exc:  # a missing compiler, headers or setuptools: the Python replay runs
        log.warning("xpu-perf replays in Python, slower: perfmodel/replay.c did not build or load (%s)", exc)
        return None
    return module.ffi, module.lib


@contextlib.contextmanager
def python_replay() -> Iterator[None]:
    """Replay in Python within this block, for Replayers made in it (to compare the two)."""
    global _python
    before, _python = _python, True
    try:
        yield
    finally:
        _python = before


class Replayer:
    """model.replay of `msgs`, compiled where it can be; msgs are taken as they are now (they are frozen)."""

    def __init__(self, msgs: Sequence[Msg], arrays: dict[str, Any] | None = None) -> None:
        """`arrays`: msgs' columns (_arrays), made already."""
        self.msgs = msgs
        self.lib = None if _python else library()
        if self.lib is not None:
            self.arrays = arrays if arrays is not None else _arrays(msgs)
            self.pointers = [_ptr(self.lib[0], self.arrays[name]) for name in COLUMNS]

    def __call__(self, span: float, transport: Transport, net: Network, machines: Machines,
                 first: int | None = None) -> Prediction:
        """The replay of the first `first` messages (all: None) as a run of `span` ns."""
        n = len(self.msgs) if first is None else first
        if self.lib is None:
            return replay(self.msgs[:n] if first is not None else self.msgs, span, transport, net, machines)
        ffi, lib = self.lib
        arr = self.arrays
        free, events = np.zeros(arr["n_streams"]), np.zeros(arr["n_events"])
        cx, cy = _curve(machines.client)
        sx, sy = _curve(machines.server)
        out = ffi.new("struct xpu_replay_out *")
        p = self.pointers
        lib.xpu_replay(n, *p, _ptr(ffi, free), _ptr(ffi, events), transport.base_ns,
                       transport.per_byte_ns, net.rtt_us, net.gbps, _ptr(ffi, cx), _ptr(ffi, cy), len(cx),
                       machines.spin, machines.blocked, _ptr(ffi, sx), _ptr(ffi, sy), len(sx), out)
        return _prediction(out, span, net)

    def sent_before(self, t: float) -> int:
        """How many of the messages (in send order) were sent before `t` (ns after the trace's epoch)."""
        if self.lib is None:
            return bisect.bisect_left(self.msgs, t, key=attrgetter("sent"))
        return int(np.searchsorted(self.arrays["sent"], t, side="left"))


def of_trace(trace: fmt.Trace, overlap: bool, msgs: Sequence[Msg]) -> Replayer:
    """The Replayer of `msgs`, which are model.messages(trace) (with the GPU's operations where `overlap`), its
    arrays made from the trace's columns (trace.columns) where the C reader read it, else from its messages, in
    numpy's loops rather than Python's: `msgs` are made only where the Python replay runs."""
    if _python or library() is None:
        return Replayer(msgs)
    columns = trace.columns
    source = _columns_source(columns, overlap) if columns is not None else _messages_source(trace.messages, overlap)
    return Replayer(msgs, _trace_arrays(source))


def _prediction(out: Any, span: float, net: Network) -> Prediction:
    """model.replay's ending, from the loop's sums."""
    b = Breakdown(round_trips=int(out.round_trips), bytes_up=int(out.bytes_up), bytes_down=int(out.bytes_down))
    predicted = span + out.shift
    b.latency, b.transport, b.server = out.latency, out.transport, out.server
    b.bytes = max(0.0, out.waited - b.latency - b.transport - b.server)
    b.client = predicted - out.waited
    for name in ("client", "latency", "bytes", "transport", "server"):
        setattr(b, name, getattr(b, name) / 1e9)
    return Prediction(net, span / 1e9, predicted / 1e9, b)


def _ptr(ffi: Any, array: np.ndarray) -> Any:
    return ffi.from_buffer(C_TYPES[array.dtype.name], array)


def _curve(wake: Wake) -> tuple[np.ndarray, np.ndarray]:
    points = np.array(wake.points, dtype=np.float64).reshape(-1, 2)
    return np.ascontiguousarray(points[:, 0]), np.ascontiguousarray(points[:, 1])


def _arrays(msgs: Sequence[Msg]) -> dict[str, Any]:
    """The messages as columns, and their GPU steps as columns of one flat list with each message's start in it."""
    n = len(msgs)
    col = {name: np.fromiter((getattr(m, name) for m in msgs), np.float64, n)
           for name in ("sent", "server", "wait", "blocked")}
    col["up"] = np.fromiter((m.up for m in msgs), np.int64, n)
    col["down"] = np.fromiter((m.down for m in msgs), np.int64, n)
    col["kind"] = np.fromiter((KINDS.get(m.kind, 2) for m in msgs), np.int8, n)
    counts = np.fromiter((len(m.gpu) for m in msgs), np.int64, n)
    col["gpu_start"] = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    steps = np.array(list(chain.from_iterable(m.gpu for m in msgs)), dtype=np.float64).reshape(-1, 4)
    col.update(_dense(steps[:, 0], steps[:, 1].astype(np.int8), steps[:, 2].astype(np.int64), steps[:, 3]))
    return col


def _messages_source(messages: Sequence[fmt.Message], overlap: bool) -> dict[str, Any]:
    """What _trace_arrays takes, from the trace's Message objects: the messages' numbers, each one's GPU operations
    where `overlap` (`counts`, and their rows in `flat`), and the server's time on each item of those that have any
    (`sizes`, and their `times`; nil 0)."""
    n = len(messages)
    col = {name: np.fromiter(map(attrgetter(name), messages), np.float64, n) for name in ("sent", "wait")}
    col["server"] = np.nan_to_num(np.array(list(map(attrgetter("server"), messages)), np.float64), nan=0.0)
    col["up"] = np.fromiter(map(attrgetter("up"), messages), np.int64, n)
    col["down"] = np.fromiter(map(attrgetter("down"), messages), np.int64, n)
    col["kind"] = np.fromiter(map(KINDS.get, map(attrgetter("kind"), messages), repeat(2)), np.int8, n)
    flats = [ops.flat if type(ops) is fmt.GpuOps else tuple(chain.from_iterable(ops))
             for ops in map(attrgetter("gpu_ops"), messages)] if overlap else [()] * n
    col["counts"] = np.fromiter(map(len, flats), np.int64, n) // 4
    col["flat"] = np.array(list(chain.from_iterable(flats)), np.int64).reshape(-1, 4)
    items = [m.per_call or () if c else () for m, c in zip(messages, col["counts"].tolist(), strict=True)]
    col["sizes"] = np.fromiter(map(len, items), np.int64, n)
    col["times"] = np.nan_to_num(np.array(list(chain.from_iterable(items)), np.float64), nan=0.0)
    return col


def _columns_source(c: fmt.Columns, overlap: bool) -> dict[str, Any]:
    """_messages_source of the messages the columns `c` are, made from them."""
    n = len(c)
    kinds = np.array([KINDS.get(kind, 2) for kind in fmt.KINDS], np.int8)
    col = {"sent": c.sent.astype(np.float64), "wait": c.wait.astype(np.float64),
           "server": np.where(c.server_nil, 0, c.server).astype(np.float64), "up": c.up, "down": c.down,
           "kind": kinds[c.kind]}
    col["counts"] = np.diff(c.ops_start) if overlap else np.zeros(n, np.int64)
    col["flat"] = c.ops if overlap else np.zeros((0, 4), np.int64)
    timed = (col["counts"] > 0) & ~c.per_call_nil
    col["sizes"] = np.where(timed, np.diff(c.items_start), 0)
    kept = np.repeat(timed, np.diff(c.items_start))
    col["times"] = np.where(c.item_nil, 0, c.item)[kept].astype(np.float64)
    return col


def _trace_arrays(src: dict[str, Any]) -> dict[str, Any]:
    """_arrays(model.messages(...)) made from a source of them (_messages_source, _columns_source): model.msg's
    arithmetic over columns."""
    n, counts, sizes = len(src["sent"]), src["counts"], src["sizes"]
    col = {name: src[name] for name in ("sent", "wait", "server", "up", "down", "kind")}
    col["gpu_start"] = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    steps = src["flat"]  # (pos, op, a, b), numbers as read
    owner = np.repeat(np.arange(n), counts)  # each step's message
    # where each item began in the server's time on its message: the items' times summed, per message
    summed = np.concatenate(([0.0], np.cumsum(src["times"])))
    base = np.concatenate(([0], np.cumsum(sizes)))[:-1]
    pos = steps[:, 0]
    index = np.where(pos < 0, pos + sizes[owner], pos)
    known = (pos < sizes[owner]) & (index >= 0)
    first = base[owner]
    offset = np.zeros(len(pos))
    offset[known] = summed[first[known] + index[known]] - summed[first[known]]
    op, b = steps[:, 1], steps[:, 3].astype(np.float64)
    syncs = np.isin(op, SYNCS)
    waited = np.bincount(owner[syncs], weights=b[syncs], minlength=n)
    col["blocked"] = np.where(counts > 0, np.minimum(waited, col["server"]), 0.0)
    col.update(_dense(offset, op.astype(np.int8), steps[:, 2], b))
    return col


def _dense(offset: np.ndarray, op: np.ndarray, a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """Steps (offset, op, a, b) as columns; streams and events renumbered 0.. (the legacy stream 0 stays 0)."""
    on_stream = np.isin(op, (fmt.WORK, fmt.RECORD, fmt.WAIT, fmt.SYNC_STREAM))
    by_event = np.isin(op, (fmt.RECORD, fmt.WAIT))
    synced = op == fmt.SYNC_EVENT
    n_streams, streams = _numbered(np.concatenate(([0], a[on_stream])))
    dense_a = np.zeros(len(op), np.int32)
    dense_a[on_stream] = streams[1:]
    events_a = a[synced]
    n_events, events = _numbered(np.concatenate((events_a, b[by_event].astype(np.int64))))
    ev = np.zeros(len(op), np.int32)
    ev[by_event] = events[len(events_a):]
    ev[synced] = events[:len(events_a)]
    return {"offset": np.ascontiguousarray(offset), "op": np.ascontiguousarray(op), "a": dense_a, "ev": ev,
            "b": np.ascontiguousarray(b), "n_streams": n_streams, "n_events": max(n_events, 1)}


def _numbered(values: np.ndarray) -> tuple[int, np.ndarray]:
    """How many different values, and each one's rank among them (np.searchsorted(np.unique(values), values)); by a
    table where they are small numbers, as the writer numbers streams and events, rather than by sorting."""
    if len(values) and values.min() >= 0 and values.max() < 1 << 20:
        present = np.zeros(int(values.max()) + 1, bool)
        present[values] = True
        rank = np.cumsum(present) - 1
        return int(rank[-1]) + 1, rank[values]
    unique = np.unique(values)
    return len(unique), np.searchsorted(unique, values)


def _macros() -> list[tuple[str, str]]:
    """The numbers replay.c shares with Python, from where they are defined: the trace's GPU operations and this
    module's message kinds."""
    ops = [(f"XPU_GPU_{name.upper()}", str(i)) for i, name in enumerate(fmt.GPU_OPS_NAMES)]
    return ops + [(f"XPU_KIND_{kind.upper()}", str(n)) for kind, n in KINDS.items()]
