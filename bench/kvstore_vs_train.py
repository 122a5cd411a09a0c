#!/usr/bin/env python3
"""The KVStore API against troupe's own trainer: MXNet's dist_sync loop written by hand in C++
(examples/kvstore_softmax, on troupe::KVStore) vs `troupe train --schedule dist_sync`, the same
model (softmax regression, 784 -> 10: configs/softmax.toml) on the same data (Fashion-MNIST),
both as 2 workers and 1 parameter server started by `troupe launch -n 2 -s 1` on this machine.
With --kvstore ring: the loop on the ring store vs `troupe train --schedule bsp-allreduce`, both
as 2 workers and no server (`troupe launch -n 2`).

Both: batch 64 per worker (global 128), SGD lr 0.02 fixed, momentum 0.9, no weight decay, the
mean gradient of the global batch, 468 steps (59904 images) an epoch, one thread a process.
  KVStore loop: built against a fresh `cmake --install` of build/ (as a user's program would be),
                images from the IDX files of Debian's dataset-fashion-mnist; worker 0 prints each
                epoch's test accuracy and inputs/s.
  troupe train: the LMDB copy of the same files (made by `troupe convert` into
                out/fashion-mnist-lmdb if missing); the chief's "epoch N done" lines.
inputs/s = the images of epochs 2..E over their time (the first epoch is the warm-up; test
evaluation is not timed); accuracy = on the 10000 test images after epoch E. A cell is the median
over --rounds rounds, [min-max]; rounds alternate the two programs.

    flock /tmp/troupe-build.lock ninja -C build -j2          # build/bin/troupe and libtroupe
    python3 bench/kvstore_vs_train.py [--epochs 6] [--rounds 5] [--kvstore dist_sync|ring]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

from train_bench import ROOT, add_troupe_and_data_flags, ensure_data


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-4000:]}")
    return p.stdout


def summarize(epochs):
    """epochs: [(images, inputs/s, test accuracy)] by epoch -> (inputs/s of 2.., last accuracy)."""
    timed = epochs[1:]
    seconds = sum(n / rate for n, rate, _ in timed)
    return sum(n for n, _, _ in timed) / seconds, epochs[-1][2]


# Per store type: the launcher's servers and the trainer's schedule that it is compared with.
PEERS = {"dist_sync": (["-s", "1"], "dist_sync"), "ring": ([], "bsp-allreduce")}


def kvstore_round(troupe, example, kvstore, epochs, cwd):
    out = run([troupe, "launch", "-n", "2"] + PEERS[kvstore][0] + ["--", example, "--kvstore",
              kvstore, "--epochs", str(epochs)], cwd)
    rows = re.findall(r"\[worker 0\] epoch \d+: train loss [0-9.]+, test accuracy ([0-9.]+), "
                      r"inputs/s ([0-9.]+)", out)
    if len(rows) != epochs:
        sys.exit(f"the KVStore loop printed {len(rows)} of {epochs} epochs:\n{out[-4000:]}")
    return summarize([(59904, float(rate), float(acc)) for acc, rate in rows])


def train_round(troupe, data, kvstore, epochs, cwd):
    servers, schedule = PEERS[kvstore]
    out = run([troupe, "launch", "-n", "2"] + servers + ["--", troupe, "train",
               os.path.join(ROOT, "configs/softmax.toml"), "--schedule", schedule,
               "--train_data", os.path.join(data, "train"), "--test_data",
               os.path.join(data, "test"), "--num_epochs", str(epochs), "--threads", "1",
               "--log_every", "0"], cwd)
    rows = re.findall(r"epoch \d+ done: .*test_accuracy ([0-9.]+) \((\d+) inputs in [0-9.]+ s, "
                      r"([0-9.]+) inputs/s\)", out)
    if len(rows) != epochs:
        sys.exit(f"troupe train logged {len(rows)} of {epochs} epochs:\n{out[-4000:]}")
    return summarize([(int(n), float(rate), float(acc)) for acc, n, rate in rows])


def cell(values, fmt):
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-" \
           f"{fmt.format(max(values))}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kvstore", choices=sorted(PEERS), default="dist_sync")
    add_troupe_and_data_flags(ap)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    if a.epochs < 2 or a.rounds < 1:
        sys.exit("--epochs must be at least 2 (the first is the warm-up), --rounds at least 1")
    if not os.path.exists(a.troupe):
        sys.exit(f"{a.troupe} is missing: build it first (see the top of this file)")
    ensure_data(a.troupe, a.data)
    with tempfile.TemporaryDirectory(prefix="kvstore_vs_train.") as tmp:
        prefix, examples = os.path.join(tmp, "prefix"), os.path.join(tmp, "examples")
        run(["cmake", "--install", a.build, "--prefix", prefix], tmp)
        run(["cmake", "-S", os.path.join(ROOT, "examples"), "-B", examples,
             f"-DCMAKE_PREFIX_PATH={prefix}"], tmp)
        run(["cmake", "--build", examples, "-j2"], tmp)
        troupe = os.path.join(prefix, "bin/troupe")
        kv, tr = [], []
        for r in range(a.rounds):
            kv.append(kvstore_round(troupe, os.path.join(examples, "kvstore_softmax"), a.kvstore,
                                    a.epochs, tmp))
            tr.append(train_round(troupe, a.data, a.kvstore, a.epochs, tmp))
            print(f"round {r + 1}: KVStore loop {kv[-1][0]:.0f} inputs/s, accuracy "
                  f"{kv[-1][1]:.4f}; troupe train {tr[-1][0]:.0f} inputs/s, accuracy "
                  f"{tr[-1][1]:.4f}", flush=True)
    ratios = [k[0] / t[0] for k, t in zip(kv, tr)]
    servers, schedule = PEERS[a.kvstore]
    print(f"\n2 workers{' + 1 server' if servers else ''}, kvstore {a.kvstore} vs --schedule "
          f"{schedule}, softmax regression, {a.epochs} epochs, {a.rounds} rounds "
          f"(median [min-max])\n")
    print("| program | inputs/s (epochs 2..) | test accuracy after the last epoch |")
    print("|---|---|---|")
    print(f"| KVStore loop (examples/kvstore_softmax --kvstore {a.kvstore}) | "
          f"{cell([k[0] for k in kv], '{:.0f}')} | "
          f"{cell([k[1] for k in kv], '{:.4f}')} |")
    print(f"| troupe train --schedule {schedule} | {cell([t[0] for t in tr], '{:.0f}')} | "
          f"{cell([t[1] for t in tr], '{:.4f}')} |")
    print(f"\nKVStore loop / troupe train, inputs/s, per round: {cell(ratios, '{:.2f}')}")
    print(f"accuracy difference (KVStore - train), median: "
          f"{statistics.median(k[1] for k in kv) - statistics.median(t[1] for t in tr):+.4f}")


if __name__ == "__main__":
    main()
