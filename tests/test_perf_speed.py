"""xpu-perf's compiled replay (perfmodel/fast.py, perfmodel/replay.c) against the Python one (model.replay), its
reference: the same Prediction, breakdown included, on traces recorded by real programs on a real server, on the
bench's synthetic training loop, on GPU traces made by hand, and on what-if models; and the Python replay where
the C cannot be built. The Model made from a trace's columns (protocol/trace_reader.c) against the one made from
its Message objects: the same, bit for bit."""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from test_perf import gpu_loop, record, workloads  # noqa: F401  (workloads: a fixture)

from xpuremote.perfmodel import cli, fast, model, validate, whatif
from xpuremote.protocol import trace

NETWORKS = [model.Network(rtt, gbps) for rtt in (0.0, 1.0, 37.5, 500.0, 10_000.0) for gbps in (0.0, 1.0, 25.0, 400.0)]


def _bench():
    spec = importlib.util.spec_from_file_location("perf_speed", ROOT / "bench" / "perf_speed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_same(compiled: model.Prediction, python: model.Prediction) -> None:
    """Equal to within rounding: both replays do the same arithmetic in the same order."""
    close = pytest.approx(python.predicted_s, rel=1e-12, abs=1e-15)
    assert compiled.predicted_s == close and compiled.trace_s == python.trace_s
    got, want = vars(compiled.breakdown), vars(python.breakdown)
    assert got == {k: pytest.approx(v, rel=1e-9, abs=1e-12) for k, v in want.items()}


def same_everywhere(make: callable) -> int:
    """The compiled and the Python replay of the Model `make()` makes, over NETWORKS; how many messages it has."""
    assert fast.library() is not None, "replay.c builds here"
    compiled = make()
    with fast.python_replay():
        python = make()
    assert compiled.replayer.lib is not None and python.replayer.lib is None
    assert compiled.bias == pytest.approx(python.bias, rel=1e-9, abs=1e-15)
    for net in NETWORKS:
        assert_same(compiled.predict(net), python.predict(net))
    sent = [m.sent for m in python.msgs]  # validate's step times: replays of the messages before a moment
    marks = [sent[0] - 1, sent[len(sent) // 3], sent[len(sent) // 2] + 0.5, sent[-1], sent[-1] + 1]
    for t in marks:
        assert compiled.replayer.sent_before(t) == python.replayer.sent_before(t) == sum(s < t for s in sent)
        for net in NETWORKS[::3]:
            at = validate.time_at(compiled, net, t)
            assert at == pytest.approx(validate.time_at(python, net, t), rel=1e-12, abs=1e-6)
    return len(compiled.msgs)


def same_from_columns(path: Path) -> model.Model:
    """The Model of the trace at `path` read into columns (trace.columns: no Message object made) and of it read by
    the Python reader (the Message objects): the same transport, span, arrays and predictions, bit for bit, and the
    same `xpu-perf predict` text; with and without the GPU's queues. The columns' Model."""
    assert trace.library() is not None and fast.library() is not None
    columnar, objects = model.Model(trace.read(path)), model.Model(trace.read(path, native=False))
    assert columnar.trace.columns is not None and objects.trace.columns is None
    assert list.__len__(columnar.trace.messages) == 0, "predicted without making a Message"
    for a, b in ((columnar, objects), (columnar.without_gpu(), objects.without_gpu())):
        assert (a.transport, a.span, a.bias, a.queues_gpu()) == (b.transport, b.span, b.bias, b.queues_gpu())
        arrays, reference = a.replayer.arrays, b.replayer.arrays
        assert arrays.keys() == reference.keys()
        for name, column in arrays.items():
            same = column == reference[name] if isinstance(column, int) else \
                column.dtype == reference[name].dtype and np.array_equal(column, reference[name])
            assert same, name
        for net in NETWORKS:
            assert a.predict(net) == b.predict(net)
        net = model.Network(50.0, 10.0)
        assert cli.describe(a.predict(net), a) == cli.describe(b.predict(net), b)
    assert list.__len__(columnar.trace.messages) == 0
    return columnar


def test_same_prediction_on_recorded_traces(run_on, workloads: Path, tmp_path: Path) -> None:  # noqa: F811
    """The three mixes of examples/workloads.cu recorded on the server, and each with its optimisations turned off
    (whatif: messages the replay was not built from)."""
    for mix, n in (("sync", 30), ("async", 20), ("bytes", 2)):
        t = record(run_on, tmp_path / f"{mix}.trace", workloads, mix, n)
        same_from_columns(tmp_path / f"{mix}.trace")
        assert same_everywhere(lambda: model.Model(t)) == len(t.messages)  # noqa: B023
        for off in whatif.OFF.values():
            same_everywhere(lambda: whatif.without(model.Model(t), off))  # noqa: B023


def test_same_prediction_on_a_gpu_bound_loop() -> None:
    """test_perf's GPU-bound loops (a cuda trace made by hand): the GPU's queues, events and event syncs."""
    for lag in (0, 1):
        recorded, _ = gpu_loop(200_000, lag)
        same_everywhere(lambda: model.Model(recorded))  # noqa: B023
        same_everywhere(lambda: model.Model(recorded).without_gpu())  # noqa: B023


def test_same_prediction_on_a_training_loops_trace(tmp_path: Path) -> None:
    """bench/perf_speed.py's trace, small: lane batches on three streams, events, stream waits, later copies and
    stream and context syncs, written by TraceWriter and read back, with a wake-up probe."""
    path = tmp_path / "loop.trace"
    _bench().write_trace(path, 20_000)
    assert same_from_columns(path).queues_gpu()
    t = trace.read(path)
    assert same_everywhere(lambda: model.Model(t)) == len(t.messages) > 3_000
    assert any(m.gpu for m in model.Model(t).msgs) and model.Model(t).machines.client.points


def test_same_model_from_columns_on_traces_written_by_hand(tmp_path: Path) -> None:
    """test_trace_reader's hand-written traces (nil server and per_call, untimed items, several GPU_OPS records for a
    message, a later message, GPU records of versions 1-2) on a GPU, the sim and a recorded link: the Model of
    the columns is the Model of the Message objects."""
    from test_trace_reader import V3, written

    for backend in ("cuda", "sim"):
        header = {"version": 3, "backend": backend, "link": {"rtt_us": 20, "gbps": 10, "on": True}, "spin_us": 30,
                  "wake": {"client": [[1000, 300], [100_000, 2000]], "server": [[1000, 100]]}}
        assert same_from_columns(written(tmp_path / f"{backend}.trace", header, V3)).queues_gpu() == (backend == "cuda")
    v2 = [r for r in V3 if r[0] != trace.GPU_OPS]
    assert not same_from_columns(written(tmp_path / "v2.trace", {"version": 2, "backend": "cuda"}, v2)).queues_gpu()


def random_msgs(rng: random.Random, n: int) -> list[model.Msg]:
    """Messages of every kind with GPU steps of every op on streams 0-4 (0: the legacy stream) and 6 events, some of
    them synced before they were recorded; sizes around the 64 KiB that separates small from large."""
    msgs, t = [], 0.0
    for _ in range(n):
        t += rng.uniform(0, 200_000)
        steps = []
        for _ in range(rng.choice((0, 0, 1, 3, 6))):
            op = rng.randrange(6)
            a = rng.randrange(6) if op == trace.SYNC_EVENT else rng.randrange(5)
            b = rng.randrange(6) if op in (trace.RECORD, trace.WAIT) else rng.uniform(0, 300_000)
            steps.append((rng.uniform(0, 20_000), op, a, float(b)))
        server = rng.uniform(1_000, 50_000)
        blocked = min(server, sum(s[3] for s in steps if s[1] in model.SYNCS))
        kind = rng.choice(("async", "async", "sync", "later"))
        up, down = rng.choice((100, 5_000, 70_000, 2_000_000)), rng.choice((0, 64, 100_000))
        msgs.append(model.Msg(t, kind, up, down, server, rng.uniform(10_000, 400_000) if kind == "sync" else 0.0,
                              tuple(steps), blocked))
    return msgs


def test_same_prediction_on_random_gpu_messages() -> None:
    """Random messages (random_msgs, seeded) replayed by both, with and without wake-up curves and a spin before
    blocking, through fast.Replayer and model.replay directly."""
    rng = random.Random(43)
    client = model.Wake(((50_000.0, 2_000.0), (1e6, 20_000.0), (1e6, 25_000.0)))
    server = model.Wake(((0.0, 500.0), (300_000.0, 9_000.0)))
    curves = (model.Machines(), model.Machines(client, server),
              model.Machines(client, server, blocked=4_000.0, spin=150_000.0))  # spin, then block
    for _ in range(20):
        msgs = random_msgs(rng, rng.randrange(1, 400))
        compiled = fast.Replayer(msgs)
        transport = model.Transport(rng.uniform(0, 40_000), rng.uniform(0, 0.5))
        span = msgs[-1].sent + 1e6
        for machines in curves:
            for net in NETWORKS[::3]:
                assert_same(compiled(span, transport, net, machines), model.replay(msgs, span, transport, net,
                                                                                   machines))


def test_without_a_compiler_the_python_replay_runs_and_says_so(tmp_path: Path) -> None:
    """With no compiler on the PATH and an empty cache, `xpu-perf predict` says once that it replays in Python and
    prints what the compiled replay prints."""
    path = tmp_path / "loop.trace"
    _bench().write_trace(path, 2_000)
    cmd = [sys.executable, "-m", "xpuremote.perfmodel.cli", "predict", str(path), "--rtt-us", "200", "--gbps", "10"]
    compiled = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    env = dict(os.environ, PATH=str(tmp_path / "nothing"), XPU_SHIM_DIR=str(tmp_path / "cache"))
    python = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert compiled.returncode == python.returncode == 0, python.stderr
    assert "replays in Python" not in compiled.stderr
    assert python.stderr.count("replays in Python") == 1 and "replay.c did not build" in python.stderr
    assert python.stderr.count("traces are read in Python") == 1 and "trace_reader.c did not build" in python.stderr
    assert "read in Python" not in compiled.stderr
    assert python.stdout == compiled.stdout and "predicted" in compiled.stdout


def reference_read(path: Path) -> tuple[dict, list[trace.Call], list[trace.Message]]:
    """The format decoded record by record, as protocol/trace.py's docstring describes it (and as its reader did before
    it read in batches and made its calls on first use)."""
    import msgpack
    import zstandard

    data = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes()[len(trace.MAGIC):])
    values = msgpack.Unpacker(raw=False, strict_map_key=False)
    values.feed(data)
    header, names, calls, msgs, ops = next(values), {}, [], [], {}
    last_call = last_message = 0
    tick = trace.TICK_NS
    for rec in values:
        if rec[0] == trace.NAME:
            names[rec[1]] = rec[2]
        elif rec[0] == trace.CALL:
            last_call += rec[3]
            calls.append(trace.Call(names[rec[1]], trace.CLASSES[rec[2]], last_call * tick, (last_call + rec[4]) * tick,
                                    rec[5], rec[6], rec[7], len(rec) > 8 and bool(rec[8])))
        elif rec[0] == trace.MESSAGE:
            last_message += rec[3]
            per_call = None if rec[9] is None else [None if t is None else t * tick for t in rec[9]]
            msgs.append(trace.Message(rec[1], trace.KINDS[rec[2]], last_message * tick, rec[4], rec[5], rec[6] * tick,
                                      rec[7], None if rec[8] is None else rec[8] * tick, per_call))
        elif rec[0] == trace.GPU_OPS:
            ops.setdefault(rec[1], []).extend(trace.GpuOp(*rec[2][i:i + 4]) for i in range(0, len(rec[2]) - 3, 4))
    for m in msgs:
        m.gpu_ops = ops.get(m.seq, [])
        m.gpu = sum(o.b for o in m.gpu_ops if o.op == trace.WORK) if m.gpu_ops else None
    return header, calls, sorted(msgs, key=lambda m: m.sent)


def test_a_large_trace_reads_as_record_by_record(tmp_path: Path) -> None:
    """The reader takes a trace in batches and makes its calls and each message's GPU operations on first use
    (trace.Lazy): what it gives is what decoding record by record gives, before and after they are made, and its
    lists act as lists (appended to, compared, sliced)."""
    path = tmp_path / "loop.trace"
    _bench().write_trace(path, 5_000)
    header, calls, msgs = reference_read(path)
    t = trace.read(path)
    assert isinstance(t.calls, trace.Lazy) and list.__len__(t.calls) == 0, "not made yet"
    last = max(max(c.ret for c in calls), max(m.sent + m.wait for m in msgs))
    assert len(t.calls) == len(calls) and t.span_ns == last
    assert any(c.lane for c in t.calls) and list.__len__(t.calls) < len(calls), "any() stops where it can"
    assert t.header == header and t.header["wake"]["client"][0] == [100_000, 4_000], "the header's arrays are lists"
    assert t.messages == msgs and t.calls == calls and t.calls[-1] == calls[-1] and t.calls[:3] == calls[:3]
    assert t.span_ns == trace.Trace(header, calls, msgs).span_ns
    t.calls.append(calls[0])
    assert len(t.calls) == len(calls) + 1 and t.calls[-1] is calls[0]
