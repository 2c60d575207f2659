"""xpu-perf: traces recorded from real programs on a real server, the emulated link, the model
and its command line, and the model's accuracy against runs over emulated links.

The programs are examples/workloads.cu in its three mixes (round-trip bound, launch bound,
bandwidth bound), compiled with nvcc; on the sim their kernels run through examples/sim_kernels.py.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import BACKEND, ROOT, SIM_KERNELS, Build
from pyclient import PyClient
from test_torch import torch_python
from toolchain import nvcc_lib_dir

from xpuremote.client import call_cpu, wake
from xpuremote.perfmodel import by_call, model, shares, validate, whatif
from xpuremote.protocol import trace
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.wire import PROBE_BUSY_MAX_NS

WORKLOADS = ROOT / "examples" / "workloads.cu"
CHUNK = 16 << 20  # bytes per copy in the bytes mix


@pytest.fixture(scope="module")
def workloads(build: Build) -> Path:
    lib_dir = nvcc_lib_dir()
    if lib_dir is None:
        pytest.skip("nvcc's wheel has no lib directory with libcudart_static.a")
    return build("workloads", ["-arch=sm_90", f"-L{lib_dir}", str(WORKLOADS)])


def record(run_on, path: Path, *cmd: str, **env: str) -> trace.Trace:
    proc = run_on([*map(str, cmd)], XPU_TRACE=str(path), **env)
    assert proc.returncode == 0, proc.stderr
    return trace.read(path)


def xpu_perf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xpuremote.perfmodel.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


# ---- recording ---------------------------------------------------------------------------------
def test_trace_holds_every_call_and_message(run_on, workloads: Path, tmp_path: Path) -> None:
    t = record(run_on, tmp_path / "sync.trace", workloads, "sync", 50)
    names = collections.Counter(c.name for c in t.calls)
    assert names["cuMemcpyHtoD_v2"] == names["cuMemcpyDtoH_v2"] == names["cuLaunchKernel"] == 50
    assert {c.cls for c in t.calls} >= {"local", "sync", "async"}
    launches = [c for c in t.calls if c.name == "cuLaunchKernel"]
    assert all(c.seq for c in launches), "each launch names the message it went in"
    by_seq = {m.seq: m for m in t.messages}
    sync = [m for m in t.messages if m.kind == "sync"]
    assert len(sync) >= 100 and all(m.wait > 0 and m.down > 0 for m in sync)
    lanes = shares.lane_items(t)  # a lane's records are one item of their message
    items = {m.seq: m.n - sum(n for (seq, _), n in lanes.items() if seq == m.seq) +
             sum(seq == m.seq for seq, _ in lanes) for m in t.messages}
    assert all(m.server is not None and len(m.per_call) == items[m.seq] for m in t.messages), "the server timed each"
    assert all(by_seq[c.seq].n > c.pos for c in launches)
    assert t.end is not None and 0 < t.span_ns <= t.end
    assert t.header["backend"] == BACKEND and t.header["argv"][1:] == ["sync", "50"]


def test_a_traced_run_keeps_the_fast_path_and_records_every_call(run_on, workloads: Path, tmp_path: Path) -> None:
    """Under XPU_TRACE the session is the one that runs untraced, its data connection on and its lane open: a
    launch after the first and every memset are queued in C and never enter the client core (XPU_CALL_CPU counts
    the core's calls), yet the trace holds each of them, named, timed by the lane and placed in the message it
    went in. What reached the server is, by name and count, what a
    traced run with the lane closed (XPU_LANE=0, every call through the core) sent."""
    runs = {}
    for lane in ("1", "0"):
        table = tmp_path / f"core-{lane}.tsv"
        t = record(run_on, tmp_path / f"lane-{lane}.trace", workloads, "async", 20, XPU_LANE=lane,
                   XPU_CALL_CPU=str(table))
        runs[lane] = t, call_cpu.read(table)
    (traced, core), (closed, closed_core) = runs["1"], runs["0"]
    assert traced.header["data"] and traced.header["lane"], "the session that runs: its data connection, its lane"
    assert closed_core["cuLaunchKernel"][0] == 20 * 16
    assert {name: n for name, (n, _) in core.items() if CALLS[name].lane} == {"cuLaunchKernel": 1}, core
    assert not any(c.lane for c in closed.calls)
    sent = collections.Counter(c.name for c in traced.calls if c.seq)
    assert sent == collections.Counter(c.name for c in closed.calls if c.seq)
    queued = [c for c in traced.calls if c.lane]
    assert collections.Counter(CALLS[c.name].lane for c in queued) == {"launch": 20 * 16 - 1, "args": 20}
    messages = {m.seq: m for m in traced.messages}
    assert all(c.seq in messages and 0 <= c.ret - c.entry < messages[c.seq].sent - c.entry for c in queued), \
        "each record was queued before its message went out, and costs the application its time in C"
    lanes = shares.lane_items(traced)
    assert sum(lanes.values()) == len(queued) and all(pos < len(messages[seq].per_call) for seq, pos in lanes), \
        "a lane's records are one item of their message"


def test_a_traced_run_records_the_library_calls_queued_in_c(tmp_path: Path) -> None:
    """cuBLAS GEMMs that kept.h queues in the lane under a trace are in it as calls of their messages, named by the
    record (the stream and workspace their handle lacked on the server before them too), and the server ran the
    same calls as in a traced run with the lane closed, where the core sent each GEMM with those settings."""
    from conftest import shim_env, start_server
    from test_mathlibs import GEMM_PROGRAM

    from xpuremote.interpose.build import ensure_shim

    srv = start_server(tmp_path)
    traces = {}
    try:
        for lane in ("1", "0"):
            path = tmp_path / f"gemm-{lane}.trace"
            proc = subprocess.run([sys.executable, "-c", GEMM_PROGRAM], capture_output=True, text=True, timeout=120,
                                  env=shim_env(ensure_shim(), srv.address, XPU_LANE=lane, XPU_TRACE=str(path)))
            assert proc.returncode == 0, proc.stderr[-3000:]
            traces[lane] = trace.read(path)
    finally:
        srv.stop()
    queued = collections.Counter(c.name for c in traces["1"].calls if c.lane)
    assert queued == {"cublasGemmEx": 3, "cublasSgemm_v2": 3, "cublasSetStream_v2": 4, "cublasSetWorkspace_v2": 3}
    gemms = [collections.Counter(c.name for c in t.calls if c.seq and "gemm" in c.name.lower())
             for t in traces.values()]
    assert gemms[0] == gemms[1] == {"cublasGemmEx": 3, "cublasSgemm_v2": 5}
    assert sum(m.n for m in traces["1"].messages) == sum(m.n for m in traces["0"].messages)
    served = re.findall(r"library calls: .*?cublas=(\d+)", srv.log())
    assert len(served) == 2 and served[0] == served[1], served
    for t in traces.values():  # each GEMM's time on its handle's stream, as the driver's work (not the one refused)
        ran = {m.seq: len(m.per_call or ()) for m in t.messages}  # a failed call's item is not timed
        works = collections.Counter((m.seq, o.pos) for m in t.messages for o in m.gpu_ops if o.op == trace.WORK)
        items = collections.Counter((c.seq, c.pos) for c in t.calls if c.seq and "gemm" in c.name.lower()
                                    and c.pos < ran.get(c.seq, 0))
        assert sum(items.values()) == 7 and all(works[item] >= n for item, n in items.items()), (works, items)


ENQUEUED = ("cuLaunchKernel", "cuMemsetD8Async")  # what the async mix queues on its stream


@pytest.mark.parametrize("where", ["sim", pytest.param("cuda backend", marks=pytest.mark.sim_only(
    reason="the cuda backend on a stand-in libcuda chained to a sim server"))])
def test_a_trace_records_each_enqueued_calls_gpu_time(run_on, workloads: Path, tmp_path: Path, where: str,
                                                       request: pytest.FixtureRequest) -> None:
    """By default a trace holds, for each kernel and memset the server queued (the lane's records included), its
    GPU time on its stream (events around it on the cuda backend, here on a stand-in libcuda; the sim's own time
    on the sim), at the item of the message it went in, and each synchronizing call with its wait; the worker
    times a lane's records as their item. XPU_TRACE_GPU=0 turns the GPU's part off."""
    address = request.getfixturevalue("chained")[0].address if where == "cuda backend" else None
    proc = run_on([str(workloads), "async", "5"], address=address, XPU_TRACE=str(tmp_path / "gpu.trace"))
    assert proc.returncode == 0, proc.stderr
    t = trace.read(tmp_path / "gpu.trace")
    assert t.header["version"] == 3 and t.header["backend"] == ("cuda" if address else "sim")
    queued = [c for c in t.calls if c.seq and c.name in ENQUEUED]
    works = [(m, o) for m in t.messages for o in m.gpu_ops if o.op == trace.WORK]
    assert len(works) == len(queued) == 5 * 17 and any(c.lane for c in queued)
    assert collections.Counter(o.a for _, o in works) == collections.Counter(c.stream for c in queued), \
        "each on the stream its call named"
    assert all(o.b > 0 and o.pos < len(m.per_call) for m, o in works)
    assert all(m.gpu == sum(o.b for o in m.gpu_ops if o.op == trace.WORK) for m in t.messages if m.gpu_ops)
    syncs = collections.Counter(trace.GPU_OPS_NAMES[o.op] for m in t.messages for o in m.gpu_ops if o.op != trace.WORK)
    assert syncs == {"sync_stream": 5, "sync_all": 1}  # its cuStreamSynchronize each round, cuCtxSynchronize at exit
    assert shares.lane_items(t) and all(None not in m.per_call for m in t.messages), "lane items timed too"
    calls = json.loads(xpu_perf("calls", tmp_path / "gpu.trace", "--json").stdout)
    assert calls["gpu_s"] == pytest.approx(sum(o.b for _, o in works) / 1e9)
    off = record(run_on, tmp_path / "off.trace", workloads, "async", 5, XPU_TRACE_GPU="0")
    assert not any(m.gpu_ops or m.gpu for m in off.messages)


def test_trace_starts_with_the_wake_up_probe(run_on, workloads: Path, tmp_path: Path) -> None:
    """The probe's points for each end, what blocking costs a wait on the data connection, and the client's spin
    window (the model needs to know which waits blocked)."""
    t = record(run_on, tmp_path / "sync.trace", workloads, "sync", 5, XPU_SPIN_US="150")
    for end in ("client", "server"):
        points = t.header["wake"][end]
        assert [idle for idle, _ in points] == list(wake.IDLE_NS)
        assert all(0 <= extra < 50_000_000 for _, extra in points)
    assert t.header["data"] and 0 <= t.header["wake"]["blocked"] < 50_000_000
    assert t.header["spin_us"] == 150
    assert model.Model(t).machines.spin == 150_000
    linked = record(run_on, tmp_path / "linked.trace", workloads, "sync", 5, XPU_LINK_RTT_US="100")
    assert linked.header["wake"] is None, "an emulated link's holds would be measured, not the machines"
    zero = record(run_on, tmp_path / "zero.trace", workloads, "sync", 5, XPU_LINK_RTT_US="0")
    assert zero.link == {"rtt_us": 0.0, "gbps": 0.0, "on": True}, "set, even to 0: emulated"
    assert zero.header["wake"] is not None, "a link that delays nothing leaves the machines to measure"


def test_probe_asks_for_a_bounded_wait(server) -> None:
    client = PyClient(server.address)
    try:
        client.conn.request({"op": "probe", "busy_ns": 1_000})
        for bad in (-1, PROBE_BUSY_MAX_NS + 1, "soon", None):
            with pytest.raises(CudaError, match="probe: busy_ns must be an integer"):
                client.conn.request({"op": "probe", "busy_ns": bad})
    finally:
        client.conn.close()


def test_probe_stays_on_zeromq_where_the_data_connection_refuses_its_call(server, monkeypatch) -> None:
    """The probe's round trips on the data connection are a call the server may refuse (a GPU's worker before the
    application made a context): then it asks once, and measures the server on ZeroMQ, without `blocked`."""
    client = PyClient(server.address)
    try:
        conn = client.conn
        spin_ns = conn.spin_ns
        answered = wake.probe(conn)
        assert isinstance(answered["blocked"], int) and conn.spin_ns == spin_ns, "the client's spin as it was"
        monkeypatch.setattr(wake, "PING", CALLS["cuDeviceGetCount"])  # a call the client never sends: refused
        refused = wake.probe(conn)
        assert refused["blocked"] is None and [i for i, _ in refused["server"]] == list(wake.IDLE_NS)
    finally:
        client.conn.close()


@pytest.mark.parametrize("link", [{"rtt_us": -1, "gbps": 0}, {"rtt_us": 0, "gbps": "fast"},
                                  {"rtt_us": 0, "gbps": 0, "on": "yes"}])
def test_init_refuses_a_malformed_link(server, link: dict) -> None:
    client = PyClient(server.address)
    try:
        with pytest.raises(CudaError, match="link: rtt_us and gbps must be"):
            client.conn.request({"op": "init", "link": link})
        assert client.mem_info()[1] > 0, "the session goes on"
    finally:
        client.conn.close()


def test_a_traced_call_goes_its_way_and_the_trace_is_written_while_a_sync_call_waits(server, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """What recording adds to a call's way to the server is an append: the recorder writes nothing (names,
    numbers, packing, compression) of the asynchronous calls it is told of, nor of the message that carries
    them, until a synchronous call waits for the server's answer, and writes them then; at the end the trace
    holds every call and message, with the server's times."""
    from pyclient import CTX

    from xpuremote.client import trace as client_trace
    from xpuremote.client.connection import Connection

    path = tmp_path / "written.trace"
    conn = Connection(server.address, measure=True)
    recorder = client_trace.Recorder(str(path), {})
    monkeypatch.setattr(client_trace, "RECORDER", recorder)
    writes: list[str] = []
    for name in ("call", "lane_calls", "message", "gpu"):
        method = getattr(recorder.writer, name)
        monkeypatch.setattr(recorder.writer, name, lambda *a, _m=method, _n=name: (writes.append(_n), _m(*a))[1])

    def traced(symbol: str, *args: int) -> Any:  # as the driver's dispatcher reports a call
        entry = recorder.begin()
        try:
            if CALLS[symbol].cls == "async":
                return conn.post(CALLS[symbol], list(args), CTX)
            return conn.call(CALLS[symbol], list(args), CTX)
        finally:
            recorder.end(CALLS[symbol], entry, 0)

    try:
        conn.post(CALLS["cuCtxCreate_v2"], [CTX, 0, 0], None)
        ptr = int.from_bytes(traced("cuMemAlloc_v2", 8, 1 << 20)[1][0], "little")
        written = len(writes)
        for value in range(5):
            traced("cuMemsetD8Async", ptr, value, 1 << 20, 0)
        conn.flush()  # they go out as an asynchronous batch
        assert writes[written:] == [], "nothing written on the way of the calls and their message"
        traced("cuCtxSynchronize")
        assert writes[written:].count("call") >= 6, writes[written:]  # the alloc's and the five memsets
    finally:
        conn.close()
        client_trace.stop()
    t = trace.read(path)
    assert [(c.name, c.seq, c.pos) for c in t.calls] == [
        ("cuMemAlloc_v2", 1, 2), *[("cuMemsetD8Async", 2, i) for i in range(5)], ("cuCtxSynchronize", 3, 0)]
    assert [(m.seq, m.kind, m.n) for m in sorted(t.messages, key=lambda m: m.seq)][:3] == [
        (1, "sync", 3), (2, "async", 5), (3, "sync", 1)]
    assert all(m.server is not None for m in t.messages if m.seq <= 3)


