"""The client's link to its worker: handshake, synchronous calls, batched asynchronous calls.

Async calls are queued and go out together, when a sync call is made, when the batch grows
past MAX_BATCH_CALLS or MAX_BATCH_BYTES, before it would grow past the server's request size
limit (which the worker reports at init; a call that alone is over it fails), or when the
flusher thread finds that nothing has been queued for the batch window (or the batch has waited
MAX_BATCH_DELAY_S); the server answers nothing for them. Their failures come back with the next
sync reply. The flusher sleeps on an alarm (client/alarm.py) that the first call of a batch sets
and the message carrying the batch clears: it wakes up only for a batch that nothing else sent in
time.

A few calls are sent at once but answered later (`call_later`: device-to-host copies into
pinned memory, host functions): their answers are read by whichever sync call comes next, or
by the flusher thread when none does, and always before any later sync call returns.

With the shim, the hottest async calls are queued in C instead (client/lane.py): their records are
taken before anything else is queued, and travel as one call of the batch (in a trace, each record is a
call of that message, timed in C).

With an emulated link (protocol/link.py), messages carry their send time; this end holds each
answer, on ZeroMQ or the data connection, until the link delivers it, and the worker does the same for
requests. The session is otherwise the one that runs without it: its data connection, its lane, its
batching and its spin before blocking.

With a trace recorder (client/trace.py), each message is reported as it is sent and answered,
with the server's times for it (on either connection) and the bytes its call's values took on
the data connection; a synchronous call has the recorder write what it noted while the answer is due.

A peer that goes away
(TCP disconnect, or ZeroMQ heartbeats unanswered) fails the call in flight and every later
one, with a message naming the server.
"""

from __future__ import annotations

import getpass
import logging
import os
import queue
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import zmq
import zmq.utils.monitor

from xpuremote.protocol import curve, errors, spin, wire
from xpuremote.protocol.calls import CALLS, Call
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.link import DATA, NO_LINK, LinkSpec, Wire, wait_until
from xpuremote.protocol.stream import KEY_BYTES as SEAL_KEY_BYTES
from xpuremote.protocol.stream import SealBroken, message_bound, valid_keys

from . import data, marshal, trace
from .alarm import Alarm
from .lane import LANE_CALL, Lane

log = logging.getLogger("xpuremote.client")

MAX_BATCH_CALLS = 256
MAX_BATCH_BYTES = 1 << 20
MAX_BATCH_DELAY_S = 1e-3  # the flusher sends a batch still growing once it has waited this long
HEARTBEAT_MS = 1000
RECEIVE_SLICE_MS = 100  # a wait for an answer looks at the monitor (and its deadline) this often
RIDE_BYTES = 64 << 10  # an answer the application reads later that is at most this large rides with a batch's
SET_CONTEXT = CALLS["cuCtxSetCurrent"]
Rider = tuple[int, Call, list[Any], Callable[[int, list[Any]], None]]  # (index in its batch, call, args, on_answer)



def _nothing() -> None:
    pass


# Set by the shim: makes a thread of the client's ready to run application code (interpose/core.c).
native_thread_init: Callable[[], None] = _nothing

def _beside(values: list[wire.Data]) -> tuple[int, int]:
    """Bytes a call's values took on the data connection beside its message: (up, down)."""
    return sum(v.size for v in values if not v.asked), sum(v.size for v in values if v.asked)


class ServerGone(CudaError):
    pass


class NoAnswer(ServerGone):
    """The server said nothing within the time a request had."""


