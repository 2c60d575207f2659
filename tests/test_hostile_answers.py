"""A hostile server's answers: the client writes no output past what the call asked for.

The server here is a fake one: a ZeroMQ ROUTER in this process that speaks the real protocol (protocol/wire.py)
as the daemon and the worker at once (hello, init, calls, bye). It answers every call as an honest server does,
and tampers with the answers a test names: more bytes than asked, fewer, or a value of another type, to a
sized output (cuMemcpyDtoH), scalar outputs (cuMemAlloc's pointer, cuCtxGetStreamPriorityRange's ints), a
deferred copy into pinned memory, a graph launch's copy to the host, and the inventory (uuid, name,
attributes, PCI ids, sizes). The application is the real client in this process: its driver (client/driver.py)
called as the shim calls it, returning the CUresult the shim would, into buffers followed by canaries. One case
runs a real program under the shim, with the answer that made it die with SIGSEGV.
"""

from __future__ import annotations

import json
import logging
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from conftest import shim_env

from xpuremote.client import driver, marshal
from xpuremote.client.marshal import ffi
from xpuremote.protocol import errors, wire
from xpuremote.protocol.calls import BY_OPCODE, CALLS, Call
from xpuremote.protocol.cuda_api import ENUMS
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.layouts import MEMCPY3D
from xpuremote.server.backends.sim import SimBackend

CANARY = b"\xa5" * 64  # just past each output buffer: no answer may touch it
BEFORE = 0x11  # what an output buffer holds before the call: a refused answer leaves it
HONEST = 0x5A  # the bytes of an honest answer
UNKNOWN = errors.UNKNOWN
HOST, DEVICE = ENUMS["CU_MEMORYTYPE_HOST"], ENUMS["CU_MEMORYTYPE_DEVICE"]

Tamper = Callable[[list[Any]], Any]


def honest_inventory() -> dict[str, Any]:
    """The sim's inventory, as it comes off the wire."""
    answer = {"op": "reply", "status": 0, **SimBackend(1).inventory().to_wire(), "max_request_bytes": 0}
    return wire.decode(wire.encode(answer))


class FakeServer:
    """A fake xpuremote server (daemon and worker on one ROUTER socket) that answers each sync call honestly,
    unless `tamper[symbol]` rewrites its outputs, and sends `inventory` as its answer to init."""

    def __init__(self, inventory: dict[str, Any] | None = None) -> None:
        self.inventory = inventory or honest_inventory()
        self.tamper: dict[str, Tamper] = {}
        self.errors: list[str] = []
        self.rides = True  # answers a batch's `answers` (client/connection.py's riders); False: a server before them
        self.address_seed = 0x7F00_0000_0000
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.ctx.destroy(0)

    def _serve(self) -> None:
        while not self.stopped.is_set():
            if not self.sock.poll(50):
                continue
            identity, *frames = self.sock.recv_multipart()
            try:
                answer = self._answer(wire.decode(frames))
            except Exception as exc:  # said by the test that made it (errors), never a silent end of the server
                self.errors.append(f"{type(exc).__name__}: {exc}")
                answer = {"op": "reply", "status": errors.UNKNOWN, "error": "the fake server failed"}
            if answer is not None:
                self.sock.send_multipart([identity, *wire.encode(answer)])

    def _answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        reply = {"op": "reply", "status": 0}
        if message["op"] == "hello":  # a key of its own: the worker's ROUTER tells sessions apart by it
            return {**reply, "worker": self.address, "session": "fake", "key": secrets.token_bytes(wire.KEY_BYTES)}
        if message["op"] == "init":
            return {**self.inventory, "op": "reply"}
        if message["op"] != "calls":
            return reply  # bye
        if not message.get("reply"):
            return None
        answer = {**reply, "seq": message["seq"], "outs": self._outs(*message["calls"][-1])}  # its last call's
        if "answers" in message and self.rides:  # and those of the calls whose answers ride with it
            answer["answers"] = [[i, 0, self._outs(*message["calls"][i])] for i in message["answers"]]
        return answer

    def _outs(self, opcode: int, args: list[Any]) -> list[Any]:
        call = BY_OPCODE[opcode]
        outs = self.honest(call, args)
        tamper = self.tamper.get(call.symbol)
        return tamper(outs) if tamper else outs

    def honest(self, call: Call, args: list[Any]) -> list[Any]:
        """Each output as a server answers it: an address or a handle for a pointer, else HONEST bytes, as many
        as the call asked for."""
        outs: list[Any] = []
        for p, asked in zip(call.params, args):
            if p.direction == "in":
                continue
            if asked is None:
                outs.append(None)
            elif p.count is None and p.pointee_size == 8 and p.pointee in ("handle", "int"):
                self.address_seed += 0x10000
                outs.append(self.address_seed.to_bytes(8, "little"))
            else:
                outs.append(bytes([HONEST]) * (p.pointee_size if p.count is None else asked))
        return outs


