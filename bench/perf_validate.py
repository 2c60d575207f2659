"""xpu-perf's accuracy: the model's predictions against runs over emulated links (sim backend).

    python bench/perf_validate.py [--out bench/results/perf-validate.json] [--plot docs/images/validate.png]

The same check as tests/test_perf.py's, written down: examples/workloads.cu in its three mixes
(round-trip bound, launch bound, bandwidth bound), each recorded once at loopback speed and then
run over RTT {0, 50, 200, 1000} µs x {1, 10 Gbit/s, unlimited}, in --repeat shuffled rounds of
three recordings and one run per link; the faster two thirds of each side are compared
(perfmodel/validate.py).
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write JSON here and Markdown beside it")
    parser.add_argument("--plot", help="write predicted vs measured (PNG) here")
    parser.add_argument("--repeat", type=int, default=12)
    args = parser.parse_args()
    os.environ.setdefault("XPU_SIM_KERNELS", str(ROOT / "examples/sim_kernels.py"))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        for mix in MIXES:
            results.append(validate.validate([str(exe), *mix], repeat=args.repeat, backend="sim"))
            print(validate.table(results[-1]), flush=True)
    errors = [abs(p.error) for r in results for p in r.points]
    command = "python bench/perf_validate.py " + " ".join(sys.argv[1:])
    summary = f"all {len(errors)} points: median |error| {statistics.median(errors):.1%}, worst {max(errors):.1%}"
    print(summary)
    for r in results:
        r.command = ["workloads", *r.command[1:]]
    if args.out:
        data = {"command": command, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "programs": [r.to_json() for r in results]}
        Path(args.out).write_text(json.dumps(data, indent=1))
        md = [f"# xpu-perf validation (sim backend)\n\nCommand: `{command}`\n\nMachine: {data['machine']}\n"]
        md += [f"```\n{validate.table(r)}\n```\n" for r in results]
        Path(args.out).with_suffix(".md").write_text("\n".join(md) + f"\n{summary}\n")
    if args.plot:
        points = [dict(p, label=" ".join(r.command)) for r in results for p in r.to_json()["points"]]
        plots.validation(points, "xpu-perf on the sim backend: predicted vs measured", Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
