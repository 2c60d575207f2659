"""NCCL on the sim device: communicators across sessions, collectives computed with numpy.

Each rank is a session of its own (a worker process), so the ranks meet in the file system
(sim_rendezvous.py): across the sessions of one daemon and across daemons of one machine. A
collective writes this rank's contribution there, waits for every peer's and computes the result
itself, in rank order, so every rank gets the same bytes. The sim runs calls in order as they come,
so a collective is done when its call returns; stream order holds trivially.

Data types: every ncclDataType_t numpy has (int8, uint8, int32, uint32, int64, uint64, fp16, fp32,
fp64) and bf16; the fp8 types are refused. fp16 and bf16 are reduced in fp32 and rounded once,
as a GPU's ring rounds at each step: results agree with a GPU's to rounding, not bit for bit.
Reductions: sum, prod, max, min, avg (an integer average truncates, as NCCL's does);
ncclRedOpCreatePreMulSum's operators are not served (the call is refused in the client).
Between ncclGroupStart and ncclGroupEnd the operations wait for the group's end, which runs the
sends first, so a group's receives never wait for a send queued after them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xpuremote.protocol import errors, mathlibs
from xpuremote.protocol.errors import CudaError

from .sim_blas import bf16_to_f32, f32_to_bf16
from .sim_rendezvous import Rendezvous, derived_id, new_id

ENUMS = mathlibs.api(mathlibs.NCCL).ENUMS
BF16 = ENUMS["ncclBfloat16"]
DTYPES = {ENUMS[name]: np.dtype(kind) for name, kind in (
    ("ncclInt8", "i1"), ("ncclUint8", "u1"), ("ncclInt32", "<i4"), ("ncclUint32", "<u4"), ("ncclInt64", "<i8"),
    ("ncclUint64", "<u8"), ("ncclFloat16", "<f2"), ("ncclFloat32", "<f4"), ("ncclFloat64", "<f8"),
    ("ncclBfloat16", "<u2"))}
SUM, PROD, MAX, MIN, AVG = (ENUMS[f"nccl{op}"] for op in ("Sum", "Prod", "Max", "Min", "Avg"))
SPLIT = struct.Struct("<iq")  # a rank's color and key, as ncclCommSplit's exchange carries them
NO_COLOR = -1  # NCCL_SPLIT_NOCOLOR
REDUCE: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    SUM: lambda x: x.sum(axis=0), PROD: lambda x: x.prod(axis=0), MAX: lambda x: x.max(axis=0),
    MIN: lambda x: x.min(axis=0)}


def nccl_error(outcome: str, detail: str) -> CudaError:
    return errors.library_error("nccl", outcome, detail)


@dataclass(eq=False)
class Comm:
    """A communicator of this session: its rank's membership, and its device."""
    meeting: Rendezvous
    device: int

    @property
    def nranks(self) -> int:
        return self.meeting.nranks

    @property
    def rank(self) -> int:
        return self.meeting.rank


@dataclass
class Group:
    """Operations between ncclGroupStart and its ncclGroupEnd: sends, then the rest in order."""
    depth: int = 0
    sends: list[Callable[[], None]] = field(default_factory=list)
    rest: list[Callable[[], None]] = field(default_factory=list)


