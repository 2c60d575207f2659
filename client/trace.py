"""Recording a run for xpu-perf (`XPU_TRACE=path`): every driver call and every message.

The dispatcher reports calls; the connection reports messages as they are sent and answered,
and the server's own times for them as they come back (with a later answer, for messages
that are not answered). The calls the shim queued in C as lane records are reported as the
connection takes them into a batch, each with the stamp C gave it (protocol/records.py's
lane_stamp): they are calls of that message, timed by the lane itself, so the lane stays open
under a trace and the run recorded is the run that runs. The answers C gives itself (context
questions, kept descriptors, cached answers) send nothing and are not recorded.
Reporting an event only notes it: the writing (names, stream numbers, time stamps, the lane's stamps
unpacked, msgpack and zstd) is done while a synchronous call waits for the server's answer, when the
application's thread would idle anyway, so that the traced run's path is the untraced one's plus an append
per event. The file format is protocol/trace.py's.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import abi, trace, wire
from xpuremote.protocol.calls import BY_OPCODE, CALLS, SYMBOLS, Call

CLASS_INDEX = {name: i for i, name in enumerate(trace.CLASSES)}
KIND_INDEX = {name: i for i, name in enumerate(trace.KINDS)}
INTERNAL = CLASS_INDEX["internal"]
log = logging.getLogger("xpuremote.trace")
BACKLOG = 8192  # events noted before a catch-up that no wait for an answer made


class Recorder:
    """The trace of this process's session. The calls and messages are noted as they happen, each a tuple
    appended to `backlog`, and written (named, numbered, packed, compressed) in `catch_up`: while a synchronous
    call waits for its answer, or once BACKLOG events wait. The application's path pays an append per event."""

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.writer = trace.TraceWriter(path, {"argv": command_line(), "pid": os.getpid(), **header})
        self.local = threading.local()
        self.backlog: list[tuple[Any, ...]] = []  # (method, *arguments), in the order they happened
        self.open: dict[int, _Open] = {}  # seq -> message record waiting for an answer or times
        self.lanes: dict[int, list[int]] = {}  # seq -> the positions of lane records in that message, until sent
        self.named: dict[tuple[int, int], tuple[str, int]] = {}  # a lane record's (op, opcode) -> (name, class)
        self.lock = threading.Lock()  # one thread catches up at a time

    # ---- noted as they happen (the application's and the flusher's threads) -------------------------
    def begin(self) -> int:
        self.local.queued = (0, 0)
        return time.monotonic_ns()

    def end(self, call: Call, entry: int, stream: int) -> None:
        seq, pos = getattr(self.local, "queued", (0, 0))
        self._note(self._call, call, entry, time.monotonic_ns(), stream, seq, pos)

    def queued(self, seq: int, pos: int) -> None:
        """The calling thread's call queued a request at `pos` of message `seq`."""
        self.local.queued = (seq, pos)

    def lane(self, seq: int, pos: int, records: bytes, stamps: bytes, count: int) -> None:
        """`count` lane records taken into message `seq` at `pos`, with their stamps (one each)."""
        if len(stamps) == count * abi.LANE_STAMP_SIZE:  # the records themselves are not kept: a lane may be large
            self._note(self._lane, seq, pos, b"", stamps, 0)
        else:
            self._note(self._lane, seq, pos, records, None, time.monotonic_ns())

    def sent(self, seq: int, kind: str, sent: int, up: int, n: int, items: int) -> None:
        """Message `seq` went out: `n` calls (lane records counted) in `items` items."""
        self._note(self._sent, seq, kind, sent, up, n, items)

    def answered(self, seq: int, wait: int, down: int, up: int = 0) -> None:
        """Message `seq` was answered after `wait` ns with `down` bytes; `up`: bytes that went after it (a copy's
        input on the data connection)."""
        self._note(self._answered, seq, wait, down, up)

    def timed(self, timings: list[list[Any]]) -> None:
        """The server's [seq, server_ns, per_call_ns] for messages it has finished."""
        self._note(self._timed, timings)

    def gpu_timed(self, times: list[list[Any]]) -> None:
        """The server's [seq, gpu operations] for messages whose GPU work has finished."""
        self._note(self._gpu_timed, times)

    def _note(self, *event: Any) -> None:
        backlog = self.backlog
        backlog.append(event)  # atomic: threads noting at once keep each event
        if len(backlog) >= BACKLOG:  # nothing has waited for an answer for a while
            self.catch_up()

    # ---- written --------------------------------------------------------------------------------
    def catch_up(self, wait: bool = False) -> None:
        """Write what has been noted, in its order; a thread already at it goes on with what comes meanwhile
        (`wait`: wait for it to finish, then look again)."""
        if not self.lock.acquire(blocking=wait):
            return
        try:
            backlog = self.backlog
            if self.writer.closed:  # a thread's report after the recording ended: nowhere to go
                backlog.clear()
            while backlog:
                batch = backlog[:len(backlog)]
                del backlog[:len(batch)]  # what was appended meanwhile stays
                for method, *args in batch:
                    try:  # never into the call that waits: its answer is on its way
                        method(*args)
                    except Exception:
                        log.exception("the trace could not record an event (%s)", method.__name__.lstrip("_"))
        finally:
            self.lock.release()

    def _call(self, call: Call, entry: int, ret: int, stream: int, seq: int, pos: int) -> None:
        self.writer.call(call.symbol, CLASS_INDEX.get(call.cls, INTERNAL), entry, ret, stream, seq, pos)

    def _lane(self, seq: int, pos: int, records: bytes, stamps: bytes | None, taken: int) -> None:
        self.lanes.setdefault(seq, []).append(pos)
        named = self.named
        if stamps is not None:
            rows = [(*(named.get((op, opcode)) or self._name(op, opcode)), queued - took, queued, stream)
                    for queued, stream, opcode, took, op in abi.LANE_STAMP.iter_unpack(stamps)]
        else:  # not stamped (cannot happen while the lane opens traced): named from the records, timed as taken
            rows = [(*self._name(-1, opcode), taken, taken, 0) for opcode in _opcodes(records)]
        self.writer.lane_calls(rows, seq, pos)

    def _name(self, op: int, opcode: int) -> tuple[str, int]:
        """A lane record's call, (name, class): the application's where C knew its op, else the record's."""
        call = CALLS.get(SYMBOLS[op]) if 0 <= op < len(SYMBOLS) else BY_OPCODE.get(opcode)
        if call is None:
            return "(an unknown lane record)", INTERNAL
        self.named[op, opcode] = found = call.symbol, CLASS_INDEX.get(call.cls, INTERNAL)
        return found

    def _sent(self, seq: int, kind: str, sent: int, up: int, n: int, items: int) -> None:
        self.open[seq] = _Open([seq, KIND_INDEX[kind], sent, up, n, 0, 0, None, None],
                               answered=kind == "async",  # nothing answers an async batch
                               items=items, lanes=self.lanes.pop(seq, []))

    def _answered(self, seq: int, wait: int, down: int, up: int) -> None:
        msg = self.open.get(seq)
        if msg is not None:
            msg.fields[3] += up
            msg.fields[5:7] = [wait, down]
            msg.answered = True
            self._write_if_done(msg)

    def _timed(self, timings: list[list[Any]]) -> None:
        for seq, server, per_call in timings:
            msg = self.open.get(seq)
            if msg is not None:
                msg.fields[7:9] = [server, msg.aligned(per_call)]
                msg.timed = True
                self._write_if_done(msg)

    def _gpu_timed(self, times: list[list[Any]]) -> None:
        for seq, gpu in times:
            self.writer.gpu(seq, gpu)

    def _write_if_done(self, msg: _Open) -> None:
        if msg.answered and msg.timed:
            del self.open[msg.fields[0]]
            self.writer.message(*msg.fields)

    def close(self) -> None:
        self.catch_up(wait=True)
        for seq in list(self.open):
            self.writer.message(*self.open.pop(seq).fields)  # the server's times never came
        self.writer.close()


