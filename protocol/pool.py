"""The GPU pool's contract: what an xpu-server publishes in a Ray cluster and how a lease finds it.

Ray does the membership, the GPU accounting, the queue and the failure detection; xpuremote
only names things so the two sides meet:

- Each `xpu-server --pool` brings a Ray node of its own (fate-shared with the server), whose
  `GPU` resource is the server's devices and which carries the `xpuremote` resource, and one
  actor on it, `xpu-server:<node id>`, that publishes the server's endpoint, devices and CURVE
  public key (`ServerRecord`).
- A lease is a placement group of one bundle {GPU: n, xpuremote: 1}, named after its holder, owned
  by the `xpu-run` that asked (so Ray removes it when that process dies), and an actor in it,
  `xpu-lease:<group id>`, whose GPU ids are the server's device indices to use (`Lease`).
Ray is never in the data path: the client talks to the server it was given directly.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

NAMESPACE = "xpuremote"
RESOURCE = "xpuremote"  # on every server's node; a lease's bundle asks for one unit of it
RESOURCE_UNITS = 10_000  # more than a server ever has sessions
SERVER_ACTOR = "xpu-server:"  # + the node id
LEASE_ACTOR = "xpu-lease:"  # + the placement group's id
LEASE_GROUP = "xpu-lease"  # placement group names: "xpu-lease|user|host|pid|gpus|time"
SERVER_LABEL = "xpuremote.server"  # a node label: which server process brought the node
PR_SET_PDEATHSIG = 1


def ray_address(pool: str) -> str:
    """What `ray.init` takes for a pool address: `ray://HEAD:PORT` (Ray Client, port 10001 unless
    the head says otherwise), `HEAD:PORT` (the head's GCS port, from a machine of the cluster)
    or `auto` (RAY_ADDRESS, else the cluster started on this machine)."""
    if pool == "auto":
        return pool
    rest = pool.removeprefix("ray://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or "/" in rest:
        raise ValueError(f"pool address {pool!r}: give ray://HEAD:PORT, HEAD:PORT or auto")
    return pool


def lease_group_name(gpus: int, holder: dict[str, Any]) -> str:
    fields = [str(holder.get(k, "?")).replace("|", "/")[:64] for k in ("user", "host", "pid")]
    return "|".join([LEASE_GROUP, *fields, str(gpus), f"{time.time():.3f}"])


def parse_lease_group_name(name: str) -> dict[str, Any] | None:
    """The holder a lease group's name records; None for a group that is not a lease."""
    parts = name.split("|")
    if len(parts) != 6 or parts[0] != LEASE_GROUP:
        return None
    try:
        return {"user": parts[1], "host": parts[2], "pid": parts[3], "gpus": int(parts[4]), "asked": float(parts[5])}
    except ValueError:
        return None


def quiet_grpc() -> None:
    """Ray's gRPC warns on every fork of a process that uses it; our forks exec at once."""
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


_prctl = ctypes.CDLL(None).prctl  # looked up before any fork: a forked child of threads must not dlopen


def die_with_parent() -> None:
    """A `preexec_fn`: the child is killed when its parent dies, even by SIGKILL (Linux), so a
    program or a Ray node never outlives the process that answers for it."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class ServerRecord:
    """The actor a server publishes itself with: its endpoint, devices, backend and public key."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def describe(self) -> dict[str, Any]:
        return self.record


class Lease:
    """The actor that holds a lease's GPUs: Ray gives it the devices, and kills it (freeing them)
    when its owner, the xpu-run that asked, ends or dies."""

    def __init__(self, holder: dict[str, Any]) -> None:
        self.holder = {**holder, "since": time.time()}

    def describe(self) -> dict[str, Any]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        return {**self.holder, "node_id": node, "devices": sorted(int(g) for g in ray.get_gpu_ids())}
