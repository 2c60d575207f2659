"""Test helpers: a client session through the Python client library (no shim), a recording TCP
relay, CURVE keys for a test server, and questions to a running daemon."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from xpuremote.client.connection import Connection
from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.errors import CudaError
from xpuremote.server.daemon import ask_status

CTX = 0x7C00_0000_1000


class PyClient:
    """One session driven through `xpuremote.client.connection.Connection`, as the shim drives it,
    minus the C entry points: fast enough to run dozens at once in one test process."""

    def __init__(self, address: str, timeout_s: float = 10.0, batch_window_us: float = 50.0) -> None:
        self.conn = Connection(address, timeout_s, batch_window_us)
        self.conn.post(CALLS["cuCtxCreate_v2"], [CTX, 0, 0], None)

    def call(self, symbol: str, *args: Any) -> list[Any]:
        status, outs, deferred = self.conn.call(CALLS[symbol], list(args), CTX)
        if status:
            raise CudaError(status, symbol)
        if deferred:
            raise CudaError(deferred[0][1], f"earlier {deferred[0][0]}: {deferred[0][2]}")
        return outs

    def post(self, symbol: str, *args: Any, size: int = 0) -> None:
        self.conn.post(CALLS[symbol], list(args), CTX, size)

    def status_of(self, symbol: str, *args: Any) -> int:
        """The CUresult of a sync call (or of an async failure it reports)."""
        try:
            self.call(symbol, *args)
        except CudaError as exc:
            return exc.code
        return errors.SUCCESS

    def alloc(self, size: int) -> int:
        return int.from_bytes(self.call("cuMemAlloc_v2", 8, size)[0], "little")

    def write(self, ptr: int, data: bytes) -> None:
        self.call("cuMemcpyHtoD_v2", ptr, data, len(data))

    def read(self, ptr: int, size: int) -> bytes:
        return bytes(self.call("cuMemcpyDtoH_v2", size, ptr, size)[0])

    def mem_info(self) -> tuple[int, int]:
        free, total = self.call("cuMemGetInfo_v2", 8, 8)
        return int.from_bytes(free, "little"), int.from_bytes(total, "little")

    def close(self) -> None:
        self.conn.close()


class Relay:
    """A TCP relay on loopback in front of host:port that keeps every byte each way, per connection. `flip`
    (way, at): one bit of the byte at offset `at` of one way of its first connection is flipped (way 0: what the
    client sends, 1: what the server sends back)."""

    def __init__(self, host: str, port: int, flip: tuple[int, int] | None = None) -> None:
        self.upstream, self.flip = (host, port), flip
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections: list[tuple[bytearray, bytearray]] = []  # (client -> server, server -> client)
        threading.Thread(target=self._accept, daemon=True).start()

    @classmethod
    def to(cls, endpoint: str) -> Relay:
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        return cls(host, int(port))

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            ways = (bytearray(), bytearray())
            flip = self.flip if not self.connections else None
            self.connections.append(ways)
            for way, (src, dst) in enumerate(((client, server), (server, client))):
                at = flip[1] if flip and flip[0] == way else -1
                threading.Thread(target=_pump, args=(src, dst, ways[way], at), daemon=True).start()

    def captured(self) -> bytes:
        return b"".join(bytes(up) + bytes(down) for up, down in self.connections)

    def close(self) -> None:
        self.listener.close()


def _pump(src: socket.socket, dst: socket.socket, record: bytearray, at: int = -1) -> None:
    """Bytes from `src` to `dst`, kept in `record`; the one at offset `at` (if any) with its lowest bit flipped."""
    try:
        while data := bytearray(src.recv(1 << 16)):
            if len(record) <= at < len(record) + len(data):
                data[at - len(record)] ^= 1
            record += data
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def make_keys(folder: Path, *names: str) -> dict[str, Path]:
    """`xpu-server keygen` for each name: {name: its NAME.key_secret}, public files beside them."""
    out = {}
    for name in names:
        subprocess.run([sys.executable, "-m", "xpuremote.server.daemon", "keygen", str(folder), "--name", name],
                       check=True, capture_output=True, timeout=60)
        out[name] = folder / f"{name}.key_secret"
    return out


def sessions(address: str) -> list[dict[str, Any]]:
    return ask_status(address, 5.0)["sessions"]


def wait_for(predicate: Any, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def rss(pid: int) -> int:
    """Resident memory of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
