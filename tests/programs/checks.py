"""What the cuda-python check programs share (they import it from their own folder).

Every check prints `ok <what>` or `FAIL <what>: <why>`; a program ends with `finish()`: `ALL OK` and
exit 0 only if nothing failed. Sections are independent: a failure in one does not hide the others.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as cu

FAILURES: list[str] = []
SUCCESS = cu.CUresult.CUDA_SUCCESS
XPUREMOTE = "XPU_SERVER" in os.environ  # under the shim: for what only xpuremote answers its own way


def check(cond: bool, what: str, why: str = "") -> None:
    if cond:
        print(f"ok {what}")
    else:
        FAILURES.append(what)
        print(f"FAIL {what}: {why}", flush=True)


def ok(result: tuple, what: str) -> Any:
    """Check a cuda-python result tuple's CUresult; return its value(s)."""
    err, *values = result
    check(err == SUCCESS, what, f"returned {err!r}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def fails(result: Any, expected: cu.CUresult | tuple[cu.CUresult, ...], what: str) -> None:
    """The call failed with `expected` (or one of them, where the driver's documentation allows several)."""
    err = result[0] if isinstance(result, tuple) else result
    wanted = expected if isinstance(expected, tuple) else (expected,)
    check(err in wanted, what, f"returned {err!r}, expected {' or '.join(map(repr, wanted))}")


def section(fn: Callable[[], None]) -> Callable[[], None]:
    """Run a section now; an exception fails it without stopping the program."""
    try:
        fn()
    except Exception:
        FAILURES.append(fn.__name__)
        print(f"FAIL {fn.__name__}: exception\n{traceback.format_exc()}", flush=True)
    return fn


def finish() -> None:
    sys.stdout.flush()
    if FAILURES:
        print(f"{len(FAILURES)} FAILED: {', '.join(FAILURES)}")
        os._exit(1)
    print("ALL OK")
