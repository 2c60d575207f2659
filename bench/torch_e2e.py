"""PyTorch end to end, natively and through xpuremote, side by side (GPU results: bench/results/gpu/).

    python bench/torch_e2e.py --out DIR [--server tcp://host:port] [--workloads a,b] [--steps N]

Runs each workload twice in fresh processes: natively on this machine's GPU, then under
`xpu-run` (against --server, else a local `xpu-server --backend cuda` that xpu-run starts),
and writes DIR/torch_e2e.json and DIR/torch_e2e.md: median step time of each, the slowdown,
and the loss or output checksum of each so that the two runs can be seen to compute the same.
Needs a GPU for the native runs (the sim device runs no PyTorch kernels); `transformers` for
gpt2_generate (randomly initialised GPT-2 small, nothing downloaded).

    python bench/torch_e2e.py --run WORKLOAD[,...] --steps N   # in this process, a JSON line each

`--size small` runs the same layers and calls at toy sizes: what the sim device can go
through (tests/test_torch_math.py runs every workload so with XPU_SIM_SKIP_KERNELS=1).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

WORKLOADS = ("mlp_train", "cnn_train_fp32", "cnn_train_amp", "gpt2_step_bf16", "cnn_infer_b1", "cnn_infer_b32",
             "mlp_compile_graph", "gpt2_generate")
WARMUP = 3
# the workloads' dimensions: as benchmarked, and small enough for the sim device's numpy math
SIZES = {
    "full": {"mlp": (1024, 4096, 256), "image": 224, "images": 32, "gpt": (12, 768, 12, 50257, 1024),
             "tokens": (8, 512), "gpt2": {}, "generate": (32, 64), "compile_batch": 64},
    "small": {"mlp": (32, 64, 8), "image": 32, "images": 2, "gpt": (2, 64, 2, 512, 64), "tokens": (2, 16),
              "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 512, "n_positions": 64,
                       "bos_token_id": 0, "eos_token_id": 511},  # not 0: the sim's skipped kernels pick 0
              "generate": (8, 4), "compile_batch": 4},
}


# ---- the workloads: each returns (step function, checksum function) ------------------------------
def _mlp(torch: Any, width_in: int = 1024, width: int = 4096) -> Any:
    nn = torch.nn
    return nn.Sequential(nn.Linear(width_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 10))


def _resnet18(torch: Any) -> Any:
    """ResNet-18's shape (basic blocks 2-2-2-2, 64..512 channels) without torchvision."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                      nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: Any) -> Any:
            return torch.relu(self.body(x) + self.skip(x))

    layers, cin = [], 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                         nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


