"""A script written for torchrun's elastic launches, run unchanged by `troupe launch --elastic`
(tests/launch_local_test.cc): it keeps its progress in a checkpoint (--ckpt, written by rank 0
after every step) and resumes from it whenever it starts again, with whatever RANK and WORLD_SIZE
that start gives it. Each step, gloo's allreduce of a 1 from every rank must make the world's
size; rank 0 says when each start begins (TORCHELASTIC_RESTART_COUNT, the world, the step) and,
at the end, the world of every step."""
import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--ckpt", required=True)
ap.add_argument("--step-seconds", type=float, default=0.1)
a = ap.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
state = {"step": 0, "worlds": []}
if os.path.exists(a.ckpt):
    with open(a.ckpt) as f:
        state = json.load(f)
print(f"rank {rank} of {world} pid {os.getpid()}", flush=True)
if rank == 0:
    print(f"start: restart {os.environ['TORCHELASTIC_RESTART_COUNT']}, {world} ranks, from step "
          f"{state['step']}", flush=True)
while state["step"] < a.steps:
    t = torch.ones(1)
    dist.all_reduce(t)
    if t.item() != world:
        raise SystemExit(f"rank {rank}: allreduce of {world} ones made {t.item()}")
    state["step"] += 1
    if rank == 0:
        state["worlds"].append(world)
        with open(a.ckpt + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(a.ckpt + ".tmp", a.ckpt)
        if state["step"] % 10 == 0:
            print(f"step {state['step']}", flush=True)
    time.sleep(a.step_seconds)
dist.barrier()
if rank == 0:
    runs, last = [], None
    for w in state["worlds"]:
        if runs and w == last:
            runs[-1][1] += 1
        else:
            runs.append([w, 1])
        last = w
    print("done: " + ", ".join(f"{n} step(s) of {w}" for w, n in runs), flush=True)
dist.destroy_process_group()
