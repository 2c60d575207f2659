"""What the link emulation (protocol/link.py) costs: the same programs plain and over an emulated link that adds
nothing (XPU_LINK_RTT_US=0, no rate limit), in the same rounds.

    python bench/link_emulation.py [--out bench/results/link-emulation.json] [--repeats 7]
                                   [--torch mlp_train,gpt2_step_bf16] [--parts torch,loop,unit] [--before TREE]

torch: each bench/torch_e2e.py workload at --size small on the sim (XPU_SIM_SKIP_KERNELS=1), plain and emulated,
in a shuffled order each round: the median step of each run (torch_e2e's) and the application process's CPU a
step, then the median of the runs and the mean of their faster two thirds. Each run has a
server of its own, whose log says what the session was: calls from the fast lane, messages on the data
connection, and (emulated) the messages the link held on each channel.

loop: a small-call loop under the shim (ctypes, as a C program calls the driver): `cuCtxSynchronize` alone (a
round trip on the data connection), and 16 `cuMemsetD8Async` of 256 B (queued in C, the fast lane) then one
`cuCtxSynchronize`. Wall time an iteration, and the client's and the worker's CPU (this run's worker: the child
of its daemon); the emulation's CPU a round trip at each end is the emulated runs' CPU less the plain runs'.

unit: the emulation's own code in one process, a message at a time: the sender's stamp and the receiver's hold
of a message that is already due (what a link of 0 µs adds to each message at each end).

--before TREE (a checkout of other code, e.g. `git archive COMMIT | tar -x -C TREE`) adds that code's plain and
emulated runs to the same rounds (bench/trace_overhead.py's venv of links to TREE's packages).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from trace_overhead import faster_mean, python_of  # noqa: E402

from xpuremote.protocol import wire  # noqa: E402
from xpuremote.protocol.link import DATA, LinkSpec, Wire  # noqa: E402
from xpuremote.protocol.local_server import free_port  # noqa: E402

TORCH_PYTHON = Path(os.environ.get("XPU_TORCH_PYTHON") or ROOT / ".venv-torch" / "bin" / "python")
TORCH_STEPS, TORCH_WARMUP = 40, 3
LOOP_SYNC, LOOP_ASYNC, LOOP_BATCH = 4000, 1000, 16
LINKS = {"plain": {}, "emulated 0 µs": {"XPU_LINK_RTT_US": "0"}}
ENDED = re.compile(r"ended: (\d+) calls \((\d+) from the fast lane, in (\d+) lanes\).*?(\d+) bytes on the data "
                   r"connection, (\d+) messages there")
HELD = re.compile(r"emulated link held (\d+) messages from ZeroMQ and (\d+) from the data connection")

LOOP = r"""
import ctypes, json, os, sys, time
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
def check(r, what):
    if r:
        raise SystemExit(f"{what} failed: {r}")
DAEMON = os.environ["XPU_BENCH_DAEMON"]
def worker_cpu():  # this session's worker: the one child of this run's daemon (others' may run beside)
    total = 0.0
    for proc in os.listdir("/proc"):
        try:
            if proc.isdigit():
                fields = open(f"/proc/{proc}/stat").read().rsplit(")", 1)[1].split()
                if fields[1] == DAEMON:
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total
check(cu.cuInit(0), "cuInit")
dev, ctx, ptr = c_int(), c_void_p(), c_uint64()
check(cu.cuDeviceGet(byref(dev), 0), "cuDeviceGet")
check(cu.cuDevicePrimaryCtxRetain(byref(ctx), dev), "cuDevicePrimaryCtxRetain")
check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
check(cu.cuMemAlloc_v2(byref(ptr), c_size_t(4096)), "cuMemAlloc")
def sync(n):
    for _ in range(n):
        cu.cuCtxSynchronize()
def batched(n):
    for _ in range(n):
        for _ in range(__BATCH__):
            cu.cuMemsetD8Async(ptr, 0, c_size_t(256), None)
        cu.cuCtxSynchronize()
