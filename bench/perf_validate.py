"""xpu-perf's accuracy: the model's predictions against runs over emulated links (sim backend, or --backend cuda).

    python bench/perf_validate.py [--out bench/results/perf-validate.json] [--plot docs/images/validate.png]
                                  [--backend sim|cuda]

The fuller form of tests/test_perf.py's accuracy check: examples/workloads.cu in its three mixes
(round-trip bound, launch bound, bandwidth bound), each recorded once at loopback speed and then
run over RTT {0, 50, 200, 1000} µs x {1, 10 Gbit/s, unlimited}, in --repeat shuffled rounds of
three recordings and one run per link; the faster two thirds of each side are compared
(perfmodel/validate.py).

Each table has, beside the prediction, the model's without the GPU's queues (each message's server time as
recorded): the same on the sim, whose GPU times are part of the server's; on a GPU, what they change.

It also draws the rounds again, with replacement, to show how far the worst point may land in a
validation of as many rounds, and of half as many.

    python bench/perf_validate.py --torch [--workloads mlp_train,...] [--rtt-us 25,100,500,2000] [--gbps 10,100]
                                  [--size small] [--steps N] [--warmup N] [--new-tokens N] [--out X.json]

--torch: PyTorch workloads (bench/torch_e2e.py) instead, a step's time (perfmodel/validate.py's validate_torch):
each recorded once at loopback and run once over each link, every point's step recorded, predicted and measured,
and the time the link adds, predicted against measured, set against the aims (step time median error <= 5%,
worst <= 10%; added time within 20% where the link adds >= 5% of the step). On the sim, set
XPU_SIM_SKIP_KERNELS=1 and --size small. The JSON and Markdown are written after each workload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from xpuremote.perfmodel import plots, validate  # noqa: E402

MIXES = (("sync", "400"), ("async", "300"), ("bytes", "8"))
TORCH_WORKLOADS = ("mlp_train", "cnn_train_fp32", "cnn_infer_b1", "gpt2_step_bf16", "gpt2_generate")
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


def torch_workloads(args: argparse.Namespace) -> int:
    """--torch: each workload validated over the links, the report rewritten after each."""
    told = " ".join(f"{k}={os.environ[k]}" for k in ("XPU_SIM_SKIP_KERNELS", "XPU_SIM_KERNELS", "XPU_TORCH_PYTHON")
                    if k in os.environ)
    command = f"{told + ' ' if told else ''}python bench/perf_validate.py " + " ".join(sys.argv[1:])
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    results: list[validate.TorchValidation] = []
    failures: list[dict[str, str]] = []
    for name in filter(None, args.workloads.split(",")):
        cmd = [args.torch_python, str(ROOT / "bench/torch_e2e.py"), "--run", name, "--size", args.size,
               "--steps", str(args.steps), "--warmup", str(args.warmup),
               *(["--new-tokens", str(args.new_tokens)] if args.new_tokens and name == "gpt2_generate" else [])]
        started = time.monotonic()
        try:
            results.append(validate.validate_torch(name, cmd, _floats(args.rtt_us), _floats(args.gbps),
                                                   backend=args.backend, timeout_s=args.timeout,
                                                   keep=args.keep and Path(args.keep)))
        except RuntimeError as exc:
            failures.append({"workload": name, "error": str(exc)[-2000:]})
        print(f"{name}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        if args.out:
            _write_torch(Path(args.out), command, machine, args.backend, results, failures)
    print(validate.torch_table(results))
    for f in failures:
        print(f"{f['workload']} failed: {f['error']}")
    return 1 if failures else 0


def merge(paths: list[str], out: Path) -> int:
    """--merge: the --torch reports of workloads run one by one (each with its own --out), as one report."""
    found = [json.loads(Path(p).read_text()) for p in paths if Path(p).is_file()]
    results = [validate.TorchValidation.from_json(w) for f in found for w in f["workloads"]]
    failures = [x for f in found for x in f["failures"]]
    command = " ; ".join(f["command"] for f in found)
    _write_torch(out, command, found[0]["machine"] if found else "-", found[0]["backend"] if found else "-", results,
                 failures)
    print(validate.torch_table(results))
    return 0


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _write_torch(out: Path, command: str, machine: str, backend: str, results: list[validate.TorchValidation],
                 failures: list[dict[str, str]]) -> None:
    data = {"command": command, "machine": machine, "backend": backend, "summary": validate.torch_summary(results),
            "workloads": [r.to_json() for r in results], "failures": failures}
    out.write_text(json.dumps(data, indent=1))
    md = [f"# xpu-perf validation on PyTorch workloads ({backend} backend)", "", f"Command: `{command}`", "",
          f"Machine: {machine}", "", validate.torch_table(results), ""]
    md += [f"- {f['workload']} failed: {f['error'].splitlines()[0] if f['error'] else ''}" for f in failures]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write JSON here and Markdown beside it")
    parser.add_argument("--plot", help="write predicted vs measured (PNG) here")
    parser.add_argument("--repeat", type=int, default=24)
    parser.add_argument("--backend", default="sim", choices=["sim", "cuda"])
    parser.add_argument("--torch", action="store_true", help="PyTorch workloads: a step's time (above)")
    parser.add_argument("--workloads", default=",".join(TORCH_WORKLOADS))
    parser.add_argument("--rtt-us", default=",".join(f"{r:g}" for r in validate.TORCH_RTTS_US))
    parser.add_argument("--gbps", default=",".join(f"{g:g}" for g in validate.TORCH_GBPS))
    parser.add_argument("--size", default="full", choices=["full", "small"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, help="gpt2_generate's new tokens a step")
    parser.add_argument("--torch-python", default=os.environ.get("XPU_TORCH_PYTHON", sys.executable))
    parser.add_argument("--timeout", type=float, default=1800, help="seconds for each workload's runs")
    parser.add_argument("--keep", help="a folder to leave the traces in (WORKLOAD-0.trace: the recording)")
    parser.add_argument("--merge", nargs="+", help="--torch reports (JSON) to write as one, to --out")
    args = parser.parse_args()
    if args.merge:
        return merge(args.merge, Path(args.out)) if args.out else parser.error("--merge needs --out")
    if args.torch:
        return torch_workloads(args)
    os.environ.setdefault("XPU_SIM_KERNELS", str(ROOT / "examples/sim_kernels.py"))
    from trace_overhead import build  # nvcc's: the mixes only

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
