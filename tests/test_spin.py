"""How the ends wait (protocol/spin.py): a synchronous call's wait looks for its answer without sleeping, as
the context's scheduling flags allow, and for no longer than its bound; the operator's settings are checked."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import free_port, shim_env

from xpuremote.client.connection import Connection
from xpuremote.protocol import spin

BOUND_NS = 2_000_000


def test_spin_answers_the_first_true_look_or_none_after_its_bound() -> None:
    answers = iter([0, [], None, "ready"])
    assert spin.spin(lambda: next(answers), BOUND_NS) == "ready"
    looks = []
    began = time.perf_counter_ns()
    assert spin.spin(lambda: looks.append(1), BOUND_NS) is None
    assert time.perf_counter_ns() - began >= BOUND_NS and len(looks) > 1
    assert spin.spin(lambda: looks.append(1) or True, 0) is None and len(looks) > 1  # no bound: no look


def test_the_default_bound_follows_the_machine_and_xpu_spin_us(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XPU_SPIN_US", raising=False)
    assert spin.cpus() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(spin, "cpus", lambda: spin.SPIN_MIN_CPUS)  # stands in for a larger machine
    assert spin.default_us() == spin.DEFAULT_US
    assert spin.default_us(spin.SPIN_MIN_CPUS - 1) == spin.DEFAULT_US  # a server's sessions, fewer than its CPUs
    assert spin.default_us(spin.SPIN_MIN_CPUS) == 0
    monkeypatch.setattr(spin, "cpus", lambda: spin.SPIN_MIN_CPUS - 1)
    assert spin.default_us() == 0
    monkeypatch.setenv("XPU_SPIN_US", "350")
    assert spin.default_us() == 350 and spin.default_us(1000) == 350  # the operator's word wins
    monkeypatch.setenv("XPU_SPIN_US", " 0")
    assert spin.default_us() == 0
    for bad in ("fast", "-5", "1.5", ""):
        monkeypatch.setenv("XPU_SPIN_US", bad)
        with pytest.raises(ValueError, match=f"XPU_SPIN_US='{bad}' is not a whole number"):
            spin.default_us()


class CountedPoll:
    """The client's select.poll over a real socket, with its looks counted."""

    def __init__(self, sock: socket.socket) -> None:
        self.inner, self.looks = select.poll(), 0
        self.inner.register(sock, select.POLLIN)

    def poll(self, timeout_ms: int) -> list:
        self.looks += 1
        return self.inner.poll(timeout_ms)


@pytest.fixture
def waiting() -> Iterator[tuple[Connection, socket.socket]]:
    """A connection's wait for an answer on its data connection, the worker's end a socket of the test's. Only the
    fields the wait reads are set: the rest of a Connection needs a server, which this test does not."""
    mine, theirs = socket.socketpair()
    conn = Connection.__new__(Connection)
    conn.later, conn.data, conn.data_ready, conn.spin_ns = {}, mine, CountedPoll(mine), BOUND_NS
    yield conn, theirs
    mine.close()
    theirs.close()


def test_a_wait_spins_up_to_its_bound_unless_the_context_blocks(waiting: tuple[Connection, socket.socket],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    conn, worker = waiting
    assert not conn._spun(spin.SCHED_BLOCKING_SYNC) and conn.data_ready.looks == 0
    began = time.perf_counter_ns()
    assert not conn._spun(0)  # CU_CTX_SCHED_AUTO: nothing came within the bound
    assert time.perf_counter_ns() - began >= BOUND_NS and conn.data_ready.looks > 1
    yields = []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))
    assert not conn._spun(spin.SCHED_YIELD | 0x08) and yields  # other flags (CU_CTX_MAP_HOST) play no part
    worker.send(b"x")
    conn.data_ready.looks = 0
    assert conn._spun(1) and conn.data_ready.looks == 1  # CU_CTX_SCHED_SPIN: the answer is there at once
    conn.later = {7: print}  # answers due on ZeroMQ: the wait must watch both, in slices
    assert not conn._spun(1) and conn.data_ready.looks == 1


def xpu_server(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xpuremote.server.daemon", "--listen", "tcp://127.0.0.1:1", *args],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_the_server_refuses_a_bad_spin_setting_before_it_starts() -> None:
    done = xpu_server("--spin-us", "-1")
    assert done.returncode == 2 and "--spin-us cannot be negative" in done.stderr, done
    done = xpu_server(env={"XPU_SPIN_US": "1ms"})
    assert done.returncode == 2 and "XPU_SPIN_US='1ms' is not a whole number of microseconds" in done.stderr, done


def test_a_bad_xpu_spin_us_is_said_before_the_program_runs_or_by_its_first_call(shim: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "xpuremote.interpose.run", "--", sys.executable, "-c", "print(1)"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "XPU_SPIN_US": "soon"})
    assert done.returncode == 2 and "XPU_SPIN_US='soon' is not a whole number" in done.stderr, done
    assert "1" not in done.stdout
    # preloaded by hand: cuInit fails with INVALID_VALUE and says why (no server is reached)
    program = "import ctypes; print(ctypes.CDLL('libcuda.so.1').cuInit(0))"
    env = shim_env(shim, f"tcp://127.0.0.1:{free_port()}", XPU_SPIN_US="soon")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, env=env)
    assert done.stdout.split() == ["1"], done
    assert "a setting in the environment: XPU_SPIN_US='soon' is not a whole number" in done.stderr, done
