"""Memory pools (stream-ordered allocation) and virtual memory management (VMM).

cuda-python's driver bindings, unmodified, through the shim on the session's server and through the
cuda backend's generic replay (a stand-in libcuda chained to a sim server); the stock PyTorch wheel's
two allocators that use them, `backend:cudaMallocAsync` and `expandable_segments:True`; and what a
session's limits make of pool and VMM memory (quota, handles, reserved but unmapped addresses).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import BACKEND, ROOT, TORCH_SIM_KERNELS, Server, assert_all_ok, start_server
from pyclient import PyClient
from toolchain import cudart_path

from xpuremote.protocol import errors, memprops, trace

PROGRAM = ROOT / "tests" / "programs" / "memory_pools_check.py"
TORCH_PROGRAM = ROOT / "tests" / "programs" / "torch_allocators_check.py"
MALLOC_ASYNC = ROOT / "tests" / "programs" / "malloc_async_check.py"
MIB = 1 << 20
GRANULE = memprops.GRANULARITY
PROP = memprops.ALLOCATION_PROP.pack(memprops.PINNED, 0, memprops.ON_DEVICE, 0, 0, 0, 0, 0)
ACCESS = memprops.ACCESS_DESC.pack(memprops.ON_DEVICE, 0, memprops.ACCESS_READWRITE)


@pytest.mark.parametrize("where", ["server", pytest.param("cuda backend", marks=pytest.mark.sim_only(
    reason="the cuda backend on a stand-in libcuda chained to a sim server"))])
def test_pools_and_vmm_through_cuda_python(run_on, request, where: str) -> None:
    """Default and created pools (allocation, attributes, trim, access, destroy), VMM (reserve, create,
    map, access, copies, memsets and a kernel across adjacent mappings, an alias of one physical
    allocation, retain, unmap, release, free), pointer attributes, and the refusals: unmapped
    addresses, exportable memory, a host pointer in the properties."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python (cuda-bindings) is not installed")
    address = request.getfixturevalue("chained")[0].address if where == "cuda backend" else None
    assert_all_ok(run_on([sys.executable, str(PROGRAM)], timeout=180, address=address), 150)


