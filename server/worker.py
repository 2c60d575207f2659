"""One client session: a process that executes the client's calls in order on a backend.

A client's crash, bad input or sticky error stays in this process; when the client goes
away (disconnect, `bye`, or the daemon dying) everything it held is released and the
process exits.

    python -m xpuremote.server.worker --bind tcp://127.0.0.1 --backend sim --session ID
prints `endpoint <address> <key, hex>` on stdout once it listens, and `connected` when the
first message presenting the session's key came (see protocol/wire.py). Any other message is
refused unread: whoever can reach the port learns nothing of the session and cannot end it.

This module is the process's transport loop and entry point: it reads each message (from ZeroMQ or the
data connection), hands it to the Session that runs its calls (session.py), and answers it; a watchdog
thread (watchdog.py) ends the process when the client or the daemon is gone.
"""

from __future__ import annotations

import argparse
import logging
import secrets
import signal
import socket
import time
from typing import Any

import zmq

from xpuremote.protocol import errors, logs, spin, wire
from xpuremote.protocol.link import DATA, wait_until
from xpuremote.protocol.stream import new_keys as new_data_keys

from . import auth, data, metrics
from .backends import load_backend
from .data import DATA_TIMEOUT_S, Closed, DataConnection, DataError, Incoming, Overdeclared
from .limits import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_MAX_HANDLES, Accounted, Limits, give_back_memory, parse_size
from .session import Session, report
from .watchdog import Watchdog

log = logging.getLogger("xpuremote.worker")

RECEIVE_SLICE_MS = 100  # the loop looks at the rest (the watchdog, reports) after this long without a message


# ---- the process ------------------------------------------------------------------------
def serve(bind: str, backend_name: str, session_id: str, idle_connect_s: float = DEFAULT_CONNECT_TIMEOUT_S,
          limits: Limits | None = None, keys: auth.ServerKeys | None = None, client_key: str = "",
          spin_us: int = 0, refusal_interval_s: float = metrics.REPEAT_INTERVAL_S) -> int:
    backend = Accounted(load_backend(backend_name), limits or Limits())
    session = Session(backend, secrets.token_bytes(wire.KEY_BYTES), session_id)
    session.limits = backend.limits
    session.repeats = metrics.Repeats(log, refusal_interval_s)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)  # a client host that vanishes without a FIN is noticed
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 5000)
    if session.limits.max_request_bytes:  # a larger frame drops the connection before it is allocated
        sock.setsockopt(zmq.MAXMSGSIZE, session.limits.max_request_bytes)
    authenticator = None
    if keys is not None:  # only the client this session was started for gets in
        auth.make_server(sock, keys)
        authenticator = auth.start_authenticator(ctx, lambda key: key.decode() == client_key, f"session {session_id}",
                                                 session.repeats)
    stopping = _stop_on_sigterm()
    # MONITOR_STOPPED: disable_monitor() at the end wakes the watchdog at once
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_MONITOR_STOPPED)
    endpoint = _bind(sock, bind, session_id)
    session.listener = data.listen(bind)
    if session.listener is not None:
        if keys is not None:  # an encrypted session's data connection is sealed, with keys of its own
            session.data_keys = new_data_keys()
        log.info("session %s: waits on the data connection spin up to %d µs", session_id, spin_us)
    print(f"endpoint {endpoint} {session.key.hex()}", flush=True)  # to the daemon's pipe only
    watchdog = Watchdog(monitor, session)
    poller = Poller(spin_us * 1000)
    poller.register(sock, zmq.POLLIN)
    sock.setsockopt(zmq.RCVTIMEO, RECEIVE_SLICE_MS)
    started, look_at, reported = time.monotonic(), 0.0, None
    try:
        while not stopping and not watchdog.gone:
            if watchdog.connected.is_set() and time.monotonic() < look_at:
                # serving: wait for the next message (_next); the rest is looked at after
                # RECEIVE_SLICE_MS without a message, or each second
                try:
                    if not _next(sock, session, poller):
                        break
                    continue
                except zmq.Again:
                    pass
            look_at = time.monotonic() + 1.0
            reported = report(session, reported)
            session.repeats.flush()
            stream = _stream_of(session)
            if session.uplink:
                session.uplink.waiting()
            ready = poller.wait(stream, 1000, stream is not None and session.data.buffered())
            if watchdog.gone:
                log.info("session %s: %s; ending", session_id, watchdog.gone)
                break
            if not session.peers and time.monotonic() - started > idle_connect_s:  # a hello squatted
                log.warning("session %s: no client connected within %g s", session_id, idle_connect_s)
                break
            if sock in ready and not _handle(sock, session, polled=True):
                break
            if sock not in ready and stream in ready and not _handle_stream(sock, session):
                break
        if stopping:
            _say_closing(sock, session)
    finally:
        watchdog.finished.set()
        for conn in (session.listener, session.data):
            if conn is not None:
                conn.close()
        backend.close()
        report(session, None)
        by_library = "".join(f" {name}={n}" for name, n in sorted(session.library_calls.items()))
        log.info("session %s ended: %d calls (%d from the fast lane, in %d lanes), %d errors, peak device memory "
                 "%d bytes, %d bytes on the data connection, %d messages there; library calls:%s", session_id,
                 session.calls, session.lane_calls, session.lanes, session.errors, backend.peak,
                 session.data.moved if session.data else 0, session.data.messages if session.data else 0,
                 by_library or " none")
        if session.uplink:
            log.info("session %s: the emulated link held %d messages from ZeroMQ and %d from the data connection",
                     session_id, *session.uplink.held)
        sock.disable_monitor()  # a watchdog still looking wakes up and sees `finished`
        sock.close()
        watchdog.join()
        monitor.close(0)
        if authenticator is not None:
            authenticator.stop()
        ctx.term()
    return 0


