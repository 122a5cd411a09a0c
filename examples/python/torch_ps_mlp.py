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

import torch

import troupe
import troupe.torch
from ddp_mlp import mlp, train  # the DDP example beside this file: its model and loop
from kv_mlp import add_training_flags


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv-store", default="dist_sync", help="dist_sync, dist_async or ssp")
    add_training_flags(ap)
    a = ap.parse_args()

    kv = troupe.kv.create(a.kv_store)  # a parameter server serves here, then exits
    torch.set_num_threads(1)  # the workers and servers share the machine's cores
    torch.manual_seed(1)  # worker 0's initial weights go to the servers, then to every worker
    model = mlp()
    opt = troupe.torch.ParameterServerOptimizer(
        model.named_parameters(), kv,
        troupe.optimizer.create("sgd", learning_rate=a.lr, momentum=a.momentum, wd=a.wd))
    # Every worker takes the same number of steps (dist_sync waits for each worker's push).
    train(model, opt, a, kv.rank, kv.num_workers, f"{kv.num_workers} worker(s), {a.kv_store}")
    kv.close()


if __name__ == "__main__":
    main()
