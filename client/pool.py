"""The client's side of the Ray pool: lease GPUs for `xpu-run --pool`, list the pool for `xpu-smi --pool`.

A lease is a placement group {GPU: n, xpuremote: 1} owned by this process's Ray connection,
and an actor in it that holds the GPUs (protocol/pool.py). Ray queues the group while no server
has n free devices, and removes it when this process releases it, ends, or dies (after Ray
Client's reconnect grace, XPU_POOL_GRACE_S, which this process sets). A spread lease (--spread)
is n bundles of one GPU each, packed by Ray onto as few servers as it can, and an actor in each.
"""

from __future__ import annotations

import getpass
import itertools
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import pool

BUSY_RETRIES = 4
DEFAULT_GRACE_S = 5  # a lost client's lease outlives it by this much (a blip in the network is forgiven)
CALL_TIMEOUT_S = 30.0


class PoolError(RuntimeError):
    """What went wrong, said so that the user knows what to do."""


@dataclass
class Held:
    """Devices of one server that a lease holds."""

    endpoint: str
    devices: list[int]  # the server's ordinals
    public_key: str
    count: int  # the devices the server has: where the next server's begin in the program's one list


@dataclass
class Grant:
    """A lease: the servers to talk to (one, unless spread) and which of their devices are ours."""

    held: list[Held]
    group: Any = field(repr=False)
    holders: list[Any] = field(repr=False)  # the actors holding the GPUs
    released: bool = False

    @property
    def endpoint(self) -> str:
        """XPU_SERVER for the program: the servers, in the order of its device list."""
        return ",".join(h.endpoint for h in self.held)

    def visible_devices(self) -> str:
        """CUDA_VISIBLE_DEVICES over the one list of every named server's devices."""
        offsets = itertools.accumulate((h.count for h in self.held), initial=0)
        return ",".join(str(first + d) for h, first in zip(self.held, offsets) for d in h.devices)

    def server_keys(self) -> list[str]:
        """The servers' public keys, in order: none if they have none; refused if only some have."""
        keys = [h.public_key for h in self.held]
        if any(keys) and not all(keys):
            raise PoolError("the lease's servers mix CURVE keys and plain TCP, which one program cannot use; "
                            "ask for fewer GPUs, or key every server")
        return keys if any(keys) else []


def connect(address: str, busy_retries: int = BUSY_RETRIES) -> None:
    """Connect to the pool's cluster (ray://HEAD:PORT through Ray Client, HEAD:PORT or auto from
    a machine of the cluster). Ray Client's head starts a server process per client and gives up
    on one that takes 30 s to answer, which many clients arriving at once on a small head do:
    that refusal is tried again, after a random wait, `busy_retries` times."""
    try:
        import ray
        from ray import cloudpickle
    except ImportError:
        raise PoolError("the pool needs Ray: pip install 'xpuremote[pool]' (the cluster's Ray version)") from None
    pool.quiet_grpc()
    os.environ.setdefault("RAY_CLIENT_RECONNECT_GRACE_PERIOD", os.environ.get("XPU_POOL_GRACE_S", str(DEFAULT_GRACE_S)))
    cloudpickle.register_pickle_by_value(pool)  # the actors travel by value: the head needs no xpuremote
    for attempt in range(busy_retries + 1):
        try:
            ray.init(address=pool.ray_address(address), namespace=pool.NAMESPACE, logging_level=logging.ERROR,
                     log_to_driver=False)
            return
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
            if "Initialization failure from server" not in str(exc) or attempt == busy_retries:
                raise PoolError(f"cannot reach the pool at {address}: {exc}") from None
            time.sleep(random.uniform(1, 5) * (attempt + 1))


def disconnect() -> None:
    import ray

    ray.shutdown()


def server(node_id: str) -> dict[str, Any] | None:
    """The server of a node, as it published itself; None if it is gone."""
    import ray

    try:
        return ray.get(ray.get_actor(pool.SERVER_ACTOR + node_id).describe.remote(), timeout=CALL_TIMEOUT_S)
    except (ray.exceptions.RayError, ValueError):  # no such actor, or it died as it was asked
        return None


def servers() -> dict[str, dict[str, Any]]:
    """The live servers of the pool by node id."""
    import ray

    nodes = [name.removeprefix(pool.SERVER_ACTOR) for name in ray.util.list_named_actors()
             if name.startswith(pool.SERVER_ACTOR)]
    return {node: record for node in nodes if (record := server(node)) is not None}


def holder() -> dict[str, Any]:
    return {"user": getpass.getuser(), "host": socket.gethostname(), "pid": os.getpid()}


def lease(gpus: int, timeout_s: float, say: Callable[[str], None], spread: bool = False) -> Grant:
    """Wait (at most `timeout_s`) for `gpus` devices of one server, or with `spread` of as few servers as hold
    them, and hold them."""
    from ray.util.placement_group import placement_group

    known = servers()
    largest = max((len(r["devices"]) for r in known.values()), default=0)
    total = sum(len(r["devices"]) for r in known.values())
    if spread and total < gpus:
        raise PoolError(f"the pool has {total} devices in all ({len(known)} servers), not {gpus}")
    if not spread and largest < gpus:
        raise PoolError(f"no server in the pool has {gpus} devices ({len(known)} servers, the largest has {largest}); "
                        "--spread takes them from several servers")
    # spread: a GPU a bundle, each with a share of a server's marker (as many bundles a server as it holds GPUs)
    per_bundle, bundles, marker = (1, gpus, 0.001) if spread else (gpus, 1, 1)
    group = placement_group([{"GPU": per_bundle, pool.RESOURCE: marker}] * bundles, strategy="PACK",
                            name=pool.lease_group_name(gpus, holder()))
    granted(group, gpus, known, timeout_s, say)
    return hold(group, per_bundle, bundles)