def _stop_on_sigterm() -> list[int]:
    """A list that is non-empty once SIGTERM came: the daemon is shutting down. The batch in
    flight is finished and answered first (the handler only sets the flag)."""
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _: stopping.append(signum))
    return stopping


def _say_closing(sock: zmq.Socket, session: Session, why: str = "the server is shutting down",
                 status: int = errors.DEINITIALIZED) -> None:
    """Tell the client that the session ends: its next call fails with this, not a timeout."""
    if session.peer is None:
        return
    notice = {"op": "closing", "status": status, "error": why}
    sock.setsockopt(zmq.LINGER, 2000)  # the notice must leave before the socket closes
    sock.send_multipart([session.peer, *wire.encode(notice)])


def _bind(sock: zmq.Socket, bind: str, session_id: str) -> str:
    if bind.startswith("ipc://"):
        endpoint = f"{bind}.{session_id}"
        sock.bind(endpoint)
        return endpoint
    sock.bind_to_random_port(bind)
    return sock.getsockopt_string(zmq.LAST_ENDPOINT)


def _stream_of(session: Session) -> socket.socket | None:
    """The data connection, while a message may be read there."""
    return session.data.sock if session.data is not None and not session.stream_pending else None


def _next(sock: zmq.Socket, session: Session, poller: Poller) -> bool:
    """Take the next message, from ZeroMQ or the data connection; zmq.Again after RECEIVE_SLICE_MS without one."""
    stream = _stream_of(session)
    if stream is None:
        return _handle(sock, session)  # waiting in recv costs fewer system calls than a poll
    if session.uplink:
        session.uplink.waiting()
    ready = poller.wait(stream, RECEIVE_SLICE_MS, session.data.buffered())
    if sock in ready:  # first: a message there may be the one a message on the stream comes after
        return _handle(sock, session, polled=True)
    if ready:
        return _handle_stream(sock, session)
    raise zmq.Again()


class Poller(zmq.Poller):
    """ZeroMQ's poller over the worker's socket and, while there is one to read, the data connection: kept
    registered from one wait to the next (registering it anew for each message cost as much as the poll).
    While the data connection is open, a wait looks without sleeping for `spin_ns` first (protocol/spin.py):
    a call the client waits for comes there, and its answer is sooner if this end need not be woken."""

    stream: socket.socket | None = None

    def __init__(self, spin_ns: int = 0) -> None:
        super().__init__()
        self.spin_ns = spin_ns

    def wait(self, stream: socket.socket | None, wait_ms: int, buffered: bool = False) -> dict[Any, int]:
        """What of ZeroMQ and the data connection (if given) has a message within `wait_ms`. `buffered`: the
        data connection's next message was read with the last one, so its socket may have nothing to say."""
        if buffered:
            return {stream: zmq.POLLIN}
        if stream is not self.stream:
            if self.stream is not None:
                self.unregister(self.stream)
            if stream is not None:
                self.register(stream, zmq.POLLIN)
            self.stream = stream
        if stream is not None and self.spin_ns:
            ready = spin.spin(lambda: dict(self.poll(0)), self.spin_ns)
            if ready:
                return ready
        return dict(self.poll(wait_ms))


