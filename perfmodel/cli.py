"""xpu-perf: how much a network slows an application, and what network it needs, from a trace.

    xpu-run --trace app.trace -- python train.py          # record (or XPU_TRACE=app.trace)
    xpu-perf predict app.trace --rtt-us 50 --gbps 25 [--json]
    xpu-perf sweep app.trace --plot slowdown.png
    xpu-perf requirements app.trace --max-slowdown 5%
    xpu-perf whatif app.trace --rtt-us 50 --gbps 25
    xpu-perf calls app.trace [--top 20] [--from-ms 1500]   # where the recorded time went, call by call
    xpu-perf validate [--plot out.png] -- CMD ...
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from xpuremote.protocol import trace as fmt

from .model import Model, Network, Prediction

# by_call, whatif and validate are imported by the commands that use them: `predict` starts sooner without them

SWEEP_RTTS_US = [10 ** (k / 6) for k in range(0, 25)]  # 1 µs .. 10 ms
SWEEP_GBPS = [10 ** (k * math.log10(400) / 18) for k in range(0, 19)]  # 1 .. 400 Gbit/s
FRONTIER_GBPS = [1, 2.5, 5, 10, 25, 40, 100, 200, 400]


# ---- predict ----------------------------------------------------------------------------------
def cmd_predict(args: argparse.Namespace) -> int:
    model = _model(args.trace)
    pred = model.predict(Network(args.rtt_us, args.gbps))
    if args.json:
        print(json.dumps(pred.to_json()))
    else:
        print(describe(pred, model))
    return 0


def describe(pred: Prediction, model: Model) -> str:
    b = pred.breakdown
    calls = len(model.trace.calls)
    parts = [("the application and client", b.client), ("network round trips (RTT)", b.latency),
             ("bytes on the link and queueing for it", b.bytes), ("software transport", b.transport),
             ("server and GPU", b.server)]
    lines = [f"{pred.network}: predicted {pred.predicted_s * 1e3:.2f} ms, recorded {pred.trace_s * 1e3:.2f} ms "
             f"(slowdown {pred.slowdown:.3f}x)",
             f"{calls} calls, {b.round_trips} round trips, {_size(b.bytes_up)} up, {_size(b.bytes_down)} down",
             "where the predicted time goes:"]
    lines += [f"  {name:<40} {seconds * 1e3:10.2f} ms  {seconds / pred.predicted_s:6.1%}"
              for name, seconds in parts if pred.predicted_s]
    gpu = _gpu_ns(model.trace)
    if gpu is not None:
        how = "the model queues it per stream" if model.queues_gpu() else "part of the server's time"
        lines.append(f"GPU work measured in the recorded run: {gpu / 1e6:.2f} ms ({how})")
    return "\n".join(lines)


def _gpu_ns(trace: fmt.Trace) -> int | None:
    """The GPU time the trace's messages measured (None: none did), from its columns where it has them."""
    columns = trace.columns
    if columns is not None:
        measured = ~columns.gpu_nil
        return int(columns.gpu[measured].sum()) if measured.any() else None
    gpu = [m.gpu for m in trace.messages if m.gpu is not None]
    return sum(gpu) if gpu else None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


# ---- sweep ------------------------------------------------------------------------------------
def cmd_sweep(args: argparse.Namespace) -> int:
    model = _model(args.trace)
    grid = [[model.predict(Network(rtt, bw)).slowdown for rtt in SWEEP_RTTS_US] for bw in SWEEP_GBPS]
    if args.json:
        print(json.dumps({"rtt_us": SWEEP_RTTS_US, "gbps": SWEEP_GBPS, "slowdown": grid}))
    else:
        shown = range(0, len(SWEEP_RTTS_US), 3)
        print("slowdown; rows: Gbit/s, columns: RTT µs")
        print(f"{'':>8}" + "".join(f"{SWEEP_RTTS_US[j]:>9.3g}" for j in shown))
        for bw, row in zip(SWEEP_GBPS[::3], grid[::3]):
            print(f"{bw:>8.3g}" + "".join(f"{row[j]:>9.3f}" for j in shown))
    if args.plot:
        from . import plots

        plots.heatmap(SWEEP_RTTS_US, SWEEP_GBPS, grid, f"slowdown of {_program(model)}", Path(args.plot))
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


