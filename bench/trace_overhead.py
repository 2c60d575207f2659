"""What recording a trace (XPU_TRACE) costs: the same program with tracing off and on, same run.

    python bench/trace_overhead.py [--out bench/results/trace-overhead.json] [--repeats 7]
                                   [--torch mlp_train,gpt2_step_bf16] [--parts mixes,torch,recorder] [--before TREE]

Mixes: builds examples/workloads.cu with nvcc, starts its own `xpu-server --backend sim`, and runs
the launch-bound mix (17 async calls and one sync call per iteration) and the round-trip-bound
mix, alternating tracing off and on. The figure is the program's own timing of its loop
(steady_clock, printed by the program), so start-up and the trace's closing are outside it.
Medians over the repeats; the trace's size per recorded call comes from the last traced run.

PyTorch: each bench/torch_e2e.py workload at --size small under `xpu-run --backend sim` (a local server
for each run, XPU_SIM_SKIP_KERNELS=1), untraced, traced, and traced with the lane closed (XPU_LANE=0:
every call through the client core, as a trace was recorded before the lane stayed open under one), in a
shuffled order each repeat. The figures are the median step time of each run (torch_e2e's), and the
application process's CPU a step; medians over the repeats. As the machine's load drifts between rounds, a ratio
is also taken within each round (traced over untraced, run next to each other), and its median over the rounds
given beside; the 1-minute load average is read at each run. --before TREE (a checkout of other code, e.g.
`git archive COMMIT | tar -x -C TREE`) adds that code's untraced and traced runs to the same rounds: a
venv made here imports it (a folder of links to TREE's packages) and this venv's dependencies, client,
core and server alike.

Recorder (with torch): the client's own share, without the machine's noise. The last traced run of each workload
is replayed through client/trace.py's Recorder, event by event in the order the connection reported them (each
message's lane records as one take with their stamps, its calls, its sending, its answer, the server's times and
GPU operations), on this process's thread CPU clock: what the reports cost the application's path, and what
writing costs while a synchronous call waits (catch_up). With --before, TREE's Recorder is replayed alike.
"""

from __future__ import annotations

import argparse
import importlib.util
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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from toolchain import nvcc_lib_dir, nvcc_path  # noqa: E402

from xpuremote.interpose.build import ensure_shim  # noqa: E402
from xpuremote.interpose.run import child_env  # noqa: E402
from xpuremote.protocol import abi, trace  # noqa: E402
from xpuremote.protocol.calls import CALLS, SYMBOLS  # noqa: E402
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
    return {"step_ms": statistics.median(result["steps_s"]) * 1e3, "cpu_ms": result["cpu_ms"],
            "server_cpu_ms": result["server_cpu_ms"], "load": os.getloadavg()[0]}


def replay_events(t: trace.Trace) -> list[tuple[str, tuple[object, ...]]]:
    """The reports a recorder had of `t`'s session, in order: (method, arguments), `wait` where a synchronous call
    began to wait for its answer."""
    by_seq: dict[int, list[trace.Call]] = {}
    for c in t.calls:
        by_seq.setdefault(c.seq, []).append(c)
    ops = {name: i for i, name in enumerate(SYMBOLS)}
    events: list[tuple[str, tuple[object, ...]]] = []
    for m in sorted(t.messages, key=lambda m: m.seq):
        calls = by_seq.get(m.seq, [])
        lanes: dict[int, list[trace.Call]] = {}
        for c in calls:
            if c.lane:
                lanes.setdefault(c.pos, []).append(c)
        for pos, taken in lanes.items():
            stamps = b"".join(abi.LANE_STAMP.pack(c.ret, c.stream, CALLS[c.name].opcode if c.name in CALLS else 0,
                                                  c.ret - c.entry, ops.get(c.name, -1)) for c in taken)
            events.append(("lane", (m.seq, pos, b"", stamps, len(taken))))
        own = [c for c in calls if not c.lane and c.name in CALLS]
        for c in own:
            events.append(("queued", (m.seq, c.pos)))
        items = len(m.per_call) if m.per_call is not None else len(lanes) + len(own)
        events.append(("sent", (m.seq, m.kind, m.sent, m.up, m.n, items)))
        if m.kind == "sync":
            events.append(("wait", ()))
        for c in own:
            events.append(("call", (CALLS[c.name], c.stream)))
        if m.kind != "async":
            events.append(("answered", (m.seq, m.wait, m.down)))
        if m.server is not None:
            events.append(("timed", ([[m.seq, m.server, m.per_call]],)))
        if m.gpu_ops:
            events.append(("gpu_timed", ([[m.seq, [v for o in m.gpu_ops for v in (o.pos, trace.GPU_OPS_NAMES.index(o.op)
                                                                               if isinstance(o.op, str) else o.op,
                                                                               o.a, o.b)]]],)))
    return events


