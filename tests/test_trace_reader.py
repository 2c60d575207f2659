"""The trace read into columns in C (protocol/trace_reader.c) against the Python reader, its reference: equal Traces
on a trace a real session recorded on the server, on the bench's training loop written by TraceWriter, on traces
written by hand (versions 1-3, nil where the format allows it, lane flags, several GPU_OPS records for one message,
records longer than the format's) and cut short; and anything malformed a TraceError, never a crash."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest
import zstandard
from test_perf import record, workloads  # noqa: F401  (workloads: a fixture)
from test_perf_speed import _bench

from xpuremote.protocol import trace
from xpuremote.protocol.trace import CALL, END, GPU, GPU_OPS, MESSAGE, NAME, RECORD, SYNC_ALL, WAIT, WORK


def both(path: Path) -> trace.Trace:
    """The trace at `path` as the C reader reads it, checked equal to the Python reader's."""
    assert trace.library() is not None, "trace_reader.c builds here"
    c, py = trace.read(path), trace.read(path, native=False)
    assert c.columns is not None and py.columns is None
    assert c.span_ns == py.span_ns, "known before the calls and messages are made"
    assert list.__len__(c.calls) == list.__len__(c.messages) == 0
    assert c.header == py.header and c.end == py.end and len(c.calls) == len(py.calls)
    assert c.messages == py.messages and c.calls == py.calls and c == py
    for a, b in zip(c.messages, py.messages, strict=True):  # the same types too ([] is not (), 0 is not None)
        assert [type(getattr(a, f)) for f in a.__slots__] == [type(getattr(b, f)) for f in b.__slots__]
        assert type(a.gpu_ops) is type(b.gpu_ops) and getattr(a.gpu_ops, "flat", 0) == getattr(b.gpu_ops, "flat", 0)
    assert c.span_ns == py.span_ns
    return c


def written(path: Path, header: dict, records: list[list], cut: int = 0) -> Path:
    """A trace of these records (their last `cut` bytes left out), compressed as the writer does."""
    raw = msgpack.packb({"format": "xpuremote-trace", "epoch_ns": 7, **header})
    raw += b"".join(msgpack.packb(r) for r in records)
    path.write_bytes(trace.MAGIC + zstandard.ZstdCompressor(level=3).compress(raw[:len(raw) - cut]))
    return path


V3 = [
    [NAME, 0, "cuLaunchKernel"], [NAME, 1, "cuStreamSynchronize"],
    [CALL, 0, 1, 10, 5, 1, 1, 0, 1],  # a lane record
    [CALL, 0, 1, 3, 2, 2, 1, 0, 0],
    [CALL, 1, 3, 4, 100, 1, 2, 0],  # no lane flag
    [CALL, 1, 3, -2, 7, 0, 2, 1, None, "more"],  # a nil flag, an item the format does not name
    [MESSAGE, 2, 1, 50, 80, 1, 30, 64, None, None],  # nil server and per_call
    [MESSAGE, 1, 0, -20, 100, 3, 0, 0, 12, [4, None, 6]],  # sent before the one written first; an untimed item
    [MESSAGE, 3, 2, 40, 120, 2, 0, 16, 7, []],
    [MESSAGE, 4, 0, 0, 10, 1, 0, 0, 5, [5]],  # sent with the one before it: the order written stays
    [MESSAGE, 5, 1, 9, 2 ** 40, 1, 2 ** 33, 70_000, 2 ** 32, [2 ** 32, -1]],  # numbers of every width
    [GPU_OPS, 1, [0, WORK, 1, 500, 1, RECORD, 1, 0]],
    [GPU_OPS, 2, [0, SYNC_ALL, 0, 300]],
    [GPU_OPS, 1, [2, WORK, 2, 700, 1, WAIT, 2, 0, 9]],  # message 1's again, and a number short of an operation
    [GPU_OPS, 3, [1, 2]], [GPU, 3, 9],  # no whole operation: the GPU record's time stands
    [GPU_OPS, 99, [0, WORK, 0, 1]],  # no message of its own
    [GPU, 4, 11], [GPU, 4, 12],  # the last one stands
    [NAME, 0, "cuLaunchKernel_ptsz"],  # defined again: the last one names all its calls
    [CALL, 0, 1, 5, 1, 2, 0, 0, 1],
    [END, 12345],
]