def _handle_stream(sock: zmq.Socket, session: Session) -> bool:
    """Take a message from the data connection: a reply batch the client sent there to be answered there,
    served after the batches it sent on ZeroMQ before it (`after`: the seq of the last of them, 0 for none;
    they came in order, so once that one has come, all have)."""
    try:
        frames, too_big = session.data.read_message(session.limits.max_request_bytes)
    except Overdeclared as exc:  # no client of ours declares that: the session ends now
        log.warning("session %s: ending it: %s", session.name, exc)
        _say_closing(sock, session, f"the server ended this session: {exc}", errors.INVALID_VALUE)
        return False
    except Closed as exc:  # between two messages: nothing is owed (an answer now would answer the next call)
        log.warning("session %s: %s", session.name, exc)
        return True
    except DataError as exc:  # the client sees the stream end and looks for the answer on ZeroMQ
        log.warning("session %s: %s", session.name, exc)
        if session.peer is not None:
            _answer(sock, session.peer, session, {"op": "reply", "status": errors.INVALID_VALUE, "error": str(exc)})
        return True
    message = Message(None, frames, too_big, session.data)
    header = message.header
    arrived = _arrived(session, message)
    if not message.error and (header.get("op") != "calls" or not header.get("reply")):
        message.error = wire.WireError("only a batch to be answered may come on the data connection")
    after = header.get("after")
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while isinstance(after, int) and after > session.stream_after and after not in session.zmq_seqs:
        if time.monotonic() > deadline:
            message.error = wire.WireError(f"it comes after batch {after} on ZeroMQ, which never came")
            break
        try:
            if not _handle(sock, session):
                return False
        except zmq.Again:
            pass
    if isinstance(after, int) and after > session.stream_after:  # what came before it is behind it now
        session.stream_after = after
        session.zmq_seqs = {seq for seq in session.zmq_seqs if seq > after}
    if arrived is not None:  # behind the batches it came after on the emulated link, as it is served after them
        wait_until(session.uplink.deliver_at(arrived, wire.size_of(frames) + sum(v.size for v in message.incoming),
                                             DATA))
    return _dispatch(sock, session, message)


def _arrived(session: Session, message: Message) -> float | None:
    """With an emulated link, when a message read from the data connection reached this end (protocol/link.py)."""
    sent = message.header.get("sent")
    if session.uplink is None or not isinstance(sent, int):
        return None
    return session.uplink.arrived(sent, wire.size_of(message.frames), DATA)


def _handle(sock: zmq.Socket, session: Session, polled: bool = False) -> bool:
    """Take one message; False when the client said goodbye. `polled`: a poll found it (an emulated link's idle
    mark was set before that poll).

    While the client runs a host function (`session.awaiting`), every other message waits in
    the stash: work queued behind the function must not start before it has run."""
    if session.uplink and not polled:
        session.uplink.waiting()
    limits = session.limits
    frames, too_big = wire.receive(sock, limits.max_request_bytes, limits.request_frames())
    if too_big:  # answered and logged as any malformed message; ZeroMQ took it in whole, though
        give_back_memory()
    if not _admit(sock, session, frames):
        return True
    message = Message(frames[0], frames[1:], too_big)  # bytes on the data connection follow only a message there
    if session.uplink and isinstance(message.header.get("sent"), int):
        session.uplink.hold(message.header["sent"], wire.size_of(message.frames))  # see protocol/link.py
    if message.header.get("op") == "calls" and isinstance(message.header.get("seq"), int):
        session.zmq_seqs.add(message.header["seq"])
    return _dispatch(sock, session, message)


def _dispatch(sock: zmq.Socket, session: Session, message: Message) -> bool:
    """Serve a message now, or stash it while the client runs a host function."""
    session.stream_pending = session.stream_pending or message.by_stream
    if session.awaiting is None:
        return _serve(sock, session, message)
    if message.header.get("op") != "done" or message.header.get("token") != session.awaiting:
        session.stash.append(message)
        return True
    session.awaiting = None
    while session.stash and session.awaiting is None:
        if not _serve(sock, session, session.stash.popleft()):
            return False
    return True


