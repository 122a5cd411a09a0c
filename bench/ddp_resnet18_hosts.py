#!/usr/bin/env python3
"""torchvision's ResNet-18 under PyTorch's DistributedDataParallel (examples/python/ddp_resnet18.py)
on troupe's torch.distributed backend and on gloo, one rank a network-namespace host (as
bench/allreduce_hosts.py makes them), every host's egress shaped by tc, side by side in one run:
images/s over the same steps, and the train loss and test accuracy they reach.

Each rank runs 1 thread; the example as it is, started with torchrun's variables (MASTER_ADDR:
host 0), --steps steps of --batch-size 28x28 Fashion-MNIST images a rank, its test accuracy on the
first --test-images test images. ResNet-18's 11.2M parameters are 44.7 MB of gradients a step,
which DDP sums in buckets during the backward pass: 2 (N-1)/N of that crosses each rank's link,
about 0.36 s a step at 1 Gbit/s with 2 ranks. A cell is the median over --rounds rounds (the
rounds take every configuration in turn). PY is .venv-torch's python (torch 2.15 from PyPI, and
torchvision, installed if missing) with build/python on its path.

    flock /tmp/troupe-build.lock ninja -C build -j2   # build/bin/troupe and build/python
    sudo python3 bench/ddp_resnet18_hosts.py [--hosts 2,4] [--rates 1gbit,10gbit] [--steps 30]
    sudo python3 bench/ddp_resnet18_hosts.py --hosts 2 --rates 1gbit \
        --backends gloo,troupe,gloo:powersgd,troupe:2bit     # the hooks, side by side

"/ gloo" is a row's images/s over gloo's (DDP's own allreduce) on the same hosts and egress.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce_hosts import (Hosts, Measuring, ToolError, ensure_torch,  # noqa: E402
                             interrupt_on_termination, run_ranks, TORCH_VERSION, VENV_PY)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples/python/ddp_resnet18.py")
EPOCH = re.compile(r"epoch 1: train loss ([0-9.]+), test accuracy ([0-9.]+), (\d+) images/s")


def ensure_torchvision():
    """torchvision beside .venv-torch's torch (the version pip pairs with it)."""
    check = [VENV_PY, "-c", "import torchvision; print(torchvision.__version__)"]
    r = subprocess.run(check, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if r.returncode != 0:
        print("# installing the peer's torchvision into .venv-torch", flush=True)
        subprocess.run([VENV_PY, "-m", "pip", "install", "torchvision",
                        f"torch=={TORCH_VERSION}"], check=True)
        r = subprocess.run(check, stdout=subprocess.PIPE, text=True, check=True)
    return r.stdout.strip()


def run(a, hosts, world, config, k):
    """(images/s, train loss, test accuracy) of one run on hosts 0 .. world-1; config: BACKEND,
    or BACKEND:HOOK (the example's --hook: 2bit, fp16, bf16, powersgd)."""
    backend, _, hook = config.partition(":")
    logs = [os.path.join(hosts.shared, f"resnet18-{backend}-{hook or 'none'}-{world}-{k}-{r}.log")
            for r in range(world)]
    cmd = [VENV_PY, EXAMPLE, "--backend", backend, "--hook", hook or "none", "--steps",
           str(a.steps), "--batch-size", str(a.batch_size), "--test-images", str(a.test_images)]
    run_ranks(hosts, world, cmd, logs, 29500 + k % 400, what=f"{config} on {world} hosts")
    with open(logs[0]) as f:
        text = f.read()
    m = EPOCH.search(text)
    if not m:
        raise ToolError(f"{config} on {world} hosts: no 'epoch 1:' line:\n{text[-3000:]}")
    return float(m.group(3)), float(m.group(1)), float(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="2,4", help="host counts, a rank each")
    ap.add_argument("--rates", default="1gbit,10gbit", help="each host's egress (tc tbf)")
    ap.add_argument("--backends", default="gloo,troupe",
                    help="BACKEND or BACKEND:HOOK, comma-separated: gloo:powersgd,troupe:2bit "
                    "compares troupe's 2-bit hook with PyTorch's PowerSGD")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=32, help="a rank's")
    ap.add_argument("--test-images", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prefix", default="rn")
    ap.add_argument("--subnet", default="10.77.5")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("must run as root (hosts.sh makes network namespaces)")
    counts = [int(n) for n in a.hosts.split(",")]
    rates, backends = a.rates.split(","), a.backends.split(",")
    torch_version = ensure_torch()
    vision_version = ensure_torchvision()
    interrupt_on_termination()
    results, failed = {}, {}
    hosts = Hosts(a.prefix, a.subnet, max(counts))
    with Measuring(hosts) as measuring:
        print(hosts.up(), file=sys.stderr, flush=True)
        k = 0
        for rate in rates:
            for i in range(max(counts)):
                print(f"# {hosts.shape(i, rate)}", file=sys.stderr, flush=True)
            for r in range(a.rounds):
                for world in counts:
                    for backend in backends:
                        k += 1
                        start = time.monotonic()
                        key = (rate, world, backend)
                        try:
                            got = run(a, hosts, world, backend, k)
                        except ToolError as e:  # a failed cell; the others go on
                            failed[key] = str(e)
                            print(f"# {key} FAILED: {e}", file=sys.stderr, flush=True)
                            hosts.kill_children()
                            continue
                        results.setdefault(key, []).append(got)
                        print(f"# round {r + 1}, {rate}, {world} hosts, {backend}: {got[0]:.0f} "
                              f"images/s, train loss {got[1]:.4f}, test accuracy {got[2]:.4f} "
                              f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    if measuring.code is not None:
        return measuring.code

    print(f"# torchvision ResNet-18 under DDP, {a.steps} steps of {a.batch_size} 28x28 images a "
          f"rank, SGD; one rank a namespace host, 1 thread a rank; torch {torch_version}, "
          f"torchvision {vision_version}; {os.cpu_count()} CPUs; median over {a.rounds} "
          f"round(s)\n")
    print("| egress | hosts | backend | images/s | steps/s | / gloo | train loss | "
          "test accuracy |")
    print("|---|---|---|---|---|---|---|---|")
    for rate in rates:
        for world in counts:
            gloo = results.get((rate, world, "gloo"))
            for backend in backends:
                v = results.get((rate, world, backend))
                if not v:
                    print(f"| {rate} | {world} | {backend} | failed | | | | |")
                    continue
                rate_med = statistics.median(x[0] for x in v)
                ratio = (f"{rate_med / statistics.median(x[0] for x in gloo):.2f}"
                         if gloo and backend != "gloo" else "")
                print(f"| {rate} | {world} | {backend} | {rate_med:.0f} | "
                      f"{rate_med / (a.batch_size * world):.2f} | {ratio} | "
                      f"{statistics.median(x[1] for x in v):.4f} | "
                      f"{statistics.median(x[2] for x in v):.4f} |")
    for key, why in failed.items():
        print(f"\n{key} failed: {why.splitlines()[0]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
