"""The record ABI (protocol/records.py) is declared once and every end follows it.

A row of the declarations is changed (the lane record's fields reordered and one added), the generator writes
abi.h and abi.py for it, and the ends are built and run against them: the shim's encoder (interpose/lane.h)
queues a record, the worker's C (server/native_lane.c) runs it, and the worker's Python reader
(protocol/wire.py) decodes it. Each reads what the other wrote, and the same record read with the committed ABI
comes out wrong: nothing depends on the layout except through the generated files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xpuremote.protocol import abi, generate_abi, records
from xpuremote.protocol.cbuild import cc

ROOT = Path(__file__).resolve().parent.parent
CTX, OPCODE, ADDRESS, STREAM, SERVER_STREAM = 0x7C00_0000_1000, 0x1234_5678, 0x7D00_0000_0000, 0x7C00_0000_2000, 0x9000

# The shim's lane and the worker's native lane in one program: a record queued as an application's memset
# would be, then run by the worker's C against a recording driver function; the record's bytes and what the
# driver was called with are printed.
HARNESS = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "abi.h"
static uint64_t xpu_ctx_current(void) { return CTX; }
#include "lane.h"
#include "native_lane.c"

static uint64_t seen[4];
static int driver(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e, uint64_t f, uint64_t g, uint64_t h) {
    seen[0] = a, seen[1] = b, seen[2] = c, seen[3] = d;
    return (int)(e | f | g | h);
}

int main(void) {
    static unsigned char buf[XPU_LANE_BYTES];
    uint64_t slots[12] = {ADDRESS, 7, 256, STREAM}, state[2], at = 0, ran = 0;  /* a launch's room */
    xpu_lane_allow(0, OPCODE, XPU_LANE_PLAIN, 4, -1);
    xpu_lane_context(CTX, 1);
    xpu_lane_set_open(1, -1, 0);
    if (xpu_lane_put(0, slots)) return 2;
    size_t n = xpu_lane_take(buf, state);

    struct xpu_native *native = xpu_native_new();
    uint8_t kind[4] = {XPU_NATIVE_ARG_INT, XPU_NATIVE_ARG_INT, XPU_NATIVE_ARG_INT, XPU_NATIVE_ARG_HANDLE};
    uint8_t family[4] = {0, 0, 0, 5};
    uint64_t max[4] = {UINT64_MAX, 255, UINT64_MAX, 0};
    if (xpu_native_op(native, OPCODE, (void *)driver, XPU_NATIVE_CALL_PLAIN, 4, kind, family, max, 0, 2, 1, -1, -1))
        return 3;
    xpu_native_handle(native, STREAM, 5, SERVER_STREAM);
    xpu_native_range(native, ADDRESS, ADDRESS + 4096);
    uint32_t failed_op[4], failures;
    int32_t status[4];
    xpu_native_run(native, buf, n, &at, CTX, &ran, failed_op, status, 4, &failures);
    printf("{\"record\": \"");
    for (size_t i = 0; i < n; i++) printf("%02x", buf[i]);
    printf("\", \"head\": %zu, \"ran\": %llu, \"seen\": [%llu, %llu, %llu, %llu]}\n", sizeof(struct xpu_lane_record),
           (unsigned long long)ran, (unsigned long long)seen[0], (unsigned long long)seen[1],
           (unsigned long long)seen[2], (unsigned long long)seen[3]);
    return 0;
}
"""

# The worker's Python reader with a given abi.py in place of the committed one.
DECODE = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("xpuremote.protocol.abi", sys.argv[1])
abi = importlib.util.module_from_spec(spec)
spec.loader.exec_module(abi)
import xpuremote.protocol
sys.modules["xpuremote.protocol.abi"] = xpuremote.protocol.abi = abi
from xpuremote.protocol import wire
try:
    opcode, ctx, args, at = wire.lane_record(memoryview(bytes.fromhex(sys.argv[2])), 0)
