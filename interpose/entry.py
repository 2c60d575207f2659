"""The Python side of the shim: connects the C entry points to the client's driver.

Imported by the client core's init code (interpose/core.c, in an interpreter of its own) with the
core's cffi module."""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from xpuremote.client import call_cpu, connection, driver, integrity, kept_in_c, mathlibs, nvml, trace
from xpuremote.client.lane import Lane
from xpuremote.protocol import abi, errors, logs
from xpuremote.protocol.calls import CALLS, LIBRARY_SYMBOLS, SYMBOLS
from xpuremote.protocol.mathlibs import LIBRARIES

log = logging.getLogger("xpuremote.client")


class ShimContexts(driver.ContextStack):
    """The per-thread context stack kept in C, where the runtime's private tables read it."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def current(self) -> int:
        return self.lib.xpu_ctx_current()

    def set_current(self, ctx: int) -> None:
        self.lib.xpu_ctx_set_current(ctx)

    def push(self, ctx: int) -> None:
        if self.lib.xpu_ctx_push(ctx):
            raise errors.CudaError(errors.INVALID_VALUE, "context stack is full")

    def pop(self) -> int:
        return self.lib.xpu_ctx_pop()

    def release(self, ctx: int) -> None:
        self.lib.xpu_cls_release(ctx)


def primary_context(ffi: Any, slots: Any) -> int:
    """CUDART_INTERFACE slot 2: the primary context of a device, not made current."""
    d = driver.DRIVER
    d.connect()
    out, dev = slots[0], int(ffi.cast("int", slots[1]))
    if not out:
        return errors.INVALID_VALUE
    d.device(dev)
    ffi.cast("uint64_t *", out)[0] = d.primaries[dev].handle
    return 0


def context_kind(ffi: Any, slots: Any) -> int:
    """CONTEXT_CHECKS slot 2: 1 for a green context's CUcontext, 0 for any other (the current one for 0)."""
    d = driver.DRIVER
    ctx = d.ctxs.get(slots[0] or d.contexts.current())
    ffi.cast("uint32_t *", slots[1])[0] = int(bool(ctx is not None and ctx.green))
    return 0


def integrity_check(ffi: Any, slots: Any) -> int:
    d = driver.DRIVER
    d.connect()
    version, seconds, out, cudart_table, integrity_table, function = (slots[i] for i in range(6))
    devices = [integrity.DeviceId(dev.uuid, *dev.pci) for dev in d.devices]
    answer = integrity.integrity_answer(
        version, seconds, driver_version=d.driver_version, pid=os.getpid(), thread=threading.get_ident(),
        cudart_table=cudart_table, integrity_table=integrity_table, function=function, devices=devices)
    ffi.memmove(ffi.cast("uint8_t *", out), answer, 16)
    return 0


def unknown_slot(ffi: Any, slots: Any) -> int:
    table = ffi.string(ffi.cast("char *", slots[0])).decode()
    driver.DRIVER.say_once(f"{table}{slots[1]}", "the runtime called slot %d of private table %s, "
                           "which xpuremote does not implement", slots[1], table)
    return errors.NOT_SUPPORTED


# Tables the runtimes from 12.9 on (to 13.5) ask for and go on without: said at INFO only (12.4 to 12.8 do not ask);
# and the compilers' one.
OPTIONAL_TABLES = {
    # slot 1: a log function (domain, severity, format, va_list); 13.x also calls slot 2 with 0 or 1
    # around some device queries. Without the table the runtime skips both.
    "f8cff951-2146-8b4e-b9e2-fb469e7c0dd9": "the runtime's optional driver-log table",
    # asked by the host-only compilers NVRTC and nvJitLink 13, which compile and link without it (tests/test_nvrtc.py)
    "da9151d3-3ae6-cc41-a5c0-4f26d533e328": "NVRTC's and nvJitLink's optional table",
}


def unknown_table(ffi: Any, slots: Any) -> int:
    """A refused cuGetExportTable: said once per table, naming the library that asked."""
    uuid = bytes(ffi.buffer(ffi.cast("char *", slots[0]), 16)).hex()
    name = f"{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}"
    library = ffi.string(ffi.cast("char *", slots[1])).decode(errors="replace") or "a library"
    if name in OPTIONAL_TABLES:
        driver.DRIVER.say_once(f"table {name}", "%s asked for private table %s (%s); xpuremote has none and it "
                               "goes on without it", library, name, OPTIONAL_TABLES[name], level=logging.INFO)
    else:
        driver.DRIVER.say_once(f"table {name}", "%s asked for private table %s, which xpuremote does not "
                               "implement (it fails to initialise if it needs it)", library, name)
    return errors.INVALID_VALUE


# The questions answered in C (answers.h), by symbol.
ASKED = {"cuCtxGetCurrent": abi.ASK_CURRENT, "cuCtxGetDevice": abi.ASK_DEVICE, "cuCtxGetDevice_v2": abi.ASK_DEVICE_OF,
         "cuDevicePrimaryCtxGetState": abi.ASK_PRIMARY_STATE, "cuStreamIsCapturing": abi.ASK_STREAM_CAPTURING,
         "cuStreamIsCapturing_ptsz": abi.ASK_STREAM_CAPTURING}