# ---- stream-ordered allocation waits for no answer ---------------------------------------------------------
def run_malloc_async(run_on, *args: str, **env: str) -> dict[str, Any]:
    libcudart = cudart_path(12) or cudart_path(13)
    if libcudart is None:
        pytest.skip("no NVIDIA runtime wheel (nvidia-cuda-runtime-cu12) is installed")
    proc = run_on([sys.executable, str(MALLOC_ASYNC), libcudart, *args], **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cuda_malloc_async_sends_no_waiting_message(run_on, tmp_path) -> None:
    """libcudart's cudaMallocAsync: after the pool's first allocation (which asks the server for the pool's
    addresses), 200 allocations and fills of 256 B to 2 MiB send no message that waits for an answer, twice
    (the second time in the addresses the first round freed); the memory holds what was written, the
    allocations do not overlap, and an allocation larger than the device is refused at once."""
    found = run_malloc_async(run_on, XPU_TRACE=str(tmp_path / "run.trace"))
    recorded = trace.read(tmp_path / "run.trace")
    allocations = [c for c in recorded.calls if c.name.startswith(("cuMemAllocAsync", "cuMemAllocFromPoolAsync"))]
    assert len(allocations) >= 401, len(allocations)
    for began, ended in found["windows"]:
        waited = [m for m in recorded.messages if m.kind != "async" and began <= m.sent <= ended]
        assert not waited, f"{len(waited)} messages waited for an answer during 200 allocations"
    assert found["values"] and found["values_again"] and found["disjoint"], found
    assert found["reused"], "the second round's allocations are placed where the first round's were freed"
    assert found["too_large"] == 2, found  # cudaErrorMemoryAllocation


def test_cuda_malloc_async_beyond_the_quota_fails_at_the_next_synchronisation(run_on, tmp_path) -> None:
    """Under --mem-quota the client cannot tell that an allocation is too much: cudaMallocAsync answers at once,
    the next synchronisation reports CUDA_ERROR_OUT_OF_MEMORY, the free of that allocation is quiet, and the
    session goes on."""
    srv = start_server(tmp_path, args=("--mem-quota", "8M"))
    try:
        found = run_malloc_async(run_on, "quota", address=srv.address)
    finally:
        srv.stop()
    assert found == {"within": 0, "beyond": 0, "synchronize": 2, "free": 0, "after": 0, "again": 0,
                     "value": True}, found


@pytest.mark.sim_only(reason="the sim's random per-session address bases: two GPU processes may share addresses")
def test_placed_allocations_are_checked(server: Server) -> None:
    """A hand-made client's xpuMemPoolAlloc is refused outside the ranges reserved for that pool, over memory it
    holds, or in another session's range; what it placed properly is its memory, and another session's
    placed memory is out of its reach."""
    owner, intruder = PyClient(server.address), PyClient(server.address)
    try:
        (pool,) = owner.call("cuDeviceGetDefaultMemPool", 8, 0)
        pool = int.from_bytes(pool, "little")
        (base,) = owner.call("xpuMemPoolReserve", 8, pool, 64 * MIB)
        base = int.from_bytes(base, "little")
        owner.post("xpuMemPoolAlloc", pool, base, MIB, 0)
        owner.write(base + MIB - 64, b"placed" * 10)
        assert owner.read(base + MIB - 64, 60) == b"placed" * 10
        refused = {}
        for name, address, size in (("overlapping", base + MIB // 2, MIB), ("before the range", base - MIB, 512),
                                    ("running past the range", base + 63 * MIB, 2 * MIB)):
            owner.post("xpuMemPoolAlloc", pool, address, size, 0)
            refused[name] = owner.status_of("cuCtxSynchronize")
        (theirs,) = intruder.call("cuDeviceGetDefaultMemPool", 8, 0)
        theirs = int.from_bytes(theirs, "little")
        intruder.call("xpuMemPoolReserve", 8, theirs, 64 * MIB)
        intruder.post("xpuMemPoolAlloc", theirs, base + 2 * MIB, MIB, 0)  # in the owner's range
        refused["another session's range"] = intruder.status_of("cuCtxSynchronize")
        refused["reading placed memory"] = intruder.status_of("cuMemcpyDtoH_v2", 64, base + MIB - 64, 64)
        intruder.post("cuMemFreeAsync", base, 0)
        refused["freeing it"] = intruder.status_of("cuCtxSynchronize")
        assert refused == dict.fromkeys(refused, errors.INVALID_VALUE), refused
        assert owner.read(base + MIB - 64, 60) == b"placed" * 10
        owner.post("cuMemFreeAsync", base, 0)
        owner.post("xpuMemPoolAlloc", pool, base + MIB // 2, MIB, 0)  # free again: placed anew
        assert owner.status_of("cuCtxSynchronize") == errors.SUCCESS
    finally:
        owner.close()
        intruder.close()


# ---- the stock PyTorch wheel's allocators ----------------------------------------------------------------
@pytest.fixture(scope="module")
def torch_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("torch-allocators"), env={"XPU_SIM_KERNELS": TORCH_SIM_KERNELS})
    yield srv
    srv.stop()


def run_allocator(server: Server, conf: str) -> tuple[dict[str, Any], str]:
    from test_torch import run_torch

    proc = run_torch(server, [str(TORCH_PROGRAM)], PYTORCH_CUDA_ALLOC_CONF=conf)
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode})\nstderr:\n{proc.stderr[-4000:]}"
    found = json.loads(lines[-1])
    # tensors left alive are freed at exit, after the session has ended: that must not fail the program
    assert proc.returncode == 0, f"{json.dumps(found, indent=1)}\nstderr:\n{proc.stderr[-4000:]}"
    return found, proc.stderr


