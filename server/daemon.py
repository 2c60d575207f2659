"""xpu-server: accepts clients and gives each a worker process of its own.

    xpu-server --listen tcp://0.0.0.0:17000 --backend auto|cuda|sim
               [--key server.key_secret --allowed-keys DIR] [--mem-quota 8G] [--max-clients 64]
               [--max-clients-per-peer N] [--max-pending-per-peer 8] [--connect-timeout 10]
               [--max-request-bytes 1G] [--metrics-port 9400 [--metrics-bind ADDR] [--metrics-token FILE]]
               [--pool ray://HEAD:PORT|HEAD:PORT|auto [--advertise tcp://HOST:PORT]] [--refusal-log-interval 60]
    xpu-server keygen DIR [--name NAME]      a CURVE key pair: NAME.key, NAME.key_secret
    xpu-server status [--listen ADDR]        the sessions and devices of a running server

A client says `hello` to the daemon and is answered with the endpoint of its own worker and the
session's key; from then on it talks to that worker directly (one hop, no proxy in the data
path), presenting the key on every connection. A hello costs a worker process, so a peer (a
client's host, or its CURVE key) may hold only so many sessions, and only so many that its
client has not connected to yet; a worker whose client does not connect in time ends.
With --pool it also joins a Ray cluster as a pool member (server/pool.py), before it says ready.
Prints a line containing `ready` on stderr once it accepts clients. SIGTERM (or SIGINT) stops
it gracefully: no new sessions, each worker finishes the batch in flight and tells its
client, then exit.
At start-up it raises its own limit of open files to the hard limit, and says what it has. A refusal a
peer repeats (a failed handshake, a refused hello, a bad message) is said once a minute per source,
with the count of those kept quiet since.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import zmq
import zmq.utils.monitor

from xpuremote.protocol import curve, errors, gcm, logs, spin, wire
from xpuremote.protocol import pool as protocol_pool

from . import auth, metrics, pool
from .backends import gpu_present, load_backend, sim_board
from .limits import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_MAX_HANDLES, Limits, give_back_memory, parse_size

log = logging.getLogger("xpuremote.server")
WORKER_START_TIMEOUT_S = 30.0
# Workers put large allocations (device memory copies, bulk frames) on transparent huge pages: a
# fresh 64 MiB buffer then takes 32 page faults instead of 16384 (on glibc; ignored elsewhere).
WORKER_TUNABLES = "glibc.malloc.hugetlb=1"
# the daemon takes only small control messages (hello, status) of one frame: bytes and frames a message
DAEMON_MAX_MESSAGE = 1 << 20
DAEMON_MAX_FRAMES = 1
DEFAULT_MAX_CLIENTS = 64  # each session is a worker process (~30 MB of host memory on the sim)
DEFAULT_MAX_PENDING_PER_PEER = 8


@dataclass
class Options:
    keys: auth.ServerKeys | None = None
    allowed_keys: str = ""  # directory of the public key files of the clients admitted
    limits: Limits = field(default_factory=Limits)
    max_clients: int = DEFAULT_MAX_CLIENTS  # 0: no limit
    max_clients_per_peer: int = 0  # sessions of one peer (a host, or a CURVE key); 0: no limit
    max_pending_per_peer: int = DEFAULT_MAX_PENDING_PER_PEER  # of those, not yet connected; 0: no limit
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S  # a session's client has this long to connect
    metrics_port: int | None = None
    shutdown_grace_s: float = 10.0
    metrics_bind: str = "127.0.0.1"  # the metrics name users and hosts: loopback unless the operator says
    metrics_token: str = ""  # a bearer token the metrics requests must show ("": none)
    pool: str = ""  # a Ray cluster to join as a pool member ("": none)
    advertise: str = ""  # the endpoint the pool hands out ("": the listen address)
    spin_us: int | None = None  # how long a worker looks for the next message before it blocks (None: spin.default_us)
    refusal_log_interval_s: float = metrics.REPEAT_INTERVAL_S  # a source's repeated refusals: said once in this long


@dataclass
class Worker:
    session: str
    process: subprocess.Popen
    endpoint: str
    client: dict[str, str]
    started: float
    key: str = ""
    peer: str = ""  # who said hello: the client's host, or its CURVE key
    secret: bytes = field(default=b"", repr=False)  # the session's key: for the hello answer only
    connected: bool = False  # the client has reached its worker
    stats: dict[str, int] = field(default_factory=lambda: dict.fromkeys(metrics.COUNTERS, 0))
    reader: threading.Thread | None = None

    def describe(self) -> dict[str, Any]:
        return {"session": self.session, **self.client, "key": self.key, "peer": self.peer,
                "connected": self.connected, **self.stats,
                "age_s": round(time.time() - self.started, 1), "worker_pid": self.process.pid}


class Daemon:
    def __init__(self, listen: str, backend: str, options: Options | None = None) -> None:
        self.listen = listen
        self.backend = backend
        self.options = options or Options()
        self.workers: dict[str, Worker] = {}
        self.ids = itertools.count(1)
        self.stopping = threading.Event()
        self.totals = {"sessions_started": 0, "sessions_refused": 0, "auth_failures": 0}
        self.devices: list[dict[str, Any]] | None = None
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, DAEMON_MAX_MESSAGE)
        self.authenticator = None
        self.metrics_server = None
        self.board: Path | None = None  # the sim backend's board directory (backends/sim_board.py)
        self.pool_helper: subprocess.Popen | None = None  # our membership in a Ray pool (server/pool.py)
        self.repeats = metrics.Repeats(log, self.options.refusal_log_interval_s)  # refusals, once per source

    def worker_bind(self) -> str:
        """Where workers listen: the daemon's host on a free port, or an ipc path beside its own."""
        if self.listen.startswith("ipc://"):
            return self.listen
        return f"tcp://{self.host()}"

    def host(self) -> str:
        host = urlparse(self.listen).hostname or "127.0.0.1"
        return "[" + host + "]" if ":" in host else host

    # ---- sessions ---------------------------------------------------------------------------------
    def spawn(self, client: dict[str, str], key: str, peer: str) -> Worker:
        session = f"{os.getpid()}-{next(self.ids)}"
        limits = self.options.limits
        cmd = [sys.executable, "-m", "xpuremote.server.worker", "--bind", self.worker_bind(),
               "--backend", self.backend, "--session", session, "--mem-quota", str(limits.mem_quota),
               "--max-request-bytes", str(limits.max_request_bytes), "--max-handles", str(limits.max_handles),
               "--connect-timeout", str(self.options.connect_timeout_s)]
        spin_us = self.options.spin_us
        if spin_us is None:  # spinning while the sessions are fewer than the CPUs, as the driver counts contexts
            spin_us = spin.default_us(len(self.workers) + 1)
        cmd += ["--spin-us", str(spin_us), "--refusal-log-interval", str(self.options.refusal_log_interval_s)]
        if self.options.keys is not None:
            cmd += ["--key", self.options.keys.secret_path, f"--client-key={key}"]  # a z85 key may start with -
        env = dict(os.environ)  # the operator's own tunables come last, so they win
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [WORKER_TUNABLES, env.get("GLIBC_TUNABLES")]))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        words = _read_line(proc, WORKER_START_TIMEOUT_S).split()
        if len(words) != 3 or words[0] != "endpoint":
            proc.kill()
            raise RuntimeError(f"worker for session {session} failed to start (exit {proc.poll()})")
        worker = Worker(session, proc, words[1], client, time.time(), key, peer, bytes.fromhex(words[2]))
        worker.reader = threading.Thread(target=_read_stats, args=(worker,), name=f"stats-{session}", daemon=True)
        worker.reader.start()
        self.workers[session] = worker
        self.totals["sessions_started"] += 1
        log.info(metrics.kv("session_start", session=session, user=client["user"], host=client["host"],
                            pid=client["pid"], key=key, peer=peer, worker=worker.endpoint, worker_pid=proc.pid))
        return worker

    def reap(self) -> None:
        for session, worker in list(self.workers.items()):
            code = worker.process.poll()
            if code is not None:
                if worker.reader is not None:
                    worker.reader.join(1.0)  # its last stats line
                s = worker.stats
                log.info(metrics.kv("session_end", session=session, user=worker.client["user"],
                                    host=worker.client["host"], pid=worker.client["pid"], key=worker.key,
                                    duration_s=time.time() - worker.started, peak_memory=s["peak"],
                                    calls=s["calls"], errors=s["errors"], exit=code))
                del self.workers[session]

    # ---- requests -----------------------------------------------------------------------------------
    def answer(self, frames: list[Any], key: str = "", peer: str = "") -> dict[str, Any]:
        try:
            header = wire.decode(frames)
        except wire.WireError as exc:
            self.repeats.say("bad message", peer, f"malformed message to the daemon from {peer}: {exc}")
            return {"op": "reply", "status": errors.INVALID_VALUE, "error": f"malformed message: {exc}"}
        if header["op"] == "status":
            return {"op": "reply", "status": 0, **self.status()}
        if header["op"] != "hello":
            why = f"the daemon only takes hello and status, not {header['op']!r}"
            return {"op": "reply", "status": errors.INVALID_VALUE, "error": why}
        client = _client(header.get("client"))
        refusal = self.refusal(peer)
        if refusal:
            self.totals["sessions_refused"] += 1
            self.repeats.say("session_refused", peer, metrics.kv("session_refused", user=client["user"],
                             host=client["host"], pid=client["pid"], key=key, peer=peer, reason=refusal),
                             structured=True)
            return {"op": "reply", "status": errors.NOT_PERMITTED, "error": refusal}
        try:
            worker = self.spawn(client, key, peer)
        except (OSError, RuntimeError) as exc:
            log.error("cannot start a worker: %s", exc)
            return {"op": "reply", "status": errors.OPERATING_SYSTEM, "error": str(exc)}
        return {"op": "reply", "status": 0, "worker": worker.endpoint, "session": worker.session,
                "key": worker.secret}

    def refusal(self, peer: str) -> str | None:
        if self.stopping.is_set():
            return "the server is shutting down"
        self.reap()
        opts = self.options
        if opts.max_clients and len(self.workers) >= opts.max_clients:
            return f"the server is full: it serves at most {opts.max_clients} clients at a time (--max-clients)"
        theirs = [w for w in self.workers.values() if w.peer == peer]
        if opts.max_clients_per_peer and len(theirs) >= opts.max_clients_per_peer:
            return (f"{peer} already has {len(theirs)} sessions: at most {opts.max_clients_per_peer} a client host "
                    "or key (--max-clients-per-peer)")
        pending = sum(not w.connected for w in theirs)
        if opts.max_pending_per_peer and pending >= opts.max_pending_per_peer:
            return (f"{peer} already has {pending} sessions whose client has not connected yet: at most "
                    f"{opts.max_pending_per_peer} (--max-pending-per-peer); each ends after "
                    f"{opts.connect_timeout_s:g} s without its client (--connect-timeout)")
        return None

    def status(self) -> dict[str, Any]:
        limits = self.options.limits
        return {"listen": self.listen, "backend": self.backend, "curve": self.options.keys is not None,
                "limits": {"mem_quota": limits.mem_quota, "max_request_bytes": limits.max_request_bytes,
                           "max_handles": limits.max_handles, "max_clients": self.options.max_clients},
                "sessions": [w.describe() for w in list(self.workers.values())], "devices": self.inventory()}

    def inventory(self) -> list[dict[str, Any]]:
        """The devices, as a worker's backend sees them (looked up once)."""
        if self.devices is None:
            try:
                backend = load_backend(self.backend)
                inv = backend.inventory()
                backend.close()
                self.devices = [{"index": i, "name": d.name, "total_mem": d.total_mem}
                                for i, d in enumerate(inv.devices)]
            except Exception as exc:  # a status must not fail for want of a device list
                log.warning("cannot list the devices: %s", exc)
                return []
        return self.devices

    # ---- the loop -------------------------------------------------------------------------------------
    def secure(self) -> zmq.Socket:
        """CURVE on the daemon's socket when keys are given; a monitor for refused handshakes."""
        keys = self.options.keys
        if keys is not None:
            auth.make_server(self.sock, keys)
            allowed = auth.AllowedKeys(self.options.allowed_keys)
            self.authenticator = auth.start_authenticator(self.ctx, allowed.__contains__, "the daemon", self.repeats)
        elif not auth.is_loopback(self.listen):
            log.warning("listening on %s without CURVE keys: anyone who can reach this port can use the GPU and "
                        "read the traffic; use --key and --allowed-keys beyond a trusted network", self.listen)
        return self.sock.get_monitor_socket(auth.HANDSHAKE_FAILURES)

    def run(self) -> int:
        monitor = self.secure()
        self.sock.bind(self.listen)
        self.backend = self.backend if self.backend != "auto" else ("cuda" if gpu_present() else "sim")
        if self.backend == "sim":  # the workers' (and inventory()'s) sim backends find it in the environment
            self.board = sim_board.make_directory()
            os.environ[sim_board.ENV] = str(self.board)
        if self.options.metrics_port is not None:
            self.serve_metrics()
        if self.options.pool:
            try:
                self.join_pool()
            except RuntimeError:
                self.sock.disable_monitor()
                monitor.close(0)
                self.shutdown()
                raise
        if self.options.keys is not None:  # built now (once per cache), not while a keyed session's client waits
            gcm.library()
        print(f"xpu-server ready on {self.listen} (backend {self.backend}, CURVE "
              f"{'on' if self.options.keys else 'off'})", file=sys.stderr, flush=True)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while not self.stopping.is_set():
            ready = dict(poller.poll(500))
            if monitor in ready:
                self.handshake_failed(zmq.utils.monitor.recv_monitor_message(monitor))
            if self.sock in ready:
                self.take()
            self.repeats.flush()
            self.reap()
            self.watch_pool()
        self.sock.disable_monitor()
        monitor.close(0)
        self.shutdown()
        return 0

    def handshake_failed(self, event: dict[str, Any]) -> None:
        """A connection that failed CURVE's handshake. A refused key was said by the ZAP handler, with its
        address; ZeroMQ names no address for the other failures, so each kind of them counts as one source."""
        self.totals["auth_failures"] += 1
        if event["event"] != zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            what = auth.describe_handshake_failure(event)
            self.repeats.say("handshake", what, f"refused a client at {self.listen}: {what}")

    def take(self) -> None:
        """Answer one message; one over the bounds is refused, unread, and its memory given back."""
        (identity, *frames), refusal = wire.receive(self.sock, DAEMON_MAX_MESSAGE, DAEMON_MAX_FRAMES)
        key = auth.peer_key(frames[0]) if frames and self.options.keys is not None else ""
        peer = key or auth.peer_address(frames[-1] if frames else identity)  # whom per-peer limits count
        if refusal:
            self.repeats.say("bad message", peer, f"refused a message from {peer}: {refusal}")
            answer = {"op": "reply", "status": errors.INVALID_VALUE, "error": f"refused: {refusal}"}
            give_back_memory()
        else:
            answer = self.answer(frames, key, peer)
        self.sock.send_multipart([identity, *wire.encode(answer)])

    # ---- the pool ---------------------------------------------------------------------------------------
    def join_pool(self) -> None:
        """Join the Ray cluster of --pool; the server does not start without it."""
        keys = self.options.keys
        endpoint = self.options.advertise or self.listen
        if urlparse(endpoint).hostname in ("0.0.0.0", "::", "*"):
            raise RuntimeError(f"--pool: clients cannot reach {endpoint}; give --advertise tcp://HOST:PORT")
        record = {"endpoint": endpoint, "backend": self.backend, "devices": self.inventory(),
                  "public_key": keys.public.decode() if keys else "", "pid": os.getpid(),
                  "limits": self.status()["limits"], "started": time.time()}
        if not record["devices"]:
            raise RuntimeError("--pool: the server has no devices to offer")
        self.pool_helper = pool.start_helper(self.options.pool, record)
        words = _read_line(self.pool_helper, pool.JOIN_TIMEOUT_S + 30).split(maxsplit=1)
        if words[:1] != ["joined"]:
            self.pool_helper.kill()
            why = words[1] if len(words) > 1 else f"no answer (exit {self.pool_helper.poll()})"
            raise RuntimeError(f"cannot join the pool at {self.options.pool}: {why}")
        log.info(metrics.kv("pool_joined", pool=self.options.pool, node=words[1].strip(), endpoint=endpoint))

    def watch_pool(self) -> None:
        if self.pool_helper is not None and self.pool_helper.poll() is not None:
            log.error("this server has left the pool at %s (its Ray node ended, exit %s): sessions in progress go "
                      "on, new leases go to other servers; restart xpu-server to rejoin", self.options.pool,
                      self.pool_helper.returncode)
            self.pool_helper = None

    def serve_metrics(self) -> None:
        bind, token = self.options.metrics_bind, self.options.metrics_token
        if not token and not auth.is_loopback(f"tcp://{bind}:0"):
            log.warning("metrics on %s without --metrics-token: anyone who reaches the port sees every session's "
                        "user and host", bind)
        self.metrics_server = metrics.serve_metrics(bind, self.options.metrics_port,
                                                    lambda: metrics.render(self.status(), self.totals), token,
                                                    self.repeats)

    def shutdown(self) -> None:
        """Graceful: no new sessions, then each worker finishes its batch in flight, tells its
        client that the server is going away, and exits; one that overstays is killed."""
        self.sock.close(0)  # no more hellos: new connections are refused from now on
        log.info(metrics.kv("shutdown", sessions=len(self.workers)))
        for worker in self.workers.values():
            worker.process.terminate()
        deadline = time.monotonic() + self.options.shutdown_grace_s
        for worker in self.workers.values():
            try:
                worker.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("session %s did not end within %.0f s; killing it", worker.session,
                            self.options.shutdown_grace_s)
                worker.process.kill()
                worker.process.wait()
        self.reap()
        if self.pool_helper is not None:  # leave the pool: its helper stops the server's Ray node
            self.pool_helper.terminate()
            self.pool_helper.wait(40)
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
        if self.authenticator is not None:
            self.authenticator.stop()
        if self.board is not None:
            shutil.rmtree(self.board, ignore_errors=True)
        self.ctx.term()


