"""The gloo side of troupe's allreduce benchmarks (bench/allreduce_vs_gloo.py on one host,
bench/allreduce_hosts.py across hosts): the same inputs and timing as `troupe bench allreduce`.
torch and torch.distributed come in as arguments, so that importing this module needs no torch."""
import time

PERIOD = 1021  # troupe's bench's input pattern: rank r gives (r + 1) + (i % PERIOD)


def timed_allreduces(torch, dist, rank, world, count, warmup, iters):
    """float32 sum allreduces of `count` elements in the process group: `warmup` untimed, then
    `iters` timed ones, each after a barrier, with rank-dependent inputs refilled outside the timing
    and every sum checked. Returns (seconds of each timed allreduce, elements summed wrongly)."""
    pattern = torch.arange(count, dtype=torch.int64) % PERIOD
    mine = (pattern + (rank + 1)).to(torch.float32)
    expected = (pattern * world + world * (world + 1) // 2).to(torch.float32)
    buf = torch.empty(count, dtype=torch.float32)
    times, wrong = [], 0
    for i in range(warmup + iters):
        buf.copy_(mine)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
        wrong += int((buf != expected).sum())
    return times, wrong
