#!/usr/bin/env python3
"""DDP of a small GPT (examples/python/ddp_gpt.py) on troupe's torch.distributed backend and on
gloo, with DDP's own allreduce, troupe's 2-bit hook (troupe.hooks) and PyTorch's PowerSGD hook,
side by side in one run: milliseconds a step and the held-out loss after the same steps.

  local:     `troupe launch -n P -- PY examples/python/ddp_gpt.py ...` on this host;
  --hosts N: N network-namespace hosts (tests/hosts/hosts.sh, as bench/allreduce_hosts.py makes
             them), every host's egress shaped to --rate (tc tbf), one rank a host started with
             torchrun's variables (MASTER_ADDR: host 0), GLOO_SOCKET_IFNAME=eth0.
PY is .venv-torch's python (torch 2.15 from PyPI, made if missing) with build/python on its path.
Every configuration runs the same steps from the same seeds; a cell is the median over --rounds
rounds (the rounds take every configuration in turn). Ratios: gloo's time with DDP's allreduce
over the configuration's (above 1: faster than plain DDP on gloo).

    flock /tmp/troupe-build.lock ninja -C build -j2   # build/bin/troupe and build/python
    python3 bench/ddp_gpt_hooks.py [--procs 2] [--steps 60] [--rounds 1]
    sudo python3 bench/ddp_gpt_hooks.py --hosts 2 --rate 1gbit
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce_hosts import (Hosts, ToolError, ensure_torch, interrupt_on_termination,  # noqa: E402
                             run_ranks, tail, Measuring)
import allreduce_hosts  # noqa: E402
from train_bench import add_int_flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-torch/bin/python")
EXAMPLE = os.path.join(ROOT, "examples/python/ddp_gpt.py")
CONFIGS = "gloo:none,troupe:none,gloo:powersgd,troupe:powersgd,gloo:2bit,troupe:2bit"


def parse_done(text, what):
    """(ms a step, held-out loss) from the example's last line."""
    m = re.search(r"done: .*held-out loss ([0-9.]+), ([0-9.]+) ms a step", text)
    if not m:
        raise ToolError(f"{what}: no 'done:' line in its output:\n{text[-3000:]}")
    return float(m.group(2)), float(m.group(1))


def example_flags(a, backend, hook):
    return [EXAMPLE, "--backend", backend, "--hook", hook, "--steps", str(a.steps),
            "--eval-every", str(a.steps), "--n-embd", str(a.n_embd), "--n-layer", str(a.n_layer),
            "--block-size", str(a.block_size), "--batch-size", str(a.batch_size)]


def run_local(a, backend, hook):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build/python"))
    cmd = [a.troupe, "launch", "-n", str(a.procs), "--", VENV_PY, *example_flags(a, backend, hook)]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=1800)
    if r.returncode != 0:
        first = next((line for line in r.stdout.splitlines() if "what():" in line), "")
        raise ToolError(f"{backend}/{hook} exited {r.returncode}: {first}\n{r.stdout[-3000:]}")
    return parse_done(r.stdout, f"{backend}/{hook}")


def run_hosts(a, hosts, backend, hook, k):
    logs = [os.path.join(hosts.shared, f"gpt-{backend}-{hook}-{k}-{r}.log")
            for r in range(a.hosts)]
    run_ranks(hosts, a.hosts, [VENV_PY, *example_flags(a, backend, hook)], logs, 29400 + k % 500,
              what=f"{backend}/{hook}")
    with open(logs[0]) as f:
        return parse_done(f.read(), f"{backend}/{hook} (log {logs[0]}: {tail(logs[0])})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=CONFIGS, help="BACKEND:HOOK,...")
    ap.add_argument("--procs", type=int, default=2, help="ranks on this host (local)")
    ap.add_argument("--hosts", type=int, default=0, help="namespace hosts, a rank each")
    ap.add_argument("--rate", default="1gbit", help="each host's egress (--hosts); none: unshaped")
    add_int_flags(ap, steps=300, n_embd=128, n_layer=2, block_size=64, batch_size=16, rounds=1)
    ap.add_argument("--prefix", default="bg")
    ap.add_argument("--subnet", default="10.77.3")
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    a = ap.parse_args()
    configs = [tuple(c.split(":")) for c in a.configs.split(",")]
    torch_version = ensure_torch()
    if a.hosts and os.geteuid() != 0:
        sys.exit("--hosts must run as root (hosts.sh makes network namespaces)")
    interrupt_on_termination()
    results, failed = {}, {}
    allreduce_hosts.WORLD = a.hosts or allreduce_hosts.WORLD
    hosts = Hosts(a.prefix, a.subnet) if a.hosts else None
    with Measuring(hosts) as run:
        if hosts:
            print(hosts.up(), file=sys.stderr, flush=True)
            for i in range(a.hosts):
                print(f"# {hosts.shape(i, a.rate)}", file=sys.stderr, flush=True)
        k = 0
        for r in range(a.rounds):
            for backend, hook in configs:
                k += 1
                start = time.monotonic()
                try:
                    ms, loss = (run_hosts(a, hosts, backend, hook, k) if a.hosts
                                else run_local(a, backend, hook))
                except ToolError as e:  # kept as a failed cell; the other configurations go on
                    failed[(backend, hook)] = str(e)
                    print(f"# round {r + 1}: {backend} {hook} FAILED: {e}", file=sys.stderr,
                          flush=True)
                    if hosts:
                        hosts.kill_children()
                    continue
                results.setdefault((backend, hook), []).append((ms, loss))
                print(f"# round {r + 1}: {backend} {hook}: {ms:.1f} ms a step, held-out loss "
                      f"{loss:.3f} ({time.monotonic() - start:.0f} s)", file=sys.stderr,
                      flush=True)
    if run.code is not None:
        return run.code

    where = (f"{a.hosts} namespace hosts x 1 rank, egress {a.rate} (tc tbf)" if a.hosts
             else f"{a.procs} ranks on this host (troupe launch)")
    print(f"# GPT n_layer {a.n_layer} n_embd {a.n_embd} block {a.block_size}, batch "
          f"{a.batch_size} a rank, AdamW, {a.steps} steps; {where}; 1 thread a rank; torch "
          f"{torch_version}; {os.cpu_count()} CPUs; median over {a.rounds} round(s)")
    print(f"{'backend':<8} {'hook':<9} {'ms/step':>9} {'vs gloo/none':>13} {'held-out loss':>14}")
    base = statistics.median(x[0] for x in results.get(("gloo", "none"), [(float("nan"),)]))
    for backend, hook in configs:
        v = results.get((backend, hook))
        if not v:
            why = failed[(backend, hook)].splitlines()[0]
            print(f"{backend:<8} {hook:<9} {'failed':>9}  {why[:200]}")
            continue
        ms = statistics.median(x[0] for x in v)
        loss = statistics.median(x[1] for x in v)
        print(f"{backend:<8} {hook:<9} {ms:>9.1f} {base / ms:>12.2f}x {loss:>14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
