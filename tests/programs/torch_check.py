"""Stock PyTorch's CUDA paths, run under xpu-run by tests/test_torch.py; prints one JSON line.

The sim device executes no GPU code, so this keeps to what needs no kernel (device queries,
allocation, copies, pinned memory, streams, events, memory statistics, the NVML-based queries
of torch.cuda) plus fills, whose ATen kernel has a host implementation in
tests/torch_sim_kernels.py, and a CUDA graph of copies and fills.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

MIB = 1 << 20


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def properties() -> dict[str, Any]:
    p = torch.cuda.get_device_properties(0)
    return {"name": p.name, "total_memory": p.total_memory, "major": p.major, "minor": p.minor,
            "multi_processor_count": p.multi_processor_count, "capability": list(torch.cuda.get_device_capability(0))}


def round_trips() -> dict[str, bool]:
    out = {}
    for count in (1, 1000, 3 * MIB + 5):  # one element, under and over the wire's 64 KiB inline limit
        x = torch.randn(count, dtype=torch.float32)
        x[0] = float("nan")
        out[str(count)] = same_bits(x.cuda().cpu(), x)
    ints = torch.randint(-(2**62), 2**62, (4097,), dtype=torch.int64)
    out["int64"] = same_bits(ints.to("cuda").to("cpu"), ints)
    return out


def empty_and_copy() -> dict[str, Any]:
    e = torch.empty(64, 1024, device="cuda", dtype=torch.float16)
    x = torch.randn(256, 512)
    a = x.cuda()
    b = torch.empty_like(a)
    b.copy_(a)  # same dtype and layout: a device-to-device memcpy, no kernel
    return {"empty_device": str(e.device), "empty_shape": list(e.shape), "empty_ptr": e.data_ptr(),
            "copy_equal": same_bits(b.cpu(), x), "distinct": a.data_ptr() != b.data_ptr()}


def fills() -> dict[str, Any]:
    """zeros is a memset; ones, full and fill_ launch ATen's fill kernel (the test's sim kernels)."""
    n = 1000
    return {"zeros": same_bits(torch.zeros(n, device="cuda").cpu(), torch.zeros(n)),
            "ones": same_bits(torch.ones(n, device="cuda").cpu(), torch.ones(n)),
            "full": same_bits(torch.full((n,), 2.5, device="cuda").cpu(), torch.full((n,), 2.5)),
            "fill_int64": same_bits(torch.empty(n, dtype=torch.int64, device="cuda").fill_(-7).cpu(),
                                    torch.full((n,), -7, dtype=torch.int64))}


def pinned() -> dict[str, Any]:
    x = torch.randn(MIB // 4 + 3)
    host = x.pin_memory()
    dev = host.to("cuda", non_blocking=True)
    back = torch.empty_like(host).pin_memory()
    back.copy_(dev, non_blocking=True)
    torch.cuda.synchronize()
    return {"is_pinned": host.is_pinned() and back.is_pinned(), "equal": same_bits(back, x)}


def streams_and_events() -> dict[str, Any]:
    x = torch.randn(MIB)
    side = torch.cuda.Stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(side):
        start.record()
        a = x.to("cuda", non_blocking=True)
        b = torch.empty_like(a)
        b.copy_(a, non_blocking=True)
        end.record()
    torch.cuda.current_stream().wait_stream(side)
    end.synchronize()
    return {"elapsed_ms": start.elapsed_time(end), "event_done": end.query(), "stream_done": side.query(),
            "side_is_not_default": side != torch.cuda.default_stream(), "equal": same_bits(b.cpu(), x)}


def threads() -> dict[str, Any]:
    """Application threads copying on streams of their own, and DataLoader's pin-memory thread
    (with worker processes forked after CUDA was initialised)."""
    torch.cuda.Stream()  # see docs/design.md, known hazards: the stream pools are made before the threads
    failures: list[str] = []

    def copier(seed: int) -> None:
        try:
            stream, g = torch.cuda.Stream(), torch.Generator().manual_seed(seed)
            for _ in range(20):
                x = torch.randn(10_000, generator=g)
                with torch.cuda.stream(stream):
                    y = x.to("cuda", non_blocking=True)
                    z = torch.empty_like(y)
                    z.copy_(y, non_blocking=True)
                stream.synchronize()
                if not same_bits(z.cpu(), x):
                    failures.append(f"thread {seed}: mismatch")
        except Exception as exc:
            failures.append(f"thread {seed}: {type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=copier, args=(i,)) for i in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    data = torch.arange(4096, dtype=torch.float32).reshape(512, 8)
    seen, pinned_batches = [], True
    for (batch,) in DataLoader(TensorDataset(data), batch_size=64, num_workers=2, pin_memory=True):
        pinned_batches &= batch.is_pinned()
        seen.append(batch.to("cuda", non_blocking=True).cpu())
    return {"failures": failures, "alive": sum(t.is_alive() for t in workers),
            "loader_equal": same_bits(torch.cat(seen), data), "loader_pinned": pinned_batches}


def memory() -> dict[str, Any]:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0, total = torch.cuda.mem_get_info()
    allocated0 = torch.cuda.memory_allocated()
    size = 8 * MIB
    block = torch.empty(size, dtype=torch.uint8, device="cuda")
    free1, _ = torch.cuda.mem_get_info()
    held = {"allocated": torch.cuda.memory_allocated() - allocated0, "reserved": torch.cuda.memory_reserved(),
            "mem_get_info_used": total - free1, "nvml_used": torch.cuda.device_memory_used(0)}
    del block
    torch.cuda.empty_cache()
    free2, _ = torch.cuda.mem_get_info()
    return {"size": size, "total": total, "free_before": free0, "free_holding": free1, "free_after": free2,
            "held": held, "allocated_after": torch.cuda.memory_allocated() - allocated0}


def nvml() -> dict[str, Any]:
    block = torch.empty(4 * MIB, dtype=torch.uint8, device="cuda")
    listing = torch.cuda.list_gpu_processes(0)
    out = {"driver_device_count": torch._C._cuda_getDeviceCount(), "utilization": torch.cuda.utilization(0),
           "memory_usage": torch.cuda.memory_usage(0), "temperature": torch.cuda.temperature(0),
           "power_draw": torch.cuda.power_draw(0), "clock_rate": torch.cuda.clock_rate(0),
           "processes": listing, "uuids": torch.cuda._raw_device_uuid_nvml()}
    del block
    return out


def cuda_graph() -> dict[str, Any]:
    """torch.cuda.CUDAGraph: copies, fills and an allocation from the graph's private pool, captured
    once (nothing runs then) and replayed after the input changes."""
    n = 4096
    static_in = torch.full((n,), 1.0, device="cuda")
    static_out = torch.full((n,), 7.0, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capturing = torch.cuda.is_current_stream_capturing()
        static_out.copy_(static_in)
        scratch = torch.empty(n // 4, device="cuda")  # from the graph's private memory pool
        scratch.fill_(-3.0)
        static_out[: n // 4].copy_(scratch)
    untouched = same_bits(static_out.cpu(), torch.full((n,), 7.0))
    results = []
    for value in (2.0, 5.0):
        static_in.fill_(value)
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.full((n,), value)
        expected[: n // 4] = -3.0
        results.append(same_bits(static_out.cpu(), expected))
    graph.reset()
    return {"capturing_inside": capturing, "capturing_after": torch.cuda.is_current_stream_capturing(),
            "untouched_by_capture": untouched, "replays": results}


def main() -> int:
    result: dict[str, Any] = {"ok": True, "torch": torch.__version__, "cuda": torch.version.cuda}
    result["available"] = torch.cuda.is_available()
    result["count"] = torch.cuda.device_count()
    checks = [("properties", properties), ("round_trips", round_trips), ("copy", empty_and_copy), ("fills", fills),
              ("pinned", pinned), ("streams", streams_and_events), ("threads", threads), ("memory", memory),
              ("nvml", nvml), ("cuda_graph", cuda_graph)]
    for name, check in checks:
        try:
            result[name] = check()
        except Exception as exc:  # report every check, not only the first failure
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            result["ok"] = False
    torch.cuda.synchronize()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
