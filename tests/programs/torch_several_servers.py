"""PyTorch on the devices of two servers named by one XPU_SERVER list: cuda:0 and cuda:1 on the first, cuda:2
(and cuda:3) on the second. Tensors move between them (staged through the client), each computes its own, a
stream of one waits for an event of the other; results against the CPU's. Prints one JSON line."""

from __future__ import annotations

import json

import torch


def main() -> None:
    seen = {"count": torch.cuda.device_count(), "peer": torch.cuda.can_device_access_peer(0, 2)}
    x = torch.arange(4096, dtype=torch.float32)
    there = x.to("cuda:0").to("cuda:2")  # from the first server to the second
    back = (there * there).to("cuda:1")  # computed on the second, back to the first server's other device
    again = back.to("cuda:2", non_blocking=True)
    seen["moved"] = bool(torch.equal(again.cpu(), x * x))
    w = torch.randn(64, 64)
    seen["matmul"] = all(torch.allclose((w.to(f"cuda:{i}") @ w.to(f"cuda:{i}")).cpu(), w @ w, atol=1e-4)
                         for i in (0, 2))
    with torch.cuda.device(2):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            threes = torch.full((1024,), 3.0, device="cuda:2")
        done = torch.cuda.Event()
        done.record(side)
    torch.cuda.current_stream(0).wait_event(done)  # a stream of the first server waits for the second's event
    seen["waited"] = float(threes.to("cuda:0").sum().item())
    torch.cuda.synchronize()
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
