"""One rank of a two-rank torch.distributed job on the "nccl" backend: init, then an all_reduce.

Usage: nccl_two_ranks.py RANK STORE_FILE. Prints the all_reduce's result when the collective runs.
"""

import sys

import torch
import torch.distributed as dist

rank, world = int(sys.argv[1]), 2
torch.cuda.set_device(rank)
dist.init_process_group("nccl", store=dist.FileStore(sys.argv[2], world), rank=rank, world_size=world)
tensor = torch.ones(4, device=f"cuda:{rank}") * (rank + 1)
dist.all_reduce(tensor)
print(f"rank {rank}: {tensor.tolist()}", flush=True)
dist.destroy_process_group()
