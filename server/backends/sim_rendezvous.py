"""Where the sim's NCCL ranks meet: one directory per communicator, shared by the worker processes of every
xpu-server of this user on this machine.

Each session runs in a worker process of its own, and the ranks of one job may be sessions of one daemon or of
several daemons on one machine; so they meet in the file system, as the sim board's workers do (sim_board.py).
The unique id the sim makes (ncclGetUniqueId) holds a magic and 16 random bytes; the communicator's directory
is named by those bytes in hex, under a private directory of this user (0700, checked as the board's is), so
an id from a client names nothing outside it.

In a communicator's directory:
- `rank-R`: rank R has joined (its process id, and the communicator's size). Made with O_EXCL: a rank joins
  once. Every rank waits until all have joined, or the timeout.
- `c<N>.R`: rank R's contribution to its N-th collective, written whole and then renamed into place. A rank
  reads every rank's and computes the result itself. Once it has seen all of collective N, every rank has
  finished N-1 (each wrote N only after), so it removes its own N-1.
- `p<S>-<D>.<N>`: the N-th message from rank S to rank D (ncclSend), removed by D once read.
- `left-R`: rank R has left (destroy, abort or the session's end); the last to leave removes the directory. A
  rank whose join failed withdraws (its `rank-R` removed). What a killed worker left is removed by a later
  ncclGetUniqueId once the directory has been idle an hour and none of its ranks' processes is alive.

A wait polls with a growing sleep (50 µs to 2 ms), and gives up after the timeout (XPU_NCCL_TIMEOUT_S, 300 s by
default) or as soon as a peer it waits for has left or its process is gone, each with an error that says which
rank, and why.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
import time
from pathlib import Path

from xpuremote.protocol import errors
from xpuremote.protocol.errors import CudaError

from .sim_board import process_alive

ID_BYTES = 128
MAGIC = b"xpuremote-sim-nccl-v1\0"
TOKEN_BYTES = 16
TIMEOUT_ENV = "XPU_NCCL_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
POLL_MIN_S, POLL_MAX_S = 50e-6, 2e-3
LIVENESS_EVERY_S = 0.5  # how often a wait looks whether the peers it waits for are still there
STALE_S = 3600.0  # a communicator's directory idle this long, its ranks' processes gone, is removed


def nccl_error(outcome: str, detail: str) -> CudaError:
    return errors.library_error("nccl", outcome, detail)


def timeout_s() -> float:
    """XPU_NCCL_TIMEOUT_S: how long a rank waits for its peers (to join, or for a collective's data)."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise nccl_error("invalid_value", f"{TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    return value if value > 0 else DEFAULT_TIMEOUT_S


def root() -> Path:
    """This user's directory of communicators (made private, or refused when someone else's)."""
    path = Path(tempfile.gettempdir()) / f"xpuremote-nccl-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise nccl_error("internal", f"{path} is not a private directory of uid {os.getuid()}: "
                        "refusing to meet NCCL peers there")
    return path


def new_id() -> bytes:
    """A unique id as ncclGetUniqueId answers it: 128 bytes, which the application passes to every rank. Each new
    one first removes what communicators whose ranks are all gone left behind."""
    remove_stale(root())
    return (MAGIC + secrets.token_bytes(TOKEN_BYTES)).ljust(ID_BYTES, b"\0")


def remove_stale(directory: Path, idle_s: float = STALE_S) -> None:
    """The communicators' directories untouched for `idle_s` whose joined ranks' processes have all ended (a
    worker killed outright never leaves)."""
    now = time.time()
    for entry in directory.iterdir():
        try:
            if now - entry.stat().st_mtime < idle_s:
                continue
            pids = [int(f.read_text().split()[0]) for f in entry.glob("rank-*")]
        except (OSError, ValueError, IndexError):
            continue
        if not any(process_alive(pid) for pid in pids):
            shutil.rmtree(entry, ignore_errors=True)


def derived_id(token: str, salt: str) -> bytes:
    """The unique id of a communicator split from the one named `token`: the same for every rank that asks with
    the same salt (the parent's collective count and the color), unguessable without the parent's."""
    derived = hashlib.sha256(f"{token}/{salt}".encode()).digest()[:TOKEN_BYTES]
    return (MAGIC + derived).ljust(ID_BYTES, b"\0")


def token_of(comm_id: bytes) -> str:
    """The communicator's name in the id's bytes; an id the sim did not make is refused."""
    raw = bytes(comm_id)
    token = raw[len(MAGIC): len(MAGIC) + TOKEN_BYTES]
    if len(raw) != ID_BYTES or not raw.startswith(MAGIC) or any(raw[len(MAGIC) + TOKEN_BYTES:]):
        raise nccl_error("invalid_value", "the ncclUniqueId was not made by this machine's sim "
                        "(ncclGetUniqueId on a sim server, passed unchanged to every rank)")
    return token.hex()


