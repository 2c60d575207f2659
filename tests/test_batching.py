"""The client's batching of async calls: the alarm the flusher sleeps on, and the flusher sending
a batch that no sync call carries, against a real server."""

from __future__ import annotations

import select
import threading
import time
from typing import Any

import pytest
from conftest import Server
from pyclient import PyClient, sessions, wait_for

from xpuremote.client.alarm import Alarm
from xpuremote.protocol import errors

MIB = 1 << 20


def fired(alarm: Alarm, within_s: float) -> bool:
    return bool(select.select([alarm.fd], [], [], within_s)[0])


def test_alarm_goes_off_once_and_disarming_forgets_an_expiry() -> None:
    alarm = Alarm()
    try:
        alarm.arm(0.001)
        assert fired(alarm, 2.0)
        alarm.wait()
        assert not fired(alarm, 0.01), "one-shot"

        alarm.arm(0.0001)
        time.sleep(0.01)  # it has gone off, and no one has waited for it
        alarm.disarm()
        assert not fired(alarm, 0.05)

        alarm.arm(10.0)
        alarm.arm(0.001)  # a new setting replaces the old
        assert fired(alarm, 2.0)
    finally:
        alarm.close()
    alarm.arm(0.001)  # closed: nothing, and no error
    alarm.disarm()


def flushers() -> int:
    return sum(t.name == "xpuremote-flush" for t in threading.enumerate())


def test_the_flusher_sends_a_batch_no_sync_call_carries(server: Server) -> None:
    before = flushers()
    client = PyClient(server.address)
    try:
        ptr = client.alloc(MIB)

        def memory(expected: int) -> bool:  # the worker reports its session's figures now and then
            return any(s["session"] == client.conn.session and s["memory"] == expected
                       for s in sessions(server.address))

        assert wait_for(lambda: memory(MIB), 5)
        client.post("cuMemFree_v2", ptr)  # async, and no sync call after it
        assert wait_for(lambda: memory(0), 5), "the free went out by itself"
        assert client.mem_info()[0] > 0  # and the session goes on
    finally:
        client.close()
    assert wait_for(lambda: flushers() == before, 5), "close() ends the flusher thread"


def test_a_batch_the_flusher_cannot_send_fails_loudly_and_the_flusher_lives_on(server: Server) -> None:
    """A call the wire cannot carry (no entry point queues one, but nothing may ever depend on
    that): its batch fails at the next sync call, and the flusher keeps sending later batches."""
    before = flushers()
    client = PyClient(server.address)
    try:
        ptr = client.alloc(MIB)
        client.post("cuMemsetD8_v2", ptr, object(), 16)  # not encodable: the flusher's send raises
        assert wait_for(lambda: not client.conn.pending, 5), "the flusher took the batch"
        assert flushers() == before + 1, "the flusher thread died"
        assert client.status_of("cuCtxSynchronize") == errors.UNKNOWN, "the lost batch is reported"
        client.post("cuMemFree_v2", ptr)
        assert wait_for(lambda: not client.conn.pending, 5), "a later batch goes out by itself"
        assert client.status_of("cuCtxSynchronize") == errors.SUCCESS
    finally:
        client.close()


class Exclusive:
    """The connection's own ZeroMQ socket, counting the times two threads used it at once (a ZeroMQ socket
    takes one thread at a time). Everything else passes through to the socket."""

    CHECKED = ("send", "recv", "poll", "send_multipart", "recv_multipart")

    def __init__(self, sock: Any) -> None:
        self.sock, self.busy, self.overlaps = sock, threading.Lock(), 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sock, name)
        if name not in self.CHECKED:
            return attr

        def checked(*args: Any, **kwargs: Any) -> Any:
            if not self.busy.acquire(blocking=False):
                self.overlaps += 1
                return attr(*args, **kwargs)
            try:
                return attr(*args, **kwargs)
            finally:
                self.busy.release()
        return checked


@pytest.mark.parametrize("data_connection", ["1", "0"])
def test_threads_queue_calls_while_the_flusher_sends(server: Server, monkeypatch: pytest.MonkeyPatch,
                                                     data_connection: str) -> None:
    """The flusher sends its batch after letting go of the connection's lock: calls queued meanwhile, and sync
    calls that use the socket next, keep each thread's order (every thread reads back its own last memset) and
    never share the socket with the flusher's send. Without the data connection the sync calls use it too."""
    monkeypatch.setenv("XPU_DATA_CONNECTION", data_connection)
    client = PyClient(server.address, batch_window_us=1)  # the flusher sends all the time
    sock = client.conn.sock = Exclusive(client.conn.sock)
    threads, rounds, size = 6, 150, 4096
    buffers = [client.alloc(size) for _ in range(threads)]
    failures: list[str] = []

    def work(i: int) -> None:
        try:
            for r in range(rounds):
                for k in range(4):
                    client.post("cuMemsetD8Async", buffers[i], (i * 31 + r * 4 + k) & 0xFF, size, 0)
                if r % 10 == 9:
                    want = (i * 31 + r * 4 + 3) & 0xFF
                    got = client.read(buffers[i], size)
                    if got != bytes([want]) * size:
                        failures.append(f"thread {i} round {r}: read {got[:4].hex()}, wanted {want:02x}")
        except Exception as exc:  # noqa: BLE001 - any failure of a thread fails the test
            failures.append(f"thread {i}: {type(exc).__name__}: {exc}")

    sent_before = client.conn.seq
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert not any(w.is_alive() for w in workers), "a thread hung"
        assert failures == []
        assert sock.overlaps == 0, "two threads used the socket at once"
        assert client.conn.seq - sent_before > threads * rounds // 10, "the flusher sent batches of its own meanwhile"
        assert client.status_of("cuCtxSynchronize") == errors.SUCCESS
    finally:
        client.close()


