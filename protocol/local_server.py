"""A private xpu-server on this machine, as `xpu-run` starts one for a program and `xpu-perf validate` for its
runs: its command line, the `ready` line the daemon says once it accepts clients (server/daemon.py), and the
CPUs a child may run on. Here, not in interpose/, so that the perf model starts one without importing the
shim's side."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Collection

from .pool import die_with_parent


def on_cpus(cpus: Collection[int] | None) -> Callable[[], None]:
    """A `preexec_fn`: the child dies with us, and stays (with what it starts) on `cpus` if given."""
    def setup() -> None:
        die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_local_server(backend: str, cpus: Collection[int] | None = None) -> tuple[subprocess.Popen, str]:
    """A private xpu-server on a free loopback port, on `cpus` if given (its workers too);
    returns once it says it is ready."""
    address = f"tcp://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "xpuremote.server.daemon", "--listen", address, "--backend", backend]
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=on_cpus(cpus))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "ready" in line:
            forward_stderr(proc)
            return proc, address
        sys.stderr.write(line)
    proc.kill()
    raise SystemExit(f"xpu-run: the local xpu-server did not start (exit {proc.poll()})")


def forward_stderr(proc: subprocess.Popen) -> None:
    import threading

    verbose = os.environ.get("XPU_LOG", "WARNING").upper() in ("CALLS", "DEBUG", "INFO")

    def pump() -> None:
        for line in proc.stderr:
            if verbose or "ERROR" in line:
                sys.stderr.write(line)

    threading.Thread(target=pump, daemon=True).start()
