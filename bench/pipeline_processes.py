#!/usr/bin/env python3
"""Pipeline stages in processes of their own (`--pipeline_across processes`): the pipeline's
bubble against GPipe's (K-1)/(M+K-1) for K stages and M micro-batches, with the stages' workers
on this host (`troupe launch -n K`) or on K namespace hosts over a shaped link (--hosts), beside
the same pipeline as stage threads of one process, in one run.

bubble = 1 - (the stages' computing) / (K x the first stage's time), per step, over the last
epoch: each stage's worker logs, at an epoch's end, its steps' time from their start there to its
last backward and the part of it it computed (the replica's noteStageTimes); the first stage
finishes a step last. GPipe's figure holds for balanced stages with free transfers; cores shared
by more stages than the machine has, unbalanced stages and transfers add to it.
Model: GPT-2 of --n-layer layers, --n-head heads, --n-embd wide, batch --batch x --seq bytes of
the licence texts every Debian system has (`troupe convert text`), SGD at a fixed rate; --threads
threads a stage (its worker's), and K x that for the process of stage threads.
tokens/s: the last epoch's, from the chief's "epoch N done" line.

    ninja -C build -j2 troupe_cli
    python3 bench/pipeline_processes.py [--stages 2,4] [--micro 1,2,4,8] [--epochs 2]
    sudo python3 bench/pipeline_processes.py --hosts [--rate 1gbit] [--stages 2,4]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce_hosts import (Hosts, Measuring, ToolError, interrupt_on_termination,  # noqa: E402
                             tail, wait_all)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ["/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0"]
STAGE = re.compile(r"\[worker (\d+)\] .*pipeline stage (\d+) of (\d+), (\d+) steps to step \d+ "
                   r"\(epoch (\d+)\): ([\d.]+) ms a step from its start to this stage's last "
                   r"backward, ([\d.]+) ms of it computing")
DONE = re.compile(r"epoch (\d+) done: .*\(\d+ tokens in [\d.]+ s, (\d+) tokens/s\)")


def train_flags(a, data, stages, micro, out):
    return ["train", "--model", "gpt2", "--block_size", str(a.seq), "--vocab_size", "256",
            "--n_layer", str(a.n_layer), "--n_head", str(a.n_head), "--n_embd", str(a.n_embd),
            "--batch_size", str(a.batch), "--train_data", data,
            "--epoch_size", str(a.batch * a.steps), "--num_epochs", str(a.epochs),
            "--optimizer", "sgd", "--lr_policy", "fixed", "--base_learning_rate", "0.01",
            "--log_every", "0", "--pipeline_stages", str(stages), "--micro_batches", str(micro),
            "--log_dir", out, "--checkpoint_dir", out]


def tokens_per_s(output, epochs, what):
    rates = {int(e): int(r) for e, r in DONE.findall(output)}
    if epochs not in rates:
        raise ToolError(f"{what}: no line 'epoch {epochs} done':\n{output[-3000:]}")
    return rates[epochs]


def bubble(output, stages, epochs, what):
    """The last epoch's bubble and the stages' (step ms, computing ms)."""
    times = {}
    for worker, stage, k, _, epoch, step_ms, busy_ms in STAGE.findall(output):
        if int(epoch) == epochs and int(k) == stages:
            times[int(stage)] = (float(step_ms), float(busy_ms))
    if sorted(times) != list(range(stages)):
        raise ToolError(f"{what}: stage lines of epoch {epochs} for {sorted(times)}, want all "
                        f"{stages}:\n{output[-3000:]}")
    longest = max(t for t, _ in times.values())
    return 1 - sum(b for _, b in times.values()) / (stages * longest), times


def run(cmd, timeout, what, cwd):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise ToolError(f"{what} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return r.stdout


class Local:
    """The stages' workers on this host."""

    def __init__(self, a, folder):
        self.a, self.folder = a, folder

    def stages(self, k, m, out):
        cmd = [self.a.troupe, "launch", "-n", str(k), "--", self.a.troupe,
               *train_flags(self.a, self.data, k, m, out), "--schedule", "bsp-allreduce",
               "--pipeline_across", "processes", "--threads", str(self.a.threads)]
        return run(cmd, self.a.timeout, f"{k} stage workers, {m} micro-batches", out)


