"""CUDA arrays and texture/surface objects: cuda-python's driver bindings under the shim
(tests/programs/array_check.py), on the session's server and through the cuda backend's generic replay;
and one session's arrays and objects out of another's reach."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT, assert_all_ok

PROGRAM = ROOT / "tests" / "programs" / "array_check.py"


@pytest.mark.parametrize("where", ["server", pytest.param("cuda backend", marks=pytest.mark.sim_only(
    reason="the cuda backend on stand-in libraries chained to a sim server"))])
def test_arrays_copies_and_texture_objects(run_on, request, where: str) -> None:
    """Arrays made, described and destroyed; 1D, 2D and 3D copies host/device/array with pitches and offsets;
    the driver's refusals; texture and surface objects over arrays and linear memory."""
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python (cuda-bindings) is not installed")
    address = request.getfixturevalue("chained")[0].address if where == "cuda backend" else None
    assert_all_ok(run_on([sys.executable, str(PROGRAM)], timeout=120, address=address), 100)


def test_another_session_cannot_use_them(server) -> None:
    """An array handle and a texture object are the session's: another session's calls naming them fail."""
    from xpuremote.client.connection import Connection
    from xpuremote.protocol import errors
    from xpuremote.protocol.calls import CALLS
    from xpuremote.protocol.layouts import ARRAY_DESCRIPTOR, RESOURCE_DESC

    owner, other = Connection(server.address), Connection(server.address)
    try:
        ctx = 0x7C00_0000_1000
        for conn in (owner, other):
            conn.post(CALLS["cuDevicePrimaryCtxRetain"], [ctx, 0], None)
        (handle,) = owner.call(CALLS["cuArrayCreate_v2"], [8, ARRAY_DESCRIPTOR.pack(16, 4, 0x20, 1)], ctx)[1]
        array = int.from_bytes(handle, "little")
        resource = RESOURCE_DESC.pack(0, array.to_bytes(8, "little") + bytes(120), 0)
        status, outs, _ = owner.call(CALLS["xpuTexObjectCreate"], [8, array, resource, bytes(104), None], ctx)
        assert status == errors.SUCCESS
        texture = int.from_bytes(outs[0], "little")
        status, _, _ = other.call(CALLS["xpuMemcpyArrayToHost"], [64, array, 0, 0, 0, 64, 1, 0], ctx)
        assert status == errors.INVALID_HANDLE
        other.post(CALLS["cuTexObjectDestroy"], [texture], ctx)
        status, _, deferred = other.call(CALLS["cuCtxSynchronize"], [], ctx)
        assert [d[:2] for d in deferred] == [["cuTexObjectDestroy", errors.INVALID_VALUE]], deferred
        status, outs, _ = owner.call(CALLS["xpuMemcpyArrayToHost"], [64, array, 0, 0, 0, 64, 1, 0], ctx)
        assert status == errors.SUCCESS and bytes(outs[0]) == bytes(64)  # a new array reads as zeros
        owner.post(CALLS["cuTexObjectDestroy"], [texture], ctx)
        owner.post(CALLS["cuArrayDestroy"], [array], ctx)
        status, _, deferred = owner.call(CALLS["cuCtxSynchronize"], [], ctx)
        assert status == errors.SUCCESS and not deferred, deferred
    finally:
        owner.close()
        other.close()


def test_arrays_count_against_the_quota_and_addresses_are_checked(tmp_path) -> None:
    """An array is device memory: the quota counts it and its destruction gives it back. A copy between an
    array and device memory, and a texture over linear memory, name only the client's own addresses."""
    from conftest import start_server
    from pyclient import PyClient

    from xpuremote.protocol import errors
    from xpuremote.protocol.layouts import ARRAY3D_DESCRIPTOR, RESOURCE_DESC, RESOURCE_LINEAR

    srv = start_server(tmp_path, args=("--mem-quota", "1M"))
    client = PyClient(srv.address)
    try:
        big = ARRAY3D_DESCRIPTOR.pack(256, 256, 3, 0x20, 1, 0)  # 768 KiB of floats
        first = int.from_bytes(client.call("cuArray3DCreate_v2", 8, big)[0], "little")
        assert client.status_of("cuArray3DCreate_v2", 8, big) == errors.OUT_OF_MEMORY
        assert client.status_of("cuMemAlloc_v2", 8, 600_000) == errors.OUT_OF_MEMORY
        client.post("cuArrayDestroy", first)
        assert client.status_of("cuCtxSynchronize") == errors.SUCCESS
        array = int.from_bytes(client.call("cuArray3DCreate_v2", 8, big)[0], "little")  # room again
        mine = client.alloc(4096)
        foreign = 0x5555_0000_1000
        for address in (foreign, mine + 4096 - 32):  # elsewhere, and running past the end of mine
            client.post("xpuMemcpyArrayFromDevice", array, 0, 0, 0, address, 64, 64, 1, 0)
            assert client.status_of("cuCtxSynchronize") == errors.INVALID_VALUE
            client.post("xpuMemcpyArrayToDevice", address, 64, array, 0, 0, 0, 64, 1, 0)
            assert client.status_of("cuCtxSynchronize") == errors.INVALID_VALUE
            linear = RESOURCE_DESC.pack(2, RESOURCE_LINEAR.pack(address, 0x20, 1, 64).ljust(128, b"\0"), 0)
            assert client.status_of("xpuTexObjectCreate", 8, 0, linear, bytes(104), None) == errors.INVALID_VALUE
        mipmapped = RESOURCE_DESC.pack(1, bytes(128), 0)
        assert client.status_of("xpuTexObjectCreate", 8, 0, mipmapped, bytes(104), None) == errors.NOT_SUPPORTED
        # past the array's own extent: refused by the backend, before it builds anything of that size
        client.post("xpuMemcpyArrayFromHost", array, 1020, 0, 0, b"\xee" * 8, 8, 1, 0)
        assert client.status_of("cuCtxSynchronize") == errors.INVALID_VALUE
        client.post("xpuMemcpyArrayToArray", array, 0, 0, 0, array, 0, 0, 0, 16, 2**40, 0)
        assert client.status_of("cuCtxSynchronize") == errors.INVALID_VALUE
        assert client.status_of("xpuMemcpyArrayToHost", 16 * 2**40, array, 0, 0, 0, 16, 2**40, 0) \
            == errors.INVALID_VALUE
        client.write(mine, b"ok" * 32)
        client.post("xpuMemcpyArrayFromDevice", array, 0, 255, 1, mine, 64, 64, 1, 0)
        (rows,) = client.call("xpuMemcpyArrayToHost", 64, array, 0, 255, 1, 64, 1, 0)
        assert bytes(rows) == b"ok" * 32
    finally:
        client.close()
        srv.stop()
