"""torch.distributed on troupe's backend between hosts (tests/hosts_train_test.cc): every chunk of
a collective to another host goes from the caller's own tensor, and the collective ends only once
the transport has sent it. Each rank sums, gathers and broadcasts tensors of odd sizes up to 12 MB
(3 of the ring's segments) whose values it can predict, checks every element of the result, and
overwrites its tensor at once: a chunk still in flight from it would carry the overwrite to the
other rank, whose next check fails."""
import datetime

import torch
import torch.distributed as dist

import troupe.torch  # noqa: F401  (registers the "troupe" backend)

dist.init_process_group("troupe", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)


def values(n, r, it):
    """Rank r's n values at iteration it: small integers, exact in float32 and in their sums."""
    return ((torch.arange(n, dtype=torch.int64) * 7 + r * 3 + it) % 1024).to(torch.float32)


checks = 0
for n in (1, 7, 1_000_003, 3_000_001):
    t = torch.empty(n)
    for it in range(2):
        t.copy_(values(n, rank, it))
        dist.all_reduce(t)
        assert torch.equal(t, sum(values(n, r, it) for r in range(world))), (n, it)
        t.fill_(-1.0)
        parts = [torch.empty(n) for _ in range(world)]
        mine = values(n, rank, it + 10)
        dist.all_gather(parts, mine)
        for r in range(world):
            assert torch.equal(parts[r], values(n, r, it + 10)), ("all_gather", n, it, r)
        mine.fill_(-1.0)
        b = values(n, 0, it + 20) if rank == 0 else torch.empty(n)
        dist.broadcast(b, 0)
        assert torch.equal(b, values(n, 0, it + 20)), ("broadcast", n, it)
        b.fill_(-1.0)
        checks += 3
print(f"rank {rank} of {world}: {checks} collectives between hosts, every element as predicted",
      flush=True)
dist.destroy_process_group()