def raise_descriptor_limit() -> None:
    """Raise this process's soft limit of open files to its hard limit, and say what it has: each session, and
    each metrics connection, holds descriptors of the daemon's, and running out refuses every new session."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)  # Linux's default nr_open
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("open files: cannot raise the soft limit %d to %d: %s", soft, target, exc)
    now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    log.info("open files: the daemon may hold %s (soft limit%s; hard limit %s)", _limit(now),
             f", raised from {soft}" if now != soft else "", _limit(hard))


def _limit(value: int) -> str:
    return "unlimited" if value == resource.RLIM_INFINITY else str(value)


def _client(value: Any) -> dict[str, str]:
    """The client's description (informational, never trusted): user, host, pid, as short strings."""
    value = value if isinstance(value, dict) else {}
    return {k: str(value.get(k, "?"))[:64] for k in ("user", "host", "pid")}


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return result[0] if result else ""


def _read_stats(worker: Worker) -> None:
    """The worker's counters (and whether its client has connected), from its stdout until it exits."""
    for line in worker.process.stdout:
        stats = metrics.parse_stats(line)
        if stats is not None:
            worker.stats = stats
        elif line.strip() == "connected":
            worker.connected = True


# ---- the command line --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = {"keygen": keygen_main, "status": status_main}.get(argv[0] if argv else "")
    if command is not None:
        return command(argv[1:])
    return serve_main(argv)


