"""What the server says about itself: session counters, structured log lines, status, Prometheus.

Workers report their counters to the daemon as `stats {json}` lines on their stdout (the pipe
the daemon already reads their endpoint from): once a second while they change, and once
more as they end. The daemon serves them as the `status` op (`xpu-server status`) and, with
`--metrics-port`, as Prometheus text over plain HTTP: on loopback unless `--metrics-bind` says
otherwise, and with `--metrics-token FILE` only to requests that bear that token.

The daemon's and the workers' log is one record a line, whatever a peer puts in what it sends
(`escape`, `kv`, `OneLineFormatter`), and a refusal a peer repeats is said once a minute per
source, with a count (`Repeats`).
"""

from __future__ import annotations

import hmac
import json
import logging
import re
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("xpuremote.server")
COUNTERS = ("calls", "errors", "memory", "peak")


# ---- workers -> daemon ------------------------------------------------------------------------
def stats_line(calls: int, errors: int, memory: int, peak: int) -> str:
    return "stats " + json.dumps({"calls": calls, "errors": errors, "memory": memory, "peak": peak})


def parse_stats(line: str) -> dict[str, int] | None:
    if not line.startswith("stats "):
        return None
    try:
        data = json.loads(line[6:])
    except ValueError:
        return None
    return {k: int(data.get(k, 0)) for k in COUNTERS} if isinstance(data, dict) else None


# ---- log lines ---------------------------------------------------------------------------------
# A peer's words reach the log: a hello's user, host and pid, an error that names its input. A line
# break in them would start a line of the peer's choosing, which log-based accounting and alerting
# would read as the server's. So what Python's str.isprintable() calls unprintable is escaped wherever
# it comes from: the C0 controls (newline, CR, tab, NUL, ...), DEL, the C1 controls, Unicode's line and
# paragraph separators, format characters (bidi overrides, zero-width spaces) and unassigned code
# points. Printable non-ASCII (a user named José) stays as it is: the log is UTF-8, and no line-based
# parser splits on a letter.
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNESCAPES = {"n": "\n", "r": "\r", "t": "\t"}
_ESCAPED = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8}|.)")
_FIELD = re.compile(r' (\w+)=(?:"((?:[^"\\]|\\.)*)"|([^\s"]*))')


def escape(text: str, quoted: bool = False) -> str:
    """`text` with what is unprintable backslash-escaped (\\n, \\r, \\t, \\xNN, \\uNNNN, \\UNNNNNNNN); `quoted`
    (a value between double quotes) escapes '"' and '\\' too."""
    if text.isprintable() and not (quoted and ('"' in text or "\\" in text)):
        return text
    return "".join(_escape_char(c, quoted) for c in text)


def _escape_char(c: str, quoted: bool) -> str:
    if c.isprintable():
        return "\\" + c if quoted and c in '"\\' else c
    if c in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[c]
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def kv(event: str, **fields: Any) -> str:
    """One structured log line: `event key=value ...`. A value that is empty is `-`; one that holds a space,
    '=', '"', '\\' or anything unprintable is quoted and escaped (`escape`), so a line is always one line and
    `parse_kv` gives back each value as it was."""
    parts = [event]
    for key, value in fields.items():
        text = f"{value:.1f}" if isinstance(value, float) else str(value if value not in (None, "") else "-")
        bare = text.isprintable() and not any(c in text for c in ' ="\\')
        parts.append(f"{key}={text}" if bare else f'{key}="{escape(text, quoted=True)}"')
    return " ".join(parts)


def parse_kv(line: str) -> tuple[str, dict[str, str]]:
    """A `kv()` line read back: its event and its values, unescaped. ValueError if it is not one."""
    event, _, rest = line.partition(" ")
    rest, fields, at = " " + rest if rest else "", {}, 0
    while at < len(rest):
        match = _FIELD.match(rest, at)
        if match is None:
            raise ValueError(f"not a key=value line from {at}: {rest[at:at + 40]!r}")
        fields[match[1]] = _unescape(match[2]) if match[2] is not None else match[3]
        at = match.end()
    return event, fields


def _unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match[1]
        return chr(int(code[1:], 16)) if len(code) > 1 else _UNESCAPES.get(code, code)
    return _ESCAPED.sub(one, text)