except wire.WireError as exc:
    print(json.dumps({"error": str(exc)}))
else:
    print(json.dumps({"opcode": opcode, "ctx": ctx, "args": args, "at": at}))
"""

# The changed row: the context first, and a field more (the head grows from 24 to 32 bytes).
CHANGED = ("the lane record, rearranged by tests/test_abi.py", (
    ("ctx", "u64"), ("opcode", "u32"), ("nargs", "u8"), ("scalar_size", "u8"), ("blob_at", "u16"), ("blob_len", "u32"),
    ("scalars", "u32"), ("spare", "u64")))


def write_abi(folder: Path, lane_record: tuple | None = None) -> Path:
    declared = dict(records.RECORDS)
    if lane_record:
        declared["lane_record"] = lane_record
    header, module = generate_abi.emit(records.LIMITS, records.ENUMS, declared, records.TABLES, abi.DRIVER_OPS,
                                            abi.LIBRARY_OPS)
    folder.mkdir()
    (folder / "abi.h").write_text(header)
    (folder / "abi.py").write_text(module)
    return folder


def run_ends(tmp: Path, folder: Path) -> dict:
    """The C ends built against `folder`'s abi.h, run: the record they made and what the driver was given."""
    source = tmp / "harness.c"
    source.write_text(HARNESS)
    binary = folder / "harness"
    defines = [f"-D{k}={v}ull" for k, v in (("CTX", CTX), ("OPCODE", OPCODE), ("ADDRESS", ADDRESS),
                                          ("STREAM", STREAM), ("SERVER_STREAM", SERVER_STREAM))]
    subprocess.run([*cc(), "-O1", "-Wall", "-Werror", "-Wno-unused-function", f"-I{folder}",
                    f"-I{ROOT / 'interpose'}", f"-I{ROOT / 'server'}", *defines, str(source), "-o", str(binary),
                    "-lpthread"], check=True, capture_output=True, text=True)
    return json.loads(subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout)


def decode(folder: Path, record: str) -> dict:
    out = subprocess.run([sys.executable, "-c", DECODE, str(folder / "abi.py"), record], check=True,
                         capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_the_committed_abi_is_what_the_declarations_give() -> None:
    header, module = generate_abi.emit(records.LIMITS, records.ENUMS, records.RECORDS, records.TABLES, abi.DRIVER_OPS,
                                       abi.LIBRARY_OPS)
    assert (ROOT / "protocol" / "abi.h").read_text() == header
    assert (ROOT / "protocol" / "abi.py").read_text() == module


def test_a_changed_row_reaches_the_shim_and_both_ends_of_the_worker(tmp_path: Path) -> None:
    expected = {"opcode": OPCODE, "ctx": CTX, "args": [ADDRESS, 7, 256, STREAM]}
    committed, changed = write_abi(tmp_path / "committed"), write_abi(tmp_path / "changed", CHANGED)
    for folder, head in ((committed, 24), (changed, 32)):
        ends = run_ends(tmp_path, folder)
        assert ends["head"] == head
        assert len(ends["record"]) == 2 * (head + 4 * 8)
        assert ends["ran"] == 1 and ends["seen"] == [ADDRESS, 7, 256, SERVER_STREAM]  # the worker's C read it
        assert decode(folder, ends["record"]) == {**expected, "at": head + 4 * 8}  # and the worker's Python
    # Only one end following the change: the committed reader misreads the changed shim's record.
    misread = decode(committed, run_ends(tmp_path, changed)["record"])
    assert {k: misread.get(k) for k in expected} != expected


def test_a_name_given_twice_is_refused() -> None:
    limits = {**records.LIMITS, "LANE_RECORD_SIZE": (1, "a clash")}
    with pytest.raises(SystemExit, match="LANE_RECORD_SIZE"):
        generate_abi.emit(limits, records.ENUMS, records.RECORDS, records.TABLES, abi.DRIVER_OPS, abi.LIBRARY_OPS)
