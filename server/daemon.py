"""xpu-server: accepts clients and gives each a worker process of its own.

    xpu-server --listen tcp://0.0.0.0:17000 --backend auto|cuda|sim

A client says `hello` to the daemon and is answered with the endpoint of its own worker; from
then on it talks to that worker directly (one hop, no proxy in the data path). Prints a line
containing `ready` on stderr once it accepts clients.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import zmq

from xpuremote.protocol import errors, wire

from .backends import gpu_present

log = logging.getLogger("xpuremote.server")
WORKER_START_TIMEOUT_S = 30.0
# Workers put large allocations (device memory copies, bulk frames) on transparent huge pages: a
# fresh 64 MiB buffer then takes 32 page faults instead of 16384 (on glibc; ignored elsewhere).
WORKER_TUNABLES = "glibc.malloc.hugetlb=1"


@dataclass
class Worker:
    session: str
    process: subprocess.Popen
    endpoint: str
    client: dict[str, Any]
    started: float


class Daemon:
    def __init__(self, listen: str, backend: str) -> None:
        self.listen = listen
        self.backend = backend
        self.workers: dict[str, Worker] = {}
        self.ids = itertools.count(1)
        self.stopping = threading.Event()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)

    def worker_bind(self) -> str:
        """Where workers listen: the daemon's host on a free port, or an ipc path beside its own."""
        if self.listen.startswith("ipc://"):
            return self.listen
        host = urlparse(self.listen).hostname or "127.0.0.1"
        return f"tcp://{'[' + host + ']' if ':' in host else host}"

    def spawn(self, client: dict[str, Any]) -> Worker:
        session = f"{os.getpid()}-{next(self.ids)}"
        cmd = [sys.executable, "-m", "xpuremote.server.worker", "--bind", self.worker_bind(),
               "--backend", self.backend, "--session", session]
        env = dict(os.environ)  # the operator's own tunables come last, so they win
        env["GLIBC_TUNABLES"] = ":".join(filter(None, [WORKER_TUNABLES, env.get("GLIBC_TUNABLES")]))
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
        line = _read_line(proc, WORKER_START_TIMEOUT_S)
        if not line.startswith("endpoint "):
            proc.kill()
            raise RuntimeError(f"worker for session {session} failed to start (exit {proc.poll()})")
        worker = Worker(session, proc, line.split(None, 1)[1].strip(), client, time.time())
        self.workers[session] = worker
        log.info("session %s started for %s (pid %s on %s), worker at %s", session, client.get("user"),
                 client.get("pid"), client.get("host"), worker.endpoint)
        return worker

    def reap(self) -> None:
        for session, worker in list(self.workers.items()):
            code = worker.process.poll()
            if code is not None:
                log.info("session %s ended (worker exit %s) after %.1f s", session, code, time.time() - worker.started)
                del self.workers[session]

    def answer(self, frames: list[Any]) -> dict[str, Any]:
        try:
            header = wire.decode(frames)
        except wire.WireError as exc:
            log.warning("malformed message to the daemon: %s", exc)
            return {"op": "reply", "status": errors.INVALID_VALUE, "error": f"malformed message: {exc}"}
        if header["op"] != "hello":
            why = f"the daemon only takes hello, not {header['op']!r}"
            return {"op": "reply", "status": errors.INVALID_VALUE, "error": why}
        client = header.get("client") if isinstance(header.get("client"), dict) else {}
        try:
            worker = self.spawn(client)
        except (OSError, RuntimeError) as exc:
            log.error("cannot start a worker: %s", exc)
            return {"op": "reply", "status": errors.OPERATING_SYSTEM, "error": str(exc)}
        return {"op": "reply", "status": 0, "worker": worker.endpoint, "session": worker.session}

    def run(self) -> int:
        self.sock.bind(self.listen)
        backend = self.backend if self.backend != "auto" else ("cuda" if gpu_present() else "sim")
        self.backend = backend
        print(f"xpu-server ready on {self.listen} (backend {backend})", file=sys.stderr, flush=True)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self.stopping.is_set():
            if poller.poll(500):
                identity, *frames = self.sock.recv_multipart()
                self.sock.send_multipart([identity, *wire.encode(self.answer(frames))])
            self.reap()
        self.shutdown()
        return 0

    def shutdown(self) -> None:
        log.info("shutting down: ending %d sessions", len(self.workers))
        for worker in self.workers.values():
            worker.process.terminate()
        for worker in self.workers.values():
            try:
                worker.process.wait(5)
            except subprocess.TimeoutExpired:
                worker.process.kill()
        self.sock.close(0)
        self.ctx.term()


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return result[0] if result else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xpu-server", description="xpuremote GPU server")
    parser.add_argument("--listen", default=os.environ.get("XPU_LISTEN", "tcp://127.0.0.1:17000"))
    parser.add_argument("--backend", default="auto", choices=["auto", "cuda", "sim"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("XPU_LOG", "INFO").upper(), stream=sys.stderr,
                        format="xpu-server %(levelname)s %(message)s")
    daemon = Daemon(args.listen, args.backend)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: daemon.stopping.set())
    try:
        return daemon.run()
    except zmq.ZMQError as exc:
        print(f"xpu-server: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
