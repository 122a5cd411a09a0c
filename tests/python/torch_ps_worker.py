"""A PyTorch training loop on troupe's parameter servers, for tests/python/test_torch_ps.py: run by
`troupe launch -n 2 -s 1 -- python torch_ps_worker.py TYPE OUT`. A linear model (8 inputs, 3
outputs, seed 0) fits a fixed linear map under MSE; worker r trains on rows [8r, 8r + 8) of each
step's global batch of 16 (torch_ps_program.py), SGD with momentum on the servers, 20 steps.
Each worker saves its final parameters to OUT.rank.pt."""
import sys

import torch

import troupe
import troupe.torch
from torch_ps_program import LR, MOMENTUM, STEPS, batch, model

kv = troupe.kv.create(sys.argv[1])  # a server serves here and exits
net = model()
opt = troupe.torch.ParameterServerOptimizer(
    net.named_parameters(), kv,
    troupe.optimizer.create("sgd", learning_rate=LR, momentum=MOMENTUM))
for step in range(STEPS):
    x, y = batch(step)
    rows = slice(8 * kv.rank, 8 * kv.rank + 8)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(net(x[rows]), y[rows])
    loss.backward()
    opt.step()
    print(f"worker {kv.rank} step {step}: loss {loss.item():.6f}", flush=True)
torch.save({n: p.detach().clone() for n, p in net.named_parameters()},
           f"{sys.argv[2]}.{kv.rank}.pt")
kv.close()
