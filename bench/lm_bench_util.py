"""What the language models' CPU benchmarks share (bench/gpt_cpu_vs_peers.py,
bench/lstm_cpu_vs_peers.py): running PyTorch's side and troupe's, each read as its figure."""
import argparse
import csv
import glob
import os
import re
import statistics
import subprocess
import sys
import time

from allreduce_hosts import ensure_torch


def parse_args_or_torch_side(parser, torch_side):
    """Parses the command line, with the internal flag --torch-side that PyTorch's side's command
    gives (torch_median_step's, this script under .venv-torch's python): then torch_side(args)
    prints its figure and the script ends. Otherwise: the args, and the torch version of
    .venv-torch (installed if missing)."""
    parser.add_argument("--torch-side", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.torch_side:
        torch_side(a)
        sys.exit()
    return a, ensure_torch()


def median_step_seconds(step, steps):
    """Runs step() steps + 1 times, the first a warm-up (and torch.compile's compilation): the
    median of the others' times, in seconds."""
    times = []
    for i in range(steps + 1):
        start = time.perf_counter()
        step()
        if i > 0:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_median_step(cmd):
    """Runs PyTorch's side (a command printing "median_step_s S"): S, in seconds."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    m = re.search(r"median_step_s ([0-9.]+)", r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"PyTorch's side failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return float(m.group(1))


def troupe_tokens_per_sec(cmd, work, model):
    """Runs `troupe train` (cmd, its log in `work`, two epochs): the tokens/s of its second epoch
    from its CSV log (the first holds the warm-up)."""
    return troupe_run(cmd, work, model)[0]


def troupe_run(cmd, work, model):
    """As troupe_tokens_per_sec: that figure, and the run's output."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
    logs = glob.glob(os.path.join(work, model + "_*.log"))
    if r.returncode != 0 or not logs:
        sys.exit(f"troupe failed ({r.returncode}):\n{r.stdout[-3000:]}")
    with open(logs[0]) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    return float(rows[-1]["inputs_per_sec"]), r.stdout
