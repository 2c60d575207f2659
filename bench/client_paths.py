"""Which path should a driver call take from the application's thread? Measured side by side.

    python bench/client_paths.py [--out bench/results/client-paths.json] [--calls N] [--repeats R]

The client runs in the application's process, in a Python of its own (the client core, loaded
into a link-map namespace of its own: docs/design.md). The alternatives measured beside it: a
per-process helper reached through shared memory, and C entry points that encode the hot
asynchronous calls into a shared ring that Python drains. This compares, in one run, from a C
program (`bench/client_paths.c`, compiled here with the system's C compiler):

  shim C entry        cuGetProcAddress through the shim: answered in C, the floor of an entry point
  shim Python local   cuCtxGetFlags through the shim: the call into the client core's Python
  shim async          cuMemsetD8Async through the shim: queued in C (the fast lane)
  shim C answer       cuCtxGetDevice through the shim: answered in C from the core's table (answers.h)
  futex, C peer       a round trip to another process (shared page, futexes): the floor of a helper
  futex, Python peer  the same with a Python helper (ctypes futex calls): what a Python helper adds
  ring, Python peer   a 64-byte record enqueued in C, drained by Python: a C-encoded async call

Medians of --repeats runs. Needs no server of its own except for the shim rows, which start a
sim `xpu-server` on loopback.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
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
REQUEST, ANSWER, HEAD, TAIL, SLEEPING, RECORDS = 0, 64, 128, 192, 256, 320  # client_paths.c's shared_page
RING_SLOTS, RECORD = 4096, 64
FUTEX_WAIT, FUTEX_WAKE, SYS_FUTEX = 0, 1, 202  # x86-64
STOP = 0xFFFFFFFF


# ---- the Python peer (run as a child of the C program, the shared page on fd 3) ------------------
class Page:
    def __init__(self) -> None:
        self.map = mmap.mmap(3, RECORDS + RING_SLOTS * RECORD)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.u32 = {off: ctypes.c_uint32.from_buffer(self.map, off) for off in (REQUEST, ANSWER, SLEEPING)}
        self.u64 = {off: ctypes.c_uint64.from_buffer(self.map, off) for off in (HEAD, TAIL)}

    def wait(self, off: int, value: int) -> None:
        """Until the word at `off` differs from `value`: spin briefly, then sleep (GIL released)."""
        word = self.u32[off]
        for _ in range(200):
            if word.value != value:
                return
        while word.value == value:
            self.libc.syscall(SYS_FUTEX, ctypes.c_void_p(self.base + off), FUTEX_WAIT, value, None, None, 0)

    def wake(self, off: int) -> None:
        self.libc.syscall(SYS_FUTEX, ctypes.c_void_p(self.base + off), FUTEX_WAKE, 1, None, None, 0)


def futex_peer() -> None:
    page, seen = Page(), 0
    while True:
        page.wait(REQUEST, seen)
        seen = page.u32[REQUEST].value
        if seen == STOP:
            return
        page.u32[ANSWER].value = seen
        page.wake(ANSWER)


def ring_peer() -> None:
    """Drain records as a helper would: read each one's opcode, advance the tail."""
    page = Page()
    head, tail, view = page.u64[HEAD], page.u64[TAIL], memoryview(page.map)
    unpack = struct.Struct("<Q").unpack_from
    while True:
        end = head.value
        if end == tail.value:
            page.u32[SLEEPING].value = 1
            if head.value == tail.value:
                page.wait(SLEEPING, 1)
            continue
        for i in range(tail.value, end):
            unpack(view, RECORDS + (i % RING_SLOTS) * RECORD)
        tail.value = end


# ---- the driver ----------------------------------------------------------------------------------------
def compile_probe(tmp: Path) -> Path:
    exe = tmp / "client_paths"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-o", str(exe), str(HERE / "client_paths.c"), "-ldl"], check=True)
    return exe


