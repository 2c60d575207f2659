"""What the server says about itself: session counters, structured log lines, status, Prometheus.

Workers report their counters to the daemon as `stats {json}` lines on their stdout (the pipe
the daemon already reads their endpoint from): once a second while they change, and once
more as they end. The daemon serves them as the `status` op (`xpu-server status`) and, with
`--metrics-port`, as Prometheus text over plain HTTP: on loopback unless `--metrics-bind` says
otherwise, and with `--metrics-token FILE` only to requests that bear that token.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
def kv(event: str, **fields: Any) -> str:
    """One structured log line: `event key=value ...`, values with spaces quoted."""
    parts = [event]
    for key, value in fields.items():
        text = f"{value:.1f}" if isinstance(value, float) else str(value if value not in (None, "") else "-")
        plain = not any(c in text for c in ' ="')
        parts.append(f"{key}={text if plain else json.dumps(text)}")
    return " ".join(parts)


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
        client = f"{s['user']}@{s['host']}:{s['pid']}"
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


def serve_metrics(host: str, port: int, snapshot: Callable[[], str], token: str = "") -> ThreadingHTTPServer:
    """GET /metrics on a thread of its own; `snapshot()` gives the text. With a token, only a request
    that shows it (`Authorization: Bearer TOKEN`) gets them: the sessions name users and hosts."""
    expected = f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if token and not hmac.compare_digest(self.headers.get("Authorization", "").encode(), expected):
                log.warning("metrics: refused a request from %s without the bearer token", self.client_address[0])
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Bearer realm="xpu-server"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = snapshot().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # one line per scrape is noise
            pass

    server_class = _HTTPServer6 if ":" in host else ThreadingHTTPServer
    server = server_class((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="xpu-metrics", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics%s", host if ":" not in host else f"[{host}]", server.server_address[1],
             " (bearer token required)" if token else "")
    return server


class _HTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6
