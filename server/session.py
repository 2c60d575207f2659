"""A client session's execution of its calls: the handles it holds, its batches of calls, the fast lane's records
(run here in Python, or taught to the lane's C side in native_lane.py), and the decoders and encoders between
the wire and the backend.

worker.py serves one Session in its process: it reads the messages and answers them; the Session runs them.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from xpuremote.protocol import abi, errors, mathlibs, wire
from xpuremote.protocol.calls import BY_OPCODE, CALLS, DEFAULT_STREAMS, Call, Param
from xpuremote.protocol.errors import CudaError
from xpuremote.protocol.link import LinkSpec, Wire

from . import metrics
from .backends.base import Backend
from .data import Asked, DataConnection, DataError, Incoming
from .gpu_timer import GpuTimer
from .limits import Limits
from .native_lane import NativeLane, NativeOp

if TYPE_CHECKING:
    from .worker import Message

log = logging.getLogger("xpuremote.worker")

MAX_OUTPUT_BYTES = 1 << 34  # a single reply larger than this is an error, not an attempt
SERVER_HANDLE_BASE = 0x5E00_0000_0000
STILLBORN_MAX = 4096  # handles whose making failed, remembered: a bound against a client that fails forever
LANE, SET_CONTEXT = CALLS["xpuLane"], CALLS["cuCtxSetCurrent"]
# a CUkernel works as a CUfunction; the runtime's stream and event types are the driver's; a
# cuBLAS handle is a cuBLASLt handle too (NVIDIA documents the cast, and PyTorch makes it); a green
# context's handle is also the CUcontext that stands for it (the client gives both one handle)
HANDLE_FAMILIES = {"CUkernel": "CUfunction", "cudaStream_t": "CUstream", "cudaEvent_t": "CUevent",
                   "cublasLtHandle_t": "cublasHandle_t", "CUgreenCtx": "CUcontext", **mathlibs.CUSPARSE_HANDLE_FAMILIES}


class Handles(dict):
    """The session's handles (client handle -> (family, object)), counting those that went or changed: the
    lane's C side forgets what it was taught when the count moves."""

    gone = 0

    def __setitem__(self, key: Any, value: Any) -> None:
        self.gone += key in self
        super().__setitem__(key, value)

    def __delitem__(self, key: Any) -> None:
        self.gone += 1
        super().__delitem__(key)

    def pop(self, key: Any, *default: Any) -> Any:
        self.gone += 1
        return super().pop(key, *default)

    def popitem(self) -> Any:
        self.gone += 1
        return super().popitem()

    def clear(self) -> None:
        self.gone += 1
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.gone += 1
        super().update(*args, **kwargs)


