"""xpu-run: run a program with xpuremote's libcuda.so.1, libnvidia-ml.so.1 and math libraries
(protocol/mathlibs.py's LIBRARIES: cuBLAS, cuBLASLt, cuDNN, cuFFT, cuSOLVER, cuSPARSE, cuRAND..., and NCCL)
in place of NVIDIA's.

    xpu-run [--server tcp://host:port | --pool ray://HEAD:PORT [--gpus N] [--lease-timeout S]]
            [--backend auto|cuda|sim] [--trace PATH] [--key CLIENT.key_secret --server-key SERVER.key]
            -- CMD [ARGS...]

Without --server (or XPU_SERVER), starts a local xpu-server for the program's lifetime:
on a GPU if this machine has one, else the sim device. With --pool (or XPU_POOL), leases N GPUs
of one server of a Ray pool (client/pool.py) and runs CMD against them, with CUDA_VISIBLE_DEVICES
set to the leased devices; the lease ends with CMD. CMD (and a local server) die with xpu-run,
even when it is killed -9.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from xpuremote.protocol import spin
from xpuremote.protocol.local_server import start_local_server
from xpuremote.protocol.pool import die_with_parent

from .build import LIBRARY_NAMES, NVML_NAME, ensure_shim


def child_env(shim_dir: str, server: str, key: str | None = None, server_key: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    for name, path in (("XPU_CLIENT_KEY", key), ("XPU_SERVER_KEY", server_key)):
        if path:  # a file, or one per server separated by commas
            env[name] = ",".join(os.path.abspath(p.strip()) for p in path.split(","))
    # preloaded, not only first on the path: PyTorch finds NVIDIA's math libraries through its
    # DT_RPATH, which wins over LD_LIBRARY_PATH, but never over an already loaded SONAME
    preload = [os.path.join(shim_dir, name) for name in ("libcuda.so.1", NVML_NAME, *LIBRARY_NAMES)]
    env["LD_PRELOAD"] = " ".join(filter(None, [*preload, env.get("LD_PRELOAD")]))
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [shim_dir, env.get("LD_LIBRARY_PATH")]))
    # Triton links its kernel launchers against the libcuda it finds (ldconfig first, which on a
    # machine with a GPU driver would be NVIDIA's): pointed at this one
    env.setdefault("TRITON_LIBCUDA_PATH", shim_dir)
    env["XPU_SERVER"] = server
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="xpu-run", description="Run CMD on a remote (or local sim) GPU.")
    parser.add_argument("--server", help="tcp://host:port of an xpu-server, or several separated by commas, whose "
                        "devices the program sees as one list (or XPU_SERVER)")
    parser.add_argument("--pool",
                        help="lease GPUs from a Ray pool instead: ray://HEAD:PORT (Ray Client), HEAD:PORT or auto")
    parser.add_argument("--gpus", type=int, default=int(os.environ.get("XPU_POOL_GPUS", "1")),
                        help="GPUs to lease from the pool, all of one server unless --spread (default 1)")
    parser.add_argument("--spread", action="store_true", default=os.environ.get("XPU_POOL_SPREAD") == "1",
                        help="lease the GPUs from as few servers as hold them free, when no one server has them "
                        "(the program sees them as one list: docs/distributed.md)")
    parser.add_argument("--lease-timeout", type=float, default=float(os.environ.get("XPU_POOL_TIMEOUT_S", "600")),
                        help="seconds to wait for free GPUs in the pool (default 600)")
    parser.add_argument("--backend", default="auto", choices=["auto", "cuda", "sim"],
                        help="backend of the local server started when no --server is given")
    parser.add_argument("--trace", help="record the run for xpu-perf into this file (sets XPU_TRACE)")
    parser.add_argument("--key", help="this client's CURVE secret key file (NAME.key_secret; or XPU_CLIENT_KEY)")
    parser.add_argument("--server-key", help="the server's CURVE public key file (server.key; or XPU_SERVER_KEY)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (xpu-run [options] -- CMD ...)")
    if args.pool and args.server:
        parser.error("--server and --pool exclude each other")
    # the environment's choice, where the command line made none (a flag beats either variable)
    if not args.pool and not args.server:
        args.server, args.pool = os.environ.get("XPU_SERVER"), os.environ.get("XPU_POOL")
        if args.server and args.pool:
            parser.error("XPU_SERVER and XPU_POOL are both set: unset one, or say --server or --pool")
    if args.gpus < 1:
        parser.error("--gpus must be at least 1")
    try:
        spin.default_us()  # the client's and a local server's: a bad XPU_SPIN_US is said before the program starts
    except ValueError as exc:
        parser.error(str(exc))
    shim = ensure_shim()
    if args.pool:
        return run_leased(args, command, str(shim.parent))
    server_proc = None
    server = args.server
    if not server:
        server_proc, server = start_local_server(args.backend)
    try:
        code = run_child(command, child_env(str(shim.parent), server, args.key, args.server_key), args.trace)
    finally:
        if server_proc is not None:
            server_proc.terminate()
            try:
                server_proc.wait(10)
            except subprocess.TimeoutExpired:
                server_proc.kill()
    return code


def run_child(command: list[str], env: dict[str, str], trace: str | None) -> int:
    """CMD to its end (it dies with us); our signals are passed on. Its exit status, the shell's way."""
    if trace:
        env["XPU_TRACE"] = os.path.abspath(trace)
    child = subprocess.Popen(command, env=env, preexec_fn=die_with_parent)
    signal.signal(signal.SIGINT, lambda *_: child.send_signal(signal.SIGINT))
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    code = child.wait()
    return code if code >= 0 else 128 - code


def public_key_file(folder: str, i: int, key: str) -> str:
    path = os.path.join(folder, f"server{i}.key")
    with open(path, "w") as f:
        f.write(f'curve\n    public-key = "{key}"\n')
    return path


def run_leased(args: argparse.Namespace, command: list[str], shim_dir: str) -> int:
    """CMD against GPUs leased from the pool; the lease ends when CMD does (or its server dies)."""
    import tempfile

    from xpuremote.client import pool

    def say(text: str) -> None:
        print(f"xpu-run: {text}", file=sys.stderr, flush=True)

    try:
        pool.connect(args.pool)
        grant = pool.lease(args.gpus, args.lease_timeout, say, args.spread)
    except pool.PoolError as exc:
        say(str(exc))
        return 1

    def lost() -> None:
        say(f"the server {grant.endpoint} left the pool: its lease is given back; the program's calls to it fail")
        pool.release(grant)

    watching = pool.watch(grant, lost)
    try:
        try:
            keys = grant.server_keys()
        except pool.PoolError as exc:
            say(str(exc))
            return 1
        with tempfile.TemporaryDirectory(prefix="xpu-run-") as folder:
            server_key = args.server_key
            if keys and not server_key:  # the pool hands out public keys, never secrets
                server_key = ",".join(public_key_file(folder, i, key) for i, key in enumerate(keys))
            env = child_env(shim_dir, grant.endpoint, args.key, server_key)
            env["CUDA_VISIBLE_DEVICES"] = grant.visible_devices()
            env.pop("XPU_POOL", None)  # an xpu-run inside CMD uses the leased server
            if os.environ.get("XPU_LOG", "").upper() in ("INFO", "DEBUG", "CALLS"):
                say(f"leased device(s) {grant.visible_devices()} of {grant.endpoint}")
            return run_child(command, env, args.trace)
    finally:
        watching.set()
        pool.release(grant)
        pool.disconnect()


if __name__ == "__main__":
    raise SystemExit(main())
