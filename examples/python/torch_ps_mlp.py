#!/usr/bin/env python3
"""A PyTorch model on troupe's parameter servers (as BytePS ran them): a 784-128-64-10 ReLU
network (torch.nn) on Fashion-MNIST, its gradients from autograd, its weights and SGD on the
servers through troupe.torch.ParameterServerOptimizer.

    troupe launch -n 2 -s 1 -- python3 examples/python/torch_ps_mlp.py --kv-store dist_sync
    troupe launch -n 2 -s 1 -- python3 examples/python/torch_ps_mlp.py --kv-store dist_async

Each worker trains on its share of the training set (every num_workers-th image from its rank),
--batch-size images a step, the mean loss of its batch; the servers average the workers'
gradients (dist_sync) or apply each worker's as it comes (dist_async). Worker 0 prints the test
accuracy after each epoch: after one, 0.82 under dist_sync and 0.75 under dist_async (its
gradients a step stale, with momentum 0.9 on the servers), measured on 2 cores.
"""
import argparse
import time

import torch

import troupe
import troupe.torch
from kv_mlp import add_training_flags, load, print_epoch  # the numpy MLP beside this file


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv-store", default="dist_sync", help="dist_sync, dist_async or ssp")
    add_training_flags(ap)
    a = ap.parse_args()

    kv = troupe.kv.create(a.kv_store)  # a parameter server serves here, then exits
    torch.set_num_threads(1)  # the workers and servers share the machine's cores
    torch.manual_seed(1)  # worker 0's initial weights go to the servers, then to every worker
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    opt = troupe.torch.ParameterServerOptimizer(
        model.named_parameters(), kv,
        troupe.optimizer.create("sgd", learning_rate=a.lr, momentum=a.momentum, wd=a.wd))
    train_x, train_y = (torch.from_numpy(t) for t in load(a.data_dir, "train"))
    test_x, test_y = (torch.from_numpy(t) for t in load(a.data_dir, "t10k"))
    mine = torch.arange(kv.rank, len(train_x), kv.num_workers)
    generator = torch.Generator().manual_seed(kv.rank)
    # Every worker takes the same number of steps (dist_sync waits for each worker's push).
    steps = len(train_x) // kv.num_workers // a.batch_size
    for epoch in range(a.num_epochs):
        start, loss_sum = time.perf_counter(), 0.0
        order = mine[torch.randperm(len(mine), generator=generator)]
        for step in range(steps):
            batch = order[step * a.batch_size:(step + 1) * a.batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(train_x[batch]), train_y[batch])
            loss.backward()
            opt.step()
            loss_sum += loss.item()
        seconds = time.perf_counter() - start
        if kv.rank == 0:
            with torch.no_grad():
                accuracy = (model(test_x).argmax(dim=1) == test_y).float().mean().item()
            print_epoch(epoch, loss_sum / steps, accuracy, steps * a.batch_size * kv.num_workers,
                        seconds, f"{kv.num_workers} worker(s), {a.kv_store}")
    kv.close()


if __name__ == "__main__":
    main()