@dataclass
class _Open:
    """A message record still waiting for its answer or for the server's times."""

    fields: list[Any]
    answered: bool = False
    timed: bool = False
    items: int = 0
    lanes: list[int] = field(default_factory=list)  # positions of lane records

    def aligned(self, per_call: list[int] | None) -> list[int | None] | None:
        """The server's times per item, None at each lane position it did not time (a server that times only
        the calls it runs one by one)."""
        if per_call is None or not self.lanes or len(per_call) != self.items - len(self.lanes):
            return per_call
        out: list[int | None] = list(per_call)
        for pos in sorted(self.lanes):
            out.insert(pos, None)
        return out


def _opcodes(records: bytes) -> list[int]:
    view, at, out = memoryview(records), 0, []
    while at < len(view):
        opcode, _, _, at = wire.lane_record(view, at)
        out.append(opcode)
    return out


def command_line() -> list[str]:
    """The program's arguments: sys.argv is empty when the program is not Python."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return list(sys.argv)


RECORDER: Recorder | None = None


def _path() -> str:
    return os.environ.get("XPU_TRACE", "").replace("%p", str(os.getpid()))  # %p: one file per process


_declined = False  # XPU_TRACE is set, and this process records nothing (decline)


def requested() -> bool:
    """This process is to record a trace (XPU_TRACE is set, and not declined)."""
    return bool(_path()) and not _declined


def decline() -> None:
    """Record no trace in this process, whatever XPU_TRACE says (the caller says why)."""
    global _declined
    _declined = True


def wanted() -> bool:
    """XPU_TRACE asks for a recording that has not begun."""
    return requested() and RECORDER is None


def start(header: dict[str, Any]) -> Recorder | None:
    """Begin recording if XPU_TRACE asks for it; called once the session is up."""
    global RECORDER
    if wanted():
        RECORDER = Recorder(_path(), header)
    return RECORDER


def stop() -> None:
    global RECORDER
    if RECORDER is not None:
        RECORDER.close()
        RECORDER = None
