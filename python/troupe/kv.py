"""MXNet's KVStore API (mx.kv) on troupe's stores: create, init, push, pull, pushpull,
set_optimizer, set_gradient_compression, rank, num_workers, barrier.

Values are numpy arrays or torch tensors (CPU; a CUDA tensor goes through host memory), any
shape, float32 on the wire: another dtype is converted on the way in and out. Keys are ints, or
strings (mapped to ints in the order a worker inits them: every worker inits the same keys in
the same order, as MXNet requires). A list of keys takes a list of values, one a key (each a
value or a list of values, summed, as MXNet's several devices); `out` takes one array or a list,
each of which receives the value.

Types: "local", "device" (one process); "dist_sync", "dist_async", "ssp" (workers and parameter
servers started by `troupe launch -n W -s S -- python script.py`, or MXNet's DMLC_* variables);
"ring" (troupe's: no servers). A server process runs the same script: its create() serves the
store until every worker is done, then ends the process (MXNet's servers never return either).
"""
import atexit
import itertools
import sys
import weakref

import numpy as np

from . import _troupe
from .optimizer import Optimizer

# MXNet's other names for troupe's types.
_ALIASES = {"dist_sync_device": "dist_sync", "dist_device_sync": "dist_sync",
            "dist": "dist_sync"}


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _as_float32(value, what):
    """A C-contiguous float32 numpy array of value's values (no copy where it already is one);
    TypeError naming `what` ("push of key 3") for a value that is not floating point: troupe's
    stores hold float32, and an integer's conversion would round silently above 2^24."""
    if _is_torch(value):
        if not value.is_floating_point():
            raise TypeError(f"{what}: a torch tensor of {value.dtype}; troupe's stores hold "
                            "float32 (convert it, or keep integers out of the store)")
        # float32 on the CPU (bfloat16 has no numpy type; a CUDA tensor crosses to the host).
        value = value.detach().to(device="cpu", dtype=sys.modules["torch"].float32).numpy()
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"{what}: an array of {array.dtype}; troupe's stores hold float32 "
                        "(convert it, or keep integers out of the store)")
    return np.ascontiguousarray(array, dtype=np.float32)


def _receive(out, flat, shape):
    """Writes the float32 values `flat` into out (numpy array, torch tensor, or anything that
    takes `out[...] = array`)."""
    values = flat.reshape(shape)
    if _is_torch(out):
        import torch
        out.copy_(torch.from_numpy(values))
    elif isinstance(out, np.ndarray):
        if out.size != values.size:
            raise ValueError(f"out has shape {out.shape}, the key's value {values.shape}")
        out[...] = flat.reshape(out.shape)  # in place, whatever out's strides
    else:  # an mx.nd.NDArray, say
        out[:] = values


