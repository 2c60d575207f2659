"""One client cannot reach another's device memory through any call.

Each session is a worker process with an address space of its own (on the sim device, at a
random base, as separate processes on a GPU have separate address spaces). A pointer of
another session therefore points at nothing: every copy, memset, 2D copy, launch or free
with it fails, and the owner's bytes stay as they were.
"""

from __future__ import annotations

import hashlib
import struct

from conftest import Server
from pyclient import PyClient

from xpuremote.protocol import errors
from xpuremote.server.backends import sim

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


def load(client: PyClient) -> None:
    client.post("xpuModuleLoad", MODULE, hashlib.sha256(PTX).digest(), PTX, len(PTX))  # key: 32 bytes
    client.post("xpuModuleGetFunction", FUNCTION, MODULE, "saxpy")
    assert client.status_of("cuCtxSynchronize") == errors.SUCCESS


def saxpy(client: PyClient, x: int, y: int, n: int) -> int:
    """Launch saxpy(2.0, x, y, n); the status of the launch (reported by the next sync call)."""
    params = struct.pack("<f4xQQi", 2.0, x, y, n)
    client.post("xpuLaunchKernel", FUNCTION, 1, 1, 1, n, 1, 1, 0, 0, params, len(params), 0)
    return client.status_of("cuCtxSynchronize")


def test_foreign_pointers_fail_and_the_owner_data_stays(server: Server) -> None:
    owner = PyClient(server.address)
    intruder = PyClient(server.address)
    try:
        secret = bytes(range(256)) * (SIZE // 256)
        theirs = [owner.alloc(SIZE) for _ in range(3)]
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