def test_equal_on_traces_written_by_hand(tmp_path: Path) -> None:
    """Version 3 with all the format allows; versions 1 and 2 (no lane flag, GPU records); a trace of no records;
    and each of them cut short at every byte of its last records."""
    t = both(written(tmp_path / "v3.trace", {"version": 3, "backend": "cuda", "link": {"rtt_us": 5}}, V3))
    assert [m.seq for m in t.messages] == [1, 2, 3, 4, 5] and t.messages[0].per_call == [400, None, 600]
    assert t.messages[0].gpu_ops == [(0, WORK, 1, 500), (1, RECORD, 1, 0), (2, WORK, 2, 700), (1, WAIT, 2, 0)]
    assert t.messages[0].gpu == 1200 and t.messages[2].gpu == 900 and t.messages[2].gpu_ops == []
    assert t.messages[3].gpu == 1200 and t.messages[1].server is None and t.messages[1].per_call is None
    assert t.messages[4].per_call == [2 ** 32 * 100, -100] and t.messages[4].up == 2 ** 40
    assert [c.lane for c in t.calls] == [True, False, False, False, True] and t.calls[0].name == "cuLaunchKernel_ptsz"
    assert t.end == 1_234_500 and t.link == {"rtt_us": 5}
    v1 = [r[:8] if r[0] == CALL else r for r in V3 if r[0] != GPU_OPS]
    both(written(tmp_path / "v1.trace", {"version": 1}, v1))
    both(written(tmp_path / "v2.trace", {"version": 2}, [r for r in V3 if r[0] != GPU_OPS]))
    assert both(written(tmp_path / "empty.trace", {"version": 3}, [])).span_ns == 0
    for cut in range(1, 120):
        t = both(written(tmp_path / "cut.trace", {"version": 3}, V3, cut))
        assert t.end is None and len(t.calls) <= 5


