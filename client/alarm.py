"""A one-shot timer that one thread sets and another sleeps on: Linux's timerfd.

The client's flusher sends a batch of async calls that no sync call has carried away in time.
With an Event, every batch woke the flusher twice (once to start counting, once when it had
counted), and each wake-up took the GIL from the application's thread, on its CPU. Here the
application's thread sets and clears the timer with a system call of its own; the flusher wakes
up only when a batch really has waited the whole window.
"""

from __future__ import annotations

import ctypes
import os

CLOCK_MONOTONIC = 1
TFD_CLOEXEC = 0o2000000
_Itimerspec = ctypes.c_long * 4  # struct itimerspec: the interval (seconds, nanoseconds), then the expiry

_libc = ctypes.CDLL(None, use_errno=True)
_settime = _libc.timerfd_settime
_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]  # none guessed per call


def _checked(result: int) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


class Alarm:
    def __init__(self) -> None:
        self.fd = _checked(_libc.timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC))
        self.armed = False

    def arm(self, delay_s: float) -> None:
        """Go off `delay_s` from now (replacing any earlier setting); nothing once closed."""
        ns = max(1, int(delay_s * 1e9))  # 0 would disarm it
        self._set(ns)
        self.armed = True

    def disarm(self) -> None:
        """Not go off; also forgets an expiry no one has waited for yet."""
        if self.armed:
            self._set(0)
            self.armed = False

    def wait(self) -> None:
        """Sleep until it goes off (the GIL is released meanwhile)."""
        os.read(self.fd, 8)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _set(self, ns: int) -> None:
        if self.fd < 0:
            return
        _checked(_settime(self.fd, 0, _Itimerspec(0, 0, *divmod(ns, 1_000_000_000)), None))