# ---- requirements -------------------------------------------------------------------------------
def max_rtt_us(model: Model, gbps: float, target: float) -> float | None:
    """The largest RTT keeping the slowdown within `target` at this bandwidth (None: none does)."""
    if model.predict(Network(0.0, gbps)).slowdown > target:
        return None
    low, high = 0.0, 1e5
    if model.predict(Network(high, gbps)).slowdown <= target:
        return high
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if model.predict(Network(mid, gbps)).slowdown <= target else (low, mid)
    return low


def cmd_requirements(args: argparse.Namespace) -> int:
    model = _model(args.trace)
    target = 1 + _percent(args.max_slowdown)
    frontier = [(bw, max_rtt_us(model, bw, target)) for bw in FRONTIER_GBPS]
    if args.json:
        print(json.dumps({"max_slowdown": target - 1, "frontier": [{"gbps": bw, "max_rtt_us": rtt}
                                                                   for bw, rtt in frontier]}))
        return 0
    print(f"to stay within {target - 1:.0%} of the recorded run:")
    print(f"{'Gbit/s':>8} {'max RTT µs':>12}")
    for bw, rtt in frontier:
        print(f"{bw:>8g} {'none suffices' if rtt is None else f'{rtt:.1f}':>12}")
    print(sentence(frontier, target))
    return 0


def sentence(frontier: list[tuple[float, float | None]], target: float) -> str:
    ok = [(bw, rtt) for bw, rtt in frontier if rtt is not None]
    if not ok:
        return f"No network up to {frontier[-1][0]:g} Gbit/s keeps this application within {target - 1:.0%}."
    need_bw, rtt_there = ok[0]
    best = ok[-1]
    return (f"This application needs at least {need_bw:g} Gbit/s (with RTT under {rtt_there:.0f} µs) to stay within "
            f"{target - 1:.0%}; with {best[0]:g} Gbit/s an RTT up to {best[1]:.0f} µs will do.")


def _percent(text: str) -> float:
    return float(text.rstrip("%")) / 100 if text.endswith("%") else float(text)


# ---- whatif --------------------------------------------------------------------------------------
def cmd_whatif(args: argparse.Namespace) -> int:
    from . import whatif

    model = _model(args.trace)
    net = Network(args.rtt_us, args.gbps)
    rows = [("as recorded (all optimisations)", model.predict(net))]
    rows += [(name, whatif.without(model, off).predict(net)) for name, off in whatif.OFF.items()]
    if args.json:
        print(json.dumps({name: p.to_json() for name, p in rows}))
        return 0
    print(f"{net}; recorded run {model.span / 1e6:.2f} ms")
    print(f"{'':<34} {'predicted ms':>13} {'slowdown':>9} {'round trips':>12}")
    for name, p in rows:
        print(f"{name:<34} {p.predicted_s * 1e3:>13.2f} {p.slowdown:>9.3f} {p.breakdown.round_trips:>12}")
    return 0


# ---- calls -----------------------------------------------------------------------------------------
def cmd_calls(args: argparse.Namespace) -> int:
    from . import by_call

    trace = _trace(args.trace)  # a table of what was recorded: no model to fit
    since = int(args.from_ms * 1e6)
    rows, gpu = by_call.by_call(trace, since), by_call.gpu_ns(trace, since)
    if args.json:
        print(json.dumps({"span_s": trace.span_ns / 1e9, "from_s": since / 1e9, "gpu_s": gpu and gpu / 1e9,
                          "calls": [r.to_json() for r in rows[:args.top]]}))
    else:
        print(by_call.describe(rows, trace.span_ns, args.top, since, gpu))
    return 0


