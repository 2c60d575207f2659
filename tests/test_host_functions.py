"""Host functions on streams run by a reverse call: the server stops at the function's place in
the stream, the client runs it and says `done`. The caller never waits for the function."""

from __future__ import annotations

import sys
from pathlib import Path

PROGRAM = Path(__file__).resolve().parent / "programs" / "host_function_check.py"


def test_host_functions(run_on) -> None:
    result = run_on([sys.executable, str(PROGRAM)], timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("ALL OK")
