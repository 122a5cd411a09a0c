"""A script written for torchrun, run unchanged by `troupe launch` (tests/launch_local_test.cc):
torch.distributed's env:// rendezvous reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; each
rank adds rank + 1 by gloo's allreduce and prints what it saw of torchrun's variables."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
# GROUP_RANK: the host's index (Open MPI's launcher cannot say it: unset there).
print(f"rank {rank} of {world}, local {os.environ['LOCAL_RANK']} of "
      f"{os.environ['LOCAL_WORLD_SIZE']}, group {os.environ.get('GROUP_RANK', '-')}: "
      f"sum {t.item():g}", flush=True)
dist.destroy_process_group()