def serve_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="xpu-server", description="xpuremote GPU server (also: keygen, status)")
    parser.add_argument("--listen", default=os.environ.get("XPU_LISTEN", "tcp://127.0.0.1:17000"))
    parser.add_argument("--backend", default="auto", choices=["auto", "cuda", "sim"])
    parser.add_argument("--key", help="the server's secret key file (NAME.key_secret): CURVE on")
    parser.add_argument("--allowed-keys", help="directory of the public key files (*.key) of admitted clients")
    parser.add_argument("--mem-quota", type=parse_size, default=0, help="device memory per client, e.g. 8G (0: none)")
    parser.add_argument("--max-clients", type=int, default=DEFAULT_MAX_CLIENTS,
                        help=f"sessions at a time, each a worker process (default {DEFAULT_MAX_CLIENTS}; 0: no limit)")
    parser.add_argument("--max-clients-per-peer", type=int, default=0,
                        help="sessions of one peer: a client host (plain TCP) or a CURVE key; for a server "
                             "that several hosts or keys share (default 0: only --max-clients)")
    parser.add_argument("--max-pending-per-peer", type=int, default=DEFAULT_MAX_PENDING_PER_PEER,
                        help="sessions of one peer whose client has not connected yet, after its hello "
                             f"(default {DEFAULT_MAX_PENDING_PER_PEER}; 0: no limit)")
    parser.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                        help="seconds a client has to connect to its worker after its hello; then the "
                             f"session ends (default {DEFAULT_CONNECT_TIMEOUT_S:g})")
    parser.add_argument("--max-request-bytes", type=parse_size, default=0,
                        help="largest request a client may send, e.g. 1G (0: no limit)")
    parser.add_argument("--max-handles", type=int, default=DEFAULT_MAX_HANDLES,
                        help="live allocations, streams, events, modules, ... of each kind per client (0: no limit)")
    parser.add_argument("--metrics-port", type=int,
                        help="serve Prometheus metrics on this port (plain HTTP; at most "
                             f"{metrics.METRICS_MAX_CONNECTIONS} connections at a time, each closed "
                             f"{metrics.METRICS_TIMEOUT_S:g} s after it opens)")
    parser.add_argument("--metrics-bind", default="127.0.0.1", metavar="ADDR",
                        help="address the metrics port listens on (default: loopback only)")
    parser.add_argument("--metrics-token", metavar="FILE",
                        help="file holding a bearer token that metrics requests must send (Authorization: Bearer)")
    parser.add_argument("--pool", metavar="ADDRESS",
                        help="join a Ray cluster as a member of its GPU pool: ray://HEAD:PORT (Ray Client), "
                             "HEAD:PORT (the head's GCS port, from a machine of the cluster) or auto")
    parser.add_argument("--advertise", metavar="ENDPOINT",
                        help="the endpoint the pool gives clients (default: --listen)")
    parser.add_argument("--shutdown-grace", type=float, default=10.0, help="seconds sessions get to end on SIGTERM")
    parser.add_argument("--refusal-log-interval", type=float, default=metrics.REPEAT_INTERVAL_S, metavar="S",
                        help="a refusal a source repeats (a failed handshake, a refused hello, a bad message, a "
                             "metrics request without the token) is logged once in this many seconds, with the "
                             f"count of those kept quiet since (default {metrics.REPEAT_INTERVAL_S:g})")
    parser.add_argument("--spin-us", type=int, metavar="US",
                        help="how long a session's worker looks for the client's next message before it blocks "
                             f"(default: XPU_SPIN_US, or {spin.DEFAULT_US} while the sessions are fewer than the "
                             f"CPUs, if those are {spin.SPIN_MIN_CPUS} or more; else 0)")
    args = parser.parse_args(argv)
    metrics.log_to_stderr("xpu-server", logs.level("INFO"))
    if bool(args.key) != bool(args.allowed_keys):
        parser.error("--key and --allowed-keys go together")
    if args.spin_us is not None and args.spin_us < 0:
        parser.error("--spin-us cannot be negative")
    if not args.refusal_log_interval > 0:
        parser.error("--refusal-log-interval must be a positive number of seconds")
    try:
        keys = auth.load_server_keys(args.key) if args.key else None
        token = metrics.read_token(args.metrics_token) if args.metrics_token else ""
        if args.allowed_keys and not os.path.isdir(args.allowed_keys):
            raise ValueError(f"--allowed-keys {args.allowed_keys} is not a directory")
        if args.pool:
            protocol_pool.ray_address(args.pool)
        if args.spin_us is None:
            spin.default_us()  # a bad XPU_SPIN_US is said here, not by each worker
    except (OSError, ValueError) as exc:
        print(f"xpu-server: {exc}", file=sys.stderr)
        return 2
    options = Options(keys, args.allowed_keys or "", Limits(args.mem_quota, args.max_request_bytes, args.max_handles),
                      args.max_clients, args.max_clients_per_peer, args.max_pending_per_peer, args.connect_timeout,
                      args.metrics_port, shutdown_grace_s=args.shutdown_grace,
                      metrics_bind=args.metrics_bind.strip("[]"), metrics_token=token, pool=args.pool or "",
                      advertise=args.advertise or "", spin_us=args.spin_us,
                      refusal_log_interval_s=args.refusal_log_interval)
    raise_descriptor_limit()
    daemon = Daemon(args.listen, args.backend, options)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stopping.set())
    try:
        return daemon.run()
    except (zmq.ZMQError, OSError) as exc:
        print(f"xpu-server: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"xpu-server: {exc}", file=sys.stderr)
        return 1


def keygen_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="xpu-server keygen", description="Make a CURVE key pair.")
    parser.add_argument("directory", help="where to write NAME.key (public) and NAME.key_secret (private)")
    parser.add_argument("--name", default="server", help="file name stem: 'server', or a client's name")
    args = parser.parse_args(argv)
    try:
        public, secret = auth.keygen(args.directory, args.name)
    except (OSError, ValueError) as exc:
        print(f"xpu-server keygen: {exc}", file=sys.stderr)
        return 1
    print(f"public key: {public}\nsecret key: {secret} (keep it private)")
    return 0