def test_a_report_the_trace_cannot_record_is_logged_and_the_session_goes_on(server, tmp_path: Path, monkeypatch,
                                                                            caplog) -> None:
    """The trace is written while a call waits for its answer: an event it cannot record (a server's timing that is
    not [seq, server_ns, per_call]) is logged and dropped there, and the call, the next ones and the rest of the
    trace go on."""
    from pyclient import CTX

    from xpuremote.client import trace as client_trace
    from xpuremote.client.connection import Connection

    path = tmp_path / "bad.trace"
    conn = Connection(server.address, measure=True)
    monkeypatch.setattr(client_trace, "RECORDER", client_trace.Recorder(str(path), {}))
    try:
        conn.post(CALLS["cuCtxCreate_v2"], [CTX, 0, 0], None)
        client_trace.RECORDER.timed([[7]])
        assert [conn.call(CALLS["cuCtxSynchronize"], [], CTX)[0] for _ in range(2)] == [0, 0]
    finally:
        conn.close()
        client_trace.stop()
    assert "could not record an event (timed)" in caplog.text
    assert [(m.seq, m.kind) for m in sorted(trace.read(path).messages, key=lambda m: m.seq)][:2] == [
        (1, "sync"), (2, "sync")]


def test_trace_counts_bytes_each_way(run_on, workloads: Path, tmp_path: Path) -> None:
    t = record(run_on, tmp_path / "bytes.trace", workloads, "bytes", 3)
    assert sum(m.up for m in t.messages) >= 3 * CHUNK
    assert sum(m.down for m in t.messages) >= 3 * CHUNK