class KVStore:
    """A troupe store with mx.kv.KVStore's methods."""

    def __init__(self, store):
        self._store = store
        self._keys = {}    # a str key's int
        self._shapes = {}  # an int key's value's shape

    # ---- what it is ----
    @property
    def type(self):
        return self._store.type

    @property
    def rank(self):
        return self._store.rank

    @property
    def num_workers(self):
        return self._store.num_workers

    # ---- keys ----
    def _key(self, key, new=False):
        if isinstance(key, str):
            if key not in self._keys:
                if not new:
                    raise _troupe.Error(f"key {key!r} was never initialised")
                self._keys[key] = len(self._keys)
            return self._keys[key]
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool) and key >= 0:
            return int(key)
        raise TypeError(f"a key is an int >= 0 or a str, not {key!r}")

    @staticmethod
    def _listed(key, value):
        """(keys, values) as lists: one key with its value, or lists of each."""
        if isinstance(key, (list, tuple)):
            if not isinstance(value, (list, tuple)) or len(value) != len(key):
                raise ValueError(f"{len(key)} keys need a list of {len(key)} values")
            return list(key), list(value)
        return [key], [value]

    def _size(self, k):
        if k not in self._shapes:
            raise _troupe.Error(f"key {k} was never initialised")
        return int(np.prod(self._shapes[k], dtype=np.int64))

    # ---- MXNet's calls ----
    def init(self, key, value):
        """Gives each key its first value (worker 0's; the others wait for it)."""
        for k, v in zip(*self._listed(key, value)):
            array = _as_float32(v, f"init of key {k!r}")
            k = self._key(k, new=True)
            self._store.init(k, array.reshape(-1))
            self._shapes[k] = array.shape

    def push(self, key, value, priority=0):
        """Pushes each key's value (a list of values: their sum)."""
        keys, values = self._listed(key, value)
        ints = [self._key(k) for k in keys]
        if len(keys) > 1 and not any(isinstance(v, (list, tuple)) for v in values):
            arrays = [self._checked(i, _as_float32(v, f"push of key {k!r}"))
                      for k, i, v in zip(keys, ints, values)]
            self._store.push_many(ints, arrays, priority)
            return
        for k, i, v in zip(keys, ints, values):
            parts = v if isinstance(v, (list, tuple)) else [v]
            self._store.push(i, [self._checked(i, _as_float32(p, f"push of key {k!r}"))
                                 for p in parts], priority)

    def _checked(self, k, array):
        if array.size != self._size(k):
            raise ValueError(f"key {k}: a value of {array.size} numbers, but the key holds "
                             f"{self._size(k)} (shape {self._shapes[k]})")
        return array.reshape(-1)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copies each key's value into its out (an array, or a list of arrays that each get it).
        Without out, returns the value (a numpy array; a list for a list of keys)."""
        keys = list(key) if isinstance(key, (list, tuple)) else [key]
        ints = [self._key(k) for k in keys]
        flats = [np.empty(self._size(k), dtype=np.float32) for k in ints]
        if len(ints) > 1:
            self._store.pull_many(ints, flats, priority)
        else:
            self._store.pull(ints[0], flats[0], priority)
        if out is None:
            values = [f.reshape(self._shapes[k]) for f, k in zip(flats, ints)]
            return values if isinstance(key, (list, tuple)) else values[0]
        outs = list(out) if isinstance(key, (list, tuple)) else [out]
        if len(outs) != len(ints):
            raise ValueError(f"{len(ints)} keys need a list of {len(ints)} outs")
        for o, f, k in zip(outs, flats, ints):
            for each in (o if isinstance(o, (list, tuple)) else [o]):
                _receive(each, f, self._shapes[k])
        return None

    def pushpull(self, key, value, out=None, priority=0):
        """push, then pull (into out; without out, into value)."""
        self.push(key, value, priority)
        return self.pull(key, out=value if out is None else out, priority=priority)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        raise NotImplementedError(
            "row_sparse_pull: troupe's stores hold dense float32 values; pull the whole key")

    def set_optimizer(self, optimizer):
        """The update the store applies to pushes (troupe.optimizer.create(...))."""
        if not isinstance(optimizer, Optimizer):
            raise TypeError("set_optimizer takes troupe.optimizer.create(name, **params), not "
                            f"{type(optimizer).__name__}")
        self._store.set_optimizer(optimizer.spec)

    def set_gradient_compression(self, compression_params):
        """MXNet's dict: {'type': '2bit', 'threshold': 0.5}; troupe's fp16 and bf16 too."""
        params = dict(compression_params)
        kind = params.pop("type", None)
        if kind is None:
            raise ValueError("set_gradient_compression needs {'type': '2bit' | 'fp16' | "
                             "'bf16' | 'none', ...}")
        threshold = float(params.pop("threshold", 0.5))
        if params:
            raise ValueError(f"set_gradient_compression: unknown parameters {sorted(params)}")
        self._store.set_gradient_compression(kind, threshold)

    def barrier(self):
        """Waits for every worker."""
        self._store.barrier()

    _barrier = barrier  # MXNet 1.x's name

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Every key's optimizer state (and update count) to fname, written whole or not at all:
        local, device and ring stores, whose optimizer runs here (a ring's worker saves its own
        copy; a distributed store's servers hold theirs: troupe.Error, as MXNet refuses). The file names the optimizer; its settings are
        not in it (dump_optimizer): set the same optimizer before load_optimizer_states."""
        if dump_optimizer:
            raise NotImplementedError("save_optimizer_states(dump_optimizer=True): troupe's file "
                                      "holds the states, not the optimizer's settings; call "
                                      "set_optimizer with them before load_optimizer_states")
        self._store.save_optimizer_states(str(fname))

    def load_optimizer_states(self, fname):
        """The states save_optimizer_states wrote, into a store with the same optimizer set and
        the same keys (troupe.Error naming what differs)."""
        self._store.load_optimizer_states(str(fname))

    def close(self):
        """Tells the servers this worker is done and waits for the others (also when the store
        is garbage-collected or the interpreter exits)."""
        self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# Stores still open at exit, closed then (before the interpreter tears the module down), in the
# order they were made: closing a store waits for its peers (a ring's members meet), and every
# process made its stores in one order (torch.distributed's groups, say), so no two processes
# wait for each other on two stores.
_open = weakref.WeakValueDictionary()  # creation number -> store
_made = itertools.count()


@atexit.register
def _close_open_stores():
    for _, store in sorted(_open.items(), key=lambda item: item[0]):
        store.close()


def create(name="local", settings=None):
    """A store of type `name`, as mx.kv.create(name). In a process started as a parameter server,
    serves the store until every worker is done and ends the process. settings: troupe's config
    keys as text ({"peer_timeout": "30"}), over the launcher's variables."""
    name = _ALIASES.get(name, name)
    settings = {k: str(v) for k, v in (settings or {}).items()}
    if _troupe.is_server(settings):
        _troupe.run_server(name, settings)
        sys.exit(0)
    store = KVStore(_troupe.create(name, settings))
    _open[next(_made)] = store
    return store
