"""CUDA graphs through xpuremote: a step of K small operations issued one by one, and the same step
captured once and replayed as a graph.

    python bench/graphs.py [--out bench/results/graphs-sim.json] [--ops 10,100,1000] [--steps 200]
                           [--backend sim|cuda]

The step: K 256-byte cuMemsetD32Async on one stream, then cuStreamSynchronize. Eager issues the K
calls each step; graph captures them once (cuStreamBeginCapture .. cuStreamEndCapture,
cuGraphInstantiate) and then launches the graph each step. An agent process does both through
cuda-python under `xpu-run` against a private `xpu-server` on loopback, and, when a GPU is at hand
(--backend cuda), natively beside it. The baseline from the same run: bare pyzmq + msgpack against
an echo server, the wire shape of each step (K calls batched as the client batches them, or one call,
then one round trip). Medians of --steps steps after 10 warm-up steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import RawAgent, clean_env, machine, start_echo_server, start_server, stop  # noqa: E402

from xpuremote.protocol.calls import CALLS  # noqa: E402

AGENT = r"""
import json, statistics, sys, time
from cuda.bindings import driver as cu

def ok(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"{err!r}")
    return values[0] if len(values) == 1 else values

ops, steps = [int(v) for v in sys.argv[1].split(",")], int(sys.argv[2])
ok(cu.cuInit(0))
ctx = ok(cu.cuDevicePrimaryCtxRetain(ok(cu.cuDeviceGet(0))))
ok(cu.cuCtxSetCurrent(ctx))
stream = ok(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING))
buffers = [ok(cu.cuMemAlloc(256)) for _ in range(max(ops))]

def issue(k):
    for i in range(k):
        ok(cu.cuMemsetD32Async(buffers[i], i, 64, stream))

def timed(step):
    times = []
    for n in range(10 + steps):
        t0 = time.perf_counter()
        step()
        ok(cu.cuStreamSynchronize(stream))
        if n >= 10:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6

out = {}
for k in ops:
    ok(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    issue(k)
    graph = ok(cu.cuStreamEndCapture(stream))
    t0 = time.perf_counter()
    graph_exec = ok(cu.cuGraphInstantiate(graph, 0))
    instantiate = (time.perf_counter() - t0) * 1e6
    out[k] = {"eager_us": timed(lambda: issue(k)), "graph_us": timed(lambda: ok(cu.cuGraphLaunch(graph_exec, stream))),
              "instantiate_us": instantiate}
    ok(cu.cuGraphExecDestroy(graph_exec))
    ok(cu.cuGraphDestroy(graph))
print("@@ " + json.dumps(out))
"""


def run_agent(ops: list[int], steps: int, server: str | None) -> dict[str, Any]:
    """The agent's figures, through xpuremote (server given) or natively."""
    argv = [sys.executable, "-c", AGENT, ",".join(map(str, ops)), str(steps)]
    if server:
        argv = [sys.executable, "-m", "xpuremote.interpose.run", "--server", server, "--", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, env=clean_env(), timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@ ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"the agent failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(lines[-1][3:]).items()}


def raw_baseline(ops: list[int], steps: int) -> dict[int, dict[str, float]]:
    """Bare pyzmq + msgpack, the same wire shape: K memsets batched then a round trip; one call then one."""
    echo, endpoint = start_echo_server()
    raw = None
    launch = [CALLS["cuGraphLaunch"].opcode, [0x7C00_0000_1000, 0x7C00_0000_2000]]
    try:
        raw = RawAgent(endpoint, 256)
        out = {}
        for k in ops:
            eager = [raw.async_batched(k) for _ in range(steps)]
            graph = [raw.batched(1, launch) for _ in range(steps)]
            out[k] = {"eager_us": statistics.median(eager) * 1e6, "graph_us": statistics.median(graph) * 1e6}
        return out
    finally:  # the echo server goes whatever failed: left behind, it would hold the caller's output open
        if raw is not None:
            raw.close()
        stop(echo)


def table(results: dict[str, Any]) -> str:
    native = results.get("native") or {}
    rows = ["| K ops | mode | xpuremote µs/step | raw ZeroMQ µs/step | native µs/step | xpuremote / native |",
            "|---|---|---|---|---|---|"]
    for k, remote in results["xpuremote"].items():
        for mode in ("eager", "graph"):
            mine, raw = remote[f"{mode}_us"], results["raw"][k][f"{mode}_us"]
            base = native.get(k, {}).get(f"{mode}_us")
            ratio = f"{mine / base:.1f}x" if base else "-"
            rows.append(f"| {k} | {mode} | {mine:.0f} | {raw:.0f} | {f'{base:.0f}' if base else '-'} | {ratio} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="a .json file; the Markdown table goes beside it")
    parser.add_argument("--ops", default="10,100,1000", help="operations per step, comma-separated")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--backend", choices=("sim", "cuda"), default="sim", help="the private server's")
    args = parser.parse_args(argv)
    ops = [int(v) for v in args.ops.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        server, address = start_server(Path(tmp) / "server.log", args.backend)
        try:
            remote = run_agent(ops, args.steps, address)
        finally:
            stop(server)
    results = {"command": " ".join(["python bench/graphs.py", *(argv or sys.argv[1:])]),
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(), "backend": args.backend,
               "xpuremote": remote, "raw": raw_baseline(ops, args.steps),
               "native": run_agent(ops, args.steps, None) if args.backend == "cuda" else None}
    text = table(results)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
        Path(args.out).with_suffix(".md").write_text(
            f"# CUDA graphs through xpuremote ({results['date']})\n\nCommand: `{results['command']}`; "
            f"server backend {args.backend}; medians of {args.steps} steps.\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
