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
import contextlib
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

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
               cpus: Collection[int] | None = None, env: Mapping[str, str] | None = None) -> fmt.Trace:
    """Run `command` under xpu-run (on `cpus`, with `env` added to the environment) over the emulated `net`,
    tracing it; its trace."""
    env = dict(os.environ, **(env or {}), XPU_TRACE=str(path), XPU_LINK_RTT_US=str(net.rtt_us),
               XPU_LINK_GBPS=str(net.gbps))
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
             gbps: tuple[float, ...] = GBPS, repeat: int = 1, backend: str = "auto",
             env: Mapping[str, str] | None = None) -> Validation:
    """Predictions from a loopback recording against runs over each emulated link.

    Without `server`, a local one of `backend` is started on CPUs apart from the runs'. `env`: settings for the
    recordings and runs only (the client's XPU_SPIN_US, say), not for that server.
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
                                   cpus and cpus[0], env)
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


# ---- PyTorch workloads: a step's time over each link ---------------------------------------------------
TORCH_RTTS_US = (25.0, 100.0, 500.0, 2000.0)
TORCH_GBPS = (10.0, 100.0)
STEP_AIMS = (0.05, 0.10)  # the step time's error: median, worst
ADDS_ENOUGH = 0.05  # where the link adds at least this share of the step, its added time is held to ADDED_AIM
ADDED_AIM = 0.20


def time_at(model: Model, net: Network, t: float) -> float:
    """When the predicted run on `net` reaches the recorded run's instant `t` (ns after the trace's epoch): `t`,
    and the delay the messages sent before it accumulated."""
    replayer = model.replayer  # the messages before `t`, compiled where the model's replay is
    return replayer(t, model.transport, net, model.machines, replayer.sent_before(t)).predicted_s * 1e9


def window_s(model: Model, net: Network, start: float, end: float) -> float:
    """The predicted duration on `net` of the recorded run's window [start, end) (ns after the epoch), made exact
    at the recorded network as the whole run's prediction is (the replay's fit error over the window taken off)."""
    def span(n: Network) -> float:
        return time_at(model, n, end) - time_at(model, n, start)
    return (span(net) - span(model.recorded) + (end - start)) / 1e9


def step_times(model: Model, net: Network, marks: Sequence[float], at_recorded: Sequence[float]) -> list[float]:
    """Each step's predicted time (s) on `net` between consecutive `marks` (ns after the epoch), made exact at the
    recorded network as window_s is (`at_recorded`: time_at of each mark there)."""
    at = [time_at(model, net, t) for t in marks]
    return [((b - a) - (rb - ra) + (m1 - m0)) / 1e9
            for a, b, ra, rb, m0, m1 in zip(at, at[1:], at_recorded, at_recorded[1:], marks, marks[1:])]


@dataclass
class StepPoint:
    """One link: a step's time recorded (at loopback), predicted from that recording, and measured over the link."""

    network: Network
    recorded_s: float
    predicted_s: float
    without_gpu_s: float  # the prediction without the GPU's queues
    measured_s: float | None = None  # None: the run failed (`failure` says why)
    failure: str = ""

    @property
    def error(self) -> float | None:
        return None if self.measured_s is None else self.predicted_s / self.measured_s - 1.0

    @property
    def added_predicted_s(self) -> float:
        return self.predicted_s - self.recorded_s

    @property
    def added_measured_s(self) -> float | None:
        return None if self.measured_s is None else self.measured_s - self.recorded_s

    @property
    def link_adds(self) -> float | None:
        """The share of the recorded step the link added, measured."""
        added = self.added_measured_s
        return None if added is None else added / self.recorded_s

    @property
    def added_error(self) -> float | None:
        added = self.added_measured_s
        return None if not added else self.added_predicted_s / added - 1.0

    @property
    def held(self) -> bool:
        """Whether the link adds enough to the step for its added time to be held to ADDED_AIM."""
        return self.link_adds is not None and self.link_adds >= ADDS_ENOUGH


@dataclass
class TorchValidation:
    workload: str
    command: list[str]
    steps: int
    points: list[StepPoint]
    tokens: int | None = None  # gpt2_generate's new tokens a step: its rate is tokens / step

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TorchValidation:
        """As to_json wrote it (the figures that follow from the others are computed again)."""
        return cls(data["workload"], data["command"], data["steps"], [StepPoint(
            Network(p["rtt_us"], p["gbps"] or 0.0), p["recorded_step_s"], p["predicted_step_s"],
            p["predicted_without_gpu_step_s"], p["measured_step_s"], p.get("failure", "")) for p in data["points"]],
            data.get("tokens"))

    def to_json(self) -> dict[str, object]:
        return {"workload": self.workload, "command": self.command, "steps": self.steps, "tokens": self.tokens,
                "points": [{"rtt_us": p.network.rtt_us, "gbps": p.network.gbps or None,
                            "recorded_step_s": p.recorded_s, "predicted_step_s": p.predicted_s,
                            "measured_step_s": p.measured_s, "error": p.error,
                            "predicted_without_gpu_step_s": p.without_gpu_s,
                            "added_predicted_s": p.added_predicted_s, "added_measured_s": p.added_measured_s,
                            "added_error": p.added_error, "link_adds": p.link_adds, "held": p.held,
                            **({"tokens_per_s": {k: self.tokens / v if v else None for k, v in (
                                ("recorded", p.recorded_s), ("predicted", p.predicted_s),
                                ("measured", p.measured_s))}} if self.tokens else {}),
                            **({"failure": p.failure} if p.failure else {})} for p in self.points]}


