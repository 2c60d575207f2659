"""What the sim devices of one xpu-server hold, across its sessions.

Every session runs a sim backend of its own, in its own worker process; but device-wide
questions (free memory, what nvidia-smi would list) are about all of them, as on a real GPU.
Each worker keeps its bytes per device in a small file of its own, mapped into memory (a store
is a memory write, no system call); a question reads the files of the workers still alive.
The files live in a directory per daemon (the workers' parent) and user.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import tempfile
from pathlib import Path

MAX_DEVICES = 64
SLOT = struct.Struct("<Q")


def default_directory() -> Path:
    return Path(tempfile.gettempdir()) / f"xpuremote-sim-{os.getuid()}-{os.getppid()}"


class Board:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or default_directory()
        self.path = self.directory / str(os.getpid())
        for _ in range(3):  # another worker's close() may remove the directory in between
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                break
        else:
            raise OSError(f"cannot create {self.path}")
        try:
            os.ftruncate(fd, SLOT.size * MAX_DEVICES)
            self.map: mmap.mmap | None = mmap.mmap(fd, SLOT.size * MAX_DEVICES)
        finally:
            os.close(fd)

    def publish(self, device: int, used: int) -> None:
        if self.map is not None and 0 <= device < MAX_DEVICES:
            SLOT.pack_into(self.map, SLOT.size * device, used)

    def sessions(self, device: int) -> dict[int, int]:
        """Worker pid -> bytes it holds on `device`, for the live workers holding any."""
        out: dict[int, int] = {}
        for entry in os.scandir(self.directory):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            if not _alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)  # a worker that died without closing
                continue
            try:
                with open(entry.path, "rb") as f:
                    f.seek(SLOT.size * device)
                    raw = f.read(SLOT.size)
            except OSError:
                continue
            used = SLOT.unpack(raw)[0] if len(raw) == SLOT.size else 0
            if used:
                out[pid] = used
        return out

    def used(self, device: int) -> int:
        return sum(self.sessions(device).values())

    def close(self) -> None:
        if self.map is None:
            return
        self.map.close()
        self.map = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # the last one out (fails while others remain)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
