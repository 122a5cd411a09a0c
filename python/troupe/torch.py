"""troupe for PyTorch models: an optimizer whose update runs on troupe's parameter servers, as
BytePS's and MXNet's distributed training did.

    import troupe, troupe.torch
    kv = troupe.kv.create("dist_async")           # or "dist_sync", "ssp"
    opt = troupe.torch.ParameterServerOptimizer(
        model.named_parameters(), kv,
        troupe.optimizer.create("sgd", learning_rate=0.1, momentum=0.9))
    for x, y in batches:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()                                # push the gradients, pull the new weights

Start it with `troupe launch -n WORKERS -s SERVERS -- python train.py`: every process runs the
script; in a server, troupe.kv.create serves until the workers are done and ends the process.
The servers hold the weights and the optimizer's state and apply each update: under dist_sync
once every worker pushed the step (the workers' gradients averaged, as DDP averages them), under
dist_async each push as it comes (1/W of a step each: staleness-aware asynchronous SGD), under ssp
as dist_async with workers at most `staleness` steps apart.
"""
import torch

from .kv import KVStore
from .optimizer import Optimizer


class ParameterServerOptimizer:
    """Trains a model's parameters on a distributed troupe KVStore's servers.

    named_parameters: model.named_parameters() (or a list of tensors, keyed by position): every
        worker passes the same parameters in the same order, as DDP requires. Those without
        requires_grad are left alone.
    kv: troupe.kv.create("dist_sync" | "dist_async" | "ssp").
    optimizer: troupe.optimizer.create(...): the update the servers apply. Its rescale_grad is
        divided by the number of workers, so that a dist_sync step applies the workers' mean
        gradient (a push of each worker's mean over its batch).

    Building it initialises the store's keys with worker 0's values and copies them into every
    worker's parameters (as DDP broadcasts rank 0's). step() pushes every gradient (zeros for a
    parameter the step left without one: a dist_sync server waits for every key of every
    worker), then pulls every parameter. The optimizer's state lives on the servers: it is not in
    state_dict(), and the learning rate changes by set_optimizer(), not by param_groups.
    """

    def __init__(self, named_parameters, kv, optimizer):
        if not isinstance(kv, KVStore):
            raise TypeError(f"kv: troupe.kv.create(...), not {type(kv).__name__}")
        if not isinstance(optimizer, Optimizer):
            raise TypeError("optimizer: troupe.optimizer.create(name, **params), not "
                            f"{getattr(optimizer, '__name__', type(optimizer).__name__)}")
        named = []
        for i, item in enumerate(named_parameters):
            name, p = item if isinstance(item, tuple) else (f"param{i}", item)
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameter {name!r}: a {type(p).__name__}, not a torch tensor")
            if p.requires_grad:
                named.append((name, p))
        if not named:
            raise ValueError("no parameter to train (none requires grad)")
        if kv.type not in ("dist_sync", "dist_async", "ssp"):
            raise ValueError(f"a ParameterServerOptimizer needs a store with parameter servers "
                             f"(dist_sync, dist_async, ssp), not {kv.type!r}")
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"parameters named twice: {twice}")
        self._kv = kv
        self._names = names
        self._params = [p for _, p in named]
        with torch.no_grad():
            kv.init(self._names, [p.detach() for p in self._params])
            self.set_optimizer(optimizer)
            kv.pull(self._names, out=[p.data for p in self._params])

    @property
    def kv(self):
        return self._kv

    def set_optimizer(self, optimizer):
        """The update the servers apply from now on (a new learning rate: the same optimizer
        created with it)."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError("optimizer: troupe.optimizer.create(name, **params), not "
                            f"{type(optimizer).__name__}")
        params = dict(optimizer.params)
        params["rescale_grad"] = params.get("rescale_grad", 1.0) / self._kv.num_workers
        self._kv.set_optimizer(Optimizer(optimizer.name, **params))

    def zero_grad(self, set_to_none=True):
        """As torch.optim.Optimizer.zero_grad."""
        for p in self._params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        """Pushes the gradients and pulls the weights the servers updated; closure (as
        torch.optim's) is called first, with grad enabled, and its loss returned."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        for name, p, g in zip(self._names, self._params, grads):
            if g.is_sparse:
                raise TypeError(f"parameter {name!r}: a sparse gradient; troupe's stores hold "
                                "dense values (nn.Embedding(sparse=False))")
        self._kv.push(self._names, grads)
        self._kv.pull(self._names, out=[p.data for p in self._params])
        return loss
