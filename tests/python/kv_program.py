"""One KVStore program written for MXNet's mx.kv and run as it is on troupe.kv, for
tests/python/test_kv_vs_mxnet.py:

    python kv_program.py mxnet|troupe local|dist_sync sgd|adam OUT.npz

Three keys of odd sizes, given random first values; each of 5 steps pushes to every key a list
of two random arrays (as from two devices; their sum is the gradient), the store's optimizer
updates, and the worker pulls every key. Worker 0 saves the values it pulled after each step. The
random numbers depend on the rank, the step and the key only, so both libraries see the same."""
import sys

import numpy as np

from kv_settings import PARAMS, SHAPES, STEPS

library, store, optimizer, out_path = sys.argv[1:5]
PARAMS = PARAMS[optimizer]

if library == "mxnet":
    import mxnet as mx
    kv = mx.kv.create(store)
    array = lambda a: mx.nd.array(a, dtype="float32")  # noqa: E731
    values = lambda outs: [o.asnumpy() for o in outs]  # noqa: E731
    opt = mx.optimizer.create(optimizer, **PARAMS)
else:
    import troupe
    kv = troupe.kv.create(store)
    array = lambda a: np.array(a, dtype=np.float32)  # noqa: E731
    values = lambda outs: [o.copy() for o in outs]  # noqa: E731
    opt = troupe.optimizer.create(optimizer, **PARAMS)


def rng(*seed):
    return np.random.default_rng(list(seed))


keys = list(range(len(SHAPES)))
kv.init(keys, [array(rng(0, k).standard_normal(s)) for k, s in zip(keys, SHAPES)])
kv.set_optimizer(opt)
trajectory = []
for step in range(STEPS):
    grads = [[array(rng(1, kv.rank, step, k, d).standard_normal(s)) for d in (0, 1)]
             for k, s in zip(keys, SHAPES)]
    kv.push(keys, grads)
    outs = [array(np.zeros(s)) for s in SHAPES]
    kv.pull(keys, out=outs)
    trajectory.append(values(outs))
if kv.rank == 0:
    np.savez(out_path, **{f"step{t}_key{k}": v for t, vs in enumerate(trajectory)
                          for k, v in enumerate(vs)})
print(f"worker {kv.rank} done", flush=True)