def test_a_small_answer_read_later_rides_with_the_next_message(server: Server) -> None:
    """A copy into pinned memory (a call answered later) whose answer is small rides with the batch: the
    synchronize after it carries it, and both answers come back in one message, the copy's written before the
    synchronize returns. With no call after it, the flusher sends the batch for its answer; in a batch that
    fills up, the answer rides with that batch's."""
    from pyclient import CTX

    from xpuremote.client.connection import MAX_BATCH_CALLS
    from xpuremote.protocol.calls import CALLS

    client = PyClient(server.address)
    conn, got = client.conn, []
    try:
        ptr = client.alloc(4096)
        dtoh = CALLS["cuMemcpyDtoHAsync_v2"]
        for value in (7, 9):
            client.post("cuMemsetD8Async", ptr, value, 4096, 0)
            sent = conn.seq
            conn.call_later(dtoh, [8, ptr, 8, 0], CTX, lambda status, outs: got.append(bytes(outs[0])), answer_bytes=8)
            client.call("cuStreamSynchronize", 0)
            assert got[-1] == bytes([value]) * 8, "written before the synchronize returned"
            assert conn.seq - sent == 1, "the copy and the synchronize went as one message"
        client.post("cuMemsetD8Async", ptr, 3, 4096, 0)
        conn.call_later(dtoh, [8, ptr, 8, 0], CTX, lambda status, outs: got.append(bytes(outs[0])), answer_bytes=8)
        assert wait_for(lambda: got[-1] == bytes([3]) * 8, 5), "the flusher sent it and read the answer"
        conn.call_later(dtoh, [8, ptr, 8, 0], CTX, lambda status, outs: got.append(bytes(outs[0])), answer_bytes=8)
        for _ in range(MAX_BATCH_CALLS):  # the batch fills up and goes out with the copy in it
            client.post("cuMemsetD8Async", ptr + 8, 1, 8, 0)
        client.call("cuStreamSynchronize", 0)
        assert len(got) == 4 and got[-1] == bytes([3]) * 8
        for rode in ("with a sync call", "in the flusher's batch"):  # a failing rider fails the next wait
            conn.call_later(dtoh, [8, ptr + (1 << 40), 8, 0], CTX, lambda status, outs: got.append(outs),
                            answer_bytes=8)
            if rode != "with a sync call":
                assert wait_for(lambda: not conn.later and not conn.riders and not conn.boarding, 5)
            assert client.status_of("cuStreamSynchronize", 0) == errors.INVALID_VALUE, rode
            assert client.status_of("cuStreamSynchronize", 0) == 0 and len(got) == 4
        assert not conn.later and not conn.riders and not conn.boarding
    finally:
        client.close()


def test_a_batch_past_its_age_bound_waits_a_window_for_the_sync_call_of_its_last_rider(server: Server) -> None:
    """A generation loop's token: a copy into pinned memory, then the synchronize that reads it. Where the batch's
    bound on its age falls between the two, the flusher gives the batch one window more, so the synchronize still
    carries the copy (one message), rather than sending the copy alone for its answer and the synchronize after it.
    A window of 200 ms makes the timing plain: the batch begins at 0, its bound is at 200 ms, the copy comes at
    100 ms, the synchronize at 300 ms, the window more ends at 400 ms."""
    from pyclient import CTX

    from xpuremote.protocol.calls import CALLS

    client = PyClient(server.address, batch_window_us=200_000)
    conn, got = client.conn, []
    try:
        ptr = client.alloc(4096)
        client.call("cuCtxSynchronize")
        sent = conn.seq
        client.post("cuMemsetD8Async", ptr, 5, 4096, 0)
        time.sleep(0.1)
        conn.call_later(CALLS["cuMemcpyDtoHAsync_v2"], [8, ptr, 8, 0], CTX,
                        lambda status, outs: got.append(bytes(outs[0])), answer_bytes=8)
        time.sleep(0.2)
        client.call("cuStreamSynchronize", 0)
        assert got == [bytes([5]) * 8]
        assert conn.seq - sent == 1, "the memset, the copy and the synchronize went as one message"
    finally:
        client.close()
