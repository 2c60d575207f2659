"""An emulated network link: a fixed one-way delay and a rate limit, added to a real connection.

For what-if runs on one machine (`XPU_LINK_RTT_US`, `XPU_LINK_GBPS`; setting either, even to 0,
turns the emulation on). The session over it is the session that runs without it: ZeroMQ and the
data connection, the fast lane, the batching windows and the spin before blocking are all as they
are. Each direction of the link is one wire, which every channel's messages in that direction
cross (a message on the data connection counts the bytes that follow it there, a copy's input or
output). A message enters the wire when it has reached the receiving end over the real transport.
It leaves after the messages before it have gone, plus its own bits at the link's rate. It is
delivered RTT/2 after that. So the emulated link comes on top of what the real transport costs,
as a network does on top of the software stack.

The receiving end holds each message until its delivery time: the sender never blocks, as with
a real socket. One Wire at each end, for the direction it receives, so the messages of both
channels queue behind each other in the order that end takes them in, which is the order the
protocol serves them in (a message on the data connection after the batches it names as `after`,
an answer there after the answers due on ZeroMQ before it). Senders stamp messages with their send
time (CLOCK_MONOTONIC, the same on both ends of one machine). The receiver finds where the real
transport would have delivered a message, even when the message waited because the receiver was
busy: it uses the one-way latency measured on that channel's messages that came while it was idle.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

SPIN_NS = 300_000  # the last stretch of a wait spins: sleep() wakes up tens of µs late
LATENCY_WEIGHT = 0.05  # weight of each new idle-receiver sample in the transport's latency estimate
LATENCY_SAMPLE_MAX = 64 * 1024  # messages up to this size measure the transport's latency
ZMQ, DATA = 0, 1  # the channels: each has a real latency of its own (ZeroMQ's I/O threads, a plain stream)


@dataclass(frozen=True)
class LinkSpec:
    rtt_us: float = 0.0
    gbps: float = 0.0  # 0: no rate limit
    # emulate even a link that adds nothing: its bookkeeping costs a few µs a message, which a
    # comparison of runs over emulated links wants in every run (perfmodel/validate.py)
    on: bool = False

    @property
    def delays(self) -> bool:
        return self.rtt_us > 0 or self.gbps > 0

    @property
    def active(self) -> bool:
        return self.on or self.delays

    def serialise_ns(self, nbytes: int) -> float:
        """The time `nbytes` occupy the wire."""
        return nbytes * 8 / self.gbps if self.gbps > 0 else 0.0

    def to_wire(self) -> dict[str, float | bool]:
        return {"rtt_us": self.rtt_us, "gbps": self.gbps, "on": self.active}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LinkSpec:
        """XPU_LINK_RTT_US and XPU_LINK_GBPS (0 or unset: no rate limit); either one set turns it on."""
        rtt, gbps = env.get("XPU_LINK_RTT_US"), env.get("XPU_LINK_GBPS")
        spec = cls(float(rtt or 0), float(gbps or 0), rtt is not None or gbps is not None)
        if not (0 <= spec.rtt_us < 1e9 and 0 <= spec.gbps < 1e9):  # NaN fails too
            raise ValueError(f"XPU_LINK_RTT_US and XPU_LINK_GBPS must be non-negative numbers, not {rtt!r}, {gbps!r}")
        return spec

    @classmethod
    def from_wire(cls, value: object) -> LinkSpec:
        if not isinstance(value, dict):
            return cls()
        rtt, gbps = value.get("rtt_us", 0.0), value.get("gbps", 0.0)
        on = value.get("on", False)
        if not all(isinstance(v, (int, float)) and 0 <= v < 1e9 for v in (rtt, gbps)) or not isinstance(on, bool):
            raise ValueError(f"link: rtt_us and gbps must be non-negative numbers and on a boolean, not {value!r}")
        return cls(float(rtt), float(gbps), on)


NO_LINK = LinkSpec()


class Wire:
    """One direction of an emulated link, at its receiving end, for all its channels. Its hold is on every
    message's path, so it is one function of plain arithmetic: a few hundred ns a message."""

    def __init__(self, spec: LinkSpec) -> None:
        self.spec = spec
        self.free_at = 0.0  # when the wire has sent its last message's bits
        self.latency_ns: list[float | None] = [None, None]  # each channel's real one-way latency, measured
        self.idle_since = time.monotonic_ns()
        self.held = [0, 0]  # messages that crossed it, by channel
        self.ns_per_byte = 8 / spec.gbps if spec.gbps > 0 else 0.0
        self.half_rtt_ns = spec.rtt_us * 500.0

    def waiting(self) -> None:
        """The receiver is about to wait for a message: what comes next shows the real latency."""
        self.idle_since = time.monotonic_ns()

    def arrived(self, sent_ns: int, nbytes: int, channel: int = ZMQ, now: int | None = None) -> float:
        """When a message sent at `sent_ns` and read `now` reached this end over the real transport."""
        now = time.monotonic_ns() if now is None else now
        if sent_ns >= self.idle_since:  # the receiver was waiting: `now` is when it really arrived
            if nbytes < LATENCY_SAMPLE_MAX:  # a large one's time is mostly its copying, not latency
                sample, latency = now - sent_ns, self.latency_ns[channel]
                self.latency_ns[channel] = sample if latency is None else latency + LATENCY_WEIGHT * (sample - latency)
            return now
        # it may have waited for the receiver: it arrived one transport latency after sending
        return min(now, sent_ns + (self.latency_ns[channel] or 0.0))

    def deliver_at(self, arrived: float, nbytes: int, channel: int = ZMQ) -> float:
        """When a message that arrived at `arrived` leaves the emulated link: behind the messages before it."""
        self.held[channel] += 1
        self.free_at = free = max(arrived, self.free_at) + nbytes * self.ns_per_byte
        return free + self.half_rtt_ns

    def hold(self, sent_ns: int, nbytes: int, channel: int = ZMQ) -> None:
        """Wait until a message read just now is delivered: arrived() and deliver_at() in one."""
        now = time.monotonic_ns()
        latency = self.latency_ns[channel]
        if sent_ns >= self.idle_since:
            arrived: float = now
            if nbytes < LATENCY_SAMPLE_MAX:
                sample = now - sent_ns
                self.latency_ns[channel] = sample if latency is None else latency + LATENCY_WEIGHT * (sample - latency)
        else:
            arrived = min(now, sent_ns + (latency or 0.0))
        self.held[channel] += 1
        self.free_at = free = max(arrived, self.free_at) + nbytes * self.ns_per_byte
        if free + self.half_rtt_ns > now:
            wait_until(free + self.half_rtt_ns)


def wait_until(deadline_ns: float) -> None:
    """Precise to a few microseconds: sleep the long part, spin the rest."""
    left = deadline_ns - time.monotonic_ns()
    if left > SPIN_NS:
        time.sleep((left - SPIN_NS) / 1e9)
    while time.monotonic_ns() < deadline_ns:
        pass
