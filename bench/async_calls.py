"""Async calls through NVIDIA's libcudart: what each costs the application, the client and the server.

    python bench/async_calls.py [--out bench/results/async-calls.json] [--calls N] [--repeats R]
                                [--backend sim|cuda|stand-in]

A C program (`bench/async_calls.c`, compiled here) makes N `cudaMemsetAsync` calls of 256 bytes through
the libcudart 13 of the test extra, under the shim, then one `cudaStreamSynchronize`; against a sim
`xpu-server` on loopback started here. Three ways, interleaved over the repeats:

  lane      the shim queues each call in C (interpose/lane.h), the client core sends the records
  no lane   XPU_LANE=0: each call enters the client core's Python (the path before the lane)
  raw       the baseline: the same records, already encoded, sent by bare pyzmq to a ROUTER that only
            receives them (what the transport alone costs per call; no client, no server work)
  native    with `--backend cuda` (a machine with a GPU): the program on the real driver, no xpuremote
  lane, records in Python
            on the cuda backend, a second server with XPU_NATIVE_LANE=0: the worker runs each record in
            Python, where it otherwise runs them in C (server/native_lane.py)

`--backend stand-in` runs the cuda backend without a GPU: its libcuda is xpuremote's own shim (a stand-in,
named as such) chained to a sim server. Its worker's CPU then includes the stand-in's own client.

Figures per call: the application thread's CPU (libcudart and the shim's entry), the whole client process's
CPU (the core's threads too), the server worker's CPU (from /proc, around the calls only), and calls/s from
the first call to the end of the synchronize. Medians of the repeats.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from foundation import clean_env, publish, run_facts, start_server, start_stand_in, stop  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
LANE_BYTES = 256 << 10  # interpose/front.h's XPU_LANE_BYTES: the raw baseline's messages are a full lane's


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def worker_of(daemon: int) -> int:
    """The daemon's one worker process (a session is open)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == daemon:
                return int(entry.name)
    raise RuntimeError("no worker found")


def compile_program(tmp: Path) -> Path:
    exe = tmp / "async_calls"
    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-O2", str(HERE / "async_calls.c"), "-o", str(exe), "-ldl"], check=True)
    return exe


def shim_run(exe: Path, cudart: str, calls: int, shim: Path | None, address: str, daemon: int | None,
             lane: bool = True) -> dict[str, float]:
    """One run of the program: through the shim, or natively (`shim` None: the real driver, no server)."""
    env = clean_env()
    if shim is not None:
        env.update({"LD_PRELOAD": str(shim), "LD_LIBRARY_PATH": str(shim.parent), "XPU_SERVER": address,
                    "XPU_LANE": "1" if lane else "0"})
    proc = subprocess.Popen([str(exe), cudart, str(calls)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the program did not start (exit {proc.wait()})")
        worker = worker_of(daemon) if daemon is not None else None
        before = cpu_seconds(worker) if worker is not None else 0.0
        proc.stdin.write("go\n")
        proc.stdin.flush()
        issue, total, app, process = map(float, proc.stdout.readline().split())
        server = cpu_seconds(worker) - before if worker is not None else None
        proc.stdin.write("end\n")
        proc.stdin.flush()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    figures = {"calls_per_s": calls / total, "issue_ns": issue / calls * 1e9, "app_ns": app / calls * 1e9,
               "client_ns": process / calls * 1e9}
    if server is not None:
        figures["server_ns"] = server / calls * 1e9
    return figures


def raw_run(calls: int) -> dict[str, float]:
    """The same records' bytes through bare pyzmq, DEALER to a ROUTER that only receives them."""
    import zmq

    from xpuremote.protocol import abi
    from xpuremote.protocol.calls import CALLS

    record = abi.pack_lane_record(opcode=CALLS["cuMemsetD8Async"].opcode, nargs=4, blob_at=abi.LANE_NO_BLOB, ctx=1) \
        + struct.pack("<4Q", 1 << 40, 7, 256, 0)
    per_message = LANE_BYTES // len(record)
    message = record * per_message
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    messages = calls // per_message
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(messages):
        dealer.send(message)
        router.recv_multipart()
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    ctx.destroy(0)
    n = messages * per_message
    return {"calls_per_s": n / total, "client_ns": cpu / n * 1e9}


IN_PYTHON = "lane, records in Python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write JSON here and Markdown beside it")
    parser.add_argument("--backend", choices=["sim", "cuda", "stand-in"], default="sim",
                        help="the xpu-server's; cuda also runs the program natively (default sim)")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(HERE.parent / "tests"))
    from toolchain import cudart_path

    from xpuremote.interpose.build import ensure_shim

    cudart = cudart_path(13)
    if cudart is None:
        raise SystemExit("the CUDA 13 runtime wheel is not installed (pip install -e '.[test]')")
    shim = ensure_shim()
    cuda = args.backend in ("cuda", "stand-in")
    samples: dict[str, list[dict[str, float]]] = {"lane": [], "no lane": [], "raw": []}
    if cuda:
        samples[IN_PYTHON] = []
    if args.backend == "cuda":
        samples["native"] = []
    servers = []
    with tempfile.TemporaryDirectory() as tmp:
        exe = compile_program(Path(tmp))
        try:
            env: dict[str, str] = {}
            if args.backend == "stand-in":
                sim, env = start_stand_in(Path(tmp) / "sim.log")
                servers.append(sim)
            backend = "cuda" if cuda else "sim"
            server, address = start_server(Path(tmp) / "server.log", backend, env=env)
            servers.append(server)
            if cuda:
                python_server, python_address = start_server(Path(tmp) / "python.log", backend,
                                                              env={**env, "XPU_NATIVE_LANE": "0"})
                servers.append(python_server)
            for _ in range(args.repeats):
                samples["lane"].append(shim_run(exe, cudart, args.calls, shim, address, server.pid, True))
                if cuda:
                    samples[IN_PYTHON].append(shim_run(exe, cudart, args.calls, shim, python_address,
                                                       python_server.pid, True))
                samples["no lane"].append(shim_run(exe, cudart, args.calls // 4, shim, address, server.pid, False))
                samples["raw"].append(raw_run(args.calls))
                if "native" in samples:
                    samples["native"].append(shim_run(exe, cudart, args.calls, None, "", None))
        finally:
            for server in servers:
                stop(server)
    rows = {way: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for way, runs in samples.items()}
    result = {"calls": args.calls, "repeats": args.repeats, "rows": rows, "backend": args.backend,
              **run_facts("async_calls.py", argv)}
    publish(args.out, result, markdown(result))
    return 0


def markdown(result: dict[str, Any]) -> str:
    backend = result.get("backend", "sim")
    command = result.get("command", "python bench/async_calls.py --out bench/results/async-calls.json")
    head = ("# Async calls through libcudart: application, client and server CPU per call\n\n"
            f"`{command}`\n\n"
            f"Python {result['python']}, cudaMemsetAsync of 256 B x {result['calls']:,} (no lane: a quarter as many), "
            f"{backend} server on loopback, medians of {result['repeats']} interleaved runs; "
            "load average after "
            f"{[round(x, 2) for x in result['load']]}.\n\n"
            "| way | calls/s | app thread ns/call | client process ns/call | server worker ns/call |\n"
            "|---|---:|---:|---:|---:|\n")
    lines = []
    for way, r in result["rows"].items():
        cells = [f"{r['calls_per_s']:,.0f}"] + [f"{r[k]:,.0f}" if k in r else "-" for k in
                                                 ("app_ns", "client_ns", "server_ns")]
        lines.append(f"| {way} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