def test_trace_is_a_few_bytes_per_call(run_on, workloads: Path, tmp_path: Path) -> None:
    path = tmp_path / "async.trace"
    t = record(run_on, path, workloads, "async", 300)
    records = len(t.calls) + len(t.messages)
    assert records > 5000
    # 7.6-8.0 bytes a record on the 2-core VM (timing noise decides how well the times compress);
    # uncompressed records would be 15-25
    assert path.stat().st_size / records < 10, f"{path.stat().st_size} bytes for {records} records"


def test_trace_cut_short_reads_up_to_its_last_block(run_on, workloads: Path, tmp_path: Path) -> None:
    path = tmp_path / "async.trace"
    whole = record(run_on, path, workloads, "async", 300)
    cut = tmp_path / "cut.trace"
    cut.write_bytes(path.read_bytes()[:-10])  # its last block damaged, as by a process killed while writing
    part = trace.read(cut)
    assert part.end is None and 0 < len(part.calls) < len(whole.calls)
    assert part.calls == whole.calls[: len(part.calls)]


def test_not_a_trace_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.trace"
    bogus.write_bytes(b"not a trace at all")
    with pytest.raises(trace.TraceError, match="not an xpuremote trace"):
        trace.read(bogus)
    proc = xpu_perf("predict", bogus)
    assert proc.returncode != 0 and "not an xpuremote trace" in proc.stderr


