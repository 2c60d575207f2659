"""How fast xpu-perf answers on a large trace: reading it, building the model, one `predict`, `sweep`'s grid and
`requirements`' frontier, after (this code: the trace read into columns by protocol/trace_reader.c, the model made
from them, the compiled replay of perfmodel/fast.py), with the Python reader (this code with XPU_TRACE_NATIVE=0: the
model made from Message objects) and before (the reader of commit --before, the pure-Python replay), each in a
Python of its own; then the whole commands, with either reader, and what starting Python and importing takes.

    python bench/perf_speed.py [--calls 1000000] [--baseline-points 3] [--before COMMIT] [--out FILE.md]

The trace is synthetic but real: written by protocol/trace.py's TraceWriter as a client writes it, with the
messages a PyTorch training loop makes (docs/xpu-perf.md: a step is a few batches of lane records, a later copy
and a synchronising call): each step sends four async batches of seven lane records (launches and a memset on
three streams, an event recorded after them, a stream waiting for another's event once a step), a `later`
message (an async copy to the host, read at the next sync) and a sync message (cuStreamSynchronize on a stream,
or cuCtxSynchronize), with two calls answered locally; the server's GPU operations for each (backend "cuda":
the model keeps the GPU's queues) and a wake-up probe in its header.

The Python replay takes minutes for the whole grid on such a trace, so its `sweep` and `requirements` are its
mean time over --baseline-points predictions times the number of predictions they make (the frontier's counted
in the compiled run). Before's Model is this code's under fast.python_replay(), which makes its Msg list and
replays it in Python as the code before did. Figures are wall-clock seconds on whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from xpuremote.perfmodel import cli, fast
from xpuremote.perfmodel.model import Model, Network
from xpuremote.protocol import trace as fmt

ROOT = Path(__file__).resolve().parent.parent
BEFORE = "f470153"  # the commit before the compiled replay and the faster reader
NET = Network(100.0, 25.0)
CALLS_PER_STEP = 4 * 7 + 1 + 1 + 2  # 4 batches of 7 lane records, the later copy, the sync, 2 local answers
STREAMS = (0x5100, 0x5200, 0x5300)
WAKE = {"client": [[100_000, 4_000], [300_000, 7_000], [1_000_000, 18_000], [3_000_000, 25_000]],
        "server": [[100_000, 3_000], [300_000, 6_000], [1_000_000, 15_000], [3_000_000, 22_000]]}


def write_trace(path: Path, calls: int, seed: int = 1) -> int:
    """A training loop's trace of about `calls` calls at `path`; the number of messages written."""
    rng = random.Random(seed)
    w = fmt.TraceWriter(path, {"argv": ["train.py"], "backend": "cuda", "devices": 1,
                               "link": {"rtt_us": 0.0, "gbps": 0.0, "on": False}, "wake": WAKE,
                               "data": True, "lane": True})
    t, seq = w.epoch + 5_000_000, 0
    for step in range(-(-calls // CALLS_PER_STEP)):
        for _ in range(2):
            w.call("cuCtxGetCurrent", 0, t, t + 300, 0, 0, 0)
            t += 2_000
        for batch in range(4):
            seq += 1
            ops, records = [], []
            for k in range(6):
                stream = STREAMS[(batch + k) % 3]
                name = "cuMemsetD32Async" if k == 5 else "cuLaunchKernel"
                records.append((name, 1, t, t + 1_000, stream))
                kernel = rng.randint(5_000, 60_000)
                ops += [0, fmt.WORK, stream, kernel]
                t += rng.randint(8_000, 20_000)
            event = 0xE000 + (step * 4 + batch) % 16
            records.append(("cuEventRecord", 1, t, t + 500, STREAMS[batch % 3]))
            ops += [0, fmt.RECORD, STREAMS[batch % 3], event]
            if batch == 3:
                ops += [0, fmt.WAIT, STREAMS[0], event]
            w.lane_calls(records, seq, 0)
            server = rng.randint(6_000, 15_000)
            w.message(seq, 0, t, 60 * len(records), len(records), 0, 0, server, [server])
            w.gpu(seq, ops)
            t += 3_000
        seq += 1  # the loss, copied to the host and read at the sync
        w.call("cuMemcpyDtoHAsync_v2", 1, t, t + 4_000, STREAMS[0], seq, 0)
        server = rng.randint(5_000, 9_000)
        w.message(seq, 2, t + 3_000, 120, 1, 0, 4 + 16, server, [server])
        w.gpu(seq, [0, fmt.WORK, STREAMS[0], 2_000])
        t += 6_000
        seq += 1
        whole = step % 5 == 0
        stream = 0 if whole else STREAMS[step % 3]
        blocked = rng.randint(0, 200_000)  # the GPU still busy with the step when the sync came
        server = blocked + rng.randint(4_000, 8_000)
        wait = server + rng.randint(25_000, 40_000)
        w.call("cuCtxSynchronize" if whole else "cuStreamSynchronize", 3, t, t + wait + 2_000, stream, seq, 0)
        w.message(seq, 1, t + 1_000, 80, 1, wait, 64, server, [server])
        w.gpu(seq, [0, fmt.SYNC_ALL if whole else fmt.SYNC_STREAM, stream, blocked])
        t += wait + rng.randint(20_000, 80_000)
    w.close()
    return seq


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def grid(model: Model) -> list[list[float]]:
    return [[model.predict(Network(rtt, bw)).slowdown for rtt in cli.SWEEP_RTTS_US] for bw in cli.SWEEP_GBPS]


def frontier(model: Model) -> list[tuple[float, float | None]]:
    return [(bw, cli.max_rtt_us(model, bw, 1.05)) for bw in cli.FRONTIER_GBPS]


class Counted(Model):
    """A Model that counts its predictions (requirements' bisection makes as many as it needs)."""

    count = 0

    def predict(self, net: Network):  # type: ignore[no-untyped-def]
        Counted.count += 1
        return super().predict(net)


def after(path: Path, native: bool = True) -> dict[str, float]:
    """This code: the trace read (into columns in C where `native`, else by the Python reader, whose Message objects
    the Model's arrays are then made from), the Model with the compiled replay, a prediction, sweep's grid,
    requirements."""
    f: dict[str, float] = {}
    f["read_s"], trace = timed(lambda: fmt.read(path, native))
    f["calls"], f["messages"] = len(trace.calls), len(trace.messages)
    f["model_s"], model = timed(lambda: Counted(trace))
    f["predict_s"], pred = timed(lambda: model.predict(NET))
    f["predicted_s"] = pred.predicted_s
    f["sweep_s"], _ = timed(lambda: grid(model))
    Counted.count = 0
    f["requirements_s"], _ = timed(lambda: frontier(model))
    f["requirements_predictions"] = Counted.count
    f["compiled"] = fast.library() is not None
    f["columns"] = trace.columns is not None
    return f


def before(path: Path, rev: str, points: int) -> dict[str, float]:
    """The code before: protocol/trace.py of `rev` reads the trace, the Python replay predicts (model.replay, made
    from Msg objects as before); sweep and requirements from the time of `points` predictions."""
    source = subprocess.run(["git", "show", f"{rev}:protocol/trace.py"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout
    old = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)  # noqa: SIM115
    old.write(source)
    old.close()
    spec = importlib.util.spec_from_file_location("trace_before", old.name)
    assert spec is not None and spec.loader is not None
    reader = importlib.util.module_from_spec(spec)
    sys.modules["trace_before"] = reader  # its dataclasses look their module up
    spec.loader.exec_module(reader)
    reader.Trace.columns = None  # a Trace of then: the Model makes its arrays from its Message objects
    os.unlink(old.name)
    f: dict[str, float] = {}
    f["read_s"], trace = timed(lambda: reader.read(path))
    with fast.python_replay():
        f["model_s"], model = timed(lambda: Model(trace))
        f["predict_s"], pred = timed(lambda: model.predict(NET))
        nets = [Network(r, g) for r, g in zip((1.0, 100.0, 10_000.0), (400.0, 10.0, 1.0), strict=True)][:points]
        each, _ = timed(lambda: [model.predict(n) for n in nets])
    f["predicted_s"] = pred.predicted_s
    f["per_prediction_s"] = each / len(nets)
    return f


def command_s(*args: str, native: bool = True, runs: int = 3) -> float:
    """Wall time of an xpu-perf command, from starting Python to its exit (the median of `runs`)."""
    env = dict(os.environ, XPU_TRACE_NATIVE="1" if native else "0")
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "xpuremote.perfmodel.cli", *args], check=True, capture_output=True,
                       env=env)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def start_s(runs: int = 3) -> float:
    """Wall time of starting Python and importing what `xpu-perf predict` imports, numpy included (median)."""
    code = "import numpy, xpuremote.perfmodel.cli, xpuremote.perfmodel.fast"
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def child(kind: str, *args: str) -> dict[str, float]:
    """A phase's figures from a Python of its own, as a command would run it (no other trace in its memory)."""
    out = subprocess.run([sys.executable, __file__, "--child", kind, *args], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out)


def table(new: dict[str, float], py: dict[str, float], old: dict[str, float], whole: dict[str, dict[str, float]],
          command: str) -> str:
    grid_n = len(cli.SWEEP_RTTS_US) * len(cli.SWEEP_GBPS)
    old_sweep, old_req = old["per_prediction_s"] * grid_n, old["per_prediction_s"] * new["requirements_predictions"]
    sides = (old, py, new)
    rows = [("read the trace", *(f["read_s"] for f in sides), ""),
            ("build the model", *(f["model_s"] for f in sides), ""),
            ("predict (one network)", *(f["predict_s"] for f in sides), ""),
            ("read + model + predict", *(f["read_s"] + f["model_s"] + f["predict_s"] for f in sides),
             "predict <= 1 s"),
            (f"sweep's grid ({grid_n} predictions)", old_sweep, py["sweep_s"], new["sweep_s"], ""),
            ("read + model + grid", old["read_s"] + old["model_s"] + old_sweep,
             *(f["read_s"] + f["model_s"] + f["sweep_s"] for f in (py, new)), "sweep <= 10 s"),
            (f"requirements at 5% ({new['requirements_predictions']:.0f} predictions)", old_req,
             py["requirements_s"], new["requirements_s"], "")]
    same = all(abs(f["predicted_s"] - old["predicted_s"]) <= 1e-9 * old["predicted_s"] for f in (py, new))
    lines = [f"`{command}`", "",
             f"{new['calls']:.0f} calls, {new['messages']:.0f} messages; {platform.machine()}, {os.cpu_count()} CPUs, "
             f"load average {os.getloadavg()[0]:.1f} at the end; Python {platform.python_version()}; compiled "
             f"replay: {bool(new['compiled'])}; read into columns: {bool(new['columns'])}; the same prediction from "
             f"all three: {same}", "",
             "| step, seconds | before | Python reader | after | aim |", "|---|---:|---:|---:|---|"]
    lines += [f"| {name} | {b:.3f} | {p:.3f} | {a:.3f} | {aim} |" for name, b, p, a, aim in rows]
    lines += ["", "| whole command (starting Python, reading, printing), seconds | Python reader | after |",
              "|---|---:|---:|"]
    lines += [f"| {name} | {s['python']:.2f} | {s['after']:.2f} |" for name, s in whole.items()]
    lines += ["", "Before: the reader of the commit before the compiled replay (protocol/trace.py), the Python replay; "
              "its sweep and requirements are its time a prediction (the mean of a few) times their number of "
              "predictions. Python reader: this code with XPU_TRACE_NATIVE=0, as where protocol/trace_reader.c cannot "
              "be built (the trace read in Python, the model's arrays made from its Message objects, as before the "
              "C reader), the compiled replay. After: the trace read into columns in C, the model made from them. "
              "Each side runs in a Python of its own; each whole command is the median of three runs."]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--baseline-points", type=int, default=3, choices=(1, 2, 3))
    p.add_argument("--before", default=BEFORE, help="the commit whose trace reader is the baseline's")
    p.add_argument("--out", help="write the table (markdown) here too")
    p.add_argument("--child", nargs=2, metavar=("KIND", "TRACE"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, path = args.child
        f = after(Path(path), kind == "after") if kind != "before" else \
            before(Path(path), args.before, args.baseline_points)
        print(json.dumps(f))
        return 0
    command = "python bench/perf_speed.py " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "loop.trace"
        write_s, _ = timed(lambda: write_trace(path, args.calls))
        print(f"wrote {path.stat().st_size / 1e6:.1f} MB in {write_s:.1f} s", file=sys.stderr)
        new = child("after", str(path))
        py = child("python", str(path))
        old = child("before", str(path), "--before", args.before, "--baseline-points", str(args.baseline_points))
        whole = {f"`xpu-perf {verb} loop.trace`": {"python": command_s(verb, str(path), native=False),
                                                 "after": command_s(verb, str(path))}
                 for verb in ("predict", "sweep", "requirements")}
        started = start_s()
        whole["of which starting Python and importing (numpy included)"] = {"python": started, "after": started}
    out = table(new, py, old, whole, command.strip())
    print(out)
    if args.out:
        Path(args.out).write_text(out + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
