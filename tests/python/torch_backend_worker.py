"""torch.distributed on troupe's backend against gloo, in each rank of a run started by
`troupe launch -n N` (or torchrun), for tests/python/test_torch_backend.py. Every collective runs
on both process groups on the same random tensors of odd sizes; then DDP trains the same model
20 steps on each. A difference past its bound raises (the process exits non-zero); each check
prints "ok NAME" with what it measured."""
import sys

import torch
import torch.distributed as dist

import troupe.torch  # noqa: F401  (registers the "troupe" backend)

U = 2.0 ** -24  # float32's unit roundoff


def main():
    dist.init_process_group("troupe")
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    g = torch.Generator().manual_seed(100 + rank)

    for n in (1, 7, 1000, 4099):
        x = torch.randn(n, generator=g)
        ours, theirs, magnitude = x.clone(), x.clone(), x.abs()
        dist.all_reduce(ours)
        dist.all_reduce(theirs, group=gloo)
        dist.all_reduce(magnitude, group=gloo)
        # Two float sums of the same `world` terms in other orders: each within
        # gamma(world - 1) * sum |x_i| of the exact sum (Higham, Lemma 3.1).
        gamma = (world - 1) * U / (1 - (world - 1) * U)
        excess = ((ours - theirs).abs() - 2 * gamma * magnitude).max().item()
        assert excess <= 0, f"allreduce of {n}: {excess} past the bound"
    print("ok allreduce", flush=True)

    for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8):
        for root in range(world):
            x = (torch.randn(13, generator=g) * 100).to(dtype)
            ours, theirs = x.clone(), x.clone()
            dist.broadcast(ours, src=root)
            dist.broadcast(theirs, src=root, group=gloo)
            assert torch.equal(ours, theirs), f"broadcast of {dtype} from {root}"
    # The root's tensor as it is, bit for bit, whatever its type, size or layout (a transposed
    # view; over a million values: several of the ring's segments): each rank draws the root's.
    for dtype, n in ((torch.float64, 7), (torch.bfloat16, 9), (torch.int32, 5), (torch.bool, 11),
                     (torch.float32, 1_100_003)):
        for root in range(world):
            rooted = torch.Generator().manual_seed(1000 + root)
            drawn = torch.randn(n, generator=rooted)
            want = drawn > 0 if dtype == torch.bool else (drawn * 100).to(dtype)
            ours = want.clone() if rank == root else torch.zeros(n).to(dtype)
            dist.broadcast(ours, src=root)
            assert torch.equal(ours, want), f"broadcast of {n} {dtype} from {root}"
    for root in range(world):
        want = torch.arange(54.0).view(6, 9).t() * (root + 1)
        ours = want.clone() if rank == root else torch.zeros(6, 9).t()
        dist.broadcast(ours, src=root)
        assert torch.equal(ours, want) and not ours.is_contiguous(), f"transposed from {root}"
    print("ok broadcast", flush=True)

    for dtype in (torch.float32, torch.int64):
        x = (torch.randn(5, generator=g) * 1000).to(dtype)
        ours = [torch.empty_like(x) for _ in range(world)]
        theirs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(ours, x)
        dist.all_gather(theirs, x, group=gloo)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), f"allgather of {dtype}"
    print("ok allgather", flush=True)

    parts = [torch.randn(3, generator=g) for _ in range(world)]
    out = torch.empty(3)
    dist.reduce_scatter(out, parts)
    whole = torch.cat(parts)
    dist.all_reduce(whole, group=gloo)  # gloo has no reduce_scatter: its allreduce's slice
    magnitude = torch.cat(parts).abs()
    dist.all_reduce(magnitude, group=gloo)
    gamma = (world - 1) * U / (1 - (world - 1) * U)
    mine = slice(3 * rank, 3 * rank + 3)
    assert ((out - whole[mine]).abs() <= 2 * gamma * magnitude[mine]).all(), "reduce_scatter"
    dist.barrier()
    print("ok reduce_scatter barrier", flush=True)

    # all_gather_into_tensor and reduce_scatter_tensor (FSDP's): a float32 output in host memory
    # is written where it lies, others through a copy; against gloo's list all_gather and the
    # slice of its allreduce. AVG is the sum divided by the world's size: with the same sum,
    # the same division, so equal to the bit to SUM's result divided here.
    for dtype in (torch.float32, torch.float16, torch.int64):
        x = (torch.randn(7, generator=g) * 100).to(dtype)
        ours = torch.empty(world * 7, dtype=dtype)
        theirs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather_into_tensor(ours, x)
        dist.all_gather(theirs, x, group=gloo)
        assert torch.equal(ours, torch.cat(theirs)), f"all_gather_into_tensor of {dtype}"
    whole = torch.randn(world * 5, generator=g)
    out, avg = torch.empty(5), torch.empty(5)
    dist.reduce_scatter_tensor(out, whole)
    dist.reduce_scatter_tensor(avg, whole, op=dist.ReduceOp.AVG)
    theirs, magnitude = whole.clone(), whole.abs()
    dist.all_reduce(theirs, group=gloo)
    dist.all_reduce(magnitude, group=gloo)
    mine = slice(5 * rank, 5 * rank + 5)
    assert ((out - theirs[mine]).abs() <= 2 * gamma * magnitude[mine]).all(), \
        "reduce_scatter_tensor"
    assert torch.equal(avg, out / world), "reduce_scatter_tensor with AVG"
    summed, averaged = whole.clone(), whole.clone()
    dist.all_reduce(summed)
    dist.all_reduce(averaged, op=dist.ReduceOp.AVG)
    assert torch.equal(averaged, summed / world), "allreduce with AVG"
    print("ok all_gather_into_tensor reduce_scatter_tensor avg", flush=True)

    # alltoall: rank r's split j lands in rank j's output split r. Even splits and uneven ones
    # (rank r sends rank j r + j + 1 rows of 3), every dtype, against gloo's all_to_all_single.
    for dtype in (torch.float32, torch.float16, torch.int64, torch.uint8):
        x = (torch.randn(world * 7, 3, generator=g) * 100).to(dtype)
        ours, theirs = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(ours, x)
        dist.all_to_all_single(theirs, x, group=gloo)
        assert torch.equal(ours, theirs), f"alltoall of {dtype}"
        sends = [rank + j + 1 for j in range(world)]
        gets = [r + rank + 1 for r in range(world)]
        x = (torch.randn(sum(sends), 3, generator=g) * 100).to(dtype)
        ours = torch.empty(sum(gets), 3, dtype=dtype)
        theirs = torch.empty_like(ours)
        dist.all_to_all_single(ours, x, gets, sends)
        dist.all_to_all_single(theirs, x, gets, sends, group=gloo)
        assert torch.equal(ours, theirs), f"alltoall of {dtype} in uneven splits"
    # The list form, against what each rank knows it was sent: rank r's tensor for rank j holds
    # 10 r + j, j + 1 times.
    outs = [torch.empty(rank + 1) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((j + 1,), 10.0 * rank + j) for j in range(world)])
    assert all(torch.equal(o, torch.full((rank + 1,), 10.0 * r + rank))
               for r, o in enumerate(outs)), "alltoall of lists"
    print("ok alltoall", flush=True)

    # send and recv round the ring, receives posted first, against gloo's.
    def passed(group):
        x = (torch.randn(11, generator=torch.Generator().manual_seed(rank)) * 100).to(torch.int32)
        got = torch.empty_like(x)
        receive = dist.irecv(got, src=(rank - 1) % world, group=group, tag=5)
        dist.send(x, dst=(rank + 1) % world, group=group, tag=5)
        receive.wait()
        return got
    ours = passed(None)
    assert torch.equal(ours, passed(gloo)), "send and recv"
    want = (torch.randn(11, generator=torch.Generator().manual_seed((rank - 1) % world)) * 100)
    assert torch.equal(ours, want.to(torch.int32)), "recv of what the previous rank sent"
    print("ok send recv", flush=True)

    # Subgroups (dist.new_group(ranks), as DeviceMesh makes them): each its own ring, whose rank
    # 0 serves its rendezvous; the even ranks' and the odd ranks' sums of small integers, exact.
    evens = dist.new_group([r for r in range(world) if r % 2 == 0], backend="troupe")
    odds = dist.new_group([r for r in range(world) if r % 2 == 1], backend="troupe")
    mine = torch.full((7,), float(rank + 1))
    dist.all_reduce(mine, group=evens if rank % 2 == 0 else odds)
    want = sum(r + 1 for r in range(world) if r % 2 == rank % 2)
    assert torch.equal(mine, torch.full((7,), float(want))), f"subgroup sum {mine} for {want}"
    everyone = torch.ones(3)
    dist.all_reduce(everyone)  # the world's group goes on beside them
    assert torch.equal(everyone, torch.full((3,), float(world))), "the world's sum after"
    print("ok subgroups", flush=True)

    if troupe.torch._backend() is not None:  # the C++ backend: every reduction, every dtype
        print("backend c++", flush=True)
        other_reductions(rank, world, gloo, g)
        bad_calls = ((torch.zeros(3, dtype=torch.int64),
                      lambda t: dist.all_reduce(t, op=dist.ReduceOp.AVG)),
                     (torch.zeros(3), lambda t: dist.all_reduce(t, op=dist.ReduceOp.BAND)),
                     (torch.zeros(3), lambda t: dist.recv(t)))
    else:  # the Python process group (TROUPE_TORCH_BACKEND=python)
        print("backend python", flush=True)
        bad_calls = ((torch.zeros(3, dtype=torch.float64), lambda t: dist.all_reduce(t)),
                     (torch.zeros(3), lambda t: dist.all_reduce(t, op=dist.ReduceOp.MAX)),
                     (torch.zeros(3), lambda t: dist.recv(t)))
    for bad, call in bad_calls:
        try:
            call(bad)
        except (TypeError, ValueError, RuntimeError, NotImplementedError) as e:
            assert "troupe backend" in str(e), str(e)
            print(f"refused: {str(e).splitlines()[0]}", flush=True)
        else:
            raise AssertionError("a bad call went through")

    # DDP, 20 steps of SGD (momentum 0.9) on each backend from the same weights and batches.
    def trained(group):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(),
                                    torch.nn.Linear(16, 3))
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        data = torch.Generator().manual_seed(rank)
        for _ in range(20):
            x = torch.randn(8, 10, generator=data)
            y = torch.randn(8, 3, generator=data)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        return [p.detach() for p in model.parameters()]

    ours = trained(dist.group.WORLD)
    theirs = trained(gloo)
    # The same gradients on each rank; the two backends sum the world's in other orders, within
    # 2 gamma(world - 1) of the exact sum when its terms do not cancel (tests/float_bounds.h's
    # sgdTrajectoryBound, with the probabilistic gamma: 7 sqrt(world) u); the momentum buffer
    # carries each step's error 1 / (1 - 0.9) times over, and the weights move by lr v.
    bound = 2 * 7 * world ** 0.5 * U / (1 - 0.9) + 20 * 4 * U
    worst = max(((a - b).abs().max() / a.abs().max()).item() for a, b in zip(ours, theirs))
    assert worst <= bound, f"DDP: relative difference {worst} past {bound}"
    print(f"ok ddp relative difference {worst:.3g} (bound {bound:.3g})", flush=True)
    dist.destroy_process_group()