def granted(group: Any, gpus: int, known: dict[str, dict[str, Any]], timeout_s: float,
            say: Callable[[str], None]) -> None:
    """Wait for Ray to place the group, saying so if it queues; removed if it is not placed in time."""
    from ray.util.placement_group import remove_placement_group

    if not group.wait(1):
        say(f"waiting for {gpus} free GPU(s) in the pool ({queued() - 1} requests ahead; at most {timeout_s:g} s)")
        if not group.wait(max(0.0, timeout_s - 1)):
            remove_placement_group(group)
            raise PoolError(f"{gpus} GPU(s) were not free within {timeout_s:g} s ({len(known)} servers, "
                            f"{sum(len(r['devices']) for r in known.values())} GPUs); xpu-smi --pool shows who holds "
                            "them, --lease-timeout waits longer")


def hold(group: Any, per_bundle: int, bundles: int) -> Grant:
    """An actor in each bundle of a placed group, holding its GPUs; the grant, by server in the order the bundles
    came (removed, with its group, if a holder does not start or its server has left)."""
    import ray
    from ray.util.placement_group import remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    actors = [ray.remote(pool.Lease).options(
        name=pool.LEASE_ACTOR + group.id.hex() + (f".{i}" if i else ""), num_cpus=0, num_gpus=per_bundle,
        max_restarts=0, scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote(holder())
        for i in range(bundles)]
    try:
        held: dict[str, Held] = {}
        for where in ray.get([a.describe.remote() for a in actors], timeout=CALL_TIMEOUT_S):
            if where["node_id"] not in held:
                record = server(where["node_id"])
                if record is None:
                    raise PoolError(f"the server of node {where['node_id']} left the pool as it was leased; try again")
                held[where["node_id"]] = Held(record["endpoint"], [], record["public_key"], len(record["devices"]))
            held[where["node_id"]].devices += where["devices"]
    except ray.exceptions.RayError as exc:
        remove_placement_group(group)
        raise PoolError(f"the lease was granted but its holder did not start: {exc}") from None
    except BaseException:
        remove_placement_group(group)
        raise
    for h in held.values():
        h.devices.sort()
    return Grant(list(held.values()), group, actors)


def release(grant: Grant) -> None:
    from ray.util.placement_group import remove_placement_group

    if not grant.released:
        grant.released = True
        remove_placement_group(grant.group)  # and with it the actor holding the GPUs


def watch(grant: Grant, on_lost: Callable[[], None], period_s: float = 1.0) -> threading.Event:
    """Call `on_lost` once if the lease's actor dies (its server's node left the pool; Ray would
    otherwise move the group to another server, for a program that is not there); set the
    returned event to stop watching."""
    import ray

    done = threading.Event()

    def run() -> None:
        while not done.wait(period_s):
            try:
                ray.get([h.describe.remote() for h in grant.holders], timeout=CALL_TIMEOUT_S)
            except ray.exceptions.RayActorError:
                if not done.is_set():
                    on_lost()
                return
            except (ray.exceptions.RayError, ConnectionError):  # the cluster is slow or unreachable: ask again
                continue

    threading.Thread(target=run, name="xpu-lease-watch", daemon=True).start()
    return done


def lease_groups() -> list[dict[str, Any]]:
    """The pool's lease groups, each with its holder (as its name records it) and state."""
    from ray.util.placement_group import placement_group_table

    groups = []
    for group_id, row in placement_group_table().items():
        who = pool.parse_lease_group_name(row.get("name", ""))
        if who is not None and row["state"] != "REMOVED":
            groups.append({**who, "group": group_id, "state": row["state"]})
    return sorted(groups, key=lambda g: g["asked"])


def queued() -> int:
    return sum(g["state"] != "CREATED" for g in lease_groups())


def snapshot() -> dict[str, Any]:
    """Every server with its devices and who holds each, and the queue: what xpu-smi --pool shows."""
    import ray

    known = servers()
    holders: dict[tuple[str, int], dict[str, Any]] = {}
    queue = []
    now = time.time()
    actors = ray.util.list_named_actors()
    for g in lease_groups():
        if g["state"] != "CREATED":
            queue.append({**g, "waiting_s": round(now - g["asked"], 1)})
            continue
        mine = pool.LEASE_ACTOR + g["group"]  # and, for a spread lease, mine.1, mine.2...
        for name in (a for a in actors if a == mine or a.startswith(mine + ".")):
            try:
                held = ray.get(ray.get_actor(name).describe.remote(), timeout=CALL_TIMEOUT_S)
            except (ray.exceptions.RayError, ValueError):  # granted, its holder actor not placed yet (or gone)
                continue
            for device in held["devices"]:
                holders[(held["node_id"], device)] = {k: held[k] for k in ("user", "host", "pid")} | {
                    "held_s": round(now - held["since"], 1)}
    listing = []
    for node_id, record in sorted(known.items(), key=lambda kv: kv[1]["endpoint"]):
        devices = [{**d, "holder": holders.get((node_id, d["index"]))} for d in record["devices"]]
        listing.append({**record, "devices": devices})
    return {"servers": listing, "queue": queue,
            "gpus": sum(len(s["devices"]) for s in listing), "leased": len(holders)}