def _gpt(torch: Any, layers: int = 12, width: int = 768, heads: int = 12, vocab: int = 50257, ctx: int = 1024) -> Any:
    """GPT-2 small's size: pre-norm blocks, causal scaled_dot_product_attention."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x: Any) -> Any:
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, c // heads).transpose(1, 3).unbind(2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(ctx, width)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            return self.head(self.ln(self.blocks(x)))

    return GPT()


def _train(torch: Any, model: Any, make_batch: Callable[[], tuple[Any, Any]], loss_fn: Any,
           amp: Any = None) -> tuple[Callable[[], Any], Callable[[], float]]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=amp == torch.float16)
    x, y = make_batch()
    last: list[Any] = [None]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        last[0] = loss

    return step, lambda: float(last[0])


def build(name: str, torch: Any, size: str = "full", new_tokens: int | None = None
          ) -> tuple[Callable[[], Any], Callable[[], float]]:
    """A workload's step and checksum; `new_tokens`: gpt2_generate's, instead of its size's."""
    torch.manual_seed(0)
    dev, F, dims = "cuda", torch.nn.functional, SIZES[size]
    if name == "mlp_train":
        width_in, width, rows = dims["mlp"]
        batch = lambda: (torch.randn(rows, width_in, device=dev),  # noqa: E731
                         torch.randint(0, 10, (rows,), device=dev))
        return _train(torch, _mlp(torch, width_in, width).to(dev), batch, F.cross_entropy)
    side, images = dims["image"], dims["images"]
    if name in ("cnn_train_fp32", "cnn_train_amp"):
        model = _resnet18(torch).to(dev).to(memory_format=torch.channels_last)
        batch = lambda: (torch.randn(images, 3, side, side, device=dev).to(memory_format=torch.channels_last),  # noqa: E731
                         torch.randint(0, 1000, (images,), device=dev))
        return _train(torch, model, batch, F.cross_entropy, torch.float16 if name.endswith("amp") else None)
    if name == "gpt2_step_bf16":
        layers, width, heads, vocab, ctx = dims["gpt"]
        model = _gpt(torch, layers, width, heads, vocab, ctx).to(dev)
        tokens = lambda: (torch.randint(0, vocab, dims["tokens"], device=dev),) * 2  # noqa: E731
        loss = lambda logits, y: F.cross_entropy(logits[:, :-1].flatten(0, 1), y[:, 1:].flatten())  # noqa: E731
        return _train(torch, model, tokens, loss, torch.bfloat16)
    if name in ("cnn_infer_b1", "cnn_infer_b32"):
        model = _resnet18(torch).to(dev).eval()
        x = torch.randn(1 if name.endswith("b1") else images, 3, side, side, device=dev)
        out: list[Any] = [None]

        def infer() -> None:
            with torch.inference_mode():
                out[0] = model(x)

        return infer, lambda: float(out[0].float().sum())
    if name == "mlp_compile_graph":  # torch.compile's reduce-overhead mode replays a CUDA graph
        width_in, width, _ = dims["mlp"]
        model = torch.compile(_mlp(torch, width_in, width).to(dev).eval(), mode="reduce-overhead")
        x = torch.randn(dims["compile_batch"], width_in, device=dev)
        out = [None]

        def compiled() -> None:
            with torch.inference_mode():
                out[0] = model(x)

        return compiled, lambda: float(out[0].float().sum())
    if name == "gpt2_generate":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(**dims["gpt2"])
        model = GPT2LMHeadModel(config).to(dev).eval()
        prompt_tokens, new_tokens = dims["generate"][0], new_tokens or dims["generate"][1]
        prompt = torch.randint(0, config.vocab_size, (1, prompt_tokens), device=dev)
        out = [None]

        def generate() -> None:
            with torch.inference_mode():
                out[0] = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, use_cache=True,
                                        pad_token_id=0, attention_mask=torch.ones_like(prompt))

        generate.tokens = lambda: out[0].shape[1] - prompt_tokens  # type: ignore[attr-defined]  # the last step's
        return generate, lambda: float(out[0].sum())
    raise SystemExit(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")


def run_one(name: str, steps: int, size: str = "full", warmup: int = WARMUP, stop_at: float | None = None,
            gate: bool = False, new_tokens: int | None = None, count_syncs: bool = False) -> dict[str, Any]:
    """One workload in this process: per-step times after warm-up, and a checksum. With `stop_at` (a
    time.time()), the steps stop there, after at least one: fewer steps, not none. With `gate`, once warmed up
    it says so on stdout and times its steps when a line comes on stdin (xpu-perf's validation starts a
    workload's runs together and times them one at a time). `window_ns`: the timed steps' start and end on
    CLOCK_MONOTONIC, the clock a trace's times are on; `step_ends_ns`: each step's end there. With `count_syncs`,
    `syncs_asked`: the synchronizing operations the timed steps asked for, as PyTorch's sync debug mode sees them
    (a `.item()`, a blocking copy, a data-dependent branch), the synchronize ending each step counted too."""
    import torch

    step, checksum = build(name, torch, size, new_tokens)
    at: dict[str, Any] = {}  # this process's CPU and the workers' when the timed steps begin

    def begin() -> None:
        if gate:
            print(json.dumps({"ready": name}), flush=True)
            sys.stdin.readline()
        at.update(cpu=time.process_time(), workers=workers_cpu_s(), start=time.monotonic_ns())
        if asked:
            asked.start()

    ends: list[int] = []  # each timed step's end on CLOCK_MONOTONIC
    asked = _SyncCounter(torch) if count_syncs else None

    def sync() -> None:
        torch.cuda.synchronize()
        if "start" in at:
            ends.append(time.monotonic_ns())

    times = time_steps(step, sync, steps, warmup, stop_at, begin)
    syncs = {"syncs_asked": asked.stop() + len(times)} if asked else {}
    window = [at["start"], ends[-1]]
    cpu = time.process_time() - at["cpu"]
    served = sum(now - at["workers"].get(pid, 0.0) for pid, now in workers_cpu_s().items())
    return {"workload": name, "steps_s": times, "median_ms": 1000 * statistics.median(times), "checksum": checksum(),
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "max_allocated": torch.cuda.max_memory_allocated(), "steps": len(times), "steps_asked": steps,
            "cpu_ms": 1000 * cpu / len(times), "server_cpu_ms": 1000 * served / len(times), "window_ns": window,
            "step_ends_ns": ends, **syncs, **({"tokens": step.tokens()} if name == "gpt2_generate" else {})}  # type: ignore[attr-defined]


class _SyncCounter:
    """PyTorch's synchronizing operations while on: its sync debug mode's warnings, counted (and not shown)."""

    def __init__(self, torch: Any) -> None:
        self.torch, self.count, self._shown = torch, 0, None

    def start(self) -> None:
        warnings.simplefilter("always")
        self._shown = warnings.showwarning
        warnings.showwarning = self._seen
        self.torch.cuda.set_sync_debug_mode("warn")

    def _seen(self, message: Any, *_: Any, **__: Any) -> None:
        self.count += str(message).startswith("called a synchronizing")  # not the mode's own notice

    def stop(self) -> int:
        self.torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = self._shown
        return self.count


def time_steps(step: Callable[[], Any], sync: Callable[[], Any], steps: int, warmup: int,
               stop_at: float | None = None, begin: Callable[[], None] = lambda: None) -> list[float]:
    """`warmup` steps, then `begin()` and up to `steps` timed ones (each ended by `sync`). Past `stop_at` (a
    time.time()) the warm-up ends after its first step; the timing ends after its first timed step where the
    next one, as long as the last, would end past it."""
    late = lambda ahead=0.0: stop_at is not None and time.time() + ahead >= stop_at  # noqa: E731
    for i in range(warmup):
        if i and late():
            break
        step()
    sync()
    begin()
    times: list[float] = []
    while len(times) < steps and not (times and late(times[-1])):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return times


def workers_cpu_s() -> dict[int, float]:
    """CPU seconds of each of this machine's xpu-server session workers (all their threads), by pid: where the
    step's calls ran. With this process's own CPU (the application's and the client's), it says which side a
    step waits for. Clock ticks: meaningful over all the timed steps, not one. The caller compares the same
    pids: another session's worker that ends meanwhile takes its CPU with it."""
    found = {}
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"xpuremote.server.worker" in (proc / "cmdline").read_bytes():
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                found[int(proc.name)] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:  # gone meanwhile
            continue
    return found


# ---- the comparison ---------------------------------------------------------------------------------
def measure(name: str, steps: int, remote: bool, server: str | None, timeout_s: float,
            size: str = "full", warmup: int = WARMUP, backend: str = "cuda", stop_at: float | None = None
            ) -> dict[str, Any]:
    me = [sys.executable, str(Path(__file__).resolve()), "--run", name, "--steps", str(steps), "--size", size,
          "--warmup", str(warmup), *(["--stop-at", repr(stop_at)] if stop_at else [])]
    cmd = me
    if remote:
        cmd = [sys.executable, "-m", "xpuremote.interpose.run", *(["--server", server] if server else []),
               "--backend", backend, "--", *me]
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:  # a run that printed its figures and was slow to exit keeps them
        out, said = (_text(exc.stdout).strip().splitlines(), _text(exc.stderr))
        if out and out[-1].startswith("{"):
            return {**json.loads(out[-1]), "wall_s": timeout_s, "cut": "while it exited"}
        return {"workload": name, "error": f"cut at its limit of {timeout_s:.0f} s", "wall_s": timeout_s,
                "said": _xpuremote_lines(said)}
    wall = time.perf_counter() - started
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"workload": name, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-1500:]}", "wall_s": wall,
                "said": _xpuremote_lines(proc.stderr)}
    return {**json.loads(lines[-1]), "wall_s": wall}


