#!/usr/bin/env python3
"""Sharded optimizer state (ZeRO stage 1) on the CPU: memory per worker and step time, against
the same run unsharded, side by side in one run.

A GPT (--n-layer 4 --n-embd 512 --n-head 8: 12.7M parameters, vocabulary 256, sequences of
--seq 64 tokens, --batch-size 4 a worker) trained with AdamW, whose state is two rows the size of
the weights, by `troupe launch -n W` (--workers, 2 by default; one thread each) under
bsp-allreduce, with `--zero_stage 0` and `--zero_stage 1`. Each worker runs under GNU time, whose
maximum resident set size is its peak memory; the step time is the second epoch's tokens/s from
the chief's CSV log (the first holds the warm-up). Expected: the sharded worker holds
(W - 1) / W of the state less, 2 x 4 B x params x (W - 1) / W (101 MiB at 12.7M params and 2
workers), at about the same speed (the traffic of an allreduce: a reduce-scatter and an
all-gather).

    bash scripts/build.sh troupe_cli
    python3 bench/zero_cpu.py [--workers 2] [--epoch-size 256] [--n-embd 512]
"""
import argparse
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_bench_util import troupe_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TROUPE = os.path.join(ROOT, "build/bin/troupe")


def run(a, zero, work):
    """One run: (tokens/s, each worker's peak resident memory in MiB)."""
    cmd = [TROUPE, "launch", "-n", str(a.workers), "--", "/usr/bin/time", "-f",
           "maxrss_kib %M", TROUPE, "train", "--model", "gpt2", "--train_data", "null",
           "--block_size", str(a.seq), "--vocab_size", "256", "--n_layer", str(a.n_layer),
           "--n_head", str(a.n_head), "--n_embd", str(a.n_embd),
           "--batch_size", str(a.batch_size), "--epoch_size", str(a.epoch_size),
           "--num_epochs", "2", "--optimizer", "adamw", "--base_learning_rate", "0.0003",
           "--threads", "1", "--log_every", "0", "--schedule", "bsp-allreduce",
           "--zero_stage", str(zero), "--log_dir", work, "--checkpoint_every", "0"]
    tokens, output = troupe_run(cmd, work, "gpt2")
    peaks = [int(k) / 1024 for k in re.findall(r"maxrss_kib (\d+)", output)]
    if len(peaks) != a.workers:
        sys.exit(f"expected {a.workers} peaks from GNU time:\n{output[-3000:]}")
    return tokens, peaks


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=512)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--epoch-size", type=int, default=256)
    a = p.parse_args()
    if not os.path.exists(TROUPE):
        sys.exit(f"{TROUPE} is missing: bash scripts/build.sh troupe_cli")
    results = {}
    for zero in (0, 1):
        with tempfile.TemporaryDirectory() as work:
            results[zero] = run(a, zero, work)
    print(f"GPT n_layer {a.n_layer} n_embd {a.n_embd}, AdamW, {a.workers} workers of batch "
          f"{a.batch_size} x {a.seq} tokens, 1 thread each")
    print(f"{'zero_stage':>10} {'tokens/s':>10} {'peak MiB per worker':>30}")
    for zero, (tokens, peaks) in results.items():
        print(f"{zero:>10} {tokens:>10.0f} {', '.join(f'{m:.0f}' for m in peaks):>30}")
    (t0, p0), (t1, p1) = results[0], results[1]
    print(f"sharded / unsharded: tokens/s {t1 / t0:.2f}x, peak memory per worker "
          f"{max(p1) / max(p0):.2f}x ({max(p0) - max(p1):.0f} MiB less)")


if __name__ == "__main__":
    main()
