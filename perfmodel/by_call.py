"""Where a recorded run's time goes, call by call: for each call name, how often it was made, the time
the application's thread spent inside it, the server's time on it, and the waits it ended.

A call the client ran is timed in Python while recording, which makes it dearer (2-5x for the cheap ones);
a call the shim queued in C (a lane record) is timed by the lane itself, two clock reads. The answers the
shim gives in C send nothing and are not in a trace. The server's time is each call's own share of its
message (shares.py: the worker times each item; a lane's records share theirs); a wait is the time the
application waited for the answer of a message that the call ended (a sync call, or the call whose answer
was read later).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from xpuremote.protocol import trace as fmt

from .shares import call_shares, item_times


@dataclass
class CallTime:
    name: str
    cls: str
    count: int = 0
    inside_ns: int = 0  # the application's thread inside the call (its wait included)
    server_ns: int = 0
    waits: int = 0  # messages this call ended whose answer the application waited for
    wait_ns: int = 0

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def by_call(trace: fmt.Trace, since_ns: int = 0) -> list[CallTime]:
    """One row per call name, of the calls entered `since_ns` into the run or later (a warm-up left out),
    the dearest (inside time, then server time) first."""
    messages = {m.seq: m for m in trace.messages}
    last_of: dict[int, fmt.Call] = {}
    rows: dict[str, CallTime] = {}
    server: dict[str, float] = {}
    taken: dict[int, set[int]] = {}  # each message's positions that hold a call of the application's
    for call, share in zip(trace.calls, call_shares(trace), strict=True):
        taken.setdefault(call.seq, set()).add(call.pos)
        if call.entry < since_ns:
            continue
        row = rows.setdefault(call.name, CallTime(call.name, call.cls))
        row.count += 1
        row.inside_ns += call.ret - call.entry
        if call.seq in messages:
            if not call.lane:  # a lane's records went out with the call that sent them, which ended the message
                last_of[call.seq] = call
            server[call.name] = server.get(call.name, 0.0) + (share or 0.0)
    for name, ns in server.items():
        rows[name].server_ns = round(ns)
    for seq, call in last_of.items():
        message = messages[seq]
        if message.kind != "async":
            rows[call.name].waits += 1
            rows[call.name].wait_ns += message.wait
    own = _own_requests(trace, since_ns, taken)
    return sorted([*rows.values(), *([own] if own.count else [])], key=lambda r: (r.inside_ns, r.server_ns),
                  reverse=True)


def _own_requests(trace: fmt.Trace, since_ns: int, taken: dict[int, set[int]]) -> CallTime:
    """The server's time on what the client asked of its own (the positions of a message that no call of
    the application's holds: its internal requests, a context set before a call)."""
    own = CallTime(OWN, "-")
    items = item_times(trace)
    ns = 0.0
    for m in trace.messages:
        if m.sent >= since_ns and m.seq in items:
            for pos, t in enumerate(items[m.seq]):
                if pos not in taken.get(m.seq, ()):
                    own.count += 1
                    ns += t
    own.server_ns = round(ns)
    return own


OWN = "(xpuremote's own requests)"


def gpu_ns(trace: fmt.Trace, since_ns: int = 0) -> int | None:
    """The GPU time of the kernels, copies and memsets of the messages sent since `since_ns`, where the
    trace measured it (XPU_TRACE_GPU=1), else None."""
    measured = [m.gpu for m in trace.messages if m.gpu is not None and m.sent >= since_ns]
    return sum(measured) if measured else None


def describe(rows: list[CallTime], span_ns: int, top: int, since_ns: int = 0, gpu: int | None = None) -> str:
    """The `top` dearest calls as a table, with what the rest add up to."""
    lines = [f"{'call':<44} {'class':<6} {'count':>8} {'inside ms':>10} {'µs/call':>8} {'server ms':>10} "
             f"{'waits':>6} {'wait ms':>9}"]
    for r in rows[:top]:
        lines.append(f"{r.name:<44} {r.cls:<6} {r.count:>8} {r.inside_ns / 1e6:>10.2f} "
                     f"{r.inside_ns / r.count / 1e3:>8.2f} {r.server_ns / 1e6:>10.2f} {r.waits:>6} "
                     f"{r.wait_ns / 1e6:>9.2f}")
    rest = rows[top:]
    if rest:
        lines.append(f"{f'the other {len(rest)} calls':<44} {'':<6} {sum(r.count for r in rest):>8} "
                     f"{sum(r.inside_ns for r in rest) / 1e6:>10.2f} {'':>8} "
                     f"{sum(r.server_ns for r in rest) / 1e6:>10.2f} {sum(r.waits for r in rest):>6} "
                     f"{sum(r.wait_ns for r in rest) / 1e6:>9.2f}")
    lines.append(f"recorded run: {span_ns / 1e6:.2f} ms, calls from {since_ns / 1e6:.2f} ms on; times inside the "
                 "calls the client ran are measured while recording, which makes each dearer (a lane record's: in C)")
    if gpu is not None:
        lines.append(f"GPU work of those calls' messages: {gpu / 1e6:.2f} ms")
    return "\n".join(lines)
