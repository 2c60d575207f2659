"""The client's CPU in a PyTorch step, call by call, beside the application's own (sim backend).

    python bench/client_cpu.py [--workloads cnn_infer_b1,mlp_train] [--out bench/results/client-cpu-sim.json]
                               [--backend sim|cuda] [--repeats N]

Each bench/torch_e2e.py workload (--size small, XPU_SIM_SKIP_KERNELS=1) runs under `xpu-run` against a local
sim server twice, with 1 and with 1 + STEPS steps (after 2 warm-up steps), and XPU_CALL_CPU set: the core
then times every call it runs on its thread's CPU clock (client/call_cpu.py). The difference of the two runs,
divided by STEPS, is one step: each entry point's calls and CPU. The calls the shim answers in C (the fast
lane, the context questions, kept descriptors) never reach the core and cost it nothing here. Each run has its
own server: its sessions' `ended` lines say how many calls the worker ran that did not come as fast-lane records
(a step's synchronize, the calls the core sent).

With --backend cuda (a GPU; the GPU check's stage 6) the workloads run at their benchmark sizes on a local
`xpu-server --backend cuda`, NVIDIA's libraries behind it.

Beside it, from the same runs: the application process's CPU per step (torch_e2e's `cpu_ms`: PyTorch, the
core on the application's threads, its flusher and ZeroMQ's threads), and what is left of it outside the
core's calls: PyTorch's own work and the client's background threads. On a GPU, bench/torch_e2e.py puts the
same process's CPU beside the native run's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from foundation import TORCH_PYTHON, start_server, stop  # noqa: E402

from xpuremote.client import call_cpu  # noqa: E402

STEPS = 20
TOP = 12  # entry points listed per workload


SESSION_ENDED = re.compile(r"session \S+ ended: (\d+) calls \((\d+) from the fast lane, in (\d+) lanes\)")


def run_once(workload: str, steps: int, folder: Path, backend: str) -> tuple[dict[str, list[int]], float, int]:
    """One run: each entry point's [calls, CPU ns] over the whole run, the application's CPU ms a step, and the
    calls the worker ran that did not come in the fast lane, the lanes themselves apart (its sessions' `ended`
    lines)."""
    table, log = folder / f"{workload}-{steps}.tsv", folder / f"{workload}-{steps}.log"
    skip = {"XPU_SIM_SKIP_KERNELS": "1"} if backend == "sim" else {}
    server, address = start_server(log, backend, env=skip)
    env = {**os.environ, "XPU_CALL_CPU": str(table), **skip}
    command = [sys.executable, "-m", "xpuremote.interpose.run", "--server", address, "--", str(TORCH_PYTHON),
               str(ROOT / "bench" / "torch_e2e.py"), "--run", workload, "--size", "small" if backend == "sim" else
               "full", "--steps", str(steps), "--warmup", "2"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    finally:
        stop(server)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines or not table.is_file():
        raise SystemExit(f"{workload} failed ({done.returncode}): {done.stderr[-2000:]}")
    spent = {name: list(row) for name, row in call_cpu.read(table).items()}
    ended = SESSION_ENDED.findall(log.read_text())
    outside_lane = sum(int(calls) - int(lane) - int(lanes) for calls, lane, lanes in ended)
    return spent, json.loads(lines[-1])["cpu_ms"], outside_lane


def one_step(workload: str, folder: Path, backend: str, repeats: int) -> dict[str, Any]:
    """Medians over `repeats` pairs of runs: the core's calls in one step, and the application's CPU a step."""
    per_call: dict[str, list[tuple[float, float]]] = {}
    totals, app, worker = [], [], []
    for _ in range(repeats):
        short, _, short_worker = run_once(workload, 1, folder, backend)
        long, cpu_ms, long_worker = run_once(workload, 1 + STEPS, folder, backend)
        worker.append((long_worker - short_worker) / STEPS)
        step = {name: ((n - short.get(name, [0, 0])[0]) / STEPS, (ns - short.get(name, [0, 0])[1]) / STEPS)
                for name, (n, ns) in long.items() if n > short.get(name, [0, 0])[0]}  # what each step calls
        for name, value in step.items():
            per_call.setdefault(name, []).append(value)
        totals.append(sum(ns for _, ns in step.values()) / 1e6)
        app.append(cpu_ms)
    calls = {name: (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values) / 1e3)
             for name, values in per_call.items()}
    core_ms, app_ms = statistics.median(totals), statistics.median(app)
    rows = sorted(((name, n, us) for name, (n, us) in calls.items() if n >= 0.05), key=lambda row: -row[2])
    return {"workload": workload, "app_cpu_ms": app_ms, "core_ms": core_ms, "outside_ms": app_ms - core_ms,
            "core_calls": sum(n for n, _ in calls.values()), "worker_calls": statistics.median(worker),
            "app_samples": app, "core_samples": totals,
            "calls": [{"call": name, "per_step": n, "us_per_step": us, "us_per_call": us / n} for name, n, us in rows]}


def markdown(report: dict[str, Any]) -> str:
    runs = f"Medians of {report['repeats']} pairs of runs" if report["repeats"] > 1 else "One pair of runs"
    where = ("the sim backend with XPU_SIM_SKIP_KERNELS=1, --size small" if report["backend"] == "sim" else
             "the cuda backend, --size full")
    out = [f"# The client's CPU in a PyTorch step ({report['when']})", "", f"Command: `{report['command']}`",
           f"Machine: {report['machine']}", "",
           f"{runs} (1 and {1 + STEPS} steps after 2 warm-up steps; the difference is {STEPS} steps), {where}.", "",
           "| workload | application CPU ms/step | the core's calls ms/step | outside them ms/step | calls into the "
           "core/step | the worker's calls outside the lane/step |", "|---|---:|---:|---:|---:|---:|"]
    for w in report["workloads"]:
        out.append(f"| {w['workload']} | {w['app_cpu_ms']:.2f} | {w['core_ms']:.2f} | {w['outside_ms']:.2f} | "
                   f"{w['core_calls']:.2f} | {w['worker_calls']:.2f} |")
    for w in report["workloads"]:
        out += ["", f"## {w['workload']}: the dearest entry points", "",
                "| call | calls/step | µs/call | µs/step |", "|---|---:|---:|---:|"]
        out += [f"| {c['call']} | {c['per_step']:.1f} | {c['us_per_call']:.1f} | {c['us_per_step']:.0f} |"
                for c in w["calls"][:TOP]]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="cnn_infer_b1,mlp_train")
    parser.add_argument("--out", type=Path, help="JSON here, Markdown beside it")
    parser.add_argument("--backend", choices=["sim", "cuda"], default="sim", help="the local server's (default sim)")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of runs, medians (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [one_step(w, Path(tmp), args.backend, args.repeats) for w in args.workloads.split(",")]
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(["bench/client_cpu.py", *sys.argv[1:]]),
              "machine": f"{platform.platform()}, {os.cpu_count()} cpus", "backend": args.backend,
              "repeats": args.repeats, "workloads": results}
    text = markdown(report)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
        args.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
