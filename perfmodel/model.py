"""The performance model: a recorded run replayed over another network.

The application's own time between messages is kept as recorded. Each message is replayed
through queues that the recorded run measured or that the network adds:

    client sends at t  (t = recorded send time + the delay accumulated so far)
    the real transport:  ready = t + base/2 + bytes * per_byte       (fitted from the trace)
    uplink wire:         leaves = max(ready, uplink free) + bytes / bandwidth;  arrives = leaves + RTT/2
    server:              done = max(arrives, server free + ...) + the server's recorded time on it
    downlink, for answered messages, the same way back
    a sync message's sender resumes when the answer arrives: the delay grows by
    (predicted wait - recorded wait)

An end that idled waits a little longer still: its CPU wakes up late, the later the longer it
idled. The trace's wake-up probe (client/wake.py) measured that, for the client and for the
server. An end spins before it blocks (protocol/spin.py), so the replay adds it to each wait of the
client that outlasts the client's spin window (in the trace's header) and to each message reaching an
idle server (whose spin the probe's server points were measured against).

The bandwidth is a queue shared by consecutive messages in each direction, and batched async
calls travel as the one message they were. The server is a queue too: a sync call waits for the
async work sent before it. Where the trace says what each message did to the GPU's queues (GPU_OPS,
protocol/trace.py) and the GPU runs apart from the server (a GPU, not the sim), the GPU is a queue per
stream (rperf's Block): a work starts once the server has queued it and its stream's earlier work is done,
and a synchronizing call holds the server until the queue it waits for is done, so the wait is computed,
not replayed, and a wait for the GPU overlaps network time as it does on the wire.

The client's own costs (the application, the shim, encoding) come from the trace as measured, not
from constants. The recorded transport (base latency and per-byte cost of the loopback or network
the trace was taken on) is fitted from the trace's sync round trips. The predicted network is added
on top of it, as it is in the link emulation.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xpuremote.protocol import trace as fmt

SMALL_BYTES = 64 * 1024  # round trips smaller than this calibrate the base latency; larger ones the per-byte cost


@dataclass(frozen=True)
class Network:
    rtt_us: float = 0.0
    gbps: float = 0.0  # 0: unlimited

    def serialise_ns(self, nbytes: float) -> float:
        return nbytes * 8 / self.gbps if self.gbps > 0 else 0.0

    def __str__(self) -> str:
        bandwidth = f"{self.gbps:g} Gbit/s" if self.gbps > 0 else "unlimited"
        return f"RTT {self.rtt_us:g} µs, {bandwidth}"


GpuStep = tuple[float, int, int, float]  # (ns into the server's time on its message, op, a, b): trace.GpuOp


@dataclass(frozen=True)
class Msg:
    """One message, as the model sees it."""

    sent: float  # ns after the trace's epoch, in the recorded run
    kind: str  # async | sync | later
    up: int
    down: int
    server: float  # ns the server spent on it
    wait: float  # ns the sender waited for its answer in the recorded run
    gpu: tuple[GpuStep, ...] = ()  # what it did to the GPU's queues (overlapping traces only)
    blocked: float = 0.0  # ns of `server` it waited for the GPU in synchronizing calls (computed in the replay)


@dataclass(frozen=True)
class Transport:
    """What the recorded run's own transport cost, beyond the network it emulated."""

    base_ns: float  # round trip of a small message, less the server's time
    per_byte_ns: float  # each byte, either way

    def one_way(self, nbytes: int) -> float:
        return self.base_ns / 2 + nbytes * self.per_byte_ns


@dataclass(frozen=True)
class Wake:
    """How much later a message reaches an end that idled `idle` ns: measured points
    (idle, extra), straight lines between them, flat beyond the last."""

    points: tuple[tuple[float, float], ...] = ()

    @classmethod
    def from_header(cls, value: object) -> Wake:
        if not isinstance(value, list):
            return cls()
        return cls(tuple(sorted((float(i), float(e)) for i, e in value)))

    def extra(self, idle: float) -> float:
        x0 = y0 = 0.0
        for x1, y1 in self.points:
            if idle <= x1:
                return y0 + (y1 - y0) * (idle - x0) / (x1 - x0) if x1 > x0 else y1
            x0, y0 = x1, y1
        return y0


