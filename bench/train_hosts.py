#!/usr/bin/env python3
"""Distributed training across two hosts on a shaped link: troupe vs PyTorch DDP (gloo), and
troupe's gradient compression, side by side in one run.

Two "hosts" from tests/hosts/hosts.sh (network namespaces on a bridge, each with its own /tmp,
/dev/shm and sshd; prefix --prefix, torn down at the end, also on an error or Ctrl-C), every
host's egress shaped to --rate by `hosts.sh shape I rate R` (tc tbf; "none" = unshaped veth), one
process x 1 thread per host, per-process batch --batch (global 2x), SGD lr 0.01 (fixed), momentum
0.9, weight decay 5e-4, Fashion-MNIST, --epochs epochs of --epoch-size inputs (over both hosts).
  troupe: `troupe launch --launcher ssh -H HOSTFILE -n 2 --interface eth0` on host 0, logging in
          to both hosts through their sshd (hosts.sh ssh-opts), running `troupe train --schedule
          bsp-allreduce --threads 1 --interface eth0 --gradient_compression C
          --gradient_compression_threshold T` from the LMDB copy of Fashion-MNIST (made by `troupe
          convert` into out/fashion-mnist-lmdb if missing); inputs/s and test accuracy from rank
          0's CSV log.
  DDP:    torch.nn.parallel.DistributedDataParallel over gloo (GLOO_SOCKET_IFNAME=eth0), this
          script's --ddp-worker mode under .venv-torch's python on each host, the models of
          bench/kernels_vs_pytorch.py, images already in memory as a tensor (no loading cost).
inputs/s = the inputs of epochs 2..E over their training time (the first epoch is the warm-up;
test evaluation is not timed); test accuracy = on the 10000 test images after the last epoch.
A cell is the median over --rounds rounds, [min-max]; the rounds take every configuration in turn.

    flock /tmp/troupe-build.lock ninja -C build -j2 troupe_cli   # build/bin/troupe
    sudo python3 bench/train_hosts.py [--models mlp,lenet] [--rate 1gbit] [--epochs 3]
        [--epoch-size 19200] [--batch 32] [--compression none,fp16,bf16,2bit] [--threshold 0.001]
        [--rounds 1] [--prefix bt]
(.venv-torch is made with torch==2.15.0 from PyPI if it lacks torch.)
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce_hosts import (Hosts, ToolError, ensure_torch, interrupt_on_termination,  # noqa: E402
                             tail, Measuring, wait_all)

from train_bench import ROOT, add_troupe_and_data_flags, ensure_data  # noqa: E402
VENV_PY = os.path.join(ROOT, ".venv-torch/bin/python")
FASHION = "/usr/share/datasets/fashion-mnist"
WORLD = 2


# --- the DDP worker (runs on a host, under .venv-torch's python) ---------------------------------

def ddp_worker(rank, master, name, batch, epochs, epoch_size):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from kernels_vs_pytorch import lenet, mlp
    from train_vs_pytorch import load_idx
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=master, rank=rank, world_size=WORLD)
    torch.manual_seed(1)
    x, y = load_idx("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
    net = {"lenet": lenet, "mlp": mlp}[name]()
    params = sum(p.numel() for p in net.parameters())
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    steps = epoch_size // (batch * WORLD)
    times = []
    i = 0
    for epoch in range(epochs):
        perm = torch.randperm(x.shape[0])
        model.train()
        dist.barrier()
        start = time.perf_counter()
        for s in range(steps):
            first = ((s * WORLD + rank) * batch) % (x.shape[0] - batch)
            idx = perm[first:first + batch]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            i += 1
        dist.barrier()
        times.append(time.perf_counter() - start)
    if rank == 0:
        tx, ty = load_idx("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
        model.eval()
        with torch.no_grad():
            correct = sum(int((net(tx[k:k + 1000]).argmax(1) == ty[k:k + 1000]).sum())
                          for k in range(0, tx.shape[0], 1000))
        timed = times[1:] or times
        rate = steps * batch * WORLD * len(timed) / sum(timed)
        print(f"RESULT {rate:.2f} {correct / tx.shape[0]:.6f} {params} "
              + " ".join(f"{t:.3f}" for t in times), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# --- the runs ------------------------------------------------------------------------------------

class Runs:
    def __init__(self, a, hosts, data):
        self.a, self.hosts, self.data = a, hosts, data
        self.counter = 0
        self.hostfile = os.path.join(hosts.shared, "hostfile")
        with open(self.hostfile, "w") as f:
            f.writelines(f"{addr}\n" for addr in hosts.addr)

    def workdir(self, name):
        self.counter += 1
        d = os.path.join(self.hosts.shared, f"{self.counter:03d}-{name}")
        os.makedirs(d)
        return d

    def timeout(self):
        return 300 + self.a.epochs * self.a.epoch_size / 50  # >= 50 inputs/s, plus start-up

    def troupe(self, model, compression):
        d = self.workdir(f"troupe-{model}-{compression}")
        ssh = [f"--ssh-opt={o}" for o in self.hosts.ssh_opts.split()]
        cmd = [self.a.troupe, "launch", "--launcher", "ssh", "-H", self.hostfile, "-n", str(WORLD),
               "--interface", "eth0", *ssh, "--",
               self.a.troupe, "train", "--model", model, "--schedule", "bsp-allreduce",
               "--batch_size", str(self.a.batch), "--threads", "1", "--interface", "eth0",
               "--gradient_compression", compression,
               "--gradient_compression_threshold", str(self.a.threshold),
               "--train_data", f"{self.data}/train", "--test_data", f"{self.data}/test",
               "--db_type", "lmdb", "--epoch_size", str(self.a.epoch_size),
               "--num_epochs", str(self.a.epochs), "--base_learning_rate", "0.01",
               "--lr_policy", "fixed", "--momentum", "0.9", "--weight_decay", "0.0005",
               "--log_every", "0", "--log_dir", d, "--checkpoint_dir", d]
        p = self.hosts.start(0, {}, cmd, f"{d}/launch.out", cwd=d)
        wait_all([p], self.timeout(), f"troupe {model} {compression}")
        logs = [f for f in os.listdir(d) if f.endswith(".log")]
        if len(logs) != 1:
            raise ToolError(f"troupe {model} {compression}: want one CSV log in {d}, found {logs}:"
                            f"\n{tail(p.log)}")
        with open(os.path.join(d, logs[0])) as f:
            rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
        if len(rows) != self.a.epochs:
            raise ToolError(f"troupe {model} {compression}: {len(rows)} epochs logged, want "
                            f"{self.a.epochs}:\n{tail(p.log)}")
        timed = rows[1:] or rows
        rate = sum(float(r["input_count"]) for r in timed) / sum(float(r["time_spent"])
                                                                 for r in timed)
        return rate, float(rows[-1]["test_accuracy"]), [float(r["time_spent"]) for r in rows]

    def ddp(self, model):
        d = self.workdir(f"ddp-{model}")
        master = f"tcp://{self.hosts.addr[0]}:{29500 + self.counter % 1000}"
        env = {"GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": 1}
        procs = [self.hosts.start(r, env, [VENV_PY, os.path.abspath(__file__), "--ddp-worker",
                                           str(r), master, "--models", model,
                                           "--batch", str(self.a.batch),
                                           "--epochs", str(self.a.epochs),
                                           "--epoch-size", str(self.a.epoch_size)],
                                  f"{d}/rank{r}.log")
                 for r in reversed(range(WORLD))]
        wait_all(procs, self.timeout(), f"ddp {model}")
        with open(procs[-1].log) as f:
            line = next((x for x in f if x.startswith("RESULT ")), None)
        if not line:
            raise ToolError(f"ddp {model}: no result:\n{tail(procs[-1].log)}")
        f = line.split()
        self.params = int(f[3])
        return float(f[1]), float(f[2]), [float(t) for t in f[4:]]


def cell(values, fmt):
    if not values:
        return "-"
    if len(values) == 1:
        return format(values[0], fmt)
    return (f"{format(statistics.median(values), fmt)} "
            f"[{format(min(values), fmt)}-{format(max(values), fmt)}]")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_troupe_and_data_flags(p)
    p.add_argument("--models", default="mlp,lenet")
    p.add_argument("--rate", default="1gbit", help="every host's egress rate (tc tbf); none")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--epoch-size", type=int, default=19200, help="inputs per epoch, both hosts")
    p.add_argument("--batch", type=int, default=32, help="per process")
    p.add_argument("--compression", default="none,fp16,bf16,2bit",
                   help="troupe's --gradient_compression values to run")
    p.add_argument("--threshold", type=float, default=0.001, help="2bit's threshold")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-ddp", action="store_true", help="troupe only")
    p.add_argument("--prefix", default="bt", help="hosts.sh prefix of this run's hosts")
    p.add_argument("--subnet", default="10.80.0", help="hosts.sh subnet A.B.C")
    p.add_argument("--ddp-worker", nargs=2, metavar=("RANK", "MASTER"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.ddp_worker:
        ddp_worker(int(a.ddp_worker[0]), a.ddp_worker[1], a.models, a.batch, a.epochs,
                   a.epoch_size)
        return 0
    if a.epoch_size % (a.batch * WORLD):
        sys.exit(f"--epoch-size must be a multiple of {a.batch * WORLD} (2 x --batch)")
    if os.geteuid() != 0:
        sys.exit("must run as root (hosts.sh makes network namespaces, bridges and mounts)")
    if not os.access(a.troupe, os.X_OK):
        sys.exit(f"{a.troupe} is missing: flock /tmp/troupe-build.lock ninja -C build -j2 "
                 "troupe_cli")
    torch_version = "-" if a.no_ddp else ensure_torch()
    ensure_data(a.troupe, a.data, stdout=subprocess.DEVNULL)
    models = a.models.split(",")
    configs = ([] if a.no_ddp else ["ddp"]) + [f"troupe-{c}" for c in a.compression.split(",")]

    interrupt_on_termination()

    hosts = Hosts(a.prefix, a.subnet)
    results = {}  # (model, config) -> [(inputs/s, test accuracy)]
    failures = 0
    params = {}
    with Measuring(hosts) as run:
        print(hosts.up(), file=sys.stderr, flush=True)
        for i in range(WORLD):
            print(f"# {hosts.shape(i, a.rate)}", file=sys.stderr, flush=True)
        runs = Runs(a, hosts, a.data)
        for r in range(a.rounds):
            for model in models:
                for config in configs:
                    with open("/proc/loadavg") as f:
                        load = " ".join(f.read().split()[:3])
                    try:
                        if config == "ddp":
                            rate, acc, times = runs.ddp(model)
                            params[model] = runs.params
                        else:
                            rate, acc, times = runs.troupe(model, config.split("-", 1)[1])
                    except ToolError as e:
                        print(f"# FAILED: {e}", file=sys.stderr, flush=True)
                        failures += 1
                        continue
                    results.setdefault((model, config), []).append((rate, acc))
                    print(f"# round {r + 1}: {model} {config}: {rate:.0f} inputs/s, test accuracy "
                          f"{acc:.4f}; epoch seconds {' '.join(f'{t:.2f}' for t in times)}; "
                          f"load average {load}", file=sys.stderr, flush=True)
    if run.code is not None:
        return run.code

    print(f"# 2 hosts x 1 process x 1 thread, link {a.rate} each way (tc tbf), batch {a.batch} "
          f"per process (global {a.batch * WORLD}), SGD lr 0.01 momentum 0.9 wd 5e-4, "
          f"{a.epochs} epochs of {a.epoch_size} inputs; inputs/s of epochs 2..{a.epochs}; test "
          f"accuracy after epoch {a.epochs}; median [min-max] over {a.rounds} round(s); "
          f"2bit threshold {a.threshold:g}; torch {torch_version}; {os.cpu_count()} CPUs")
    print(f"{'model':<6} {'config':<12} {'params':>8} {'inputs/s':>20} {'vs DDP':>7} "
          f"{'vs none':>8} {'test acc':>22}")
    for model in models:
        def med(config):
            v = results.get((model, config))
            return statistics.median(x[0] for x in v) if v else float("nan")

        def ratio(x, y):
            return f"{x / y:.2f}x" if x == x and y == y else "-"  # x == x: not nan
        for config in configs:
            v = results.get((model, config), [])
            print(f"{model:<6} {config:<12} {params.get(model, '-'):>8} "
                  f"{cell([x[0] for x in v], '.0f'):>20} {ratio(med(config), med('ddp')):>7} "
                  f"{ratio(med(config), med('troupe-none')):>8} "
                  f"{cell([x[1] for x in v], '.4f'):>22}")
    if failures:
        print(f"\n# {failures} run(s) failed (their errors are above, on stderr)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
