"""The server's time on each call of a recorded run: the call's share of the message it went in.

The worker times each item of a message (`per_call`). The shim's lane records travel as one item of their
message, and a worker that times only the calls it runs one by one leaves that item untimed (None). Such an
item gets what the message's time leaves after its timed items, less what a message costs the worker beyond
its items (decoding, answering: the median of that remainder over the messages without lane records); its
records share it equally. A call the application made through the client has its item's time.
"""

from __future__ import annotations

import statistics
from collections import Counter

from xpuremote.protocol import trace as fmt


def lane_items(trace: fmt.Trace) -> Counter[tuple[int, int]]:
    """(seq, pos) -> how many lane records that item of that message holds."""
    return Counter((c.seq, c.pos) for c in trace.calls if c.lane)


def message_overhead(trace: fmt.Trace) -> float:
    """The worker's time on a message beyond its items', typically: the median over messages it timed whole."""
    rest = [m.server - sum(m.per_call) for m in trace.messages
            if m.server is not None and m.per_call and None not in m.per_call]
    return max(0.0, statistics.median(rest)) if rest else 0.0


def item_times(trace: fmt.Trace) -> dict[int, list[float]]:
    """seq -> the server's time on each item of that message, untimed items estimated (see the module)."""
    records = lane_items(trace)
    overhead = message_overhead(trace) if any(m.per_call and None in m.per_call for m in trace.messages) else 0.0
    out: dict[int, list[float]] = {}
    for m in trace.messages:
        if not m.per_call:
            continue
        untimed = [i for i, t in enumerate(m.per_call) if t is None]
        times = [float(t or 0) for t in m.per_call]
        if untimed:
            left = max(0.0, float(m.server or 0) - sum(times) - overhead)
            weights = [records.get((m.seq, i), 1) for i in untimed]
            for i, w in zip(untimed, weights, strict=True):
                times[i] = left * w / sum(weights)
        out[m.seq] = times
    return out


def call_shares(trace: fmt.Trace) -> list[float | None]:
    """Each of trace.calls' share of the server's time (None: its message has no per-item times, or it sent
    nothing): its item's time, a lane item's divided among its records."""
    items, records = item_times(trace), lane_items(trace)
    shares: list[float | None] = []
    for c in trace.calls:
        times = items.get(c.seq)
        if times is None or c.pos >= len(times):
            shares.append(None)
        else:
            shares.append(times[c.pos] / records[(c.seq, c.pos)] if c.lane else times[c.pos])
    return shares