def status_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="xpu-server status", description="Sessions and devices of a running server.")
    parser.add_argument("--listen", default=os.environ.get("XPU_SERVER", os.environ.get("XPU_LISTEN",
                        "tcp://127.0.0.1:17000")), help="the server's address")
    parser.add_argument("--json", action="store_true", help="print the raw answer as JSON")
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    try:
        answer = ask_status(args.listen, args.timeout)
    except (RuntimeError, ValueError, errors.CudaError) as exc:
        print(f"xpu-server status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=1, default=str) if args.json else metrics.format_status(answer))
    return 0


def ask_status(address: str, timeout_s: float) -> dict[str, Any]:
    """The `status` answer of the daemon at `address` (CURVE keys from XPU_CLIENT_KEY/XPU_SERVER_KEY)."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        keys = curve.client_keys()
        curve.secure(sock, keys)
        monitor = sock.get_monitor_socket(curve.WATCHED)
        sock.connect(address)
        sock.send_multipart(wire.encode({"op": "status"}))
        why = curve.wait_for_answer(sock, monitor, timeout_s, keys is not None)
        if why:
            raise RuntimeError(f"no status from {address}: {why}")
        answer = wire.decode(sock.recv_multipart())
    finally:
        ctx.destroy(0)
    if answer.get("status"):
        raise RuntimeError(f"{address}: {answer.get('error')}")
    return answer


if __name__ == "__main__":
    raise SystemExit(main())
