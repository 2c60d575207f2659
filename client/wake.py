"""The wake-up probe, run when a trace starts: how much later a message reaches an end of the
connection that waited for it blocked rather than spinning, after idling for a while.

A thread blocked in a receive is woken by the message. The longer its CPU idled, the longer
that takes: deeper sleep states, a virtual CPU the host has descheduled, cold caches. A slower
network makes both ends idle longer per round trip, so the performance model needs this cost
as a function of the idle time, for the client and for the server (perfmodel/model.py). An end
that spins (protocol/spin.py) pays none of it while its wait lasts less than its spin window, and
pays it once the wait outlasts the window and it blocks. The probe measures, SAMPLES round trips
each (medians), for each idle time:

  client   the server answers `idle` later (its `probe` op): the round trip with the client blocked
           in its receive, less the same with the client spinning. The server's own lateness (its
           wait sleeps before it spins) is in both and cancels; what is left is the client's wake-up.
  server   with the client spinning, a round trip sent `idle` after the last answer, on time, less one
           sent at once: the server's wake-up. Where the session has a data connection and the server
           answers a synchronous call there (PING), this goes there, as the synchronous calls do, and a
           worker that spins longer than `idle` shows none.

It records [idle, extra ns] per idle time in the trace's header as `wake`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from xpuremote.protocol import wire
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.link import wait_until

if TYPE_CHECKING:
    from .connection import Connection

IDLE_NS = (100_000, 300_000, 1_000_000, 3_000_000)
SAMPLES = 11
SPIN_NS = 10_000_000  # the client's spin while the probe wants it spinning: longer than any round trip it makes
# A synchronous call on the data connection that changes nothing: a round trip. A server whose worker has no
# current context yet (a GPU's, before the application made one) refuses it, and logs that: the probe then asks
# it once and stays on ZeroMQ.
PING = CALLS["cuCtxSynchronize"]


def _ping(conn: Connection, busy_ns: int, spinning: bool = False) -> int:
    """A probe round trip on ZeroMQ that the server answers `busy_ns` late; `spinning`: the client looks for the
    answer without sleeping (ZeroMQ's own receive blocks)."""
    began = time.monotonic_ns()
    if not spinning:
        conn.request({"op": "probe", "busy_ns": busy_ns})
        return time.monotonic_ns() - began
    with conn.lock:
        conn._sent()
        conn.sock.send_multipart(wire.encode(conn._stamped({"op": "probe", "busy_ns": busy_ns})))
        while not conn.sock.poll(0):
            pass
        conn._recv()
    return time.monotonic_ns() - began


def _data_ping(conn: Connection, spin_ns: int) -> int:
    """A synchronous call's round trip on the data connection, the client spinning for up to `spin_ns` of it."""
    conn.spin_ns = spin_ns
    began = time.monotonic_ns()
    conn.call(PING, [], None)
    return time.monotonic_ns() - began


def probe(conn: Connection) -> dict[str, object]:
    """{"client": [[idle_ns, extra_ns], ...], "server": [...], "blocked": ns or None} for each of IDLE_NS."""
    client = [[idle, _client_extra(conn, idle)] for idle in IDLE_NS]
    spin_ns, blocked = conn.spin_ns, None
    try:
        if conn.data is not None and conn.call(PING, [], None)[0] == 0:
            blocked = _data_blocked(conn)
            ping: Callable[[], int] = lambda: _data_ping(conn, SPIN_NS)  # noqa: E731
        else:
            ping = lambda: _ping(conn, 0, spinning=True)  # noqa: E731
        base = statistics.median(ping() for _ in range(SAMPLES))
        server = [[idle, _server_extra(idle, ping, base)] for idle in IDLE_NS]
    finally:
        conn.spin_ns = spin_ns
    return {"client": client, "server": server, "blocked": blocked}


def _data_blocked(conn: Connection) -> int:
    """What blocking costs the client's wait on the data connection, over spinning, in a round trip answered at
    once. ZeroMQ's spinning receive above does not show it: ZeroMQ's I/O thread blocks either way."""
    blocked, spinning = [], []
    for _ in range(SAMPLES):
        blocked.append(_data_ping(conn, 0))
        spinning.append(_data_ping(conn, SPIN_NS))
    return round(max(0.0, statistics.median(blocked) - statistics.median(spinning)))


def _client_extra(conn: Connection, idle_ns: int) -> int:
    """What blocking costs the client in a wait of `idle_ns`: blocked and spinning round trips taken in turn, so
    that the machine's drift hits both alike."""
    blocked, spinning = [], []
    for _ in range(SAMPLES):
        blocked.append(_ping(conn, idle_ns))
        spinning.append(_ping(conn, idle_ns, spinning=True))
    return round(max(0.0, statistics.median(blocked) - statistics.median(spinning)))


def _server_extra(idle_ns: int, ping: Callable[[], int], base: float) -> int:
    """How much later than `base` a `ping()` made `idle_ns` after the last answer, on time (protocol/link.py),
    comes back: only the server idled."""
    rounds = []
    for _ in range(SAMPLES):
        wait_until(time.monotonic_ns() + idle_ns)
        rounds.append(ping())
    return round(max(0.0, statistics.median(rounds) - base))
