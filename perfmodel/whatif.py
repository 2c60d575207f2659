"""What each of the client's optimisations buys: the same trace with one of them turned off.

- no async: every async call waits for its own answer, as a plain RPC layer would do;
- no shadow handles: each call creating a handle (stream, event, module, function) waits for the
  server to make it, instead of using a handle the client made;
- no local answers: every call answered from the client's cache (device attributes, contexts,
  pointer queries) goes to the server.

Turned-off calls become sync round trips at their recorded entry time, with the server's
recorded time for them (per call, shares.py), and bytes shared out equally among the calls of their
message. A record the shim queued in C (a lane record) is an async call like any other here. Local
calls were never sent, so they get the median size and server time of the trace's small round trips;
the answers the shim gives in C are not in a trace, so "no local answers" covers only the client's.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from xpuremote.protocol import trace as fmt

from .model import SMALL_BYTES, SYNCS, GpuStep, Model, Msg, gpu_overlaps, msg
from .shares import call_shares

OFF = {
    "no async": lambda c: c.cls == "async",
    "no shadow handles": lambda c: c.cls == "shadow",
    "no local answers": lambda c: c.cls == "local",
}


def without(model: Model, turned_off: Callable[[fmt.Call], bool]) -> Model:
    """The model of the same run with the calls `turned_off` selects made synchronous."""
    by_seq = {m.seq: m for m in model.trace.messages}
    overlap = gpu_overlaps(model.trace)
    steps = {m.seq: msg(m, overlap).gpu for m in model.trace.messages}
    removed: dict[int, list[float]] = {}  # seq -> the server's time on each call taken out of that message
    moved: dict[int, set[int]] = {}  # seq -> the items whose GPU operations went with a call taken out
    added: list[Msg] = []
    local = _typical_round_trip(model.msgs)
    for call, share in zip(model.trace.calls, call_shares(model.trace), strict=True):
        if not turned_off(call):
            continue
        if call.cls == "local":
            added.append(Msg(call.entry, "sync", local.up, local.down, local.server, 0.0))
            continue
        m = by_seq.get(call.seq)
        if m is None:
            continue  # never sent: it failed before reaching the connection
        server = share if share is not None else float(m.server or 0) / max(m.n, 1)
        removed.setdefault(m.seq, []).append(server)
        gpu = ()  # its item's GPU work goes with the first call of the item taken out (a lane's records share one)
        if call.pos not in moved.setdefault(m.seq, set()):
            moved[m.seq].add(call.pos)
            gpu = tuple((0.0, *rest) for _, *rest in _of_item(m, call.pos, steps[m.seq]))
        added.append(Msg(call.entry, "sync", m.up // max(m.n, 1), local.down, server, 0.0, gpu))
    kept = [_shrunk(m, removed.get(m.seq, []), overlap, moved.get(m.seq, set()))
            for m in model.trace.messages]
    msgs = sorted([k for k in kept if k is not None] + added, key=lambda m: m.sent)
    return Model(model.trace, msgs)


def _of_item(m: fmt.Message, pos: int, steps: tuple[GpuStep, ...]) -> list[GpuStep]:
    """The GPU operations of item `pos` of message `m` (its steps, as model.msg made them)."""
    return [step for step, op in zip(steps, m.gpu_ops) if op.pos == pos]


def _shrunk(m: fmt.Message, taken: list[float], overlap: bool, moved: set[int]) -> Msg | None:
    """A message without calls taken out of it, the server's time on each in `taken`, the GPU operations of its
    items in `moved` gone with them; None if nothing of it is left."""
    if len(taken) >= m.n:
        return None
    up = m.up - len(taken) * (m.up // max(m.n, 1))
    kept = msg(m, overlap)
    gpu = tuple(step for step, op in zip(kept.gpu, m.gpu_ops) if op.pos not in moved) if kept.gpu else ()
    blocked = sum(step[3] for step in gpu if step[1] in SYNCS)
    return dataclasses.replace(kept, up=up, gpu=gpu, blocked=blocked,
                               server=max(kept.server - sum(taken), blocked))


def _typical_round_trip(msgs: list[Msg]) -> Msg:
    sync = [m for m in msgs if m.kind == "sync"] or msgs
    small = [m for m in sync if m.up + m.down < SMALL_BYTES] or sorted(sync, key=lambda m: m.up + m.down)[:1]
    return Msg(0, "sync", int(statistics.median(m.up for m in small)), int(statistics.median(m.down for m in small)),
               statistics.median(m.server for m in small), 0.0)