class OneLineFormatter(logging.Formatter):
    """Every record on one line of its own: what is unprintable in a message is escaped (an error that quotes
    a peer's input cannot start a line), and a traceback's lines are indented and escaped, so that none of
    them reads as a record."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = escape(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + escape(line) for line in text.split("\n"))


def log_to_stderr(prefix: str, level: int) -> None:
    """The server's logging: records from `level` up on stderr, `PREFIX LEVEL message`, one line each."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(f"{prefix} %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])


# ---- refusals a peer repeats -----------------------------------------------------------------------
REPEAT_INTERVAL_S = 60.0  # a source's refusals of one kind are said at most once in this long
REPEAT_SOURCES = 1024  # sources remembered; the one quiet longest is forgotten first


@dataclass
class _Seen:
    said_at: float  # when a line was last said for the source (the clock's)
    said_wall: float  # the same, as wall-clock time (for "since HH:MM:SS")
    quiet: int = 0  # refusals not said since
    last: tuple[int, str, bool] = (logging.WARNING, "", False)  # the latest of them: level, line, structured


class Repeats:
    """Says a refusal once per source and kind each `interval_s`, and how many it kept quiet since: a peer that
    repeats one (a failed handshake, a hello over a limit, a bad message) costs the log a line a minute, not a
    line each. Each line is one refusal; "(37 more since 12:01:03)" (" more=37 since=12:01:03" on a kv line)
    counts those kept quiet before it, since the source's last line. `flush()` says the count of a source that
    went quiet. At most `max_sources` (kind, source) pairs are remembered, the one quiet longest forgotten
    first (its count said then). Thread-safe: refused CURVE keys are said on the ZAP handler's thread."""

    def __init__(self, logger: logging.Logger, interval_s: float = REPEAT_INTERVAL_S,
                 max_sources: int = REPEAT_SOURCES, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.log, self.interval_s, self.max_sources = logger, interval_s, max_sources
        self.clock, self.wall = clock, wall
        self.seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()  # least recently refused first
        self.lock = threading.Lock()
        self.flushed = clock()

    def say(self, kind: str, source: str, line: str, level: int = logging.WARNING, structured: bool = False) -> bool:
        """Log `line` (a refusal of `kind` from `source`) unless that source's last line of the kind is newer than
        the interval; whether it was said. `structured`: a kv() line, whose count goes in as fields."""
        said: list[tuple[int, str]] = []
        with self.lock:
            now, key = self.clock(), (kind, source)
            seen = self.seen.get(key)
            if seen is not None and now - seen.said_at < self.interval_s:
                seen.quiet += 1
                seen.last = (level, line, structured)
                self.seen.move_to_end(key)
                return False
            said.append((level, line + (_more(seen.quiet, seen.said_wall, structured) if seen else "")))
            self.seen[key] = _Seen(now, self.wall())
            self.seen.move_to_end(key)
            while len(self.seen) > self.max_sources:
                _, old = self.seen.popitem(last=False)
                if old.quiet:
                    said.append(_last_of(old))
        for level_, text in said:
            self.log.log(level_, text)
        return True

    def flush(self) -> None:
        """Say the count of each source whose interval has passed with refusals kept quiet (the last of them,
        and how many more); forget those that had none. Looks at most once a second."""
        said: list[tuple[int, str]] = []
        with self.lock:
            now = self.clock()
            if now - self.flushed < min(1.0, self.interval_s):
                return
            self.flushed = now
            for key, seen in list(self.seen.items()):
                if now - seen.said_at < self.interval_s:
                    continue
                if seen.quiet:
                    said.append(_last_of(seen))
                    self.seen[key] = _Seen(now, self.wall())
                else:
                    del self.seen[key]
        for level, text in said:
            self.log.log(level, text)


def _last_of(seen: _Seen) -> tuple[int, str]:
    """The last refusal kept quiet, said with the count of the others."""
    level, line, structured = seen.last
    return level, line + _more(seen.quiet - 1, seen.said_wall, structured)


def _more(count: int, since: float, structured: bool) -> str:
    if not count:
        return ""
    at = time.strftime("%H:%M:%S", time.localtime(since))
    return f" more={count} since={at}" if structured else f" ({count} more since {at})"


# ---- status --------------------------------------------------------------------------------------
def format_status(status: dict[str, Any]) -> str:
    """The `status` answer as tables for a terminal."""
    lines = [f"xpu-server on {status.get('listen')}: backend {status.get('backend')}, "
             f"CURVE {'on' if status.get('curve') else 'off'}, {len(status['sessions'])} sessions, "
             f"limits {status.get('limits')}", "", "DEVICE  NAME                                      MEMORY"]
    for d in status.get("devices", []):
        lines.append(f"{d['index']:<7} {d['name']:<41} {_mib(d['total_mem'])}")
    lines += ["", f"{'SESSION':<14} {'CLIENT':<32} {'KEY':<12} {'MEMORY':>10} {'PEAK':>10} "
                  f"{'CALLS':>9} {'ERRORS':>7} {'AGE':>8}"]
    for s in status["sessions"]:
        client = escape(f"{s['user']}@{s['host']}:{s['pid']}")  # a peer's words: no escape sequence reaches a terminal
        lines.append(f"{s['session']:<14} {client[:32]:<32} {(s['key'] or '-')[:12]:<12} {_mib(s['memory']):>10} "
                     f"{_mib(s['peak']):>10} {s['calls']:>9} {s['errors']:>7} {s['age_s']:>7.0f}s")
    return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


# ---- Prometheus ----------------------------------------------------------------------------------
SESSION_METRICS = (
    ("xpu_session_memory_bytes", "gauge", "memory", "Device memory a session holds"),
    ("xpu_session_peak_memory_bytes", "gauge", "peak", "Most device memory a session has held"),
    ("xpu_session_calls_total", "counter", "calls", "Driver calls a session has made (rate() for calls/s)"),
    ("xpu_session_errors_total", "counter", "errors", "Driver calls of a session that failed"),
)


def render(status: dict[str, Any], totals: dict[str, int]) -> str:
    """Prometheus text exposition format (version 0.0.4)."""
    out = ["# HELP xpu_sessions Sessions now open", "# TYPE xpu_sessions gauge",
           f"xpu_sessions {len(status['sessions'])}"]
    for name, value in totals.items():
        out += [f"# TYPE xpu_{name}_total counter", f"xpu_{name}_total {value}"]
    for metric, kind, key, text in SESSION_METRICS:
        out += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
        for s in status["sessions"]:
            labels = ",".join(f'{k}="{_label(s[k])}"' for k in ("session", "user", "host"))
            out.append(f"{metric}{{{labels}}} {s[key]}")
    out += ["# HELP xpu_device_memory_bytes Device memory of each device", "# TYPE xpu_device_memory_bytes gauge"]
    for d in status.get("devices", []):
        out.append(f'xpu_device_memory_bytes{{device="{d["index"]}",name="{_label(d["name"])}"}} {d["total_mem"]}')
    return "\n".join(out) + "\n"


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def read_token(path: str) -> str:
    """The bearer token in file `path` (its first line); an empty one is refused."""
    with open(path) as f:
        token = f.readline().strip()
    if not token:
        raise ValueError(f"--metrics-token {path}: the file holds no token")
    return token


# The metrics port is plain HTTP that anyone who reaches it may open: what it holds is bounded, so idle or
# slow connections cannot take the daemon's descriptors (each one it holds is one fewer for sessions).
METRICS_MAX_CONNECTIONS = 32  # served at a time; one more is closed at once
METRICS_TIMEOUT_S = 5.0  # a connection's whole request and answer, from its accept: then it is closed
METRICS_MAX_HEAD = 8192  # bytes of request line and headers
_ACCEPT_POLL_S = 0.5  # how often the accepting thread looks whether it should stop
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large"}


class MetricsServer:
    """GET /metrics over HTTP/1.1, one request a connection, on a thread of its own; `snapshot()` gives the text.

    Bounded against whoever reaches the port: at most METRICS_MAX_CONNECTIONS at a time (one over is closed
    as it is accepted), each closed METRICS_TIMEOUT_S after its accept whatever it has sent (a deadline for the
    whole request and answer, not for each read), its request line and headers at most METRICS_MAX_HEAD bytes.
    With a token (the sessions name users and hosts), the request line and the Authorization header are all
    that is read before it is checked: a request without it gets 401, and nothing else is looked at."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], str], token: str, repeats: Repeats) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=128)
        self.sock.settimeout(_ACCEPT_POLL_S)
        self.server_address = self.sock.getsockname()
        self.snapshot, self.repeats = snapshot, repeats
        self.expected = f"Bearer {token}".encode() if token else b""
        self.slots = threading.BoundedSemaphore(METRICS_MAX_CONNECTIONS)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.serve, name="xpu-metrics", daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, address = self.sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # out of descriptors (EMFILE): the connection waits in the backlog
                if self.stopped.is_set():
                    return
                self.repeats.say("metrics accept", "", f"metrics: cannot accept a connection: {exc}")
                self.stopped.wait(0.1)
                continue
            if not self.slots.acquire(blocking=False):
                conn.close()
                self.repeats.say("metrics full", address[0], f"metrics: closed a connection from {address[0]} at "
                                 f"once: {METRICS_MAX_CONNECTIONS} are open, the most served at a time")
                continue
            try:
                threading.Thread(target=self.handle, args=(conn, address[0]), name="xpu-metrics-request",
                                 daemon=True).start()
            except RuntimeError:  # no thread to be had
                conn.close()
                self.slots.release()

    def handle(self, conn: socket.socket, peer: str) -> None:
        """One connection: its request read and answered by the deadline, then closed."""
        deadline = time.monotonic() + METRICS_TIMEOUT_S
        try:
            head = _read_head(conn, deadline)
            status, body, extra = self.respond(head, peer) if head is not None else (431, b"", "")
            _send(conn, deadline, status, body, extra)
        except TimeoutError:
            self.repeats.say("metrics slow", peer, f"metrics: closed a connection from {peer} that sent no whole "
                             f"request within {METRICS_TIMEOUT_S:g} s", logging.INFO)
        except OSError:
            pass  # it went away
        finally:
            conn.close()
            self.slots.release()

    def respond(self, head: bytes, peer: str) -> tuple[int, bytes, str]:
        """(status, body, extra headers) for a request's head; the token is checked before anything else."""
        lines = head.split(b"\r\n")
        if self.expected and not hmac.compare_digest(_authorization(lines[1:]), self.expected):
            self.repeats.say("metrics token", peer, f"metrics: refused a request from {peer} without the bearer token")
            return 401, b"", 'WWW-Authenticate: Bearer realm="xpu-server"\r\n'
        words = lines[0].split()
        if len(words) != 3 or not words[2].startswith(b"HTTP/"):
            return 400, b"", ""
        if words[0] not in (b"GET", b"HEAD"):
            return 405, b"", "Allow: GET, HEAD\r\n"
        if words[1].split(b"?")[0] not in (b"/metrics", b"/"):
            return 404, b"", ""
        body = self.snapshot().encode()
        return 200, body if words[0] == b"GET" else b"", "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"

    def shutdown(self) -> None:
        self.stopped.set()
        self.thread.join(2 * _ACCEPT_POLL_S + 1)
        self.sock.close()


def _read_head(conn: socket.socket, deadline: float) -> bytes | None:
    """The request line and headers (without the blank line that ends them); None if they are longer than
    METRICS_MAX_HEAD. TimeoutError past the deadline, ConnectionError if the peer closes first."""
    head = bytearray()
    while (end := head.find(b"\r\n\r\n")) < 0:
        if len(head) > METRICS_MAX_HEAD:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        conn.settimeout(left)
        chunk = conn.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the request's end")
        head += chunk
    return bytes(head[:end]) if end <= METRICS_MAX_HEAD else None


def _authorization(header_lines: list[bytes]) -> bytes:
    """The first Authorization header's value (b"" if none)."""
    for line in header_lines:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"authorization":
            return value.strip()
    return b""


def _send(conn: socket.socket, deadline: float, status: int, body: bytes, extra: str) -> None:
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
            f"{extra}\r\n").encode()
    conn.settimeout(max(deadline - time.monotonic(), 0.1))  # the whole answer, by the same deadline
    conn.sendall(head + body)


def serve_metrics(host: str, port: int, snapshot: Callable[[], str], token: str = "",
                  repeats: Repeats | None = None) -> MetricsServer:
    """The metrics on http://HOST:PORT/metrics (MetricsServer); refusals said through `repeats`."""
    server = MetricsServer(host, port, snapshot, token, repeats or Repeats(log))
    log.info("metrics on http://%s:%d/metrics%s; at most %d connections at a time, each closed %g s after it opens",
             host if ":" not in host else f"[{host}]", server.server_address[1],
             " (bearer token required)" if token else "", METRICS_MAX_CONNECTIONS, METRICS_TIMEOUT_S)
    return server