out = {}
for name, loop, n in (("sync", sync, __SYNC__), ("async", batched, __ASYNC__)):
    loop(n // 10)
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    wall, cpu, worker = time.perf_counter(), time.process_time(), worker_cpu()
    loop(n)
    out[name] = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                 "worker_s": worker_cpu() - worker, "iterations": n}
print(json.dumps(out), flush=True)
""".replace("__BATCH__", str(LOOP_BATCH)).replace("__SYNC__", str(LOOP_SYNC)).replace("__ASYNC__", str(LOOP_ASYNC))


class Server:
    """A sim xpu-server of `python`'s code on a free loopback port, its log in a file: one per run, so that its
    log's lines are that run's session's."""

    def __init__(self, python: str, log: Path) -> None:
        self.address, self.log = f"tcp://127.0.0.1:{free_port()}", log
        env = {**os.environ, "XPU_LOG": "INFO"}
        env.pop("LD_PRELOAD", None)
        with open(log, "w") as out:
            self.proc = subprocess.Popen([python, "-m", "xpuremote.server.daemon", "--listen", self.address,
                                          "--backend", "sim"], stderr=out, env=env)
        deadline = time.monotonic() + 30
        while "ready" not in log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"xpu-server did not start:\n{log.read_text()}")
            time.sleep(0.05)

    def session(self) -> dict[str, int] | None:
        """What the log says of the session that ran (its end waited for, a few seconds at most); the server
        stops."""
        deadline = time.monotonic() + 10
        while not (ended := ENDED.search(self.log.read_text())) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.proc.terminate()
        self.proc.wait(10)
        text = self.log.read_text()
        ended, held = ENDED.search(text), HELD.search(text)
        if not ended:
            return None
        found = dict(zip(("calls", "lane_calls", "lanes", "data_bytes", "data_messages"), map(int, ended.groups())))
        if held:
            found |= {"held_zmq": int(held[1]), "held_data": int(held[2])}
        return found


def run_under(python: str, command: list[str], env: dict[str, str], log: Path) -> tuple[dict[str, Any], dict]:
    """`command` under xpu-run of `python`'s code against a server of its own: its last JSON line, and what the
    server's log says of the session."""
    server = Server(python, log)
    try:
        done = subprocess.run([python, "-m", "xpuremote.interpose.run", "--server", server.address, "--", *command],
                              env={**env, "XPU_BENCH_DAEMON": str(server.proc.pid)}, capture_output=True, text=True,
                              timeout=600)
    finally:
        session = server.session()
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"{' '.join(command[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
    if session is None:
        raise SystemExit(f"the session's end is not in the server's log:\n{log.read_text()[-2000:]}")
    return json.loads(lines[-1]), session


def variants(before: str | None) -> dict[str, tuple[str, dict[str, str]]]:
    """Each variant's interpreter (whose xpuremote runs client and server) and link settings."""
    found = {name: (sys.executable, env) for name, env in LINKS.items()}
    if before:
        found |= {f"before: {name}": (before, env) for name, env in LINKS.items()}
    return found


def rounds(kinds: dict[str, tuple[str, dict[str, str]]], repeats: int, one: Any) -> dict[str, list[Any]]:
    """`one(python, env)` for each variant, `repeats` times, in a shuffled order each time: drift in the machine's
    load hits all alike."""
    runs: dict[str, list[Any]] = {v: [] for v in kinds}
    for _ in range(repeats):
        for name in random.sample(list(kinds), len(kinds)):
            python, link = kinds[name]
            base = {k: v for k, v in os.environ.items() if not k.startswith("XPU_LINK_")}
            runs[name].append(one(python, {**base, **link}))
    return runs


def torch_step(workload: str, tmp: Path) -> Any:
    """A run of `workload` by an interpreter in an environment: its median step, CPU a step and session."""
    command = [str(TORCH_PYTHON), str(ROOT / "bench" / "torch_e2e.py"), "--run", workload, "--size", "small",
               "--steps", str(TORCH_STEPS), "--warmup", str(TORCH_WARMUP)]

    def one(python: str, env: dict[str, str]) -> dict[str, Any]:
        result, session = run_under(python, command, env, tmp / "server.log")
        return {"step_ms": statistics.median(result["steps_s"]) * 1e3, "cpu_ms": result["cpu_ms"], "session": session}
    return one