class SimNccl:
    """The NCCL families the call table forwards, over the sim's `memory`."""

    def __init__(self, memory: Any, device: Callable[[], int]) -> None:
        self.memory = memory
        self.device = device  # the session's current device, which a new communicator belongs to
        self.comms: list[Comm] = []
        self.group = Group()

    # ---- communicators ------------------------------------------------------------------------------
    def ncclGetUniqueId(self) -> tuple[bytes]:
        return (new_id(),)

    def ncclCommInitRank(self, nranks: int, comm_id: bytes, rank: int) -> tuple[Comm]:
        comm = Comm(Rendezvous(comm_id, nranks, rank), self.device())
        self.comms.append(comm)
        return (comm,)

    def ncclCommInitRankConfig(self, nranks: int, comm_id: bytes, rank: int, config: bytes | None) -> tuple[Comm]:
        return self.ncclCommInitRank(nranks, comm_id, rank)  # the config's tuning means nothing here

    def ncclCommSplit(self, comm: Any, color: int, key: int, config: bytes | None) -> tuple[Comm | None]:
        """Every rank of the parent says its color and key (a collective of the parent); the ranks of one color
        form a new communicator, ranked by key then by their rank in the parent. NCCL_SPLIT_NOCOLOR: none."""
        parent = self._comm(comm)
        salt = f"split {parent.meeting.collectives}"
        choices = [SPLIT.unpack(p) for p in parent.meeting.exchange(SPLIT.pack(color, key))]
        if color == NO_COLOR:
            return (None,)
        members = sorted((k, r) for r, (c, k) in enumerate(choices) if c == color)
        rank = [r for _k, r in members].index(parent.rank)
        made = Comm(Rendezvous(derived_id(parent.meeting.token, f"{salt} color {color}"), len(members), rank),
                    parent.device)
        self.comms.append(made)
        return (made,)

    def ncclCommCount(self, comm: Any) -> tuple[int]:
        return (self._comm(comm).nranks,)

    def ncclCommUserRank(self, comm: Any) -> tuple[int]:
        return (self._comm(comm).rank,)

    def ncclCommCuDevice(self, comm: Any) -> tuple[int]:
        return (self._comm(comm).device,)

    def ncclCommFinalize(self, comm: Comm) -> None:
        self._comm(comm)  # every operation has completed: calls run as they come

    def ncclCommDestroy(self, comm: Comm) -> None:
        self._comm(comm).meeting.leave()
        self.comms.remove(comm)

    def ncclCommAbort(self, comm: Comm) -> None:
        self.ncclCommDestroy(comm)

    def ncclCommRegister(self, comm: Any, buff: int, size: int) -> tuple[bytes]:
        """A registration changes nothing here: its handle (a void *) is the buffer's address, checked."""
        self._comm(comm)
        self.memory.view(buff, size)
        return ((buff or 1).to_bytes(8, "little"),)

    def ncclCommDeregister(self, comm: Any, handle: int) -> None:
        self._comm(comm)

    def close(self) -> None:
        """The session's end: its ranks leave their communicators."""
        for comm in self.comms:
            comm.meeting.leave()
        self.comms.clear()

    def _comm(self, comm: Any) -> Comm:
        if not isinstance(comm, Comm) or comm not in self.comms:
            raise nccl_error("invalid_value", "not a live communicator of this session")
        return comm

    # ---- groups -------------------------------------------------------------------------------------
    def ncclGroupStart(self) -> None:
        self.group.depth += 1

    def ncclGroupEnd(self) -> None:
        if not self.group.depth:
            raise nccl_error("not_supported", "ncclGroupEnd without ncclGroupStart")
        self.group.depth -= 1
        if self.group.depth:
            return
        queued, self.group = [*self.group.sends, *self.group.rest], Group()
        for run in queued:
            run()

    def _run(self, run: Callable[[], None], send: bool = False) -> None:
        if not self.group.depth:
            run()
        else:
            (self.group.sends if send else self.group.rest).append(run)

    # ---- memory as arrays ---------------------------------------------------------------------------
    def _dtype(self, datatype: int) -> np.dtype:
        found = DTYPES.get(datatype)
        if found is None:
            raise nccl_error("invalid_value", f"data type {datatype} on the sim device (the fp8 types are not "
                             "served; numpy has no such type)")
        return found

    def _read(self, ptr: int, count: int, datatype: int) -> np.ndarray:
        dtype = self._dtype(datatype)
        return np.frombuffer(self.memory.read(ptr, count * dtype.itemsize), dtype).copy() if count else \
            np.zeros(0, dtype)

    def _write(self, ptr: int, values: np.ndarray) -> None:
        if values.size:
            self.memory.write(ptr, np.ascontiguousarray(values).tobytes())

    def _reduce(self, parts: list[bytes], datatype: int, op: int) -> np.ndarray:
        """The element-wise reduction of every rank's part, in the data type."""
        dtype = self._dtype(datatype)
        stacked = np.stack([np.frombuffer(p, dtype) for p in parts])
        if datatype == BF16:
            stacked = bf16_to_f32(stacked)
        elif dtype == np.float16:
            stacked = stacked.astype(np.float32)
        if op == AVG:
            if stacked.dtype.kind in "iu":
                total = stacked.sum(axis=0)
                result = np.sign(total) * (np.abs(total) // len(parts))
            else:
                result = stacked.sum(axis=0) / len(parts)
        elif op in REDUCE:
            result = REDUCE[op](stacked)
        else:
            raise nccl_error("invalid_value", f"reduction {op} (the sim serves sum, prod, max, min and avg)")
        if datatype == BF16:
            return f32_to_bf16(result)
        return result.astype(dtype)

    # ---- collectives --------------------------------------------------------------------------------
    def ncclAllReduce(self, send: int, recv: int, count: int, datatype: int, op: int, comm: Any,
                      stream: Any) -> None:
        comm = self._comm(comm)

        def run() -> None:
            parts = comm.meeting.exchange(self._read(send, count, datatype).tobytes())
            self._write(recv, self._reduce(parts, datatype, op))
        self._run(run)

    def ncclReduce(self, send: int, recv: int, count: int, datatype: int, op: int, root: int, comm: Any,
                   stream: Any) -> None:
        comm = self._root(comm, root)

        def run() -> None:
            parts = comm.meeting.exchange(self._read(send, count, datatype).tobytes())
            if comm.rank == root:
                self._write(recv, self._reduce(parts, datatype, op))
        self._run(run)

    def ncclBroadcast(self, send: int, recv: int, count: int, datatype: int, root: int, comm: Any,
                      stream: Any) -> None:
        comm = self._root(comm, root)

        def run() -> None:
            mine = self._read(send, count, datatype).tobytes() if comm.rank == root else b""
            parts = comm.meeting.exchange(mine)
            self._write(recv, np.frombuffer(parts[root], self._dtype(datatype)))
        self._run(run)

    def ncclBcast(self, buff: int, count: int, datatype: int, root: int, comm: Any, stream: Any) -> None:
        self.ncclBroadcast(buff, buff, count, datatype, root, comm, stream)

    def ncclAllGather(self, send: int, recv: int, count: int, datatype: int, comm: Any, stream: Any) -> None:
        comm = self._comm(comm)

        def run() -> None:
            parts = comm.meeting.exchange(self._read(send, count, datatype).tobytes())
            self._write(recv, np.frombuffer(b"".join(parts), self._dtype(datatype)))
        self._run(run)

    def ncclReduceScatter(self, send: int, recv: int, count: int, datatype: int, op: int, comm: Any,
                          stream: Any) -> None:
        comm = self._comm(comm)

        def run() -> None:
            parts = comm.meeting.exchange(self._read(send, count * comm.nranks, datatype).tobytes())
            reduced = self._reduce(parts, datatype, op)
            self._write(recv, reduced[comm.rank * count: (comm.rank + 1) * count])
        self._run(run)

    def ncclAlltoAll(self, send: int, recv: int, count: int, datatype: int, comm: Any, stream: Any) -> None:
        comm = self._comm(comm)

        def run() -> None:
            parts = comm.meeting.exchange(self._read(send, count * comm.nranks, datatype).tobytes())
            dtype = self._dtype(datatype)
            mine = [np.frombuffer(p, dtype)[comm.rank * count: (comm.rank + 1) * count] for p in parts]
            self._write(recv, np.concatenate(mine) if mine else np.zeros(0, dtype))
        self._run(run)

    def ncclGather(self, send: int, recv: int, count: int, datatype: int, root: int, comm: Any,
                   stream: Any) -> None:
        comm = self._root(comm, root)

        def run() -> None:
            parts = comm.meeting.exchange(self._read(send, count, datatype).tobytes())
            if comm.rank == root:
                self._write(recv, np.frombuffer(b"".join(parts), self._dtype(datatype)))
        self._run(run)

    def ncclScatter(self, send: int, recv: int, count: int, datatype: int, root: int, comm: Any,
                    stream: Any) -> None:
        comm = self._root(comm, root)

        def run() -> None:
            mine = self._read(send, count * comm.nranks, datatype).tobytes() if comm.rank == root else b""
            parts = comm.meeting.exchange(mine)
            values = np.frombuffer(parts[root], self._dtype(datatype))
            self._write(recv, values[comm.rank * count: (comm.rank + 1) * count])
        self._run(run)

    def _root(self, comm: Any, root: int) -> Comm:
        comm = self._comm(comm)
        if not 0 <= root < comm.nranks:
            raise nccl_error("invalid_value", f"root {root} of a communicator of {comm.nranks}")
        return comm

    # ---- point to point -----------------------------------------------------------------------------
    def ncclSend(self, send: int, count: int, datatype: int, peer: int, comm: Any, stream: Any) -> None:
        comm = self._comm(comm)
        data = self._read(send, count, datatype).tobytes()  # the bytes as they are at the call, as in order
        self._run(lambda: comm.meeting.send(peer, data), send=True)

    def ncclRecv(self, recv: int, count: int, datatype: int, peer: int, comm: Any, stream: Any) -> None:
        comm = self._comm(comm)
        size = count * self._dtype(datatype).itemsize

        def run() -> None:
            data = comm.meeting.recv(peer)
            if len(data) != size:
                raise nccl_error("invalid_value", f"rank {comm.rank} expected {size} bytes from rank {peer}, which "
                                 f"sent {len(data)}")
            self._write(recv, np.frombuffer(data, np.uint8))
        self._run(run)
