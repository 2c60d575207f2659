"""A hostile tenant beside well-behaved ones: one client runs every attack of the hardening
issue in a loop while two others run the checksummed load (tests/test_load.py's sequences).
Zero corruption, zero lost sessions, every attack refused, and the daemon's and the workers'
memory bounded. Each attack is tested on its own, with the details, in test_security,
test_isolation, test_operations and test_fatbin; this is all of them at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import test_load
import zmq
from conftest import start_server
from pyclient import PyClient, rss, sessions, wait_for
from test_data_connection import RawSession
from test_isolation import HOSTILE, SIZE, host_pointer_statuses, load, load_image, variable_elf

from xpuremote.protocol import errors, wire
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.errors import CudaError

MIB = 1 << 20
ROUNDS = 2
MAX_HANDLES = 1000


class Attacker:
    """Every attack, each returning what the server answered (asserted by the caller)."""

    def __init__(self, address: str, victim_endpoint: str) -> None:
        self.address, self.victim_endpoint = address, victim_endpoint
        self.ctx = zmq.Context()
        self.client = PyClient(address)
        self.mine = self.client.alloc(SIZE)
        load(self.client)

    def close(self) -> None:
        self.client.close()
        self.ctx.destroy(0)

    def _dealer(self, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        return sock

    def _ask(self, sock: zmq.Socket, frames: list) -> dict:
        sock.send_multipart(frames)
        assert sock.poll(30_000), "no answer"
        return wire.decode(sock.recv_multipart())

    def takeover(self) -> list[int]:
        """Into a victim's worker without its session key: a read, then away (which must not end it)."""
        sock = self._dealer(self.victim_endpoint)
        call = [[CALLS["cuMemcpyDtoH_v2"].opcode, [64, HOSTILE, 64]]]
        answer = self._ask(sock, wire.encode({"op": "calls", "seq": 1, "reply": True, "calls": call}))
        sock.close(0)
        return [answer["status"]]

    def daemon_frames(self) -> list[int]:
        sock = self._dealer(self.address)
        answer = self._ask(sock, [*wire.encode({"op": "status"}), *[b"\0" * MIB] * 200])
        sock.close(0)
        return [answer["status"]]

    def worker_frames(self) -> list[int]:
        conn = self.client.conn
        header = {"op": "calls", "seq": 99, "reply": True, "calls": [[0x1, []]]}
        with conn.lock:
            conn.sock.send_multipart([*wire.encode(header), *[b"\0" * (15 * MIB)] * 12])
            return [conn._receive(None, 30)["status"]]

    def host_pointers(self) -> list[int]:
        return list(host_pointer_statuses(self.client, self.mine).values())

    def device_addresses(self) -> list[int]:
        return [self.client.status_of("cuMemcpyDtoH_v2", 64, HOSTILE, 64),
                self.client.status_of("cuMemcpyHtoD_v2", self.mine + SIZE - 8, b"x" * 64, 64)]

    def images(self) -> list[int]:
        """A 2 GiB module variable, a PTX comment bomb, garbage."""
        return [load_image(self.client, 0x7C00_0000_9000 + 16 * i, image)
                for i, image in enumerate((variable_elf(2 << 30), b"/*" * 100_000, os.urandom(4096)))]

    def handles(self) -> list[int]:
        """Streams until refused; then all destroyed again."""
        made = [0x7C00_3000_0000 + 16 * i for i in range(MAX_HANDLES + 1)]
        for handle in made:
            self.client.post("cuStreamCreate", handle, 0)
        status = self.client.status_of("cuCtxSynchronize")
        for handle in made[:MAX_HANDLES - 10]:  # the few the session held before are not ours
            self.client.post("cuStreamDestroy_v2", handle)
        self.client.status_of("cuCtxSynchronize")
        return [status]

    def squat(self) -> list[int]:
        """Hellos never followed by a connection: past the per-peer bound they are refused. The slots
        last 8 s (--connect-timeout): a GPU's workers start slowly enough (cuInit) that the first of
        six hellos asked in turn could expire before the last is asked."""
        socks = [self._dealer(self.address) for _ in range(6)]
        answers = [self._ask(s, wire.encode({"op": "hello", "client": {"user": "squatter"}})) for s in socks]
        for sock in socks:
            sock.close(0)
        return [a["status"] for a in answers[-2:]]  # the first ones may still find free slots

    def data_head(self) -> list[int]:
        """A session of its own whose data connection declares a 6 GiB message and sends nothing more: the
        worker takes no memory for it and ends that session at once, saying why."""
        deadline = time.monotonic() + 20
        while True:  # the squatters' pending slots may still be taken (--connect-timeout)
            try:
                s = RawSession(self.address)
                break
            except KeyError:  # refused: no session key
                assert time.monotonic() < deadline, "no session for the data connection attack"
                time.sleep(0.5)
        try:
            s.data = s.connect_data()
            assert s.request({"op": "data"})["status"] == 0
            s.data.sendall(wire.STREAM_HEAD.pack(1, 6 << 30))
            assert s.sock.poll(10_000), "no word from the worker"
            notice = wire.decode(s.sock.recv_multipart())
            return [notice["status"] if notice.get("op") == "closing" else errors.SUCCESS]
        finally:
            s.close()

    def attacks(self) -> dict[str, tuple[Callable[[], list[int]], set[int]]]:
        """name -> (attack, the statuses that count as refused)."""
        return {
            "takeover": (self.takeover, {errors.NOT_PERMITTED}),
            "daemon frames": (self.daemon_frames, {errors.INVALID_VALUE}),
            "worker frames": (self.worker_frames, {errors.INVALID_VALUE}),
            "host pointers": (self.host_pointers, {errors.NOT_SUPPORTED}),
            "device addresses": (self.device_addresses, {errors.INVALID_VALUE}),
            "images": (self.images, {errors.OUT_OF_MEMORY, errors.INVALID_IMAGE, errors.NO_BINARY_FOR_GPU}),
            "handles": (self.handles, {errors.OUT_OF_MEMORY}),
            "squatting": (self.squat, {errors.NOT_PERMITTED}),
            "data connection head": (self.data_head, {errors.INVALID_VALUE}),
        }


