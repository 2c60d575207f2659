"""CURVE keys for the server: key generation, the server's own key pair, and who may connect.

`xpu-server keygen` writes ZeroMQ certificate files: NAME.key (the public key, to hand out)
and NAME.key_secret (both keys, kept private, mode 0600). The server takes its secret file
(`--key`) and a directory of the public files of the clients it admits (`--allowed-keys`).
Every socket the server listens on (the daemon's and each worker's) is a CURVE server, and a
ZAP handler in the same process decides who passes: the daemon admits any listed key, a
worker only the key of the client its session was started for.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from . import metrics

log = logging.getLogger("xpuremote.server")
ZAP_DOMAIN = "xpuremote"


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    secret_path: str  # workers read the key from here: a secret never goes on a command line


def keygen(directory: str, name: str) -> tuple[Path, Path]:
    """Write NAME.key and NAME.key_secret into `directory`; refuses to overwrite a key."""
    if not re.fullmatch(r"\w[\w.-]*", name):  # no path: "../x" or "/etc/x" would write outside `directory`
        raise ValueError(f"--name {name!r}: a plain file name stem (letters, digits, '_', '-', '.') is needed")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    for path in (public, secret):
        if path.exists():
            raise FileExistsError(f"{path} exists; remove it first to make a new key")
    old = os.umask(0o077)  # the secret file is never readable by others, not even for a moment
    try:
        zmq.auth.create_certificates(str(folder), name)
    finally:
        os.umask(old)
    public.chmod(0o644)
    return public, secret


def load_server_keys(path: str) -> ServerKeys:
    public, secret = zmq.auth.load_certificate(path)
    if not secret:
        raise ValueError(f"{path} holds no secret key: give the server its NAME.key_secret file")
    for which, key in (("public", public), ("secret", secret)):
        if not _is_z85_key(key):
            raise ValueError(f"the key file {path} is bad: its {which} key is not a 40-character Z85 CURVE key")
    if zmq.curve_public(secret) != public:
        raise ValueError(f"the key file {path} is bad: its public key is not the secret key's")
    return ServerKeys(public, secret, os.path.abspath(path))


def _is_z85_key(key: bytes) -> bool:
    try:
        return len(key) == 40 and len(z85.decode(key)) == 32
    except (ValueError, KeyError):  # KeyError: a character outside Z85's alphabet
        return False


def make_server(sock: zmq.Socket, keys: ServerKeys) -> None:
    """Make `sock` a CURVE server (before it binds)."""
    sock.curve_server = True
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    sock.zap_domain = ZAP_DOMAIN.encode()


class AllowedKeys:
    """The public keys of a directory, read again when the directory changes: adding or
    removing a client's file takes effect for its next connection, without a restart."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.keys: set[bytes] = set()
        self.stamp: tuple[float, int] | None = None
        self.refresh()
        if not self.keys:
            log.warning("no client keys in %s: every client will be refused", directory)

    def refresh(self) -> None:
        entries = sorted(Path(self.directory).glob("*.key"))
        stamp = (os.stat(self.directory).st_mtime, len(entries))
        if stamp == self.stamp:
            return
        keys = set()
        for entry in entries:
            try:
                keys.add(zmq.auth.load_certificate(str(entry))[0])  # z85, as ZAP gives it
            except (OSError, ValueError) as exc:
                log.warning("ignoring %s: %s", entry, exc)
        self.keys, self.stamp = keys, stamp

    def __contains__(self, key: bytes) -> bool:
        self.refresh()
        return key in self.keys


class _Authenticator(ThreadAuthenticator):
    """pyzmq's ZAP handler, keeping the address of the request it is deciding: ZAP gives it, the key
    callback does not, and a refusal is said once per address (a peer can make keys at will)."""

    address = ""

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self.address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)


class _Provider:
    """ZAP callback: True admits a client key (z85 bytes); a refusal is said with the key and address, once
    a minute per address (metrics.Repeats)."""

    def __init__(self, admits: Callable[[bytes], bool], where: str, handler: _Authenticator,
                 repeats: metrics.Repeats) -> None:
        self.admits, self.where, self.handler, self.repeats = admits, where, handler, repeats

    def callback(self, domain: str, key: bytes) -> bool:
        if self.admits(key):
            return True
        address = self.handler.address or "an unknown address"
        self.repeats.say("handshake", address, f"{self.where} refused a client from {address}: its key "
                         f"{key.decode()} is not allowed (CURVE authentication failed)")
        return False


def start_authenticator(ctx: zmq.Context, admits: Callable[[bytes], bool], where: str,
                        repeats: metrics.Repeats) -> ThreadAuthenticator:
    """A ZAP handler for every CURVE server socket of `ctx`."""
    handler = _Authenticator(ctx, log=logging.getLogger("xpuremote.zap"))
    handler.start()
    handler.configure_curve_callback(ZAP_DOMAIN, credentials_provider=_Provider(admits, where, handler, repeats))
    return handler


def peer_key(frame: zmq.Frame) -> str:
    """The z85 public key of the client that sent `frame` ("" without CURVE)."""
    try:
        return frame.get("User-Id") or ""
    except zmq.ZMQError:
        return ""


def peer_address(frame: zmq.Frame) -> str:
    """Where `frame` came from, for per-peer limits and logs: a TCP peer's IP address; for an ipc
    peer (ZeroMQ says `localhost:UID:GID:PID`), its user rather than its process."""
    try:
        address = frame.get("Peer-Address") or ""
    except zmq.ZMQError:
        address = ""
    parts = address.split(":")
    if len(parts) == 4 and parts[0] == "localhost" and all(p.isdigit() for p in parts[1:]):
        return f"local user {parts[1]}"
    return address or "an unknown peer"


HANDSHAKE_FAILURES = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                      | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


def describe_handshake_failure(event: dict) -> str:
    kind = {zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the client's key is not allowed",
            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "security mechanism mismatch or a malformed handshake",
            }.get(event["event"], "the handshake could not be completed")
    return f"a connection failed the handshake ({kind}, code {event['value']:#x})"


def is_loopback(listen: str) -> bool:
    host = listen.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return listen.startswith("ipc://") or host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