@dataclass(frozen=True)
class Machines:
    """The wake-up costs of the recorded run's two ends (none if the trace did not probe), and how long the client
    spins before it blocks (protocol/spin.py). The server's spin needs no figure of its own: the probe's server
    points were measured against it, so an idle shorter than its window shows no extra there."""

    client: Wake = Wake()
    server: Wake = Wake()
    blocked: float = 0.0  # ns a wait on the data connection pays for blocking rather than spinning
    spin: float = 0.0  # ns the client's waits spin before they block

    @classmethod
    def from_header(cls, value: object, spin_us: object = None) -> Machines:
        if not isinstance(value, dict):
            return cls()
        blocked = value.get("blocked")
        blocked = float(blocked) if isinstance(blocked, (int, float)) and blocked > 0 else 0.0
        spin = spin_us * 1e3 if isinstance(spin_us, (int, float)) and spin_us > 0 else 0.0
        return cls(Wake.from_header(value.get("client")), Wake.from_header(value.get("server")), blocked, spin)

    def client_wake(self, wait: float) -> float:
        """How much later than its answer the client goes on after a wait of `wait` ns. A client that spins pays
        nothing within its window, as in the recorded waits it spun through; a wait that outlasts the window
        blocks for the rest, and pays the wake-up of having idled that long (the data connection's, or more where
        ZeroMQ's probe found more after a longer idle). A client that never spins blocked in every recorded wait
        too: the replay of the recorded network takes that part off again (Model.bias)."""
        if wait <= self.spin:
            return 0.0
        return max(self.blocked, self.client.extra(wait - self.spin))


@dataclass
class Breakdown:
    """Where the predicted run's time goes (seconds); the parts add up to the total."""

    client: float = 0.0  # the application and the client library, between waits
    latency: float = 0.0  # RTTs on the critical path
    bytes: float = 0.0  # serialisation at the link's rate, and queueing behind other messages
    transport: float = 0.0  # the software stack's own round trip (fitted), and waking up after idling
    server: float = 0.0  # the server working, or busy with earlier work the answer waits for
    round_trips: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass
class Prediction:
    network: Network
    trace_s: float
    predicted_s: float
    breakdown: Breakdown = field(default_factory=Breakdown)

    @property
    def slowdown(self) -> float:
        return self.predicted_s / self.trace_s if self.trace_s else 1.0

    def to_json(self) -> dict[str, object]:
        b = self.breakdown
        return {"rtt_us": self.network.rtt_us, "gbps": self.network.gbps or None, "trace_s": self.trace_s,
                "predicted_s": self.predicted_s, "slowdown": self.slowdown,
                "breakdown_s": {"client": b.client, "latency": b.latency, "bytes": b.bytes,
                                "transport": b.transport, "server": b.server},
                "round_trips": b.round_trips, "bytes_up": b.bytes_up, "bytes_down": b.bytes_down}


# ---- from a trace ---------------------------------------------------------------------------
def gpu_overlaps(trace: fmt.Trace) -> bool:
    """Whether the GPU ran apart from the server in the recorded run: not on the sim, which runs each call to its
    end before the next (its GPU times are part of the server's)."""
    return trace.header.get("backend") != "sim"


def messages(trace: fmt.Trace, gpu: bool = True) -> list[Msg]:
    """The trace's messages; with their GPU operations where `gpu` and the GPU ran apart (gpu_overlaps)."""
    overlap = gpu and gpu_overlaps(trace)
    return [msg(m, overlap) for m in trace.messages]


SYNCS = (fmt.SYNC_ALL, fmt.SYNC_STREAM, fmt.SYNC_EVENT)