class Session:
    """Executes batches of calls; owns the client's handles."""

    def __init__(self, backend: Backend, key: bytes = b"", name: str = "") -> None:
        self.backend = backend
        self.name = name
        self.key = key  # what every connection of this session presents as its routing id
        self.handles = Handles()
        self.held: collections.Counter[str] = collections.Counter()  # live handles of each family
        # client handles whose making failed here (an async shadow call refused): their destroy is a no-op, so
        # one refusal is said once, not again at the destroy and at whatever waits next
        self.stillborn: dict[int, str] = {}
        self.next_handle = SERVER_HANDLE_BASE
        self.deferred: list[tuple[str, int, str]] = []  # async failures not yet reported
        self.calls = 0
        self.lane_calls = 0  # of them, run from the shim's fast lane
        self.lanes = 0  # xpuLane calls: the lane's batches
        self.library_calls: collections.Counter[str] = collections.Counter()  # math library -> calls
        self.errors = 0
        self.awaiting: int | None = None  # a host function the client runs before more work is done
        self.stash: collections.deque[Message] = collections.deque()  # messages that came meanwhile
        self.uplink: Wire | None = None  # the client's emulated link, for what reaches this end
        self.measure = False  # time each message and call for the client's trace
        self.timings: list[list[Any]] = []  # [seq, server_ns, per_call_ns] not yet sent back
        self.per_call: list[int] | None = None  # the server's time on each call of this message
        self.gpu_timer: GpuTimer | None = None  # events around GPU work, when the client asks
        self.runners: dict[int, tuple[Call, Callable[[list[Any]], Any]]] = {}  # lane calls by opcode, compiled
        self.compiled: dict[int, Callable[[list[Any]], list[Any]]] = {}  # any call by opcode, as a batch runs it
        self.native: NativeLane | None = None  # the lane's records in C, once a lane names a call it can run
        self.seq = 0  # the message being served
        self.zmq_seqs: set[int] = set()  # batches that came on ZeroMQ, after `stream_after`
        self.stream_after = 0  # the batch the last message on the data connection came after
        self.stream_pending = False  # a message from the data connection not yet served: nothing more is read there
        self.peer: Any = None  # the client's socket identity: where a last word goes at shutdown
        self.peers: set[int] = set()  # connections (fds) that have sent messages with the key: the client's own
        self.repeats = metrics.Repeats(log)  # refusals (messages without the key), said once a minute per source
        self.limits = Limits()
        self.named: dict[tuple[str, Any], int] = {}  # (type, object) -> its handle, of objects the backend made
        self.owned: dict[Any, list[int]] = {}  # owner object -> handles named for objects it holds
        self.owners: dict[int, Any] = {}  # a handle made with an owner -> that owner object
        self.listener: socket.socket | None = None  # where the client opens the data connection (server/data.py)
        self.data: DataConnection | None = None
        self.data_keys: list[bytes] | None = None  # a keyed session's: its data connection is sealed with them
        self.answering = False  # the call being run is the one a reply answers: it may send an output as data
        self.outgoing: list[Any] = []  # outputs for the data connection, sent after the answer
        backend.bind(self.handles, self.name_handle, self.drop_handle, self.owner_of)

    def start(self, header: dict[str, Any]) -> dict[str, Any]:
        """The `init` request: the client's link and trace settings; answered with the inventory."""
        try:
            link = LinkSpec.from_wire(header.get("link"))
        except ValueError as exc:
            raise wire.WireError(str(exc)) from None
        self.uplink = Wire(link) if link.active else None
        self.measure = bool(header.get("measure"))
        if self.gpu_timer is not None:
            self.gpu_timer.close()
        self.gpu_timer = GpuTimer(self.backend) if header.get("gpu") else None
        self.runners.clear()
        self.compiled.clear()
        self.native = None  # its ops depend on the settings (the GPU timer)
        answer = {"op": "reply", "status": 0, **self.backend.inventory().to_wire(),
                  "max_request_bytes": self.limits.max_request_bytes}
        if self.listener is not None and self.data is None:
            answer["data_port"] = self.listener.getsockname()[1]
            if self.data_keys:  # in the CURVE-encrypted answer: no one else learns them
                answer["data_keys"] = self.data_keys
        return answer

    def open_data(self) -> dict[str, Any]:
        """The `data` request: the client has connected to the data port; take its connection."""
        if self.listener is None:
            raise DataError("this session offers no data connection")
        try:
            self.data = DataConnection.accept(self.listener, self.key, self.name, self.data_keys)
        finally:
            self.listener.close()
            self.listener = None
        log.info("session %s: data connection open", self.name)
        return {"op": "reply", "status": 0}

    # ---- handles --------------------------------------------------------------------------
    def resolver(self, param: Param) -> Callable[[Any, Any], Any]:
        """What turns a client's handle for `param` into the backend's object (None for 0)."""
        family, handles = _handle_family(param.ctype), self.handles
        defaults = DEFAULT_STREAMS if family == "CUstream" else ()

        def resolve(value: Any, scalars: Any) -> Any:
            if value is None or value == 0:
                return None
            if not isinstance(value, int):
                raise CudaError(errors.INVALID_HANDLE, f"{param.name}: handle must be an integer")
            if value in defaults:
                return value
            entry = handles.get(value)
            if entry is not None and entry[0] == family:
                return entry[1]
            why = f" (making it failed: {self.stillborn[value]})" if value in self.stillborn else ""
            raise CudaError(errors.INVALID_HANDLE, f"{param.name}={value:#x} is not a live {param.ctype}{why}")
        return resolve

    def register(self, ctype: str, obj: Any, handle: int | None = None, owner: Any = None) -> int:
        """A new handle (the client's, for a shadow call); with an owner (a graph, for its nodes), it goes
        when the owner's handle is destroyed."""
        if handle is None:
            while self.next_handle in self.handles:  # a client may have taken one of these values
                self.next_handle += 16
            handle, self.next_handle = self.next_handle, self.next_handle + 16
        else:
            self.check_new(handle)
        self.handles[handle] = (_handle_family(ctype), obj)
        self.held[_handle_family(ctype)] += 1
        if ctype == "CUgraphNode":  # a node listed later is named by the handle it was made with
            self.named[(ctype, obj)] = handle
        if owner is not None:
            self.owned.setdefault(owner, []).append(handle)
            self.owners[handle] = owner
        return handle

    def check_new(self, handle: Any) -> None:
        if not isinstance(handle, int) or handle <= 0 or handle in self.handles:
            raise CudaError(errors.INVALID_VALUE, f"client handle {handle!r} is invalid or already in use")

    def name_handle(self, ctype: str, obj: Any, owner: Any) -> int:
        """The one handle of an object the backend made on its own (the nodes a capture made), the same
        each time it is named; it goes when its owner's handle is destroyed."""
        handle = self.named.get((ctype, obj))
        if handle is None:
            self.limits.check_count(self.held[_handle_family(ctype)], f"handles of type {ctype}")
            handle = self.named[(ctype, obj)] = self.register(ctype, obj, owner=owner)
        return handle

    def owner_of(self, ctype: str, obj: Any) -> Any:
        """The owner a named object's handle was made with (a node's graph), or None."""
        return self.owners.get(self.named.get((ctype, obj), 0))

    def drop_handle(self, handle: int) -> None:
        """A handle whose object the backend found gone (the graph of a failed capture), and what it owned."""
        entry = self.handles.pop(handle, None)
        self.owners.pop(handle, None)
        if entry is None:
            return
        self.held[entry[0]] -= 1
        if entry[0] in ("CUgraphNode", "CUgraph"):  # the named kinds; the driver may reuse the address
            self.named.pop(entry, None)
        if entry[0] == "CUgraph":
            for owned in self.owned.pop(entry[1], ()):
                self.drop_handle(owned)

    def stillbirth(self, call: Call, args: list[Any], made: list[tuple[int, str]], error: CudaError) -> CudaError:
        """A shadow call that failed: the client's handles it was to make are remembered as never made."""
        if call.cls == "shadow":
            for i, _ in made:
                if isinstance(args[i], int) and args[i] not in self.handles and len(self.stillborn) < STILLBORN_MAX:
                    self.stillborn[args[i]] = str(error)
        return error

    def forget(self, call: Call, args: list[Any]) -> None:
        """Destroy calls drop the handle they destroyed, and the handles of what it held."""
        if call.destroys and args and isinstance(args[0], int):
            self.drop_handle(args[0])

    def add_timings(self, answer: dict[str, Any], final: bool = False) -> dict[str, Any]:
        """Give an answer the times measured since the last one, for the client's trace (`final`: the last answer,
        which waits for the GPU's)."""
        if self.timings:
            answer["timing"], self.timings = self.timings, []
        if self.gpu_timer and (gpu := self.gpu_timer.collect(final)):
            answer["gpu"] = gpu
        return answer

    # ---- calls ----------------------------------------------------------------------------
    def run_batch(self, batch: Any, reply: bool, wanted: Any = None) -> dict[str, Any]:
        """Run a batch's calls in order; the answer carries the last one's status and outputs where `reply`, and
        those of the calls at `wanted` (indices: calls whose answers ride with the batch's, client/connection.py)."""
        if not isinstance(batch, list) or not batch:
            raise wire.WireError("calls must be a non-empty list")
        if wanted is not None and (type(wanted) is not list or not all(type(i) is int for i in wanted)):
            raise wire.WireError("answers must be a list of call indices")
        riding: set[int] = set(wanted or ())
        rode: list[list[Any]] = []
        outs: list[Any] = []
        status = errors.SUCCESS
        timer = self.gpu_timer
        for i, item in enumerate(batch):
            last = i == len(batch) - 1
            self.answering = last and reply
            if timer is not None:
                timer.pos = i
            try:
                call, args = _unpack(item)
                if call is LANE:
                    if self.per_call is not None:  # one item: its records share its time (perfmodel/shares.py)
                        began = time.monotonic_ns()
                        self.run_lane(args)
                        self.per_call.append(time.monotonic_ns() - began)
                    else:
                        self.run_lane(args)
                    outs, status = [], errors.SUCCESS
                    continue
                run = self.compiled.get(call.opcode) or self.compile(call)
                if self.per_call is not None:
                    began = time.monotonic_ns()
                    outs = run(args)
                    self.per_call.append(time.monotonic_ns() - began)
                else:
                    outs = run(args)
                status = errors.SUCCESS
            except CudaError as exc:
                name = _name_of(item)
                status = errors.status_for(exc, CALLS[name].library if name in CALLS else "cuda")
                self.errors += 1
                if not (last and reply) or i in riding:  # a rider's failure is said as an asynchronous call's
                    self.deferred.append((name, status, exc.detail))
                log.info("%s failed: %s", name, exc)
                outs = []
            if i in riding:
                rode.append([i, status, outs])
        if timer is not None:
            timer.end_message(self.seq)
        if reply and status == errors.SUCCESS and call.symbol == "xpuHostFunc":
            self.awaiting = args[1]  # stop here until the client says the function has run
        answer: dict[str, Any] = {"op": "reply", "status": status, "outs": outs}
        if riding:
            answer["answers"] = rode
        if reply and self.deferred:
            answer["deferred"] = [list(d) for d in self.deferred]
            self.deferred.clear()
        return answer

    def run_lane(self, args: list[Any]) -> None:
        """The records of the shim's fast lane, each as the call it names, in its context; each failure is
        deferred under its own call's name. A malformed record fails the rest of the lane. Where the backend's
        calls are C functions, runs of records go through native_lane.c, the session's checks taught to it."""
        if len(args) != 2 or not isinstance(args[0], (bytes, memoryview)) or args[1] != len(args[0]):
            raise CudaError(errors.INVALID_VALUE, "xpuLane takes [records, their size]")
        view, at, ctx = memoryview(args[0]), 0, None
        self.lanes += 1
        try:
            while at < len(view):
                if self.native is not None and ctx is not None and self.native.ops.get(_opcode_at(view, at)):
                    at = self.run_native(view, at, ctx)
                    if at >= len(view):
                        break
                start = at
                opcode, record_ctx, record, at = wire.lane_record(view, at)
                ctx = self.run_record(opcode, record_ctx, record, ctx, view[start:at])
        except wire.WireError as exc:
            raise CudaError(errors.INVALID_VALUE, str(exc)) from None

    def run_record(self, opcode: int, record_ctx: int, record: list[Any], ctx: int | None,
                   raw: memoryview | None = None) -> int | None:
        """One lane record (its bytes: `raw`), in Python; the context current after it."""
        entry = self.runners.get(opcode)
        call = entry[0] if entry is not None else BY_OPCODE.get(opcode)
        try:
            if entry is None:
                if call is None or not call.in_lane:
                    raise CudaError(errors.NOT_SUPPORTED, f"opcode {opcode:#x} may not come in a lane")
                entry = self.runners[opcode] = (call, self.runner(call))
                self.register_native(call)
            if record_ctx != ctx:  # the context the record was made in, as the client's SET_CONTEXT does
                self.execute(SET_CONTEXT, [record_ctx])
                ctx = record_ctx
            self.lane_calls += 1
            record = call.from_slots(record)  # as the client's own path sends them
            entry[1](record)
            if self.native is not None and (op := self.native.ops.get(opcode)):
                self.teach(op, record, raw)
        except CudaError as exc:
            self.defer_lane_failure(call.symbol if call is not None else "a lane record", exc)
        return ctx

    def defer_lane_failure(self, name: str, exc: CudaError) -> None:
        """A record's failure, deferred as a batch defers its calls': as a status of the library of the call it
        names (the client reads it so), a cuBLAS refusal as cuBLAS's NOT_SUPPORTED."""
        self.errors += 1
        call = CALLS.get(name)
        self.deferred.append((name, errors.status_for(exc, call.library if call is not None else "cuda"), exc.detail))
        log.info("%s (lane) failed: %s", name, exc)

    # ---- the lane in C (native_lane.py) ----------------------------------------------------------
    def register_native(self, call: Call) -> None:
        """Tell the C side how to run `call`, where the backend has it as a C function and the session checks
        no more than numbers' bounds, handles, one device range and a blob's size (the backend's native_call);
        or, a math library's call or a cuDNN execution, where it is a record of the same values as one the session
        ran (VETTED, EXECUTE)."""
        native_call = getattr(self.backend, "native_call", None)
        if (native_call is None or call.destroys or self.gpu_times(call) or not call.sent
                or (found := native_call(call)) is None):
            return
        function, convention, address, length, scale, blob_max = found
        extra, keep = (), None
        if convention == abi.NATIVE_CALL_EXECUTE:
            extra, handle_types, keep = self.backend.native_execute()
            shape = _execute_shape(call, handle_types)
        else:
            shape = _native_shape(call) if call.library == "cuda" else _vetted_shape(call)
        if shape is None:
            return
        if self.native is None:
            self.native = NativeLane.load()  # after its first try in this process, at once
            if self.native is None:
                return
        kinds, bounds, families, blob, blob_size = shape
        if blob >= 0 and blob_size >= 0:  # a blob sized by an argument (a launch's): as large as the backend allows
            bounds = (*bounds[:blob], blob_max, *bounds[blob + 1:])
        self.native.register(call.opcode, NativeOp(function, convention, kinds, bounds, families, address, length,
                                                   scale, blob, blob_size, extra), keep)

    def teach(self, op: NativeOp, record: list[Any], raw: memoryview | None) -> None:
        """What the record just run named, now checked: its handles and its device range, or (VETTED) itself."""
        native = self.native
        self.native_current()
        for i, family in enumerate(op.families):
            if family and record[i] and (entry := self.handles.get(record[i])) and type(entry[1]) is int:
                native.teach_handle(record[i], family, entry[1])
        if op.address >= 0 and record[op.address]:
            native.teach_range(*self.backend.regions.last)
        if op.convention in (abi.NATIVE_CALL_VETTED, abi.NATIVE_CALL_EXECUTE) and raw is not None:
            native.vet(raw)

    def native_current(self) -> None:
        """The C side forgets all it was taught once a handle or a range went."""
        marks = (self.handles.gone, self.backend.regions.gone)
        if marks != self.native.marks:
            family = _family_number("CUstream")
            self.native.forget(marks, [(s, family, s) for s in DEFAULT_STREAMS if s])

    def run_native(self, view: memoryview, at: int, ctx: int) -> int:
        """The records from `at` that the C side runs; where it stopped."""
        native = self.native
        self.native_current()
        at, ran, failed = native.run(view, at, ctx)
        self.calls += ran
        self.lane_calls += ran
        for opcode, status in failed:
            call = BY_OPCODE[opcode]
            op = native.ops.get(opcode)
            library = "cudnn" if op is not None and op.convention == abi.NATIVE_CALL_EXECUTE else call.library
            self.defer_lane_failure(call.symbol, CudaError(status, f"{call.symbol} on the server's GPU", library))
        return at

    def gpu_times(self, call: Call) -> bool:
        """Whether the GPU timer (a trace's) must see `call`: it then goes the generic way, which the timer wraps."""
        return self.gpu_timer is not None and self.gpu_timer.touches(call)

    def compile(self, call: Call) -> Callable[[list[Any]], list[Any]]:
        """What a batch runs for `call`: its runner, which leaves out the generic dispatch for the calls that
        allow it (the lane's own cache is apart: a lane may name only the calls the table lets in)."""
        run = self.runner(call)
        self.compiled[call.opcode] = run
        return run

    def runner(self, call: Call) -> Callable[[list[Any]], Any]:
        """execute() compiled for one call: for a call of integers, handles and outputs the client sizes (the
        lane's hot calls, most of a batch's, a copy to the host), its shape checked, its handles resolved, then
        the backend's runner (the limits' checks included); for any other, `generic`."""
        plain = _plain(call)
        if plain is None or call.destroys or self.gpu_times(call) or not call.sent or call.library != "cuda":
            return self.generic(call)
        run, count = self.backend.runner(call), len(call.params)
        resolvers = [(i, self.resolver(call.params[i])) for i in plain.handles]
        outputs = [(i, call.params[i]) for i in plain.outputs]

        def plain_call(args: list[Any]) -> list[Any]:
            self.calls += 1
            if len(args) != count:
                raise CudaError(errors.INVALID_VALUE, f"{call.symbol} takes {count} arguments, got {len(args)}")
            decoded = self.decode_plain(call, args, plain, resolvers)
            for i, p in outputs:
                decoded[i] = self.output_size(call, p, args[i])
            try:
                outs = run(decoded)
            except BACKEND_FAULTS as exc:
                raise _invalid(call, exc) from None
            return [self.encode(p, args[i], o, call) for (i, p), o in zip(outputs, outs)] if outputs else []
        return plain_call

    def execute(self, call: Call, args: list[Any]) -> list[Any]:
        """One call, as a batch runs it."""
        return (self.compiled.get(call.opcode) or self.compile(call))(args)

    def generic(self, call: Call) -> Callable[[list[Any]], list[Any]]:
        """Any call, compiled: each argument's decoder, the handles it makes, the backend's runner and each
        output's encoding found once (looked up per call, they cost a math library call 9 µs of CPU here)."""
        if not call.sent:  # e.g. a copy whose struct holds host pointers: the client rewrites those
            def refuse(args: list[Any]) -> list[Any]:
                raise CudaError(errors.NOT_SUPPORTED, f"{call.symbol} is not served (the client library never "
                                "sends it)")
            return refuse
        count, library, shadow = len(call.params), call.library, call.cls == "shadow"
        ints = [(i, *_int_range(p)) for i, p in enumerate(call.params) if p.kind == "int"]  # checked inline
        decoders = [(i, self.decoder(call, p)) for i, p in enumerate(call.params) if p.kind != "int"]
        numbers = [(p.name, i) for i, p in enumerate(call.params) if p.kind in ("int", "float")]
        sized = any(p.kind == "ptr" and p.count is not None and p.factors and p.factors[1] for p in call.params)
        made = [(i, _handle_family(p.ctype.rstrip(" *"))) for i, p in enumerate(call.params)
                if p.direction == "out" and p.pointee == "handle"]
        # a caller's struct (cuSPARSELt's) initialised again: the client names the object it held, which ends
        in_struct = {i for i, p in enumerate(call.params) if p.direction == "out" and p.pointee_size > 8} \
            if shadow and library != "cuda" else set()
        outputs = [(i, p) for i, p in enumerate(call.params) if p.direction != "in"]
        graph = _graph_of(call)
        run = self.backend.runner(call)
        timed = self.gpu_timer.wrap(call, run) if self.gpu_timer else None

        def generic_call(args: list[Any]) -> list[Any]:
            self.calls += 1
            if library != "cuda":
                self.library_calls[library] += 1
            if len(args) != count:
                raise CudaError(errors.INVALID_VALUE, f"{call.symbol} takes {count} arguments, got {len(args)}")
            if call.destroys and type(args[0]) is int and self.stillborn.pop(args[0], None) is not None:
                return []  # its making failed and was said: nothing to destroy
            for i, low, high in ints:
                if type(args[i]) is not int or not low <= args[i] < high:
                    self.decoder(call, call.params[i])(args[i], {})  # raises, saying what is wrong
            scalars = {name: args[i] for name, i in numbers} if sized else {}
            decoded = list(args)
            for i, decode in decoders:
                decoded[i] = decode(args[i], scalars)
            for i, family in made:  # checked before anything is made
                if i in in_struct and self.handles.get(args[i], ("",))[0] == family:
                    self.drop_handle(args[i])
                self.limits.check_count(self.held[family], f"handles of type {family}")
                if shadow:
                    self.check_new(args[i])  # the client's new handle is free
            try:
                outs = run(decoded) if timed is None else timed(args, decoded)
            except BACKEND_FAULTS as exc:
                raise self.stillbirth(call, args, made, _invalid(call, exc)) from None
            except CudaError as exc:
                raise self.stillbirth(call, args, made, exc) from None
            if call.destroys:
                self.forget(call, args)
            if not outputs:
                return []
            owner = decoded[graph] if graph is not None else None  # a node belongs to its graph
            return [self.encode(p, args[i], o, call, owner) for (i, p), o in zip(outputs, outs)]
        return generic_call

    def decode_plain(self, call: Call, args: list[Any], plain: Plain, resolvers: list[tuple[int, Any]]) -> list[Any]:
        """The decoders' work for a call of integers and handles, by its precomputed shape."""
        for i, low, high in plain.ints:
            value = args[i]
            if type(value) is not int or not low <= value < high:
                p = call.params[i]
                raise CudaError(errors.INVALID_VALUE, f"{call.symbol}.{p.name}={value!r} is not a {p.ctype}")
        decoded = list(args)
        for i, resolve in resolvers:
            decoded[i] = resolve(args[i], None)
        return decoded

    def decoder(self, call: Call, p: Param) -> Callable[[Any, dict[str, Any]], Any]:
        """What checks and converts one argument of `call` from the wire, given the call's numbers by name."""
        name = f"{call.symbol}.{p.name}"
        if p.kind == "handle":
            return self.resolver(p)
        if p.by_reference:  # the handle a caller's struct holds: resolved as one of the struct's type
            return self.resolver(dataclasses.replace(p, ctype=p.ctype.replace("const ", "").rstrip(" *")))
        if p.kind in ("int", "float"):
            low, high = _int_range(p) if p.kind == "int" else (None, None)

            def number(value: Any, scalars: dict[str, Any]) -> Any:
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise CudaError(errors.INVALID_VALUE, f"{name} must be a number")
                if low is not None and not (isinstance(value, int) and low <= value < high):
                    raise CudaError(errors.INVALID_VALUE, f"{name}={value!r} is not a {p.ctype}")  # a float, too big
                return value
            return number
        if p.direction == "out":
            if p.pointee == "handle" and call.cls == "shadow":
                return lambda value, scalars: value  # the client's id for the handle being created
            return lambda value, scalars: self.output_size(call, p, value)
        return lambda value, scalars: self.input_bytes(call, p, value, scalars)

    def output_size(self, call: Call, p: Param, value: Any) -> Any:
        if type(value) is Asked:
            if not (call.by_data and self.answering):
                raise CudaError(errors.INVALID_VALUE, f"{call.symbol}.{p.name}: an output on the data "
                                "connection is for an answered copy only")
            value = value.size
        if value is not None and (not isinstance(value, int) or not 0 <= value <= MAX_OUTPUT_BYTES):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}.{p.name}: output size {value!r}")
        return value

    def input_bytes(self, call: Call, p: Param, value: Any, scalars: dict[str, Any]) -> Any:
        if value is None or p.is_string and isinstance(value, str):
            return value
        if (p.is_address or p.is_scalar) and isinstance(value, int) and 0 <= value < 1 << 64:
            return value  # a device address (a scalar in device pointer mode)
        if type(value) is Incoming and not call.by_data:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}.{p.name} may not come on the data connection")
        if not isinstance(value, (bytes, memoryview, Incoming)):
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}.{p.name} must be bytes")
        try:
            expected = p.byte_count(scalars)
        except (TypeError, ValueError, OverflowError, KeyError):  # a size argument that is not a number
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}.{p.name}: its size is not a number") from None
        if expected is not None and len(value) != expected:
            raise CudaError(errors.INVALID_VALUE, f"{call.symbol}.{p.name}: {len(value)} bytes, expected {expected}")
        return value

    def encode(self, p: Param, arg: Any, out: Any, call: Call, owner: Any = None) -> Any:
        if arg is None and p.pointee != "handle":
            return None  # the application passed NULL for this output
        if p.pointee == "handle":
            handle = self.register(p.ctype.rstrip(" *"), out, arg if call.cls == "shadow" else None, owner)
            return None if call.cls == "shadow" else handle.to_bytes(8, "little")
        if isinstance(out, (bytes, memoryview)):
            if type(arg) is Asked:  # sent on the data connection after the answer
                self.outgoing.append(out)
                return wire.Data(out)
            return wire.frame(out)  # a large output goes as a frame of its own, not through msgpack
        if p.count == "*":
            return out
        if p.count is None and p.pointee in ("int", "float"):
            return _pack_scalar(p, out)
        return out


