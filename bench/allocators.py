"""PyTorch's three CUDA allocators through xpuremote: the cost of an allocation and its free.

    python bench/allocators.py [--out bench/results/allocators-sim.json] [--backend sim|cuda] [--rounds 3]

A round allocates 1,000 tensors of 1 KiB to 2 MiB (twelve sizes) and frees them; the figure is the
median time per allocation and free over --rounds rounds, after two warm-up rounds. Each allocator
runs in its own process of the stock torch wheel under `xpu-run` against a private `xpu-server`:
the caching allocator (PyTorch's default, which asks the driver only for new segments), the same
with `expandable_segments:True` (VMM: it maps more of one reservation as it grows) and
`backend:cudaMallocAsync` (the driver's stream-ordered pool: a call per allocation and per free).
Baselines from the same run: natively, with --backend cuda on a GPU; and the default allocator,
which after its warm-up makes no driver call for these tensors. XPU_TORCH_PYTHON names the
interpreter with torch (default .venv-torch).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foundation import TORCH_PYTHON, clean_env, machine, start_server, stop  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"caching (default)": "", "expandable_segments": "expandable_segments:True",
           "cudaMallocAsync": "backend:cudaMallocAsync"}
AGENT = r"""
import json, statistics, sys, time
import torch
rounds = int(sys.argv[1])
sizes = [1 << (10 + i % 12) for i in range(1000)]
def one_round():
    t0 = time.perf_counter()
    tensors = [torch.empty(size, dtype=torch.uint8, device="cuda") for size in sizes]
    del tensors
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / len(sizes)
for _ in range(2):
    one_round()
times = [one_round() for _ in range(rounds)]
print("@@ " + json.dumps({"us": statistics.median(times) * 1e6, "reserved": torch.cuda.memory_reserved()}))
"""


def run(conf: str, rounds: int, server: str | None) -> dict[str, Any]:
    argv = [str(TORCH_PYTHON), "-c", AGENT, str(rounds)]
    if server:
        argv = [str(TORCH_PYTHON), "-m", "xpuremote.interpose.run", "--server", server, "--", *argv]
    env = {**clean_env(), "PYTORCH_CUDA_ALLOC_CONF": conf} if conf else clean_env()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("@@ ")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]}
    return json.loads(lines[-1][3:])


def table(results: dict[str, Any]) -> str:
    rows = ["| allocator | xpuremote µs per allocation + free | native | xpuremote / native |", "|---|---|---|---|"]
    for name, remote in results["xpuremote"].items():
        native = (results.get("native") or {}).get(name, {})
        cell = f"{remote['us']:.1f}" if "us" in remote else f"error: {remote['error']}"
        base = f"{native['us']:.1f}" if "us" in native else "-"
        ratio = f"{remote['us'] / native['us']:.2g}x" if "us" in remote and "us" in native else "-"
        rows.append(f"| {name} | {cell} | {base} | {ratio} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="a .json file; the Markdown table goes beside it")
    parser.add_argument("--backend", choices=("sim", "cuda"), default="sim", help="the private server's")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not TORCH_PYTHON.exists():
        print(f"no PyTorch interpreter at {TORCH_PYTHON}: run `make torch` or set XPU_TORCH_PYTHON")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        server, address = start_server(Path(tmp) / "server.log", args.backend)
        try:
            remote = {name: run(conf, args.rounds, address) for name, conf in CONFIGS.items()}
        finally:
            stop(server)
    native = {name: run(conf, args.rounds, None) for name, conf in CONFIGS.items()} if args.backend == "cuda" else None
    results = {"command": " ".join(["python bench/allocators.py", *(argv or sys.argv[1:])]),
               "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(), "backend": args.backend,
               "xpuremote": remote, "native": native}
    text = table(results)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
        Path(args.out).with_suffix(".md").write_text(
            f"# PyTorch's allocators through xpuremote ({results['date']})\n\nCommand: `{results['command']}`; "
            f"server backend {args.backend}; median of {args.rounds} rounds of 1,000 tensors.\n\n{text}\n")
    return 0 if all("us" in r for r in remote.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
