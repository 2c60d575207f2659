"""Device resources and green contexts: cuda-python's driver and runtime bindings under the shim
(tests/programs/green_check.py), on the session's server and through the cuda backend."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import ROOT, assert_all_ok, start_server

pytest.importorskip("cuda.bindings.driver", reason="cuda-python (cuda-bindings) is not installed")

PROGRAM = ROOT / "tests" / "programs" / "green_check.py"


@pytest.mark.parametrize("where", ["server", pytest.param("cuda backend", marks=pytest.mark.sim_only(
    reason="the cuda backend on stand-in libraries chained to a sim server"))])
def test_resources_splits_and_green_contexts(run_on, request, where: str) -> None:
    """Resources of a device, a context and a stream; both splits and their errors; descriptors; green
    contexts with their streams, events and context, made and destroyed; the runtime's forms of them."""
    address = request.getfixturevalue("chained")[0].address if where == "cuda backend" else None
    result = run_on([sys.executable, str(PROGRAM)], timeout=120, address=address)
    assert_all_ok(result, 150, all_forwarded=False)
    unsupported = re.findall(r"(\S+ \S+ \(type \d+\)|\w+) (?:are|is) not supported by xpuremote", result.stderr)
    assert unsupported == ["workqueue resources (type 1000)"], result.stderr[-2000:]


REFUSED = """
import json
from cuda.bindings import driver as cu
cu.cuInit(0)
dev = cu.cuDeviceGet(0)[1]
whole = cu.cuDeviceGetDevResource(dev, cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM)[1]
desc = cu.cuDevResourceGenerateDesc([whole], 1)[1]
created = cu.cuGreenCtxCreate(desc, dev, 0)[0]
active = cu.cuDevicePrimaryCtxGetState(dev)[2]
cu.cuCtxSetCurrent(cu.cuDevicePrimaryCtxRetain(dev)[1])
err, ptr = cu.cuMemAlloc(4096)
print(json.dumps({"created": int(created), "active": active, "alloc": int(err), "sync": int(cu.cuCtxSynchronize()[0])}))
"""


@pytest.mark.sim_only(reason="the sim refuses green contexts on request; a GPU's driver answers for itself")
def test_a_green_context_the_driver_refuses_fails_at_its_create(run_on, tmp_path) -> None:
    """A driver may refuse green contexts altogether (an H100's 580 driver in a virtual machine did): the
    create says so itself, leaves no context and no retain of the primary, and the session goes on."""
    srv = start_server(tmp_path, backend="sim", env={"XPU_SIM_REFUSED_CALLS": "xpuGreenCtxCreate"})
    try:
        result = run_on([sys.executable, "-c", REFUSED], timeout=60, address=srv.address)
    finally:
        srv.stop()
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"created": 1, "active": 0, "alloc": 0, "sync": 0}, result.stderr[-2000:]  # INVALID_VALUE
