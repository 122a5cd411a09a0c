#!/usr/bin/env python3
"""PyTorch's DDP and allreduce on troupe's torch.distributed backend against gloo, side by side in
the same processes: `troupe launch -n P` starts P ranks on this host; each makes the "troupe"
default group and a gloo group, and times the same work on each, alternating.

  allreduce:  dist.all_reduce of float32 tensors of 1 MB and 25 MB (DDP's bucket), seconds each
              and the ring's algorithm bandwidth (bytes / time).
  all_gather: dist.all_gather of 1 MB and 25 MB in all (each rank's part 1/P of it), likewise;
              and dist.all_gather_into_tensor (FSDP's: into one tensor) of 25 MB.
  broadcast:  dist.broadcast of 25 MB from rank 0 (DDP's model at its start), likewise.
  DDP:        an MLP (784-512-512-10, 0.7M parameters: compute-bound) and a wide one (1024-4096-
              4096-10, 21M parameters, 84 MB of gradients: communication-bound), batch 32 a rank,
              1 thread a rank, SGD; steps/s after 3 warm-up steps.
  FSDP2:      the wide MLP under torch's fully_shard (torch 2: each Linear sharded, all-gathered
              for its forward and backward, its gradients reduce-scattered), likewise; and the
              largest relative difference of the two backends' weights after the steps.
Rank 0 prints a table with troupe / gloo (above 1: troupe faster). Each of troupe's
implementations (--impls: the C++ backend, the Python process group) runs in a launch of its own,
and a last table puts their ratios side by side.

    .venv-torch/bin/python bench/torch_backend_vs_gloo.py [--procs 2] [--steps 20]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)


def run_rank(a):
    import torch
    import torch.distributed as dist

    import troupe.torch

    torch.set_num_threads(1)
    dist.init_process_group("troupe")
    rank = dist.get_rank()
    groups = {"troupe": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rows = []

    def timed(fn, n):
        dist.barrier(group=groups["gloo"])
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n

    for mb in (1, 25):
        t = torch.ones(mb * (1 << 20) // 4)
        times = {}
        for name, group in groups.items():
            dist.all_reduce(t, group=group)  # warm-up (troupe: the key's first use)
            times[name] = timed(lambda g=group: dist.all_reduce(t, group=g), a.rounds)
        rows.append((f"allreduce {mb} MB", "s", times, lambda s: f"{s * 1e3:.2f} ms",
                     lambda s, mb=mb: f"{mb / s:.0f} MB/s"))

    t = torch.ones(25 * (1 << 20) // 4)  # DDP's first step broadcasts the model from rank 0
    times = {}
    for name, group in groups.items():
        dist.broadcast(t, src=0, group=group)
        times[name] = timed(lambda g=group: dist.broadcast(t, src=0, group=g), a.rounds)
    rows.append(("broadcast 25 MB", "s", times, lambda s: f"{s * 1e3:.2f} ms",
                 lambda s: f"{25 / s:.0f} MB/s"))

    world = dist.get_world_size()
    for mb in (1, 25):  # what every rank ends with: its part is 1/world of it
        part = torch.ones(mb * (1 << 20) // 4 // world)
        parts = [torch.empty_like(part) for _ in range(world)]
        times = {}
        for name, group in groups.items():
            dist.all_gather(parts, part, group=group)
            times[name] = timed(lambda g=group: dist.all_gather(parts, part, group=g), a.rounds)
        rows.append((f"all_gather {mb} MB", "s", times, lambda s: f"{s * 1e3:.2f} ms",
                     lambda s, mb=mb: f"{mb / s:.0f} MB/s"))

    part = torch.ones(25 * (1 << 20) // 4 // world)  # the output: world parts, about 25 MB
    whole = torch.empty(part.numel() * world)
    times = {}
    for name, group in groups.items():
        dist.all_gather_into_tensor(whole, part, group=group)
        times[name] = timed(lambda g=group: dist.all_gather_into_tensor(whole, part, group=g),
                            a.rounds)
    rows.append(("all_gather_into_tensor 25 MB", "s", times, lambda s: f"{s * 1e3:.2f} ms",
                 lambda s: f"{25 / s:.0f} MB/s"))

    def mlp(sizes):
        layers = []
        for i, (m, n) in enumerate(zip(sizes, sizes[1:])):
            layers.append(torch.nn.Linear(m, n))
            if i + 2 < len(sizes):
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers)

    def trained(model, sizes):
        """The seconds of a SGD step of model on a batch of 32, timed over a.steps after 3."""
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(32, sizes[0]), torch.randint(0, 10, (32,))

        def step():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        for _ in range(3):
            step()
        return timed(step, a.steps)

    for label, sizes in (("DDP MLP 0.7M", [784, 512, 512, 10]),
                         ("DDP wide MLP 21M", [1024, 4096, 4096, 10])):
        times = {}
        for name, group in groups.items():
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(mlp(sizes), process_group=group)
            times[name] = trained(model, sizes)
        rows.append((label, "steps/s", times, lambda s: f"{1 / s:.1f} steps/s", None))

    functional = None  # torch 2's functional collectives on each backend: equal or not
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:  # torch 1
        funcol = None
    if funcol is not None:
        def each(group):
            g = torch.Generator().manual_seed(rank)
            x = torch.randn(world * 1000 + 8 * world, generator=g)
            try:
                return [funcol.all_reduce(x, "sum", group).wait(),
                        funcol.all_gather_tensor(x, 0, group).wait(),
                        funcol.reduce_scatter_tensor(x, "sum", 0, group).wait(),
                        funcol.all_to_all_single(x, None, None, group).wait(),
                        funcol.broadcast(x, 1, group).wait()]
            except (RuntimeError, NotImplementedError) as e:
                return str(e).splitlines()[0]
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the older names, kept by torch 2.15
            ours, theirs = each(groups["troupe"]), each(groups["gloo"])
        if isinstance(ours, str):
            functional = f"refused ({ours})"
        else:
            # The sums (all_reduce, reduce_scatter_tensor): two float32 sums of the same
            # `world` terms in other orders, each within gamma(world - 1) sum|x| of the exact
            # one (Higham, Lemma 3.1); equal where world is 2. The rest move values as they are.
            u = 2.0 ** -24
            gamma = (world - 1) * u / (1 - (world - 1) * u)
            g = torch.Generator().manual_seed(rank)
            magnitude = torch.randn(world * 1000 + 8 * world, generator=g).abs()
            dist.all_reduce(magnitude, group=groups["gloo"])
            bounds = [magnitude, None, magnitude.chunk(world)[rank], None, None]
            good = [torch.equal(a, b) if m is None else
                    bool(((a - b).abs() <= 2 * gamma * m).all())
                    for a, b, m in zip(ours, theirs, bounds)]
            functional = ("all_reduce and reduce_scatter_tensor within 2 gamma(world - 1) "
                          "sum|x| of gloo's, all_gather_tensor, all_to_all_single and broadcast "
                          f"equal to it: {'yes' if all(good) else 'NO'}")

    mesh_check = None  # a 2-D DeviceMesh's DTensors (subgroups: one ring a row, one a column)
    if funcol is not None and world >= 4 and world % 2 == 0:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        t = torch.arange(8.0 * world).reshape(4 * world, 2)
        try:
            d = distribute_tensor(t, mesh, [Shard(0), Shard(1)])
            moved = (d * 2).redistribute(mesh, [Replicate(), Shard(0)])
            same = torch.equal(d.full_tensor(), t) and torch.equal(moved.full_tensor(), 2 * t)
            back = "give the tensor back" if same else "DO NOT give it back"
            mesh_check = (f"a (2, {world // 2}) mesh: distribute_tensor, redistribute and "
                          f"full_tensor {back}")
        except (RuntimeError, NotImplementedError) as e:  # the Python process group
            mesh_check = f"refused ({str(e).splitlines()[0]})"

    fsdp_difference = None
    gathered = []  # how the FSDP weights were compared: "full_tensor" or "shards"

    def whole(p):
        try:
            got = p.full_tensor()
            gathered.append("full_tensor")
            return got
        except (RuntimeError, NotImplementedError):  # the Python process group
            gathered.append("shards")
            return p.to_local()
    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 1
        fully_shard = None
    if fully_shard is not None:
        sizes, times, weights = [1024, 4096, 4096, 10], {}, {}
        for name, group in groups.items():
            torch.manual_seed(0)
            model = mlp(sizes)
            mesh = DeviceMesh.from_group(group, "cpu")
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            times[name] = trained(model, sizes)
            # The whole weights, by DTensor's full_tensor() (torch's functional collectives, on
            # the group's own backend); the Python process group has no C++ backend for them,
            # so there each rank's shards, which both backends shard alike.
            weights[name] = [whole(p).detach().clone() for p in model.parameters()]
        rows.append(("FSDP2 wide MLP 21M", "steps/s", times, lambda s: f"{1 / s:.1f} steps/s",
                     None))
        worst = torch.tensor(max(((a - b).abs().max() / a.abs().max()).item()
                                 for a, b in zip(weights["troupe"], weights["gloo"])
                                 if a.numel() > 0))
        dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=groups["gloo"])
        fsdp_difference = worst.item()

    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({label: times for label, _, times, _, _ in rows}, f)
    if rank == 0:
        impl = "C++ backend" if troupe.torch._backend() is not None else "Python process group"
        print(f"\n{dist.get_world_size()} ranks on this host, 1 thread each; troupe's {impl}\n")
        print("| what | troupe | gloo | troupe / gloo | troupe rate | gloo rate |")
        print("|---|---|---|---|---|---|")
        for label, _, times, show, rate in rows:
            ratio = times["gloo"] / times["troupe"]
            print(f"| {label} | {show(times['troupe'])} | {show(times['gloo'])} | {ratio:.2f} | "
                  f"{rate(times['troupe']) if rate else '-'} | "
                  f"{rate(times['gloo']) if rate else '-'} |", flush=True)
        if functional is not None:
            print(f"\nfunctional collectives: {functional}", flush=True)
        if mesh_check is not None:
            print(f"DeviceMesh: {mesh_check}", flush=True)
        if fsdp_difference is not None:
            how = ("whole, by full_tensor()" if set(gathered) == {"full_tensor"}
                   else "shard by shard")
            print(f"\nFSDP2: the largest relative difference of the backends' weights after "
                  f"{a.steps + 3} steps: {fsdp_difference:.3g} (compared {how})", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=10, help="allreduce calls timed a size")
    ap.add_argument("--troupe", default=os.environ.get("TROUPE", "build/bin/troupe"))
    ap.add_argument("--impls", default="c++,python",
                    help="troupe's implementations to run, one launch each (TROUPE_TORCH_BACKEND): "
                    "c++ (the default backend), python (the Python process group)")
    ap.add_argument("--json", help=argparse.SUPPRESS)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        return run_rank(a)
    env = dict(os.environ)
    build_python = os.path.join(os.path.dirname(os.path.abspath(a.troupe)), "..", "python")
    if os.path.isdir(build_python):  # a build tree's package, where troupe is not installed
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [build_python,
                                                          env.get("PYTHONPATH")]))
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        for impl in a.impls.split(","):
            out = os.path.join(tmp, f"{impl}.json")
            cmd = [a.troupe, "launch", "-n", str(a.procs), "--", sys.executable, HERE, "--rank",
                   "--steps", str(a.steps), "--rounds", str(a.rounds), "--json", out]
            code = subprocess.call(cmd, env=dict(env, TROUPE_TORCH_BACKEND=impl))
            if code:
                return code
            with open(out) as f:
                found[impl] = json.load(f)
    if len(found) > 1:  # each implementation's time over gloo's in its own run
        impls = list(found)
        print("\nthe implementations side by side (gloo / troupe, above 1: troupe faster)\n")
        print("| what | " + " | ".join(impls) + f" | {impls[0]} / {impls[1]} |")
        print("|---|" + "---|" * (len(impls) + 1))
        for label in found[impls[0]]:
            ratios = [found[i][label]["gloo"] / found[i][label]["troupe"] for i in impls]
            print(f"| {label} | " + " | ".join(f"{r:.2f}" for r in ratios) +
                  f" | {ratios[0] / ratios[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
