"""A ring store's optimizer states saved and loaded mid-run, for tests/python/test_kv_dist.py: run
by `troupe launch -n 2 -- python kv_states_worker.py DIR`. Each worker pushes its gradients for 3
steps, saves its states, pushes 3 more, loads the saved states back and pushes 3 more. A local
store then does the same with the sum of both workers' pushes: the ring's value must be its bits
(a ring's sum of two arrays is the local store's sum of the same two, and every update the same
float32 operations)."""
import os
import sys

import numpy as np

import troupe


def grad(step, rank):
    return np.random.default_rng([step, rank]).standard_normal(20).astype(np.float32)


def run(kv, push, states):
    kv.init(0, np.ones(20))
    kv.set_optimizer(troupe.optimizer.create("adam", learning_rate=0.05))
    for step in range(9):
        if step == 3:
            kv.save_optimizer_states(states)
        if step == 6:
            kv.load_optimizer_states(states)
        push(step)
    return kv.pull(0)


folder = sys.argv[1]
ring = troupe.kv.create("ring")
rank = ring.rank
got = run(ring, lambda s: ring.push(0, grad(s, rank)), os.path.join(folder, f"ring{rank}"))
local = troupe.kv.create("local")
want = run(local, lambda s: local.push(0, [grad(s, 0), grad(s, 1)]),
           os.path.join(folder, f"local{rank}"))
assert np.array_equal(got, want), (got, want)
print(f"worker {rank}: the ring's states saved and loaded as the local store's", flush=True)
ring.close()
