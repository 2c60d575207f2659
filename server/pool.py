"""An xpu-server's membership in a Ray pool (`xpu-server --pool`): a helper process of the daemon.

    python -m xpuremote.server.pool ADDRESS RECORD_JSON

It brings a Ray node of its own whose `GPU` resource is the server's devices, publishes the
server on it (protocol/pool.py), prints `joined NODE_ID`, and stays until it is terminated.
The node is fate-shared with this helper, and the helper with the daemon (both through
PDEATHSIG), so a server killed -9 takes its node with it: Ray's health checks then mark the node
dead, its leases are gone and new ones go elsewhere. Ray is never in the data path: the daemon
keeps serving its sessions whatever happens here.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from xpuremote.protocol import pool

log = logging.getLogger("xpuremote.server.pool")
JOIN_TIMEOUT_S = 120.0


def start_helper(address: str, record: dict[str, Any]) -> subprocess.Popen:
    """The helper, as the daemon starts it: it dies with the daemon."""
    cmd = [sys.executable, "-m", "xpuremote.server.pool", address, json.dumps(record)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, preexec_fn=pool.die_with_parent)


def start_local_head(port: int, client_port: int, log_path: Path, extra_env: dict[str, str] | None = None,
                     timeout_s: float = JOIN_TIMEOUT_S) -> subprocess.Popen:
    """A Ray head on this machine, for a pool on one machine (tests, benchmarks, trials): GCS on
    `port`, Ray Client on `client_port`, no GPUs, one CPU, and no gRPC fork handlers (docs/pool.md).
    It dies with the caller. Returns once it runs."""
    env = {**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false", **(extra_env or {})}
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(port),
           "--ray-client-server-port", str(client_port), "--num-cpus", "1", "--num-gpus", "0",
           "--include-dashboard=false", "--disable-usage-stats"]
    with open(log_path, "w") as log:
        head = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=pool.die_with_parent)
    deadline = time.monotonic() + timeout_s
    while "block forever" not in log_path.read_text():
        if head.poll() is not None or time.monotonic() > deadline:
            head.kill()
            raise RuntimeError(f"the Ray head did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.2)
    return head


def connect(address: str) -> str:
    """Connect to the cluster (a Ray Client address, `auto`, or the head's GCS address) and give
    the GCS address a node joins with. A bare GCS address is connected to once the node is up:
    a driver needs a Ray node on its own machine."""
    import ray

    address = pool.ray_address(address)
    if address.startswith("ray://") or address == "auto":
        ray.init(address=address, namespace=pool.NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
        return ray.get_runtime_context().gcs_address
    return address


def start_node(gcs: str, devices: int, label: str) -> subprocess.Popen:
    """`ray start --block` joining `gcs`: the server's devices as GPUs (ids 0..n-1, the server's
    own ordinals), no CPUs for tasks, the xpuremote resource, and a label naming this server."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.setdefault("RAY_raylet_start_wait_time_s", str(int(JOIN_TIMEOUT_S)))  # a loaded machine is slow to start one
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", gcs, "--block",
           "--num-cpus", "0", "--num-gpus", str(devices), "--disable-usage-stats",
           "--resources", json.dumps({pool.RESOURCE: pool.RESOURCE_UNITS}),
           "--labels", json.dumps({pool.SERVER_LABEL: label})]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=pool.die_with_parent)


def find_node(label: str, node: subprocess.Popen) -> str:
    """The id of the node carrying `label`, once it is alive."""
    import ray

    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while time.monotonic() < deadline:
        if node.poll() is not None:
            raise RuntimeError(f"the Ray node did not start (exit {node.returncode}): {node.stderr.read()[-2000:]}")
        for info in ray.nodes():
            if info["Alive"] and info.get("Labels", {}).get(pool.SERVER_LABEL) == label:
                return info["NodeID"]
        time.sleep(0.5)
    raise RuntimeError(f"the Ray node did not join within {JOIN_TIMEOUT_S:g} s")


def publish(node_id: str, record: dict[str, Any]) -> Any:
    """The server's actor, on its own node (it dies with the node)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor = ray.remote(pool.ServerRecord).options(
        name=pool.SERVER_ACTOR + node_id, num_cpus=0, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote({**record, "node_id": node_id})
    ray.get(actor.describe.remote(), timeout=JOIN_TIMEOUT_S)
    return actor


def serve(address: str, record: dict[str, Any]) -> int:
    pool.quiet_grpc()
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(pool)  # the head's Python need not have xpuremote
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    gcs = connect(address)
    label = secrets.token_hex(8)
    node = start_node(gcs, len(record["devices"]), label)
    try:
        if not ray.is_initialized():
            ray.init(address=gcs, namespace=pool.NAMESPACE, logging_level=logging.ERROR, log_to_driver=False)
        node_id = find_node(label, node)
        actor = publish(node_id, record)  # held: Ray ends an actor nobody holds, named or not
        print("joined", node_id, flush=True)
        while not stop and node.poll() is None:
            time.sleep(0.5)
        del actor
        if not stop:
            log.error("the server's Ray node exited (code %s): the server has left the pool", node.returncode)
            return 1
        return 0
    finally:
        ray.shutdown()
        node.terminate()  # `ray start --block` stops its node gracefully: Ray drops it at once
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            node.kill()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="xpu-server pool %(levelname)s %(message)s")
    address, record = argv[0], json.loads(argv[1])
    try:
        return serve(address, record)
    except Exception as exc:  # whatever Ray raises: the daemon reports it and goes on without the pool
        print(f"failed {exc}", flush=True)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
