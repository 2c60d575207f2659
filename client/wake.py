"""The wake-up probe, run when a trace starts: how much later a message reaches an end of the
connection that has been idle for a while.

A thread blocked in a receive is woken by the message. The longer its CPU idled, the longer
that takes: deeper sleep states, a virtual CPU the host has descheduled, cold caches. A slower
network makes both ends idle longer per round trip, so the performance model needs this cost
as a function of the idle time, for the client and for the server (perfmodel/model.py). The
probe measures it with round trips of three kinds, SAMPLES each (medians):

  base     ping, answered at once
  client   the server answers `idle` later, on time to the µs: the client idles `idle` longer
  server   the client sends `idle` after the last answer, on time: the server idles `idle` longer

and records extra = time − `idle` − base, per idle time, in the trace's header as `wake`.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

from xpuremote.protocol.link import wait_until

if TYPE_CHECKING:
    from .connection import Connection

IDLE_NS = (100_000, 300_000, 1_000_000, 3_000_000)
SAMPLES = 11


def _ping(conn: Connection, busy_ns: int) -> int:
    began = time.monotonic_ns()
    conn.request({"op": "probe", "busy_ns": busy_ns})
    return time.monotonic_ns() - began


def probe(conn: Connection) -> dict[str, list[list[int]]]:
    """{"client": [[idle_ns, extra_ns], ...], "server": [...]} for each of IDLE_NS."""
    base = statistics.median([_ping(conn, 0) for _ in range(SAMPLES)])
    client, server = [], []
    for idle in IDLE_NS:
        late = statistics.median([_ping(conn, idle) for _ in range(SAMPLES)]) - idle - base
        client.append([idle, round(max(0.0, late))])
        rounds = []
        for _ in range(SAMPLES):
            wait_until(time.monotonic_ns() + idle)  # on time (protocol/link.py): only the server is late
            rounds.append(_ping(conn, 0))
        server.append([idle, round(max(0.0, statistics.median(rounds) - base))])
    return {"client": client, "server": server}
