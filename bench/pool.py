"""The Ray pool's cost: lease latency and short-job throughput, against a fixed server.

    python bench/pool.py [--queued 50] [--jobs 24] [--out bench/results/pool.json]

On this machine (loopback): a Ray head and three sim servers of two devices each joined with
`xpu-server --pool`, and one plain sim server of two devices as the baseline. A job is a Python
program under xpu-run that initialises the driver, asks for its device, prints a line and exits
(or holds its device for `--hold` seconds). Measured, every row beside its baseline:
- lease latency: from starting xpu-run to the program's line; one job alone (median of 5), and
  each of `--queued` jobs started at once (6 GPUs: they wait their turn);
- throughput: `--jobs` short jobs started at once, jobs/s through the pool (which runs 6 at a time,
  one per GPU) and against the fixed server (all at once, crowding its two devices).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import foundation  # noqa: E402
from foundation import clean_env, free_port, stop  # noqa: E402

from xpuremote.server.pool import start_local_head  # noqa: E402

SERVERS, DEVICES = 3, 2
JOB = """
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
dev = ctypes.c_int()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
print("started", time.time(), flush=True)
time.sleep(float(sys.argv[1]))
"""


# 50 clients starting at once load a 2-core machine far past what the client's 10 s wait for its
# server's hello allows for
JOB_ENV = {**clean_env(), "XPU_CONNECT_TIMEOUT_S": "120"}


def start_server(tmp: Path, name: str, *args: str) -> tuple[subprocess.Popen, str]:
    """A sim server of DEVICES devices; one that joins the pool may take minutes on a loaded machine."""
    return foundation.start_server(tmp / f"{name}.log", "sim", args=args, env={"XPU_SIM_DEVICES": str(DEVICES)},
                                   timeout_s=180)


def jobs(how: list[str], n: int, hold_s: float) -> tuple[list[float], float]:
    """Start `n` jobs at once through `xpu-run how...`: each one's latency to its line, and the wall time."""
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "xpuremote.interpose.run", *how, "--", sys.executable, "-c",
                               JOB, str(hold_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=JOB_ENV) for _ in range(n)]
    latencies = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0 or not out.startswith("started"):
            raise RuntimeError(f"a job failed (exit {p.returncode}): {out!r}\n{err[-3000:]}")
        latencies.append(float(out.split()[1]) - t0)
    return latencies, time.time() - t0


def measure(pool: list[str], fixed: list[str], queued: int, n_jobs: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, how in (("pool", pool), ("fixed", fixed)):
        alone = [jobs(how, 1, 0)[0][0] for _ in range(5)]
        waves, _ = jobs(how, queued, 1.0)
        _, wall = jobs(how, n_jobs, 0)
        result[name] = {"alone_s": alone, "queued_s": waves, "throughput_jobs_s": n_jobs / wall}
    return result


def summary(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for label, key, fmt in (("lease latency, one job alone (median of 5), s", "alone_s", statistics.median),
                            ("latency of queued jobs started at once: median, s", "queued_s", statistics.median),
                            ("latency of queued jobs started at once: slowest, s", "queued_s", max)):
        rows.append((label, f"{fmt(result['pool'][key]):.2f}", f"{fmt(result['fixed'][key]):.2f}"))
    rows.append((f"short jobs started at once, jobs/s ({result['jobs']} jobs)",
                 f"{result['pool']['throughput_jobs_s']:.2f}", f"{result['fixed']['throughput_jobs_s']:.2f}"))
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = ["# The Ray pool: lease latency and short-job throughput", "",
             f"`{result['command']}` on {result['machine']}: a Ray head and {SERVERS} sim servers of {DEVICES} devices "
             f"(`xpu-server --pool`), against one fixed sim server of {DEVICES} devices (`xpu-run --server`).",
             f"{result['queued']} queued jobs each hold their device 1 s.", "",
             "| figure | pool | fixed server |", "|---|---:|---:|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in summary(result)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queued", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="xpu-pool-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        port, client_port = free_port(), free_port()
        head = start_local_head(port, client_port, tmp / "head.log")
        servers = []
        try:
            for i in range(SERVERS):  # one after the other (docs/pool.md)
                servers.append(start_server(tmp, f"pool-{i}", "--pool", f"127.0.0.1:{port}")[0])
            fixed, address = start_server(tmp, "fixed")
            servers.append(fixed)
            result = measure(["--pool", f"ray://127.0.0.1:{client_port}"], ["--server", address],
                             args.queued, args.jobs)
        finally:
            for proc in servers:
                stop(proc)
            stop(head)
    result.update(command="python bench/pool.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  machine=f"{os.cpu_count()} CPUs, {platform.python_implementation()} {platform.python_version()}",
                  queued=args.queued, jobs=args.jobs)
    print(markdown(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
        args.out.with_suffix(".md").write_text(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