# what a backend raises for a handle of the wrong kind, or a value no driver would accept (CudaError aside)
BACKEND_FAULTS = (TypeError, AttributeError, ValueError, IndexError, KeyError, struct.error)


def _invalid(call: Call, exc: Exception) -> CudaError:
    return CudaError(errors.INVALID_VALUE, f"{call.symbol}: {type(exc).__name__}: {exc}")


@dataclasses.dataclass(frozen=True)
class Plain:
    """A call whose parameters are integers, handles and outputs the client sizes (not handles: nothing is
    made): what it checks of each."""
    ints: tuple[tuple[int, int, int], ...]  # (index, lowest, past the highest value)
    handles: tuple[int, ...]
    outputs: tuple[int, ...]


_PLAIN: dict[str, Plain | None] = {}


def _plain(call: Call) -> Plain | None:
    try:
        return _PLAIN[call.symbol]
    except KeyError:
        pass
    plain = None
    outputs = tuple(i for i, p in enumerate(call.params) if p.direction != "in")
    if all(p.kind in ("int", "handle") and p.direction == "in" or i in outputs and p.pointee != "handle"
           for i, p in enumerate(call.params)):
        ints = tuple((i, *_int_range(p)) for i, p in enumerate(call.params) if p.kind == "int")
        plain = Plain(ints, tuple(i for i, p in enumerate(call.params) if p.kind == "handle"), outputs)
    _PLAIN[call.symbol] = plain
    return plain


