#!/usr/bin/env python3
"""torchvision's ResNet-18 under PyTorch's DistributedDataParallel on troupe's torch.distributed
backend, on Fashion-MNIST, written as for any backend; `import troupe.torch` makes "troupe" one.

    troupe launch -n 2 -- python3 examples/python/ddp_resnet18.py              # backend troupe
    troupe launch -n 2 -- python3 examples/python/ddp_resnet18.py --backend gloo
    troupe launch -n 2 -- python3 examples/python/ddp_resnet18.py --hook 2bit  # troupe.hooks

The model is torchvision.models.resnet18(num_classes=10) as it is: each 28x28 grey image goes in
as three equal channels, and its adaptive pooling takes the small maps. DDP sums the gradient
buckets over the backend while the backward pass goes on and broadcasts the batch norms' running
statistics from rank 0 before each forward, so the backend's allreduce and broadcast both run
every step. Each rank trains on every world_size-th training image from its rank, --batch-size a
step. Rank 0 prints each epoch's line (the mean loss, the accuracy on the first --test-images test
images) and at the end a digest of every parameter and buffer's bytes: two ranks end with the same
digest on troupe's backend and on gloo (a sum of two is the same in either order, and broadcasts
copy), which tests/python/test_example_resnet18.py checks. One epoch on 2 ranks of one thread
each (2 cores, Debian's torch 1.13): train loss 0.5375, test accuracy 0.860, 295 images/s.
"""
import argparse
import hashlib
import time

import torch
import torch.distributed as dist
import torchvision

import troupe.torch  # noqa: F401  (registers the "troupe" backend)
from ddp_gpt import register_hook  # the GPT example's --hook, beside this file
from kv_mlp import add_training_flags, load, print_epoch  # the numpy MLP beside this file


def images_of(flat):
    """Flat 784-value rows as the [N, 3, 28, 28] batch torchvision's ResNet takes."""
    return flat.view(-1, 1, 28, 28).expand(-1, 3, -1, -1)


def digest(model):
    """SHA-256 of every parameter's and buffer's bytes, in the model's order."""
    h = hashlib.sha256()
    for t in list(model.parameters()) + list(model.buffers()):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="troupe", help="troupe, or gloo to compare")
    ap.add_argument("--hook", default="none", choices=["2bit", "fp16", "bf16", "powersgd", "none"],
                    help="DDP's communication hook, as examples/python/ddp_gpt.py's (none: DDP's "
                    "own allreduce of float32)")
    ap.add_argument("--threshold", type=float, default=0.05, help="2bit's threshold")
    ap.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD's matrix rank")
    add_training_flags(ap)
    ap.add_argument("--steps", type=int, default=0,
                    help="steps an epoch (0: the whole training set's)")
    ap.add_argument("--test-images", type=int, default=10000)
    ap.set_defaults(num_epochs=1, lr=0.05)
    a = ap.parse_args()

    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # the ranks share the machine's cores
    torch.manual_seed(1)
    model = torch.nn.parallel.DistributedDataParallel(torchvision.models.resnet18(num_classes=10))
    register_hook(model, a)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.wd)
    train_x, train_y = (torch.from_numpy(t) for t in load(a.data_dir, "train"))
    test_x, test_y = (torch.from_numpy(t)[:a.test_images] for t in load(a.data_dir, "t10k"))
    mine = torch.arange(rank, len(train_x), world)
    generator = torch.Generator().manual_seed(rank)
    steps = a.steps or len(train_x) // world // a.batch_size  # the same on every rank
    for epoch in range(a.num_epochs):
        model.train()
        start, loss_sum = time.perf_counter(), 0.0
        order = mine[torch.randperm(len(mine), generator=generator)]
        for step in range(steps):
            batch = order[step * a.batch_size:(step + 1) * a.batch_size]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(images_of(train_x[batch])),
                                                     train_y[batch])
            loss.backward()
            opt.step()
            loss_sum += loss.item()
        seconds = time.perf_counter() - start
        if rank == 0:
            model.eval()
            with torch.no_grad():
                predicted = torch.cat([model.module(images_of(x)).argmax(dim=1)
                                       for x in test_x.split(500)])
            accuracy = (predicted == test_y).float().mean().item()
            print_epoch(epoch, loss_sum / steps, accuracy, steps * a.batch_size * world, seconds,
                        f"{world} rank(s), {a.backend}" +
                        (f", hook {a.hook}" if a.hook != "none" else ""))
    if rank == 0:
        print(f"digest {digest(model.module)} ({a.backend})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
