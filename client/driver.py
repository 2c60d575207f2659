"""The driver API in Python: the state behind the shim's entry points, and the dispatcher.

Each exported symbol gets a handler built from its call-table entry:
- a hand-written implementation registered with `@implements(family)` (local answers,
  client-made handles, lazily uploaded modules, packed launches), or else
- the generic path: arguments packed by the table and sent (sync: wait and write outputs
  back; async/shadow: queue), or else
- CUDA_ERROR_NOT_SUPPORTED, with the symbol named in the log once.

Implementations live in devices.py, memory.py, modules.py and streams.py; each takes
(driver, call, args) with args decoded from the shim's slots, and returns a CUresult or None.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from xpuremote.protocol import errors, spin
from xpuremote.protocol.calls import CALLS, SYMBOLS, Call, Param
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.link import LinkSpec
from xpuremote.protocol.logs import EVERY_CALL

from . import inventory, marshal, trace
from .connection import Connection
from .lane import Lane
from .wake import probe as probe_wake

log = logging.getLogger("xpuremote.client")

Impl = Callable[["Driver", Call, list[Any]], "int | None"]
IMPLEMENTATIONS: dict[str, Impl] = {}
CLIENT_HANDLE_BASE = 0x7C00_0000_0000
DEFAULT_SERVER = "tcp://127.0.0.1:17000"


def named_servers(text: str) -> list[str]:
    """The servers XPU_SERVER (or --server) names: one, or several separated by commas, whose devices the
    application sees as one list in that order (docs/distributed.md, "Several servers, one client")."""
    named = [s.strip() for s in text.split(",") if s.strip()] or [DEFAULT_SERVER]
    if len(set(named)) < len(named):
        raise CudaError(errors.INVALID_VALUE, f"XPU_SERVER names a server twice: {text!r}")
    return named


def implements(*families: str) -> Callable[[Impl], Impl]:
    def register(fn: Impl) -> Impl:
        for family in families:
            if family in IMPLEMENTATIONS:
                raise ValueError(f"{family} is implemented twice")
            IMPLEMENTATIONS[family] = fn
        return fn

    return register


class ContextStack:
    """Per-thread current-context stack, for use without the shim (which keeps it in C)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def _stack(self) -> list[int]:
        if not hasattr(self.local, "stack"):
            self.local.stack = []
        return self.local.stack

    def current(self) -> int:
        stack = self._stack()
        return stack[-1] if stack else 0

    def set_current(self, ctx: int) -> None:
        stack = self._stack()
        if stack:
            stack[-1] = ctx
        elif ctx:
            stack.append(ctx)

    def push(self, ctx: int) -> None:
        self._stack().append(ctx)

    def pop(self) -> int:
        stack = self._stack()
        return stack.pop() if stack else 0

    def release(self, ctx: int) -> None:
        """Run context-local-storage destructors: only the shim has any."""


@dataclass
class Device:
    server_index: int
    name: str
    uuid: bytes
    total_mem: int
    attributes: dict[int, int]
    pci: tuple[int, int, int]
    sm: int
    refused: frozenset[int] = frozenset()  # attributes the server's driver does not know
    server: int = 0  # which of the servers XPU_SERVER names has it (Driver.sessions)


@dataclass
class Context:
    device: int  # client ordinal
    flags: int = 0
    primary: bool = False
    ident: int = 0
    green: int = 0  # a green context's own handle (it is its CUcontext too), or 0
    sms: int = 0  # a green context's SMs (bit i: SM i)


@dataclass
class Primary:
    handle: int
    retains: int = 0
    flags: int = 0
    on_server: bool = False


@dataclass
class Failure:
    """An earlier asynchronous call's failure, from the server: kept until a call returns it (see `Driver.report`)."""
    symbol: str
    code: int  # a status of `library`, the failed call's
    library: str
    detail: str


