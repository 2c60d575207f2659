"""Stream capture and CUDA graphs: cuda-python's driver bindings under the shim (tests/programs/graph_check.py),
on the session's server and through the cuda backend's generic replay; torch.cuda.CUDAGraph is in test_torch."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Build, assert_all_ok, start_server
from pyclient import CTX, PyClient

from xpuremote.protocol import errors
from xpuremote.protocol.calls import CALLS
from xpuremote.server.backends import sim
from xpuremote.server.session import Session

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


# ---- what a client that does not use the client library may send (the worker's own checks) -------------
STREAM, GRAPH = 0x7C00_0000_2000, 0x7C00_0000_2010


def deferred_and_status(client: PyClient, symbol: str, *args: Any) -> tuple[list[list[Any]], int]:
    status, _, deferred = client.conn.call(CALLS[symbol], list(args), CTX)
    return [d[:2] for d in deferred], status


@pytest.mark.sim_only(reason="calls the sim's own requests with arguments no client library sends")
def test_what_a_replay_could_not_do_is_refused_on_the_server_too(server) -> None:
    """A host copy in a capture (refused by the client first) invalidates it; a free there of memory that no
    graph allocated is refused, and the capture goes on."""
    client = PyClient(server.address)
    try:
        dst = client.alloc(64)
        client.post("cuStreamCreate", STREAM, 1)
        for symbol, args, code, end in (("cuMemcpyHtoDAsync_v2", [dst, b"x" * 64, 64, STREAM], errors.NOT_SUPPORTED,
                                         errors.CAPTURE_INVALIDATED),
                                        ("cuMemFreeAsync", [dst, STREAM], errors.INVALID_VALUE, errors.SUCCESS)):
            client.post("xpuStreamBeginCapture", GRAPH, STREAM, 0)
            client.post(symbol, *args)
            deferred, status = deferred_and_status(client, "xpuStreamEndCapture", STREAM, GRAPH)
            assert deferred == [[symbol, code]] and status == end
        assert client.read(dst, 4) == bytes(4)  # neither ran, and dst is still allocated
    finally:
        client.close()


@pytest.mark.sim_only(reason="calls the sim's own requests with arguments no client library sends")
def test_graph_handles_are_checked_and_go_with_their_graph(tmp_path: Path) -> None:
    """A handle already in use is refused before anything is made; nodes' handles go with their graph
    (so building and destroying graphs does not exhaust --max-handles); graphs launched within graphs
    are bounded; a destroyed stream leaves its capture."""
    srv = start_server(tmp_path, args=("--max-handles", "40"))
    client = PyClient(srv.address)
    try:
        client.post("cuGraphCreate", GRAPH, 0)
        client.post("cuGraphAddEmptyNode", GRAPH + 16, GRAPH, None, 0)
        assert deferred_and_status(client, "cuGraphAddEmptyNode", GRAPH + 16, GRAPH, None, 0)[1] == errors.INVALID_VALUE
        assert client.call("xpuGraphCountNodes", GRAPH, 0, 8)[0] == (1).to_bytes(8, "little")
        client.post("cuGraphDestroy", GRAPH)
        for round_ in range(10):  # 10 graphs of 10 nodes, one at a time, under a limit of 40 handles
            graph = GRAPH + 0x1000 * (round_ + 1)
            client.post("cuGraphCreate", graph, 0)
            for i in range(10):
                client.post("cuGraphAddEmptyNode", graph + 16 * (i + 1), graph, None, 0)
            client.post("cuGraphDestroy", graph)
        client.call("cuCtxSynchronize_v2", CTX)
        client.post("cuStreamCreate", STREAM, 1)
        inner = client.alloc(64)
        graph, graph_exec = GRAPH + 0x20000, 0
        for depth in range(10):
            client.post("xpuStreamBeginCapture", graph + depth * 16, STREAM, 0)
            if graph_exec:
                client.post("cuGraphLaunch", graph_exec, STREAM)
            else:
                client.post("cuMemsetD8Async", inner, 7, 64, STREAM)
            client.call("xpuStreamEndCapture", STREAM, graph + depth * 16)
            status, outs, _ = client.conn.call(CALLS["cuGraphInstantiateWithFlags"], [8, graph + depth * 16, 0], CTX)
            if status:
                break
            graph_exec = int.from_bytes(outs[0], "little")
        assert status == errors.NOT_SUPPORTED and depth == 8  # eight deep at most
        blocking = STREAM + 16
        client.post("cuStreamCreate", blocking, 0)
        client.post("xpuStreamBeginCapture", graph + 0x1000, blocking, 0)
        client.post("cuStreamDestroy_v2", blocking)
        client.call("cuMemsetD8_v2", inner, 1, 64)  # the legacy stream is free again
    finally:
        client.close()
        srv.stop()
    assert "internal error" not in srv.log()


@pytest.mark.sim_only(reason="calls the sim's own requests with arguments no client library sends")
def test_conditional_nodes_and_green_contexts_are_bounded(server) -> None:
    """A conditional node of more bodies than its type has, or of a condition of another graph, and a green
    context of no SMs or of SMs the device lacks, are refused before anything is made."""
    client = PyClient(server.address)
    try:
        client.post("cuGraphCreate", GRAPH, 0)
        (handle,) = client.call("cuGraphConditionalHandleCreate", 8, GRAPH, CTX, 0, 0)
        handle = int.from_bytes(handle, "little")
        for kind, size in ((0, 3), (1, 2), (2, 1 << 30), (7, 1)):
            status, _, _ = client.conn.call(CALLS["xpuGraphAddConditionalNode"],
                                            [8, GRAPH, None, 0, handle, kind, size, 1], CTX)
            assert status == errors.INVALID_VALUE, (kind, size)
        status, _, _ = client.conn.call(CALLS["xpuGraphAddConditionalNode"], [8, GRAPH, None, 0, handle + 1, 0, 1, 1],
                                        CTX)
        assert status == errors.INVALID_VALUE  # not a condition of this graph
        assert client.call("xpuGraphCountNodes", GRAPH, 0, 8)[0] == bytes(8)
        for mask in (0, 1 << 200):
            client.post("xpuGreenCtxCreate", GRAPH + 16, 0, mask.to_bytes(64, "little"), 0)
            deferred, _ = deferred_and_status(client, "xpuGraphCountNodes", GRAPH, 0, 8)
            assert deferred == [["xpuGreenCtxCreate", errors.INVALID_VALUE]]
    finally:
        client.close()


def test_an_address_the_driver_gives_again_gets_a_live_handle() -> None:
    """In process: the cuda backend names objects the driver made by their addresses (a conditional node's
    body graphs), and the driver reuses an address once its graph is destroyed. The handle named for it
    then must be a new live one, not the one that went with the first graph (an H100 refused every
    conditional node after the first graph's bodies were destroyed)."""
    session = Session(sim.SimBackend())
    session.execute(CALLS["cuDevicePrimaryCtxRetain"], [CTX, 0])
    session.execute(CALLS["cuCtxSetCurrent"], [CTX])
    body = 0x7F00_0000_1000  # an address, as the real driver's body graphs are
    for round_ in range(2):
        graph = GRAPH + 0x100 * round_
        session.execute(CALLS["cuGraphCreate"], [graph, 0])
        named = session.name_handle("CUgraph", body, session.handles[graph][1])
        assert session.handles[named] == ("CUgraph", body)
        session.execute(CALLS["cuGraphDestroy"], [graph])
        assert named not in session.handles


@pytest.mark.sim_only(reason="the sim's own refusal; on a GPU graph_check.py's launch with a timing-free event "
                      "is the driver's side of it")
def test_a_launch_attributes_event_must_not_time(server) -> None:
    """cuda.h: a launch-completion or programmatic event is made with CU_EVENT_DISABLE_TIMING; the driver
    refuses a timing one with NOT_SUPPORTED (an H200), and so does the sim."""
    from test_isolation import FUNCTION, load

    from xpuremote.protocol.cuda_api import ENUMS
    from xpuremote.protocol.layouts import LAUNCH_ATTRIBUTE

    client = PyClient(server.address)
    try:
        load(client)
        buffer = client.alloc(64)
        params = struct.pack("<f4xQQI", 1.0, buffer, buffer, 0)  # saxpy(a, x, y, n = 0)
        for flags, status in ((0, errors.NOT_SUPPORTED), (ENUMS["CU_EVENT_DISABLE_TIMING"], errors.SUCCESS)):
            event = 0x7C00_0000_5000 + 0x10 * flags
            client.post("cuEventCreate", event, flags)
            attrs = LAUNCH_ATTRIBUTE.pack(12, event.to_bytes(8, "little"))  # a launch-completion event
            client.post("xpuLaunchKernelEx", FUNCTION, 1, 1, 1, 32, 1, 1, 0, 0, params, len(params), attrs, 1)
            assert client.status_of("cuCtxSynchronize") == status, flags
    finally:
        client.close()


OLDER_DRIVER = r"""
import json, struct
from xpuremote.protocol.calls import CALLS
from xpuremote.server.backends.cuda import CudaBackend
from xpuremote.server.limits import Accounted, Limits
from xpuremote.server.session import Session

HIDDEN = ("cuGraphNodeGetContainingGraph", "cuGraphGetEdges_v2")

class Driver130:
    '''A mock of a CUDA 13.0 driver, which no machine here has: the driver it wraps, less CUDA 13.1's
    cuGraphNodeGetContainingGraph (and, to see how any missing symbol is answered, cuGraphGetEdges_v2).'''
    def __init__(self, lib):
        self.lib = lib
    def __getattr__(self, name):
        if name in HIDDEN:
            raise AttributeError(f"function/symbol '{name}' not found in library 'libcuda.so.1'")
        return getattr(self.lib, name)

CTX, GRAPH = 0x7C00_0000_1000, 0x7C00_0000_2000
A, B, C = GRAPH + 16, GRAPH + 32, GRAPH + 48
backend = CudaBackend()
backend.lib = Driver130(backend.lib)
session = Session(Accounted(backend, Limits()))

def ask(symbol, *args):
    answer = session.run_batch([[CALLS[symbol].opcode, list(args)]], True)
    return answer["status"], answer.get("outs")

ask("cuCtxCreate_v2", CTX, 0, 0)
ask("cuGraphCreate", GRAPH, 0)
ask("cuGraphAddEmptyNode", A, GRAPH, None, 0)
for node in (B, C):
    ask("cuGraphAddEmptyNode", node, GRAPH, struct.pack("<Q", A), 1)
print(json.dumps(default=list, obj={"handles": [GRAPH, A, B, C], "dependents": ask("xpuGraphNodeListEdges", A, 1, 1),
                  "dependencies": ask("xpuGraphNodeListEdges", C, 0, 1),
                  "graph": ask("xpuGraphNodeGetContainingGraph", B, 8), "edges": ask("xpuGraphListEdges", GRAPH, 1)}))
"""


@pytest.mark.sim_only(reason="hides symbols of the stand-in libcuda; a GPU's driver is what it is")
def test_a_driver_without_13_1s_calls_still_lists_a_nodes_edges(driver_env: dict[str, str]) -> None:
    """A CUDA 13.0 driver lacks cuGraphNodeGetContainingGraph: the cuda backend lists a node's edges and names
    its graph from the session's own record (on an H200's 13.0 driver the listing answered INVALID_VALUE), and
    a call the server's driver lacks is answered NOT_SUPPORTED, naming it."""
    env = {**os.environ, **driver_env}
    env.pop("LD_PRELOAD", None)
    proc = subprocess.run([sys.executable, "-c", OLDER_DRIVER], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    graph, a, b, c = found["handles"]
    assert found["dependents"][0] == 0 and sorted(found["dependents"][1][0]) == [b, c], found
    assert found["dependencies"] == [0, [[a]]], found
    assert found["graph"][0] == 0 and int.from_bytes(bytes(found["graph"][1][0]), "little") == graph, found
    assert found["edges"][0] == errors.NOT_SUPPORTED, found