@pytest.mark.parametrize("conf", ["backend:cudaMallocAsync", "expandable_segments:True"])
def test_torch_allocators(torch_server: Server, conf: str) -> None:
    found, stderr = run_allocator(torch_server, conf)
    assert found["backend"] == ("cudaMallocAsync" if "cudaMallocAsync" in conf else "native")
    assert found["round_trips"] == dict.fromkeys(["1", "1000", str(MIB + 5), str(50 * MIB // 4), "fill", "zeros"],
                                                 True), found["round_trips"]
    grown = found["growth"]
    assert "error" not in grown, grown
    assert grown["values_kept"] and grown["reserved_grew"], grown
    assert grown["allocated"] == grown["expected"] and grown["allocated_after_free"] == 0, grown
    if BACKEND == "sim":  # the device is this session's alone: its free memory moves with the session's
        assert grown["expected"] <= grown["device_memory_taken"] == grown["device_memory_given_back"], grown
    assert found["graph"] == {"replays": [True, True]}, found["graph"]
    if "expandable" in conf:  # one segment that grew page by page (20 MiB each) to hold all six tensors
        assert grown["segments"] == 1 and grown["largest_segment"] >= 3 * 20 * MIB, grown
    unanswered = [line for line in stderr.splitlines() if "not supported by xpuremote" in line]
    assert not unanswered and "Traceback" not in stderr, stderr[-4000:]


# ---- a session's limits ---------------------------------------------------------------------------------------
def vmm_mapping(client: PyClient, granules: int = 1) -> tuple[int, int]:
    """(address, handle) of `granules` granules of physical memory mapped, with access, into a new range."""
    size = granules * GRANULE
    (reserved,) = client.call("cuMemAddressReserve", 8, size, 0, 0, 0)
    (handle,) = client.call("cuMemCreate", 8, size, PROP, 0)
    address, handle = int.from_bytes(reserved, "little"), int.from_bytes(handle, "little")
    client.post("cuMemMap", address, size, 0, handle, 0)
    client.post("cuMemSetAccess", address, size, ACCESS, 1)
    return address, handle


def test_reserved_addresses_are_not_memory_until_mapped(server: Server) -> None:
    client = PyClient(server.address)
    try:
        (reserved,) = client.call("cuMemAddressReserve", 8, 4 * GRANULE, 0, 0, 0)
        base = int.from_bytes(reserved, "little")
        assert client.status_of("cuMemcpyHtoD_v2", base, b"x" * 64, 64) == errors.INVALID_VALUE
        (handle,) = client.call("cuMemCreate", 8, GRANULE, PROP, 0)
        client.post("cuMemMap", base + GRANULE, GRANULE, 0, int.from_bytes(handle, "little"), 0)
        client.post("cuMemSetAccess", base + GRANULE, GRANULE, ACCESS, 1)
        client.write(base + GRANULE, b"mapped" * 10)
        assert client.read(base + GRANULE, 60) == b"mapped" * 10
        for outside in (base, base + 2 * GRANULE, base + 2 * GRANULE - 8):  # before, after, running past it
            assert client.status_of("cuMemcpyDtoH_v2", 16, outside, 16) == errors.INVALID_VALUE, hex(outside)
        assert "is not inside one of this client's allocations" in server.log()
    finally:
        client.close()


def test_pool_and_vmm_memory_count_against_the_quota(tmp_path) -> None:
    srv = start_server(tmp_path, args=("--mem-quota", "5M"))
    client = PyClient(srv.address)
    try:
        (first,) = client.call("cuMemCreate", 8, GRANULE, PROP, 0)
        client.call("cuMemCreate", 8, GRANULE, PROP, 0)
        assert client.status_of("cuMemCreate", 8, GRANULE, PROP, 0) == errors.OUT_OF_MEMORY  # 6 MiB > 5 MiB
        assert client.status_of("cuMemAllocAsync", 8, MIB + 1, 0) == errors.OUT_OF_MEMORY
        (pooled,) = client.call("cuMemAllocAsync", 8, MIB, 0)
        client.post("cuMemFreeAsync", int.from_bytes(pooled, "little"), 0)
        client.post("cuMemRelease", int.from_bytes(first, "little"))  # unmapped: its memory goes back
        client.call("cuMemCreate", 8, GRANULE, PROP, 0)
    finally:
        client.close()
        srv.stop()


POOL_PROPS = memprops.POOL_PROPS.pack(memprops.PINNED, 0, memprops.ON_DEVICE, 0, 0, 0, 0, 0)
GRAPH, STREAM = 0x7C00_0000_3000, 0x7C00_0000_3020


def test_graph_memory_counts_against_the_quota_while_a_graph_or_instantiation_holds_it(tmp_path) -> None:
    """An allocation node is charged when it is made and stays charged while its graph or an instantiation of it
    lives (the driver keeps the address for them); a free of it outside the graph gives nothing back."""
    srv = start_server(tmp_path, args=("--mem-quota", "3M"))
    client = PyClient(srv.address)
    try:
        client.post("cuGraphCreate", GRAPH, 0)
        node, dptr = client.call("xpuGraphAddMemAllocNode", 8, GRAPH, None, 0, POOL_PROPS, None, 0, 2 * MIB, 8)
        assert client.status_of("xpuGraphAddMemAllocNode", 8, GRAPH, None, 0, POOL_PROPS, None, 0, 2 * MIB, 8) \
            == errors.OUT_OF_MEMORY  # 4 MiB > 3 MiB
        (graph_exec,) = client.call("cuGraphInstantiateWithFlags", 8, GRAPH, 0)
        client.post("cuGraphDestroy", GRAPH)
        client.post("cuMemFreeAsync", int.from_bytes(dptr, "little"), 0)  # the graph's: stays charged
        assert client.status_of("cuMemAlloc_v2", 8, 2 * MIB) == errors.OUT_OF_MEMORY  # the instantiation holds it
        client.post("cuGraphExecDestroy", int.from_bytes(graph_exec, "little"))
        client.alloc(2 * MIB)
        client.post("cuStreamCreate", STREAM, 1)
        client.post("xpuStreamBeginCapture", GRAPH, STREAM, 0)
        (captured,) = client.call("cuMemAllocAsync", 8, MIB, STREAM)  # the capture's graph's allocation
        assert client.status_of("cuMemAlloc_v2", 8, MIB) == errors.OUT_OF_MEMORY
        client.post("cuMemFreeAsync", int.from_bytes(captured, "little"), STREAM)  # a free node: charged still
        client.call("xpuStreamEndCapture", STREAM, GRAPH)
        assert client.status_of("cuMemAlloc_v2", 8, MIB) == errors.OUT_OF_MEMORY
        client.post("cuGraphDestroy", GRAPH)
        client.alloc(MIB)
    finally:
        client.close()
        srv.stop()


@pytest.mark.sim_only(reason="the sim's random per-session address bases: two GPU processes may share addresses")
def test_another_sessions_pool_and_vmm_memory_is_out_of_reach(server: Server) -> None:
    """Its pool allocations, mappings, reserved ranges and allocation handles: every call naming them fails,
    and the owner's bytes stay as they were."""
    owner, intruder = PyClient(server.address), PyClient(server.address)
    try:
        (pooled,) = owner.call("cuMemAllocAsync", 8, 64 << 10, 0)
        pooled = int.from_bytes(pooled, "little")
        mapped, handle = vmm_mapping(owner)
        secret = bytes(range(256)) * 256
        for address in (pooled, mapped):
            owner.write(address, secret)
        mine, my_handle = vmm_mapping(intruder)
        attempts: dict[str, int] = {}
        for name, address in (("pool", pooled), ("mapping", mapped)):
            attempts |= {f"read {name}": intruder.status_of("cuMemcpyDtoH_v2", 64, address + 64, 64),
                         f"write {name}": intruder.status_of("cuMemcpyHtoD_v2", address, b"\xee" * 64, 64),
                         f"retain {name}": intruder.status_of("cuMemRetainAllocationHandle", 8, address)}
        queued = {"free the pool's": ("cuMemFreeAsync", pooled, 0), "unmap": ("cuMemUnmap", mapped, GRANULE),
                  "map into its range": ("cuMemMap", mapped, GRANULE, 0, my_handle, 0),
                  "access": ("cuMemSetAccess", mapped, GRANULE, ACCESS, 1), "release": ("cuMemRelease", handle),
                  "free its range": ("cuMemAddressFree", mapped, GRANULE)}
        for name, call in queued.items():
            intruder.post(*call)
            attempts[name] = intruder.status_of("cuCtxSynchronize")
        attempts["properties"] = intruder.status_of("cuMemGetAllocationPropertiesFromHandle", 32, handle)
        succeeded = [what for what, status in attempts.items() if status == errors.SUCCESS]
        assert not succeeded, f"calls with another client's pool or VMM memory succeeded: {succeeded}"
        for address in (pooled, mapped):
            assert owner.read(address, len(secret)) == secret, "the owner's data changed"
        intruder.write(mine, b"mine" * 16)  # the intruder's session goes on
        assert intruder.read(mine, 64) == b"mine" * 16
    finally:
        owner.close()
        intruder.close()


VISIBLE = """
from cuda.bindings import driver as cu
import json
assert cu.cuInit(0)[0] == 0
_, ctx = cu.cuDevicePrimaryCtxRetain(0)
cu.cuCtxSetCurrent(ctx)
location = cu.CUmemLocation()
location.type, location.id = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, 0
prop = cu.CUmemAllocationProp()
prop.type, prop.location = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED, location
free_before = cu.cuMemGetInfo()[1]
err, handle = cu.cuMemCreate(2 << 20, prop, 0)
_, got = cu.cuMemGetAllocationPropertiesFromHandle(handle)
_, pool = cu.cuDeviceGetDefaultMemPool(0)
_, location_id = cu.cuMemPoolGetAttribute(pool, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_LOCATION_ID)
props = cu.CUmemPoolProps()
props.allocType, props.location = prop.type, location
_, created = cu.cuMemPoolCreate(props)
_, created_id = cu.cuMemPoolGetAttribute(created, cu.CUmemPool_attribute.CU_MEMPOOL_ATTR_LOCATION_ID)
print(json.dumps({"create": int(err), "property_id": got.location.id, "pool_location": int(location_id),
                  "created_location": int(created_id), "taken": free_before - cu.cuMemGetInfo()[1]}))
"""


@pytest.mark.sim_only(reason="two sim devices (XPU_SIM_DEVICES)")
def test_device_ordinals_inside_structs_are_the_applications(run_on, tmp_path) -> None:
    """Under CUDA_VISIBLE_DEVICES=1 the application's device 0 is the server's device 1: the ordinals in
    allocation properties, pool properties and a pool's LOCATION_ID are translated both ways, and the
    memory is made on the server's device 1."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python (cuda-bindings) is not installed")
    srv = start_server(tmp_path, env={"XPU_SIM_DEVICES": "2"})
    try:
        result = run_on([sys.executable, "-c", VISIBLE], address=srv.address, CUDA_VISIBLE_DEVICES="1")
        assert result.returncode == 0, result.stderr
        found = json.loads(result.stdout.strip().splitlines()[-1])
        assert found == {"create": 0, "property_id": 0, "pool_location": 0, "created_location": 0,
                         "taken": 2 << 20}, found
    finally:
        srv.stop()