class Rendezvous:
    """One rank's membership of a communicator's directory: joining, exchanging, sending, leaving."""

    def __init__(self, comm_id: bytes, nranks: int, rank: int, timeout: float | None = None) -> None:
        if nranks < 1 or not 0 <= rank < nranks:
            raise nccl_error("invalid_value", f"rank {rank} of a communicator of {nranks}")
        self.nranks, self.rank = nranks, rank
        self.timeout = timeout if timeout is not None else timeout_s()
        self.token = token_of(comm_id)
        self.directory = root() / self.token
        with contextlib.suppress(FileExistsError):
            self.directory.mkdir(mode=0o700)
        self.collectives = 0  # collectives done so far
        self.sent: dict[int, int] = {}  # peer -> messages sent to it
        self.received: dict[int, int] = {}  # peer -> messages received from it
        self.pids: dict[int, int] = {}
        self.left = False
        self._join()

    # ---- joining ----------------------------------------------------------------------------------------
    def _join(self) -> None:
        mine = self.directory / f"rank-{self.rank}"
        # written whole under a name of its own, then linked into place: a peer never reads it half-written, and
        # the link fails where the rank has joined already
        draft = self.directory / f".rank-{self.rank}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {self.nranks}\n")
        try:
            os.link(draft, mine)
        except FileExistsError:
            raise nccl_error("invalid_value", f"rank {self.rank} has joined this communicator already "
                            "(each rank must call ncclCommInitRank with its own rank)") from None
        finally:
            os.unlink(draft)
        try:
            self._wait_for([self.directory / f"rank-{r}" for r in range(self.nranks)], "to join")
            for r in range(self.nranks):
                pid, size = (int(v) for v in (self.directory / f"rank-{r}").read_text().split())
                if size != self.nranks:
                    raise nccl_error("invalid_value", f"rank {r} joined a communicator of {size} ranks, "
                                    f"rank {self.rank} one of {self.nranks}")
                self.pids[r] = pid
        except CudaError:
            self._withdraw()
            raise

    # ---- waiting ----------------------------------------------------------------------------------------
    def _wait_for(self, paths: list[Path], what: str) -> None:
        """Until every path exists; a timeout, or a peer that left or died, ends the wait with an error."""
        began = last_check = time.monotonic()
        nap = POLL_MIN_S
        missing = list(paths)
        while True:
            missing = [p for p in missing if not p.exists()]
            if not missing:
                return
            now = time.monotonic()
            if now - began > self.timeout:
                ranks = ", ".join(str(self._rank_of(p)) for p in missing)
                raise nccl_error("timeout", f"rank {self.rank} waited {self.timeout:g} s for rank(s) {ranks} "
                                f"{what} (of {self.nranks}); each rank must run under a server of this machine "
                                f"(XPU_NCCL_TIMEOUT_S sets the wait)")
            if now - last_check > LIVENESS_EVERY_S:
                self._check_peers([self._rank_of(p) for p in missing], what)
                last_check = now
            time.sleep(nap)
            nap = min(nap * 2, POLL_MAX_S)

    def _rank_of(self, path: Path) -> int:
        """The peer a file waited for belongs to: rank-R, c<N>.R, p<S>-<D>.<N>."""
        name = path.name
        if name.startswith("rank-"):
            return int(name[5:])
        if name.startswith("p"):
            return int(name[1:].split("-")[0])
        return int(name.rsplit(".", 1)[1])

    def _check_peers(self, ranks: list[int], what: str) -> None:
        for r in ranks:
            if (self.directory / f"left-{r}").exists():
                raise nccl_error("remote", f"rank {r} left the communicator while rank {self.rank} waited "
                                f"for it {what}")
            pid = self.pids.get(r)
            if pid is not None and not process_alive(pid):
                raise nccl_error("remote", f"rank {r}'s server process ({pid}) is gone while rank "
                                f"{self.rank} waited for it {what}")

    # ---- data -------------------------------------------------------------------------------------------
    def _put(self, name: str, data: bytes | memoryview) -> None:
        temporary = self.directory / f".{name}.{secrets.token_hex(4)}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temporary, self.directory / name)

    def _get(self, name: str) -> bytes:
        fd = os.open(self.directory / name, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def exchange(self, data: bytes | memoryview) -> list[bytes]:
        """Every rank's contribution to the next collective, in rank order (this rank's `data` among them)."""
        self._check_open()
        n = self.collectives
        self._put(f"c{n}.{self.rank}", data)
        self._wait_for([self.directory / f"c{n}.{r}" for r in range(self.nranks)], f"in collective {n}")
        parts = [bytes(data) if r == self.rank else self._get(f"c{n}.{r}") for r in range(self.nranks)]
        if n:  # every rank is past collective n-1 now
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / f"c{n - 1}.{self.rank}")
        self.collectives = n + 1
        return parts

    def send(self, peer: int, data: bytes | memoryview) -> None:
        self._check_open()
        self._peer(peer)
        n = self.sent.get(peer, 0)
        self._put(f"p{self.rank}-{peer}.{n}", data)
        self.sent[peer] = n + 1

    def recv(self, peer: int) -> bytes:
        self._check_open()
        self._peer(peer)
        n = self.received.get(peer, 0)
        path = self.directory / f"p{peer}-{self.rank}.{n}"
        self._wait_for([path], f"to send message {n}")
        data = self._get(path.name)
        os.unlink(path)
        self.received[peer] = n + 1
        return data

    def _peer(self, peer: int) -> None:
        if not 0 <= peer < self.nranks:
            raise nccl_error("invalid_value", f"peer {peer} of a communicator of {self.nranks}")

    def _check_open(self) -> None:
        if self.left:
            raise nccl_error("invalid_value", f"rank {self.rank} has left this communicator")

    # ---- leaving ----------------------------------------------------------------------------------------
    def _withdraw(self) -> None:
        """A join that failed: this rank was never a member. A peer still waiting learns it from `left-R`; the
        directory goes with the last rank that had joined."""
        self.left = True
        with contextlib.suppress(OSError):
            (self.directory / f"left-{self.rank}").touch()
            os.unlink(self.directory / f"rank-{self.rank}")
        if not any(self.directory.glob("rank-*")):
            shutil.rmtree(self.directory, ignore_errors=True)

    def leave(self) -> None:
        """Say so to the peers; the last one to leave removes the directory."""
        if self.left:
            return
        self.left = True
        with contextlib.suppress(OSError):
            (self.directory / f"left-{self.rank}").touch()
        if all((self.directory / f"left-{r}").exists() for r in range(self.nranks)):
            shutil.rmtree(self.directory, ignore_errors=True)