def msg(m: fmt.Message, overlap: bool = True) -> Msg:
    """A recorded message as the replay takes it; with its GPU operations where the GPU ran apart."""
    if not (overlap and m.gpu_ops):
        return Msg(m.sent, m.kind, m.up, m.down, float(m.server or 0), float(m.wait))
    starts, at = [], 0.0  # where each item began in the server's time on the message
    for t in m.per_call or ():
        starts.append(at)
        at += t or 0
    steps = tuple((starts[o.pos] if o.pos < len(starts) else 0.0, o.op, o.a, float(o.b)) for o in m.gpu_ops)
    blocked = sum(float(o.b) for o in m.gpu_ops if o.op in SYNCS)
    return Msg(m.sent, m.kind, m.up, m.down, float(m.server or 0), float(m.wait), steps, min(blocked, m.server or 0))


class Queues:
    """The GPU's queues in a replay: when each stream's queued work is done, and when each event was reached."""

    def __init__(self) -> None:
        self.free: dict[int, float] = {}
        self.events: dict[int, float] = {}

    def run(self, steps: Sequence[GpuStep], start: float) -> float:
        """Queue a message's GPU operations, the server having begun it at `start`; when its synchronizing calls
        release the server (0: it has none)."""
        free, events, release = self.free, self.events, 0.0
        for offset, op, a, b in steps:
            if op == fmt.WORK:
                free[a] = max(start + offset, free.get(a, 0.0)) + b
            elif op == fmt.RECORD:
                events[b] = max(start + offset, free.get(a, 0.0))
            elif op == fmt.WAIT:
                free[a] = max(free.get(a, 0.0), events.get(b, 0.0))
            elif op == fmt.SYNC_ALL or op == fmt.SYNC_STREAM and a == 0:  # the legacy stream waits for all
                release = max(release, start + offset, *free.values())
            elif op == fmt.SYNC_STREAM:
                release = max(release, start + offset, free.get(a, 0.0))
            elif op == fmt.SYNC_EVENT:
                release = max(release, start + offset, events.get(a, 0.0))
        return release


def fit_transport(msgs: Iterable[Msg], recorded: Network) -> Transport:
    """The recorded run's transport, from its round trips: wait = base + bytes * per_byte + server,
    plus the network the trace was recorded on. Medians: a round trip that queued behind
    earlier work on the server is an outlier here, not a sample."""
    return _fit([(m.wait - m.server - recorded.rtt_us * 1e3 - recorded.serialise_ns(m.up + m.down), m.up + m.down)
                 for m in msgs if m.kind == "sync"])


def fit_transport_columns(c: fmt.Columns, recorded: Network) -> Transport:
    """fit_transport of the messages the columns `c` are (trace.columns): the same arithmetic, over arrays."""
    import numpy as np

    sync = c.kind == fmt.KINDS.index("sync")
    nbytes = c.up[sync] + c.down[sync]
    server = np.where(c.server_nil[sync], 0, c.server[sync]).astype(np.float64)
    rest = c.wait[sync].astype(np.float64) - server - recorded.rtt_us * 1e3 - recorded.serialise_ns(nbytes)
    return _fit(list(zip(rest.tolist(), nbytes.tolist(), strict=True)))


def _fit(trips: list[tuple[float, int]]) -> Transport:
    """The transport of the round trips (what their waits leave beyond the server and the recorded network, bytes)."""
    small = [(r, n) for r, n in trips if n < SMALL_BYTES]
    large = [(r, n) for r, n in trips if n >= SMALL_BYTES]
    base = statistics.median(r for r, _ in small) if small else 0.0
    per_byte = statistics.median(max(0.0, r - base) / n for r, n in large) if large else 0.0
    return Transport(max(0.0, base), per_byte)