# ---- validate ------------------------------------------------------------------------------------
def cmd_validate(args: argparse.Namespace) -> int:
    from . import validate as val

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("xpu-perf validate: no command given (xpu-perf validate [options] -- CMD ...)")
    rtts = tuple(float(x) for x in args.rtt_us.split(",")) if args.rtt_us is not None else val.RTTS_US
    gbps = tuple(float(x) for x in args.gbps.split(",")) if args.gbps is not None else val.GBPS
    result = val.validate(command, args.server, rtts, gbps, args.repeat, args.backend)
    print(json.dumps(result.to_json()) if args.json else val.table(result))
    if args.plot:
        from . import plots

        points = [dict(p, label=" ".join(command)) for p in result.to_json()["points"]]
        plots.validation(points, "xpu-perf: predicted vs measured", Path(args.plot))
    return 0


# ---- plumbing --------------------------------------------------------------------------------------
def _trace(path: str) -> fmt.Trace:
    try:
        trace = fmt.read(path)
    except (OSError, fmt.TraceError) as exc:
        raise SystemExit(f"xpu-perf: {exc}") from None
    if not trace.calls:
        raise SystemExit(f"xpu-perf: {path} holds no calls")
    return trace


def _model(path: str) -> Model:
    return Model(_trace(path))


def _program(model: Model) -> str:
    argv = model.trace.header.get("argv") or ["the application"]
    return os.path.basename(argv[0]) + (" " + " ".join(argv[1:3]) if len(argv) > 1 else "")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xpu-perf", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = p.add_subparsers(dest="verb", required=True)

    def with_trace(name: str, help_: str, network: bool = True) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help_)
        s.add_argument("trace", help="a trace recorded with XPU_TRACE=path or xpu-run --trace path")
        if network:
            s.add_argument("--rtt-us", type=float, default=50.0, help="round-trip time in µs (default 50)")
            s.add_argument("--gbps", type=float, default=0.0, help="bandwidth in Gbit/s (default: unlimited)")
        s.add_argument("--json", action="store_true", help="one JSON object on stdout")
        return s

    with_trace("predict", "predicted run time on a network, and where the time goes").set_defaults(fn=cmd_predict)
    s = with_trace("sweep", "slowdown over RTT 1 µs-10 ms and bandwidth 1-400 Gbit/s", network=False)
    s.add_argument("--plot", help="write a heat map (PNG) here")
    s.set_defaults(fn=cmd_sweep)
    s = with_trace("requirements", "the RTT/bandwidth frontier for a target slowdown", network=False)
    s.add_argument("--max-slowdown", default="5%", help="e.g. 5%% or 0.05 (default 5%%)")
    s.set_defaults(fn=cmd_requirements)
    with_trace("whatif", "the prediction with each optimisation turned off").set_defaults(fn=cmd_whatif)
    s = with_trace("calls", "where the recorded time went, call by call", network=False)
    s.add_argument("--top", type=int, default=20, help="rows shown (default 20)")
    s.add_argument("--from-ms", type=float, default=0.0,
                   help="only the calls made this many ms into the run or later (leave a warm-up out)")
    s.set_defaults(fn=cmd_calls)
    s = sub.add_parser("validate", help="record CMD, predict a grid of links, run CMD on each emulated link")
    s.add_argument("--server", default=os.environ.get("XPU_SERVER"), help="an xpu-server on this machine "
                   "(default: start a local one, on CPUs apart from the runs')")
    s.add_argument("--backend", default="auto", choices=["auto", "cuda", "sim"])
    s.add_argument("--rtt-us", help="comma-separated (default: RTTS_US of perfmodel/validate.py)")
    s.add_argument("--gbps", help="comma-separated; 0: unlimited (default: GBPS of perfmodel/validate.py)")
    s.add_argument("--repeat", type=int, default=3,
                   help="rounds of three recordings and a run per link (the faster two thirds are compared)")
    s.add_argument("--plot", help="write predicted vs measured (PNG) here")
    s.add_argument("--json", action="store_true")
    s.add_argument("command", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_validate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    raise SystemExit(main())
