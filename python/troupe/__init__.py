"""troupe for Python: MXNet's KVStore over troupe's transport and parameter servers.

    import troupe
    kv = troupe.kv.create("dist_sync")         # as mx.kv.create; servers serve inside create()
    kv.init(3, weights)                        # numpy arrays or torch tensors
    kv.set_optimizer(troupe.optimizer.create("sgd", learning_rate=0.1, momentum=0.9))
    kv.push(3, grads)
    kv.pull(3, out=weights)

`import troupe.torch` (which imports torch) registers the torch.distributed backend "troupe"
(dist.init_process_group("troupe"): DDP on troupe's ring) and gives
troupe.torch.ParameterServerOptimizer (a PyTorch model trained on the parameter servers).

Start the processes with `troupe launch -n WORKERS -s SERVERS -- python script.py` (or MXNet's
DMLC_* variables). A failed call raises troupe.Error, whose `kind` says how it failed (input,
timeout, peer, ...) and whose message names the culprit.
"""
from . import kv, optimizer
from ._troupe import Error, __version__

__all__ = ["Error", "kv", "optimizer", "__version__"]
