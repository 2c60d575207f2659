"""What recording a trace (XPU_TRACE) costs: the same program with tracing off and on, same run.

    python bench/trace_overhead.py [--out bench/results/trace-overhead.json] [--repeats 7]

Builds examples/workloads.cu with nvcc, starts its own `xpu-server --backend sim`, and runs
the launch-bound mix (17 async calls and one sync call per iteration) and the round-trip-bound
mix, alternating tracing off and on. The figure is the program's own timing of its loop
(steady_clock, printed by the program), so start-up and the trace's closing are outside it.
Medians over the repeats; the trace's size per recorded call comes from the last traced run.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from toolchain import nvcc_lib_dir, nvcc_path  # noqa: E402

from xpuremote.interpose.build import ensure_shim  # noqa: E402
from xpuremote.interpose.run import child_env  # noqa: E402
from xpuremote.protocol import trace  # noqa: E402
from xpuremote.protocol.local_server import start_local_server  # noqa: E402

MIXES = (("async", 2000), ("sync", 2000))


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


def markdown(rows: list[dict[str, object]], command: str) -> str:
    lines = ["# Trace recording overhead (sim backend)", "", f"Command: `{command}`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}", "",
             "| mix | calls | tracing off (s) | tracing on (s) | overhead | per call | trace size |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mix']} x{r['iterations']} | {r['calls']} | {r['off_s']:.3f} | {r['on_s']:.3f} | "
                     f"{r['overhead']:+.1%} | {r['per_call_us']:.2f} µs | {r['trace_bytes'] / 1024:.1f} KiB "
                     f"({r['bytes_per_call']:.1f} B/call) |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write JSON here and Markdown beside it")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("XPU_SIM_KERNELS", str(ROOT / "examples/sim_kernels.py"))
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        proc, server = start_local_server("sim")
        try:
            rows = measure(exe, server, args.repeats, Path(tmp))
        finally:
            proc.terminate()
            proc.wait(10)
    command = "python bench/trace_overhead.py " + " ".join(sys.argv[1:])
    text = markdown(rows, command)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": command, "rows": rows}, indent=1))
        Path(args.out).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