# ---- the emulated link ---------------------------------------------------------------------------
def test_emulated_rtt_delays_each_round_trip(run_on, workloads: Path, tmp_path: Path) -> None:
    plain = record(run_on, tmp_path / "plain.trace", workloads, "sync", 100)
    slow = record(run_on, tmp_path / "slow.trace", workloads, "sync", 100, XPU_LINK_RTT_US="2000")
    delay = sum(m.kind == "sync" for m in slow.messages) * 2e-3
    assert delay < slow.span_ns / 1e9 < plain.span_ns / 1e9 + delay * 2
    assert slow.link == {"rtt_us": 2000.0, "gbps": 0.0, "on": True}


def test_emulated_bandwidth_limits_bytes(run_on, workloads: Path, tmp_path: Path) -> None:
    plain = record(run_on, tmp_path / "plain.trace", workloads, "bytes", 4)
    slow = record(run_on, tmp_path / "slow.trace", workloads, "bytes", 4, XPU_LINK_GBPS="1")
    on_wire = sum(m.up + m.down for m in slow.messages) * 8 / 1e9  # seconds at 1 Gbit/s
    assert on_wire < slow.span_ns / 1e9 < plain.span_ns / 1e9 + on_wire * 2


# ---- the model on traces made by hand ---------------------------------------------------------------
def synthetic(msgs: list[trace.Message], span_ns: int) -> trace.Trace:
    t = trace.Trace({"version": trace.VERSION}, messages=msgs, end=span_ns)
    t.calls.append(trace.Call("cuCtxSynchronize", "sync", 0, span_ns, 0, 0, 0))
    return t


def sync_msg(sent: int, wait: int = 100_000, server: int = 40_000, up: int = 100, down: int = 100) -> trace.Message:
    return trace.Message(sent + 1, "sync", sent, up, 1, wait, down, server, [server], None)


def test_model_adds_one_rtt_per_round_trip() -> None:
    t = synthetic([sync_msg(i * 1_000_000) for i in range(10)], 10_000_000)
    m = model.Model(t)
    assert m.predict(model.Network()).predicted_s == pytest.approx(0.010)
    p = m.predict(model.Network(rtt_us=500))
    assert p.predicted_s == pytest.approx(0.010 + 10 * 500e-6)
    assert p.breakdown.round_trips == 10 and p.breakdown.latency == pytest.approx(10 * 500e-6)


def test_model_queues_bytes_on_the_link() -> None:
    big = trace.Message(1, "async", 0, 125_000_000, 1, 0, 0, 1_000, [1_000], None)  # 1 s at 1 Gbit/s
    t = synthetic([big, sync_msg(10_000)], 1_000_000)
    p = model.Model(t).predict(model.Network(gbps=1))
    # the sync message goes out behind the gigabit of the async one and waits for it
    assert p.predicted_s == pytest.approx(1.0 + 0.001, rel=0.01)


def test_model_hides_async_work_behind_the_client() -> None:
    # an async batch whose server work ends before the client's next round trip starts costs nothing
    work = trace.Message(1, "async", 0, 200, 10, 0, 0, 300_000, None, None)
    t = synthetic([work, sync_msg(2_000_000)], 3_000_000)
    assert model.Model(t).predict(model.Network(rtt_us=100)).predicted_s == pytest.approx(0.003 + 100e-6)


def test_model_shares_an_untimed_lane_item_among_its_records() -> None:
    """A lane's records are one item of their message. Where the worker did not time it, the item gets what the
    message's time leaves after the items it timed, less the worker's time beyond its items in a message without a
    lane; its records share that. They cost the application their time in C, wait for nothing, and `no async`
    makes each one a round trip of its own."""
    plain = trace.Message(1, "sync", 0, 100, 1, 100_000, 100, 50_000, [40_000], None)  # 10 µs beyond its item
    laned = trace.Message(2, "sync", 1_000_000, 400, 4, 100_000, 100, 100_000, [None, 30_000], None)
    t = trace.Trace({"version": trace.VERSION}, messages=[plain, laned], end=2_000_000)
    records = [trace.Call("cuLaunchKernel", "async", 900_000 + i, 900_100 + i, 0, 2, 0, lane=True) for i in range(3)]
    t.calls = [trace.Call("cuCtxSynchronize", "sync", 0, 100_000, 0, 1, 0), *records,
               trace.Call("cuCtxSynchronize", "sync", 1_000_000, 1_100_000, 0, 2, 1)]
    assert shares.item_times(t) == {1: [40_000], 2: [60_000, 30_000]}
    assert shares.call_shares(t) == [40_000, 20_000, 20_000, 20_000, 30_000]
    rows = {r.name: r for r in by_call.by_call(t)}
    assert (rows["cuLaunchKernel"].server_ns, rows["cuLaunchKernel"].inside_ns) == (60_000, 300)
    assert (rows["cuLaunchKernel"].waits, rows["cuCtxSynchronize"].waits) == (0, 2)
    off = whatif.without(model.Model(t), whatif.OFF["no async"])
    assert sorted((m.server, m.up) for m in off.msgs) == [(20_000, 100)] * 3 + [(40_000, 100), (50_000, 100)]
    assert off.predict(model.Network()).breakdown.round_trips == 5


