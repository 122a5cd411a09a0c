#!/usr/bin/env python3
"""PyTorch peer of troupe_kernels_bench: the same models, batch and optimizer, one training step
(forward + backward + SGD with momentum) timed on the CPU. Prints one line per model:
    <model> batch=<b> threads=<t> samples/s=<x>
Run with Debian's python3-torch:  /usr/bin/python3 bench/kernels_vs_pytorch.py [--threads 2]"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def lenet():
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5),
                         nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(),
                         nn.Linear(500, 10))


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.short is None else self.short(x)))


def resnet20(cin=1):
    layers = [nn.Conv2d(cin, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    c = 16
    for i, w in enumerate([16, 32, 64]):
        for j in range(3):
            layers.append(Block(c, w, 2 if (i > 0 and j == 0) else 1))
            c = w
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--models", default="lenet,mlp,resnet20")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    builders = {"mlp": mlp, "lenet": lenet, "resnet20": resnet20}
    for name in args.models.split(","):
        model = builders[name]()
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        # Several random batches in turn, as troupe_kernels_bench does.
        xs = [torch.rand(args.batch, 1, 28, 28) * 2 - 1 for _ in range(8)]
        ys = [torch.randint(0, 10, (args.batch,)) for _ in range(8)]
        count = [0]

        def step():
            x, y = xs[count[0] % 8], ys[count[0] % 8]
            count[0] += 1
            opt.zero_grad(set_to_none=False)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()

        for _ in range(5):
            step()
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < args.seconds:
            step()
            steps += 1
        dt = time.perf_counter() - t0
        print(f"{name:9s} batch={args.batch} threads={args.threads} "
              f"samples/s={steps * args.batch / dt:.0f}", flush=True)


if __name__ == "__main__":
    main()
