"""`xpu-perf validate`: record a command once, predict a grid of links, run the command over each
emulated link, and compare.

Every run is traced: the measured duration is the traced span (from the session being up to
the last call), the same span the prediction is of, so process start-up and the server
starting a worker are outside both.

Every run goes through the link emulation, the recordings too (set to add nothing): its
bookkeeping costs CPU at both ends (about 9 µs of the client's and 7 of the worker's a round
trip on a 2-core virtual machine, bench/link_emulation.py), which a real network does not add.
Left out of the recordings, when it cost 10-17 µs a round trip, it showed up as a model error of
-2 to -6% on the round-trip-bound program. The emulated session is the one that runs: its data
connection and fast lane stay on (protocol/link.py).

When validate starts its own server, the server and the runs get CPUs of their own, as a
client and a GPU server on two machines would: the scheduler's placement of both on shared
CPUs, different from run to run, is not what the model predicts. On a 2-core virtual machine
that placement alone moved identical runs by ±15%.
"""

from __future__ import annotations

import collections
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from xpuremote.protocol import trace as fmt
from xpuremote.protocol.local_server import on_cpus, start_local_server

from .model import Model, Network

T = TypeVar("T")

RTTS_US = (0.0, 50.0, 200.0, 1000.0)
GBPS = (1.0, 10.0, 0.0)  # 0: unlimited
RECORDINGS = 3  # per round
# The statistic of repeated runs: interference on a shared machine only ever slows a run down,
# so the slowest third is dropped and the rest averaged. That is steadier than the median
# (pulled by the slow tail), the minimum (one lucky run) or any one order statistic when a
# program's runs fall into two groups, as they do when its batching depends on timing. Recordings
# and runs alike.
KEEP = 2 / 3


def fastest(values: Sequence[T], key: Callable[[T], float]) -> list[T]:
    """The KEEP fastest of `values`."""
    return sorted(values, key=key)[:max(1, round(KEEP * len(values)))]


def split_cpus() -> tuple[frozenset[int], frozenset[int]] | None:
    """CPUs for the runs and for the server: half each (None on one CPU)."""
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    return (frozenset(cpus[:half]), frozenset(cpus[half:])) if half else None


@dataclass
class Point:
    network: Network
    predicted_s: float
    measured_s: float
    without_gpu_s: float | None = None  # the prediction with the GPU's queues left out (the server's times as recorded)

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


@dataclass
class Rounds:
    """What validate measured, round by round: each recording's span and its predictions for
    each link, and each link's runs."""

    nets: list[Network]
    recorded: list[tuple[int, float, list[float]]] = field(default_factory=list)  # (round, span s, per net)
    runs: list[tuple[int, int, float]] = field(default_factory=list)  # (round, net's index, span s)
    without_gpu: list[list[float]] = field(default_factory=list)  # per recording, as `recorded`: no GPU queues

    def compare(self, rounds: Sequence[int] | None = None) -> tuple[float, list[Point]]:
        """The recorded span and a point per link, from `rounds` (default all; one may repeat).
        The prediction is the mean of the predictions from the KEEP fastest recordings (one
        recording's noise would shift every prediction alike, hence more of them); each link's
        measurement is the mean of its KEEP fastest runs."""
        times = collections.Counter(rounds if rounds is not None else {r for r, _, _ in self.recorded})
        chosen = fastest([j for j, r in enumerate(self.recorded) for _ in range(times[r[0]])],
                         key=lambda j: self.recorded[j][1])
        recorded = [self.recorded[j] for j in chosen]
        points = []
        for i, net in enumerate(self.nets):
            spans = [span for r, n, span in self.runs if n == i for _ in range(times[r])]
            plain = statistics.fmean(self.without_gpu[j][i] for j in chosen) if self.without_gpu else None
            points.append(Point(net, statistics.fmean(preds[i] for _, _, preds in recorded),
                                statistics.fmean(fastest(spans, key=float)), plain))
        return statistics.fmean(span for _, span, _ in recorded), points


@dataclass
class Validation:
    command: list[str]
    trace_s: float
    points: list[Point]
    rounds: Rounds | None = None

    @property
    def median_error(self) -> float:
        return statistics.median(abs(p.error) for p in self.points)

    @property
    def worst_error(self) -> float:
        return max(abs(p.error) for p in self.points)

    def to_json(self) -> dict[str, object]:
        return {"command": self.command, "trace_s": self.trace_s, "median_abs_error": self.median_error,
                "worst_abs_error": self.worst_error,
                "points": [{"rtt_us": p.network.rtt_us, "gbps": p.network.gbps or None,
                            "predicted_s": p.predicted_s, "measured_s": p.measured_s, "error": p.error,
                            "predicted_without_gpu_s": p.without_gpu_s} for p in self.points]}