def measure_torch(workloads: list[str], repeats: int, tmp: Path, before: str | None) -> list[dict[str, Any]]:
    rows = []
    for workload in workloads:
        runs = rounds(variants(before), repeats, torch_step(workload, tmp))
        row: dict[str, Any] = {"workload": workload, "steps": TORCH_STEPS, "repeats": repeats}
        for name, samples in runs.items():
            row[name] = {key: statistics.median(s[key] for s in samples) for key in ("step_ms", "cpu_ms")}
            row[name]["fast_ms"] = faster_mean([s["step_ms"] for s in samples])
            row[name]["session"] = samples[-1]["session"]
            row[name]["samples"] = samples
        rows.append(row)
    return rows


def measure_loop(repeats: int, tmp: Path, before: str | None) -> dict[str, Any]:
    def one(python: str, env: dict[str, str]) -> dict[str, Any]:
        result, session = run_under(python, [python, "-c", LOOP], env, tmp / "server.log")
        return {**result, "session": session}

    runs = rounds(variants(before), repeats, one)
    table: dict[str, Any] = {}
    for name, samples in runs.items():
        table[name] = {kind: {f"{key}_us": statistics.median(s[kind][key] / s[kind]["iterations"] * 1e6
                                                             for s in samples)
                              for key in ("wall_s", "cpu_s", "worker_s")} for kind in ("sync", "async")}
        for kind in ("sync", "async"):
            table[name][kind]["fast_wall_us"] = faster_mean([s[kind]["wall_s"] / s[kind]["iterations"] * 1e6
                                                             for s in samples])
        table[name]["session"] = samples[-1]["session"]
        table[name]["samples"] = samples
    session = table["emulated 0 µs"]["session"]
    iterations = LOOP_SYNC * 1.1 + LOOP_ASYNC * 1.1  # the warm-up's tenth too
    table["messages_per_iteration"] = (session.get("held_zmq", 0) + session.get("held_data", 0)) / iterations
    return table


def measure_unit(n: int = 200_000) -> dict[str, float]:
    """ns of the emulation's code a message: the sender's stamp (its send time in the header, and the header's
    bytes more to pack), the receiver's idle mark and hold of a message already due."""
    header: dict[str, Any] = {"op": "calls", "seq": 1, "calls": [[1, [0, 0]]], "reply": True}
    began = time.perf_counter_ns()
    for _ in range(n):
        wire.encode(header)
    plain = time.perf_counter_ns() - began
    began = time.perf_counter_ns()
    for _ in range(n):
        header["sent"] = time.monotonic_ns()
        wire.encode(header)
    stamped = time.perf_counter_ns() - began
    link = Wire(LinkSpec(on=True))
    began = time.perf_counter_ns()
    for _ in range(n):
        link.waiting()
        link.hold(time.monotonic_ns(), 200, DATA)
    held = time.perf_counter_ns() - began
    return {"stamp_ns": (stamped - plain) / n, "hold_ns": held / n}