@dataclass
class Driver:
    contexts: ContextStack = field(default_factory=ContextStack)
    conn: Connection | None = None  # the session with the first server XPU_SERVER names
    sessions: list[Connection] = field(default_factory=list)  # one per server it names, conn first
    lane: Lane | None = None  # the shim's C lane (client/lane.py); None without the shim
    lane_session: Connection | None = None  # the session the lane's records go to, once bound (bind_lane)
    lane_wanted: bool = False  # the session's settings allow the lane
    devices: list[Device] = field(default_factory=list)
    driver_version: int = 0
    ctxs: dict[int, Context] = field(default_factory=dict)
    primaries: list[Primary] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # per-domain state of the other modules
    lock: threading.RLock = field(default_factory=threading.RLock)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(CLIENT_HANDLE_BASE, 16))
    _said: set[str] = field(default_factory=set)
    unreachable: str | None = None  # why the last try to start the session failed (said once)
    failures: list[Failure] = field(default_factory=list)  # earlier asynchronous failures not yet returned
    _acting: threading.local = field(default_factory=threading.local)  # per thread: acting_in's contexts

    # ---- connection -----------------------------------------------------------------------
    def server(self) -> str:
        return os.environ.get("XPU_SERVER", DEFAULT_SERVER)

    def servers(self) -> list[str]:
        return named_servers(self.server())

    def connect(self) -> Connection:
        """The session with the server, made on first need (cuInit, cuDriverGetVersion)."""
        with self.lock:
            if self.conn is not None and self.conn.pid != os.getpid():
                # a forked child: CUDA state does not survive fork(); never touch the parent's socket
                raise CudaError(errors.NOT_INITIALIZED, "CUDA was initialised before fork(); "
                                "a child process cannot use its parent's GPU session")
            if self.conn is None:
                try:
                    conns = self._open_all()
                except CudaError as exc:  # said here, once per process, whichever call asked first: the runtime
                    # asks cuDriverGetVersion and gives up before cuInit; PyTorch then says only "no NVIDIA driver"
                    self.unreachable = exc.detail
                    self.say_once(f"unreachable {exc.detail}", "%s", exc.detail, level=logging.ERROR)
                    raise
                self.unreachable = None
                self._adopt(conns)
            return self.conn

    def _open_all(self) -> list[Connection]:
        """A session with each server XPU_SERVER names; none if one of them cannot be reached."""
        conns: list[Connection] = []
        servers = self.servers()
        if len(servers) > 1 and trace.requested():  # a trace holds one session's messages, numbered by it
            self.say_once("trace", "XPU_TRACE: no trace is recorded: this run uses %d servers (%s), and a trace "
                          "holds one session, which xpu-perf models; name one server to record one", len(servers),
                          ", ".join(servers))
            trace.decline()
        try:
            for position, address in enumerate(servers):
                conns.append(self._open(address, position))
        except CudaError:
            for conn in conns:
                conn.close()
            raise
        return conns

    def _open(self, address: str, position: int) -> Connection:
        """A new session with the server at `address`, with the environment's settings."""
        try:  # the user's settings: a bad one is said as such, not as an internal error
            timeout = float(os.environ.get("XPU_CONNECT_TIMEOUT_S", "10"))
            batch_us = float(os.environ.get("XPU_BATCH_US", "50"))
            link = LinkSpec.from_env(os.environ)
            spin_us = spin.default_us()
        except ValueError as exc:
            raise CudaError(errors.INVALID_VALUE, f"a setting in the environment: {exc}") from None
        tracing = trace.requested()
        return Connection(address, timeout, batch_us, link, measure=tracing,
                          measure_gpu=tracing and os.environ.get("XPU_TRACE_GPU") != "0", spin_us=spin_us,
                          position=position)

    def _adopt(self, conns: list[Connection]) -> None:
        try:  # nothing of an inventory is believed before it is checked: the session ends on a bad one
            invs = [inventory.check(conn.inventory, conn.address) for conn in conns]
        except CudaError as exc:
            self.say_once(f"inventory {exc.detail}", "%s", exc.detail, level=logging.ERROR)
            for conn in conns:
                conn.close()
            raise
        servers = [Device(i, d["name"], bytes(d["uuid"]), d["total_mem"], dict(d["attributes"]),
                          tuple(d["pci"]), d["sm"], frozenset(d.get("refused", ())), k)
                   for k, inv in enumerate(invs) for i, d in enumerate(inv["devices"])]
        self.devices = visible_devices(servers, os.environ.get("CUDA_VISIBLE_DEVICES"))
        self.driver_version = min(inv["driver_version"] for inv in invs)  # what every server's driver runs
        self.primaries = [Primary(self.new_handle()) for _ in self.devices]
        for i, p in enumerate(self.primaries):
            self.ctxs[p.handle] = Context(i, primary=True, ident=i + 1)
        self.sessions, self.conn = conns, conns[0]
        conn = conns[0]
        for each in conns:
            each.blocking = launch_blocking()
        self.lane_wanted = (self.lane is not None and not conn.blocking and not log.isEnabledFor(EVERY_CALL)
                            and os.environ.get("XPU_LANE", "1") != "0")
        if conn.blocking:
            log.info("CUDA_LAUNCH_BLOCKING=1: every asynchronous call (launches, copies, memsets, library calls) is "
                     "sent and waited for, so a failing one returns its own error; the fast lane is off")
        elif self.lane_wanted and len(conns) == 1:
            self.bind_lane(conn)
        elif self.lane_wanted:  # bound to the server of the first context used (wire_ctx)
            self.lane.decline(CROSSING)
        if trace.wanted():
            # the wake-up probe measures this machine and the server's, not an emulated link's delays
            wake = None if conn.link.delays else probe_wake(conn)
            trace.start({"server": conn.address, "backend": invs[0].get("backend"), "link": conn.link.to_wire(),
                         "devices": [d.name for d in self.devices], "wake": wake, "data": conn.data is not None,
                         "lane": conn.lane is not None, "spin_us": conn.spin_ns // 1000})
        for each, inv in zip(conns, invs):
            log.info("connected to %s (%s backend, driver %d, %d devices)", each.address, inv.get("backend"),
                     inv["driver_version"], len(inv["devices"]))

    def session(self) -> Connection:
        """The session a call goes to, for calls that need an initialised driver: of the server whose device has
        the context the call acts in (`acting`), or the first."""
        if self.conn is None:
            raise CudaError(errors.NOT_INITIALIZED, f"no session: {self.unreachable}" if self.unreachable
                            else "cuInit has not been called")
        if self.conn.pid != os.getpid():
            return self.connect()  # raises the fork error
        if len(self.sessions) == 1:
            return self.conn
        info = self.ctxs.get(self.acting())
        return self.sessions[self.server_of(info)] if info is not None else self.conn

    def session_of_device(self, dev: int) -> Connection:
        return self.sessions[self.devices[dev].server] if len(self.sessions) > 1 else self.session()

    def acting(self) -> int:
        """The context the calling thread's calls act in: its current one, or where a call names an object of
        another context (a stream, an event, memory: client/servers.py), that object's, as `acting_in` says."""
        stack = getattr(self._acting, "stack", None)
        return stack[-1] if stack else self.contexts.current()

    @contextmanager
    def acting_in(self, ctx: int) -> Iterator[None]:
        """The calls of this thread inside act in `ctx`, and go to its server."""
        stack = self._acting.__dict__.setdefault("stack", [])
        stack.append(ctx)
        try:
            yield
        finally:
            stack.pop()

    def bind_lane(self, conn: Connection) -> None:
        """The lane's records go to `conn`: with several servers, the server of the first context used, whose
        contexts alone may then take the lane (the others' calls go through the client, to their servers)."""
        conn.lane, self.lane_session = self.lane, conn
        self.lane_gate()

    def lane_gate(self) -> None:
        """Open the lane where nothing the client does for a call is needed: no capture under way (the client
        refuses and tracks work in a capture) and no event recorded in one."""
        conn = self.lane_session
        if conn is None or conn.lane is None:
            return
        if conn.dead or self.state.get("captures") or self.state.get("capture_events"):
            conn.lane.close()
        elif not conn.lane.is_open:  # traced: each record stamped in C for the trace
            conn.lane.open(conn.alarm.fd, conn.batch_window_s, traced=trace.requested())

    def new_handle(self) -> int:
        return next(self._ids)

    # ---- devices and contexts ---------------------------------------------------------------
    def device(self, ordinal: int) -> Device:
        self.session()
        if not 0 <= ordinal < len(self.devices):
            raise CudaError(errors.INVALID_DEVICE, f"device {ordinal} (there are {len(self.devices)})")
        return self.devices[ordinal]

    def current_ctx(self, required: bool = True) -> int:
        ctx = self.contexts.current()
        if required and not ctx:
            raise CudaError(errors.INVALID_CONTEXT, "no current context")
        return ctx

    def context(self, handle: int) -> Context:
        ctx = self.ctxs.get(handle or self.current_ctx())
        if ctx is None:
            raise CudaError(errors.INVALID_CONTEXT, f"{handle:#x} is not a context")
        return ctx

    def flags(self, ctx: Context) -> int:
        """A context's flags: a primary context has its device's."""
        return self.primaries[ctx.device].flags if ctx.primary else ctx.flags

    def ensure_primary(self, dev: int) -> Primary:
        """Make the primary context of `dev` exist on the server (without retaining it for the app)."""
        p = self.primaries[dev]
        if not p.on_server:
            with self.lock:
                if not p.on_server:
                    retain = CALLS["cuDevicePrimaryCtxRetain"]
                    self.session_of_device(dev).post(retain, [p.handle, self.devices[dev].server_index], None)
                    p.on_server = True
        return p

    def wire_ctx(self) -> int | None:
        """The context the calling thread's calls act in, as the server must see it before them."""
        ctx = self.acting()
        if not ctx:
            return None
        info = self.ctxs.get(ctx)
        if info is not None and info.primary:
            self.ensure_primary(info.device)
        if info is not None and self.lane is not None:
            if self.lane_session is None and self.lane_wanted:
                self.bind_lane(self.session())
            if self.lane_session is self.session():
                self.lane.context(ctx)  # on the server (or queued to be) before any record names it
        return ctx

    # ---- talking to the server ----------------------------------------------------------------
    def call(self, call: Call, wire_args: list[Any], by_data: bool = False) -> list[Any]:
        """A synchronous call: its outputs, each what `wire_args` asked for (marshal.checked), or CudaError (its
        own, or a deferred async one). `by_data`: see Connection.call."""
        if owner := self.owner(call, wire_args):
            with self.acting_in(owner):
                return self.call(call, wire_args, by_data)
        ctx = self.wire_ctx()
        info = self.ctxs.get(ctx) if ctx else None
        status, outs, deferred = self.session().call(call, wire_args, ctx, by_data, self.flags(info) if info else 0)
        if deferred:
            self.defer(deferred)
        if status:
            raise CudaError(status, f"{call.symbol} on the server", call.library)
        if self.failures:
            self.report(call)
        return marshal.checked(call, wire_args, outs)

    def defer(self, deferred: list[list[Any]]) -> None:
        """Failures of earlier asynchronous calls the server reported: said on stderr now, returned by `report`."""
        for symbol, code, detail in deferred:
            library = _library_of(symbol)  # the server gives each in its own call's library's terms
            log.warning("an earlier %s failed: %s (%s)", symbol, errors.status_name(code, library), detail)
            with self.lock:
                self.failures.append(Failure(symbol, code, library, detail))

    def report(self, call: Call) -> None:
        """Return the earliest failure not yet returned, as a status of `call`'s library (errors.deferred_status),
        and forget them all. None is sticky: the server's driver keeps a kernel's fault sticky itself, and a
        program that leaves a synchronize unchecked still meets it there, as with NVIDIA's driver: libcudart keeps
        it as the thread's last error for the next launch check (docs/client-core.md, "Failures of asynchronous
        calls")."""
        with self.lock:
            first, self.failures = self.failures[0], []
        code = errors.deferred_status(first.code, first.library, call.library)
        raise CudaError(code, f"earlier {first.symbol}: {first.detail}", call.library)

    def query(self, call: Call, wire_args: list[Any], conn: Connection | None = None) -> list[Any]:
        """A synchronous call made for a tool API (NVML), not for the application's CUDA work, to `conn` (else the
        acting context's server): failures of earlier asynchronous calls are left for the application's next
        call."""
        status, outs, deferred = (conn or self.session()).call(call, wire_args, self.wire_ctx())
        if deferred:
            self.defer(deferred)
        if status:
            raise CudaError(status, f"{call.symbol} on the server")
        return marshal.checked(call, wire_args, outs)

    def post(self, call: Call, wire_args: list[Any], size: int = 0) -> None:
        if owner := self.owner(call, wire_args):
            with self.acting_in(owner):
                return self.post(call, wire_args, size)
        self.session().post(call, wire_args, self.wire_ctx(), size)

    def owner(self, call: Call, args: list[Any]) -> int:
        """With several servers, the context of the objects `call` names (ROUTE), where it is another server's
        than the context the calling thread acts in; else 0. The call then acts in that context, and goes to its
        server (within one server, a call acts where it would with one server)."""
        if len(self.sessions) < 2:
            return 0
        owner = ROUTE[0](self, call, args)
        theirs, mine = self.ctxs.get(owner), self.ctxs.get(self.acting())
        if theirs is None or (mine is not None and self.server_of(theirs) == self.server_of(mine)):
            return 0
        return owner

    def server_of(self, ctx: Context) -> int:
        return self.devices[ctx.device].server

    def forward(self, call: Call, args: list[Any]) -> None:
        """The generic path: pack by the table, send, write outputs back (acting where call() and post() will,
        so that what translate() makes exist on a server is made on theirs)."""
        if owner := self.owner(call, args):
            with self.acting_in(owner):
                return self.forward(call, args)
        if self.state.get("captures"):  # a capture is on: the call's work may be refused
            CAPTURE_CHECK[0](self, call, args)
        wire_args, size = marshal.pack(call, self.translate(call, args), self.new_handle, call.cls != "sync")
        if call.cls == "sync":
            marshal.unpack(call, args, self.call(call, wire_args))
        else:
            self.post(call, wire_args, size)

    def translate(self, call: Call, args: list[Any]) -> list[Any]:
        """Client view -> server view: device ordinals, per-thread default streams, lazy objects, and the
        server's object for a handle that stands for one (SERVER_OBJECT)."""
        out = list(args)
        for i, translated in _translations(call):
            out[i] = translated(self, out[i])
        return out

    def say_once(self, key: str, message: str, *args: Any, level: int = logging.WARNING) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, message, *args)


def routed(impl: Impl) -> Impl:
    """`impl`, acting as Driver.forward does: with several servers, in the context of the objects the call names,
    whose server then takes what it sends."""
    def run(d: Driver, call: Call, args: list[Any]) -> int | None:
        if owner := d.owner(call, args):
            with d.acting_in(owner):
                return impl(d, call, args)
        return impl(d, call, args)
    return run


def launch_blocking() -> bool:
    """CUDA_LAUNCH_BLOCKING=1 in the application's environment: as the driver does, every launch (and here every
    other asynchronous call) returns only once it ran, with its own status."""
    return os.environ.get("CUDA_LAUNCH_BLOCKING", "0").strip() == "1"


def _library_of(symbol: str) -> str:
    call = CALLS.get(symbol)
    return call.library if call is not None else "cuda"


# Set by client/streams.py: while a capture is on, refuses work it forbids before it is sent.
CAPTURE_CHECK: list[Callable[[Driver, Call, list[Any]], None]] = []
# Set by client/servers.py: with several servers, the context whose server a call goes to (0: the acting one).
ROUTE: list[Callable[[Driver, Call, list[Any]], int]] = []
# The lane's calls (families) that may name another server's objects: with several servers they go through the client.
CROSSING = ("cuStreamWaitEvent", "cuMemcpyDtoDAsync")
# Hooks that make a lazily created object exist on the server before a call uses it.
ENSURE: dict[str, Callable[[Driver, int], None]] = {}
# Handles the client keeps that stand for a server object of its choosing: the handle that object has there.
SERVER_OBJECT: dict[str, Callable[[Driver, int], int]] = {}
Translation = Callable[["Driver", int], int]
_TRANSLATIONS: dict[str, list[tuple[int, Translation]]] = {}  # symbol -> what Driver.translate() changes
CU_STREAM_PER_THREAD = 2


def _translations(call: Call) -> list[tuple[int, Translation]]:
    """The parameters of `call` that Driver.translate() may change, each with its change: found once per call
    (looked at per parameter on each call, they cost a cuDNN batch norm about 10 µs)."""
    found = _TRANSLATIONS.get(call.symbol)
    if found is None:
        found = _TRANSLATIONS[call.symbol] = [(i, t) for i, p in enumerate(call.params)
                                              if (t := _translation(call, p)) is not None]
    return found


def _translation(call: Call, p: Param) -> Translation | None:
    if p.ctype == "CUdevice":
        return lambda d, ordinal: d.device(ordinal).server_index
    if p.ctype == "CUstream" and call.per_thread:
        return lambda d, stream: stream or CU_STREAM_PER_THREAD
    if p.ctype in ENSURE:
        ensure = ENSURE[p.ctype]

        def ensured(d: Driver, handle: int) -> int:
            if handle:
                ensure(d, handle)
            return handle
        return ensured
    if p.ctype in SERVER_OBJECT:
        server_object = SERVER_OBJECT[p.ctype]
        return lambda d, handle: server_object(d, handle) if handle else handle
    return None


def visible_devices(servers: list[Device], spec: str | None) -> list[Device]:
    """CUDA_VISIBLE_DEVICES semantics over the server's devices: a list of indices or UUID
    prefixes; the list stops at the first entry that matches nothing."""
    if spec is None:
        return servers
    chosen: list[Device] = []
    for item in (s.strip() for s in spec.split(",")):
        match = None
        if item.lstrip("-").isdigit():
            index = int(item)
            match = servers[index] if 0 <= index < len(servers) else None
        elif item.upper().startswith("GPU-"):
            prefix = item[4:].replace("-", "").lower()
            hits = [d for d in servers if d.uuid.hex().startswith(prefix)]
            match = hits[0] if len(hits) == 1 else None
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


DRIVER = Driver()
# NVIDIA's math libraries start the runtime, and so the driver, at their first handle: so do their replacements,
# and a program whose first call is one of these is told why there is no server as any other is.
STARTS_SESSION = frozenset({"cublasCreate", "cublasLtCreate", "cudnnCreate"})


def _starting(impl: Impl) -> Impl:
    def start_then(d: Driver, call: Call, args: list[Any]) -> int | None:
        if d.conn is None:
            try:
                d.connect()
            except CudaError as exc:  # NVIDIA's say NOT_INITIALIZED when the runtime does not start
                raise CudaError(errors.NOT_INITIALIZED, exc.detail) from None
        return impl(d, call, args)
    return start_then


def handler(call: Call) -> Callable[[Any], int]:
    """The function the shim calls for `call`, given the argument slots."""
    calls_logged = log.isEnabledFor(EVERY_CALL)  # XPU_LOG=CALLS: every call as it starts, with its arguments
    decode = call.from_slots
    impl = IMPLEMENTATIONS.get(call.symbol) or IMPLEMENTATIONS.get(call.family)
    if impl is not None and call.family in STARTS_SESSION:
        impl = _starting(impl)
    if impl is None and call.cls in ("sync", "async", "shadow"):
        def impl(d: Driver, c: Call, args: list[Any]) -> None:
            d.forward(c, args)
    if impl is None:
        not_supported = errors.status_for(CudaError(errors.NOT_SUPPORTED), call.library)

        def unsupported(slots: Any) -> int:
            DRIVER.say_once(call.symbol, "%s is not supported by xpuremote yet (returning %s)", call.symbol,
                            errors.status_name(not_supported, call.library))
            return not_supported
        return unsupported

    def run(slots: Any) -> int:
        try:
            args = decode(slots)
            if calls_logged:
                log.log(EVERY_CALL, "%s%s", call.symbol, tuple(args))
            return impl(DRIVER, call, args) or 0
        except CudaError as exc:
            log.debug("%s -> %s", call.symbol, exc)
            return errors.status_for(exc, call.library)
        except Exception:
            log.exception("internal error in %s", call.symbol)
            return errors.status_for(CudaError(errors.UNKNOWN), call.library)

    stream = next((i for i, p in enumerate(call.params) if p.ctype in ("CUstream", "cudaStream_t")), None)

    def run_traced(slots: Any) -> int:
        recorder = trace.RECORDER
        if recorder is None:
            return run(slots)
        entry = recorder.begin()
        try:
            return run(slots)
        finally:
            recorder.end(call, entry, int(slots[stream] or 0) if stream is not None else 0)

    return run_traced if trace.requested() else run


def handlers() -> list[Callable[[Any], int]]:
    """One handler per shim op number (the sorted exported symbols)."""
    from . import (  # noqa: F401  (they register implementations)
        arrays,
        coredump,
        devices,
        graph_nodes,
        graph_state,
        graphs,
        green,
        memory,
        modules,
        pools,
        servers,
        streams,
        vmm,
    )

    return [handler(CALLS[s]) for s in SYMBOLS]
