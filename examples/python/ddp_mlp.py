#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel on troupe's torch.distributed backend: a 784-128-64-10 ReLU
network (torch.nn) on Fashion-MNIST, written as for any backend; `import troupe.torch` makes
"troupe" one.

    troupe launch -n 2 -- python3 examples/python/ddp_mlp.py              # backend troupe
    troupe launch -n 2 -- python3 examples/python/ddp_mlp.py --backend gloo

troupe launch sets torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), so the
script reads them as under torchrun. Each rank trains on its share of the training set (every
world_size-th image from its rank), --batch-size images a step; DDP averages the gradients. Rank
0 prints the test accuracy after each epoch: 0.815 after one on 2 ranks, with either backend
(the same bits: a sum of 2 is the same in any order).
"""
import argparse
import time

import torch
import torch.distributed as dist

import troupe.torch  # noqa: F401  (registers the "troupe" backend)
from kv_mlp import add_training_flags, load, print_epoch  # the numpy MLP beside this file


def mlp():
    """The 784-128-64-10 ReLU network of MXNet's MLP example, in torch.nn."""
    return torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def train(model, opt, a, rank, world, label):
    """a.num_epochs epochs of rank's share of Fashion-MNIST (every world-th image from rank),
    a.batch_size images a step, the same number of steps on every rank; rank 0 prints the test
    accuracy after each epoch."""
    train_x, train_y = (torch.from_numpy(t) for t in load(a.data_dir, "train"))
    test_x, test_y = (torch.from_numpy(t) for t in load(a.data_dir, "t10k"))
    mine = torch.arange(rank, len(train_x), world)
    generator = torch.Generator().manual_seed(rank)
    steps = len(train_x) // world // a.batch_size
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
        if rank == 0:
            with torch.no_grad():
                accuracy = (model(test_x).argmax(dim=1) == test_y).float().mean().item()
            print_epoch(epoch, loss_sum / steps, accuracy, steps * a.batch_size * world, seconds,
                        label)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="troupe", help="troupe, or gloo to compare")
    add_training_flags(ap)
    a = ap.parse_args()

    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # the ranks share the machine's cores
    torch.manual_seed(1)
    model = torch.nn.parallel.DistributedDataParallel(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.wd)
    train(model, opt, a, rank, world, f"{world} rank(s), {a.backend}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
