"""NCCL through xpuremote: torch.distributed's "nccl" backend with ranks under xpu-run on a two-device sim server.

The communicators live on the server and the sim computes the collectives across its sessions (worker processes),
which meet in the file system (server/backends/sim_rendezvous.py). Ranks are started by hand with a TCP store.
Without NCCL forwarded, the ranks failed with a RuntimeError (before that, a SIGSEGV in NCCL's NVML probing).
The stock PyTorch wheel carries NCCL (tests/test_torch.py says how it is found).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, TORCH_SIM_KERNELS, Server, free_port, start_server
from test_torch import torch_python

pytestmark = pytest.mark.sim_only(reason="two sim devices (XPU_SIM_DEVICES), the sim's collectives")

RANKS = ROOT / "tests" / "programs" / "nccl_ranks.py"
ALONE = ROOT / "tests" / "programs" / "nccl_alone.py"
WORLD = 2


@pytest.fixture(scope="module")
def two_device_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("nccl-server"), backend="sim",
                       env={"XPU_SIM_DEVICES": str(WORLD), "XPU_SIM_KERNELS": TORCH_SIM_KERNELS})
    yield srv
    srv.stop()


def nccl_in(python: Path) -> None:
    probe = subprocess.run([str(python), "-c", "import torch.cuda.nccl as n; print(n.version())"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"{python}'s torch has no NCCL: {probe.stderr.strip()[-300:]}")


def under_xpu_run(python: Path, server: Server, *command: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as torchrun sets: ranks share the machine's cores
    env.pop("LD_PRELOAD", None)
    return subprocess.Popen([str(python), "-m", "xpuremote.interpose.run", "--server", server.address, "--",
                             str(python), *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def no_signal(rank: int, proc: subprocess.Popen, err: str) -> None:
    """xpu-run exits 128+N when its program died of signal N (SIGSEGV, or SIGABRT from a failing C++ thread)."""
    code = proc.returncode
    died = -code if code < 0 else code - 128 if 128 < code <= 128 + 64 else 0
    assert not died, f"rank {rank} died of {signal.Signals(died).name}:\n{err[-3000:]}"


def close(a: list, b: list, tolerance: float = 1e-5) -> bool:
    return bool(np.allclose(np.array(a, dtype=np.float64), np.array(b, dtype=np.float64), atol=tolerance))


def test_collectives_and_a_ddp_step_on_two_ranks(two_device_server: Server, tmp_path: Path) -> None:
    """Two ranks, each its own session on its own device of one server: every collective's result is what NCCL
    gives, in the default group and in groups split from it (one of them with rank 0 only), the DDP step's
    gradients agree across ranks and with the same step in one process, and the server ran the NCCL calls
    (counted per session in its log)."""
    python = torch_python()
    nccl_in(python)
    port = free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(WORLD)]
    ranks = [under_xpu_run(python, two_device_server, str(RANKS), str(r), str(WORLD), str(port), str(outs[r]))
             for r in range(WORLD)]
    outputs = [rank.communicate(timeout=240) for rank in ranks]
    for rank, (proc, (_out, err)) in enumerate(zip(ranks, outputs)):
        no_signal(rank, proc, err)
        assert proc.returncode == 0, f"rank {rank}: exit {proc.returncode}\n{err[-4000:]}"
    check_ranks([json.loads(o.read_text()) for o in outs])
    # the server ran them: each rank's session made at least the collectives above (17 a rank, DDP's included)
    counts = nccl_calls(two_device_server, WORLD)
    assert len(counts) >= WORLD and all(n >= 17 for n in counts[-WORLD:]), counts


def check_ranks(seen: list[dict]) -> None:
    """What tests/programs/nccl_ranks.py's ranks saw (rank order) is what NCCL gives, for any number of ranks."""
    world = len(seen)
    base = [[1.0 + i + r * 10 for i in range(4)] for r in range(world)]
    expected = {
        "all_reduce_sum": list(np.sum(base, axis=0)), "all_reduce_avg": list(np.mean(base, axis=0)),
        "all_reduce_prod": list(np.prod(base, axis=0)), "all_reduce_max": list(np.max(base, axis=0)),
        "all_reduce_min": list(np.min(base, axis=0)), "broadcast": [float(world - 1 + 5)] * 3,
        "all_gather": [[r, r * 100.0] for r in range(world)],
        **{f"all_reduce_sum_{t}": list(np.sum(base, axis=0)) for t in ("float16", "bfloat16", "int32", "int64")},
    }
    for rank, got in enumerate(seen):
        for name, want in expected.items():
            assert close(got[name], want), f"rank {rank} {name}: {got[name]} != {want}"
        assert got["reduce_scatter"] == [float(sum(r * 10 + rank for r in range(world)))] * 2, got["reduce_scatter"]
        assert got["send_recv"] == [float((rank - 1) % world)] * 3, got["send_recv"]
        # DDP: the averaged gradients, the weights after the step and the loss agree across ranks...
        for name in ("ddp_grads", "ddp_weights"):
            assert all(close(a, b, 0) for a, b in zip(got[name], seen[0][name])), f"rank {rank}'s {name} differ"
        # ... and with the same step on the whole batch in one process
        assert all(close(a, b) for a, b in zip(got["ddp_grads"], seen[0]["one_grads"])), (got["ddp_grads"],
                                                                                          seen[0]["one_grads"])
        assert all(close(a, b) for a, b in zip(got["ddp_weights"], seen[0]["one_weights"]))
        assert abs(got["ddp_loss"] - seen[0]["one_loss"]) < 1e-5, (got["ddp_loss"], seen[0]["one_loss"])
    assert close(seen[0]["reduce_on_0"], expected["all_reduce_sum"])
    assert all(close(got["split_all_reduce"], expected["all_reduce_sum"]) for got in seen)  # a group of all
    assert seen[0]["split_alone"] == base[0] and all("split_alone" not in got for got in seen[1:])  # of rank 0


