"""The lane's records in C (server/native_lane.py): the same lanes, run by a cuda-backend session in C and in
Python (XPU_NATIVE_LANE=0), leave the same bytes and defer the same failures, refusals included: a foreign
handle, an address outside the session's memory, a number out of bounds, a handle or memory used after it
went, a record of another context. The session runs in process in a child: on the sim its libcuda is the
stand-in (xpuremote's own shim chained to a sim server, named as such); on a GPU, NVIDIA's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCENARIO = r"""
import hashlib, json, struct, sys
from xpuremote.protocol import abi
from xpuremote.protocol.calls import CALLS
from xpuremote.server.backends.cuda import CudaBackend
from xpuremote.server.limits import Accounted, Limits
from xpuremote.server.session import Session

CTX, OTHER_CTX, STREAM, EVENT = 0x7C00_0000_1000, 0x7C00_0000_1100, 0x7C00_0000_2000, 0x7C00_0000_3000
MODULE, SAXPY = 0x7C00_0000_4000, 0x7C00_0000_4010
PTX = sys.argv[1].encode()
backend = Accounted(CudaBackend(), Limits())
session = Session(backend)
session.limits = backend.limits

def op(symbol):
    return CALLS[symbol].opcode

def batch(*calls):
    answer = session.run_batch([[op(s), list(a)] for s, a in calls], True)
    assert answer["status"] == 0, answer
    return answer["outs"]

def record(symbol, args, ctx=CTX, blob=None):
    head = abi.pack_lane_record(opcode=op(symbol), nargs=len(args), blob_at=abi.LANE_NO_BLOB if blob is None else 9,
                                blob_len=len(blob or b""), ctx=ctx)
    return head + struct.pack(f"<{len(args)}Q", *args) + (blob or b"") + bytes(-len(blob or b"") % 8)

def lane(*records, ctx=CTX):
    data = b"".join(r if isinstance(r, bytes) else record(*r, ctx=ctx) for r in records)
    session.run_lane([data, len(data)])

def saxpy(a, x, y, n, func=SAXPY, size=None):
    blob = struct.pack("<f4xQQI", a, x, y, n)
    return record("xpuLaunchKernel", [func, 1, 1, 1, n, 1, 1, 0, STREAM, 0, len(blob) if size is None else size, 0],
                  blob=blob)

def read(address, size):
    return batch(("cuMemcpyDtoH_v2", [size, address, size]))[0]

batch(("cuCtxCreate_v2", [CTX, 0, 0]))
base = int.from_bytes(batch(("cuMemAlloc_v2", [8, 1 << 16]))[0], "little")
spare = int.from_bytes(batch(("cuMemAlloc_v2", [8, 4096]))[0], "little")
batch(("cuStreamCreate", [STREAM, 1]), ("cuEventCreate", [EVENT, 2]))
memset = "cuMemsetD8Async"
# 1,000 memsets on the session's stream and the legacy one, an event record, a wait: the bytes they leave
lane(*[(memset, [base + 64 * (i % 1000), i & 0xFF, 64, (STREAM, 1, 0)[i % 3]]) for i in range(1000)],
     ("cuEventRecord", [EVENT, STREAM]), ("cuStreamWaitEvent", [0, EVENT, 0]),
     *[(memset, [spare, 9, 16, STREAM])] * 2, ("cuEventRecord", [EVENT, STREAM]))  # taught, then run in C
first = read(base, 64000)
# refused, each deferred under its name, the records around them run: a foreign stream, an address outside,
# a value out of a byte's bounds, a range that runs past the allocation's end
lane((memset, [base, 1, 16, 0]), (memset, [base, 2, 16, 0x7C00_0000_9990]), (memset, [0x1000, 3, 16, 0]),
     (memset, [base + 16, 256, 16, 0]), (memset, [base + 65536 - 8, 4, 16, 0]), (memset, [base + 32, 5, 16, 0]))
refusals = [[name, status] for name, status, _ in session.deferred]
session.deferred.clear()
second = read(base, 48)
# what went: the event destroyed, the spare memory freed; then a record of another context
batch(("cuEventDestroy_v2", [EVENT]), ("cuMemFree_v2", [spare]))
lane((memset, [spare, 6, 16, STREAM]), ("cuEventRecord", [EVENT, STREAM]), (memset, [base, 7, 16, STREAM]))
after = [[name, status] for name, status, _ in session.deferred]  # before a batch's answer takes them
session.deferred.clear()
batch(("cuCtxCreate_v2", [OTHER_CTX, 0, 0]))
lane((memset, [base + 48, 8, 16, 0]), ctx=OTHER_CTX)
after += [[name, status] for name, status, _ in session.deferred]
session.deferred.clear()
third = read(base, 64)
# launches: y = 2 + 10 * 3x with x = 1 (a kernel's arguments as the lane's blob); refused: a foreign kernel,
# a size that is not the blob's
batch(("xpuModuleLoad", [MODULE, hashlib.sha256(PTX).digest(), PTX, len(PTX)]),
      ("xpuModuleGetFunction", [SAXPY, MODULE, "saxpy"]))