class Connection:
    def __init__(self, address: str, connect_timeout_s: float = 10.0, batch_window_us: float = 50.0,
                 link: LinkSpec = NO_LINK, measure: bool = False, measure_gpu: bool = False, spin_us: int = 0,
                 position: int = 0) -> None:
        self.address = address
        self.position = position  # which of the servers XPU_SERVER names: the one whose XPU_SERVER_KEY it takes
        self.ctx = zmq.Context()
        self.lock = threading.RLock()
        # held by the flusher while its batch goes out, after it let go of `lock`: the application's threads
        # queue their calls meanwhile; whoever uses the socket next (under `lock`) waits for it (_sent)
        self.sending = threading.Lock()
        self.pending: list[list[Any]] = []
        self.pending_bytes = 0
        self.queued = 0  # calls queued so far; the flusher holds a batch back while this grows
        self.batch_seen = 0  # `queued` when the flusher's alarm was last set for this batch
        self.batch_open = False  # a batch is being filled (its first call set the flusher's alarm)
        self.pending_calls = 0  # calls in `pending`, a lane's records counted one by one
        self.lane: Lane | None = None  # the shim's C lane, when it has one
        self.lane_seen = 0  # the lane's count of records when they were last taken
        self.batch_nap = self.batch_deadline = 0.0  # the flusher's next wait, and its last chance to wait
        self.rider_grace = False  # the batch waited a window past its last chance for a rider's sync call
        self.seq = 0
        self.zmq_seq = 0  # the last batch sent on ZeroMQ: one sent on the data connection is served after it
        self.last_ctx: int | None = None
        self.later: dict[int, tuple[Call, list[Any], Callable[[int, list[Any]], None]] | None] = {}  # seq -> its
        # call, args and the writer of its late answer (None: a batch sent only for the answers riding in it)
        self.boarding: list[Rider] = []  # calls of the pending batch whose answers ride with its answer
        self.riders: dict[int, list[Rider]] = {}  # seq -> the riders of that message
        self.early: dict[str, Any] | None = None  # an answer read on ZeroMQ before its call looked there
        self.late_errors: list[list[Any]] = []
        self.blocking = False  # CUDA_LAUNCH_BLOCKING=1: an asynchronous call is sent and waited for (Driver sets it)
        self.dead: str | None = None
        self.batch_window_s = batch_window_us / 1e6
        self.alarm = Alarm()
        self.pid = os.getpid()
        self.link = link
        self.downlink = Wire(link) if link.active else None
        self.sent_ns = 0  # when the last message went out (kept for a trace)
        self.down_bytes = 0  # size of the last answer read (kept for a trace or a link)
        self.data: data.Stream | None = None  # the data connection (client/data.py), when there is one
        self.streamed = False  # the last batch went there
        self.scratch = memoryview(bytearray(data.SCRATCH))  # where an answer there is read
        self.starting = True  # a failure now is said by whoever connects (Driver.connect), once, not here
        try:
            self._start(connect_timeout_s, measure, measure_gpu)
        except BaseException:
            self.ctx.destroy(0)  # the sockets of a session that never started: a retry makes its own
            self.alarm.close()
            raise
        self.starting = False
        self.data_ready = select.poll()  # a wait for an answer there, in slices, as on ZeroMQ
        self.spin_ns = spin_us * 1000  # how long that wait looks before it blocks (protocol/spin.py)
        if self.data is not None:
            self.data_ready.register(self.data, select.POLLIN)
        self.request_budget = wire.request_budget(self.max_request_bytes)  # payload bytes a request may carry
        self.closed = False
        self.host_functions: queue.SimpleQueue | None = None  # (function, token), run by their own thread
        threading.Thread(target=self._flusher, name="xpuremote-flush", daemon=True).start()

    # ---- set-up -------------------------------------------------------------------------
    def _start(self, timeout_s: float, measure: bool, measure_gpu: bool) -> None:
        """The session: the daemon's hello, then its worker's inventory, and the data connection if wanted."""
        self.keys = curve.client_keys(self.position)  # CURVE keys from the environment, or None for plain TCP
        self.endpoint, self.session, self.key = self._hello(timeout_s)
        self.sock = self._socket(self.endpoint, wire.routing_id(self.key))
        self.sock.setsockopt(zmq.RCVTIMEO, RECEIVE_SLICE_MS)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        try:
            self.inventory = self.request({"op": "init", "link": self.link.to_wire(), "measure": measure,
                                           "gpu": measure_gpu}, timeout_s)
        except NoAnswer as exc:
            raise ServerGone(errors.NO_DEVICE, f"{exc.detail}: its worker for this session, at {self.endpoint}, "
                             "did not answer; fix: let this host reach that address (each session's worker "
                             "listens on a port of its own, on the host of the server's --listen)") from None
        self.max_request_bytes = self.inventory.get("max_request_bytes") or 0  # the worker's limit (0: none)
        port = self.inventory.get("data_port")
        seal = self.inventory.get("data_keys") if self.keys is not None else None  # CURVE: sealed, or none
        if port and data.wanted() and (self.keys is None or seal):
            self.data = self._open_data(port, timeout_s, seal)

    def _socket(self, endpoint: str, routing_id: bytes | None = None) -> zmq.Socket:
        """A DEALER to `endpoint`; one to the worker presents the session's key as its routing id."""
        sock = self.ctx.socket(zmq.DEALER)
        if routing_id is not None:
            sock.setsockopt(zmq.ROUTING_ID, routing_id)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5 * HEARTBEAT_MS)
        curve.secure(sock, self.keys)
        sock.connect(endpoint)
        return sock

    def _hello(self, timeout_s: float) -> tuple[str, str, bytes]:
        try:
            sock = self._socket(self.address)
        except zmq.ZMQError as exc:
            raise CudaError(errors.INVALID_VALUE, f"cannot connect to the server at {self.address!r} ({exc}); "
                            "fix: name it as tcp://HOST:PORT with --server / XPU_SERVER") from None
        monitor = sock.get_monitor_socket(curve.WATCHED)  # a refused handshake fails now, not at the timeout
        try:
            client = {"pid": os.getpid(), "host": socket.gethostname(), "user": getpass.getuser()}
            sock.send_multipart(wire.encode({"op": "hello", "client": client}))
            why = curve.wait_for_answer(sock, monitor, timeout_s, self.keys is not None)
            if why == "timeout":
                raise ServerGone(errors.NO_DEVICE, f"no xpuremote server answered at {self.address} within "
                                 f"{timeout_s:g} s; fix: start xpu-server there, or name another with --server / "
                                 "XPU_SERVER (XPU_CONNECT_TIMEOUT_S: how long to wait)")
            if why:
                raise ServerGone(errors.NO_DEVICE, f"the server at {self.address} refused the connection: {why}")
            answer = wire.decode(sock.recv_multipart())
        finally:
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
        if answer.get("status"):
            raise ServerGone(errors.NO_DEVICE, f"server at {self.address} refused: {answer.get('error')}")
        key = answer.get("key")
        if not isinstance(key, bytes) or len(key) != wire.KEY_BYTES:
            raise ServerGone(errors.NO_DEVICE, f"the server at {self.address} gave no session key")
        return self._worker_endpoint(answer["worker"]), answer["session"], key

    def _open_data(self, port: int, timeout_s: float, seal: Any = None) -> data.Stream | None:
        host = urlparse(self.endpoint).hostname or "127.0.0.1"
        if seal is not None and not valid_keys(seal):
            log.warning("the server's keys for the data connection are not two %d-byte keys: copies go in "
                        "messages", SEAL_KEY_BYTES)
            return None
        try:
            sock = data.connect(host, port, self.key, timeout_s, seal)
        except (OSError, ImportError) as exc:  # ImportError: no `cryptography` to seal it with
            log.warning("no data connection to %s port %d (%s): copies go in messages", host, port, exc)
            return None
        try:
            self.request({"op": "data"}, timeout_s)
        except ServerGone:
            sock.close()
            raise
        except CudaError as exc:
            log.warning("the server refused the data connection (%s): copies go in messages", exc.detail)
            sock.close()
            return None
        return sock

    def _worker_endpoint(self, endpoint: str) -> str:
        """A worker bound to a wildcard address is reached through the host we dialled."""
        url = urlparse(endpoint)
        if url.scheme == "tcp" and url.hostname in ("0.0.0.0", "::", "*"):
            return f"tcp://{urlparse(self.address).netloc.rsplit(':', 1)[0]}:{url.port}"
        return endpoint

    # ---- calls ----------------------------------------------------------------------------
    def post(self, call: Call, args: list[Any], ctx: int | None, size: int = 0) -> None:
        """Queue an async call; it is sent with the next batch (under CUDA_LAUNCH_BLOCKING, at once, and waited for:
        its failure is raised here)."""
        if self.blocking:
            self._blocking(call, args, ctx)
            return
        with self.lock:
            self._check()
            self._queue(call, args, ctx, size)
            if self.pending_calls >= MAX_BATCH_CALLS or self.pending_bytes >= MAX_BATCH_BYTES:
                self._send(reply=False)
            elif not self.batch_open:
                self._start_batch()

    def call(self, call: Call, args: list[Any], ctx: int | None, by_data: bool = False,
             ctx_flags: int = 0) -> tuple[int, list[Any], list[list[Any]]]:
        """Send everything queued plus this call; wait for its (status, outputs, deferred errors).
        `by_data`: some of `args` are wire.Data, to go on the data connection (or, without one, in the message).
        `ctx_flags`: the context's, whose scheduling flags say how to wait, as for the GPU (protocol/spin.py)."""
        with self.lock:
            self._check()
            values = self._data_values(args) if by_data else ()
            self._queue(call, args, ctx, 0)
            stream = self.data is not None
            seq = self._send(reply=True, stream=stream)
            stream = stream and self.streamed  # not if it went on ZeroMQ (it failed there, or was too large)
            if values and stream:
                self._send_data(values)
            if trace.RECORDER:  # the trace is written while the server works on the call, not on the way to it
                trace.RECORDER.catch_up()
            answer = self._receive_stream(seq, not values, ctx_flags) if stream else self._receive(seq)
            if stream and self.later:
                self._read_later()
            if values and answer.get("outs"):
                self._receive_data(answer["outs"], values)
            if self.riders:
                self._answer_riders(answer)
            if trace.RECORDER:  # with the bytes that went beside the message on the data connection
                up, down = _beside(values) if stream else (0, 0)
                trace.RECORDER.answered(seq, time.monotonic_ns() - self.sent_ns, self.down_bytes + down, up)
            deferred = self.late_errors + (answer.get("deferred") or [])
            self.late_errors = []
        return answer.get("status", errors.UNKNOWN), answer.get("outs") or [], deferred

    def call_later(self, call: Call, args: list[Any], ctx: int | None, on_answer: Callable[[int, list[Any]], None],
                   answer_bytes: int | None = None) -> None:
        """Send this call but do not wait: `on_answer(status, outputs)` runs when its answer is read, which is
        before the answer to any later sync call (the server answers in order). Outputs that are not what `args`
        asked for (marshal.checked) are not given to it: they fail the next sync call.

        An answer of at most RIDE_BYTES (`answer_bytes`, where the caller knows it) rides with the batch's: the
        call is queued, and a sync call within the batch window takes it along, its answer coming back with the
        sync call's on the same channel, in one round trip (a copy to pinned memory and the synchronize after it,
        as each token of a generation loop makes them); else the flusher sends the batch for its answer."""
        if self.blocking:
            on_answer(errors.SUCCESS, self._blocking(call, args, ctx))
            return
        with self.lock:
            self._check()
            self._queue(call, args, ctx, 0)
            if answer_bytes is not None and answer_bytes <= RIDE_BYTES:
                self.boarding.append((len(self.pending) - 1, call, args, on_answer))
                if not self.batch_open:
                    self._start_batch()
                return
            self.later[self._send(reply=True, kind="later")] = (call, args, on_answer)
            self.alarm.arm(self.batch_window_s)  # the flusher reads the answer if no sync call does first

    def _blocking(self, call: Call, args: list[Any], ctx: int | None) -> list[Any]:
        """An asynchronous call sent and waited for: its outputs, or its own failure raised. Failures of earlier
        calls (a late answer's) are left for the next call the application waits for."""
        status, outs, deferred = self.call(call, args, ctx)
        if deferred:
            with self.lock:
                self.late_errors[:0] = deferred
        if status:
            raise CudaError(status, f"{call.symbol} on the server (CUDA_LAUNCH_BLOCKING=1)", call.library)
        return marshal.checked(call, args, outs)

    def run_host_function(self, fn: Callable[[], None], token: int) -> None:
        """Run `fn` on the host-function thread, then tell the server it may go on.

        Not on the thread that read the answer: that one may hold the connection, and a host
        function may wait for another thread that needs it. `done` goes out on a socket of the
        host-function thread's own, so it never waits for the connection either."""
        with self.lock:
            if self.host_functions is None:
                self.host_functions = queue.SimpleQueue()
                threading.Thread(target=self._host_function_thread, name="xpuremote-hostfn", daemon=True).start()
        self.host_functions.put((fn, token))

    def _host_function_thread(self) -> None:
        native_thread_init()  # host functions are the application's code, on the application's libc
        control = self._socket(self.endpoint, wire.routing_id(self.key, wire.DONE_CHANNEL))
        while True:
            fn, token = self.host_functions.get()
            if fn is None:
                break
            try:
                fn()
            except Exception:
                log.exception("a host function raised")
            control.send_multipart(wire.encode(self._stamped({"op": "done", "token": token})))
        control.close(0)

    def flush(self) -> None:
        """Send what is queued. The batch is made under the lock and goes out after it: a send can wait for
        the GIL, and an application thread queueing a call would wait all that time for the lock."""
        with self.lock:
            self._take_lane()
            if not self.pending or self.dead or self.closed:
                return
            frames = self._outgoing(reply=False)
            self.sending.acquire()
        try:
            self._put(frames)
            failed = None
        except zmq.ZMQError as exc:
            failed = exc
        finally:
            self.sending.release()
        if failed is not None:
            with self.lock:
                self._die(f"cannot send to the server at {self.address}: {failed}")

    def request(self, header: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        with self.lock:
            self._check()
            self._sent()
            self.sock.send_multipart(wire.encode(self._stamped(header)))
            answer = self._receive(None, timeout_s)
        if answer.get("status"):
            raise CudaError(answer["status"], answer.get("error", ""))
        return answer

    # ---- the data connection --------------------------------------------------------------
    def _data_values(self, args: list[Any]) -> list[wire.Data]:
        """The call's values for the data connection; without one, they go in the message instead."""
        if self.data is None:
            self._inline(args)
            return []
        return [a for a in args if type(a) is wire.Data]

    @staticmethod
    def _inline(args: list[Any]) -> None:
        """A call's values for the data connection, in its message instead."""
        for i, a in enumerate(args):
            if type(a) is wire.Data:
                args[i] = a.size if a.asked else wire.frame(a.buffer)

    def _send_data(self, values: list[wire.Data]) -> None:
        """An input's bytes, after its message. If the stream fails the server sees it end, and answers
        the call with an error."""
        for value in values:
            if not value.asked and self.data is not None:  # lost meanwhile: the server fails the call
                try:
                    self.data.sendall(value.buffer)
                except OSError as exc:
                    self._lose_data(f"sending: {exc}")

    def _receive_data(self, outs: list[Any], values: list[wire.Data]) -> None:
        """Outputs the answer says follow it on the data connection, straight into the application's memory."""
        asked = [v for v in values if v.asked]
        for i, out in enumerate(outs):
            if type(out) is not wire.Data:
                continue
            if not asked or asked[0].size != out.size or self.data is None:
                self._lose_data(f"the answer names {out.size} bytes nobody asked for")
                raise CudaError(errors.UNKNOWN, "the server's answer does not match the copy asked for")
            value = asked.pop(0)
            try:
                data.receive_into(self.data, value.buffer)
            except OSError as exc:
                self._lose_data(f"receiving: {exc}")
                raise CudaError(errors.UNKNOWN, f"the copy's bytes were lost with the data connection: {exc}") from None
            outs[i] = value  # written already: the value asked for stands for it (marshal.checked, unpack)

    def _lose_data(self, why: str) -> None:
        log.warning("the data connection to %s failed (%s); ZeroMQ carries everything from now on", self.address, why)
        if self.data is not None:
            self.data_ready.unregister(self.data)
            self.data.close()
            self.data = None

    def _data_ref(self, size: int, asked: bool) -> wire.Data:
        return wire.Data(size=size)

    def _queue(self, call: Call, args: list[Any], ctx: int | None, size: int) -> None:
        self._take_lane()  # what the application queued in C came first
        if self.request_budget:
            size = self._fit(call, args, size)
        if ctx != self.last_ctx and ctx is not None:
            self.pending.append([SET_CONTEXT.opcode, [ctx]])
            self.pending_calls += 1
            self.last_ctx = ctx
        self.pending.append([call.opcode, args])
        self.pending_bytes += size
        self.pending_calls += 1
        self.queued += 1
        if trace.RECORDER:
            trace.RECORDER.queued(self.seq + 1, len(self.pending) - 1)

    def _take_lane(self) -> None:
        """The records the shim queued in C, as one call; the server's context after them is the last one's."""
        taken = self.lane.take() if self.lane is not None else None
        if taken is None:
            return
        records, appended, self.last_ctx, stamps = taken
        self.pending.append([LANE_CALL.opcode, [records, len(records)]])
        self.pending_bytes += len(records)
        self.pending_calls += appended - self.lane_seen
        if trace.RECORDER:  # each record a call of the trace, in the message this batch goes out as
            trace.RECORDER.lane(self.seq + 1, len(self.pending) - 1, records, stamps, appended - self.lane_seen)
        self.lane_seen = appended
        self.alarm.armed = True  # the lane's first record set it

    def _lane_waiting(self) -> bool:
        return self.lane is not None and self.lane.waiting()

    def _queued_total(self) -> int:
        """Calls queued over the session, the lane's included."""
        return self.queued + (self.lane.appended() if self.lane is not None else 0)

    def _fit(self, call: Call, args: list[Any], size: int) -> int:
        """Under the server's request size limit: refuse a call that no request can carry (the
        session goes on), and send the batch first when this call would take it over. The call's size."""
        size = size or wire.payload_size(args)
        if size > self.request_budget:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol} carries {size} bytes; the server at {self.address} "
                            f"takes requests of at most {self.max_request_bytes} bytes (--max-request-bytes)")
        if self.pending and self.pending_bytes + size > self.request_budget:
            self._send(reply=False)
        return size

    def _stamped(self, header: dict[str, Any]) -> dict[str, Any]:
        """With an emulated link, a message says when it was sent: the receiver holds it from then."""
        if self.downlink:
            header["sent"] = time.monotonic_ns()
        return header

    def _start_batch(self) -> None:
        """The first call of a batch: the flusher sends the batch if nothing else has in a window."""
        self._open_batch(time.monotonic(), self._queued_total())
        self.alarm.arm(self.batch_nap)

    def _open_batch(self, began: float, seen: int) -> None:
        self.batch_open, self.batch_seen, self.batch_nap = True, seen, self.batch_window_s
        self.rider_grace = False
        self.batch_deadline = began + max(MAX_BATCH_DELAY_S, self.batch_window_s)

    def _send(self, reply: bool, kind: str = "sync", stream: bool = False) -> int:
        """Send the batch, on the data connection if `stream` (the answer then comes there), else on ZeroMQ."""
        frames = self._outgoing(reply, kind, stream)
        if frames is not None:
            self._sent()
            try:
                self._put(frames)
            except zmq.ZMQError as exc:
                self._die(f"cannot send to the server at {self.address}: {exc}")
        return self.seq

    def _outgoing(self, reply: bool, kind: str = "sync", stream: bool = False) -> list[Any] | None:
        """The batch as a message numbered `self.seq`: sent here on the data connection if `stream` (None),
        else its frames for ZeroMQ."""
        if not self.later:  # nothing for the flusher to send or read
            self.alarm.disarm()
            if self._lane_waiting():  # a record queued in C since the lane was taken: its alarm stands
                self.alarm.arm(self.batch_window_s)
        self.seq += 1
        header = {"op": "calls", "seq": self.seq, "calls": self.pending, "reply": reply}
        if self.boarding:  # their answers come with this message's: a batch sent only for them is answered too
            header["answers"] = [rider[0] for rider in self.boarding]
            self.riders[self.seq], self.boarding = self.boarding, []
            if not reply:
                header["reply"] = reply = True
                kind, self.later[self.seq] = "later", None
                self.alarm.arm(self.batch_window_s)  # the flusher reads the answer if no sync call does first
        if stream:
            header["after"] = self.zmq_seq
        calls, self.pending, self.pending_bytes = self.pending_calls, [], 0
        self.pending_calls, self.batch_open = 0, False
        try:
            frames = wire.encode(self._stamped(header))
        except Exception as exc:  # a value the wire cannot carry: these calls are lost, say so at the next wait
            self.late_errors.append(["a batch of calls", errors.UNKNOWN, f"{calls} calls could not be sent: {exc}"])
            raise
        if trace.RECORDER:  # when it went out, for the answer's round trip
            self.sent_ns = header.get("sent") or time.monotonic_ns()
            trace.RECORDER.sent(self.seq, kind if reply else "async", self.sent_ns, wire.size_of(frames), calls,
                                len(header["calls"]))
        self.streamed = False
        if stream:
            if self._fits_stream(frames) and self._send_stream(frames):
                self.streamed = True
                return None
            self._inline(header["calls"][-1][1])  # ZeroMQ carries it instead, its bytes inline
            frames = wire.encode(header)
        self.zmq_seq = self.seq  # a message on the data connection after this one is served after it
        return frames

    def _put(self, frames: list[Any]) -> None:
        """A message on ZeroMQ: send_multipart(copy=False) without its per-frame checks."""
        for frame in frames[:-1]:
            self.sock.send(frame, zmq.SNDMORE, copy=False)
        self.sock.send(frames[-1], copy=False)

    def _sent(self) -> None:
        """Wait for the flusher's batch in flight, if any: the socket is this thread's after (it holds `lock`,
        without which no other send begins). ZeroMQ sockets take one thread at a time."""
        with self.sending:
            pass

    def _fits_stream(self, frames: list[Any]) -> bool:
        """Whether a message is within what its head may declare on the data connection; a larger one goes on
        ZeroMQ."""
        return 8 * len(frames) + wire.size_of(frames) <= message_bound(self.max_request_bytes, wire.HEADER_ALLOWANCE)

    def _send_stream(self, frames: list[Any]) -> bool:
        """A message on the data connection; False if it failed there (the worker drops what it read of it:
        the message goes on ZeroMQ instead)."""
        try:
            wire.send_buffers(self.data, wire.stream_buffers(frames))
        except OSError as exc:
            self._lose_data(f"sending a message: {exc}")
            return False
        return True

    def _receive_stream(self, seq: int, alone: bool = False, ctx_flags: int = 0) -> dict[str, Any]:
        """The answer to message `seq`, sent on the data connection: it comes there, or, if the stream is lost
        on the way, on ZeroMQ (the worker sends it there when it cannot send it on the stream). `alone`: no
        output follows it there."""
        if self.downlink:
            self.downlink.waiting()
        if not data.pending(self.data) and not self._spun(ctx_flags):
            while self.data is not None and not self._stream_ready():
                self._watch()
        try:
            if self.data is None:  # lost while the message's input was sent
                raise OSError("it failed while the call's input was sent")
            frames = data.receive_message(self.data, self.scratch if alone else None)
            answer = wire.decode(frames, self._data_ref)
        except (SealBroken, wire.WireError) as exc:  # it was sent here, but not as it came: it is lost
            self._lose_data(f"receiving an answer: {exc}")
            raise CudaError(errors.UNKNOWN, f"the answer was lost with the data connection: {exc}") from None
        except OSError as exc:  # the worker gave the stream up: it sends the answer on ZeroMQ
            self._lose_data(f"receiving an answer: {exc}")
            return self._receive(seq)
        if trace.RECORDER or self.downlink:
            self.down_bytes = wire.size_of(frames)
        if self.downlink and isinstance(answer.get("sent"), int):
            self._hold_stream(answer)
        if trace.RECORDER:
            self._timed(answer)
        return answer

    def _hold_stream(self, answer: dict[str, Any]) -> None:
        """The emulated link's delay of an answer on the data connection, the outputs that follow it counted in
        (protocol/link.py); their bytes are read after it, at the real transport's speed."""
        outs = answer.get("outs")
        following = sum(out.size for out in outs if type(out) is wire.Data) if type(outs) is list else 0
        arrived = self.downlink.arrived(answer["sent"], self.down_bytes, DATA)
        wait_until(self.downlink.deliver_at(arrived, self.down_bytes + following, DATA))

    def _watch(self) -> None:
        """Whether the server is still there (ZeroMQ's monitor); the session dies if not."""
        if self.monitor.poll(0):
            event = zmq.utils.monitor.recv_monitor_message(self.monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._die(f"lost the connection to the server at {self.address}")

    def _receive(self, seq: int | None, timeout_s: float | None = None) -> dict[str, Any]:
        early, self.early = self.early, None
        if early is not None and (seq is None or early.get("seq") in (seq, None)):
            return early
        deadline = time.monotonic() + timeout_s if timeout_s else None
        while True:
            # blocking in recv costs fewer system calls than polling the socket and the monitor;
            # the socket comes first: a worker may answer `bye` and leave at once
            try:
                answer = self._recv()
            except zmq.Again:  # nothing for RECEIVE_SLICE_MS: is the server still there?
                self._watch()
            else:
                if answer.get("op") == "closing":  # the server is going away: this and every later call fail
                    self._die(f"the server at {self.address} ended this session: {answer.get('error')}")
                if answer.get("seq") in self.later:
                    self._answer_later(answer)
                elif seq is None or answer.get("seq") == seq or "seq" not in answer:
                    return answer
            if deadline and time.monotonic() > deadline:
                self._die(f"the server at {self.address} did not answer within {timeout_s:g} s", NoAnswer)

    def _spun(self, ctx_flags: int) -> bool:
        """Whether the answer began to arrive while this thread looked for it without sleeping (protocol/spin.py):
        not for a context that blocks (CU_CTX_SCHED_BLOCKING_SYNC), nor while answers are due on ZeroMQ."""
        sched = ctx_flags & spin.SCHED_MASK
        if self.later or self.data is None or sched == spin.SCHED_BLOCKING_SYNC:
            return False
        poll = self.data_ready.poll
        return spin.spin(lambda: poll(0), self.spin_ns, sched == spin.SCHED_YIELD) is not None

    def _stream_ready(self) -> bool:
        """Whether the answer on the data connection has begun to arrive, within RECEIVE_SLICE_MS. Meanwhile the
        answers due on ZeroMQ are read as they come: a host function's must be, or the worker waits for the
        function before it serves the call this thread waits for."""
        if not self.later:
            return bool(self.data_ready.poll(RECEIVE_SLICE_MS))
        self._sent()
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.data, zmq.POLLIN)
        ready = dict(poller.poll(RECEIVE_SLICE_MS))
        while self.later and self.sock.poll(0):
            self._take_later(self._recv(polled=True))
        return self.data in ready

    def _read_later(self) -> None:
        """The answers to calls sent before the one just answered on the data connection: the worker sent
        them on ZeroMQ first, and they are read before that call returns."""
        while self.later:
            try:
                answer = self._recv()
            except zmq.Again:
                self._watch()
                continue
            self._take_later(answer)

    def _take_later(self, answer: dict[str, Any]) -> None:
        if answer.get("op") == "closing":
            self._die(f"the server at {self.address} ended this session: {answer.get('error')}")
        if answer.get("seq") in self.later:
            self._answer_later(answer)
        else:  # the answer to the call in flight, sent here because the stream failed: _receive takes it
            self.early = answer

    def _recv(self, polled: bool = False) -> dict[str, Any]:
        """The next message on ZeroMQ. `polled`: its wait began before (an emulated link's idle mark is set)."""
        if self.downlink and not polled:
            self.downlink.waiting()
        self._sent()
        frames = [self.sock.recv(copy=False)]
        while frames[-1].more:  # recv_multipart(copy=False) without a getsockopt per frame
            frames.append(self.sock.recv(copy=False))
        answer = wire.decode(frames, self._data_ref if self.data is not None else None)
        if self.downlink or trace.RECORDER:
            self.down_bytes = wire.size_of(frames)
        if self.downlink and isinstance(answer.get("sent"), int):
            self.downlink.hold(answer["sent"], self.down_bytes)
        if trace.RECORDER:
            self._timed(answer)
        return answer

    @staticmethod
    def _timed(answer: dict[str, Any]) -> None:
        """The server's times in an answer, for the trace."""
        if answer.get("timing"):
            trace.RECORDER.timed(answer["timing"])
        if answer.get("gpu"):
            trace.RECORDER.gpu_timed(answer["gpu"])

    def _drain_later(self) -> None:
        """Read answers that no sync call is waiting for, when the application makes none:
        a host function must run even if nothing else is ever called."""
        while self.later and not self.closed and not self.dead:
            with self.lock:
                self._sent()
                while self.later and self.sock.poll(0):
                    answer = self._recv()
                    if answer.get("seq") in self.later:
                        self._answer_later(answer)
                    else:
                        log.warning("dropped an answer nobody waits for (seq %s)", answer.get("seq"))
            time.sleep(0.0005)

    def _answer_later(self, answer: dict[str, Any]) -> None:
        waiting = self.later.pop(answer["seq"])
        if trace.RECORDER:
            trace.RECORDER.answered(answer["seq"], 0, self.down_bytes)
        self.late_errors += answer.get("deferred") or []
        self._answer_riders(answer)
        if waiting is None:  # sent only for its riders
            return
        call, args, on_answer = waiting
        status = answer.get("status", errors.UNKNOWN)
        if status:
            self.late_errors.append(["a call answered late", status, answer.get("error", "")])
            return
        try:  # read by whichever call came next: a failure is that call's to report, not to raise here
            on_answer(status, marshal.checked(call, args, answer.get("outs") or []))
        except CudaError as exc:
            self.late_errors.append([call.symbol, exc.code, exc.detail])

    def _answer_riders(self, answer: dict[str, Any]) -> None:
        """The answers that rode with `answer` (its `answers`: [index, status, outputs] each) to their calls. A
        failed one was deferred by the server too, and is reported as any asynchronous failure; one missing is
        said at the next sync call."""
        riders = self.riders.pop(answer.get("seq"), None)
        if not riders:
            return
        rode = {a[0]: a for a in answer.get("answers") or () if type(a) is list and len(a) == 3}
        for index, call, args, on_answer in riders:
            _, status, outs = rode.get(index, (index, None, None))
            if status is None:
                self.late_errors.append([call.symbol, errors.UNKNOWN, "the server's answer did not carry its outputs"])
                continue
            if status:
                continue
            try:
                on_answer(status, marshal.checked(call, args, outs if type(outs) is list else []))
            except CudaError as exc:
                self.late_errors.append([call.symbol, exc.code, exc.detail])

    def _check(self) -> None:
        if self.dead:
            raise ServerGone(errors.DEINITIALIZED if os.getpid() == self.pid else errors.NOT_INITIALIZED, self.dead)

    def _die(self, why: str, kind: type[ServerGone] = ServerGone) -> None:
        self.dead = why
        if self.lane is not None:
            self.lane.close()  # every later call goes through the client, which says the session is gone
        if not self.starting:
            log.error("%s", why)
        raise kind(errors.DEINITIALIZED, why)

    def _flusher(self) -> None:
        """Send queued async calls that would otherwise wait for the next sync call, and read
        answers no sync call has read; woken by the alarm only."""
        while True:
            self.alarm.wait()
            if self.closed:
                break
            if self._still_growing():
                continue
            try:
                self.flush()
                self._drain_later()
            except CudaError:
                break
            except Exception:  # the failure is kept for the next sync call; the thread carries on
                log.exception("the flusher could not send a batch")
        with self.lock:  # not while another thread may be setting it
            self.alarm.close()

    def _still_growing(self) -> bool:
        """Whether to look again later: while the application keeps queueing, the batch fills up
        and goes out by itself, and cutting it every window would send many small messages
        instead of a few full ones. Each look waits twice as long as the last, until
        MAX_BATCH_DELAY_S. Without the lock, which the application's thread holds while it
        queues: a stale read costs a look more, or a flush of nothing; a batch is never left."""
        now, queued = time.monotonic(), self._queued_total()
        if not self.batch_open and self._lane_waiting():  # a batch the lane began a window ago, with one record
            self._open_batch(now - self.batch_window_s, self.queued + self.lane_seen + 1)
        left = self.batch_deadline - now
        if not (self.pending or self._lane_waiting()) or queued == self.batch_seen or left <= 0:
            if self.rider_grace or not self._rider_last():
                return False
            # a copy whose answer is read next is followed by the sync call that reads it (a token's): the batch
            # waits one window more for it, rather than sending the copy alone for its answer, which would leave
            # the sync call a round trip of its own
            self.rider_grace = True
            self.alarm.arm(self.batch_window_s)
            return True
        self.batch_seen, self.batch_nap = queued, self.batch_nap * 2
        self.alarm.arm(min(self.batch_nap, left))
        return True

    def _rider_last(self) -> bool:
        """The batch ends with a call whose answer rides with it (read without the lock, as _still_growing is)."""
        boarding, pending = self.boarding, self.pending
        return bool(boarding) and boarding[-1][0] == len(pending) - 1 and not self._lane_waiting()

    def close(self) -> None:
        """Say goodbye so that the server releases this session at once."""
        if self.closed or os.getpid() != self.pid:
            return
        try:
            self.flush()
            if not self.dead:
                self.request({"op": "bye"}, timeout_s=2.0)
        except CudaError:
            pass
        with self.lock:
            self.closed = True
            self.alarm.arm(0)  # the flusher wakes up, sees `closed` and ends
        if self.host_functions is not None:
            self.host_functions.put((None, 0))
        self._sent()
        self.sock.close(0)
        self.monitor.close(0)
        if self.data is not None:
            self.data.close()
