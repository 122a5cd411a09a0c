#!/usr/bin/env python3
"""Parameter-server training throughput, troupe vs MXNet 1.9.1's own kvstore, side by side.

Both: 2 workers x 1 thread and 1 server on this host, the MLP 784-256-128-10, batch 64 per worker
(MXNet's dist_sync convention), SGD with momentum 0.9, Fashion-MNIST. troupe: `troupe launch -n 2
-s 1 -- troupe train --schedule dist_sync|dist_async ...`, samples/s from rank 0's CSV log. MXNet:
its ps-lite scheduler, server and workers (DMLC_ROLE ...), gluon Trainer with kvstore dist_sync /
dist_async, images in memory. MXNet comes from PyPI into .venv-mxnet (scripts/setup.sh --bench):

    bash scripts/setup.sh --bench && bash scripts/build.sh troupe_cli
    /usr/bin/python3 bench/ps_vs_mxnet.py [--steps 300] [--repeats 3] [--baseline OLD_BINARY]
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_vs_pytorch import troupe_rate  # noqa: E402  (imports torch: run with /usr/bin/python3)

from train_bench import ROOT, RateTable, add_troupe_and_data_flags, ensure_data  # noqa: E402

WORKER = r'''
import gzip, os, sys, time
import numpy as np
import mxnet as mx
from mxnet import autograd, gluon, nd
kvstore, batch, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
kv = mx.kv.create(kvstore)
d = "/usr/share/datasets/fashion-mnist"
with gzip.open(f"{d}/train-images-idx3-ubyte.gz") as f:
    x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255
with gzip.open(f"{d}/train-labels-idx1-ubyte.gz") as f:
    y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.float32)
mx.random.seed(1)
net = gluon.nn.HybridSequential()
net.add(gluon.nn.Dense(256, activation="relu"), gluon.nn.Dense(128, activation="relu"),
        gluon.nn.Dense(10))
net.initialize(mx.init.Xavier())
net.hybridize()
trainer = gluon.Trainer(net.collect_params(), "sgd",
                        {"learning_rate": 0.01, "momentum": 0.9, "wd": 0.0005}, kvstore=kv)
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
rank, n = kv.rank, kv.num_workers
perm = np.random.RandomState(rank).permutation(x.shape[0])
def step(i):
    idx = perm[(i * batch) % (x.shape[0] - batch):][:batch]
    data, label = nd.array(x[idx]), nd.array(y[idx])
    with autograd.record():
        loss = loss_fn(net(data), label)
    loss.backward()
    trainer.step(batch)
    loss.wait_to_read()
for i in range(warmup):
    step(i)
kv.barrier() if hasattr(kv, "barrier") else None
start = time.perf_counter()
for i in range(steps):
    step(warmup + i)
nd.waitall()
elapsed = time.perf_counter() - start
print(f"SAMPLES_PER_SEC {batch * steps / elapsed}", flush=True)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mxnet_samples_per_sec(python, kvstore, workers, batch, steps):
    port = free_port()
    env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
               DMLC_NUM_SERVER="1", DMLC_NUM_WORKER=str(workers), OMP_NUM_THREADS="1",
               MXNET_CPU_WORKER_NTHREADS="1", PS_VERBOSE="0")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKER)
        script = f.name
    procs = [subprocess.Popen([python, "-c", "import mxnet"], env=dict(env, DMLC_ROLE=role),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for role in ("scheduler", "server")]
    workers_p = [subprocess.Popen([python, script, kvstore, str(batch), str(steps), "20"],
                                  env=dict(env, DMLC_ROLE="worker"), stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
                 for _ in range(workers)]
    rates = []
    for w in workers_p:
        out, _ = w.communicate(timeout=900)
        rates += [float(l.split()[1]) for l in out.splitlines() if l.startswith("SAMPLES_PER_SEC")]
    for p in procs:
        p.wait(timeout=60)
    os.unlink(script)
    if len(rates) != workers:
        raise RuntimeError(f"MXNet {kvstore}: {len(rates)} of {workers} workers reported")
    return sum(rates)


def troupe_samples_per_sec(troupe, data, schedule, workers, batch, steps):  # SGD, momentum 0.9
    return troupe_rate([troupe, "launch", "-n", str(workers), "-s", "1", "--", "troupe", "train",
                        "--model", "mlp", "--schedule", schedule, "--batch_size", str(batch),
                        "--threads", "1"], data, batch * workers, steps)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_troupe_and_data_flags(p)
    p.add_argument("--mxnet-python", default=os.path.join(ROOT, ".venv-mxnet/bin/python"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per worker")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--baseline", help="another troupe build, measured beside (before/after)")
    p.add_argument("--repeats", type=int, default=1,
                   help="best of this many runs, each side, taken in turns (3 processes on a "
                        "2-core host vary by about 10%% from one run to the next)")
    args = p.parse_args()
    ensure_data(args.troupe, args.data)
    print(f"MLP, {args.workers} workers x 1 thread + 1 server, batch {args.batch} per worker, "
          f"{args.steps} steps, best of {args.repeats}")
    table = RateTable("schedule", 11, "mxnet samples/s", args.baseline)
    for schedule in ("dist_sync", "dist_async"):
        ours, theirs, before = 0.0, 0.0, None
        for _ in range(args.repeats):
            ours = max(ours, troupe_samples_per_sec(args.troupe, args.data, schedule,
                                                    args.workers, args.batch, args.steps))
            theirs = max(theirs, mxnet_samples_per_sec(args.mxnet_python, schedule, args.workers,
                                                       args.batch, args.steps))
            if args.baseline:
                before = max(before or 0.0,
                             troupe_samples_per_sec(args.baseline, args.data, schedule,
                                                    args.workers, args.batch, args.steps))
        table.row(schedule, ours, theirs, before)


if __name__ == "__main__":
    sys.exit(main())
