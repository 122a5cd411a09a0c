"""The update rules a troupe KVStore applies to pushes, created as MXNet's mx.optimizer.create.

    opt = troupe.optimizer.create("sgd", learning_rate=0.1, momentum=0.9, wd=1e-4,
                                  rescale_grad=1.0 / batch_size)
    kv.set_optimizer(opt)

Names: sgd (with momentum; nesterov=True, or MXNet's "nag"), adam, adamw, lamb, lars, rmsprop,
adagrad: troupe's optimizers, with PyTorch's semantics (include/troupe/kvstore.h). Parameters by
MXNet's names (learning_rate, momentum, wd, rescale_grad, beta1, beta2, epsilon, gamma1 for
rmsprop's decay, eta for lars' trust coefficient) or troupe's (weight_decay, rho); one it does not
know is a TypeError naming it.
"""
from . import _troupe

# MXNet's parameter names, and troupe's, for the OptimizerSpec fields they set.
_FIELDS = {
    "learning_rate": "learning_rate", "lr": "learning_rate",
    "momentum": "momentum",
    "wd": "weight_decay", "weight_decay": "weight_decay",
    "rescale_grad": "rescale_grad",
    "nesterov": "nesterov",
    "beta1": "beta1", "beta2": "beta2",
    "epsilon": "epsilon", "eps": "epsilon",
    "gamma1": "rho", "rho": "rho",
    "eta": "eta",
}
# MXNet's that troupe does not take: said so, rather than ignored.
_REFUSED = {
    "clip_gradient": "troupe's stores do not clip each gradient; troupe train clips the global "
                     "norm (clip_grad_norm)",
    "lr_scheduler": "a store's learning rate is the one set: call set_optimizer again to change it",
    "multi_precision": "troupe's stores keep float32 values",
}


class Optimizer:
    """An optimizer's name and settings, for KVStore.set_optimizer."""

    def __init__(self, name, **params):
        spec = _troupe.OptimizerSpec()
        name = name.lower()
        if name == "nag":  # MXNet's Nesterov SGD
            name, params = "sgd", {**params, "nesterov": True}
        spec.name = name
        for key, value in params.items():
            if key in _REFUSED:
                raise TypeError(f"troupe.optimizer.create({name!r}): {key}: {_REFUSED[key]}")
            if key not in _FIELDS:
                known = ", ".join(sorted(_FIELDS))
                raise TypeError(f"troupe.optimizer.create({name!r}): unknown parameter {key!r} "
                                f"(known: {known})")
            field = _FIELDS[key]
            setattr(spec, field, bool(value) if field == "nesterov" else float(value))
        self.name = name
        self.params = dict(params)
        self.spec = spec

    def __repr__(self):
        params = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"troupe.optimizer.create({self.name!r}{', ' if params else ''}{params})"


def create(name, **params):
    """An optimizer by name, as mx.optimizer.create(name, **kwargs)."""
    return Optimizer(name, **params)
