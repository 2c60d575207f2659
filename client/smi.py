"""xpu-smi: an nvidia-smi-style listing of an xpu-server's devices.

    xpu-smi [--server tcp://host:port | --pool ray://HEAD:PORT] [--json]

Opens a session of its own (as any client does), reads the device inventory and asks the server
for each device's status: memory used device-wide, utilisation, temperature, power, and the
server processes (one worker per client session) holding memory on it. With --pool: every
server of a Ray pool, its devices, who holds each, and the queue of leases waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from xpuremote.protocol.calls import CALLS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.nvml import uuid_text

from .connection import Connection
from .driver import DEFAULT_SERVER, named_servers

MIB = 1 << 20


def device_status(conn: Connection, index: int) -> dict[str, Any]:
    status, outs, _ = conn.call(CALLS["xpuDeviceStatus"], [index, 1], None)
    if status:
        raise CudaError(status, f"device {index} status")
    return outs[0]


def snapshot(address: str, timeout_s: float = 10.0, first: int = 0) -> dict[str, Any]:
    """Everything xpu-smi shows of one server, as plain data; its devices numbered from `first` (where an
    XPU_SERVER list puts them in the program's one list)."""
    conn = Connection(address, timeout_s)
    try:
        inv = conn.inventory
        devices = []
        for i, d in enumerate(inv["devices"]):
            devices.append({"index": first + i, "name": d["name"], "uuid": uuid_text(bytes(d["uuid"])),
                            "compute_capability": f"{d['sm'] // 10}.{d['sm'] % 10}",
                            "pci": "{:08X}:{:02X}:{:02X}.0".format(*d["pci"]), **device_status(conn, i)})
        return {"server": address, "backend": inv.get("backend"), "driver_version": inv["driver_version"],
                "devices": devices}
    finally:
        conn.close()


def _value(v: Any, unit: str) -> str:
    return "N/A" if v is None else f"{v}{unit}"


def render(snap: dict[str, Any]) -> str:
    v = snap["driver_version"]
    lines = [f"xpu-smi  server {snap['server']}  backend {snap['backend']}  CUDA driver {v // 1000}.{v % 1000 // 10}"]
    header = f"{'GPU':>3}  {'Name':<34} {'Memory used / total':>22}  {'Util':>5}  {'Temp':>5}  {'Power':>7}  {'CC':>4}"
    rule = "-" * len(header)
    lines += [rule, header, rule]
    for d in snap["devices"]:
        memory = f"{d['memory_used'] // MIB}MiB / {d['memory_total'] // MIB}MiB"
        power = None if d.get("power_mw") is None else d["power_mw"] // 1000
        util, temp = _value(d.get("utilization_gpu"), "%"), _value(d.get("temperature_c"), "C")
        lines.append(f"{d['index']:>3}  {d['name'][:34]:<34} {memory:>22}  {util:>5}  {temp:>5}"
                     f"  {_value(power, 'W'):>7}  {d['compute_capability']:>4}")
    lines += [rule, "Processes (server side: one worker per client session)", f"{'GPU':>3}  {'PID':>8}  {'Memory':>12}"]
    procs = [(d["index"], pid, used) for d in snap["devices"] for pid, used in d.get("processes", [])]
    lines += [f"{gpu:>3}  {pid:>8}  {used // MIB:>9}MiB" for gpu, pid, used in procs] or ["  no processes"]
    return "\n".join(lines)


def render_pool(snap: dict[str, Any]) -> str:
    queue = snap["queue"]
    lines = [f"xpu-smi  pool {snap['pool']}: {len(snap['servers'])} servers, {snap['gpus']} GPUs, "
             f"{snap['leased']} leased, {len(queue)} waiting"]
    for server in snap["servers"]:
        lines += ["", f"{server['endpoint']}  backend {server['backend']}  node {server['node_id'][:12]}"
                      f"  CURVE {'on' if server['public_key'] else 'off'}"]
        for d in server["devices"]:
            who = d["holder"]
            held = "free" if who is None else f"{who['user']}@{who['host']} pid {who['pid']}, {who['held_s']:g} s"
            lines.append(f"  {d['index']:>3}  {d['name'][:34]:<34} {d['total_mem'] // MIB:>7}MiB  {held}")
    lines += ["", "Queue"]
    lines += [f"  {i}. {g['user']}@{g['host']} pid {g['pid']}: {g['gpus']} GPU(s), waiting {g['waiting_s']:g} s"
              for i, g in enumerate(queue, 1)] or ["  empty"]
    return "\n".join(lines)


def pool_snapshot(address: str) -> dict[str, Any]:
    from . import pool

    pool.connect(address)
    try:
        return {"pool": address, **pool.snapshot()}
    finally:
        pool.disconnect()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xpu-smi", description="List an xpu-server's devices.")
    parser.add_argument("--server", default=os.environ.get("XPU_SERVER", DEFAULT_SERVER),
                        help="tcp://host:port of the xpu-server, or several separated by commas, their devices "
                        "numbered as one list (default: $XPU_SERVER, else %(default)s)")
    parser.add_argument("--pool", default=os.environ.get("XPU_POOL"),
                        help="list a Ray pool instead: ray://HEAD:PORT, HEAD:PORT or auto (default: $XPU_POOL)")
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    parser.add_argument("--timeout", type=float, default=float(os.environ.get("XPU_CONNECT_TIMEOUT_S", "10")),
                        help="seconds to wait for the server")
    args = parser.parse_args(argv)
    if args.pool:
        from .pool import PoolError

        try:
            snap = pool_snapshot(args.pool)
        except PoolError as exc:
            print(f"xpu-smi: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(snap, indent=1) if args.json else render_pool(snap))
        return 0
    snaps: list[dict[str, Any]] = []
    try:
        for address in named_servers(args.server):
            snaps.append(snapshot(address, args.timeout, sum(len(s["devices"]) for s in snaps)))
    except CudaError as exc:
        print(f"xpu-smi: {exc.detail}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(snaps[0] if len(snaps) == 1 else {"servers": snaps}, indent=1))
    else:
        print("\n\n".join(render(snap) for snap in snaps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