def gpu_loop(rtt_ns: float, lag: int, steps: int = 40) -> tuple[trace.Trace, float]:
    """A GPU-bound loop and the trace a cuda server's session would record of it, made by hand (each time below is
    chosen, not measured), over a link of `rtt_ns`; with the run's true length. Each step sends one async message
    (a 1 ms kernel and an event recorded after it on stream 1, 20 µs of the server's time), computes 30 µs, waits
    in cuEventSynchronize for the event of `lag` steps before (a sync message, 5 µs of the server's time besides
    the wait), then computes 100 µs. lag 1: the client runs a step ahead and the GPU never idles; lag 0: the GPU
    idles for each round trip. The transport costs 10 µs each way."""
    one_way, kernel = rtt_ns / 2 + 10_000, 1_000_000
    msgs, events, t, gpu_free, server_free, seq = [], [], 0.0, 0.0, 0.0, 0
    for i in range(steps):
        begun = max(t + one_way, server_free)
        gpu_free = max(begun, gpu_free) + kernel
        events.append(gpu_free)
        server_free = begun + 20_000
        ops = [trace.GpuOp(0, trace.WORK, 1, kernel), trace.GpuOp(1, trace.RECORD, 1, i)]
        msgs.append(trace.Message(seq := seq + 1, "async", round(t), 300, 2, 0, 0, 20_000, [10_000, 10_000],
                                  kernel, ops))
        t += 30_000
        begun = max(t + one_way, server_free)
        target = i - lag
        release = max(begun + 5_000, events[target] if target >= 0 else 0.0)
        server_free = release
        ops = [trace.GpuOp(0, trace.SYNC_EVENT, target, round(release - begun - 5_000))] if target >= 0 else []
        wait = release + one_way - t
        msgs.append(trace.Message(seq := seq + 1, "sync", round(t), 100, 1, round(wait), 100,
                                  round(release - begun), [round(release - begun)], None, ops))
        t += wait + 100_000
    recorded = trace.Trace({"version": trace.VERSION, "backend": "cuda"}, messages=msgs, end=round(t))
    recorded.calls.append(trace.Call("cuEventSynchronize", "sync", 0, round(t), 0, 0, 0))
    return recorded, t


def test_model_overlaps_a_gpu_bound_loop_with_the_network() -> None:
    """A GPU-bound loop whose client runs a step ahead of the GPU (a trace made by hand, gpu_loop): on a link of
    200 µs its steps stay the GPU's 1 ms, and the model says so from the trace recorded at 0 µs, where it used to
    add the RTT to every step's wait for the GPU. A loop that waits for each step's own kernel still pays the RTT
    every step, and the model still adds it."""
    rtt = 200_000
    for lag, slower in ((1, 0.0), (0, 40 * rtt)):
        recorded, span = gpu_loop(0, lag)
        _, truth = gpu_loop(rtt, lag)
        assert truth - span == pytest.approx(slower, abs=2 * rtt)
        m = model.Model(recorded)
        assert m.predict(model.Network()).predicted_s == pytest.approx(span / 1e9, rel=1e-6)
        predicted = m.predict(model.Network(rtt_us=rtt / 1e3)).predicted_s
        assert predicted == pytest.approx(truth / 1e9, rel=0.01), lag
    recorded, span = gpu_loop(0, 1)
    plain = model.Model(recorded).without_gpu()  # the server's times as recorded, its waits for the GPU fixed
    assert plain.predict(model.Network(rtt_us=rtt / 1e3)).predicted_s > (span + 30 * rtt) / 1e9, "an RTT a step"


def test_whatif_keeps_the_gpu_work_of_the_calls_it_turns_off() -> None:
    """`no async` makes each launch of gpu_loop a round trip of its own: its kernel goes with it, the event record
    stays in its message, and the GPU's work is the same. A round trip more a step over 200 µs still leaves the
    client ahead of the GPU's 1 ms steps: the loop takes as long as recorded, give or take the last step."""
    recorded, span = gpu_loop(0, 1)
    recorded.calls += [trace.Call("cuLaunchKernel", "async", m.sent - 1_000, m.sent - 900, 1, m.seq, 0)
                       for m in recorded.messages if m.kind == "async"]
    off = whatif.without(model.Model(recorded), whatif.OFF["no async"])
    work = [step[3] for m in off.msgs for step in m.gpu if step[1] == trace.WORK]
    assert len(work) == 40 and sum(work) == 40 * 1_000_000
    assert sum(step[1] == trace.RECORD for m in off.msgs for step in m.gpu) == 40
    assert off.predict(model.Network(rtt_us=200)).predicted_s == pytest.approx(span / 1e9, abs=0.001)


def test_model_keeps_a_gpu_queue_per_stream() -> None:
    """The queues, op by op: work on one stream queues behind that stream's work only; an event is reached when
    the work before it on its stream is done; a stream waiting for an event starts after it; a stream's sync waits
    for that stream, the legacy stream's and the context's for all."""
    q = model.Queues()
    ms = 1_000_000
    assert q.run([(0, trace.WORK, 1, ms), (0, trace.WORK, 2, ms), (0, trace.RECORD, 1, 7)], 0) == 0
    assert q.free == {1: ms, 2: ms} and q.events == {7: ms}
    assert q.run([(10, trace.WAIT, 2, 7), (10, trace.WORK, 2, ms), (20, trace.SYNC_STREAM, 1, 0)], 100) == ms
    assert q.free[2] == 2 * ms
    assert q.run([(0, trace.SYNC_EVENT, 7, 0)], 0) == ms
    assert q.run([(0, trace.SYNC_STREAM, 0, 0)], 0) == q.run([(0, trace.SYNC_ALL, 0, 0)], 0) == 2 * ms
    assert q.run([(0, trace.SYNC_ALL, 0, 0)], 5 * ms) == 5 * ms, "nothing queued: no wait"


