"""troupe for PyTorch: a torch.distributed backend on troupe's transport, and an optimizer whose
update runs on troupe's parameter servers (as Horovod and BytePS plugged into PyTorch).

The backend: after `import troupe.torch`, dist.init_process_group("troupe") runs PyTorch's
collectives on troupe's ring, so DDP (and code calling dist.all_reduce & co.) runs unchanged:

    import torch.distributed as dist, troupe.torch
    dist.init_process_group("troupe")             # troupe launch -n N -- python train.py
    model = torch.nn.parallel.DistributedDataParallel(model)

Each rank's tensor is summed by troupe's ring allreduce over its transport (a "ring" KVStore: the
same sum, bit for bit, on every rank). The ranks are placed by `troupe launch` (its TROUPE_*
variables), or, under torchrun, by rank 0, which serves troupe's rendezvous on a free port at
MASTER_ADDR and tells the others through torch's store.

The backend is C++ (csrc/c10d.cc: a c10d::Backend, torch 2's functional collectives and DTensor
included), built against the installed torch at the first init_process_group("troupe") and
cached by torch (build() builds it ahead); see its header for what runs where. Where it cannot be
built, or with TROUPE_TORCH_BACKEND=python, the group is ProcessGroupTroupe below, written in
Python (torch calls it through its trampoline): DDP's bucket sums on a thread of their own, the
other collectives synchronous; float tensors (float32; float16 and bfloat16 summed in float32) on
the CPU, and on a GPU through host memory; ReduceOp.SUM and AVG. allreduce, broadcast and
allgather (of integer and bool tensors too, bit for bit), reduce_scatter, all_gather_into_tensor
and reduce_scatter_tensor (FSDP's), barrier; alltoall, send/recv; gather, scatter, reduce and the
other reductions are refused by name.

The parameter-server optimizer:

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
import concurrent.futures
import contextlib
import inspect
import io
import logging
import os
import socket
import sys
import threading
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from . import kv as _kv
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


# ---- the torch.distributed backend "troupe" ----

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _host(t):
    """t's values as a flat float32 CPU tensor (t itself where it already is one)."""
    return t.detach().to("cpu", torch.float32).reshape(-1)


def _in_place(t):
    """Whether the store can write t's values where they lie: float32, contiguous, on the host."""
    return t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()


def _write_into(output, write, divisor=1):
    """write(values) fills a flat float32 numpy array with output's new values: output's own
    memory where the store can write it (_in_place), else an array copied into output after;
    the values are then divided by `divisor` (a reduction's AVG)."""
    if _in_place(output):
        write(output.detach().view(-1).numpy())
        if divisor != 1:
            output.div_(divisor)
        return
    values = np.empty(output.numel(), dtype=np.float32)
    write(values)
    if divisor != 1:
        values /= divisor
    output.copy_(torch.from_numpy(values).view(output.shape))


def _from_the_python_api():
    """Whether the collective was called by torch.distributed's Python functions (dist.all_reduce
    and the like), not by DDP's reducer: their Work is waited for through wait(), which swallows
    the error of a Work made from a future (torch 1.13 and 2.15), so they get their sum at once."""
    try:
        caller = sys._getframe(2)  # the collective method's caller
    except ValueError:  # none in Python: DDP's reducer on the autograd engine's thread
        return False
    return caller.f_code.co_filename.endswith("distributed_c10d.py")


def _done(result=None):
    """A collective that is over when it returns (troupe's calls wait for their sums): a Work whose
    future holds the result, which C++ callers (DDP) wait on as on any backend's."""
    future = torch.futures.Future()
    future.set_result(result or [])
    return _c10d._create_work_from_future(future)


