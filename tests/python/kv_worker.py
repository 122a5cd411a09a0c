"""A KVStore program as MXNet's users write it, for tests/python/test_kv_dist.py: run by
`troupe launch -n 2 -s 1 -- python kv_worker.py TYPE`. Each worker pushes (rank + 1) * ones for 3
steps; the store's SGD (learning rate 0.5) takes each step's sum, 3 * ones (1 + 2)."""
import sys

import numpy as np

import troupe

kv = troupe.kv.create(sys.argv[1])  # a server serves here and exits
kv.init(0, np.ones(5))
kv.set_optimizer(troupe.optimizer.create("sgd", learning_rate=0.5))
w = np.empty(5, dtype=np.float32)
for step in range(3):
    kv.push(0, np.full(5, kv.rank + 1.0))
    kv.pull(0, out=w)
    print(f"worker {kv.rank} of {kv.num_workers} step {step}: {w[0]:g}", flush=True)
if kv.type != "ring":  # a distributed store's optimizer states are its servers'
    try:
        kv.save_optimizer_states("states")
    except troupe.Error as e:
        print(f"worker {kv.rank}: {e.kind}: {e}", flush=True)
kv.barrier()
kv.close()