def _graph_of(call: Call) -> int | None:
    """Where the graph a call adds a node to is among its arguments (its CUgraph), or None."""
    if call.outputs and call.outputs[0].ctype == "CUgraphNode *":
        return next((i for i, p in enumerate(call.params) if p.ctype == "CUgraph"), None)
    return None


def _handle_family(ctype: str) -> str:
    return HANDLE_FAMILIES.get(ctype, ctype)


_FAMILY_NUMBERS: dict[str, int] = {}


def _family_number(ctype: str) -> int:
    """A handle family as the lane's C side names it (1 on)."""
    return _FAMILY_NUMBERS.setdefault(_handle_family(ctype), len(_FAMILY_NUMBERS) + 1)


def _native_shape(call: Call) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int] | None:
    """(each argument's kind, largest value, handle family; the blob's argument and its size's) of a call
    whose arguments are integers, handles and at most one input of bytes sized by one integer argument (a
    launch's kernel arguments): what the session checks of them, for the lane's C side. None for others."""
    kinds, bounds, families, blob, blob_size = [], [], [], -1, -1
    names = [p.name for p in call.params]
    for i, p in enumerate(call.params):
        if p.kind == "int":
            kinds.append(abi.NATIVE_ARG_INT)
            bounds.append(_int_range(p)[1] - 1)
        elif p.kind == "handle":
            kinds.append(abi.NATIVE_ARG_HANDLE)
            bounds.append(0)
        elif (p.kind == "ptr" and p.direction == "in" and blob < 0 and p.count in names
              and not (p.is_address or p.is_scalar or p.is_string)):
            blob, blob_size = i, names.index(p.count)
            kinds.append(abi.NATIVE_ARG_BLOB)
            bounds.append(0)
        else:
            return None
        families.append(_family_number(p.ctype) if p.kind == "handle" else 0)
    if blob >= 0 and call.params[blob_size].kind != "int":
        return None
    return tuple(kinds), tuple(bounds), tuple(families), blob, blob_size


