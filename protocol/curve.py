"""CURVE as the connecting side has it: its keys, and a clear reason when a server refuses the connection. The
client connects so, and so does `xpu-server status`, which asks a running daemon.

XPU_CLIENT_KEY names the client's secret key file (NAME.key_secret from `xpu-server keygen`),
XPU_SERVER_KEY the server's public key file (its NAME.key). Both set: every socket to the
server is encrypted and authenticated; neither: plain TCP. ZeroMQ keeps a refused connection
quiet (it retries forever), so the hello watches the handshake events and fails at once.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import zmq
import zmq.auth
import zmq.utils.monitor

from xpuremote.protocol import errors
from xpuremote.protocol.errors import CudaError

FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
WATCHED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
for _event in FAILED:
    WATCHED |= _event
KEY_FIX = ("give this client a key the server allows: XPU_CLIENT_KEY=NAME.key_secret (xpu-run --key) whose NAME.key "
           "is in the server's --allowed-keys, and XPU_SERVER_KEY=the server's public key file (xpu-run --server-key)")


@dataclass(frozen=True)
class ClientKeys:
    public: bytes
    secret: bytes
    server: bytes


def client_keys(position: int = 0) -> ClientKeys | None:
    """The keys named by the environment, or None for plain TCP; for the server at `position` of those XPU_SERVER
    names, whose public key is XPU_SERVER_KEY's entry there where it names one per server (separated by commas)."""
    own, server = os.environ.get("XPU_CLIENT_KEY"), os.environ.get("XPU_SERVER_KEY")
    if not own and not server:
        return None
    try:
        return _load(own, _server_key(server, position))
    except (OSError, ValueError) as exc:
        raise CudaError(errors.INVALID_VALUE, f"cannot use the CURVE keys: {exc}") from None


def _server_key(keys: str | None, position: int) -> str | None:
    named = [k.strip() for k in (keys or "").split(",")]
    if len(named) == 1:
        return keys  # one key for every server
    if position >= len(named):
        raise ValueError(f"XPU_SERVER_KEY names {len(named)} keys, none for server {position + 1} of XPU_SERVER")
    return named[position]


def _load(own: str | None, server: str | None) -> ClientKeys:
    if not own or not server:
        raise ValueError("set both XPU_CLIENT_KEY (this client's NAME.key_secret) and XPU_SERVER_KEY "
                         "(the server's public NAME.key), or neither")
    public, secret = zmq.auth.load_certificate(own)
    if not secret:
        raise ValueError(f"XPU_CLIENT_KEY={own} holds no secret key (give the NAME.key_secret file)")
    server_public, _ = zmq.auth.load_certificate(server)
    return ClientKeys(public, secret, server_public)


def secure(sock: zmq.Socket, keys: ClientKeys | None) -> None:
    """Make `sock` a CURVE client (before it connects)."""
    if keys is not None:
        sock.curve_secretkey = keys.secret
        sock.curve_publickey = keys.public
        sock.curve_serverkey = keys.server


def wait_for_answer(sock: zmq.Socket, monitor: zmq.Socket, timeout_s: float, curve: bool) -> str | None:
    """Wait until `sock` has something to read: None then, else why it never will."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    remaining_ms = int(timeout_s * 1000)
    while remaining_ms > 0:
        start = time.monotonic()
        ready = dict(poller.poll(remaining_ms))
        if sock in ready:
            return None
        if monitor in ready:
            event = zmq.utils.monitor.recv_monitor_message(monitor)["event"]
            if event in FAILED or (event == zmq.EVENT_DISCONNECTED and curve):
                return refusal(event, curve)
        remaining_ms -= int((time.monotonic() - start) * 1000) or 1
    return "timeout"


def refusal(event: int, curve: bool) -> str:
    """Why the handshake failed, and the fix, for a client with CURVE keys (`curve`) or without. xpu-server
    speaks CURVE or plain TCP: a client without keys that fails a handshake met a CURVE server."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"the server does not accept this client's key; fix: {KEY_FIX}"
    if not curve:
        return f"the server requires CURVE keys and this client has none; fix: {KEY_FIX}"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return ("the server speaks plain TCP and this client uses CURVE keys; fix: unset XPU_CLIENT_KEY and "
                "XPU_SERVER_KEY (xpu-run --key, --server-key), or start that server with --key")
    if event == zmq.EVENT_DISCONNECTED:  # a CURVE server that cannot open our hello (another server key) hangs up
        return ("the server closed the connection during the CURVE handshake, so XPU_SERVER_KEY is not its key; "
                "fix: set XPU_SERVER_KEY (xpu-run --server-key) to that server's public key file")
    return ("the CURVE handshake failed: the server does not take this client's key, or XPU_SERVER_KEY is not its "
            f"public key; fix: {KEY_FIX}")
