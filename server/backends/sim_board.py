"""What the sim devices of one xpu-server hold, across its sessions.

Every session runs a sim backend of its own, in its own worker process; but device-wide
questions (free memory, what nvidia-smi would list) are about all of them, as on a real GPU.
Each worker keeps its bytes per device in a small file of its own, mapped into memory (a store
is a memory write, no system call); a question reads the files of the workers still alive.

The files live in a private directory per daemon: made afresh with a random name and mode 0700
(never one that exists already: in a shared /tmp another user could have made it, or a symlink
in its place), named to its workers in XPU_SIM_BOARD and checked by them (ours, a directory,
0700), and removed when the daemon ends; one that a dead daemon of ours left is removed by the
next daemon. Files are created with O_EXCL|O_NOFOLLOW and read with O_NOFOLLOW.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import shutil
import stat
import struct
import tempfile
from pathlib import Path

log = logging.getLogger("xpuremote.server")
MAX_DEVICES = 64
SLOT = struct.Struct("<Q")
ENV = "XPU_SIM_BOARD"  # the daemon's board directory, for its workers
PREFIX = "xpuremote-sim-"  # then uid-pid-random (uid-pid: directories of older versions)


def make_directory() -> Path:
    """A new private board directory for this process (the daemon): the caller removes it."""
    remove_stale()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getuid()}-{os.getpid()}-"))


def remove_stale() -> None:
    """Remove the board directories that daemons of this user left when they died."""
    name = re.compile(rf"{re.escape(PREFIX)}{os.getuid()}-(\d+)(-\w+)?")
    for entry in os.scandir(tempfile.gettempdir()):
        match = name.fullmatch(entry.name)
        if match and not process_alive(int(match.group(1))) and _private(entry.path, quiet=True):
            shutil.rmtree(entry.path, ignore_errors=True)  # without following links (fd-based on Linux)


def check_directory(path: Path) -> Path:
    """`path` if it is a directory (not a link) of this user that no one else may enter."""
    if not _private(str(path)):
        raise PermissionError(f"{path} is not a private directory of this user: refusing to keep the sim board there")
    return path


def _private(path: str, quiet: bool = False) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077:
        return True
    if not quiet:
        log.warning("%s: owner uid %d, mode %o: not a private directory of uid %d", path, info.st_uid,
                    info.st_mode, os.getuid())
    return False


class Board:
    def __init__(self, directory: Path | None = None) -> None:
        given = directory or (Path(os.environ[ENV]) if os.environ.get(ENV) else None)
        # Without a daemon's directory (a backend made in a test, or by the daemon itself): one of its own.
        self.own = given is None
        self.directory = check_directory(given) if given else Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getuid()}-"
                                                                                    f"{os.getpid()}-"))
        self.path = self.directory / str(os.getpid())
        fd = self._create()
        try:
            os.ftruncate(fd, SLOT.size * MAX_DEVICES)
            self.map: mmap.mmap | None = mmap.mmap(fd, SLOT.size * MAX_DEVICES)
        finally:
            os.close(fd)

    def _create(self) -> int:
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return os.open(self.path, flags, 0o600)
        except FileExistsError:  # a dead worker's, whose pid this one has now (the directory is ours alone)
            os.unlink(self.path)
            return os.open(self.path, flags, 0o600)

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
            if not process_alive(pid):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)  # a worker that died without closing
                continue
            used = _read_slot(entry.path, device)
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
        if self.own:
            shutil.rmtree(self.directory, ignore_errors=True)


def _read_slot(path: str, device: int) -> int:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        raw = os.pread(fd, SLOT.size, SLOT.size * device)
    finally:
        os.close(fd)
    return SLOT.unpack(raw)[0] if len(raw) == SLOT.size else 0


def process_alive(pid: int) -> bool:
    """Whether process `pid` lives (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
