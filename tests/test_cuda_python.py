"""cuda-python's driver bindings (cuda.bindings.driver), unmodified, on the shim and the session's server."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT, assert_all_ok

pytest.importorskip("cuda.bindings.driver", reason="cuda-python (cuda-bindings) is not installed")

PROGRAM = ROOT / "tests" / "programs" / "cuda_python_check.py"


@pytest.mark.parametrize("per_thread", ["0", "1"], ids=["legacy-stream", "per-thread-stream"])
def test_cuda_python_driver_api(run_on, per_thread: str) -> None:
    result = run_on([sys.executable, str(PROGRAM)], timeout=90,
                    CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=per_thread)
    assert_all_ok(result, 200, all_forwarded=False)
    # graphics interop is not forwarded: CUDA_ERROR_NOT_SUPPORTED (801), named in the log once
    said = [line for line in result.stderr.splitlines() if "cuGraphicsUnregisterResource" in line]
    assert len(said) == 1 and "CUDA_ERROR_NOT_SUPPORTED" in said[0], result.stderr
