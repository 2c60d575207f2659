"""One client cannot reach another's device memory through any call.

Each session is a worker process with an address space of its own (on the sim device, at a
random base, as separate processes on a GPU have separate address spaces). A pointer of
another session therefore points at nothing: every copy, memset, 2D copy, launch or free
with it fails, and the owner's bytes stay as they were.
"""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path

import pytest
from conftest import Server, start_server
from pyclient import CTX, PyClient, rss, sessions

from xpuremote.protocol import abi, errors, mathlibs, memprops
from xpuremote.protocol.calls import CALLS, SENT_INSTEAD
from xpuremote.protocol.layouts import MEMCPY2D, MEMCPY3D
from xpuremote.server.backends import sim
from xpuremote.server.limits import Accounted, Limits, Regions
from xpuremote.server.session import Session

SIZE = 64 << 10
PTX = b"""
.version 8.0
.target sm_90
.address_size 64
.visible .entry saxpy(.param .f32 a, .param .u64 x, .param .u64 y, .param .u32 n)
{
    ret;
}
"""
MODULE, FUNCTION = 0x7C00_0000_4000, 0x7C00_0000_4010


def lane_record(opcode: int, *args: int) -> bytes:
    """A fast-lane record of integer arguments in context CTX."""
    head = abi.pack_lane_record(opcode=opcode, nargs=len(args), blob_at=abi.LANE_NO_BLOB, ctx=CTX)
    return head + struct.pack(f"<{len(args)}Q", *args)


def load(client: PyClient) -> None:
    client.post("xpuModuleLoad", MODULE, hashlib.sha256(PTX).digest(), PTX, len(PTX))  # key: 32 bytes
    client.post("xpuModuleGetFunction", FUNCTION, MODULE, "saxpy")
    assert client.status_of("cuCtxSynchronize") == errors.SUCCESS


def pool_alloc(client: PyClient, size: int) -> int:
    """An allocation of the device's default memory pool (cuMemAllocAsync)."""
    return int.from_bytes(client.call("cuMemAllocAsync", 8, size, 0)[0], "little")


def vmm_alloc(client: PyClient, granules: int = 1) -> int:
    """Physical memory (cuMemCreate) mapped, with access, into a range of its own (VMM); its address."""
    size = granules * memprops.GRANULARITY
    prop = memprops.ALLOCATION_PROP.pack(memprops.PINNED, 0, memprops.ON_DEVICE, 0, 0, 0, 0, 0)
    address = int.from_bytes(client.call("cuMemAddressReserve", 8, size, 0, 0, 0)[0], "little")
    handle = int.from_bytes(client.call("cuMemCreate", 8, size, prop, 0)[0], "little")
    client.post("cuMemMap", address, size, 0, handle, 0)
    client.post("cuMemSetAccess", address, size, memprops.ACCESS_DESC.pack(memprops.ON_DEVICE, 0,
                                                                          memprops.ACCESS_READWRITE), 1)
    return address


def saxpy(client: PyClient, x: int, y: int, n: int) -> int:
    """Launch saxpy(2.0, x, y, n); the status of the launch (reported by the next sync call)."""
    params = struct.pack("<f4xQQi", 2.0, x, y, n)
    client.post("xpuLaunchKernel", FUNCTION, 1, 1, 1, n, 1, 1, 0, 0, params, len(params), 0)
    return client.status_of("cuCtxSynchronize")