def _admit(sock: zmq.Socket, session: Session, frames: list[zmq.Frame]) -> bool:
    """Whether a message presents the session's key (its routing id); one that does not is
    refused without being read, and its connection is not counted as the client's."""
    if wire.presents(frames[0].bytes, session.key):
        if not session.peers:
            print("connected", flush=True)  # the daemon counts the session as live from now
        session.peers.add(frames[-1].get(zmq.SRCFD))
        return True
    source = auth.peer_address(frames[-1])
    session.repeats.say("no key", source, f"session {session.name}: refused a message from {source}: its "
                        "connection did not present the session's key")
    refusal = {"op": "reply", "status": errors.NOT_PERMITTED,
               "error": "refused: this connection did not present its session's key (ask the daemon with hello)"}
    sock.send_multipart([frames[0], *wire.encode(refusal)])
    return False


class Message:
    """A request as read: who sent it, its frames, its header (decoded once; {} if malformed)."""

    def __init__(self, identity: Any, frames: list[Any], too_big: str | None = None,
                 data: DataConnection | None = None) -> None:
        self.identity, self.frames = identity, frames
        self.by_stream = identity is None  # it came on the data connection: answered there
        self.header: dict[str, Any] = {}
        self.error = wire.WireError(too_big) if too_big else None
        self.incoming: list[Incoming] = []  # its input on the data connection, which follows it there
        began = time.monotonic_ns()
        try:
            if not too_big:  # not even decoded
                self.header = wire.decode(frames, self._on_stream if data is None else
                                          lambda size, asked: data.value(size, asked, self.incoming))
        except wire.WireError as exc:
            self.error = exc
        self.decode_ns = time.monotonic_ns() - began  # part of the server's time on it

    def _on_stream(self, size: int, asked: bool) -> None:
        """A reference to the data connection in a message on ZeroMQ: refused, the rest still read (its seq
        orders the data connection's messages)."""
        self.error = self.error or wire.WireError("a reference to the data connection, which a message on "
                                                  "ZeroMQ may not make")


def _probe(header: dict[str, Any]) -> dict[str, Any]:
    """The client's wake-up probe (client/wake.py): answer after `busy_ns` of staying awake."""
    busy = header.get("busy_ns")
    if not isinstance(busy, int) or not 0 <= busy <= wire.PROBE_BUSY_MAX_NS:
        raise wire.WireError(f"probe: busy_ns must be an integer from 0 to {wire.PROBE_BUSY_MAX_NS}, not {busy!r}")
    wait_until(time.monotonic_ns() + busy)
    return {"op": "reply", "status": 0}


def _serve(sock: zmq.Socket, session: Session, message: Message) -> bool:
    """Serve one message; False when the client said goodbye."""
    identity, header = message.identity, message.header
    began = time.monotonic_ns()
    if message.by_stream:  # what follows it there is read as it is served, then the stream is free again
        session.stream_pending = False
    try:
        if message.error:
            raise message.error
        op = header["op"]
        if op != "done" and not message.by_stream:
            session.peer = identity
        if op == "init":
            answer = session.start(header)
        elif op == "calls":
            session.per_call = [] if session.measure else None
            session.seq = header.get("seq")
            answer = session.run_batch(header.get("calls"), bool(header.get("reply")), header.get("answers"))
            answer["seq"] = header.get("seq")
            if session.measure:
                server_ns = time.monotonic_ns() - began + message.decode_ns
                session.timings.append([header.get("seq"), server_ns, session.per_call])
            if not header.get("reply"):
                return True
            session.add_timings(answer)
        elif op == "probe":
            answer = _probe(header)
        elif op == "data":
            answer = session.open_data()
        elif op == "done":
            return True  # a host function finished after its wait was abandoned: nothing to answer
        elif op == "bye":  # with the server's times for the last batches, for a client's trace
            sock.send_multipart([identity, *wire.encode(session.add_timings({"op": "reply", "status": 0}, final=True))])
            return False
        else:
            raise wire.WireError(f"unknown op {op!r}")
    except wire.WireError as exc:
        log.warning("malformed message: %s", exc)
        answer = {"op": "reply", "status": errors.INVALID_VALUE, "error": f"malformed message: {exc}"}
    except Exception as exc:  # never let one message end the session
        log.exception("internal error")
        answer = {"op": "reply", "status": errors.UNKNOWN, "error": f"server error: {type(exc).__name__}: {exc}"}
    if message.incoming:
        answer = _settle(session, message, answer)
    if session.uplink:
        answer["sent"] = time.monotonic_ns()  # the client holds the answer from here
    if message.by_stream:
        _answer_on_stream(sock, session, answer)
    else:
        _answer(sock, identity, session, answer)
    return True