def other_reductions(rank, world, gloo, g):
    """The C++ backend's reductions past SUM and AVG, and of dtypes past float, its reduce,
    gather and scatter, against gloo's."""
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8):
        for op in ("SUM", "PRODUCT", "MIN", "MAX"):
            x = (torch.randn(9, generator=g) * (3 if op == "PRODUCT" else 100)).to(dtype)
            ours, theirs = x.clone(), x.clone()
            dist.all_reduce(ours, op=getattr(dist.ReduceOp, op))
            dist.all_reduce(theirs, op=getattr(dist.ReduceOp, op), group=gloo)
            if dtype.is_floating_point and op in ("SUM", "PRODUCT"):
                # Both take `world` terms in some order: a sum within 2 gamma(world - 1) sum|x|
                # of the exact one, a product within 2 gamma(world - 1) |product| (Higham,
                # Lemma 3.1 and 3.4), u of the dtype.
                u = torch.finfo(dtype).eps / 2
                gamma = (world - 1) * u / (1 - (world - 1) * u)
                scale = x.abs().clone()
                dist.all_reduce(scale, op=getattr(dist.ReduceOp, op), group=gloo)
                assert ((ours - theirs).abs() <= 2 * gamma * scale.abs()).all(), (op, dtype)
            else:  # integers wrap alike; MIN and MAX pick one of the values
                assert torch.equal(ours, theirs), (op, dtype, ours, theirs)
    for op in ("BAND", "BOR", "BXOR"):
        x = torch.randint(0, 1 << 30, (6,), generator=g)
        ours, theirs = x.clone(), x.clone()
        dist.all_reduce(ours, op=getattr(dist.ReduceOp, op))
        dist.all_reduce(theirs, op=getattr(dist.ReduceOp, op), group=gloo)
        assert torch.equal(ours, theirs), op
    for root in range(world):
        x = torch.randint(-1000, 1000, (5,), generator=g)
        ours, theirs = x.clone(), x.clone()
        dist.reduce(ours, dst=root, op=dist.ReduceOp.MAX)
        dist.reduce(theirs, dst=root, op=dist.ReduceOp.MAX, group=gloo)
        if rank == root:
            assert torch.equal(ours, theirs), "reduce"
        ours = [torch.empty_like(x) for _ in range(world)] if rank == root else None
        theirs = [torch.empty_like(x) for _ in range(world)] if rank == root else None
        dist.gather(x, ours, dst=root)
        dist.gather(x, theirs, dst=root, group=gloo)
        if rank == root:
            assert all(torch.equal(a, b) for a, b in zip(ours, theirs)), "gather"
        parts = [torch.randn(4, generator=g) for _ in range(world)]
        ours, theirs = torch.empty(4), torch.empty(4)
        dist.scatter(ours, parts if rank == root else None, src=root)
        dist.scatter(theirs, parts if rank == root else None, src=root, group=gloo)
        assert torch.equal(ours, theirs), "scatter"
    print("ok other reductions reduce gather scatter", flush=True)


if __name__ == "__main__":
    sys.exit(main())
