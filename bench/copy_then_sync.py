"""A generation loop's wait, through xpu-run on the sim: each step queues work, copies a few bytes to pinned
memory (cuMemcpyDtoHAsync) and synchronizes, as a token of LLM generation does (`.item()` on the next token).

Printed beside the same loop without the copy (a synchronize alone: one round trip, the floor), over emulated
links of several RTTs, medians of `--repeats` runs of `--steps` steps each, the two interleaved:

    python bench/copy_then_sync.py [--rtt-us 0,500,2000] [--steps 150] [--repeats 3] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOP = """
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
def ck(rc, what):
    if rc:
        raise SystemExit(f"{what} failed: {rc}")
ck(cu.cuInit(0), "cuInit")
ctx = ctypes.c_void_p(); ck(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "retain")
ck(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
dev, host, stream = ctypes.c_uint64(), ctypes.c_void_p(), ctypes.c_void_p()
ck(cu.cuMemAlloc_v2(ctypes.byref(dev), 4096), "cuMemAlloc")
ck(cu.cuMemAllocHost_v2(ctypes.byref(host), 4096), "cuMemAllocHost")
ck(cu.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
copy, steps = sys.argv[1] == "copy", int(sys.argv[2])
for timed in (False, True):
    began = time.perf_counter()
    for i in range(steps):
        ck(cu.cuMemsetD8Async(dev, i & 255, 4096, stream), "cuMemsetD8Async")
        if copy:
            ck(cu.cuMemcpyDtoHAsync_v2(host, dev, 8, stream), "cuMemcpyDtoHAsync")
        ck(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
        if copy and ctypes.cast(host, ctypes.POINTER(ctypes.c_uint8))[0] != i & 255:
            raise SystemExit("the copy's bytes were not there after the synchronize")
print((time.perf_counter() - began) / steps * 1e6)
"""


def step_us(kind: str, rtt_us: float, steps: int, script: Path) -> float:
    env = {**os.environ, "XPU_LINK_RTT_US": str(rtt_us)}
    env.pop("XPU_SERVER", None)
    out = subprocess.run([sys.executable, "-m", "xpuremote.interpose.run", "--backend", "sim", "--",
                          sys.executable, str(script), kind, str(steps)],
                         env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"the {kind} loop failed: {out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-us", default="0,500,2000")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(LOOP)
        for rtt in (float(r) for r in args.rtt_us.split(",")):
            runs: dict[str, list[float]] = {"sync": [], "copy": []}
            for _ in range(args.repeats):
                for kind in runs:
                    runs[kind].append(step_us(kind, rtt, args.steps, script))
            sync, copy = statistics.median(runs["sync"]), statistics.median(runs["copy"])
            extra = f"{(copy - sync) / rtt:.2f}" if rtt else ""
            rows.append(f"| {rtt:g} | {sync:.0f} | {copy:.0f} | {copy / sync:.2f}x | {extra} |")
    load = os.getloadavg()
    text = "\n".join([
        f"# A copy to pinned memory, then a synchronize ({time.strftime('%Y-%m-%d %H:%M')}, sim backend)",
        "",
        f"`python bench/copy_then_sync.py --rtt-us {args.rtt_us} --steps {args.steps} --repeats {args.repeats}`;"
        f" load average at the end {load[0]:.1f}. µs a step, medians of {args.repeats} runs.",
        "",
        "| emulated RTT µs | synchronize alone (the floor) | copy, then synchronize | ratio | extra RTTs |",
        "|---:|---:|---:|---:|---:|",
        *rows,
    ])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
