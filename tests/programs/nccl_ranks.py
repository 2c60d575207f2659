"""One rank of a torch.distributed job on the "nccl" backend, started by hand with a TCP store.

Usage: nccl_ranks.py RANK WORLD STORE_PORT OUT.json, or nccl_ranks.py env OUT_DIR under torchrun (RANK,
WORLD_SIZE and MASTER_ADDR/MASTER_PORT from its environment; OUT_DIR/rankN.json).

Runs all_reduce (sum, avg, prod, max, min), broadcast, all_gather, reduce_scatter, send/recv and reduce on the
rank's own device (cuda:RANK), an all_reduce in two new groups (split from the default one), then one DDP
training step of a tiny model (Linear + MSE, SGD) on this rank's half of a batch; rank 0 also runs the same step
in one process, without DDP, on the whole batch. Writes what it saw to OUT.json for the test to check: every
result, the gradients and the loss.
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# bound to its device (device_id): the communicator is made at once, and new groups are split from it
if sys.argv[1] == "env":
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    out = os.path.join(sys.argv[2], f"rank{rank}.json")
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
else:
    rank, world, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    device = torch.device(f"cuda:{rank}")
    torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=datetime.timedelta(60))
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=device)
seen: dict = {}


def values(tensor: torch.Tensor) -> list:
    return tensor.cpu().tolist()


def on_device(data: list, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Made on the host and copied: the sim runs only the kernels tests/torch_sim_kernels.py registers."""
    return torch.tensor(data, dtype=dtype).to(device)


# all_reduce, each reduction, on fp32; sum on the other types the test covers
base = [1.0 + i + rank * 10 for i in range(4)]
for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("prod", dist.ReduceOp.PRODUCT),
                 ("max", dist.ReduceOp.MAX), ("min", dist.ReduceOp.MIN)):
    t = on_device(base)
    dist.all_reduce(t, op=op)
    seen[f"all_reduce_{name}"] = values(t)
for dtype in ("float16", "bfloat16", "int32", "int64"):
    t = on_device(base, getattr(torch, dtype))
    dist.all_reduce(t)
    seen[f"all_reduce_sum_{dtype}"] = values(t.cpu().float())

t = on_device([float(rank + 5)] * 3)
dist.broadcast(t, src=world - 1)
seen["broadcast"] = values(t)

gathered = [on_device([0.0, 0.0]) for _ in range(world)]
dist.all_gather(gathered, on_device([rank, rank * 100.0]))
seen["all_gather"] = [values(g) for g in gathered]

inputs = [on_device([float(rank * 10 + i)] * 2) for i in range(world)]
scattered = on_device([0.0, 0.0])
dist.reduce_scatter(scattered, inputs)
seen["reduce_scatter"] = values(scattered)

# a ring: each rank sends to the next and receives from the one before, both in one group
received = on_device([0.0] * 3)
ops = [dist.P2POp(dist.isend, on_device([float(rank)] * 3), (rank + 1) % world),
       dist.P2POp(dist.irecv, received, (rank - 1) % world)]
for request in dist.batch_isend_irecv(ops):
    request.wait()
seen["send_recv"] = values(received)

t = on_device(base)
dist.reduce(t, dst=0)
seen["reduce_on_0"] = values(t) if rank == 0 else None

# new groups, split from the default communicator: every rank, and rank 0 alone (the others ask for no color)
everyone, alone = dist.new_group(list(range(world))), dist.new_group([0])
t = on_device(base)
dist.all_reduce(t, group=everyone)
seen["split_all_reduce"] = values(t)
if rank == 0:
    t = on_device(base)
    dist.all_reduce(t, group=alone)
    seen["split_alone"] = values(t)

# one DDP step: each rank its half of the batch; gradients averaged across ranks
torch.manual_seed(0)
model = torch.nn.Linear(8, 4).to(device)
reference = torch.nn.Linear(8, 4).to(device)
reference.load_state_dict(model.state_dict())
batch_x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1)).to(device)
batch_y = torch.randn(16, 4, generator=torch.Generator().manual_seed(2)).to(device)
# the sim's kernels: a whole batch's rows sliced on the host, not on the device
share = 16 // world
ddp = DistributedDataParallel(model, device_ids=[rank])
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
mine = slice(rank * share, (rank + 1) * share)
loss = torch.nn.functional.mse_loss(ddp(batch_x.cpu()[mine].to(device)), batch_y.cpu()[mine].to(device))
loss.backward()
seen["ddp_grads"] = [values(p.grad.flatten()) for p in model.parameters()]
optimizer.step()
seen["ddp_weights"] = [values(p.detach().flatten()) for p in model.parameters()]
losses = [on_device([0.0]) for _ in range(world)]
dist.all_gather(losses, loss.detach().reshape(1))
seen["ddp_loss"] = sum(float(v.item()) for v in losses) / world

if rank == 0:  # the same job in one process: the whole batch, no DDP
    one = torch.optim.SGD(reference.parameters(), lr=0.1)
    whole = torch.nn.functional.mse_loss(reference(batch_x), batch_y)
    whole.backward()
    seen["one_grads"] = [values(p.grad.flatten()) for p in reference.parameters()]
    one.step()
    seen["one_weights"] = [values(p.detach().flatten()) for p in reference.parameters()]
    seen["one_loss"] = float(whole.item())

dist.destroy_process_group()
with open(out, "w") as f:
    json.dump(seen, f)
print(f"rank {rank}: done", flush=True)