def test_model_of_a_sim_trace_leaves_its_gpu_times_in_the_server() -> None:
    """The sim runs each call to its end, so its GPU times are part of the server's: the model queues nothing."""
    recorded, _ = gpu_loop(0, 1)
    sim = trace.Trace({**recorded.header, "backend": "sim"}, recorded.calls, recorded.messages, recorded.end)
    assert all(not m.gpu for m in model.messages(sim)) and any(m.gpu for m in model.messages(recorded))


def test_a_gpu_trace_reads_its_versions(tmp_path: Path) -> None:
    """Version 3 writes GPU operations with the trace's stream and event numbers; a server of before (one GPU time
    per message) is still written, and read, as such."""
    w = trace.TraceWriter(tmp_path / "t.trace", {})
    w.call("cuLaunchKernel", 1, w.epoch, w.epoch + 100, 0x5000, 1, 0)
    w.message(1, 0, w.epoch, 100, 2, 0, 0, 1_000, [500, 500])
    w.message(2, 1, w.epoch + 10, 100, 1, 5_000, 100, 1_000, [1_000])
    w.gpu(1, [0, trace.WORK, 0x5000, 7_000, 1, trace.RECORD, 0x5000, 0xE0, 1, trace.WAIT, 0x6000, 0xE0])
    w.gpu(2, [0, trace.SYNC_EVENT, 0xE0, 900, 0, trace.SYNC_STREAM, 0x5000, 10])
    w.gpu(3, 12_300)
    w.message(3, 0, w.epoch + 20, 100, 1, 0, 0, 1_000, [1_000])
    w.close()
    t = trace.read(tmp_path / "t.trace")
    first, second, old = t.messages
    assert [(o.op, o.a, o.b) for o in first.gpu_ops] == [(trace.WORK, 1, 7_000), (trace.RECORD, 1, 0),
                                                         (trace.WAIT, 2, 0)] and first.gpu == 7_000
    assert [(o.op, o.a, o.b) for o in second.gpu_ops] == [(trace.SYNC_EVENT, 0, 900), (trace.SYNC_STREAM, 1, 10)]
    assert old.gpu == 12_300 and old.gpu_ops == [] and t.calls[0].stream == 1


def test_wake_up_cost_is_interpolated_and_flat_beyond() -> None:
    w = model.Wake.from_header([[1_000_000, 20_000], [100_000, 0], [3_000_000, 50_000]])
    assert [w.extra(i) for i in (0, 100_000, 550_000, 1_000_000, 2_000_000, 10_000_000)] == \
        pytest.approx([0, 0, 10_000, 20_000, 35_000, 50_000])
    assert model.Wake.from_header(None).extra(1e9) == 0


def test_model_adds_the_wake_up_cost_of_longer_waits() -> None:
    msgs = [sync_msg(i * 1_000_000) for i in range(10)]
    plain = synthetic(msgs, 10_000_000)
    probed = synthetic(msgs, 10_000_000)
    probed.header["wake"] = {"client": [[100_000, 0], [1_000_000, 20_000]], "server": [[1_000_000, 10_000]]}
    net = model.Network(rtt_us=900)
    woken = model.Model(probed).predict(net)
    extra = woken.predicted_s - model.Model(plain).predict(net).predicted_s
    b = woken.breakdown
    assert b.client + b.latency + b.bytes + b.transport + b.server == pytest.approx(woken.predicted_s)
    # each wait grows from 100 µs to 1 ms (client: 0 -> 20 µs late); the server idled about 1 ms
    # between requests either way, so its wake-up cost is the same as recorded
    assert extra == pytest.approx(10 * 20e-6, rel=0.05)


def test_model_wakes_a_spinning_client_only_past_its_spin_window() -> None:
    """A client that spins 300 µs before it blocks (the window its trace's header gives) pays no wake-up in a wait
    within the window, as in the recorded waits of 100 µs it spun through, and the probe's wake-up of a blocked
    receive in a wait past it. A client that never spins blocked in every wait, recorded and predicted, so a flat
    wake-up cost changes nothing."""
    msgs = [sync_msg(i * 1_000_000) for i in range(10)]
    plain = model.Model(synthetic(msgs, 10_000_000))
    wake_up = {"client": [[100_000, 30_000], [1_000_000, 30_000]], "server": [], "blocked": 20_000}

    def extra(spin_us: int, net: model.Network) -> float:
        t = synthetic(msgs, 10_000_000)
        t.header.update(wake=wake_up, spin_us=spin_us)
        pred = model.Model(t).predict(net)
        b = pred.breakdown
        assert b.client + b.latency + b.bytes + b.transport + b.server == pytest.approx(pred.predicted_s)
        return pred.predicted_s - plain.predict(net).predicted_s

    within, past = model.Network(rtt_us=150), model.Network(rtt_us=900)  # waits of 250 µs and 1 ms
    assert extra(300, within) == pytest.approx(0, abs=1e-9)
    assert extra(300, past) == pytest.approx(10 * 30e-6), "each wait blocked for 700 µs: 30 µs to wake up"
    assert extra(0, past) == pytest.approx(0, abs=1e-9)
    wake_up["client"] = [[100_000, 0], [1_000_000, 0]]  # ZeroMQ's probe found nothing: the data connection's cost
    assert extra(300, past) == pytest.approx(10 * 20e-6)


# ---- the command line -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def async_trace(tmp_path_factory, shim: Path, server, workloads: Path) -> Path:
    from conftest import shim_env

    path = tmp_path_factory.mktemp("perf") / "async.trace"
    env = shim_env(shim, server.address, XPU_TRACE=str(path))
    subprocess.run([str(workloads), "async", "100"], env=env, check=True, capture_output=True, timeout=120)
    return path


