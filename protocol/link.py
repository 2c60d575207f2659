"""An emulated network link: a fixed one-way delay and a rate limit, added to a real connection.

For what-if runs on one machine (`XPU_LINK_RTT_US`, `XPU_LINK_GBPS`; setting either, even to 0,
turns the emulation on). Each direction of a connection is a wire of its own. A message enters
the wire when it has reached the receiving end over the real transport. It leaves after the
messages before it have gone, plus its own bits at the link's rate. It is delivered RTT/2 after
that. So the emulated link comes on top of what the real transport costs, as a network does on
top of the software stack.

The receiving end holds each message until its delivery time: the sender never blocks, as with
a real socket. Senders stamp messages with their send time (CLOCK_MONOTONIC, the same on both
ends of one machine). The receiver finds where the real transport would have delivered a
message, even when the message waited because the receiver was busy: it uses the one-way
latency measured on messages that came while it was idle.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

SPIN_NS = 300_000  # the last stretch of a wait spins: sleep() wakes up tens of µs late
LATENCY_WEIGHT = 0.05  # weight of each new idle-receiver sample in the transport's latency estimate
LATENCY_SAMPLE_MAX = 64 * 1024  # messages up to this size measure the transport's latency


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
        return cls(float(rtt or 0), float(gbps or 0), rtt is not None or gbps is not None)

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


@dataclass
class Wire:
    """One direction of an emulated link, at its receiving end."""

    spec: LinkSpec
    free_at: float = 0.0  # when the wire has sent its last message's bits
    latency_ns: float | None = None  # one-way latency of the real transport, measured
    idle_since: int = field(default_factory=time.monotonic_ns)

    def waiting(self) -> None:
        """The receiver is about to wait for a message: what comes next shows the real latency."""
        self.idle_since = time.monotonic_ns()

    def deliver_at(self, sent_ns: int, nbytes: int, now: int | None = None) -> float:
        """When a message sent at `sent_ns`, read now, leaves the emulated link."""
        now = time.monotonic_ns() if now is None else now
        if sent_ns >= self.idle_since:  # the receiver was waiting: `now` is when it really arrived
            if nbytes < LATENCY_SAMPLE_MAX:  # a large one's time is mostly its copying, not latency
                sample = now - sent_ns
                self.latency_ns = sample if self.latency_ns is None else (
                    self.latency_ns + LATENCY_WEIGHT * (sample - self.latency_ns))
            arrived = now
        else:  # it may have waited for the receiver: it arrived one transport latency after sending
            arrived = min(now, sent_ns + (self.latency_ns or 0.0))
        self.free_at = max(arrived, self.free_at) + self.spec.serialise_ns(nbytes)
        return self.free_at + self.spec.rtt_us * 500.0

    def hold(self, sent_ns: int, nbytes: int) -> None:
        """Wait until the message is delivered."""
        wait_until(self.deliver_at(sent_ns, nbytes))


def wait_until(deadline_ns: float) -> None:
    """Precise to a few microseconds: sleep the long part, spin the rest."""
    left = deadline_ns - time.monotonic_ns()
    if left > SPIN_NS:
        time.sleep((left - SPIN_NS) / 1e9)
    while time.monotonic_ns() < deadline_ns:
        pass

