"""Stream capture and CUDA graphs: cuda-python's driver bindings under the shim (tests/programs/graph_check.py),
on the session's server and through the cuda backend's generic replay; torch.cuda.CUDAGraph is in test_torch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import ROOT, Build, assert_all_ok

pytest.importorskip("cuda.bindings.driver", reason="cuda-python (cuda-bindings) is not installed")

PROGRAM = ROOT / "tests" / "programs" / "graph_check.py"
KERNELS = ROOT / "tests" / "programs" / "driver_api.cu"


@pytest.fixture(scope="module")
def fatbin(build: Build) -> Path:
    return build("graph_kernels.fatbin", ["-arch=sm_90", "--fatbin", "-DKERNELS_ONLY", "-x", "cu", str(KERNELS)])


@pytest.mark.parametrize("where", ["server", pytest.param("cuda backend", marks=pytest.mark.sim_only(
    reason="the cuda backend on stand-in libraries chained to a sim server"))])
def test_capture_graphs_and_nodes(run_on, request, fatbin: Path, where: str) -> None:
    """Capture (with a side stream that joins and a node added by hand), replay with new inputs,
    graphs built node by node, and the driver's errors for what a capture forbids."""
    address = request.getfixturevalue("chained")[0].address if where == "cuda backend" else None
    assert_all_ok(run_on([sys.executable, str(PROGRAM), str(fatbin)], timeout=120, address=address), 100)


@pytest.mark.sim_only(reason="reads the sim server's log")
def test_a_host_copy_is_refused_on_the_server_too(server) -> None:
    """The client refuses a host copy in a capture before it is sent; the server refuses one sent anyway
    (a replay on the server could not reach the client's memory)."""
    from xpuremote.client.connection import Connection
    from xpuremote.protocol import errors
    from xpuremote.protocol.calls import CALLS

    conn = Connection(server.address)
    try:
        ctx, stream, graph = 0x7C00_0000_1000, 0x7C00_0000_1010, 0x7C00_0000_1020
        conn.post(CALLS["cuDevicePrimaryCtxRetain"], [ctx, 0], None)
        (address,) = conn.call(CALLS["cuMemAlloc_v2"], [8, 64], ctx)[1]
        conn.post(CALLS["cuStreamCreate"], [stream, 1], ctx)
        conn.post(CALLS["xpuStreamBeginCapture"], [graph, stream, 0], ctx)
        dst = int.from_bytes(address, "little")
        conn.post(CALLS["cuMemcpyHtoDAsync_v2"], [dst, b"x" * 64, 64, stream], ctx)
        status, _, deferred = conn.call(CALLS["xpuStreamEndCapture"], [stream, graph], ctx)
    finally:
        conn.close()
    assert [d[:2] for d in deferred] == [["cuMemcpyHtoDAsync_v2", errors.NOT_SUPPORTED]], deferred
    assert status == errors.CAPTURE_INVALIDATED