def _vetted_shape(call: Call) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], int, int] | None:
    """(each argument's kind, largest value, handle family; the blob's argument, -1) of a math library's call of
    numbers (a float or a double by value too: a batch norm's epsilon), handles, device addresses (numbers here: the
    record is vetted whole), host scalars and at most one input struct (cublasLtMatmul's algorithm, the record's
    blob), for the lane's C side. None for others."""
    kinds, bounds, families, blob = [], [], [], -1
    for i, p in enumerate(call.params):
        family = 0
        if p.kind == "int":  # a negative one's slot is sign-extended (cuFFT's FORWARD, -1): vetted whole, as it is
            kind, bound = abi.NATIVE_ARG_INT, (1 << 64) - 1 if p.signed else _int_range(p)[1] - 1
        elif p.kind == "float":
            kind, bound = abi.NATIVE_ARG_FLOAT if p.size == 4 else abi.NATIVE_ARG_DOUBLE, 0
        elif p.kind == "handle":
            kind, bound, family = abi.NATIVE_ARG_HANDLE, 0, _family_number(p.ctype)
        elif p.is_scalar and p.direction == "in":
            kind, bound = abi.NATIVE_ARG_SCALAR, 0
        elif p.is_device:
            kind, bound = abi.NATIVE_ARG_INT, (1 << 64) - 1
        elif p.kind == "ptr" and p.direction == "in" and p.count is None and p.pointee_size and blob < 0:
            kind, bound, blob = abi.NATIVE_ARG_BLOB, p.pointee_size, i
        else:
            return None
        kinds.append(kind)
        bounds.append(bound)
        families.append(family)
    return tuple(kinds), tuple(bounds), tuple(families), blob, -1