x, y = base + 4096, base + 8192
lane(("cuMemsetD32Async", [x, 0x3F800000, 256, STREAM]), ("cuMemsetD32Async", [y, 0x40000000, 256, STREAM]),
     *[saxpy(3.0, x, y, 256) for _ in range(10)], saxpy(3.0, x, y, 256, func=0x7C00_0000_4990),
     saxpy(3.0, x, y, 256, size=8))
launches = [[name, status] for name, status, _ in session.deferred]
session.deferred.clear()
ys = struct.unpack("<256f", read(y, 1024))
# more handles than the C side keeps (it empties its table and is taught again): the legacy stream's
# records still run there afterwards
events = [0x7C00_0010_0000 + 16 * i for i in range(600)]
batch(*[("cuEventCreate", [e, 2]) for e in events])
lane(*[("cuEventRecord", [e, 1]) for e in events])
before = native.calls if (native := session.native) else 0
lane(*[(memset, [base + 64 * i, 9, 64, 1]) for i in range(100)])
after_full = (native.calls if native else 0) - before
# memsets over 300 allocations (PyTorch's caching allocator holds many segments): taught once each, then in C
many = [int.from_bytes(batch(("cuMemAlloc_v2", [8, 256]))[0], "little") for _ in range(300)]
lane(*[(memset, [a, i & 0xFF, 256, STREAM]) for i, a in enumerate(many)])
native = session.native
before = native.calls if native else 0
lane(*[(memset, [a, (i + 1) & 0xFF, 256, STREAM]) for i, a in enumerate(reversed(many))])
many_in_c = (native.calls if native else 0) - before
many_bytes = hashlib.sha256(b"".join(read(a, 256) for a in many)).hexdigest()
print(json.dumps({"after_full": after_full, "many_in_c": many_in_c, "many": many_bytes, "first": first.hex(),
                  "refusals": refusals, "second": second.hex(), "after": after, "third": third.hex(),
                  "launches": launches, "y": sorted(set(ys)), "lane_calls": session.lane_calls,
                  "in_c": native.calls if native else 0}))
"""


# y = a * x + y for the first n elements, one thread each (tests/sim_kernels.py is the sim's saxpy)
SAXPY_PTX = (Path(__file__).parent / "programs" / "saxpy.ptx").read_text()


def run_scenario(env: dict[str, str], native: str) -> dict:
    full = {**os.environ, **env, "XPU_NATIVE_LANE": native}
    full.pop("LD_PRELOAD", None)
    proc = subprocess.run([sys.executable, "-c", SCENARIO, SAXPY_PTX], env=full, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_lane_in_c_does_what_the_lane_in_python_does(driver_env: dict[str, str]) -> None:
    in_c, in_python = run_scenario(driver_env, "1"), run_scenario(driver_env, "0")
    assert in_c.pop("after_full") == 99 and in_python.pop("after_full") == 0  # a lane's first record: Python
    assert in_c.pop("many_in_c") == 299 and in_python.pop("many_in_c") == 0  # all but the first: all stay taught
    ran_in_c = in_c.pop("in_c")
    assert ran_in_c >= 990 and in_python.pop("in_c") == 0, ran_in_c  # each ran where it was meant to
    assert in_c == in_python
    expected = b"".join(bytes([i & 0xFF]) * 64 for i in range(1000))
    assert bytes.fromhex(in_c["first"]) == expected
    assert in_c["refusals"] == [["cuMemsetD8Async", 400], ["cuMemsetD8Async", 1], ["cuMemsetD8Async", 1],
                                ["cuMemsetD8Async", 1]]
    assert bytes.fromhex(in_c["second"]) == bytes([1]) * 16 + expected[16:32] + bytes([5]) * 16
    assert in_c["after"] == [["cuMemsetD8Async", 1], ["cuEventRecord", 400]]
    assert bytes.fromhex(in_c["third"])[:16] == bytes([7]) * 16
    assert in_c["launches"] == [["xpuLaunchKernel", 400], ["xpuLaunchKernel", 1]]
    assert in_c["y"] == [32.0]
