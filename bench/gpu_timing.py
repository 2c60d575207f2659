"""What recording the GPU's part of a trace costs (server/gpu_timer.py): a traced run with it (the default) and
without it (XPU_TRACE_GPU=0), side by side in the same rounds.

    python bench/gpu_timing.py [--backend sim|cuda] [--repeats 9] [--out bench/results/gpu-timing.json]

Builds examples/workloads.cu with nvcc, starts its own xpu-server, and runs the launch-bound mix (16 launches and a
memset per synchronisation: 17 timed records, most of them lane records) and the round-trip-bound mix (a kernel
and two synchronous copies per iteration), alternating the two settings. Two figures per record the timer sees
(each kernel, copy and memset, and each synchronizing call):

- the worker's time on it: the server's time on the run's messages (from the trace: read to answered), summed,
  divided by the records; its difference between the settings is the timer's cost on the server;
- the run's own time: the program's timing of its loop (steady_clock), divided by the records.

The mean of the faster two thirds of the repeats (a loaded machine only ever slows a run down). On the cuda
backend the timer records two events per record and moves the lane's records it times from C into Python (the C
side cannot put events around a record): both are in the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_overhead import ROOT, build, faster_mean  # noqa: E402

from xpuremote.interpose.build import ensure_shim  # noqa: E402
from xpuremote.interpose.run import child_env  # noqa: E402
from xpuremote.protocol import trace  # noqa: E402
from xpuremote.protocol.local_server import start_local_server  # noqa: E402

MIXES = (("async", 1000), ("sync", 1000))
SETTINGS = (("off", "0"), ("on", "1"))  # XPU_TRACE_GPU


def timed_records(t: trace.Trace) -> int:
    """The records the GPU timer saw in a run with it on: its work and its synchronizing calls."""
    return sum(len(m.gpu_ops) for m in t.messages)


def one_run(exe: Path, mix: str, iters: int, env: dict[str, str], path: Path) -> tuple[float, float, trace.Trace]:
    """(the loop's seconds, the server's seconds on the run's messages, the trace)."""
    done = subprocess.run([str(exe), mix, str(iters)], env=dict(env, XPU_TRACE=str(path)), capture_output=True,
                          text=True)
    found = re.search(r": ([0-9.]+) s", done.stdout)
    if done.returncode or not found:
        raise SystemExit(f"workloads {mix} failed ({done.returncode}): {done.stderr[-2000:]}")
    loop_s = float(found.group(1))
    t = trace.read(path)
    return loop_s, sum(m.server or 0 for m in t.messages) / 1e9, t


def measure(exe: Path, server: str, repeats: int, tmp: Path) -> list[dict[str, object]]:
    base = child_env(str(ensure_shim().parent), server)
    rows = []
    for mix, iters in MIXES:
        loops: dict[str, list[float]] = {"off": [], "on": []}
        servers: dict[str, list[float]] = {"off": [], "on": []}
        records = 0
        for i in range(repeats):  # alternated: drift in the machine's load hits both alike
            for label, value in SETTINGS if i % 2 == 0 else SETTINGS[::-1]:
                loop_s, server_s, t = one_run(exe, mix, iters, dict(base, XPU_TRACE_GPU=value), tmp / f"{label}.trace")
                loops[label].append(loop_s)
                servers[label].append(server_s)
                if label == "on":
                    records = timed_records(t)
        per = {f"{what}_{label}_us": faster_mean(values[label]) / records * 1e6
               for what, values in (("server", servers), ("loop", loops)) for label in loops}
        rows.append({"mix": mix, "iterations": iters, "timed_records": records, **per,
                     "server_cost_us": per["server_on_us"] - per["server_off_us"],
                     "loop_cost_us": per["loop_on_us"] - per["loop_off_us"],
                     "samples": {"loop": loops, "server": servers}})
    return rows


def table(rows: list[dict[str, object]], backend: str) -> str:
    lines = [f"GPU timing's cost per timed record, {backend} backend (the faster two thirds' mean; µs)",
             f"{'mix':<6} {'records':>8} {'server off':>11} {'server on':>10} {'cost':>7} "
             f"{'loop off':>9} {'loop on':>8} {'cost':>7}"]
    for r in rows:
        lines.append(f"{r['mix']:<6} {r['timed_records']:>8} {r['server_off_us']:>11.2f} {r['server_on_us']:>10.2f} "
                     f"{r['server_cost_us']:>7.2f} {r['loop_off_us']:>9.2f} {r['loop_on_us']:>8.2f} "
                     f"{r['loop_cost_us']:>7.2f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="sim", choices=["sim", "cuda"])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", help="write the figures here (JSON)")
    args = p.parse_args()
    os.environ.setdefault("XPU_SIM_KERNELS", str(ROOT / "examples/sim_kernels.py"))  # the mixes' kernel on the sim
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        proc, address = start_local_server(args.backend)
        try:
            rows = measure(exe, address, args.repeats, Path(tmp))
        finally:
            proc.terminate()
            proc.wait()
    print(table(rows, args.backend))
    if args.out:
        Path(args.out).write_text(json.dumps({"backend": args.backend, "machine": platform.node(),
                                              "repeats": args.repeats, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
