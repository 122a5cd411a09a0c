#!/usr/bin/env python3
"""MXNet's distributed MLP (example/image-classification/train_mnist.py --network mlp --kv-store
dist_sync) on troupe.kv: a 784-128-64-10 ReLU network on Fashion-MNIST, its gradients in numpy,
its weights on the store's parameter servers.

    troupe launch -n 2 -s 1 -- python3 examples/python/kv_mlp.py --kv-store dist_sync
    python3 examples/python/kv_mlp.py --kv-store local              # one process

Each worker trains on its share of the training set (every num_workers-th image from its rank),
--batch-size images a step; it pushes the gradients of its batch (sums over the batch) and pulls
the weights the servers' SGD made of every worker's pushes (rescale_grad: 1 / the global batch).
Worker 0 prints the test accuracy after each epoch. The store, not this script, sums and updates:
with dist_sync every worker pulls the same weights after each step.
"""
import argparse
import gzip
import os
import time

import numpy as np

import troupe


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(folder, kind):
    images = read_idx(os.path.join(folder, f"{kind}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(folder, f"{kind}-labels-idx1-ubyte.gz"))
    return images.reshape(len(images), -1).astype(np.float32) / 255.0, labels.astype(np.int64)


def add_training_flags(ap):
    """The data and SGD flags of MXNet's train_mnist.py that this folder's MLPs take alike."""
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                    help="the IDX files of Fashion-MNIST (or MNIST), gzipped")
    ap.add_argument("--num-epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="a worker's batch")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--wd", type=float, default=1e-4)


def print_epoch(epoch, loss, accuracy, images, seconds, where):
    """Worker 0's line after each epoch (`epoch` from 0): the mean loss, the test accuracy, the
    images every worker trained in `seconds` a second, and `where` (how many workers, on what)."""
    print(f"epoch {epoch + 1}: train loss {loss:.4f}, test accuracy {accuracy:.4f}, "
          f"{images / seconds:.0f} images/s ({where})", flush=True)


SIZES = [784, 128, 64, 10]
NAMES = [f"fc{i + 1}_{part}" for i in range(len(SIZES) - 1) for part in ("weight", "bias")]


def initial_params(seed):
    """Xavier-uniform weights (MXNet's example's initializer), zero biases: worker 0's go to the
    store, which every worker then pulls."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        params += [rng.uniform(-limit, limit, (fan_out, fan_in)).astype(np.float32),
                   np.zeros(fan_out, dtype=np.float32)]
    return params


def forward(params, x):
    """The activations of each layer, the last the logits."""
    acts = [x]
    for i in range(0, len(params), 2):
        z = acts[-1] @ params[i].T + params[i + 1]
        acts.append(np.maximum(z, 0) if i + 2 < len(params) else z)
    return acts


def gradients(params, x, y):
    """The gradients of the batch's summed softmax cross-entropy loss (summed, as MXNet's
    SoftmaxOutput with rescale_grad on the optimizer), and the loss."""
    acts = forward(params, x)
    logits = acts[-1] - acts[-1].max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-12).sum()
    delta = p
    delta[np.arange(len(y)), y] -= 1
    grads = [None] * len(params)
    for i in range(len(params) - 2, -1, -2):
        grads[i] = delta.T @ acts[i // 2]
        grads[i + 1] = delta.sum(axis=0)
        if i > 0:
            delta = (delta @ params[i]) * (acts[i // 2] > 0)
    return grads, loss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv-store", default="local", help="local, dist_sync, dist_async, ring ...")
    add_training_flags(ap)
    a = ap.parse_args()

    kv = troupe.kv.create(a.kv_store)  # a parameter server serves here, then exits
    train_x, train_y = load(a.data_dir, "train")
    test_x, test_y = load(a.data_dir, "t10k")
    mine = np.arange(kv.rank, len(train_x), kv.num_workers)
    params = initial_params(seed=1)
    kv.init(NAMES, params)
    kv.set_optimizer(troupe.optimizer.create(
        "sgd", learning_rate=a.lr, momentum=a.momentum, wd=a.wd,
        rescale_grad=1.0 / (a.batch_size * kv.num_workers)))
    kv.pull(NAMES, out=params)
    rng = np.random.default_rng(kv.rank)
    # Every worker takes the same number of steps (dist_sync waits for each worker's push).
    steps = len(train_x) // kv.num_workers // a.batch_size
    for epoch in range(a.num_epochs):
        start, loss_sum = time.perf_counter(), 0.0
        order = rng.permutation(mine)
        for step in range(steps):
            batch = order[step * a.batch_size:(step + 1) * a.batch_size]
            grads, loss = gradients(params, train_x[batch], train_y[batch])
            loss_sum += loss
            kv.push(NAMES, grads)
            kv.pull(NAMES, out=params)
        seconds = time.perf_counter() - start
        if kv.rank == 0:
            accuracy = (forward(params, test_x)[-1].argmax(axis=1) == test_y).mean()
            print_epoch(epoch, loss_sum / (steps * a.batch_size), accuracy,
                        steps * a.batch_size * kv.num_workers, seconds,
                        f"{kv.num_workers} worker(s), {a.kv_store}")
    kv.close()


if __name__ == "__main__":
    main()