# ---- the replay ---------------------------------------------------------------------------------
def replay(msgs: Sequence[Msg], span: float, transport: Transport, net: Network,
           machines: Machines = Machines()) -> Prediction:
    """The predicted duration of a run of `span` ns whose messages are `msgs` (in send order)."""
    half_rtt = net.rtt_us * 500.0
    up_free = down_free = server_free = 0.0
    gpu = Queues()
    shift = 0.0  # how much later than recorded the client is at this point
    b = Breakdown()
    waited = 0.0
    for m in msgs:
        t = m.sent + shift
        ready = t + transport.one_way(m.up)
        leaves = max(ready, up_free) + net.serialise_ns(m.up)
        up_free = leaves
        arrives = leaves + half_rtt
        # a server that idled wakes up late; one still busy with earlier work takes it when done
        server_wake = machines.server.extra(arrives - server_free) if arrives > server_free else 0.0
        begun = max(arrives + server_wake, server_free)
        # with GPU operations, its waits for the GPU as the queues have them now, not as recorded
        server_free = max(begun + m.server - m.blocked, gpu.run(m.gpu, begun)) if m.gpu else begun + m.server
        b.bytes_up += m.up
        if m.kind == "async":
            continue
        b.bytes_down += m.down
        ready = server_free + transport.one_way(m.down)
        down_free = max(ready, down_free) + net.serialise_ns(m.down)
        if m.kind != "sync":
            continue
        wait = down_free + half_rtt - t
        client_wake = machines.client_wake(wait)
        wait += client_wake
        shift += wait - m.wait
        waited += wait
        b.round_trips += 1
        b.latency += 2 * half_rtt
        b.transport += transport.base_ns + (m.up + m.down) * transport.per_byte_ns + server_wake + client_wake
        b.server += server_free - arrives - server_wake  # its own time, and earlier work it queued behind
    predicted = span + shift
    b.bytes = max(0.0, waited - b.latency - b.transport - b.server)
    b.client = predicted - waited
    for name in ("client", "latency", "bytes", "transport", "server"):
        setattr(b, name, getattr(b, name) / 1e9)
    return Prediction(net, span / 1e9, predicted / 1e9, b)


class Model:
    """A trace, ready to be replayed over any network: its transport, span and replay arrays made from the trace's
    columns where its reader has them (trace.columns: no Message object made), else from its messages."""

    @fmt.without_gc  # its arrays are made from a million objects or more
    def __init__(self, trace: fmt.Trace, msgs: list[Msg] | None = None, gpu: bool = True) -> None:
        """`msgs`: the trace's messages changed (what-if); the transport is fitted from the originals. `gpu`: keep
        the GPU's queues where the trace has them."""
        self.trace = trace
        # made on first use: predicting replays arrays made from the trace (fast.py)
        overlap = gpu and gpu_overlaps(trace)
        recorded = fmt.Lazy(len(trace.messages), (msg(m, overlap) for m in trace.messages))
        self.msgs = recorded if msgs is None else msgs
        self.overlap, self.changed = overlap, msgs is not None
        link = trace.link
        self.recorded = Network(link.get("rtt_us", 0.0), link.get("gbps", 0.0))
        columns = trace.columns  # the messages as numpy arrays, where the C reader read the trace
        self.transport = fit_transport_columns(columns, self.recorded) if columns is not None else \
            fit_transport((msg(m, False) for m in trace.messages if m.kind == "sync"), self.recorded)
        self.machines = Machines.from_header(trace.header.get("wake"), trace.header.get("spin_us"))
        self.span = float(trace.span_ns)
        from . import fast  # replay() compiled, over arrays made once here (fast.py)

        of_recorded = fast.of_trace(trace, overlap, recorded)
        self.replayer = of_recorded if msgs is None else fast.Replayer(msgs)
        # replaying the recorded network reproduces the recorded run up to the fit's error: that
        # error, taken off every prediction, makes the model exact at the point it was measured
        self.bias = of_recorded(self.span, self.transport, self.recorded, self.machines).predicted_s \
            - self.span / 1e9

    def without_gpu(self) -> Model:
        """The same trace with its GPU operations left out: each message's server time as recorded, waits for the
        GPU included (the model before it kept the GPU's queues)."""
        return Model(self.trace, gpu=False)

    def queues_gpu(self) -> bool:
        """Whether the replay keeps the GPU's queues for any message (any Msg has GPU steps)."""
        columns = self.trace.columns
        if columns is None or self.changed:
            return any(m.gpu for m in self.msgs)
        return self.overlap and len(columns.ops) > 0

    def predict(self, net: Network) -> Prediction:
        pred = self.replayer(self.span, self.transport, net, self.machines)
        pred.predicted_s -= self.bias
        pred.breakdown.client -= self.bias
        return pred