def test_predict_json(async_trace: Path) -> None:
    proc = xpu_perf("predict", async_trace, "--rtt-us", "200", "--gbps", "10", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["predicted_s"] > out["trace_s"] > 0 and out["slowdown"] == pytest.approx(
        out["predicted_s"] / out["trace_s"])
    parts = out["breakdown_s"]
    assert sum(parts.values()) == pytest.approx(out["predicted_s"], rel=1e-6)
    text = xpu_perf("predict", async_trace, "--rtt-us", "200").stdout
    assert "where the predicted time goes" in text and "round trips" in text


def test_sweep_plots_a_heat_map(async_trace: Path, tmp_path: Path) -> None:
    png = tmp_path / "sweep.png"
    proc = xpu_perf("sweep", async_trace, "--plot", png, "--json")
    assert proc.returncode == 0, proc.stderr
    grid = json.loads(proc.stdout)["slowdown"]
    assert all(row == sorted(row) for row in grid), "slowdown grows with the RTT"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_requirements_frontier(async_trace: Path) -> None:
    out = json.loads(xpu_perf("requirements", async_trace, "--max-slowdown", "10%", "--json").stdout)
    rtts = [p["max_rtt_us"] or 0.0 for p in out["frontier"]]
    assert rtts == sorted(rtts) and rtts[-1] > 0, "more bandwidth never needs a shorter RTT"
    text = xpu_perf("requirements", async_trace, "--max-slowdown", "10%").stdout
    assert "max RTT" in text and "Gbit/s" in text.splitlines()[-1]


def test_whatif_shows_what_each_optimisation_buys(async_trace: Path) -> None:
    out = json.loads(xpu_perf("whatif", async_trace, "--rtt-us", "100", "--json").stdout)
    recorded = out["as recorded (all optimisations)"]
    assert out["no async"]["predicted_s"] > 2 * recorded["predicted_s"], "the launch-bound mix relies on async"
    assert out["no async"]["round_trips"] > recorded["round_trips"] + 100 * 16
    assert out["no local answers"]["predicted_s"] > recorded["predicted_s"]


def test_calls_says_where_the_time_went_by_call(async_trace: Path) -> None:
    """`xpu-perf calls`: each call name once, with its count, the server's time on it (its share of each
    message) and the waits it ended, all of them adding up to the trace's; --from-ms leaves earlier calls out."""
    recorded = trace.read(async_trace)
    out = json.loads(xpu_perf("calls", async_trace, "--top", "1000", "--json").stdout)
    rows = {r["name"]: r for r in out["calls"]}
    own = rows.pop("(xpuremote's own requests)", {"count": 0})
    assert len(out["calls"]) == len(rows) + bool(own["count"])
    assert sum(r["count"] for r in rows.values()) == len(recorded.calls)
    assert rows["cuLaunchKernel"]["count"] >= 100 and rows["cuLaunchKernel"]["cls"] == "async"
    items = shares.item_times(recorded)  # the server's per item; a lane's records one item, estimated if untimed
    assert all(sum(items[m.seq]) <= m.server for m in recorded.messages if m.seq in items)
    assert sum(r["server_ns"] for r in [*rows.values(), own] if r["count"]) == pytest.approx(
        sum(sum(t) for t in items.values()), abs=len(rows) + 1)
    assert sum(r["waits"] for r in rows.values()) == sum(m.kind != "async" for m in recorded.messages)
    assert out["gpu_s"] == pytest.approx(sum(m.gpu or 0 for m in recorded.messages) / 1e9) and out["gpu_s"] > 0
    inside = [r["inside_ns"] for r in out["calls"]]
    assert inside == sorted(inside, reverse=True)
    later = json.loads(xpu_perf("calls", async_trace, "--from-ms", str(recorded.span_ns / 2e6), "--json").stdout)
    assert 0 < sum(r["count"] for r in later["calls"]) < len(recorded.calls)
    text = xpu_perf("calls", async_trace, "--top", "3").stdout
    assert out["calls"][0]["name"] in text and "the other" in text


def test_validate_compares_the_faster_two_thirds() -> None:
    nets = [model.Network(), model.Network(100)]
    rounds = validate.Rounds(nets, [(r, span, [span, span + 0.1]) for r, span in enumerate((1.0, 2.0, 9.0))],
                             [(r, i, 1.0 + 0.1 * i + r) for r in range(3) for i in range(2)])
    trace_s, points = rounds.compare()
    assert trace_s == 1.5, "the slowest recording is left out"
    assert [(p.predicted_s, p.measured_s) for p in points] == [(1.5, 1.5), (1.6, pytest.approx(1.6))]
    trace_s, points = rounds.compare([2, 2, 0])  # drawn again: a round may come twice
    assert trace_s == 5.0 and points[0].measured_s == 2.0
    assert validate.resampled_worst(rounds, 5, 3) == validate.resampled_worst(rounds, 5, 3), "seeded"


def test_validate_command_line(shim: Path, workloads: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if BACKEND == "sim":  # validate starts a server of its own
        monkeypatch.setenv("XPU_SIM_KERNELS", SIM_KERNELS)
    out = xpu_perf("validate", "--rtt-us", "0,500", "--gbps", "0", "--backend", BACKEND, "--repeat", "1", "--json",
                   "--plot", tmp_path / "v.png", "--", workloads, "sync", "20")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [p["rtt_us"] for p in result["points"]] == [0, 500]
    slow = result["points"][1]
    # 40 round trips, each 500 µs longer, less what the idle ends no longer pay to wake up (the
    # emulation spins out the last 300 µs of each hold): more than half of it at least
    assert slow["measured_s"] > result["trace_s"] + 40 * 250e-6
    assert abs(slow["error"]) < 0.5 and (tmp_path / "v.png").stat().st_size > 0


# ---- accuracy --------------------------------------------------------------------------------------
@pytest.mark.sim_only(reason="its bounds are set on runs against the sim")
def test_validate_predicts_the_sync_program_over_emulated_links(workloads: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The model against runs over emulated links: the round-trip-bound program (two synchronous copies around
    each kernel, 200 round trips) recorded at loopback and run over RTT 50 and 1000 µs, in validate's shuffled
    rounds of three recordings and one run a link, each side's faster two thirds averaged (perfmodel/validate.py).
    The session runs as it would over such a link: its data connection, its lane, and its waits, which spin for
    the client's window before they block (none on validate's one CPU a side here: protocol/spin.py).

    The bound is loose, for a 2-core machine that other work may share: one program's runs there vary by ±10%
    and more (bench/results/perf-validate.md has the full grid and its spread), and it is lopsided, since other
    work only slows the runs, the more the longer they block (at a load average of 5, -22% at 50 µs and -32% at
    1000 µs). It still fails a model that misses the link: at 1000 µs the RTTs are over half of the run, so a
    model that left them out, counted half of them or twice them would be off by more."""
    monkeypatch.setenv("XPU_SIM_KERNELS", SIM_KERNELS)
    monkeypatch.setenv("XPU_LOG", "WARNING")
    result = validate.validate([str(workloads), "sync", "100"], rtts=(50.0, 1000.0), gbps=(0.0,), repeat=7,
                               backend="sim")
    report = validate.table(result)
    print(report)
    assert all(-0.5 <= p.error <= 0.25 for p in result.points), report


# ---- PyTorch workloads: a step's time --------------------------------------------------------------------
def test_window_prediction_adds_the_rtts_of_the_windows_own_round_trips() -> None:
    """A step window's predicted time: the recorded window and one RTT for each round trip sent inside it; the
    round trips before it (a slow start-up) move it later but add nothing to its length. The comparison of a
    torch run's step (validate._compare) takes the recording's step marks onto the trace's clock and compares
    medians of steps, and its added time, predicted against measured, is held to the aim only where the link
    adds 5%."""
    t = synthetic([sync_msg(i * 1_000_000) for i in range(10)], 10_000_000)
    m = model.Model(t)
    net = model.Network(rtt_us=500)
    assert validate.window_s(m, net, 4_000_000, 10_000_000) == pytest.approx(0.006 + 6 * 500e-6)
    assert validate.window_s(m, model.Network(), 4_000_000, 10_000_000) == pytest.approx(0.006)
    t.header["epoch_ns"] = 10**9
    recording = {"steps_s": [0.002] * 3, "window_ns": [10**9 + 4_000_000, 10**9 + 10_000_000],
                 "step_ends_ns": [10**9 + 6_000_000, 10**9 + 8_000_000, 10**9 + 10_000_000]}
    runs = [{"steps_s": [0.0] * 3, "window_ns": [0, 12_000_000], "step_ends_ns": [3_500_000, 7_000_000, 12_000_000]},
            {"steps_s": [0.0], "window_ns": [0, 2_010_000]}, "the run over RTT 2 µs died"]
    v = validate._compare("w", ["w"], t, recording, [net, model.Network(rtt_us=1), model.Network(rtt_us=2)], runs)
    first, second, third = v.points
    assert v.steps == 3 and first.recorded_s == pytest.approx(0.002)
    # two round trips a step; the run's median step, its slow last one (5 ms) aside
    assert first.predicted_s == pytest.approx(0.003) and first.measured_s == pytest.approx(0.0035)
    assert first.error == pytest.approx(0.003 / 0.0035 - 1)
    assert first.added_error == pytest.approx(0.001 / 0.0015 - 1) and first.held
    assert second.link_adds == pytest.approx(0.005) and not second.held, "the link adds under 5% of the step"
    assert third.measured_s is None and third.error is None and "died" in third.failure
    summary = validate.torch_summary([v])
    assert (summary["points"], summary["failed"], summary["held_points"], summary["held_within_aim"]) == (2, 1, 1, 0)
    assert "failed" in validate.torch_table([v]) and json.dumps(v.to_json())


@pytest.mark.sim_only(reason="PyTorch at toy sizes with the sim's kernels skipped; a GPU's figures are the GPU "
                             "check's perf stage")
def test_validate_torch_workloads_on_emulated_links(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """bench/perf_validate.py --torch on two of the issue's workloads (a training step and gpt2_generate, whose
    tokens each wait for the GPU) at four links: each recorded at loopback, then run over RTT 500 and 2,000 µs at
    10 and 100 Gbit/s, started together and timed one at a time. Exact: every point is there, with its steps and
    the tokens a step. A step over a link takes an RTT at least, measured and predicted. One run of each on a
    shared 2-core machine, whose load can slow a run (the recording's too) 3x: the prediction is bounded loosely
    (the model's figures against the aims are bench/results/perf-validate-torch-sim.md's, the full grid)."""
    monkeypatch.setenv("XPU_SIM_SKIP_KERNELS", "1")
    monkeypatch.setenv("XPU_SIM_KERNELS", f"{SIM_KERNELS},{ROOT / 'tests' / 'torch_sim_kernels.py'}")
    monkeypatch.setenv("XPU_LOG", "WARNING")
    out = tmp_path / "v.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench/perf_validate.py"), "--torch", "--size", "small",
                           "--workloads", "mlp_train,gpt2_generate", "--rtt-us", "500,2000", "--gbps", "10,100",
                           "--steps", "4", "--warmup", "1", "--torch-python", str(torch_python()), "--out", str(out)],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    print(out.with_suffix(".md").read_text())
    assert [w["workload"] for w in data["workloads"]] == ["mlp_train", "gpt2_generate"] and not data["failures"]
    for w in data["workloads"]:
        assert w["steps"] == 4 and [(p["rtt_us"], p["gbps"]) for p in w["points"]] == [
            (r, g) for r in (500, 2000) for g in (10, 100)]
        for p in w["points"]:
            # a step over the link waits for its results at least once: an RTT at least, measured and predicted
            assert p["measured_step_s"] > p["rtt_us"] * 1e-6 and p["predicted_step_s"] > p["rtt_us"] * 1e-6, p
            # a wrong window (the start-up's seconds, a unit) is off by 100x; a busy machine's steps by up to 3x
            assert 0.25 < p["predicted_step_s"] / p["measured_step_s"] < 4, p
    assert data["workloads"][1]["tokens"] == 4, "gpt2_generate makes its 4 tokens (its end token is never picked)"
