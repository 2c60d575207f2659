"""Recording a run for xpu-perf (`XPU_TRACE=path`): every driver call and every message.

The dispatcher reports calls; the connection reports messages as they are sent and answered,
and the server's own times for them as they come back (with a later answer, for messages
that are not answered). The file format is protocol/trace.py's.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from xpuremote.protocol import trace
from xpuremote.protocol.calls import Call

CLASS_INDEX = {name: i for i, name in enumerate(trace.CLASSES)}
KIND_INDEX = {name: i for i, name in enumerate(trace.KINDS)}


class Recorder:
    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.writer = trace.TraceWriter(path, {"argv": command_line(), "pid": os.getpid(), **header})
        self.local = threading.local()
        self.open: dict[int, _Open] = {}  # seq -> message record waiting for an answer or times
        self.lock = threading.Lock()

    # ---- calls -----------------------------------------------------------------------------
    def begin(self) -> int:
        self.local.queued = (0, 0)
        return time.monotonic_ns()

    def end(self, call: Call, entry: int, stream: int) -> None:
        seq, pos = getattr(self.local, "queued", (0, 0))
        cls = CLASS_INDEX.get(call.cls, CLASS_INDEX["internal"])
        self.writer.call(call.symbol, cls, entry, time.monotonic_ns(), stream, seq, pos)

    def queued(self, seq: int, pos: int) -> None:
        """The calling thread's call queued a request at `pos` of message `seq`."""
        self.local.queued = (seq, pos)

    # ---- messages ----------------------------------------------------------------------------
    def sent(self, seq: int, kind: str, sent: int, up: int, n: int) -> None:
        with self.lock:
            self.open[seq] = _Open([seq, KIND_INDEX[kind], sent, up, n, 0, 0, None, None],
                                   answered=kind == "async")  # nothing answers an async batch

    def answered(self, seq: int, wait: int, down: int) -> None:
        with self.lock:
            msg = self.open.get(seq)
            if msg is not None:
                msg.fields[5:7] = [wait, down]
                msg.answered = True
                self._write_if_done(msg)

    def timed(self, timings: list[list[Any]]) -> None:
        """The server's [seq, server_ns, per_call_ns] for messages it has finished."""
        with self.lock:
            for seq, server, per_call in timings:
                msg = self.open.get(seq)
                if msg is not None:
                    msg.fields[7:9] = [server, per_call]
                    msg.timed = True
                    self._write_if_done(msg)

    def gpu_timed(self, times: list[list[int]]) -> None:
        """The server's [seq, gpu_ns] for messages whose GPU work has finished."""
        for seq, gpu_ns in times:
            self.writer.gpu(seq, gpu_ns)

    def _write_if_done(self, msg: _Open) -> None:
        if msg.answered and msg.timed:
            del self.open[msg.fields[0]]
            self.writer.message(*msg.fields)

    def close(self) -> None:
        with self.lock:
            for seq in list(self.open):
                self.writer.message(*self.open.pop(seq).fields)  # the server's times never came
        self.writer.close()


@dataclass
class _Open:
    """A message record still waiting for its answer or for the server's times."""

    fields: list[Any]
    answered: bool = False
    timed: bool = False


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


def requested() -> bool:
    """This process is to record a trace (XPU_TRACE is set)."""
    return bool(_path())


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