# xpuCudnnExecute's arguments as the lane's C side reads them (abi.EXECUTE_ARG_*), in their order
EXECUTE_ARGS = tuple(name.removeprefix("EXECUTE_ARG_").lower()
                     for _, name in sorted((v, k) for k, v in vars(abi).items() if k.startswith("EXECUTE_ARG_")))


def _execute_shape(call: Call, handle_types: tuple[str, str]) -> tuple[tuple[int, ...], tuple[int, ...],
                                                                       tuple[int, ...], int, int] | None:
    """xpuCudnnExecute's shape for the lane's C side (EXECUTE): its handle and plan, which the backend resolves as
    handles of `handle_types`, its count and workspace (numbers: the record is vetted whole) and its pack, the
    record's blob, as large as the pack of the most elements the shim keeps. None where the table's arguments are
    not those the C side reads."""
    if call.names != EXECUTE_ARGS:
        return None
    pack = call.params[abi.EXECUTE_ARG_PACK]
    kinds, bounds, families = [], [], []
    for name, p in zip(EXECUTE_ARGS, call.params):
        if name in ("handle", "plan"):
            kinds.append(abi.NATIVE_ARG_HANDLE)
            bounds.append(0)
            families.append(_family_number(handle_types[name == "plan"]))
        elif p is pack:
            kinds.append(abi.NATIVE_ARG_BLOB)
            bounds.append(pack.byte_count({"count": abi.KEPT_PACK_ELEMENTS}))
            families.append(0)
        else:
            kinds.append(abi.NATIVE_ARG_INT)
            bounds.append(_int_range(p)[1] - 1)
            families.append(0)
    return tuple(kinds), tuple(bounds), tuple(families), abi.EXECUTE_ARG_PACK, -1