def nccl_calls(server: Server, sessions: int) -> list[int]:
    """The NCCL calls of each ended session, as the server logs them: a worker logs its end after its client has
    gone, so this waits for `sessions` of them (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        counts = [int(n) for n in re.findall(r"library calls:[^\n]* nccl=(\d+)", server.log())]
        if len(counts) >= sessions or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def test_a_rank_whose_peer_never_comes_gets_a_clear_error(tmp_path: Path) -> None:
    """Rank 0 of two, alone (a program of NCCL's C API): a call xpuremote does not serve (ncclMemAlloc) answers
    ncclInvalidUsage and is named once on stderr; ncclCommInitRank waits XPU_NCCL_TIMEOUT_S on the server, then
    fails with ncclTimeout and a line that says why. No signal."""
    server = start_server(tmp_path, backend="sim", env={"XPU_NCCL_TIMEOUT_S": "2"})
    try:
        proc = under_xpu_run(Path(sys.executable), server, str(ALONE))
        out, err = proc.communicate(timeout=120)
    finally:
        server.stop()
    no_signal(0, proc, err)
    assert proc.returncode == 1, (out, err[-3000:])
    assert "ncclMemAlloc: 5" in out and "ncclGetUniqueId: 0" in out, out  # 5: ncclInvalidUsage
    assert "ncclCommInitRank: 8 ncclTimeout" in out, out
    assert err.count("ncclMemAlloc is not supported by xpuremote yet (returning ncclInvalidUsage)") == 1, err[-3000:]
    assert "not every rank joined within the server's XPU_NCCL_TIMEOUT_S" in err, err[-3000:]
    assert "waited 2 s for rank(s) 1 to join" in server.log(), server.log()[-3000:]


def test_the_sims_collectives_for_every_numpy_type(tmp_path: Path) -> None:
    """The sim's NCCL (server/backends/sim_nccl.py) of two ranks, in two threads over two memories, without a
    server: every reduction on every data type numpy has, the rooted collectives, all-to-all, and a group whose
    receive comes before its send (run at the group's end, sends first), and splits (a color of one rank, no
    color, ranks ordered by key)."""
    from xpuremote.protocol import mathlibs
    from xpuremote.server.backends.sim import Memory
    from xpuremote.server.backends.sim_blas import bf16_to_f32, f32_to_bf16
    from xpuremote.server.backends.sim_nccl import DTYPES, SimNccl

    enums = mathlibs.api(mathlibs.NCCL).ENUMS
    unique = SimNccl(Memory(1 << 20), lambda: 0).ncclGetUniqueId()[0]
    results: dict[int, dict] = {}
    failures: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            memory = Memory(1 << 20)
            nccl = SimNccl(memory, lambda: r)
            (comm,) = nccl.ncclCommInitRank(WORLD, unique, r)
            got = results[r] = {}
            for datatype, dtype in DTYPES.items():
                values = np.array([1, 2, 3, 4 + r], dtype=np.float32)
                raw = f32_to_bf16(values) if datatype == enums["ncclBfloat16"] else values.astype(dtype)
                send, recv = memory.alloc(raw.nbytes), memory.alloc(raw.nbytes)
                memory.write(send, raw.tobytes())
                for op in ("Sum", "Prod", "Max", "Min", "Avg"):
                    nccl.ncclAllReduce(send, recv, 4, datatype, enums[f"nccl{op}"], comm, None)
                    out = np.frombuffer(memory.read(recv, raw.nbytes), dtype)
                    got[(datatype, op)] = list(bf16_to_f32(out) if datatype == enums["ncclBfloat16"] else out)
            f32 = enums["ncclFloat32"]
            send, recv = memory.alloc(16), memory.alloc(16)
            memory.write(send, np.array([r * 10 + i for i in range(4)], np.float32).tobytes())
            nccl.ncclAlltoAll(send, recv, 2, f32, comm, None)
            got["alltoall"] = list(np.frombuffer(memory.read(recv, 16), np.float32))
            nccl.ncclGather(send, recv, 2, f32, 1, comm, None)
            got["gather"] = list(np.frombuffer(memory.read(recv, 16), np.float32))
            nccl.ncclScatter(send, recv, 2, f32, 0, comm, None)
            got["scatter"] = list(np.frombuffer(memory.read(recv, 8), np.float32))
            nccl.ncclGroupStart()
            nccl.ncclRecv(recv, 4, f32, 1 - r, comm, None)
            nccl.ncclSend(send, 4, f32, 1 - r, comm, None)
            nccl.ncclGroupEnd()
            got["exchanged"] = list(np.frombuffer(memory.read(recv, 16), np.float32))
            # a split: rank 1 alone in color 7, rank 0 asks for no color; then a split that reverses the ranks
            (lone,) = nccl.ncclCommSplit(comm, 7 if r else -1, 0, None)
            got["lone"] = None if lone is None else (nccl.ncclCommCount(lone)[0], nccl.ncclCommUserRank(lone)[0])
            (reversed_,) = nccl.ncclCommSplit(comm, 3, -r, None)
            got["reversed"] = nccl.ncclCommUserRank(reversed_)[0]
            nccl.ncclAllGather(send, recv, 1, f32, reversed_, None)
            got["reversed_gather"] = list(np.frombuffer(memory.read(recv, 8), np.float32))
            got["directories"] = [c.meeting.directory for c in (comm, lone, reversed_) if c is not None]
            nccl.ncclCommDestroy(comm)
            nccl.close()  # the session's end: its ranks leave the communicators it did not destroy
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    both = np.array([[1, 2, 3, 4], [1, 2, 3, 5]], dtype=np.float64)
    want = {"Sum": both.sum(0), "Prod": both.prod(0), "Max": both.max(0), "Min": both.min(0), "Avg": both.mean(0)}
    for r in range(WORLD):
        for (datatype, op), got in ((k, v) for k, v in results[r].items() if isinstance(k, tuple)):
            integer = DTYPES[datatype].kind in "iu" and datatype != enums["ncclBfloat16"]
            expected = np.trunc(want[op]) if integer and op == "Avg" else want[op]
            assert close(got, expected, 1e-2), (r, datatype, op, got)
        assert results[r]["alltoall"] == [r * 2, r * 2 + 1, 10 + r * 2, 11 + r * 2], results[r]["alltoall"]
        assert results[r]["scatter"] == [r * 2, r * 2 + 1], results[r]["scatter"]
        assert results[r]["exchanged"] == [(1 - r) * 10 + i for i in range(4)], results[r]["exchanged"]
    assert results[1]["gather"] == [0, 1, 10, 11], results[1]["gather"]
    assert results[0]["lone"] is None and results[1]["lone"] == (1, 0), (results[0]["lone"], results[1]["lone"])
    assert [results[r]["reversed"] for r in range(WORLD)] == [1, 0]
    assert results[0]["reversed_gather"] == results[1]["reversed_gather"] == [10, 0]
    assert not any(d.exists() for r in range(WORLD) for d in results[r]["directories"])  # the last to leave
    assert len(DTYPES) == 10 and set(DTYPES) == {v for k, v in enums.items() if k in (
        "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64", "ncclFloat16", "ncclFloat32",
        "ncclFloat64", "ncclBfloat16")}


def test_the_cuda_backends_nccl_on_nvidias_library() -> None:
    """What the cuda backend's NCCL code (server/backends/cuda_nccl.py) can do here, on NVIDIA's libnccl.so.2 from
    the torch venv's wheel through the backend's own declarations: its version, a unique id, and a communicator's
    creation, which without a GPU fails at once with NCCL's status (with one, alone, it would time out)."""
    import cffi

    from xpuremote.protocol.calls import CALLS
    from xpuremote.protocol.errors import CudaError
    from xpuremote.server.backends import cuda, cuda_nccl

    found = sorted(ROOT.glob(".venv-torch/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"))
    if not found:
        pytest.skip("no NVIDIA libnccl.so.2 in .venv-torch (make torch)")
    ffi = cffi.FFI()
    ffi.cdef(cuda.declarations())
    lib = ffi.dlopen(str(found[0]))

    class Backend:  # what cuda_nccl uses of CudaBackend
        def __init__(self) -> None:
            self.ffi = ffi

        def library(self, name: str) -> object:
            return lib

        def check(self, status: int, what: str, library: str = "cuda") -> None:
            if status:
                raise CudaError(status, what, library)

    assert cuda_nccl.version(ffi, lib)[0] == 2
    unique = ffi.new("char[128]")
    assert lib.ncclGetUniqueId(unique) == 0 and any(ffi.buffer(unique))
    config = cuda_nccl.non_blocking(None)
    assert len(config) == cuda_nccl.CONFIG_BYTES and config[16:20] == b"\0\0\0\0"  # blocking 0
    with pytest.MonkeyPatch.context() as patch, pytest.raises(CudaError) as failed:
        patch.setenv("XPU_NCCL_TIMEOUT_S", "5")
        cuda_nccl.init_rank(Backend(), CALLS["ncclCommInitRank"], [None, 2, bytes(ffi.buffer(unique)), 0])
    assert failed.value.library == "nccl", failed.value


def test_a_rank_that_times_out_leaves_nothing_behind(tmp_path: Path) -> None:
    """The sim's rendezvous (server/backends/sim_rendezvous.py), without a server: a rank alone gives up after its
    timeout with an error naming the missing rank, and withdraws, its communicator's directory removed; a
    directory that a killed worker left (its process gone) is removed once idle."""
    from xpuremote.protocol.errors import CudaError
    from xpuremote.server.backends import sim_rendezvous

    unique = sim_rendezvous.new_id()
    directory = sim_rendezvous.root() / sim_rendezvous.token_of(unique)
    with pytest.raises(CudaError, match="waited 0.2 s for rank.s. 1 to join"):
        sim_rendezvous.Rendezvous(unique, 2, 0, timeout=0.2)
    assert not directory.exists()
    with pytest.raises(CudaError, match="not made by this machine's sim"):
        sim_rendezvous.Rendezvous(b"\0" * 128, 2, 0)
    stale, live = tmp_path / "stale", tmp_path / "live"  # as in the root: a killed worker's, a running one's
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for directory, pid in ((stale, dead.stdout.strip()), (live, os.getpid())):
        directory.mkdir()
        (directory / "rank-0").write_text(f"{pid} 2\n")
    sim_rendezvous.remove_stale(tmp_path, idle_s=0)
    assert not stale.exists() and live.exists()