def test_equal_on_a_training_loops_trace_whole_cut_and_damaged(tmp_path: Path, monkeypatch) -> None:
    """bench/perf_speed.py's loop written by TraceWriter; the file cut short (the process killed) at points through
    it, reading up to its last complete record; and damaged, read in small pieces: where zstd finds the damage, what
    came before stands (else the damage reaches the records, and both readers refuse them or read the same)."""
    path = tmp_path / "loop.trace"
    _bench().write_trace(path, 10_000)
    whole = both(path)
    assert len(whole.calls) >= 10_000 and whole.end is not None and any(m.gpu_ops for m in whole.messages)
    data = path.read_bytes()
    for at in (len(data) // 2, len(data) * 3 // 4, len(data) - 10):  # past the first block
        (tmp_path / "cut.trace").write_bytes(data[:at])
        part = both(tmp_path / "cut.trace")
        assert part.end is None and 0 < len(part.calls) < len(whole.calls)
        assert part.calls == whole.calls[:len(part.calls)]
    # the same bytes each run (the header's epoch fixed), damaged at the same places
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(data[len(trace.MAGIC):])
    values = msgpack.Unpacker()
    values.feed(raw)
    values.unpack()
    raw = msgpack.packb({"version": 3}) + raw[values.tell():]
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    blocks = [compressor.compress(raw[at:at + 8192]) + compressor.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
              for at in range(0, len(raw), 8192)]  # in blocks, as the writer flushes them
    data = trace.MAGIC + b"".join(blocks) + compressor.flush()
    monkeypatch.setattr(trace, "CHUNK", 4096)
    rng, kept, refused = random.Random(5), 0, 0
    for _ in range(12):
        damaged = bytearray(data)
        damaged[rng.randrange(len(data) // 2, len(data))] ^= 1 << rng.randrange(8)
        (tmp_path / "damaged.trace").write_bytes(damaged)
        try:
            trace.read(tmp_path / "damaged.trace")
        except trace.TraceError:  # the Python reader may take what C refuses (a float for a number)
            refused += 1
            continue
        part = both(tmp_path / "damaged.trace")
        kept += part.end is None and 0 < len(part.calls) < len(whole.calls)
    assert kept >= 3 and refused < 12


def test_equal_on_a_trace_a_real_session_recorded(run_on, workloads: Path, tmp_path: Path) -> None:  # noqa: F811
    """examples/workloads.cu run on the server under XPU_TRACE: what the client wrote, read both ways."""
    record(run_on, tmp_path / "sync.trace", workloads, "sync", 30)
    t = both(tmp_path / "sync.trace")
    assert len(t.calls) > 100 and t.end is not None and all(m.per_call for m in t.messages)


@pytest.mark.parametrize(("records", "error"), [
    ([[7, 1]], "unknown record kind 7"),
    ([[MESSAGE, 1, 0, 1, 1, 1, 0, 0, None]], "a MESSAGE record not of 10 items"),
    ([[CALL, 3, 1, 1, 1, 0, 0, 0]], "calls named by number 3, which no NAME record defines"),
    ([[NAME, 0, "x"], [CALL, 0, 9, 1, 1, 0, 0, 0]], "a CALL record of an unknown class"),
    ([[MESSAGE, 1, 0, "soon", 1, 1, 0, 0, None, None]], "a number expected"),
    ([[MESSAGE, 1, 0, 1, 1, 1, 0, 0, None, [1.5]]], "a per_call item not a number"),
    ([[GPU_OPS, 1, None]], "a GPU_OPS record whose operations are not an array"),
    ([[END, 2 ** 62]], "a time out of range"),
    ([[END, 2 ** 64 - 1]], "a number expected"),
    ([5], "a record that is not an array"),
    ([[]], "an empty record"),
])
def test_malformed_records_are_trace_errors(tmp_path: Path, records: list, error: str) -> None:
    assert trace.library() is not None
    path = written(tmp_path / "bad.trace", {"version": 3}, [[NAME, 1, "cuInit"], *records])
    with pytest.raises(trace.TraceError, match=f"bad.trace: .*{error}"):
        trace.read(path)


def test_random_bytes_are_a_trace_or_a_trace_error(tmp_path: Path) -> None:
    """Fuzzed: random bytes after the header, bytes of V3 changed at random, the one byte msgpack never uses; the C
    reader gives a Trace (then equal to the Python reader's where that reads it) or a TraceError, never a crash."""
    rng = random.Random(1)
    raw = b"".join(msgpack.packb(r) for r in V3)
    header = msgpack.packb({"version": 3})
    cases = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))) for _ in range(300)]
    for _ in range(300):
        changed = bytearray(raw)
        for _ in range(rng.randrange(1, 4)):
            changed[rng.randrange(len(raw))] = rng.randrange(256)
        cases.append(bytes(changed))
    cases.append(raw[:40] + b"\xc1" + raw[40:])
    read = errors = 0
    for body in cases:
        path = tmp_path / "fuzz.trace"
        path.write_bytes(trace.MAGIC + zstandard.ZstdCompressor().compress(header + body))
        try:
            t = trace.read(path)
        except trace.TraceError:
            errors += 1
            continue
        read += 1
        try:
            py = trace.read(path, native=False)
            py.calls, py.messages  # noqa: B018  (made: a name or class the Python reader takes lazily)
            list(py.calls)
        except (trace.TraceError, LookupError):
            continue
        assert t == py
    assert read > 50 and errors > 50
