"""The worker's watchdog: a thread that notices that the client or the daemon is gone while the main thread is
busy in one long call, and ends the process if the call keeps it (worker.py's loop ends it otherwise)."""

from __future__ import annotations

import logging
import os
import threading

import zmq
import zmq.utils.monitor

from .session import Session, report

log = logging.getLogger("xpuremote.worker")


class Watchdog(threading.Thread):
    """Notices that the client or the daemon is gone, whatever the main thread is doing.

    The loop ends the session when it sees `gone`, between messages; a call that keeps it busy
    (a long kernel, a huge image) would keep the process, and its memory, long after anyone waits
    for the answer. So if the loop has not finished `EXIT_GRACE_S` after, the process exits here."""

    POLL_MS = 500
    EXIT_GRACE_S = 2.0

    def __init__(self, monitor: zmq.Socket, session: Session) -> None:
        super().__init__(name="xpu-watchdog", daemon=True)
        self.monitor, self.session = monitor, session
        self.parent = os.getppid()
        self.connected = threading.Event()  # a connection was accepted: the client is on its way
        self.finished = threading.Event()  # the main thread has left its loop
        self.gone = ""  # why the session should end
        self.start()

    def run(self) -> None:
        # the monitor stays open until the main thread has disabled it: disable_monitor() sends
        # MONITOR_STOPPED to it, and blocks if this end is already closed
        while not self.finished.is_set() and not self.gone:
            self.gone = self.look()
        if self.gone and not self.finished.wait(self.EXIT_GRACE_S):
            self.exit_now()

    def exit_now(self) -> None:
        try:
            log.warning("session %s: %s while a call was running; exiting now", self.session.name, self.gone)
            report(self.session, None)  # the daemon's session_end line gets the last counters
            logging.shutdown()
        finally:  # whatever the reports meet (a daemon that is gone has closed our stdout pipe's other end)
            os._exit(1)

    def look(self) -> str:
        if self.monitor.poll(self.POLL_MS):
            event = zmq.utils.monitor.recv_monitor_message(self.monitor)
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.connected.set()
            elif event["event"] == zmq.EVENT_DISCONNECTED and int(event["value"]) in self.session.peers:
                # only the client's own connections count: one that never got a message
                # through (a port scan, a refused key) must not end the session
                return "the client disconnected"
        if os.getppid() != self.parent:
            return "the daemon is gone"
        return ""
