#!/usr/bin/env python3
"""Sharded optimizer state and gradients (ZeRO stages 1 and 2) on the CPU: memory per worker and
step time, against the same run unsharded, side by side in one run.

A GPT (--n-layer 4 --n-embd 512 --n-head 8: 12.7M parameters, vocabulary 256, sequences of
--seq 64 tokens, --batch-size 4 a worker) trained with AdamW, whose state is two rows the size of
the weights, by `troupe launch -n W` (--workers, 2 by default; one thread each) under
bsp-allreduce, with `--zero_stage 0`, 1 and 2, gradient buckets of --bucket-mb MiB (4: a bucket
is at least a layer's, 4 MiB for the MLP's first product). Each worker's memory is read twice:
its resident set sampled every 20 ms while it trains its first epoch (/proc/PID/status VmRSS,
until the chief's CSV log has that epoch's row: the training's memory, every buffer made by
then), and its maximum resident set size from GNU time, which also holds the run's end (the
chief then holds the whole model and state for the checkpoint, sharded or not). The step time
is the second epoch's tokens/s from the chief's CSV log (the first holds the warm-up).
Expected: a sharded worker trains holding (W - 1) / W of the state less, 2 x 4 B x params x
(W - 1) / W (51 MiB at 12.7M params and 2 workers; more where the unsharded worker's epoch-end
message carried its whole state), at about the same speed (the traffic of an allreduce: a
reduce-scatter and an all-gather). Stage 2 holds, of the gradients, two buckets' slots and 1/W
of the sums instead of the whole model's: about 16 MiB less again at 2 workers.

    bash scripts/build.sh troupe_cli
    python3 bench/zero_cpu.py [--workers 2] [--epoch-size 256] [--n-embd 512] [--bucket-mb 4]
"""
import argparse
import glob
import os
import re
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_bench_util import troupe_run  # noqa: E402
from train_bench import add_int_flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TROUPE = os.path.join(ROOT, "build/bin/troupe")


def workers_of(marker):
    """The pids of the `troupe train` processes whose command line holds `marker` (not the
    launcher's, nor GNU time's)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if (len(argv) > 1 and argv[0].endswith(b"troupe") and argv[1] == b"train"
                and marker.encode() in argv):
            pids.append(pid)
    return pids


def resident_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(a, zero, work):
    """One run: (tokens/s, each worker's largest sampled resident memory while training and its
    peak from GNU time, in MiB)."""
    marker = f"zero{zero}-{os.getpid()}"
    cmd = [TROUPE, "launch", "-n", str(a.workers), "--", "/usr/bin/time", "-f",
           "maxrss_kib %M", TROUPE, "train", "--model", "gpt2", "--train_data", "null",
           "--block_size", str(a.seq), "--vocab_size", "256", "--n_layer", str(a.n_layer),
           "--n_head", str(a.n_head), "--n_embd", str(a.n_embd),
           "--batch_size", str(a.batch_size), "--epoch_size", str(a.epoch_size),
           "--num_epochs", "2", "--optimizer", "adamw", "--base_learning_rate", "0.0003",
           "--threads", "1", "--log_every", "0", "--schedule", "bsp-allreduce",
           "--zero_stage", str(zero), "--bucket_size_mb", str(a.bucket_mb), "--log_dir", work,
           "--checkpoint_every", "0",
           "--run_name", marker]
    sampled = {}
    done = threading.Event()

    def first_epoch_logged():
        for log in glob.glob(os.path.join(work, marker + "_*.log")):
            with open(log) as f:
                if sum(1 for line in f if line[:1].isdigit()) >= 1:
                    return True
        return False

    def sample():
        while not done.wait(0.02) and not first_epoch_logged():
            for pid in workers_of(marker):
                sampled[pid] = max(sampled.get(pid, 0.0), resident_mib(pid))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        tokens, output = troupe_run(cmd, work, marker)
    finally:
        done.set()
        sampler.join()
    peaks = [int(k) / 1024 for k in re.findall(r"maxrss_kib (\d+)", output)]
    if len(peaks) != a.workers or len(sampled) != a.workers:
        sys.exit(f"expected {a.workers} workers, sampled {len(sampled)}, GNU time gave "
                 f"{len(peaks)}:\n{output[-3000:]}")
    return tokens, sorted(sampled.values()), sorted(peaks)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_int_flags(p, workers=2, n_layer=4, n_head=8, n_embd=512, seq=64, batch_size=4,
                  epoch_size=256, bucket_mb=4)
    a = p.parse_args()
    if not os.path.exists(TROUPE):
        sys.exit(f"{TROUPE} is missing: bash scripts/build.sh troupe_cli")
    results = {}
    for zero in (0, 1, 2):
        with tempfile.TemporaryDirectory() as work:
            results[zero] = run(a, zero, work)
    print(f"GPT n_layer {a.n_layer} n_embd {a.n_embd}, AdamW, {a.workers} workers of batch "
          f"{a.batch_size} x {a.seq} tokens, 1 thread each, buckets of {a.bucket_mb} MiB")
    print(f"{'zero_stage':>10} {'tokens/s':>10} {'training MiB, per worker':>26} "
          f"{'whole run (GNU time)':>22}")
    for zero, (tokens, training, peaks) in results.items():
        print(f"{zero:>10} {tokens:>10.0f} {', '.join(f'{m:.0f}' for m in training):>26} "
              f"{', '.join(f'{m:.0f}' for m in peaks):>22}")
    t0, s0, p0 = results[0]
    for zero in (1, 2):
        t1, s1, p1 = results[zero]
        print(f"zero_stage {zero} / unsharded: tokens/s {t1 / t0:.2f}x; training memory of the "
              f"largest worker {max(s1) / max(s0):.2f}x ({max(s0) - max(s1):.0f} MiB less), of the "
              f"smallest {min(s1) / min(s0):.2f}x ({min(s0) - min(s1):.0f} MiB less); whole run's "
              f"peak of the largest {max(p1) / max(p0):.2f}x")


if __name__ == "__main__":
    main()
