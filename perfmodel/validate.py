"""`xpu-perf validate`: record a command once, predict a grid of links, run the command over each
emulated link, and compare.

Every run is traced: the measured duration is the traced span (from the session being up to
the last call), the same span the prediction is of, so process start-up and the server
starting a worker are outside both.
"""

from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from xpuremote.protocol import trace as fmt

from .model import Model, Network

RTTS_US = (0.0, 50.0, 200.0, 1000.0)
GBPS = (1.0, 10.0, 0.0)  # 0: unlimited
RECORDINGS = 3  # per round


@dataclass
class Point:
    network: Network
    predicted_s: float
    measured_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


@dataclass
class Validation:
    command: list[str]
    trace_s: float
    points: list[Point]

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
                            "predicted_s": p.predicted_s, "measured_s": p.measured_s, "error": p.error}
                           for p in self.points]}


def run_traced(command: list[str], server: str, path: Path, net: Network) -> fmt.Trace:
    """Run `command` under xpu-run over the emulated `net`, tracing it; its trace."""
    env = dict(os.environ, XPU_TRACE=str(path), XPU_LINK_RTT_US=str(net.rtt_us), XPU_LINK_GBPS=str(net.gbps))
    proc = subprocess.run([sys.executable, "-m", "xpuremote.interpose.run", "--server", server, "--", *command],
                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(command)} failed over {net} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return fmt.read(path)


def validate(command: list[str], server: str, rtts: tuple[float, ...] = RTTS_US, gbps: tuple[float, ...] = GBPS,
             repeat: int = 1) -> Validation:
    """Predictions from a loopback recording against runs over each emulated link.

    With `repeat`, every link's run is made that many times, in rounds of RECORDINGS recordings
    and one run per link, in a different order each round: drift in the machine's speed, and
    whatever one run leaves behind for the next, hit the recordings and the runs alike. The
    model is built from the median recording by duration (one recording's noise would shift
    every prediction alike, hence more of them), each link's measurement is its median run."""
    nets = [Network(rtt, bw) for rtt in rtts for bw in gbps]
    recordings: list[fmt.Trace] = []
    spans: dict[Network, list[float]] = {net: [] for net in nets}
    order = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="xpu-perf-") as tmp:
        for _ in range(repeat):
            runs: list[Network | None] = [*[None] * RECORDINGS, *nets]  # None: a recording
            order.shuffle(runs)
            for net in runs:
                if net is None:
                    path = Path(tmp, f"recorded{len(recordings)}.trace")
                    recordings.append(run_traced(command, server, path, Network()))
                else:
                    spans[net].append(run_traced(command, server, Path(tmp, "run.trace"), net).span_ns / 1e9)
    model = Model(sorted(recordings, key=lambda t: t.span_ns)[len(recordings) // 2])
    points = [Point(net, model.predict(net).predicted_s, statistics.median(spans[net])) for net in nets]
    return Validation(command, model.span / 1e9, points)


def table(v: Validation) -> str:
    lines = [f"{' '.join(v.command)}: recorded {v.trace_s * 1e3:.1f} ms",
             f"{'RTT µs':>8} {'Gbit/s':>9} {'predicted ms':>13} {'measured ms':>12} {'error':>7}"]
    for p in v.points:
        bw = f"{p.network.gbps:g}" if p.network.gbps else "unlimited"
        lines.append(f"{p.network.rtt_us:>8g} {bw:>9} {p.predicted_s * 1e3:>13.1f} {p.measured_s * 1e3:>12.1f} "
                     f"{p.error:>+7.1%}")
    lines.append(f"median |error| {v.median_error:.1%}, worst {v.worst_error:.1%}")
    return "\n".join(lines)
