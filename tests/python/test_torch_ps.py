"""troupe.torch.ParameterServerOptimizer: a PyTorch loop whose SGD runs on troupe's parameter
servers (tests/python/torch_ps_worker.py, 2 workers and 1 server started by `troupe launch`),
against torch.optim.SGD on the global batch in one process."""
import math
import os
import subprocess
import sys

import pytest
import torch

import troupe
import troupe.torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_ps_program import LR, MOMENTUM, STEPS, batch, model  # noqa: E402

U = 2.0 ** -24  # float32's unit roundoff


def launch(store, out):
    cmd = [os.environ.get("TROUPE", "troupe"), "launch", "-n", "2", "-s", "1", "--",
           sys.executable, os.path.join(HERE, "torch_ps_worker.py"), store, out]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout
    return [torch.load(f"{out}.{rank}.pt") for rank in (0, 1)]


def reference():
    """torch.optim.SGD on each step's whole global batch of 16."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    return {n: p.detach() for n, p in net.named_parameters()}


def loss_of(params):
    x, y = batch(STEPS)  # a batch neither side trained on
    return torch.nn.functional.mse_loss(x @ params["weight"].T + params["bias"], y).item()


def test_dist_sync_trains_as_sgd_on_the_global_batch(tmp_path):
    workers = launch("dist_sync", str(tmp_path / "params"))
    for name in workers[0]:  # both pulled the servers' values
        assert torch.equal(workers[0][name], workers[1][name]), name
    ref = reference()
    # The two differ in the order of their sums only: a gradient element sums 16 rows here (8 a
    # worker, their two sums added on the server and halved), within probableGammaN(16) =
    # 7 sqrt(16) u of its exact value (tests/float_bounds.h); the momentum buffer carries each
    # step's error with weight 0.9^k, 1 / (1 - 0.9) of it in all; and each step rounds the
    # server's momentum and weight updates, a few u of |w| a step, STEPS of them.
    bound = 7 * math.sqrt(16) * U / (1 - MOMENTUM) + STEPS * 4 * U
    for name, r in ref.items():
        diff = (workers[0][name] - r).abs().max().item() / r.abs().max().item()
        print(f"[ measured ] {name}: relative difference {diff:.3g} (bound {bound:.3g})")
        assert diff <= bound, name
    # And the bound can tell: a step less moves the weights past it.
    assert loss_of(ref) < 0.5 * loss_of({n: p.detach() for n, p in model().named_parameters()})


def test_dist_async_trains_from_pushes_applied_as_they_come(tmp_path):
    workers = launch("dist_async", str(tmp_path / "params"))
    start = loss_of({n: p.detach() for n, p in model().named_parameters()})
    # Each push is half a step (rescale_grad 1/2), at most a step or two stale: 40 pushes train
    # about as 20 synchronous steps do, whose loss ends below half the start's (the test above).
    for params in workers:
        assert loss_of(params) < 0.5 * start, (loss_of(params), start)


def test_a_store_without_servers_or_a_model_without_parameters_is_refused():
    kv = troupe.kv.create("local")
    net = torch.nn.Linear(2, 1)
    sgd = troupe.optimizer.create("sgd", learning_rate=0.1)
    with pytest.raises(ValueError, match="needs a store with parameter servers"):
        troupe.torch.ParameterServerOptimizer(net.named_parameters(), kv, sgd)
    with pytest.raises(TypeError, match=r"troupe.optimizer.create\(name, \*\*params\), not SGD"):
        troupe.torch.ParameterServerOptimizer(net.named_parameters(), kv, torch.optim.SGD)
    net.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter to train"):
        troupe.torch.ParameterServerOptimizer(net.named_parameters(), kv, sgd)
    kv.close()