# With --budget, the share of a workload's seconds after which each run stops timing steps, and the share after
# which the native run is cut: the run through xpuremote starts later and is the slower.
NATIVE_STEPS_UNTIL, NATIVE_CUT_AT = 0.4, 0.6


def runs_of(name: str, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The workload natively (on a GPU) and through xpuremote, inside --budget seconds if given."""
    begun, budget = time.time(), args.budget
    native_stop = begun + NATIVE_STEPS_UNTIL * budget if budget else None
    native_limit = min(args.timeout, NATIVE_CUT_AT * budget) if budget else args.timeout
    native = (measure(name, args.steps, False, None, native_limit, args.size, args.warmup, stop_at=native_stop)
              if args.backend == "cuda" else {"workload": name, "skipped": "no GPU: the sim backend"})
    # the run through xpuremote stops its steps before the budget's end, for its exit (and its local server's)
    remote_stop = begun + budget - min(5.0, 0.25 * budget) if budget else None
    remote_limit = min(args.timeout, max(5.0, begun + budget - time.time())) if budget else args.timeout
    remote = measure(name, args.steps, True, args.server, remote_limit, args.size, args.warmup, args.backend,
                     remote_stop)
    return native, remote


def _text(output: bytes | str | None) -> str:
    """A cut run's output so far (bytes, as subprocess keeps it then)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def _xpuremote_lines(stderr: str, most: int = 30) -> list[str]:
    """What xpuremote and its local server said (an earlier call's failure, say): a failure at one call is
    often an earlier asynchronous call's, and the traceback's tail does not name it."""
    return [line for line in stderr.splitlines() if line.startswith(("xpuremote:", "xpu-server"))][:most]


def _said(run: dict[str, Any]) -> str:
    if "median_ms" in run:
        return f"{run['median_ms']:.2f} ms/step"
    return run.get("skipped") or "error: " + (run["error"].splitlines() or [""])[-1]


def cpu_split(native: dict[str, Any], remote: dict[str, Any]) -> str:
    """CPU a step: the native run's; through xpuremote the application's process and the server's workers."""
    if "cpu_ms" not in remote:
        return "-"
    mine = f"{native['cpu_ms']:.2f}" if "cpu_ms" in native else "-"
    return f"{mine}; {remote['cpu_ms']:.2f}, {remote['server_cpu_ms']:.2f}"


def markdown(report: dict[str, Any]) -> str:
    rows = ["| workload | native ms/step | xpuremote ms/step | slowdown | CPU ms/step: native; application, server "
            "| checksums (native / remote) |", "|---|---|---|---|---|---|"]
    for r in report["results"]:
        n, x = r["native"], r["remote"]
        if "median_ms" not in n or "median_ms" not in x:
            why = (x.get("error") or n.get("error") or n.get("skipped") or "").splitlines()[-1:] or [""]
            rows.append(f"| {r['workload']} | {n.get('median_ms', '-')} | {x.get('median_ms', '-')} | - | - | "
                        f"error: {why[0][:120]} |")
            continue
        rows.append(f"| {r['workload']} | {n['median_ms']:.2f} | {x['median_ms']:.2f} | "
                    f"{x['median_ms'] / n['median_ms']:.2f}x | {cpu_split(n, x)} | "
                    f"{n['checksum']:.6g} / {x['checksum']:.6g} |")
    head = [f"# PyTorch end to end: native vs xpuremote ({report['when']})", "",
            f"Command: `{report['command']}`", f"Machine: {report['machine']}", f"Server: {report['server']}",
            f"Steps per workload: {report['steps']} after {WARMUP} warm-up steps; medians.", ""]
    return "\n".join(head + rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for torch_e2e.json and torch_e2e.md")
    parser.add_argument("--server", default=os.environ.get("XPU_SERVER"), help="xpu-server to use (else a local one)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--backend", choices=["cuda", "sim"], default="cuda",
                        help="of the local server; sim: no native run (no GPU), and set XPU_SIM_SKIP_KERNELS=1")
    parser.add_argument("--budget", type=float, default=0,
                        help="seconds for each workload, both runs: their steps stop in time (at least one each)")
    parser.add_argument("--run", help=argparse.SUPPRESS)  # one workload in this process
    parser.add_argument("--stop-at", type=float, help=argparse.SUPPRESS)  # --run's steps end there (time.time())
    parser.add_argument("--gate", action="store_true", help=argparse.SUPPRESS)  # --run: steps timed on a stdin line
    parser.add_argument("--count-syncs", action="store_true", help=argparse.SUPPRESS)  # --run: syncs_asked
    parser.add_argument("--new-tokens", type=int, help="gpt2_generate's new tokens a step (default: its size's)")
    args = parser.parse_args(argv)
    if args.run:  # one or more workloads, one after the other in this process: a JSON line each
        for name in args.run.split(","):
            print(json.dumps(run_one(name, args.steps, args.size, args.warmup, args.stop_at, args.gate,
                                     args.new_tokens, args.count_syncs)), flush=True)
        if args.gate:  # the session stays up, idle, until the other runs are timed
            sys.stdin.read()
        return 0
    if args.out is None:
        parser.error("--out DIR is required")
    results = []
    for name in filter(None, args.workloads.split(",")):
        native, remote = runs_of(name, args)
        results.append({"workload": name, "native": native, "remote": remote})
        print(f"{name}: native {_said(native)}, xpuremote {_said(remote)}", file=sys.stderr)
        print("".join(f"  {line}\n" for line in remote.get("said", [])), end="", file=sys.stderr)
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv),
              "machine": f"{platform.node()} {platform.platform()} {os.cpu_count()} cpus",
              "server": args.server or f"local xpu-server --backend {args.backend}", "steps": args.steps,
              "results": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "torch_e2e.json").write_text(json.dumps(report, indent=1))
    (args.out / "torch_e2e.md").write_text(markdown(report))
    print(args.out / "torch_e2e.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
