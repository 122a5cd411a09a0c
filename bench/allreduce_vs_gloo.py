#!/usr/bin/env python3
"""Allreduce bandwidth, troupe vs PyTorch's gloo, side by side in one run, on this host.

troupe: `troupe bench allreduce` (its own ring allreduce over the actor system and transport, as
training uses it; N local processes through the launcher and the embedded rendezvous store).
gloo: torch.distributed with the gloo backend, N processes, init_method tcp://127.0.0.1:PORT.
Both: float32 sum, the same sizes (1 MB = 1e6 bytes, nccl-tests' convention), warm-up and timed
iterations; every iteration starts after a barrier, rank-dependent inputs are refilled outside the
timing and the sums are checked; time = the slowest rank's mean. busbw = size / time * 2(n-1)/n.

    bash scripts/setup.sh --bench && bash scripts/build.sh troupe_cli
    /usr/bin/python3 bench/allreduce_vs_gloo.py [--procs 2,4] [--sizes 1,25,100] [--iters 20]
        [--warmup 5] [--rounds 1] [--troupe-args="--copy alloc"]
"""
import argparse
import os
import shlex
import socket
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gloo_timing import timed_allreduces

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_worker(rank, world, port, counts, warmup, iters, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    rows = []
    for count in counts:
        times, wrong = timed_allreduces(torch, dist, rank, world, count, warmup, iters)
        mean = torch.tensor([sum(times) / len(times)], dtype=torch.float64)
        bad = torch.tensor([wrong], dtype=torch.int64)
        dist.all_reduce(mean, op=dist.ReduceOp.MAX)
        dist.all_reduce(bad, op=dist.ReduceOp.SUM)
        rows.append((count, mean.item() * 1e3, int(bad.item())))
    if rank == 0:
        results.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def gloo_busbw(world, sizes_mb, warmup, iters):
    counts = [max(1, round(mb * 1e6 / 4)) for mb in sizes_mb]
    ctx = mp.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(gloo_worker, args=(world, free_port(), counts, warmup, iters, results), nprocs=world,
             join=True)
    rows = results.get()
    out = {}
    for mb, (count, ms, wrong) in zip(sizes_mb, rows):
        if wrong:
            sys.exit(f"gloo: {wrong} wrong sums at {mb} MB")
        out[mb] = count * 4 / (ms * 1e-3) / 1e9 * 2 * (world - 1) / world
    return out


def troupe_busbw(troupe, world, sizes_mb, warmup, iters, extra):
    cmd = [troupe, "bench", "allreduce", "-n", str(world), "--sizes",
           ",".join(f"{mb:g}" for mb in sizes_mb), "--iters", str(iters), "--warmup",
           str(warmup)] + extra
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({run.returncode}):\n{run.stdout}")
    lines = run.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["size(MB)"])
    columns = lines[header].split()
    rows = [dict(zip(columns, line.split())) for line in lines[header + 1:] if line.strip()]
    if len(rows) != len(sizes_mb) or any(r.get("check") != "OK" for r in rows):
        sys.exit(f"troupe: a size missing or wrong sums:\n{run.stdout}")
    # Row by row in the order asked (troupe prints a size to 3 decimals: 4.194304 as 4.194).
    return {mb: float(r["busbw(GB/s)"]) for mb, r in zip(sizes_mb, rows)}


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    p.add_argument("--procs", default="2,4")
    p.add_argument("--sizes", default="1,25,100", help="MB (1e6 bytes)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1,
                   help="alternate troupe and gloo this many times; report each one's median")
    p.add_argument("--troupe-args", default="", help="more flags for troupe bench allreduce")
    a = p.parse_args()
    sizes = [float(s) for s in a.sizes.split(",")]
    extra = shlex.split(a.troupe_args)

    print(f"# allreduce float32 sum, {a.warmup} warm-up + {a.iters} timed iterations per size, "
          f"median of {a.rounds} round(s); busbw in GB/s; torch {torch.__version__}; "
          f"{os.cpu_count()} CPUs; troupe flags: {' '.join(extra) or '(none)'}")
    print(f"{'n':>3} {'size(MB)':>9} {'troupe busbw':>13} {'gloo busbw':>11} {'ratio':>7}")
    for world in (int(n) for n in a.procs.split(",")):
        ours = {mb: [] for mb in sizes}
        theirs = {mb: [] for mb in sizes}
        for _ in range(a.rounds):
            for mb, bw in troupe_busbw(a.troupe, world, sizes, a.warmup, a.iters, extra).items():
                ours[mb].append(bw)
            for mb, bw in gloo_busbw(world, sizes, a.warmup, a.iters).items():
                theirs[mb].append(bw)
        for mb in sizes:
            t, g = median(ours[mb]), median(theirs[mb])
            print(f"{world:>3} {mb:>9g} {t:>13.3f} {g:>11.3f} {t / g:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