def test_a_hostile_tenant_hurts_no_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_load, "SEQUENCES", 150)
    srv = start_server(tmp_path, args=("--mem-quota", "256M", "--max-request-bytes", "16M", "--max-handles",
                                       str(MAX_HANDLES), "--max-pending-per-peer", "4", "--connect-timeout", "8"))
    try:
        sessions(srv.address)  # the daemon looks up its devices once: part of its baseline
        daemon_before = rss(srv.process.pid)
        results: dict[int, str] = {}
        loaders = [threading.Thread(target=test_load.run_client, args=(srv.address, seed, results))
                   for seed in (1, 2)]
        for loader in loaders:
            loader.start()
        victim = PyClient(srv.address)  # the one whose worker the attacker found (a port scan finds them all)
        secret = os.urandom(SIZE)
        held = victim.alloc(SIZE)
        victim.write(held, secret)
        attacker = Attacker(srv.address, victim.conn.endpoint)
        worker = next(s["worker_pid"] for s in sessions(srv.address) if s["session"] == attacker.client.conn.session)
        worker_before = rss(worker)
        try:
            for _ in range(ROUNDS):
                for name, (attack, refused) in attacker.attacks().items():
                    statuses = attack()
                    assert set(statuses) <= refused, f"{name}: answered {statuses}, not a refusal"
                    assert victim.read(held, SIZE) == secret, f"the victim's memory changed during {name}"
            attacker.client.write(attacker.mine, b"ok" * 32)  # the attacker's own session goes on too
            assert attacker.client.read(attacker.mine, 64) == b"ok" * 32
            worker_grown = rss(worker) - worker_before
        finally:
            attacker.close()
        for loader in loaders:
            loader.join(300)
        assert results == {1: "ok", 2: "ok"}, results
        assert victim.read(held, SIZE) == secret and victim.read(victim.alloc(16), 16) == bytes(16)
        victim.close()
        daemon_grown = rss(srv.process.pid) - daemon_before
        print(f"hostile tenant: {ROUNDS} rounds of {len(attacker.attacks())} attacks; the daemon grew "
              f"{daemon_grown / MIB:.1f} MiB, the attacker's worker {worker_grown / MIB:.1f} MiB")
        assert daemon_grown < 100 * MIB, f"the daemon holds {daemon_grown >> 20} MiB more"
        assert worker_grown < 150 * MIB, f"the attacker's worker holds {worker_grown >> 20} MiB more"
        assert wait_for(_fresh_session_works(srv.address), 30), "a new client got no session after the attacks"
    finally:
        srv.stop()
    assert "Traceback" not in srv.log()


def _fresh_session_works(address: str) -> Callable[[], bool]:
    def attempt() -> bool:
        try:
            client = PyClient(address)
        except CudaError:  # refused while the squatters' pending slots last (--connect-timeout)
            time.sleep(0.5)
            return False
        try:
            return client.read(client.alloc(16), 16) == bytes(16)
        finally:
            client.close()
    return attempt
