"""Stock PyTorch's other CUDA allocators under xpu-run (tests/test_memory_pools.py): whichever
PYTORCH_CUDA_ALLOC_CONF names, `backend:cudaMallocAsync` (memory pools) or `expandable_segments:True`
(virtual memory management). Prints one JSON line.

Keeps to what needs no kernel but ATen's fill (a host implementation in tests/torch_sim_kernels.py):
allocation, copies each way and on the device, memory statistics, a CUDA graph that allocates. Some tensors
are left alive at exit, as programs leave them: their frees come while Python unloads, after the session has
ended.
"""

from __future__ import annotations

import json
from typing import Any

import torch

MIB = 1 << 20
LARGE = 50 * MIB  # bytes: more than two of the large pool's 20 MiB expandable pages, so one tensor spans three


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def round_trips() -> dict[str, Any]:
    """Host to device and back, device to device, for sizes from one small block to three large pages."""
    out: dict[str, Any] = {}
    for count in (1, 1000, MIB + 5, LARGE // 4):
        x = torch.randn(count, dtype=torch.float32)
        on_device = x.cuda()
        copy = torch.empty_like(on_device)
        copy.copy_(on_device)  # a device-to-device memcpy
        out[str(count)] = same_bits(on_device.cpu(), x) and same_bits(copy.cpu(), x)
    filled = torch.empty(LARGE // 4, device="cuda").fill_(1.5)  # ATen's fill kernel over the whole range
    out["fill"] = same_bits(filled.cpu(), torch.full((LARGE // 4,), 1.5))
    out["zeros"] = same_bits(torch.zeros(3 * MIB, device="cuda").cpu(), torch.zeros(3 * MIB))
    return out


def growth() -> dict[str, Any]:
    """A set of tensors that grows: the allocator takes more device memory (more pages mapped, or a pool
    that grows), the earlier tensors keep their values, and freeing them gives the memory back."""
    torch.cuda.empty_cache()
    free_before, total = torch.cuda.mem_get_info()
    allocated_before = torch.cuda.memory_allocated()
    kept, reserved = [], [torch.cuda.memory_reserved()]
    for i in range(6):
        source = torch.full((8 * MIB // 4,), float(i))
        kept.append((source, source.cuda()))
        reserved.append(torch.cuda.memory_reserved())
    allocated = torch.cuda.memory_allocated() - allocated_before
    free_during = torch.cuda.mem_get_info()[0]
    values = all(same_bits(device.cpu(), source) for source, device in kept)
    native = torch.cuda.get_allocator_backend() == "native"  # cudaMallocAsync keeps no segments to show
    segments = [s for s in torch.cuda.memory_snapshot() if s["total_size"] >= 8 * MIB] if native else []
    del kept
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {"values_kept": values, "allocated": allocated, "expected": 6 * 8 * MIB,
            "reserved_grew": reserved[-1] - reserved[0] >= 6 * 8 * MIB and reserved == sorted(reserved),
            "device_memory_taken": free_before - free_during, "total": total,
            "device_memory_given_back": torch.cuda.mem_get_info()[0] - free_during,
            "allocated_after_free": torch.cuda.memory_allocated() - allocated_before,
            "segments": len(segments), "largest_segment": max((s["total_size"] for s in segments), default=0)}


def graph_capture() -> dict[str, Any]:
    """torch.cuda.CUDAGraph with tensors allocated inside the capture (under cudaMallocAsync, the graph's own
    allocation nodes; otherwise the graph's private pool) and one freed there, replayed after the outputs were
    cleared."""
    static_out = torch.zeros(MIB, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scratch = torch.empty(MIB, device="cuda")
        scratch.fill_(2.5)
        static_out.copy_(scratch)
        del scratch  # freed inside the capture
        kept = torch.empty(MIB, device="cuda")
        kept.fill_(4.0)
    replays = []
    for _ in range(2):
        static_out.zero_()
        kept.zero_()
        graph.replay()
        torch.cuda.synchronize()
        replays.append(same_bits(static_out.cpu(), torch.full((MIB,), 2.5))
                       and same_bits(kept.cpu(), torch.full((MIB,), 4.0)))
    del kept, graph
    torch.cuda.synchronize()
    return {"replays": replays}


def main() -> None:
    out: dict[str, Any] = {"backend": torch.cuda.get_allocator_backend()}
    for name, check in (("round_trips", round_trips), ("growth", growth), ("graph", graph_capture)):
        try:
            out[name] = check()
        except Exception as exc:  # reported in its own section, for its own test to show
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    global LEFT_ALIVE
    LEFT_ALIVE = [torch.full((1000,), 3.0).cuda(), torch.empty(LARGE // 4, device="cuda")]  # freed at exit
    print(json.dumps(out))


LEFT_ALIVE: list[torch.Tensor] = []

if __name__ == "__main__":
    main()