# Calls after which the C side's table of contexts and primary contexts is set again.
CONTEXT_FAMILIES = frozenset({
    "cuInit", "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset",
    "cuDevicePrimaryCtxSetFlags", "cuCtxCreate", "cuCtxDestroy", "cuCtxSetFlags", "cuGreenCtxCreate",
    "cuGreenCtxDestroy"})


def publishing(handle: Callable[[Any], int], ffi: Any, lib: Any, d: driver.Driver) -> Callable[[Any], int]:
    """`handle`, then the C side's table set again: for the calls that make, end or change a context."""
    def run(slots: Any) -> int:
        status = handle(slots)
        publish_contexts(ffi, lib, d)
        return status
    return run


def publish_contexts(ffi: Any, lib: Any, d: driver.Driver) -> None:
    """The C side's table (answers.h): each context's device, each device's primary context state."""
    contexts = list(d.ctxs.items())
    lib.xpu_known_set(ffi.new("uint64_t[]", [h for h, _ in contexts] or [0]),
                      ffi.new("int[]", [c.device for _, c in contexts] or [0]), len(contexts),
                      ffi.new("unsigned[]", [p.flags for p in d.primaries] or [0]),
                      ffi.new("int[]", [int(p.retains > 0) for p in d.primaries] or [0]), len(d.primaries))


def setup_logging() -> None:
    level = logs.level("WARNING")
    logger = logging.getLogger("xpuremote")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("xpuremote: %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)


def install(ffi: Any, lib: Any) -> None:
    setup_logging()
    table = driver.handlers()
    count = lib.xpu_symbol_count()
    if count != abi.DRIVER_OPS or len(SYMBOLS) != count:  # a shim built from another generator run
        raise RuntimeError(f"the shim has {count} driver entry points where protocol/abi.py says {abi.DRIVER_OPS}: "
                           "rebuild it (python -m xpuremote.interpose.build)")
    nvml_table = nvml.handlers()  # ops after the internal ones: the libnvidia-ml.so.1 forwarder's
    library_tables = mathlibs.handlers()  # ops from XPU_OP_LIBRARY on: the math libraries', 1 << 16 each
    d = driver.DRIVER
    d.contexts = ShimContexts(lib)
    d.lane = Lane(ffi, lib)
    mathlibs.IN_C = kept_in_c.KeptInC(ffi, lib)
    mathlibs.IN_C.mark()
    d.state["requested_version"] = lib.xpu_requested_version
    for op, symbol in enumerate(SYMBOLS):
        if CALLS[symbol].releases:  # what the C side answers with success after the session
            lib.xpu_mark_release(op)
        if symbol in ASKED:
            lib.xpu_mark_ask(op, ASKED[symbol])
        if CALLS[symbol].family in CONTEXT_FAMILIES:  # wrapped here, so other calls pay nothing for it
            table[op] = publishing(table[op], ffi, lib, d)
    if call_cpu.wanted():
        table = [call_cpu.timed(symbol, h) for symbol, h in zip(SYMBOLS, table)]
        library_tables = [[call_cpu.timed(symbol, h) for symbol, h in zip(LIBRARY_SYMBOLS[library.name], handlers)]
                          for library, handlers in zip(LIBRARIES, library_tables)]

    def exiting(ffi: Any, slots: Any) -> int:  # C's exit(): the core's interpreter never finalizes
        publish_contexts(ffi, lib, d)  # what the C side answers a teardown's cuCtxGetDevice with
        lib.xpu_set_finalized()
        for conn in d.sessions:
            conn.close()
        trace.stop()
        call_cpu.write()
        return 0

    internal = {abi.OP_PRIMARY_CTX: primary_context, abi.OP_INTEGRITY: integrity_check,
                abi.OP_UNKNOWN_SLOT: unknown_slot, abi.OP_EXIT: exiting, abi.OP_UNKNOWN_TABLE: unknown_table,
                abi.OP_CONTEXT_KIND: context_kind}
    assert sorted(internal) == list(range(abi.OP_NVML)), "protocol/records.py's OP enum: a core op without a handler"

    @ffi.def_extern(error=errors.UNKNOWN)
    def xpu_dispatch(op: int, slots: Any) -> int:
        if op < count:
            return table[op](slots)
        op -= count
        if op < abi.OP_NVML:
            return internal[op](ffi, slots)
        if op >= abi.OP_LIBRARY:
            op -= abi.OP_LIBRARY
            return library_tables[op >> abi.OP_LIBRARY_SHIFT][op & ((1 << abi.OP_LIBRARY_SHIFT) - 1)](slots)
        return nvml_table[op - abi.OP_NVML](slots)

    connection.native_thread_init = lib.xpu_thread_init
    # The call table and the modules live as long as the process: a full collection walked all of them (about
    # 50,000 objects, 20 ms here), in the middle of whichever application call allocated last.
    gc.freeze()
    lib.xpu_set_python_ready()
    log.debug("shim ready at %.3f", time.monotonic())
