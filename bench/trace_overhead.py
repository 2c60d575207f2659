"""What recording a trace (XPU_TRACE) costs: the same program with tracing off and on, same run.

    python bench/trace_overhead.py [--out bench/results/trace-overhead.json] [--repeats 7]
                                   [--torch mlp_train,gpt2_step_bf16] [--parts mixes,torch] [--before TREE]

Mixes: builds examples/workloads.cu with nvcc, starts its own `xpu-server --backend sim`, and runs
the launch-bound mix (17 async calls and one sync call per iteration) and the round-trip-bound
mix, alternating tracing off and on. The figure is the program's own timing of its loop
(steady_clock, printed by the program), so start-up and the trace's closing are outside it.
Medians over the repeats; the trace's size per recorded call comes from the last traced run.

PyTorch: each bench/torch_e2e.py workload at --size small under `xpu-run --backend sim` (a local server
for each run, XPU_SIM_SKIP_KERNELS=1), untraced, traced, and traced with the lane closed (XPU_LANE=0:
every call through the client core, as a trace was recorded before the lane stayed open under one), in a
shuffled order each repeat. The figures are the median step time of each run (torch_e2e's), and the
application process's CPU a step; medians over the repeats. --before TREE (a checkout of other code, e.g.
`git archive COMMIT | tar -x -C TREE`) adds that code's untraced and traced runs to the same rounds: a
venv made here imports it (a folder of links to TREE's packages) and this venv's dependencies, client,
core and server alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import site
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from toolchain import nvcc_lib_dir, nvcc_path  # noqa: E402

from xpuremote.interpose.build import ensure_shim  # noqa: E402
from xpuremote.interpose.run import child_env  # noqa: E402
from xpuremote.protocol import trace  # noqa: E402
from xpuremote.protocol.local_server import start_local_server  # noqa: E402

MIXES = (("async", 2000), ("sync", 2000))
TORCH_PYTHON = Path(os.environ.get("XPU_TORCH_PYTHON") or ROOT / ".venv-torch" / "bin" / "python")
TORCH_STEPS, TORCH_WARMUP = 40, 3
VARIANTS = ("untraced", "traced", "traced, lane closed")
BEFORE = ("before: untraced", "before: traced")
PACKAGES = ("client", "interpose", "perfmodel", "protocol", "server")  # pyproject's, each xpuremote.<name>


def build(out_dir: Path) -> Path:
    nvcc, lib_dir = nvcc_path(), nvcc_lib_dir()
    if not nvcc or not lib_dir:
        raise SystemExit("needs nvcc from the nvidia-cuda-nvcc wheel (make setup)")
    exe = out_dir / "workloads"
    subprocess.run([nvcc, "-arch=sm_90", f"-L{lib_dir}", "-o", str(exe), str(ROOT / "examples/workloads.cu")],
                   check=True)
    return exe


def run(exe: Path, mix: str, iters: int, env: dict[str, str]) -> float:
    out = subprocess.run([str(exe), mix, str(iters)], env=env, check=True, capture_output=True, text=True).stdout
    return float(re.search(r": ([0-9.]+) s", out).group(1))


def measure(exe: Path, server: str, repeats: int, tmp: Path) -> list[dict[str, object]]:
    base = child_env(str(ensure_shim().parent), server)
    rows = []
    for mix, iters in MIXES:
        path = tmp / f"{mix}.trace"
        off, on = [], []
        for i in range(repeats):  # alternate, so that drift in the machine's load hits both alike
            pair = [("off", base), ("on", dict(base, XPU_TRACE=str(path)))]
            for label, env in pair if i % 2 == 0 else pair[::-1]:
                (off if label == "off" else on).append(run(exe, mix, iters, env))
        t = trace.read(path)
        calls = sum(1 for c in t.calls if c.entry >= 0)
        off_s, on_s = statistics.median(off), statistics.median(on)
        rows.append({"mix": mix, "iterations": iters, "calls": calls, "messages": len(t.messages),
                     "off_s": off_s, "on_s": on_s, "overhead": on_s / off_s - 1,
                     "per_call_us": (on_s - off_s) / calls * 1e6, "trace_bytes": path.stat().st_size,
                     "bytes_per_call": path.stat().st_size / calls, "samples_off": off, "samples_on": on})
    return rows


def torch_run(workload: str, python: str, env: dict[str, str]) -> dict[str, float]:
    """One torch_e2e run through `python`'s xpuremote: its median step (ms) and the application's CPU a step (ms)."""
    command = [python, "-m", "xpuremote.interpose.run", "--backend", "sim", "--", str(TORCH_PYTHON),
               str(ROOT / "bench" / "torch_e2e.py"), "--run", workload, "--size", "small", "--steps", str(TORCH_STEPS),
               "--warmup", str(TORCH_WARMUP)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"{workload} failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    return {"step_ms": statistics.median(result["steps_s"]) * 1e3, "cpu_ms": result["cpu_ms"]}


def python_of(tree: Path, into: Path) -> str:
    """An interpreter whose xpuremote is `tree`'s code (links to its packages), with this one's dependencies."""
    package = into / "before-code" / "xpuremote"
    package.mkdir(parents=True)
    for name in PACKAGES:
        (package / name).symlink_to(tree.resolve() / name)
    venv = into / "before-venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    python = venv / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                           capture_output=True, text=True).stdout.strip()
    # a .pth line adds a path only: this venv's own .pth files (its editable install of this code) are not read
    Path(where, "before.pth").write_text("\n".join([str(package.parent), *site.getsitepackages()]) + "\n")
    return str(python)


def faster_mean(values: list[float]) -> float:
    """The mean of the faster two thirds: a loaded machine only ever slows a run down, and a workload's runs may
    fall into two groups (perfmodel/validate.py's statistic)."""
    kept = sorted(values)[:max(1, round(len(values) * 2 / 3))]
    return sum(kept) / len(kept)


def measure_torch(workloads: list[str], repeats: int, tmp: Path, before: str | None) -> list[dict[str, object]]:
    """`before`: the interpreter of the code to compare with, or None."""
    envs = {"untraced": {}, "traced": {"XPU_TRACE": str(tmp / "torch.trace")},
            "traced, lane closed": {"XPU_TRACE": str(tmp / "closed.trace"), "XPU_LANE": "0"}}
    if before:
        envs |= {"before: untraced": {}, "before: traced": {"XPU_TRACE": str(tmp / "before.trace")}}
    rows = []
    for workload in workloads:
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in envs}
        for _ in range(repeats):  # a shuffled order each time: drift in the machine's load hits all alike
            for variant in random.sample(list(envs), len(envs)):
                python = before if variant in BEFORE else sys.executable
                runs[variant].append(torch_run(workload, python, {**os.environ, **envs[variant]}))
        t = trace.read(tmp / "torch.trace")
        row: dict[str, object] = {"workload": workload, "steps": TORCH_STEPS, "repeats": repeats,
                                  "lane_calls": sum(c.lane for c in t.calls), "calls": len(t.calls)}
        for variant, samples in runs.items():
            row[variant] = {key: statistics.median(r[key] for r in samples) for key in ("step_ms", "cpu_ms")}
            row[variant]["fast_ms"] = faster_mean([r["step_ms"] for r in samples])
            row[variant]["samples"] = samples
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, object]], torch_rows: list[dict[str, object]], command: str) -> str:
    lines = ["# Trace recording overhead (sim backend)", "", f"Command: `{command}`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}", ""]
    if rows:
        lines += ["| mix | calls | tracing off (s) | tracing on (s) | overhead | per call | trace size |",
                  "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mix']} x{r['iterations']} | {r['calls']} | {r['off_s']:.3f} | {r['on_s']:.3f} | "
                     f"{r['overhead']:+.1%} | {r['per_call_us']:.2f} µs | {r['trace_bytes'] / 1024:.1f} KiB "
                     f"({r['bytes_per_call']:.1f} B/call) |")
    if torch_rows:
        first = torch_rows[0]
        lines += ["", f"PyTorch, `torch_e2e.py --size small`, XPU_SIM_SKIP_KERNELS=1: median ms a step of each run "
                  f"({first['steps']} steps after {TORCH_WARMUP}), then the median of {first['repeats']} runs; the "
                  "application process's CPU a step likewise; in brackets the mean of the faster two thirds of the "
                  "runs. \"lane closed\": XPU_LANE=0, as a trace was recorded before the lane stayed open under one.",
                  "",
                  "| workload | untraced ms/step | traced | traced/untraced | traced, lane closed | lane closed/"
                  "untraced | CPU ms/step untraced, traced, lane closed | lane records in the trace |",
                  "|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in torch_rows:
        off, on, closed = (r[v] for v in VARIANTS)
        lines.append(f"| {r['workload']} | {_ms(off)} | {_ms(on)} | {_ratio(on, off)} | {_ms(closed)} | "
                     f"{_ratio(closed, off)} | {off['cpu_ms']:.2f}, {on['cpu_ms']:.2f}, "
                     f"{closed['cpu_ms']:.2f} | {r['lane_calls']} of {r['calls']} calls |")
    if torch_rows and BEFORE[0] in torch_rows[0]:
        lines += ["", "The code before (--before), in the same rounds:", "",
                  "| workload | before: untraced ms/step | before: traced | traced/untraced | CPU ms/step untraced, "
                  "traced |", "|---|---:|---:|---:|---|"]
        for r in torch_rows:
            off, on = (r[v] for v in BEFORE)
            lines.append(f"| {r['workload']} | {_ms(off)} | {_ms(on)} | {_ratio(on, off)} | "
                         f"{off['cpu_ms']:.2f}, {on['cpu_ms']:.2f} |")
    return "\n".join(lines) + "\n"


def _ms(figures: dict[str, float]) -> str:
    return f"{figures['step_ms']:.2f} ({figures['fast_ms']:.2f})"


def _ratio(a: dict[str, float], b: dict[str, float]) -> str:
    return f"{a['step_ms'] / b['step_ms']:.3f} ({a['fast_ms'] / b['fast_ms']:.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write JSON here and Markdown beside it")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--torch", default="mlp_train,gpt2_step_bf16", help="torch_e2e workloads (--size small)")
    parser.add_argument("--parts", default="mixes,torch", help="mixes, torch or both")
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with (torch part)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    os.environ.setdefault("XPU_SIM_KERNELS", str(ROOT / "examples/sim_kernels.py"))
    rows, torch_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        if "mixes" in parts:
            exe = build(Path(tmp))
            proc, server = start_local_server("sim")
            try:
                rows = measure(exe, server, args.repeats, Path(tmp))
            finally:
                proc.terminate()
                proc.wait(10)
        if "torch" in parts:
            os.environ["XPU_SIM_SKIP_KERNELS"] = "1"  # for the runs' servers: the sim's numpy would be the step
            before = python_of(args.before, Path(tmp)) if args.before else None
            torch_rows = measure_torch(args.torch.split(","), args.repeats, Path(tmp), before)
    command = "python bench/trace_overhead.py " + " ".join(sys.argv[1:])
    text = markdown(rows, torch_rows, command)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": command, "rows": rows, "torch": torch_rows}, indent=1))
        Path(args.out).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