def replay(recorder_class: type, events: list[tuple[str, tuple[object, ...]]], path: Path) -> dict[str, float]:
    """Thread CPU ns of a recorder's reports on the path and of its catch-ups at the waits, over `events`."""
    recorder = recorder_class(str(path), {})
    clock, on_path, waiting = time.thread_time_ns, 0, 0
    catch_up = getattr(recorder, "catch_up", None)
    for method, args in events:
        began = clock()
        if method == "wait":
            if catch_up is not None:
                catch_up()
            waiting += clock() - began
            continue
        if method == "call":
            call, stream = args
            recorder.end(call, recorder.begin(), stream)
        else:
            getattr(recorder, method)(*args)
        on_path += clock() - began
    began = clock()
    recorder.close()
    return {"path_ns": on_path, "wait_ns": waiting, "close_ns": clock() - began}


def recorder_class(tree: Path | None) -> type:
    """client/trace.py's Recorder, this tree's or `tree`'s."""
    if tree is None:
        from xpuremote.client.trace import Recorder
        return Recorder
    spec = importlib.util.spec_from_file_location("before_client_trace", tree / "client" / "trace.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.Recorder


def measure_recorder(traces: dict[str, Path], repeats: int, tmp: Path, before: Path | None) -> list[dict[str, object]]:
    """Each trace replayed `repeats` times through each recorder, in turn; the medians per step."""
    classes = {"now": recorder_class(None), **({"before": recorder_class(before)} if before else {})}
    rows = []
    for workload, path in traces.items():
        t = trace.read(path)
        events = replay_events(t)
        row: dict[str, object] = {"workload": workload, "lane_records": sum(c.lane for c in t.calls),
                                  "messages": len(t.messages), "calls": len(t.calls), "events": len(events)}
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in classes}
        for _ in range(repeats):
            for name, cls in classes.items():
                samples[name].append(replay(cls, events, tmp / "replay.trace"))
        for name, runs in samples.items():
            row[name] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        rows.append(row)
    return rows


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
        (tmp / "torch.trace").replace(tmp / f"{workload}.trace")  # for the recorder's replay
        row: dict[str, object] = {"workload": workload, "steps": TORCH_STEPS, "repeats": repeats,
                                  "lane_calls": sum(c.lane for c in t.calls), "calls": len(t.calls)}
        for variant, samples in runs.items():
            row[variant] = {key: statistics.median(r[key] for r in samples)
                            for key in ("step_ms", "cpu_ms", "server_cpu_ms")}
            row[variant]["fast_ms"] = faster_mean([r["step_ms"] for r in samples])
            row[variant]["samples"] = samples
        row["paired"] = paired(runs, VARIANTS[1], VARIANTS[0])
        if before:
            row["before: paired"] = paired(runs, BEFORE[1], BEFORE[0])
        loads = [r["load"] for samples in runs.values() for r in samples]
        row["load"] = [min(loads), statistics.median(loads), max(loads)]
        rows.append(row)
    return rows


def paired(runs: dict[str, list[dict[str, float]]], traced: str, untraced: str) -> float:
    """The median over the rounds of each round's traced step over its untraced step."""
    return statistics.median(a["step_ms"] / b["step_ms"] for a, b in zip(runs[traced], runs[untraced]))