class Buffer:
    """Application memory: `size` bytes of BEFORE, then the canary."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.memory = ffi.new("char[]", bytes([BEFORE]) * size + CANARY)
        self.address = int(ffi.cast("uintptr_t", self.memory))

    def value(self) -> bytes:
        return ffi.buffer(self.memory, self.size)[:]

    def canary(self) -> bytes:
        return ffi.buffer(self.memory, self.size + len(CANARY))[self.size:]

    def untouched(self) -> bool:
        return self.value() == bytes([BEFORE]) * self.size and self.canary() == CANARY


class App:
    """An application on the real client, in this process: each call goes through the handler the shim calls,
    and returns the CUresult the shim would."""

    def __init__(self, server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("XPU_SERVER", server.address)
        monkeypatch.setenv("XPU_CONNECT_TIMEOUT_S", "5")
        self.driver = driver.Driver()
        monkeypatch.setattr(driver, "DRIVER", self.driver)

    def __call__(self, symbol: str, *args: int) -> int:
        return driver.handler(CALLS[symbol])(list(args))

    def start(self) -> None:
        """cuInit and a context of its own."""
        ctx = Buffer(8)
        assert self("cuInit", 0) == 0
        assert self("cuCtxCreate_v2", ctx.address, 0, 0) == 0

    def alloc(self, size: int) -> int:
        out = Buffer(8)
        assert self("cuMemAlloc_v2", out.address, size) == 0
        return int.from_bytes(out.value(), "little")

    def close(self) -> None:
        if self.driver.conn is not None:
            self.driver.conn.close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    srv = FakeServer()
    yield srv
    srv.close()
    assert not srv.errors, srv.errors


@pytest.fixture
def app(server: FakeServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[App]:
    driver.handlers()  # the implementations register themselves
    application = App(server, monkeypatch)
    yield application
    application.close()


def refused_in_log(caplog: pytest.LogCaptureFixture, symbol: str, name: str) -> bool:
    return any(r.levelno == logging.ERROR and symbol in r.getMessage() and name in r.getMessage()
               for r in caplog.records)


# The ways an answer's outputs may be wrong, given the honest ones: `which` is the output tampered with.
def oversized(which: int) -> Tamper:
    return lambda outs: [o + CANARY if i == which else o for i, o in enumerate(outs)]


def undersized(which: int) -> Tamper:
    return lambda outs: [o[: len(o) // 2] if i == which else o for i, o in enumerate(outs)]


def retyped(which: int, value: Any) -> Tamper:
    return lambda outs: [value if i == which else o for i, o in enumerate(outs)]


ILL_SHAPED: dict[str, Tamper] = {
    "missing": lambda outs: [],
    "one too many": lambda outs: [*outs, b"\0" * 8],
    "not a list": lambda outs: {"outs": outs},
}


def wrong_answers(outputs: int) -> dict[str, Tamper]:
    """Every wrong answer to a call with `outputs` outputs, by name."""
    cases = dict(ILL_SHAPED)
    for which in range(outputs):
        cases |= {f"{which}: oversized": oversized(which), f"{which}: undersized": undersized(which),
                  f"{which}: an integer": retyped(which, 0x4141), f"{which}: text": retyped(which, "A" * 64),
                  f"{which}: a list": retyped(which, [0x41] * 64), f"{which}: nothing": retyped(which, None)}
    return cases


@pytest.mark.parametrize("case", wrong_answers(1))
def test_a_sized_output_takes_only_the_bytes_asked_for(app: App, server: FakeServer, case: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """cuMemcpyDtoH of 8 bytes: a wrong answer fails the call (CUDA_ERROR_UNKNOWN, logged naming the call)
    and writes nothing, canary included; the same call answered honestly then writes its 8 bytes."""
    app.start()
    src, dst = app.alloc(8), Buffer(8)
    server.tamper["cuMemcpyDtoH_v2"] = wrong_answers(1)[case]
    assert app("cuMemcpyDtoH_v2", dst.address, src, 8) == UNKNOWN
    assert dst.untouched()
    assert refused_in_log(caplog, "cuMemcpyDtoH_v2", "refused")
    del server.tamper["cuMemcpyDtoH_v2"]
    assert app("cuMemcpyDtoH_v2", dst.address, src, 8) == 0
    assert dst.value() == bytes([HONEST]) * 8 and dst.canary() == CANARY


@pytest.mark.parametrize("case", wrong_answers(1))
def test_a_pointer_output_takes_only_its_8_bytes(app: App, server: FakeServer, case: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """cuMemAlloc's CUdeviceptr: a wrong answer fails the call and leaves the application's slot as it was."""
    app.start()
    slot = Buffer(8)
    server.tamper["cuMemAlloc_v2"] = wrong_answers(1)[case]
    assert app("cuMemAlloc_v2", slot.address, 64) == UNKNOWN
    assert slot.untouched()
    assert refused_in_log(caplog, "cuMemAlloc_v2", "refused")
    del server.tamper["cuMemAlloc_v2"]
    assert app("cuMemAlloc_v2", slot.address, 64) == 0
    assert int.from_bytes(slot.value(), "little") == server.address_seed and slot.canary() == CANARY


@pytest.mark.parametrize("case", wrong_answers(2))
def test_int_outputs_take_4_bytes_and_a_wrong_one_writes_neither(app: App, server: FakeServer, case: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """cuCtxGetStreamPriorityRange's two ints: whichever is wrong, neither is written."""
    app.start()
    least, greatest = Buffer(4), Buffer(4)
    server.tamper["cuCtxGetStreamPriorityRange"] = wrong_answers(2)[case]
    assert app("cuCtxGetStreamPriorityRange", least.address, greatest.address) == UNKNOWN
    assert least.untouched() and greatest.untouched()
    assert refused_in_log(caplog, "cuCtxGetStreamPriorityRange", "refused")
    del server.tamper["cuCtxGetStreamPriorityRange"]
    assert app("cuCtxGetStreamPriorityRange", least.address, greatest.address) == 0
    assert least.value() == greatest.value() == bytes([HONEST]) * 4
    assert least.canary() == greatest.canary() == CANARY


