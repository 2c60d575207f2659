"""Device resources and green contexts: cuda-python's driver and runtime bindings under the shim
(tests/programs/green_check.py), on the session's server and through the cuda backend."""

from __future__ import annotations

import re
import sys

import pytest
from conftest import ROOT, assert_all_ok

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