def _opcode_at(view: memoryview, at: int) -> int:
    return int.from_bytes(view[at : at + 4], "little")


def _int_range(p: Param) -> tuple[int, int]:
    """[low, high) of an integer parameter's C type."""
    bits = 8 * p.size
    return (-(1 << (bits - 1)), 1 << (bits - 1)) if p.signed else (0, 1 << bits)


def _pack_scalar(p: Param, value: Any) -> bytes:
    if p.pointee == "float":
        return struct.pack("<f" if p.pointee_size == 4 else "<d", value)
    try:
        return int(value).to_bytes(p.pointee_size, "little", signed=int(value) < 0)
    except OverflowError:  # e.g. 16 GiB free through the 32-bit cuMemGetInfo of old
        raise CudaError(errors.INVALID_VALUE, f"{p.name}={value} does not fit in {p.pointee_size} bytes") from None


def _unpack(item: Any) -> tuple[Call, list[Any]]:
    if not isinstance(item, list) or len(item) != 2 or not isinstance(item[1], list):
        raise CudaError(errors.INVALID_VALUE, "a call must be [opcode, [args]]")
    call = BY_OPCODE.get(item[0]) if isinstance(item[0], int) else None
    if call is None:
        raise CudaError(errors.NOT_SUPPORTED, f"unknown call opcode {item[0]!r}: client and server disagree")
    return call, item[1]


def _name_of(item: Any) -> str:
    try:
        return BY_OPCODE[item[0]].symbol
    except (KeyError, IndexError, TypeError):
        return "<malformed call>"


def report(session: Session, last: str | None) -> str:
    """The session's counters to the daemon (stdout), when they changed: from the loop (worker.py) and from the
    watchdog as it ends the process."""
    backend = session.backend
    line = metrics.stats_line(session.calls, session.errors, getattr(backend, "used", 0), getattr(backend, "peak", 0))
    if line != last:
        print(line, flush=True)
    return line