def markdown(rows: list[dict[str, object]], torch_rows: list[dict[str, object]], command: str,
             recorder_rows: list[dict[str, object]] = ()) -> str:
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
                  "runs; \"paired\": the median over the rounds of each round's traced/untraced. The server's CPU a "
                  "step is its worker's (clock ticks over the run's steps). \"lane closed\": XPU_LANE=0, as a trace "
                  "was recorded before the lane stayed open under one.",
                  "",
                  "| workload | untraced ms/step | traced | traced/untraced | paired | traced, lane closed | lane "
                  "closed/untraced | CPU ms/step untraced, traced, lane closed | server CPU ms/step untraced, traced | "
                  "lane records in the trace | load (min, median, max) |",
                  "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|"]
    for r in torch_rows:
        off, on, closed = (r[v] for v in VARIANTS)
        lines.append(f"| {r['workload']} | {_ms(off)} | {_ms(on)} | {_ratio(on, off)} | {r['paired']:.3f} | "
                     f"{_ms(closed)} | {_ratio(closed, off)} | {off['cpu_ms']:.2f}, {on['cpu_ms']:.2f}, "
                     f"{closed['cpu_ms']:.2f} | {off['server_cpu_ms']:.2f}, {on['server_cpu_ms']:.2f} | "
                     f"{r['lane_calls']} of {r['calls']} calls | {', '.join(f'{x:.1f}' for x in r['load'])} |")
    if torch_rows and BEFORE[0] in torch_rows[0]:
        lines += ["", "The code before (--before), in the same rounds:", "",
                  "| workload | before: untraced ms/step | before: traced | traced/untraced | paired | CPU ms/step "
                  "untraced, traced |", "|---|---:|---:|---:|---:|---|"]
        for r in torch_rows:
            off, on = (r[v] for v in BEFORE)
            lines.append(f"| {r['workload']} | {_ms(off)} | {_ms(on)} | {_ratio(on, off)} | "
                         f"{r['before: paired']:.3f} | {off['cpu_ms']:.2f}, {on['cpu_ms']:.2f} |")
    if recorder_rows:
        lines += ["", "The recorder alone: each workload's last traced run replayed through client/trace.py's Recorder "
                  "(thread CPU, median of the repeats): what its reports cost the application's path, what writing "
                  "cost while synchronous calls waited, and at the end; µs per lane record and message of the run "
                  "(its whole session, start-up included).", "",
                  "| workload | recorder | lane records, messages, calls | on the path, ms | during waits, ms | "
                  "at the end, ms | path µs a lane record + message |", "|---|---|---|---:|---:|---:|---:|"]
        for r in recorder_rows:
            for name in ("before", "now"):
                if name in r:
                    f = r[name]
                    lines.append(f"| {r['workload']} | {name} | {r['lane_records']}, {r['messages']}, {r['calls']} | "
                                 f"{f['path_ns'] / 1e6:.2f} | {f['wait_ns'] / 1e6:.2f} | {f['close_ns'] / 1e6:.2f} | "
                                 f"{f['path_ns'] / 1e3 / (r['lane_records'] + r['messages']):.2f} |")
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
    parser.add_argument("--parts", default="mixes,torch", help="mixes, torch, recorder (replays torch's traces)")
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with (torch part)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    os.environ.setdefault("XPU_SIM_KERNELS", str(ROOT / "examples/sim_kernels.py"))
    rows, torch_rows, recorder_rows = [], [], []
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
        if "recorder" in parts:  # the torch part's traces, or a folder's from an earlier run (XPU_REPLAY_TRACES)
            where = Path(os.environ.get("XPU_REPLAY_TRACES") or tmp)
            traces = {w: where / f"{w}.trace" for w in args.torch.split(",") if (where / f"{w}.trace").exists()}
            recorder_rows = measure_recorder(traces, args.repeats, Path(tmp), args.before)
    command = "python bench/trace_overhead.py " + " ".join(sys.argv[1:])
    text = markdown(rows, torch_rows, command, recorder_rows)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": command, "rows": rows, "torch": torch_rows,
                                              "recorder": recorder_rows}, indent=1))
        Path(args.out).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