class OnHosts:
    """Stage s's worker on namespace host s, every host's egress shaped to --rate."""

    def __init__(self, a, hosts):
        self.a, self.hosts = a, hosts
        self.hostfile = os.path.join(hosts.shared, "hostfile")

    def stages(self, k, m, out):
        with open(self.hostfile, "w") as f:
            f.writelines(f"{addr}\n" for addr in self.hosts.addr[:k])
        ssh = [f"--ssh-opt={o}" for o in self.hosts.ssh_opts.split()]
        cmd = [self.a.troupe, "launch", "--launcher", "ssh", "-H", self.hostfile, "-n", str(k),
               "--interface", "eth0", *ssh, "--", self.a.troupe,
               *train_flags(self.a, self.data, k, m, out), "--schedule", "bsp-allreduce",
               "--pipeline_across", "processes", "--threads", str(self.a.threads),
               "--interface", "eth0"]
        p = self.hosts.start(0, {}, cmd, os.path.join(out, "launch.out"), cwd=out)
        wait_all([p], self.a.timeout, f"{k} stage workers on hosts, {m} micro-batches")
        with open(p.log) as f:
            output = f.read()
        if p.returncode != 0:
            raise ToolError(f"{k} stage workers on hosts failed ({p.returncode}):\n{tail(p.log)}")
        return output


def measure(a, place, folder):
    print(f"# GPT-2 {a.n_layer} layers x {a.n_embd}, {a.n_head} heads, batch {a.batch} x {a.seq}; "
          f"{a.threads} thread(s) a stage; {a.epochs} epochs of {a.steps} steps, the last "
          f"measured; stages {a.where}")
    print()
    print("| K | M | bubble | GPipe (K-1)/(M+K-1) | ratio | stage ms a step (computing) "
          "| tokens/s, workers | tokens/s, threads | workers / threads |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in [int(x) for x in a.stages.split(",")]:
        for m in [int(x) for x in a.micro.split(",")]:
            out = os.path.join(folder, f"k{k}-m{m}")
            os.makedirs(out + "-threads")
            os.makedirs(out)
            staged = place.stages(k, m, out)
            b, times = bubble(staged, k, a.epochs, f"K {k} M {m}")
            rate = tokens_per_s(staged, a.epochs, f"K {k} M {m}")
            one = run([a.troupe, *train_flags(a, place.data, k, m, out + "-threads"),
                       "--threads", str(a.threads * k)], a.timeout,
                      f"{k} stage threads, {m} micro-batches", out + "-threads")
            threads_rate = tokens_per_s(one, a.epochs, f"K {k} M {m} threads")
            gpipe = (k - 1) / (m + k - 1)
            stage_ms = ", ".join(f"{t:.1f} ({c:.1f})" for _, (t, c) in sorted(times.items()))
            print(f"| {k} | {m} | {b:.3f} | {gpipe:.3f} | {b / gpipe:.2f} | {stage_ms} | {rate} "
                  f"| {threads_rate} | {rate / threads_rate:.2f} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    p.add_argument("--stages", default="2,4")
    p.add_argument("--micro", default="1,2,4,8")
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30, help="steps an epoch")
    p.add_argument("--epochs", type=int, default=2, help="the first is the warm-up")
    p.add_argument("--threads", type=int, default=1, help="a stage's")
    p.add_argument("--timeout", type=int, default=900, help="seconds a run may take")
    p.add_argument("--hosts", action="store_true", help="each stage on a namespace host (root)")
    p.add_argument("--rate", default="1gbit", help="--hosts: each host's egress (tc); none")
    p.add_argument("--prefix", default="pp", help="--hosts: hosts.sh prefix")
    p.add_argument("--subnet", default="10.78.0", help="--hosts: hosts.sh subnet A.B.C")
    a = p.parse_args()
    if not os.access(a.troupe, os.X_OK):
        sys.exit(f"{a.troupe} is missing: ninja -C build -j2 troupe_cli")
    hosts = None
    if a.hosts:
        if os.geteuid() != 0:
            sys.exit("--hosts must run as root (hosts.sh makes network namespaces)")
        interrupt_on_termination()
        hosts = Hosts(a.prefix, a.subnet, max(int(x) for x in a.stages.split(",")))
    with Measuring(hosts) as measured:
        if hosts:
            print(hosts.up(), file=sys.stderr, flush=True)
            for i in range(hosts.count):
                print(f"# {hosts.shape(i, a.rate)}", file=sys.stderr, flush=True)
            folder = tempfile.mkdtemp(prefix="pipeline-", dir=hosts.shared)
            place = OnHosts(a, hosts)
            a.where = f"on {hosts.count} namespace hosts, each host's egress {a.rate}"
        else:
            folder = tempfile.mkdtemp(prefix="troupe-pipeline-")
            place = Local(a, folder)
            a.where = "as workers on this host"
        place.data = os.path.join(folder, "data")
        run([a.troupe, "convert", "text", *TEXTS, "--out", place.data, "--name", "lic"], 120,
            "troupe convert text", folder)
        measure(a, place, folder)
    return measured.code or 0


if __name__ == "__main__":
    sys.exit(main())