def run_traced(command: list[str], server: str, path: Path, net: Network,
               cpus: Collection[int] | None = None) -> fmt.Trace:
    """Run `command` under xpu-run (on `cpus`) over the emulated `net`, tracing it; its trace."""
    env = dict(os.environ, XPU_TRACE=str(path), XPU_LINK_RTT_US=str(net.rtt_us), XPU_LINK_GBPS=str(net.gbps))
    proc = subprocess.run([sys.executable, "-m", "xpuremote.interpose.run", "--server", server, "--", *command],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          preexec_fn=on_cpus(cpus))
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed over {net} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return fmt.read(path)


@contextmanager
def serving(server: str | None, backend: str, cpus: Collection[int] | None) -> Iterator[str]:
    """`server`, or a local one of `backend` on `cpus` for the while."""
    if server:
        yield server
        return
    proc, address = start_local_server(backend, cpus)
    try:
        yield address
    finally:
        proc.terminate()
        proc.wait(10)


def validate(command: list[str], server: str | None = None, rtts: tuple[float, ...] = RTTS_US,
             gbps: tuple[float, ...] = GBPS, repeat: int = 1, backend: str = "auto") -> Validation:
    """Predictions from a loopback recording against runs over each emulated link.

    Without `server`, a local one of `backend` is started on CPUs apart from the runs'.
    With `repeat`, every link's run is made that many times, in rounds of RECORDINGS recordings
    and one run per link, in a different order each round: drift in the machine's speed, and
    whatever one run leaves behind for the next, hit the recordings and the runs alike."""
    rounds = Rounds([Network(rtt, bw) for rtt in rtts for bw in gbps])
    order = random.Random(0)
    cpus = None if server else split_cpus()
    with serving(server, backend, cpus and cpus[1]) as address, \
            tempfile.TemporaryDirectory(prefix="xpu-perf-") as tmp:
        path = Path(tmp, "run.trace")
        for r in range(repeat):
            runs: list[int | None] = [*[None] * RECORDINGS, *range(len(rounds.nets))]  # None: a recording
            order.shuffle(runs)
            for i in runs:
                trace = run_traced(command, address, path, Network() if i is None else rounds.nets[i],
                                   cpus and cpus[0])
                if i is None:
                    model = Model(trace)
                    rounds.recorded.append((r, model.span / 1e9, [model.predict(n).predicted_s for n in rounds.nets]))
                    plain = model.without_gpu()
                    rounds.without_gpu.append([plain.predict(n).predicted_s for n in rounds.nets])
                else:
                    rounds.runs.append((r, i, trace.span_ns / 1e9))
    return Validation(command, *rounds.compare(), rounds)


def resampled_worst(rounds: Rounds, trials: int, size: int, seed: int = 0) -> list[float]:
    """The worst point's error in each of `trials` validations of `size` rounds drawn, with
    replacement, from these: how far the worst point of a validation that long may land."""
    rng = random.Random(seed)
    n = len({r for r, _, _ in rounds.recorded})
    return [max(abs(p.error) for p in rounds.compare([rng.randrange(n) for _ in range(size)])[1])
            for _ in range(trials)]


def table(v: Validation) -> str:
    lines = [f"{' '.join(v.command)}: recorded {v.trace_s * 1e3:.1f} ms",
             f"{'RTT µs':>8} {'Gbit/s':>9} {'predicted ms':>13} {'measured ms':>12} {'error':>7} "
             f"{'no GPU queues ms':>17}"]
    for p in v.points:
        bw = f"{p.network.gbps:g}" if p.network.gbps else "unlimited"
        plain = "-" if p.without_gpu_s is None else f"{p.without_gpu_s * 1e3:.1f}"
        lines.append(f"{p.network.rtt_us:>8g} {bw:>9} {p.predicted_s * 1e3:>13.1f} {p.measured_s * 1e3:>12.1f} "
                     f"{p.error:>+7.1%} {plain:>17}")
    lines.append(f"median |error| {v.median_error:.1%}, worst {v.worst_error:.1%}")
    return "\n".join(lines)