def probe(exe: Path, mode: str, n: int, env: dict[str, str] | None = None, peer: str | None = None) -> list[float]:
    cmd = [str(exe), mode, str(n)] + ([sys.executable, str(Path(__file__).resolve()), "--peer", peer] if peer else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(f"{mode}: exit {out.returncode}\n{out.stderr}")
    return [float(x) for x in out.stdout.split()[1:]]


def shim_env(tmp: Path) -> tuple[dict[str, str], subprocess.Popen]:
    """What xpu-run gives a program, against a sim server of this run's own (plain TCP)."""
    from xpuremote.interpose.build import ensure_shim
    from xpuremote.interpose.run import child_env

    sys.path.insert(0, str(HERE))
    from foundation import start_server

    server, address = start_server(tmp / "server.log", "sim")
    env = child_env(str(ensure_shim().parent), address)
    for name in ("XPU_CLIENT_KEY", "XPU_SERVER_KEY", "XPU_TRACE"):
        env.pop(name, None)
    return env, server


ROWS = (  # (figure, mode, peer, index of the figure in the probe's output, unit)
    ("shim C entry (cuGetProcAddress)", "shim", None, 0, "ns/call"),
    ("shim Python local (cuCtxGetFlags)", "shim", None, 1, "ns/call"),
    ("shim async (cuMemsetD8Async), caller", "shim", None, 2, "ns/call"),
    ("shim async (cuMemsetD8Async), through the sync", "shim", None, 3, "calls/s"),
    ("shim C answer (cuCtxGetDevice)", "shim", None, 4, "ns/call"),
    ("round trip, C peer", "futex", None, 0, "ns/call"),
    ("round trip, Python peer", "peer", "futex", 0, "ns/call"),
    ("ring enqueue, caller", "ring", "ring", 0, "ns/call"),
    ("ring, drained by Python", "ring", "ring", 1, "records/s"),
)


def measure(calls: int, repeats: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="xpuremote-paths-"))
    exe = compile_probe(tmp)
    env, server = shim_env(tmp)
    samples: dict[str, list[list[float]]] = {m: [] for m in ("shim", "futex", "peer", "ring")}
    try:
        for _ in range(repeats):  # the modes interleaved, so that load drift hits them alike
            samples["shim"].append(probe(exe, "shim", calls, env))
            samples["futex"].append(probe(exe, "futex", calls))
            samples["peer"].append(probe(exe, "peer", calls, peer="futex"))
            samples["ring"].append(probe(exe, "ring", calls * 10, peer="ring"))
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [{"figure": f, "unit": unit, "median": statistics.median(s[i] for s in samples[mode]),
             "samples": [s[i] for s in samples[mode]]} for f, mode, _, i, unit in ROWS]
    return {"calls": calls, "repeats": repeats, "rows": rows, "load": os.getloadavg(),
            "python": sys.version.split()[0], "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def markdown(result: dict[str, Any], command: str) -> str:
    lines = ["# Client paths: what one driver call costs the application's thread", "", f"`{command}`", "",
             f"Python {result['python']}, {result['calls']} calls a run (ring: 10x), medians of "
             f"{result['repeats']} interleaved runs; load average after {result['load']}.", "",
             "| path | unit | median | runs |", "|---|---|---:|---|"]
    for r in result["rows"]:
        runs = ", ".join(f"{x:,.0f}" for x in r["samples"])
        lines.append(f"| {r['figure']} | {r['unit']} | {r['median']:,.0f} | {runs} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", choices=("futex", "ring"), help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write JSON here and Markdown beside it")
    args = parser.parse_args(argv)
    if args.peer:
        (futex_peer if args.peer == "futex" else ring_peer)()
        return 0
    result = measure(args.calls, args.repeats)
    command = "python bench/client_paths.py" + (f" --out {args.out}" if args.out else "")
    from foundation import publish

    publish(args.out, result, markdown(result, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
