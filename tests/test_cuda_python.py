"""cuda-python's driver bindings (cuda.bindings.driver), unmodified, on the shim and the session's server."""

from __future__ import annotations

import re
import sys

import pytest
from conftest import ROOT

pytest.importorskip("cuda.bindings.driver", reason="cuda-python (cuda-bindings) is not installed")

PROGRAM = ROOT / "tests" / "programs" / "cuda_python_check.py"


@pytest.mark.parametrize("per_thread", ["0", "1"], ids=["legacy-stream", "per-thread-stream"])
def test_cuda_python_driver_api(run_on, per_thread: str) -> None:
    result = run_on([sys.executable, str(PROGRAM)], timeout=90,
                    CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=per_thread)
    failures = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert result.returncode == 0 and not failures and "ALL OK" in result.stdout, (
        "\n".join(failures) or result.stdout[-4000:]) + "\n--- stderr ---\n" + result.stderr[-4000:]
    checks = sum(line.startswith("ok ") for line in result.stdout.splitlines())
    assert checks > 200, f"only {checks} checks ran"
    # graphics interop is not forwarded: CUDA_ERROR_NOT_SUPPORTED (801), named in the log once
    said = [line for line in result.stderr.splitlines() if "cuGraphicsUnregisterResource" in line]
    assert len(said) == 1 and "CUDA_ERROR_NOT_SUPPORTED" in said[0], result.stderr
    assert not re.search(r"Traceback|internal error", result.stderr), result.stderr