class Pinned:
    """Page-locked memory of the application's (cuMemAllocHost): `size` bytes of BEFORE, then the canary."""

    def __init__(self, app: App, size: int) -> None:
        out = Buffer(8)
        assert app("cuMemAllocHost_v2", out.address, size + len(CANARY)) == 0
        self.address, self.size = int.from_bytes(out.value(), "little"), size
        ffi.memmove(ffi.cast("char *", self.address), bytes([BEFORE]) * size + CANARY, size + len(CANARY))

    def value(self) -> bytes:
        return ffi.buffer(ffi.cast("char *", self.address), self.size)[:]

    def untouched(self) -> bool:
        whole = ffi.buffer(ffi.cast("char *", self.address), self.size + len(CANARY))[:]
        return whole == bytes([BEFORE]) * self.size + CANARY


@pytest.mark.parametrize("case", ["0: oversized", "0: undersized", "0: text", "missing"])
def test_a_deferred_copy_into_pinned_memory_takes_only_its_bytes(app: App, server: FakeServer, case: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """cuMemcpyDtoHAsync into pinned memory is answered later: a wrong answer writes nothing, and the next
    synchronisation fails, naming the copy."""
    app.start()
    src, pinned = app.alloc(4096), Pinned(app, 4096)
    server.tamper["cuMemcpyDtoHAsync_v2"] = wrong_answers(1)[case]
    assert app("cuMemcpyDtoHAsync_v2", pinned.address, src, 4096, 0) == 0
    assert app("cuStreamSynchronize", 0) == UNKNOWN
    assert pinned.untouched()
    assert refused_in_log(caplog, "cuMemcpyDtoHAsync_v2", "refused")
    assert app("cuStreamSynchronize", 0) == 0  # said once; the session goes on
    del server.tamper["cuMemcpyDtoHAsync_v2"]
    assert app("cuMemcpyDtoHAsync_v2", pinned.address, src, 4096, 0) == 0
    assert app("cuStreamSynchronize", 0) == 0
    assert pinned.value() == bytes([HONEST]) * 4096


def test_a_copy_whose_answer_should_ride_but_does_not_fails_the_next_wait(app: App, server: FakeServer,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A server that answers a batch without the answers riding with it (one before them, or a broken one): the
    copy into pinned memory writes nothing and the synchronisation after it fails, naming the copy."""
    app.start()
    src, pinned = app.alloc(64), Pinned(app, 64)
    server.rides = False
    assert app("cuMemcpyDtoHAsync_v2", pinned.address, src, 64, 0) == 0
    assert app("cuStreamSynchronize", 0) == UNKNOWN
    assert pinned.untouched()
    assert "cuMemcpyDtoHAsync_v2" in caplog.text and "did not carry its outputs" in caplog.text
    server.rides = True
    assert app("cuMemcpyDtoHAsync_v2", pinned.address, src, 64, 0) == 0
    assert app("cuStreamSynchronize", 0) == 0
    assert pinned.value() == bytes([HONEST]) * 64


@pytest.mark.parametrize("case", ["0: oversized", "0: undersized", "0: an integer"])
def test_a_graph_launch_copy_to_the_host_takes_only_its_bytes(app: App, server: FakeServer, case: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A graph's copy node from the device to host memory: its host half comes back after the launch (a deferred
    answer, xpuMemcpy2DToHost); a wrong one writes nothing and fails the next synchronisation."""
    app.start()
    size, src, host = 256, app.alloc(256), Buffer(256)
    graph, node, graph_exec = Buffer(8), Buffer(8), Buffer(8)
    assert app("cuGraphCreate", graph.address, 0) == 0
    graph_handle = int.from_bytes(graph.value(), "little")
    params = Buffer(MEMCPY3D.size)
    ffi.memmove(params.memory, MEMCPY3D.pack(0, 0, 0, 0, DEVICE, 0, src, 0, size, 1,
                                             0, 0, 0, 0, HOST, host.address, 0, 0, size, 1, size, 1, 1), MEMCPY3D.size)
    assert app("cuGraphAddMemcpyNode", node.address, graph_handle, 0, 0, params.address,
               app.driver.contexts.current()) == 0
    assert app("cuGraphInstantiateWithFlags", graph_exec.address, graph_handle, 0) == 0
    server.tamper["xpuMemcpy2DToHost"] = wrong_answers(1)[case]
    assert app("cuGraphLaunch", int.from_bytes(graph_exec.value(), "little"), 0) == 0
    assert app("cuStreamSynchronize", 0) == UNKNOWN
    assert host.untouched()
    assert refused_in_log(caplog, "xpuMemcpy2DToHost", "refused")
    del server.tamper["xpuMemcpy2DToHost"]
    assert app("cuGraphLaunch", int.from_bytes(graph_exec.value(), "little"), 0) == 0
    assert app("cuStreamSynchronize", 0) == 0
    assert host.value() == bytes([HONEST]) * size and host.canary() == CANARY


def _device(field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(inventory: dict[str, Any]) -> None:
        inventory["devices"][0][field] = value
    return change


def _attribute(value: Any) -> Callable[[dict[str, Any]], None]:
    def change(inventory: dict[str, Any]) -> None:
        inventory["devices"][0]["attributes"][ENUMS["CU_DEVICE_ATTRIBUTE_WARP_SIZE"]] = value
    return change


BAD_INVENTORIES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "uuid oversized": (_device("uuid", bytes(16) + CANARY), "uuid"),
    "uuid undersized": (_device("uuid", bytes(8)), "uuid"),
    "uuid as text": (_device("uuid", "A" * 16), "uuid"),
    "name too long": (_device("name", "A" * 4096), "name"),
    "name not text": (_device("name", b"A" * 16), "name"),
    "attribute not an int": (_attribute("32"), "attributes"),
    "attribute over 32 bits": (_attribute(1 << 40), "attributes"),
    "attribute key not an int": (_device("attributes", {"1": 2}), "attributes"),
    "pci of two parts": (_device("pci", [0, 16]), "pci"),
    "pci bus over a byte": (_device("pci", [0, 4096, 0]), "pci"),
    "memory negative": (_device("total_mem", -1), "total_mem"),
    "memory as text": (_device("total_mem", "16G"), "total_mem"),
    "sm as a float": (_device("sm", 9.0), "sm"),
    "refused not a list": (_device("refused", 5), "refused"),
    "driver version as text": (lambda inv: inv.update(driver_version="13000"), "driver_version"),
    "devices not a list": (lambda inv: inv.update(devices={"0": {}}), "devices"),
    "a device not a map": (lambda inv: inv.update(devices=[[1, 2]]), "devices[0]"),
}


@pytest.mark.parametrize("case", BAD_INVENTORIES)
def test_a_bad_inventory_fails_cuinit_and_writes_nothing(server: FakeServer, monkeypatch: pytest.MonkeyPatch,
                                                          case: str, caplog: pytest.LogCaptureFixture) -> None:
    """A field of the inventory that the client would copy into the application, of the wrong type or size:
    cuInit fails (CUDA_ERROR_UNKNOWN) saying which field, and nothing of the device is written after. The same
    server's honest inventory first, as the control: each field written at its size."""
    driver.handlers()
    app = App(server, monkeypatch)
    try:
        honest_inventory_is_written_at_its_sizes(app, server)
    finally:
        app.close()
    change, field = BAD_INVENTORIES[case]
    change(server.inventory)
    app = App(server, monkeypatch)
    try:
        assert app("cuInit", 0) == UNKNOWN
        assert any(field in r.getMessage() and "inventory" in r.getMessage() and r.levelno == logging.ERROR
                   for r in caplog.records), caplog.text
        uuid, name, value, count = Buffer(16), Buffer(64), Buffer(4), Buffer(4)
        assert app("cuDeviceGetUuid_v2", uuid.address, 0) != 0
        assert app("cuDeviceGetName", name.address, 64, 0) != 0
        assert app("cuDeviceGetAttribute", value.address, ENUMS["CU_DEVICE_ATTRIBUTE_WARP_SIZE"], 0) != 0
        assert app("cuDeviceGetCount", count.address) != 0
        assert all(b.untouched() for b in (uuid, name, value, count))
    finally:
        app.close()


def honest_inventory_is_written_at_its_sizes(app: App, server: FakeServer) -> None:
    """The uuid takes its 16 bytes, the name its NUL-terminated text, an attribute 4 bytes."""
    app.start()
    uuid, name, value = Buffer(16), Buffer(256), Buffer(4)
    assert app("cuDeviceGetUuid_v2", uuid.address, 0) == 0
    assert uuid.value() == server.inventory["devices"][0]["uuid"] and uuid.canary() == CANARY
    assert app("cuDeviceGetName", name.address, 256, 0) == 0
    assert name.value().split(b"\0")[0] == server.inventory["devices"][0]["name"].encode()
    warp = ENUMS["CU_DEVICE_ATTRIBUTE_WARP_SIZE"]
    assert app("cuDeviceGetAttribute", value.address, warp, 0) == 0
    assert int.from_bytes(value.value(), "little") == 32 and value.canary() == CANARY


# ---- a real program under the shim ------------------------------------------------------------------------
PROGRAM = r"""
import ctypes, json
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
cu = ctypes.CDLL("libcuda.so.1")
CANARY = b"\xa5" * 64
out = {"init": cu.cuInit(0)}
if out["init"] == 0:
    dev, ctx, ptr = c_int(), c_void_p(), c_uint64()
    assert cu.cuDeviceGet(byref(dev), 0) == 0 and cu.cuCtxCreate_v2(byref(ctx), 0, dev) == 0
    assert cu.cuMemAlloc_v2(byref(ptr), c_size_t(8)) == 0
    dst = ctypes.create_string_buffer(b"\x11" * 8 + CANARY, 8 + len(CANARY))
    out["copy"] = cu.cuMemcpyDtoH_v2(dst, ptr, c_size_t(8))
    out["copy_untouched"] = dst.raw == b"\x11" * 8 + CANARY
uuid = ctypes.create_string_buffer(b"\x11" * 16 + CANARY, 16 + len(CANARY))
out["uuid"] = cu.cuDeviceGetUuid(uuid, 0)
out["uuid_canary"] = uuid.raw[16:] == CANARY
print(json.dumps(out), flush=True)
"""


def run_program(server: FakeServer, shim: Path) -> subprocess.CompletedProcess:
    """PROGRAM under the shim against `server`, which is closed after; it must exit cleanly."""
    try:
        run = subprocess.run([sys.executable, "-c", PROGRAM], env=shim_env(shim, server.address),
                             capture_output=True, text=True, timeout=60)
    finally:
        server.close()
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def test_a_program_under_the_shim_survives_the_answers_that_crashed_it(shim: Path) -> None:
    """The reproduction of the defect: an 8-byte cuMemcpyDtoH answered with 8 + 4096 bytes, and a 4096-byte
    uuid, killed the program with SIGSEGV. Now the copy fails, the inventory fails cuInit saying why, and the
    program's canaries are intact."""
    server = FakeServer()
    server.tamper["cuMemcpyDtoH_v2"] = lambda outs: [outs[0] + b"\xee" * 4096]
    run = run_program(server, shim)
    result = json.loads(run.stdout)
    assert result == {"init": 0, "copy": UNKNOWN, "copy_untouched": True, "uuid": 0, "uuid_canary": True}, \
        run.stderr[-3000:]
    assert "cuMemcpyDtoH_v2" in run.stderr and "refused" in run.stderr

    inventory = honest_inventory()
    inventory["devices"][0]["uuid"] = b"\xee" * 4096
    run = run_program(FakeServer(inventory), shim)
    result = json.loads(run.stdout)
    assert result["init"] == UNKNOWN and result["uuid"] != 0 and result["uuid_canary"]
    assert "devices[0].uuid is bytes of 4096, not 16 bytes" in run.stderr


def test_an_array_a_library_fills_takes_whole_elements_up_to_the_size_asked() -> None:
    """cuDNN's dimensions (and cuBLASLt's algorithms, an attribute's bytes) are filled up to the size asked:
    fewer whole elements are written as they came (the rest of the application's array stays as it was, as the
    library leaves it); more, or a part of an element, are refused. Through marshal.checked, as every sync
    answer is, with the call's wire arguments as the client packs them."""
    call = CALLS["cudnnGetTensorNdDescriptor"]  # (desc, nbDimsRequested, dataType, nbDims, dimA, strideA)
    asked = [0x7C00_0000_2000, 8, 4, 4, 32, 32]
    honest = [b"\0" * 4, b"\0" * 4, b"\1" * 16, b"\1" * 16]
    assert marshal.checked(call, asked, honest) is honest
    for dims in (b"\1" * 36, b"\1" * 18, "A" * 16, 16):
        with pytest.raises(CudaError) as raised:
            marshal.checked(call, asked, [b"\0" * 4, b"\0" * 4, dims, b"\1" * 16])
        assert raised.value.code == UNKNOWN and "dimA" in raised.value.detail