def _own_address():
    """This host's address as the others see it: the one its packets to MASTER_ADDR leave from
    (a UDP socket's connect sends nothing); 127.0.0.1 where the master is this host's loopback."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
            return s.getsockname()[0]
        except OSError:  # no route to it: the name, as before
            return master


def _ring_settings(store, rank, size, timeout):
    """troupe's placement of this rank: the launcher's for the world's group, else one the
    group's rank 0 serves (the world's under torchrun; any subgroup, dist.new_group(ranks)):
    on a free port of its host, told to the others through the group's own store.
    Waiting for the other ranks as long as init_process_group's timeout says."""
    wait = {"rendezvous_timeout": str(timeout.total_seconds())}
    launched = os.environ.get("TROUPE_RENDEZVOUS") or os.environ.get("TROUPE_RUN_ID")
    world = size == int(os.environ.get("WORLD_SIZE", size))  # the world's group, not a subgroup
    if launched and world:
        if int(os.environ.get("TROUPE_RANK", rank)) != rank:
            raise ValueError(f"troupe backend: rank {rank} given, but troupe launch placed this "
                             f"process as rank {os.environ['TROUPE_RANK']}")
        return wait
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        # The world's rank 0 runs on MASTER_ADDR's host (torchrun's rule), named as the others
        # reach it; a subgroup's rank 0 may run elsewhere.
        master = os.environ.get("MASTER_ADDR", "127.0.0.1")
        host = master if world or os.environ.get("RANK", "0") == "0" else _own_address()
        store.set("troupe/rendezvous", f"tcp://{host}:{port}")
    url = store.get("troupe/rendezvous").decode()
    run = "torch-" + "".join(c if c.isalnum() else "-" for c in url[len("tcp://"):])
    return {"rendezvous": url, "shard_id": rank, "num_shards": size, "run_id": run, **wait}


class _ThreadWork(_c10d.Work):
    """Work done by `run` on a thread of its own, for Python callers (dist.recv, dist.irecv):
    wait() raises what `run` returned as its error. (A Work made from a future swallows the
    future's exception, in torch 1.13 and 2.15 alike.)"""

    def __init__(self, run, tensors, name):
        super().__init__()
        self._tensors, self._error = tensors, None

        def body():
            self._error = run()

        self._thread = threading.Thread(target=body, daemon=True, name=name)
        self._thread.start()

    def is_completed(self):
        return not self._thread.is_alive()

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout=None):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return True

    def result(self):
        self.wait()
        return self._tensors


