"""How fast xpu-perf answers on a large trace: reading it, building the model, one `predict`, `sweep`'s grid and
`requirements`' frontier, with the compiled replay (perfmodel/fast.py) and with the pure-Python one, same run.

    python bench/perf_speed.py [--calls 1000000] [--baseline-points 3] [--out bench/results/perf-speed.md]

The trace is synthetic but real: written by protocol/trace.py's TraceWriter as a client writes it, with the
messages a PyTorch training loop makes (perfmodel's docs: a step is a few batches of lane records, a later
copy and a synchronising call): each step sends four async batches of six lane records (launches and memsets
on three streams, an event recorded after each batch, a stream waiting for another's event now and then), a
`later` message (an async copy to the host, read at the next sync) and a sync message (cuStreamSynchronize on
a stream or the context's), with a few calls answered locally; the server's GPU operations for each (backend
"cuda": the model keeps the GPU's queues) and a wake-up probe in its header.

The Python replay takes minutes for the whole grid on such a trace, so its `sweep` and `requirements` are
timed on --baseline-points predictions and scaled to the grid's (and the frontier's, counted in the fast
run) number of predictions; its reading and model are the same code as the fast run's but for the arrays.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from xpuremote.perfmodel import cli, fast
from xpuremote.perfmodel.model import Model, Network
from xpuremote.protocol import trace as fmt

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


def measure(path: Path, baseline_points: int) -> dict[str, object]:
    figures: dict[str, object] = {}
    figures["read_s"], trace = timed(lambda: fmt.read(path))
    figures["calls"], figures["messages"] = len(trace.calls), len(trace.messages)
    figures["model_s"], model = timed(lambda: Counted(trace))
    net = Network(100.0, 25.0)
    figures["predict_s"], fast_pred = timed(lambda: model.predict(net))
    figures["sweep_s"], _ = timed(lambda: grid(model))
    Counted.count = 0
    figures["requirements_s"], _ = timed(lambda: frontier(model))
    figures["requirements_predictions"] = Counted.count
    # the same with the Python replay: its Model and one prediction in full, the grid from a few points
    with fast.python_replay():
        figures["py_model_s"], py = timed(lambda: Model(trace))
        figures["py_predict_s"], py_pred = timed(lambda: py.predict(net))
        points = [Network(r, g) for r, g in zip((1.0, 100.0, 10_000.0), (400.0, 10.0, 1.0))][:baseline_points]
        each, _ = timed(lambda: [py.predict(p) for p in points])
    each /= len(points)
    figures["py_sweep_s"] = each * len(cli.SWEEP_RTTS_US) * len(cli.SWEEP_GBPS)
    figures["py_requirements_s"] = each * Counted.count
    figures["same_prediction"] = abs(fast_pred.predicted_s - py_pred.predicted_s) <= 1e-9 * py_pred.predicted_s
    figures["compiled"] = fast.library() is not None
    return figures


def table(f: dict[str, object], command: str) -> str:
    rows = [("read the trace", f["read_s"], f["read_s"], ""),
            ("build the model", f["py_model_s"], f["model_s"], ""),
            ("predict (one network)", f["py_predict_s"], f["predict_s"], ""),
            ("predict, whole command", f["read_s"] + f["py_model_s"] + f["py_predict_s"],  # type: ignore[operator]
             f["read_s"] + f["model_s"] + f["predict_s"], "<= 1 s"),  # type: ignore[operator]
            (f"sweep's grid ({len(cli.SWEEP_RTTS_US) * len(cli.SWEEP_GBPS)} predictions)", f["py_sweep_s"],
             f["sweep_s"], ""),
            ("sweep, whole command", f["read_s"] + f["py_model_s"] + f["py_sweep_s"],  # type: ignore[operator]
             f["read_s"] + f["model_s"] + f["sweep_s"], "<= 10 s"),  # type: ignore[operator]
            (f"requirements at 5% ({f['requirements_predictions']} predictions)", f["py_requirements_s"],
             f["requirements_s"], "")]
    lines = [f"`{command}`", "",
             f"{f['calls']} calls, {f['messages']} messages; {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; compiled replay: {f['compiled']}; "
             f"same prediction from both: {f['same_prediction']}", "",
             "| step | Python replay s | compiled replay s | aim |", "|---|---:|---:|---|"]
    lines += [f"| {name} | {py:.3f} | {c:.3f} | {aim} |" for name, py, c, aim in rows]  # type: ignore[str-format]
    lines.append("")
    lines.append("The Python replay's sweep and requirements are its measured time a prediction times their number "
                 "of predictions.")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=1_000_000)
    p.add_argument("--baseline-points", type=int, default=3, choices=(1, 2, 3))
    p.add_argument("--out", help="write the table (markdown) here too")
    args = p.parse_args()
    command = "python bench/perf_speed.py " + " ".join(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "loop.trace"
        write_s, _ = timed(lambda: write_trace(path, args.calls))
        print(f"wrote {path.stat().st_size / 1e6:.1f} MB in {write_s:.1f} s", file=sys.stderr)
        figures = measure(path, args.baseline_points)
    out = table(figures, command.strip())
    print(out)
    if args.out:
        Path(args.out).write_text(out + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
