#!/usr/bin/env python3
"""Training throughput, troupe vs PyTorch, side by side in one run, on Fashion-MNIST.

troupe: `troupe train` end to end (LMDB reader actor -> replica -> reducer -> updater), samples/s
read from its CSV log (inputs_per_sec of the second epoch; the first is the warm-up, in which
oneDNN compiles its kernels). PyTorch: the same model, batch, optimizer (SGD, momentum 0.9,
weight decay 5e-4) and thread count, images already in memory as a tensor (so PyTorch pays no
data loading at all), timed after 20 warm-up steps. Both time a fixed number of steps.
--optimizer adam or adamw trains both with that optimizer instead (betas 0.9, 0.999). --baseline
OLD_BINARY measures another troupe build in the same turns: before/after figures of one run.

    bash scripts/setup.sh --bench && bash scripts/build.sh troupe_cli
    /usr/bin/python3 bench/train_vs_pytorch.py [--models lenet,mlp] [--steps 400] [--threads 2]
        [--optimizer sgd|adam|adamw] [--baseline OLD_BINARY]
"""
import argparse
import csv
import gzip
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernels_vs_pytorch import lenet, mlp, resnet20  # noqa: E402  (same definitions)

from train_bench import RateTable, add_troupe_and_data_flags, ensure_data  # noqa: E402
FASHION = "/usr/share/datasets/fashion-mnist"


def load_idx(images, labels):
    with gzip.open(os.path.join(FASHION, images)) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(FASHION, labels)) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


# The optimizers both sides train with: torch's, and troupe's flags for the same.
OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9, weight_decay=5e-4),
            ["--optimizer", "sgd", "--base_learning_rate", "0.01", "--momentum", "0.9",
             "--weight_decay", "0.0005"]),
    "adam": (lambda p: torch.optim.Adam(p, lr=0.001, weight_decay=5e-4),
             ["--optimizer", "adam", "--base_learning_rate", "0.001", "--weight_decay", "0.0005"]),
    "adamw": (lambda p: torch.optim.AdamW(p, lr=0.001, weight_decay=0.01),
              ["--optimizer", "adamw", "--base_learning_rate", "0.001", "--weight_decay", "0.01"]),
}


def pytorch_samples_per_sec(name, batch, steps, threads, warmup=20, optimizer="sgd"):
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    x, y = load_idx("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
    model = {"lenet": lenet, "mlp": mlp, "resnet20": resnet20}[name]()
    opt = OPTIMIZERS[optimizer][0](model.parameters())
    perm = torch.randperm(x.shape[0])
    model.train()

    def step(i):
        idx = perm[(i * batch) % (x.shape[0] - batch):][:batch]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()

    for i in range(warmup):
        step(i)
    start = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    return batch * steps / (time.perf_counter() - start)


def troupe_rate(command, data, batch, steps, optimizer="sgd"):
    """Runs `command` (a troupe train or launch ... train command line) for two epochs of `steps`
    global batches of `batch` from the LMDB Fashion-MNIST in `data` with the benchmarks' shared
    optimizer settings (OPTIMIZERS; a build from before --optimizer gets SGD's without the flag);
    returns the second epoch's inputs_per_sec from the chief's CSV log (the first epoch is the
    warm-up, as the peers' warm-up steps are)."""
    flags = OPTIMIZERS[optimizer][1]
    if optimizer == "sgd" and not knows_optimizer_flag(command[0]):
        flags = flags[2:]
    with tempfile.TemporaryDirectory() as logs:
        cmd = command + ["--train_data", f"{data}/train", "--db_type", "lmdb", "--epoch_size",
                         str(batch * steps), "--num_epochs", "2", *flags, "--log_every", "0",
                         "--log_dir", logs, "--checkpoint_dir", logs]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=logs)
        log = next(f for f in os.listdir(logs) if f.endswith(".log"))
        with open(os.path.join(logs, log)) as f:
            rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
        return float(rows[-1]["inputs_per_sec"])


def knows_optimizer_flag(troupe):
    """Whether this troupe build has --optimizer (builds before issue 35 train SGD only)."""
    help_text = subprocess.run([troupe, "train", "--help"], capture_output=True, text=True).stdout
    return "--optimizer" in help_text


def troupe_samples_per_sec(troupe, data, name, batch, steps, threads, optimizer="sgd"):
    return troupe_rate([troupe, "train", "--model", name, "--batch_size", str(batch), "--threads",
                        str(threads)], data, batch, steps, optimizer)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_troupe_and_data_flags(p)
    p.add_argument("--models", default="lenet,mlp")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3,
                   help="best of this many runs, each side, taken in turns")
    p.add_argument("--optimizer", default="sgd", choices=sorted(OPTIMIZERS))
    p.add_argument("--baseline", help="another troupe build, measured in the same turns")
    args = p.parse_args()

    ensure_data(args.troupe, args.data)

    print(f"batch {args.batch}, {args.threads} threads, {args.steps} steps, best of {args.repeats}, "
          f"optimizer {args.optimizer}; torch {torch.__version__}")
    table = RateTable("model", 10, "pytorch samples/s", args.baseline)
    for name in args.models.split(","):
        # Turn about, so that all see the same spells of a busy or quiet machine.
        ours, theirs, before = 0.0, 0.0, 0.0
        for _ in range(args.repeats):
            ours = max(ours, troupe_samples_per_sec(args.troupe, args.data, name, args.batch,
                                                    args.steps, args.threads, args.optimizer))
            theirs = max(theirs, pytorch_samples_per_sec(name, args.batch, args.steps,
                                                         args.threads, optimizer=args.optimizer))
            if args.baseline:
                before = max(before, troupe_samples_per_sec(args.baseline, args.data, name,
                                                            args.batch, args.steps, args.threads,
                                                            args.optimizer))
        table.row(name, ours, theirs, before)


if __name__ == "__main__":
    main()
