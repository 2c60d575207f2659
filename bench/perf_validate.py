"""xpu-perf's accuracy: the model's predictions against runs over emulated links (sim backend, or --backend cuda).

    python bench/perf_validate.py [--out bench/results/perf-validate.json] [--plot docs/images/validate.png]
                                  [--backend sim|cuda]

The same check as tests/test_perf.py's, written down: examples/workloads.cu in its three mixes
(round-trip bound, launch bound, bandwidth bound), each recorded once at loopback speed and then
run over RTT {0, 50, 200, 1000} µs x {1, 10 Gbit/s, unlimited}, in --repeat shuffled rounds of
three recordings and one run per link; the faster two thirds of each side are compared
(perfmodel/validate.py).

Each table has, beside the prediction, the model's without the GPU's queues (each message's server time as
recorded): the same on the sim, whose GPU times are part of the server's; on a GPU, what they change.

It also draws the rounds again, with replacement, to show how far the worst point may land in a
validation of as many rounds (the CI test's), and of half as many.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from trace_overhead import build  # noqa: E402

from xpuremote.perfmodel import plots, validate  # noqa: E402

MIXES = (("sync", "400"), ("async", "300"), ("bytes", "8"))
TRIALS = 300


def resampling(results: list[validate.Validation], repeat: int) -> list[str]:
    """How far the worst of the points may land in a validation of fewer or as many rounds: the
    three programs' rounds drawn again, with replacement, TRIALS times."""
    lines = [f"Worst point over the {3 * len(validate.RTTS_US) * len(validate.GBPS)} points, in {TRIALS} "
             f"validations of rounds drawn with replacement from these {repeat}:", "",
             "| rounds | worst > 10% | worst > 8% | median worst | 95th percentile |", "|---:|---:|---:|---:|---:|"]
    for size in sorted({repeat // 2, repeat}):
        worst = sorted(map(max, zip(*(validate.resampled_worst(r.rounds, TRIALS, size) for r in results))))
        past = [f"{sum(w > bar for w in worst) / TRIALS:.0%}" for bar in (0.10, 0.08)]
        lines.append(f"| {size} | {past[0]} | {past[1]} | {worst[TRIALS // 2]:.1%} | {worst[int(0.95 * TRIALS)]:.1%} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write JSON here and Markdown beside it")
    parser.add_argument("--plot", help="write predicted vs measured (PNG) here")
    parser.add_argument("--repeat", type=int, default=24)
    parser.add_argument("--backend", default="sim", choices=["sim", "cuda"])
    args = parser.parse_args()
    os.environ.setdefault("XPU_SIM_KERNELS", str(ROOT / "examples/sim_kernels.py"))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        for mix in MIXES:
            results.append(validate.validate([str(exe), *mix], repeat=args.repeat, backend=args.backend))
            print(validate.table(results[-1]), flush=True)
    errors = [abs(p.error) for r in results for p in r.points]
    command = "python bench/perf_validate.py " + " ".join(sys.argv[1:])
    summary = "\n".join([f"all {len(errors)} points: median |error| {statistics.median(errors):.1%}, "
                          f"worst {max(errors):.1%}", "", *resampling(results, args.repeat)])
    print(summary)
    for r in results:
        r.command = ["workloads", *r.command[1:]]
    if args.out:
        data = {"command": command, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "programs": [r.to_json() for r in results]}
        Path(args.out).write_text(json.dumps(data, indent=1))
        md = [f"# xpu-perf validation ({args.backend} backend)\n\nCommand: `{command}`\n\nMachine: {data['machine']}\n"]
        md += [f"```\n{validate.table(r)}\n```\n" for r in results]
        Path(args.out).with_suffix(".md").write_text("\n".join(md) + f"\n{summary}\n")
    if args.plot:
        points = [dict(p, label=" ".join(r.command)) for r in results for p in r.to_json()["points"]]
        plots.validation(points, f"xpu-perf on the {args.backend} backend: predicted vs measured", Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