def markdown(result: dict[str, Any], command: str) -> str:
    lines = ["# The link emulation's cost (sim backend)", "", f"Command: `{command}`", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}", ""]
    names = [n for n in variants("before" if result["before"] else None)]
    if result["torch"]:
        first = result["torch"][0]
        lines += [f"PyTorch, `torch_e2e.py --size small`, XPU_SIM_SKIP_KERNELS=1: the median ms a step of each run "
                  f"({first['steps']} steps after {TORCH_WARMUP}), the median of {first['repeats']} runs, in "
                  "brackets the mean of the faster two thirds; CPU ms a step of the application process (the "
                  "client's threads included), median; the session of the last run as its server's log says it "
                  "(the workers' CPU is the loop's: torch_e2e's sums every worker on the machine).", "",
                  "| workload | variant | ms a step | / plain | CPU ms a step | calls from the lane, "
                  "lanes | data connection messages | messages the link held (ZeroMQ, data) |",
                  "|---|---|---:|---:|---|---|---:|---|"]
        for row in result["torch"]:
            for name in names:
                v, s = row[name], row[name]["session"]
                base = row["before: plain" if name.startswith("before") else "plain"]
                held = f"{s['held_zmq']}, {s['held_data']}" if "held_zmq" in s else "-"
                lines.append(f"| {row['workload']} | {name} | {v['step_ms']:.2f} ({v['fast_ms']:.2f}) | "
                             f"{v['step_ms'] / base['step_ms']:.3f} ({v['fast_ms'] / base['fast_ms']:.3f}) | "
                             f"{v['cpu_ms']:.2f} | {s['lane_calls']}, {s['lanes']} | "
                             f"{s['data_messages']} | {held} |")
    if result["loop"]:
        loop = result["loop"]
        lines += ["", f"Small-call loop under the shim: `cuCtxSynchronize` x {LOOP_SYNC} (sync), and "
                  f"{LOOP_BATCH} `cuMemsetD8Async` then `cuCtxSynchronize` x {LOOP_ASYNC} (async); µs an "
                  "iteration, medians of the runs (wall in brackets: the faster two thirds' mean); "
                  f"{loop['messages_per_iteration']:.2f} messages an iteration (both loops, as the emulated link "
                  "held them).", "",
                  "| variant | sync wall | sync CPU client, worker | async wall | async CPU client, worker |",
                  "|---|---:|---|---:|---|"]
        for name in names:
            v = loop[name]
            lines.append(f"| {name} | {v['sync']['wall_s_us']:.1f} ({v['sync']['fast_wall_us']:.1f}) | "
                         f"{v['sync']['cpu_s_us']:.1f}, {v['sync']['worker_s_us']:.1f} | "
                         f"{v['async']['wall_s_us']:.1f} ({v['async']['fast_wall_us']:.1f}) | "
                         f"{v['async']['cpu_s_us']:.1f}, {v['async']['worker_s_us']:.1f} |")
        plain, emulated = loop["plain"]["sync"], loop["emulated 0 µs"]["sync"]
        lines += ["", f"The sync loop's one message each way an iteration: the emulation's CPU a round trip "
                  f"{emulated['cpu_s_us'] - plain['cpu_s_us']:+.1f} µs at the client, "
                  f"{emulated['worker_s_us'] - plain['worker_s_us']:+.1f} µs at the worker (medians' difference; "
                  "the worker's CPU is read in clock ticks)."]
    if result["unit"]:
        unit = result["unit"]
        lines += ["", f"The emulation's code a message, in one process: the sender's stamp {unit['stamp_ns']:.0f} ns, "
                  f"the receiver's idle mark and hold of a message already due {unit['hold_ns']:.0f} ns."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write JSON here and Markdown beside it")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--torch", default="mlp_train,gpt2_step_bf16", help="torch_e2e workloads (--size small)")
    parser.add_argument("--parts", default="torch,loop,unit", help="any of torch, loop and unit")
    parser.add_argument("--before", type=Path, help="a checkout of the code to compare with")
    args = parser.parse_args()
    parts = args.parts.split(",")
    os.environ.setdefault("XPU_SIM_KERNELS", str(ROOT / "examples/sim_kernels.py"))
    os.environ["XPU_SIM_SKIP_KERNELS"] = "1"  # for the servers: the sim's numpy would be the step
    result: dict[str, Any] = {"torch": [], "loop": None, "unit": None, "before": str(args.before or "")}
    with tempfile.TemporaryDirectory() as tmp:
        before = python_of(args.before, Path(tmp)) if args.before else None
        if "unit" in parts:
            result["unit"] = measure_unit()
        if "loop" in parts:
            result["loop"] = measure_loop(args.repeats, Path(tmp), before)
        if "torch" in parts:
            result["torch"] = measure_torch(args.torch.split(","), args.repeats, Path(tmp), before)
    command = "python bench/link_emulation.py " + " ".join(sys.argv[1:])
    text = markdown(result, command)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": command, **result}, indent=1))
        Path(args.out).with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
