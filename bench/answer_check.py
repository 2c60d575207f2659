"""What checking an answer's outputs costs the client per synchronous call (marshal.checked), in process.

    python bench/answer_check.py [--calls 20000] [--repeats 15]

Each call runs through the handler the shim calls (slot decoding, the call's implementation, packing,
Driver.call, writing the outputs), on a connection that answers at once with an honest answer: only the
client's own Python is timed, no network. Every repeat runs the call with the check and then with the check
replaced by a function that returns the outputs as they came, in the same process, so that drift on a shared
machine hits both alike. Prints the minimum and the median over the repeats of each, in ns per call.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import timeit
from typing import Any

from xpuremote.client import driver, marshal
from xpuremote.client.driver import Context
from xpuremote.protocol.calls import CALLS

CTX = 0x7C00_0000_1000


class Answering:
    """A connection that answers every call at once with `outs`."""

    pid, lane, dead, data = os.getpid(), None, None, None

    def __init__(self) -> None:
        self.outs: list[Any] = []

    def call(self, call: Any, args: list[Any], ctx: Any, by_data: bool = False, flags: int = 0) -> tuple:
        return 0, self.outs, []


def unchecked(call: Any, asked: list[Any], outs: Any) -> Any:
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per repeat")
    parser.add_argument("--repeats", type=int, default=15)
    options = parser.parse_args()
    driver.handlers()
    d = driver.DRIVER = driver.Driver()
    conn = d.conn = Answering()
    d.ctxs[CTX] = Context(0)
    d.contexts.push(CTX)
    out = marshal.ffi.new("char[]", 64)
    address = int(marshal.ffi.cast("uintptr_t", out))
    cases = {
        "cuCtxSynchronize (no output)": ("cuCtxSynchronize", [], []),
        "cuMemAlloc_v2 (an 8-byte pointer)": ("cuMemAlloc_v2", [address, 64], [(0x1000).to_bytes(8, "little")]),
        "cuMemcpyDtoH_v2 (8 bytes)": ("cuMemcpyDtoH_v2", [address, 0x1000, 8], [b"\x5a" * 8]),
        "cuCtxGetStreamPriorityRange (2 ints)": ("cuCtxGetStreamPriorityRange", [address, address + 8],
                                                  [b"\0" * 4, b"\0" * 4]),
    }
    checked = marshal.checked
    print(f"ns per call, with the check / without ({options.repeats} repeats of {options.calls} calls)")
    for name, (symbol, args, outs) in cases.items():
        run = driver.handler(CALLS[symbol])
        conn.outs = outs
        assert run(args) == 0, symbol
        found: dict[bool, list[float]] = {True: [], False: []}
        once = functools.partial(run, args)
        for _ in range(options.repeats):
            for on in (True, False):
                marshal.checked = checked if on else unchecked
                found[on].append(timeit.timeit(once, number=options.calls) / options.calls * 1e9)
        marshal.checked = checked
        print(f"{name:40s} min {min(found[True]):6.0f} / {min(found[False]):6.0f}   "
              f"median {statistics.median(found[True]):6.0f} / {statistics.median(found[False]):6.0f}")


if __name__ == "__main__":
    main()
