#!/usr/bin/env python3
"""Distributed training throughput, troupe vs PyTorch DDP (gloo), side by side in one run.

Both: 2 worker processes x 1 thread on this host, the same model (LeNet, MLP), per-process batch 32
(global 64), SGD with momentum 0.9 and weight decay 5e-4, Fashion-MNIST. troupe: `troupe launch -n 2
-- troupe train --schedule bsp-allreduce ...` (LMDB reader actors, ring allreduce over the
transport), samples/s of the epoch from rank 0's CSV log. PyTorch: DistributedDataParallel over
gloo, images already in memory (no data loading cost for PyTorch), timed after a warm-up.

    bash scripts/setup.sh --bench && bash scripts/build.sh troupe_cli
    /usr/bin/python3 bench/ddp_vs_troupe.py [--models lenet,mlp] [--steps 300] [--procs 2]
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_vs_pytorch import lenet, mlp  # noqa: E402
from train_vs_pytorch import load_idx, troupe_rate  # noqa: E402

from train_bench import add_troupe_and_data_flags, ensure_data  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp_worker(rank, world, port, name, batch, steps, warmup, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    torch.manual_seed(1)
    x, y = load_idx("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
    model = torch.nn.parallel.DistributedDataParallel({"lenet": lenet, "mlp": mlp}[name]())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    perm = torch.randperm(x.shape[0])

    def step(i):
        first = ((i * world + rank) * batch) % (x.shape[0] - batch)
        idx = perm[first:first + batch]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()

    for i in range(warmup):
        step(i)
    dist.barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        out.put(batch * world * steps / elapsed)
    dist.destroy_process_group()


def ddp_samples_per_sec(name, procs, batch, steps):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=ddp_worker, args=(r, procs, port, name, batch, steps, 20, out))
          for r in range(procs)]
    for p in ps:
        p.start()
    result = out.get(timeout=600)
    for p in ps:
        p.join()
    return result


def troupe_samples_per_sec(troupe, data, name, procs, batch, steps):
    return troupe_rate([troupe, "launch", "-n", str(procs), "--", "troupe", "train", "--model",
                        name, "--schedule", "bsp-allreduce", "--batch_size", str(batch),
                        "--threads", "1"], data, batch * procs, steps)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_troupe_and_data_flags(p)
    p.add_argument("--models", default="lenet,mlp")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="per process")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=2, help="best of this many runs, each side")
    args = p.parse_args()
    ensure_data(args.troupe, args.data)
    print(f"{args.procs} processes x 1 thread, batch {args.batch} per process "
          f"(global {args.batch * args.procs}), {args.steps} steps, best of {args.repeats}; "
          f"torch {torch.__version__}")
    print(f"{'model':<8} {'troupe bsp-allreduce':>21} {'pytorch DDP gloo':>17} {'ratio':>7}")
    for name in args.models.split(","):
        ours = max(troupe_samples_per_sec(args.troupe, args.data, name, args.procs, args.batch,
                                          args.steps) for _ in range(args.repeats))
        theirs = max(ddp_samples_per_sec(name, args.procs, args.batch, args.steps)
                     for _ in range(args.repeats))
        print(f"{name:<8} {ours:>21.0f} {theirs:>17.0f} {ours / theirs:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
