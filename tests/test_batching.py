"""The client's batching of async calls: the alarm the flusher sleeps on, and the flusher sending
a batch that no sync call carries, against a real server."""

from __future__ import annotations

import select
import threading
import time

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