class GatedRun:
    """A workload's process (bench/torch_e2e.py --run ... --gate) under xpu-run over an emulated link, traced: it
    warms up, says it is ready, times its steps when told, and stays up, idle, until its stdin closes."""

    def __init__(self, command: list[str], server: str, path: Path, net: Network,
                 cpus: Collection[int] | None) -> None:
        env = dict(os.environ, XPU_TRACE=str(path), XPU_LINK_RTT_US=str(net.rtt_us), XPU_LINK_GBPS=str(net.gbps))
        self.path, self.net = path, net
        self.proc = subprocess.Popen([sys.executable, "-m", "xpuremote.interpose.run", "--server", server, "--",
                                      *command, "--gate"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=on_cpus(cpus))
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.said: collections.deque[str] = collections.deque(maxlen=20)  # its stderr's tail
        self.told: list[str] = []  # and what xpuremote said there (a traceback's tail does not say why CUDA failed)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._errors, daemon=True).start()

    def _errors(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.said.append(line)
            if line.startswith(("xpuremote", "xpu-server")) and len(self.told) < 20:
                self.told.append(line)

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith("{"):
                self.lines.put(line)
        self.lines.put(None)

    def next(self, key: str, deadline: float) -> dict[str, Any]:
        """The process's next JSON line, which must hold `key`."""
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            line = None
        if line is None:
            raise RuntimeError(f"the run over {self.net} said no {key!r} (exit {self.proc.poll()}):\n"
                               + "".join(self.told) + "".join(self.said)[-1500:])
        found = json.loads(line)
        if key not in found:
            raise RuntimeError(f"the run over {self.net} said {line[:200]!r}, not {key!r}")
        return found

    def go(self, deadline: float) -> dict[str, Any]:
        """Its timed steps: its result line."""
        self.proc.stdin.write("go\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self.next("steps_s", deadline)

    def finish(self, timeout: float = 60.0) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def validate_torch(workload: str, command: list[str], rtts: Sequence[float] = TORCH_RTTS_US,
                   gbps: Sequence[float] = TORCH_GBPS, server: str | None = None, backend: str = "auto",
                   timeout_s: float = 1800.0, seed: int = 0, keep: Path | None = None) -> TorchValidation:
    """A PyTorch workload (`command`: bench/torch_e2e.py --run WORKLOAD ...) recorded once at loopback and run
    once over each emulated link, all traced; a step's time recorded, predicted from the recording, measured.

    A PyTorch process takes seconds to start (importing PyTorch, the CUDA context, the libraries, the warm-up)
    and its timed steps a fraction of one: the recording and the runs start together (as many at once as the runs
    have CPUs), wait warmed up, and time their steps one at a time in a shuffled order, each alone on the machine
    (the others idle, blocked on a read). The runs are traced as the recording is: the model replays the
    recorded server's times, which a trace makes dearer (on a GPU the timer moves the lane's records into the
    worker's Python), so an untraced run is another session than the one predicted. Each run's step is its
    timed window over its steps: the same window as the prediction's, from the recording's marks on the trace's
    clock. `keep`: a folder to leave the
    traces in (WORKLOAD-0.trace the recording's, then one a link in order)."""
    nets = [Network(rtt, bw) for rtt in rtts for bw in gbps]
    deadline = time.monotonic() + timeout_s
    cpus = None if server else split_cpus()
    # as many starting at once as the runs have CPUs: more only queue for them, and a session whose process is
    # starved that long misses the server's connection timeout
    starting = len(cpus[0]) if cpus else max(1, (os.cpu_count() or 2) // 2)
    with serving(server, backend, cpus and cpus[1]) as address, \
            tempfile.TemporaryDirectory(prefix="xpu-perf-") as tmp:
        runs: list[GatedRun] = []
        results: dict[int, dict[str, Any] | str] = {}
        try:
            links = [Network(), *nets]
            for first in range(0, len(links), starting):
                runs += [GatedRun(command, address, Path(keep or tmp, f"{workload}-{i}.trace"), links[i],
                                  cpus and cpus[0]) for i in range(first, min(first + starting, len(links)))]
                for i in range(first, len(runs)):
                    try:
                        runs[i].next("ready", deadline)
                    except RuntimeError as exc:
                        results[i] = str(exc)
            order = [i for i in range(len(runs)) if i not in results]
            random.Random(seed).shuffle(order)
            for i in order:
                try:
                    results[i] = runs[i].go(deadline)
                except RuntimeError as exc:
                    results[i] = str(exc)
        finally:
            for run in runs:
                run.finish()
        recording = results[0]
        if isinstance(recording, str):
            raise RuntimeError(f"{workload}: the recording failed: {recording}")
        return _compare(workload, command, fmt.read(runs[0].path), recording, nets,
                        [results[i + 1] for i in range(len(nets))])


def _compare(workload: str, command: list[str], trace: fmt.Trace, recording: dict[str, Any], nets: list[Network],
             runs: list[dict[str, Any] | str]) -> TorchValidation:
    """Each link's step: the median of the recording's steps, each predicted from its window of the trace, and
    the median of the run's steps. Medians: a step that a busy machine slowed (the recording's too) moves them
    little, where it would move a mean of a few steps by its whole delay."""
    epoch = trace.header["epoch_ns"]
    marks = [t - epoch for t in _marks(recording)]
    model, plain = Model(trace), Model(trace, gpu=False)
    at_recorded = [time_at(model, model.recorded, t) for t in marks]
    plain_recorded = [time_at(plain, plain.recorded, t) for t in marks]
    recorded = statistics.median((b - a) / 1e9 for a, b in zip(marks, marks[1:]))
    points = []
    for net, run in zip(nets, runs):
        point = StepPoint(net, recorded, statistics.median(step_times(model, net, marks, at_recorded)),
                          statistics.median(step_times(plain, net, marks, plain_recorded)))
        if isinstance(run, str):
            point.failure = run
        else:
            ends = _marks(run)
            point.measured_s = statistics.median((b - a) / 1e9 for a, b in zip(ends, ends[1:]))
        points.append(point)
    return TorchValidation(workload, command, len(marks) - 1, points, recording.get("tokens"))


def _marks(result: dict[str, Any]) -> list[int]:
    """A run's step boundaries on CLOCK_MONOTONIC: its window's start and each step's end (or the window's)."""
    return [result["window_ns"][0], *result.get("step_ends_ns", result["window_ns"][1:])]


def torch_summary(results: Sequence[TorchValidation]) -> dict[str, Any]:
    """The points against the aims: the step time's error (median, worst), and the added time's where the link
    adds at least ADDS_ENOUGH of the step."""
    points = [p for r in results for p in r.points if p.error is not None]
    errors = [abs(p.error) for p in points]  # type: ignore[arg-type]
    held = [abs(p.added_error) for p in points if p.held and p.added_error is not None]
    return {"points": len(points), "failed": sum(p.error is None for r in results for p in r.points),
            "median_abs_error": statistics.median(errors) if errors else None,
            "worst_abs_error": max(errors) if errors else None,
            "held_points": len(held), "held_within_aim": sum(e <= ADDED_AIM for e in held),
            "worst_held_added_error": max(held) if held else None,
            "aims": {"median": STEP_AIMS[0], "worst": STEP_AIMS[1], "adds_enough": ADDS_ENOUGH, "added": ADDED_AIM}}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def torch_table(results: Sequence[TorchValidation]) -> str:
    """A markdown table of every point, and a line against the aims. A step's times in ms; gpt2_generate's tokens/s
    beside them; last, the model's prediction without the GPU's queues (the server's times as recorded: the same on
    the sim). `*`: the link adds at least ADDS_ENOUGH of the step, so its added time is held to ADDED_AIM; an added
    time's error not held to it is in brackets."""
    lines = ["| workload | RTT µs | Gbit/s | recorded ms | predicted ms | measured ms | error | link adds | "
             "added: predicted ms | measured ms | error | tokens/s: recorded / predicted / measured | "
             "predicted without GPU queues ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in results:
        for p in r.points:
            rate = (" / ".join(f"{r.tokens / s:.0f}" if s else "-" for s in (p.recorded_s, p.predicted_s,
                                                                               p.measured_s)) if r.tokens else "")
            measured = "failed" if p.measured_s is None else f"{p.measured_s * 1e3:.2f}"
            added = p.added_measured_s
            added_error = _pct(p.added_error) if p.held else f"({_pct(p.added_error)})"  # not held: in brackets
            lines.append(
                f"| {r.workload} | {p.network.rtt_us:g} | {p.network.gbps:g} | {p.recorded_s * 1e3:.2f} | "
                f"{p.predicted_s * 1e3:.2f} | {measured} | {_pct(p.error)} | "
                f"{_pct(p.link_adds)}{'*' if p.held else ''} | {p.added_predicted_s * 1e3:.2f} | "
                f"{'-' if added is None else f'{added * 1e3:.2f}'} | {added_error} | {rate} | "
                f"{p.without_gpu_s * 1e3:.2f} |")
    s = torch_summary(results)
    if s["points"]:
        lines += ["", f"Step time over {s['points']} points: median |error| {s['median_abs_error']:.1%} (aim "
                      f"≤ {STEP_AIMS[0]:.0%}), worst {s['worst_abs_error']:.1%} (aim ≤ {STEP_AIMS[1]:.0%}). Added time "
                      f"where the link adds ≥ {ADDS_ENOUGH:.0%} of the step (*): {s['held_within_aim']} of "
                      f"{s['held_points']} points within {ADDED_AIM:.0%}"
                      + (f", worst {s['worst_held_added_error']:.1%}." if s["held_points"] else ".")
                      + (f" {s['failed']} runs failed." if s["failed"] else "")]
    return "\n".join(lines)