# Two GPU processes may be given the same addresses (the owner's pointer is then the intruder's own),
# and PTX's saxpy is an empty body that only the sim's host saxpy makes compute; the per-session check
# of every address is test_every_device_address_is_checked_against_the_session's, on every backend.
@pytest.mark.sim_only(reason="the sim's random per-session address bases and its host saxpy")
def test_foreign_pointers_fail_and_the_owner_data_stays(server: Server) -> None:
    owner = PyClient(server.address)
    intruder = PyClient(server.address)
    try:
        secret = bytes(range(256)) * (SIZE // 256)
        theirs = [owner.alloc(SIZE), pool_alloc(owner, SIZE), vmm_alloc(owner)]  # each kind of device memory
        for ptr in theirs:
            owner.write(ptr, secret)
        mine = intruder.alloc(SIZE)
        intruder.write(mine, b"\x11" * SIZE)
        # the attempts below must not land in the intruder's own buffer (odds of about 2**-30 a run)
        assert not any(abs(ptr - mine) < 2 * SIZE for ptr in theirs), "the two sessions drew overlapping addresses"
        load(intruder)
        # the launch path works with the intruder's own pointers, so its failures below are the pointers'
        assert saxpy(intruder, mine, mine, 16) == errors.SUCCESS

        attempts = {}
        for i, ptr in enumerate(theirs):
            inside = ptr + 100 * i  # the start of an allocation, and addresses inside one
            attempts |= {
                f"DtoH {i}": intruder.status_of("cuMemcpyDtoH_v2", 64, inside, 64),
                f"HtoD {i}": intruder.status_of("cuMemcpyHtoD_v2", inside, b"\xee" * 64, 64),
                f"DtoD from {i}": intruder.status_of("cuMemcpy", mine, inside, 64),
                f"DtoD to {i}": intruder.status_of("cuMemcpy", inside, mine, 64),
                f"2D to host {i}": intruder.status_of("xpuMemcpy2DToHost", 64, inside, 64, 64, 1, 0),
                f"2D on device {i}": intruder.status_of("xpuMemcpy2DDevice", inside, 64, mine, 64, 64, 1, 0),
                f"launch reading {i}": saxpy(intruder, inside, mine, 16),
                f"launch writing {i}": saxpy(intruder, mine, inside, 16),
            }
            intruder.post("cuMemsetD8_v2", inside, 0xEE, 64)
            attempts[f"memset {i}"] = intruder.status_of("cuCtxSynchronize")
            intruder.post("cuMemFree_v2", inside)
            attempts[f"free {i}"] = intruder.status_of("cuCtxSynchronize")
        succeeded = [what for what, status in attempts.items() if status == errors.SUCCESS]
        assert not succeeded, f"calls with another client's pointers succeeded: {succeeded}"

        for ptr in theirs:
            assert owner.read(ptr, SIZE) == secret, "the owner's data changed"
        assert intruder.read(mine, SIZE) != b"\x11" * SIZE  # its own saxpy ran on its own memory
    finally:
        owner.close()
        intruder.close()


@pytest.mark.sim_only(reason="the sim's address layout (sim.Memory)")
def test_address_windows_have_far_more_entropy_than_a_scan_can_cover() -> None:
    """Each session draws its base from a range of 64 TiB at 64 KiB steps (30 bits): 2,000
    sessions' bases are all but distinct, aligned, and spread over the whole range."""
    bases = [sim.Memory(1 << 30).alloc(16) for _ in range(2000)]
    # a pair in 2,000 draws from 2**30 coincides with odds of about 1 in 500 (the birthday bound);
    # three pairs, about 1 in 10**9; a 12-bit window gave hundreds
    assert len(set(bases)) >= len(bases) - 2, "sessions drew the same base"
    assert all(sim.BASE_LOW <= b < sim.BASE_HIGH and b % (64 << 10) == 0 for b in bases)
    buckets = {(b - sim.BASE_LOW) * 16 // (sim.BASE_HIGH - sim.BASE_LOW) for b in bases}
    assert buckets == set(range(16)), sorted(buckets)  # a miss here is a chance of (15/16)**2000


# ---- what a hand-made client may send ----------------------------------------------------------
HOSTILE = 0x5555_0000_1000  # where a worker process might keep its own memory (a heap, a key)
HOST, DEVICE = 1, 2


def raw_host_pointer_calls(mine: int) -> dict[str, tuple[str, ...]]:
    """Calls that the client library rewrites and never sends as they are, each with a host pointer of the
    worker's (a struct's srcHost, a launch's kernelParams): replayed by a real driver, they would read it."""
    copy_2d = MEMCPY2D.pack(0, 0, HOST, HOSTILE, 0, 0, 64, 0, 0, DEVICE, 0, mine, 0, 64, 64, 1)
    copy_3d = MEMCPY3D.pack(0, 0, 0, 0, HOST, HOSTILE, 0, 0, 64, 1, 0, 0, 0, 0, DEVICE, 0, mine, 0, 64, 1, 64, 1, 1)
    return {
        "cuMemcpy": ("cuMemcpy", mine, HOSTILE, 64),
        "cuMemcpyAsync": ("cuMemcpyAsync", mine, HOSTILE, 64, 0),
        "cuMemcpy2D_v2": ("cuMemcpy2D_v2", copy_2d),
        "cuMemcpy2DUnaligned_v2": ("cuMemcpy2DUnaligned_v2", copy_2d),
        "cuMemcpy3D_v2": ("cuMemcpy3D_v2", copy_3d),
        # kernelParams: an array of argument pointers the driver would read, as the client passes it
        "cuLaunchKernel": ("cuLaunchKernel", FUNCTION, 1, 1, 1, 1, 1, 1, 0, 0, 32, None),
    }


def host_pointer_statuses(client: PyClient, mine: int) -> dict[str, int]:
    """What the server answers each of raw_host_pointer_calls."""
    return {name: client.status_of(*call) for name, call in raw_host_pointer_calls(mine).items()}


def test_calls_the_client_never_sends_are_refused(server: Server) -> None:
    client = PyClient(server.address)
    try:
        mine = client.alloc(SIZE)
        load(client)
        refused = host_pointer_statuses(client, mine)
        assert refused == dict.fromkeys(refused, errors.NOT_SUPPORTED), refused
        client.write(mine, b"ok" * 32)
        assert client.read(mine, 64) == b"ok" * 32  # the session goes on
    finally:
        client.close()


def test_freed_memory_is_refused_right_after_calls_that_named_it(server: Server) -> None:
    """The worker's limits and the sim remember the buffer they found last (calls name one buffer again and
    again); a free forgets it: the next call naming it, in a lane or not, is refused, its neighbour is not."""
    client = PyClient(server.address)
    try:
        first, second = client.alloc(SIZE), client.alloc(SIZE)
        for _ in range(3):
            client.post("cuMemsetD8Async", first, 1, SIZE, 0)
        record = lane_record(CALLS["cuMemsetD8Async"].opcode, first, 2, SIZE, 0)
        client.post("xpuLane", record, len(record))
        client.post("cuMemFree_v2", first)
        assert client.status_of("cuMemsetD8_v2", first, 3, SIZE) == errors.INVALID_VALUE
        client.post("xpuLane", record, len(record))
        assert client.status_of("cuCtxSynchronize") == errors.INVALID_VALUE  # the lane's record failed
        client.post("cuMemsetD8Async", second, 4, SIZE, 0)
        assert client.read(second, SIZE) == b"\x04" * SIZE
    finally:
        client.close()


def test_the_limits_refuse_on_the_compiled_path_where_the_backend_would_not() -> None:
    """The limits layer alone, in process: memory the sim holds but this client never allocated through the
    limits (as another tenant's would be on a shared GPU) is refused to a batch's memset and to a lane record,
    both run compiled; the client's own memory is not."""
    backend = Accounted(sim.SimBackend(), Limits())
    session = Session(backend)
    session.execute(CALLS["cuDevicePrimaryCtxRetain"], [CTX, 0])
    session.execute(CALLS["cuCtxSetCurrent"], [CTX])
    mine = int.from_bytes(session.execute(CALLS["cuMemAlloc_v2"], [8, SIZE])[0], "little")
    foreign = backend.inner.memory.alloc(SIZE)  # the sim has it; the limits never saw it
    memset = CALLS["cuMemsetD8Async"]
    lane = b"".join(lane_record(memset.opcode, address, 7, SIZE, 0)
                    for address in (foreign, mine))
    for batch in ([[memset.opcode, [foreign, 7, SIZE, 0]]], [[CALLS["xpuLane"].opcode, [lane, len(lane)]]]):
        answer = session.run_batch(batch + [[CALLS["cuCtxSynchronize"].opcode, []]], True)
        assert [d[0] for d in answer["deferred"]] == [memset.symbol], answer
        assert "not inside one of this client's allocations" in answer["deferred"][0][2], answer
    assert backend.inner.memory.read(foreign, SIZE) == bytes(SIZE)
    assert backend.inner.memory.read(mine, SIZE) == b"\x07" * SIZE


def test_the_remembered_buffer_is_forgotten_when_freed() -> None:
    """Each layer alone (the other would refuse the call too): the limits' regions and the sim's memory."""
    regions = Regions()
    regions.add(0x1000, 0x100)
    regions.add(0x1100, 0x100)  # adjacent: one range
    assert regions.holds(0x1080, 0x100) and regions.holds(0x1000, 0x10)
    regions.remove(0x1100)
    assert not regions.holds(0x1080, 0x100) and regions.holds(0x1000, 0x10)
    regions.remove(0x1000)
    assert not regions.holds(0x1000, 0x10)
    memory = sim.Memory(1 << 20)
    base = memory.alloc(4096)
    assert memory.allocation_at(base + 8) is not None
    memory.free(base)
    assert memory.allocation_at(base + 8) is None


def test_every_device_address_is_checked_against_the_session(server: Server) -> None:
    """Driver copies, memsets and 2D halves, a cuBLAS GEMM's matrices, a device-mode scalar and a
    cuBLASLt bias pointer: each naming a foreign or host address (or running past the end of the
    client's own allocation) is refused before it reaches the backend; the session goes on."""
    client = PyClient(server.address)
    try:
        mine = client.alloc(SIZE)
        end = mine + SIZE - 32  # inside, but 64 bytes from here are not
        handle, desc = 0x7C00_0000_5000, 0x7C00_0000_5010
        client.post("cublasCreate_v2", handle)
        client.post("cublasLtMatmulDescCreate", desc, 68, 0)  # CUBLAS_COMPUTE_32F, CUDA_R_32F
        assert client.status_of("cuCtxSynchronize") == errors.SUCCESS
        for bad in (HOSTILE, end):
            attempts = {
                "DtoH": client.status_of("cuMemcpyDtoH_v2", 64, bad, 64),
                "HtoD": client.status_of("cuMemcpyHtoD_v2", bad, b"\xee" * 64, 64),
                "DtoD": client.status_of("cuMemcpyDtoD_v2", mine, bad, 64),
                "2D to host": client.status_of("xpuMemcpy2DToHost", 64, bad, 64, 64, 1, 0),
                "2D from host": client.status_of("xpuMemcpy2DFromHost", bad, 64, b"\xee" * 64, 64, 1, 0),
                # rows of pitch 0: 64 KiB of device memory, but a 256 KiB answer to build
                "2D pitch 0": client.status_of("xpuMemcpy2DToHost", 64 * 4096, mine, 0, 64, 4096, 0),
            }
            for name, call in {"memset": ("cuMemsetD32_v2", bad, 7, 16),
                               "2D memset": ("cuMemsetD2D8_v2", bad, 64, 7, 64, 1)}.items():
                client.post(*call)
                attempts[name] = client.status_of("cuCtxSynchronize")
            assert attempts == dict.fromkeys(attempts, errors.INVALID_VALUE), attempts
        # cublasSgemm_v2(handle, N, N, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc), device pointer mode
        client.post("cublasSetPointerMode_v2", handle, 1)
        gemm = ["cublasSgemm_v2", handle, 0, 0, 2, 2, 2, mine, mine, 2, mine, 2, mine, mine, 2]
        assert client.status_of("cuCtxSynchronize") == errors.SUCCESS
        for position in (7, 8, 10, 13):  # alpha, A, B, C
            call = list(gemm)
            call[position] = HOSTILE
            client.post(*call)
            assert client.status_of("cuCtxSynchronize") != errors.SUCCESS, f"gemm with argument {position} foreign"
        bias = HOSTILE.to_bytes(8, "little")  # CUBLASLT_MATMUL_DESC_BIAS_POINTER
        client.post("cublasLtMatmulDescSetAttribute", desc, 8, bias, 8)
        assert client.status_of("cuCtxSynchronize") != errors.SUCCESS
        assert "not inside one of this client's allocations" in server.log()
        client.write(mine, b"ok" * 32)
        assert client.read(mine, 64) == b"ok" * 32
    finally:
        client.close()


# ---- what a session may hold ----------------------------------------------------------------------
def variable_elf(size: int, name: bytes = b"big") -> bytes:
    """A cubin of a few hundred bytes declaring one `__device__ char big[size]` (in .nv.global, which
    takes no room in the file): loading it commits `size` bytes of device memory."""
    shstrtab, strtab = b"\0.shstrtab\0.strtab\0.symtab\0.nv.global\0", b"\0" + name + b"\0"
    symtab = bytes(24) + struct.pack("<IBBHQQ", 1, 0x11, 0, 4, 0, size)  # GLOBAL OBJECT in section 4
    body = shstrtab + strtab + symtab
    shoff = 64 + len(body)
    header = b"\x7fELF\x02\x01\x01\x33" + bytes(8) + struct.pack(
        "<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 90, 64, 56, 0, 64, 5, 1)
    section = struct.Struct("<IIQQQQIIQQ")
    at = 64
    sections = [bytes(64)]
    for name_at, kind, data, link in ((1, 3, shstrtab, 0), (11, 3, strtab, 0), (19, 2, symtab, 2)):
        sections.append(section.pack(name_at, kind, 0, 0, at, len(data), link, 1, 1, 24 if kind == 2 else 0))
        at += len(data)
    sections.append(section.pack(27, 8, 3, 0, at, size, 0, 0, 256, 0))  # SHT_NOBITS, WRITE|ALLOC
    return header + body + b"".join(sections)


def load_image(client: PyClient, handle: int, image: bytes) -> int:
    client.post("xpuModuleLoad", handle, hashlib.sha256(image).digest(), image, len(image))
    return client.status_of("cuCtxSynchronize")


# variable_elf is an ELF header and a symbol, no code or notes: the sim loads it, NVIDIA's driver would not.
@pytest.mark.sim_only(reason="a hand-made cubin that only the sim loads")
def test_module_variables_count_against_the_quota(tmp_path: Path) -> None:
    srv = start_server(tmp_path, args=("--mem-quota", "1M"))
    client = PyClient(srv.address)
    try:
        huge = variable_elf(2 << 30)
        assert len(huge) < 600
        assert load_image(client, MODULE, huge) == errors.OUT_OF_MEMORY
        huge_ptx = PTX + b".visible .global .align 1 .b8 big[2147483648];\n"  # what a JIT would commit
        assert load_image(client, MODULE, huge_ptx) == errors.OUT_OF_MEMORY
        assert load_image(client, MODULE + 16, variable_elf(600_000)) == errors.SUCCESS
        assert client.status_of("cuMemAlloc_v2", 8, 600_000) == errors.OUT_OF_MEMORY  # the variable holds 600 KB
        address, size = client.call("cuModuleGetGlobal_v2", 8, 8, MODULE + 16, "big")
        variable = int.from_bytes(address, "little")
        assert int.from_bytes(size, "little") == 600_000
        client.write(variable + 599_000, b"v" * 1000)  # a module variable is the client's memory too
        assert client.read(variable + 599_000, 1000) == b"v" * 1000
        client.post("cuModuleUnload", MODULE + 16)
        assert client.status_of("cuMemcpyDtoH_v2", 8, variable, 8) == errors.INVALID_VALUE  # gone with its module
        client.alloc(600_000)  # unloading gave its variable's bytes back
    finally:
        client.close()
        srv.stop()


def test_tiny_allocations_cost_the_driver_granule(tmp_path: Path) -> None:
    """1 MiB of one-byte allocations would be a million of them; at 512 bytes each, 2,048 fill it."""
    srv = start_server(tmp_path, args=("--mem-quota", "1M"))
    client = PyClient(srv.address)
    try:
        made = 0
        while made < 4096 and client.status_of("cuMemAlloc_v2", 8, 1) == errors.SUCCESS:
            made += 1
        assert made == 2048
        assert client.status_of("cuMemAlloc_v2", 8, 1) == errors.OUT_OF_MEMORY
    finally:
        client.close()
        srv.stop()


def test_handles_of_each_kind_are_bounded(tmp_path: Path) -> None:
    limit = 300
    srv = start_server(tmp_path, args=("--max-handles", str(limit)))
    client = PyClient(srv.address)
    try:
        worker = sessions(srv.address)[0]["worker_pid"]
        alloc_failed = mathlibs.status_code(mathlibs.CUDNN, "alloc_failed")
        kinds = (("cuStreamCreate", "cuStreamDestroy_v2", 0), ("cuEventCreate", "cuEventDestroy_v2", 0),
                 ("cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"))
        for kind, (create, destroy, *flags) in enumerate(kinds):
            failed = alloc_failed if create.startswith("cudnn") else errors.OUT_OF_MEMORY
            handles = [0x7C00_1000_0000 + kind * 0x100_0000 + 16 * i for i in range(limit + 1)]
            for handle in handles[:limit]:
                client.post(create, handle, *flags)
            assert client.status_of("cuCtxSynchronize") == errors.SUCCESS
            client.post(create, handles[limit], *flags)
            assert client.status_of("cuCtxSynchronize") == failed, create
            client.post(destroy, handles[0])
            client.post(create, handles[limit], *flags)  # a destroyed one makes room
            assert client.status_of("cuCtxSynchronize") == errors.SUCCESS, create
        held = [client.alloc(16) for _ in range(limit)]
        assert client.status_of("cuMemAlloc_v2", 8, 16) == errors.OUT_OF_MEMORY
        before = rss(worker)
        for _ in range(20):  # thousands more attempts, all refused, cost the worker nothing
            for i in range(200):
                client.post("cuStreamCreate", 0x7C00_2000_0000 + 16 * i, 0)
            assert client.status_of("cuCtxSynchronize") == errors.OUT_OF_MEMORY
        assert rss(worker) - before < 32 << 20
        client.post("cuMemFree_v2", held[0])
        client.write(client.alloc(16), b"x" * 16)  # the session goes on
    finally:
        client.close()
        srv.stop()


def test_the_server_takes_every_call_the_client_library_sends() -> None:
    """`Call.sent` against client/: every call it names, and every call its generic path forwards, is
    served; what it rewrites (SENT_INSTEAD) it implements itself."""
    from xpuremote.client import driver, mathlibs

    driver.handlers(), mathlibs.handlers()  # register the implementations
    implemented = driver.IMPLEMENTATIONS
    source = "".join(path.read_text() for path in (Path(driver.__file__).parent).glob("*.py"))
    named = set()
    for name in re.findall(r'CALLS\[f?"([\w{}]+)"\]', source):
        named |= {name.replace("{suffix}", suffix) for suffix in ("", "Async")}
    generic = {s for s, c in CALLS.items() if c.cls in ("sync", "async", "shadow")
               and s not in implemented and c.family not in implemented}
    assert named and generic
    assert [s for s in sorted(named | generic) if not CALLS[s].sent] == []
    assert [f for f in SENT_INSTEAD if f not in implemented] == []