class ProcessGroupTroupe(_c10d.ProcessGroup):
    """The "troupe" backend's process group (made by dist.init_process_group("troupe"))."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._kv = _kv.create("ring", _ring_settings(store, rank, size, timeout))
        # DDP's bucket sums run on a thread of their own, in the order DDP asks for them, while
        # its backward pass goes on; every other collective waits for them first (_drain), so
        # the ring sees every rank's calls in one order.
        self._sums_thread = f"troupe-sums-{id(self):x}"
        self._sums = concurrent.futures.ThreadPoolExecutor(1, self._sums_thread)
        self._pending = None  # the last bucket sum handed to that thread
        self._failed = None  # the error of a bucket sum, raised by the next collective
        # send and recv: through torch's store, each message under its own key.
        self._store, self._timeout = store, timeout
        self._sent, self._received = {}, {}  # (peer, tag) -> messages so far

    def getBackendName(self):
        return "troupe"

    # torch 2 names each group (init_process_group and new_group set it); DeviceMesh and FSDP2
    # read the name. torch's own ProcessGroup keeps it in its backends, which a group made in
    # Python has none of, so this one keeps it itself.
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return self._group_name

    # ---- helpers ----
    def _in_background(self, sum_, tensors):
        """A Work for `sum_()` run on the sums' thread (in call order), done with `tensors`."""
        self._drain(just_errors=True)
        # The sum's outcome goes into `outcome`, and `done` holds the tensors or the error: an
        # error raised in a callback is one C++ sees (DDP's wait raises it). Future.set_exception
        # would hand C++ a Python object for the tensors, and DDP crashes on it.
        outcome = torch.futures.Future()

        def settle(f):
            if isinstance(f.value(), Exception):
                raise f.value()
            return tensors

        done = outcome.then(settle)

        def run():
            try:
                sum_()
            except Exception as e:  # noqa: BLE001  (DDP's wait raises it; so does the next call)
                self._failed = e
                outcome.set_result(e)
                return
            outcome.set_result(None)  # runs the callbacks, on this thread

        # A DDP hook's callback runs on the sums' thread when its sum is done, and its collectives
        # run there at once, before the sums queued after it: a call of the process group itself
        # here; one through torch.distributed's functions (PowerSGD's, which it waits for) in the
        # caller's own sum, _drain not waiting for the sum it is part of.
        if self._inside_a_sum():
            run()
        else:
            self._pending = self._sums.submit(run)
        return _c10d._create_work_from_future(done)

    def _inside_a_sum(self):
        """Whether this call comes from the sums' thread (a callback of a sum that is done)."""
        return threading.current_thread().name.startswith(self._sums_thread)

    def _drain(self, just_errors=False):
        """Waits until the bucket sums handed to the sums' thread are done (not on that thread: a
        hook's callback there is inside the last of them); raises the error of one that failed
        (a peer gone: the ring's error names it)."""
        if not just_errors and self._pending is not None and not self._inside_a_sum():
            self._pending.result()
            self._pending = None
        if self._failed is not None:
            raise self._failed

    def _sum(self, flat):
        """Sums a float32 numpy array over every rank, in place (the ring store's allreduce: no
        copy of it on the way)."""
        self._kv._store.allreduce(flat)

    @staticmethod
    def _float(what, t):
        if t.dtype not in _FLOATS:
            raise TypeError(f"troupe backend: {what} of a {t.dtype} tensor: troupe's collectives "
                            "sum float32 (float16 and bfloat16 through it)")
        if t.is_sparse:
            raise TypeError(f"troupe backend: {what} of a sparse tensor")

    def _divisor(self, what, opts):
        """What a reduction's sum is divided by: 1 for ReduceOp.SUM, the world's size for AVG
        (FSDP's reduce-scatter of gradients); the other reductions are refused by name."""
        op = dist.ReduceOp.SUM if opts is None else opts.reduceOp
        if op == dist.ReduceOp.SUM:
            return 1
        if hasattr(dist.ReduceOp, "AVG") and op == dist.ReduceOp.AVG:
            return self.size()
        names = [n for n in ("PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
                 if hasattr(dist.ReduceOp, n) and op == getattr(dist.ReduceOp, n)]
        raise ValueError(f"troupe backend: {what} with ReduceOp."
                         f"{names[0] if names else op}: only ReduceOp.SUM and AVG for now")

    def _summed(self, tensors):
        """The float32 host sum over every rank of the local tensors' sum."""
        host = _host(tensors[0]).clone()
        for t in tensors[1:]:
            host += _host(t)
        self._sum(host.numpy())
        return host

    def _concatenated_sum(self, tensors):
        """The float32 host sum over every rank of the tensors laid end to end."""
        flat = torch.cat([_host(t) for t in tensors])
        self._sum(flat.numpy())
        return flat

    def _slots(self, values):
        """Every rank's float32 `values` (a flat numpy array of one size on every rank), in rank
        order, by the store's allgather (each part once around the ring)."""
        n = values.size
        everyone = np.empty(self.size() * n, dtype=np.float32)
        self._kv._store.allgather(np.ascontiguousarray(values, dtype=np.float32), everyone)
        return [everyone[i * n:(i + 1) * n] for i in range(self.size())]

    # ---- collectives ----
    def allreduce(self, tensors, opts=None):
        for t in tensors:
            self._float("allreduce", t)
        divisor = self._divisor("allreduce", opts)
        t = tensors[0]
        if len(tensors) == 1 and _in_place(t):
            # One float32 host tensor: summed where it lies. DDP's buckets meanwhile (DDP waits on
            # the Work's future, whose error it sees); a call of dist.all_reduce at once, raising
            # its errors here.
            flat = t.detach().view(-1).numpy()

            def average():
                self._sum(flat)
                if divisor != 1:
                    np.divide(flat, divisor, out=flat)
            if not _from_the_python_api():
                return self._in_background(average, tensors)
            self._drain()
            average()
            return _done(tensors)
        self._drain()
        total = self._summed(tensors)
        if divisor != 1:
            total /= divisor
        for t in tensors:
            t.copy_(total.view(t.shape))
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        self._drain()
        for t in tensors:
            self._float("allreduce_coalesced", t)
        divisor = self._divisor("allreduce_coalesced", opts)
        flat = self._concatenated_sum(tensors)
        if divisor != 1:
            flat /= divisor
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        return _done(tensors)

    def broadcast(self, tensors, opts=None):
        self._drain()
        root = 0 if opts is None else opts.rootRank
        for t in tensors:
            got = self._from_root(t, root)
            if got.data_ptr() != t.data_ptr():
                t.copy_(got.view(t.shape))
        return _done(tensors)

    def _from_root(self, t, root):
        """t's values, flat, as rank `root` holds them, bit for bit, by the store's broadcast
        along the ring from the root: a float32 host tensor's where they lie (t itself, where it
        is contiguous), any other's bytes four to a float32 word."""
        host = t.detach().cpu().contiguous().view(-1)
        if host.dtype == torch.float32:
            self._kv._store.broadcast(host.numpy(), root)
            return host
        if host.dtype in (torch.float16, torch.bfloat16):
            host = host.view(torch.int16)  # numpy has no bfloat16
        raw = host.numpy()
        words = np.zeros(-(-raw.nbytes // 4), dtype=np.float32)
        words.view(np.uint8)[:raw.nbytes] = raw.view(np.uint8)
        self._kv._store.broadcast(words, root)
        return torch.from_numpy(words.view(np.uint8)[:raw.nbytes].view(raw.dtype)).view(t.dtype)

    def _exchanged(self, t):
        """The tensor shaped and typed as t that each rank holds, bit for bit (integers, bools,
        and the bytes of compressed gradients), in rank order: by the store's allgather, which
        copies its floats' bits, four bytes to a float32."""
        raw = np.frombuffer(t.detach().cpu().contiguous().numpy().tobytes(), dtype=np.uint8)
        dtype = t.detach().cpu().numpy().dtype
        words = np.zeros(-(-raw.size // 4) * 4, dtype=np.uint8)
        words[:raw.size] = raw
        return [torch.from_numpy(np.frombuffer(g.view(np.uint8)[:raw.size].tobytes(),
                                               dtype=dtype).copy())
                for g in self._slots(words.view(np.float32))]

    def allgather(self, output_tensors, input_tensors, opts=None):
        self._drain()
        for outs, t in zip(output_tensors, input_tensors):
            if len(outs) != self.size():
                raise ValueError(f"troupe backend: allgather into {len(outs)} tensors, for "
                                 f"{self.size()} ranks")
            n = t.numel()
            for r, o in enumerate(outs):
                if o.numel() != n:
                    raise ValueError(f"troupe backend: allgather: output {r} holds {o.numel()} "
                                     f"values, the input {n}")
            if t.dtype not in _FLOATS:  # integers and bools, bit for bit
                for o, got in zip(outs, self._exchanged(t)):
                    o.copy_(got.view(o.shape))
                continue
            self._float("allgather", t)
            mine = np.ascontiguousarray(_host(t).numpy())
            if all(_in_place(o) for o in outs):  # each rank's part written where it lies
                self._kv._store.allgather_parts(mine, [o.detach().view(-1).numpy() for o in outs])
                continue
            for o, got in zip(outs, self._slots(mine)):
                o.copy_(torch.from_numpy(got).view(o.shape))
        return _done(output_tensors)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        self._drain()
        divisor = self._divisor("reduce_scatter", opts)
        for out, ins in zip(output_tensors, input_tensors):
            self._float("reduce_scatter", out)
            if len(ins) != self.size():
                raise ValueError(f"troupe backend: reduce_scatter of {len(ins)} tensors, for "
                                 f"{self.size()} ranks")
            for t in ins:
                self._float("reduce_scatter", t)
            n = out.numel()
            for r, t in enumerate(ins):
                if t.numel() != n:
                    raise ValueError(f"troupe backend: reduce_scatter: input {r} holds "
                                     f"{t.numel()} values, the output {n}")
            everyone = torch.cat([_host(t) for t in ins]).numpy()
            _write_into(out, lambda values: self._kv._store.reduce_scatter(everyone, values),
                        divisor)
        return _done(output_tensors)

    def all_gather_single(self, output, input, opts=None):
        """dist.all_gather_into_tensor (FSDP's): every rank's input laid end to end in output,
        rank by rank. A float32 output in host memory is written where it lies, with no copy."""
        self._drain()
        n = input.numel()
        if output.numel() != n * self.size():
            raise ValueError(f"troupe backend: all_gather_into_tensor: the output holds "
                             f"{output.numel()} values, {self.size()} ranks' inputs {n} each")
        if input.dtype not in _FLOATS:  # integers and bools, bit for bit
            output.copy_(torch.cat(self._exchanged(input)).view(output.shape))
            return _done([output])
        self._float("all_gather_into_tensor", input)
        self._float("all_gather_into_tensor", output)
        mine = np.ascontiguousarray(_host(input).numpy())
        _write_into(output, lambda values: self._kv._store.allgather(mine, values))
        return _done([output])

    def reduce_scatter_single(self, output, input, opts=None):
        """dist.reduce_scatter_tensor (FSDP's): the sum over the ranks of their input's rank-th
        part (as many values as output holds) into output. A float32 output in host memory is
        written where it lies."""
        self._drain()
        divisor = self._divisor("reduce_scatter_tensor", opts)
        self._float("reduce_scatter_tensor", input)
        self._float("reduce_scatter_tensor", output)
        n = output.numel()
        if input.numel() != n * self.size():
            raise ValueError(f"troupe backend: reduce_scatter_tensor: the input holds "
                             f"{input.numel()} values, {self.size()} ranks' parts of {n}")
        everyone = np.ascontiguousarray(_host(input).numpy())
        _write_into(output, lambda values: self._kv._store.reduce_scatter(everyone, values),
                    divisor)
        return _done([output])

    # torch 1.13's names of the two (torch 2 calls them all_gather_single and
    # reduce_scatter_single).
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single

    def barrier(self, opts=None):
        self._drain()
        self._kv.barrier()
        return _done()

    def _everyones(self, t):
        """Every rank's t, bit for bit, in rank order: the ranks' tensors may differ in size
        (not in dtype); by the store's allgather, floats as floats, other types as their bytes."""
        sizes = [int(n) for n in self._exchanged(torch.tensor([t.numel()]))]
        most = max(sizes)
        padded = torch.zeros(most, dtype=t.dtype)
        padded[:t.numel()] = t.detach().cpu().reshape(-1)
        if t.dtype in _FLOATS:
            got = [torch.from_numpy(v).to(t.dtype)
                   for v in self._slots(padded.to(torch.float32).numpy())]
        else:
            got = self._exchanged(padded)
        return [g[:n] for g, n in zip(got, sizes)]

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        """Rank r's input split j lands in rank j's output split r (equal splits where none are
        given). Every rank's input goes round the ring: a first version, whose traffic is the
        world's inputs, not one's own."""
        self._drain()
        world, me = self.size(), self.rank()

        def splits(t, given, what):
            if given:
                if len(given) != world or sum(given) != t.shape[0]:
                    raise ValueError(f"troupe backend: alltoall: {what} split sizes {given} "
                                     f"for {world} ranks and {t.shape[0]} rows")
                return list(given)
            if t.shape[0] % world:
                raise ValueError(f"troupe backend: alltoall: {t.shape[0]} rows of the {what} "
                                 f"do not split evenly over {world} ranks")
            return [t.shape[0] // world] * world

        if input.dtype != output.dtype:
            raise TypeError(f"troupe backend: alltoall from {input.dtype} into {output.dtype}")
        row = input[0].numel() if input.dim() > 0 and input.shape[0] else 1
        theirs_in = self._everyones(torch.tensor(splits(input, input_split_sizes, "input")))
        mine_out = splits(output, output_split_sizes, "output")
        inputs = self._everyones(input)
        parts = []
        for r in range(world):
            begin = int(theirs_in[r][:me].sum()) * row
            count = int(theirs_in[r][me]) * row
            if count != mine_out[r] * row:
                raise ValueError(f"troupe backend: alltoall: rank {r} sends this rank "
                                 f"{count // row} rows, and its output split holds {mine_out[r]}")
            parts.append(inputs[r][begin:begin + count])
        output.copy_(torch.cat(parts).view(output.shape))
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """input_tensors[j] to rank j; output_tensors[r] from rank r."""
        world = self.size()
        if len(input_tensors) != world or len(output_tensors) != world:
            raise ValueError(f"troupe backend: alltoall of {len(input_tensors)} inputs into "
                             f"{len(output_tensors)} outputs, for {world} ranks")
        sizes = [t.numel() for t in input_tensors]
        flat = torch.cat([t.detach().cpu().reshape(-1) for t in input_tensors])
        out = torch.empty(sum(o.numel() for o in output_tensors), dtype=flat.dtype)
        self.alltoall_base(out, flat, [o.numel() for o in output_tensors], sizes)
        offset = 0
        for o in output_tensors:
            o.copy_(out[offset:offset + o.numel()].view(o.shape))
            offset += o.numel()
        return _done(output_tensors)

    def _key(self, src, dst, tag, count):
        return f"troupe/p2p/{src}/{dst}/{tag}/{count}"

    def send(self, tensors, dst, tag=0):
        """Each tensor's bytes under a key of its own in torch's store (which rank 0 serves), and
        the key's count raised: a first version, for small messages (the ring carries the
        collectives)."""
        self._drain()
        for t in tensors:
            count = self._sent.get((dst, tag), 0)
            self._sent[(dst, tag)] = count + 1
            key = self._key(self.rank(), dst, tag, count)
            self._store.set(key, t.detach().cpu().contiguous().numpy().tobytes())
            self._store.add(key + "/in", 1)
        return _done(tensors)

    def recv(self, tensors, src, tag=0):
        """Waits, on a thread of its own, for src's messages; the Work is done when they are in.
        A wait past init_process_group's timeout fails naming the rank."""
        self._drain()
        keys = []
        for _ in tensors:
            count = self._received.get((src, tag), 0)
            self._received[(src, tag)] = count + 1
            keys.append(self._key(src, self.rank(), tag, count))
        def receive():
            try:
                for t, key in zip(tensors, keys):
                    # Polled, sleeping between looks: the store's own wait holds the GIL (torch
                    # 1.13), and the send this recv waits for may be the caller's next call.
                    deadline = time.monotonic() + self._timeout.total_seconds()
                    pause = 0.0005
                    while self._store.add(key + "/in", 0) == 0:
                        if time.monotonic() > deadline:
                            raise TimeoutError(
                                f"troupe backend: recv timed out after "
                                f"{self._timeout.total_seconds():g} s waiting for rank {src} "
                                f"(tag {tag})")
                        time.sleep(pause)
                        pause = min(pause * 2, 0.01)
                    raw = self._store.get(key)
                    self._store.delete_key(key)
                    self._store.delete_key(key + "/in")
                    got = np.frombuffer(raw, dtype=t.detach().cpu().numpy().dtype)
                    if got.size != t.numel():
                        raise ValueError(f"troupe backend: recv from rank {src}: {got.size} "
                                         f"values for a tensor of {t.numel()}")
                    t.copy_(torch.from_numpy(got.copy()).view(t.shape))
            except Exception as e:  # the Work's wait raises it
                return e
            return None

        return _ThreadWork(receive, tensors, f"troupe-recv-{src}")


def _refused(what):
    def refuse(self, *args, **kwargs):
        raise NotImplementedError(f"troupe backend: {what} is not supported yet (allreduce, "
                                  "broadcast, allgather, reduce_scatter, alltoall, barrier, "
                                  "send and recv are)")
    return refuse


for _method, _what in (("recv_anysource", "recv from any source"), ("gather", "gather"),
                       ("scatter", "scatter"), ("reduce", "reduce")):
    setattr(ProcessGroupTroupe, _method, _refused(_what))


# ---- the C++ backend (csrc/c10d.cc), built against the installed torch ----

_extension = None  # the built module, once loaded
_extension_error = None  # why it could not be built, once tried
_rings = []  # the C++ backends' ring stores (a backend holds its store, not the wrapper)


def build():
    """Builds troupe's C++ backend (csrc/c10d.cc) against the installed torch with torch's
    cpp_extension (a C++ compiler and ninja; about a minute on 2 cores), or loads it from torch's
    extension cache (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions) where it was built
    before; returns the module. The first init_process_group("troupe") calls it; call it ahead to
    build before the ranks start (`python -c "import troupe.torch; troupe.torch.build()"`).
    Concurrent builds (every rank at once) take turns on the cache's lock."""
    global _extension
    if _extension is None:
        # Quietly: importing cpp_extension says where CUDA is when torch has no GPU to use
        # (printed by torch 1, logged by torch 2), which is no news to a CPU run.
        log = logging.getLogger("torch.utils.cpp_extension")
        level = log.level
        log.setLevel(logging.ERROR)
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                from torch.utils import cpp_extension
        finally:
            log.setLevel(level)
        csrc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
        version = "".join(c if c.isalnum() else "_" for c in torch.__version__)
        _extension = cpp_extension.load(
            name=f"troupe_c10d_{version}", sources=[os.path.join(csrc, "c10d.cc")],
            extra_include_paths=[csrc], extra_cflags=["-O2"], verbose=False)
    return _extension


def _backend():
    """The C++ backend's module, or None where it is not used: TROUPE_TORCH_BACKEND=python asks
    for the Python process group (ProcessGroupTroupe); a failed build falls back to it, saying
    why once (that group lacks torch 2's functional collectives and DTensor)."""
    global _extension_error
    choice = os.environ.get("TROUPE_TORCH_BACKEND", "c++")
    if choice not in ("c++", "python"):
        raise ValueError(f"TROUPE_TORCH_BACKEND={choice!r}: c++ (the default) or python")
    if choice == "python":
        return None
    if _extension is None and _extension_error is None:
        try:
            build()
        except Exception as e:  # noqa: BLE001  (no compiler, no ninja, headers missing: said)
            _extension_error = e
            warnings.warn(f"troupe backend: its C++ backend could not be built against torch "
                          f"{torch.__version__} ({str(e).splitlines()[0] if str(e) else e!r}); "
                          "using the Python process group, which lacks torch 2's functional "
                          "collectives (DTensor). TROUPE_TORCH_BACKEND=python says so silently.",
                          RuntimeWarning, stacklevel=3)
    return _extension


def _create_process_group(store, rank, size, timeout):
    backend = _backend()
    if backend is None:
        return ProcessGroupTroupe(store, rank, size, timeout)
    ring = _kv.create("ring", _ring_settings(store, rank, size, timeout))
    _rings.append(ring)  # open until exit, where kv closes every store in the order made
    return backend.create(store, rank, size, timeout, ring._store)


if "troupe" not in dist.Backend.__dict__ and not hasattr(dist.Backend, "TROUPE"):
    # torch 2 asks which devices' tensors a backend takes (CUDA tensors go through host memory
    # here); torch 1.13's register_backend has no such argument.
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        dist.Backend.register_backend("troupe", _create_process_group, devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend("troupe", _create_process_group)