def _answer(sock: zmq.Socket, identity: Any, session: Session, answer: dict[str, Any]) -> None:
    """An answer on ZeroMQ."""
    frames = _encoded(session, answer)
    sock.send(identity, zmq.SNDMORE, copy=False)  # send_multipart(copy=False) without its checks
    trackers = [sock.send(frame, zmq.SNDMORE if i < len(frames) - 1 else 0, copy=False,
                          track=isinstance(frame, memoryview)) for i, frame in enumerate(frames)]
    for tracker in trackers:  # a view of device memory (the sim's): unchanged until ZeroMQ is done with it
        if tracker is not None:
            tracker.wait()


def _answer_on_stream(sock: zmq.Socket, session: Session, answer: dict[str, Any]) -> None:
    """An answer on the data connection, then the outputs it names there. If the stream is lost, the answer
    goes on ZeroMQ, where the client looks when it sees the stream end."""
    frames = _encoded(session, answer)
    if session.data.sock is not None:
        try:
            session.data.send_message(frames)
            _send_outgoing(session)
            return
        except DataError as exc:
            log.warning("session %s: %s", session.name, exc)
    if session.outgoing:
        session.outgoing.clear()
        answer = _failure(answer, "the copy's bytes were lost with the data connection")
    if session.peer is not None:
        _answer(sock, session.peer, session, answer)


def _encoded(session: Session, answer: dict[str, Any]) -> list[Any]:
    try:
        return wire.encode(answer)
    except TypeError as exc:  # an output no msgpack can carry: a backend bug, reported as such
        log.error("cannot encode reply: %s", exc)
        session.outgoing.clear()
        return wire.encode(_failure(answer, str(exc)))


def _failure(answer: dict[str, Any], error: str) -> dict[str, Any]:
    """An UNKNOWN error in place of `answer`, for the same message (its seq, if it has one)."""
    return {"op": "reply", "status": errors.UNKNOWN, "error": error, **{k: answer[k] for k in ("seq",) if k in answer}}


def _settle(session: Session, message: Message, answer: dict[str, Any]) -> dict[str, Any]:
    """Read what the message's input left unread on the data connection; a stream lost meanwhile fails it."""
    try:
        session.data.settle(message.incoming)
    except DataError as exc:
        log.warning("session %s: %s", session.name, exc)
        session.outgoing.clear()
        return {"op": "reply", "status": errors.INVALID_VALUE, "error": str(exc)}
    return answer


def _send_outgoing(session: Session) -> None:
    """The outputs an answer named as data, after it (the client reads the answer first)."""
    outgoing, session.outgoing = session.outgoing, []
    try:
        for out in outgoing:
            session.data.send(out)
    except DataError as exc:  # the client sees its copy fail when the stream ends short
        log.warning("session %s: %s", session.name, exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True, help="tcp://HOST or ipc://PATH-PREFIX")
    parser.add_argument("--backend", default="sim")
    parser.add_argument("--session", required=True)
    parser.add_argument("--mem-quota", type=parse_size, default=0, help="device memory per client (0: none)")
    parser.add_argument("--max-request-bytes", type=parse_size, default=0, help="largest request (0: no limit)")
    parser.add_argument("--max-handles", type=int, default=DEFAULT_MAX_HANDLES,
                        help="live allocations, streams, events, modules, ... of each kind (0: no limit)")
    parser.add_argument("--key", help="the server's secret key file: CURVE on")
    parser.add_argument("--client-key", default="", help="z85 public key of the only client admitted (with --key)")
    parser.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                        help="seconds the client has to connect after its hello; then the session ends")
    parser.add_argument("--spin-us", type=int, help="how long to look for the client's next message before blocking")
    parser.add_argument("--refusal-log-interval", type=float, default=metrics.REPEAT_INTERVAL_S,
                        help="seconds between lines saying one source's refused messages")
    args = parser.parse_args(argv)
    metrics.log_to_stderr(f"xpu-server[{args.session}]", logs.level("INFO"))
    keys = auth.load_server_keys(args.key) if args.key else None
    limits = Limits(args.mem_quota, args.max_request_bytes, args.max_handles)
    spin_us = spin.default_us() if args.spin_us is None else max(0, args.spin_us)
    return serve(args.bind, args.backend, args.session, args.connect_timeout, limits, keys, args.client_key, spin_us,
                 args.refusal_log_interval)


if __name__ == "__main__":
    raise SystemExit(main())
