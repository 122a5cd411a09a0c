"""troupe.kv against MXNet 1.9.1's own kvstore: the same program (tests/python/kv_program.py: three
keys of odd sizes, pushes of two arrays summed, 5 steps of SGD with momentum and weight decay, or
of Adam, on the store), run by MXNet (in .venv-mxnet, scripts/setup.sh) and by troupe, locally
and as dist_sync with 2 workers and 1 server; every pulled value equal within the bound derived
below."""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MXNET_PYTHON = os.path.join(ROOT, ".venv-mxnet", "bin", "python")
PROGRAM = os.path.join(HERE, "kv_program.py")
EPS32 = float(np.finfo(np.float32).eps)

sys.path.insert(0, HERE)
from kv_settings import PARAMS, SHAPES, STEPS  # noqa: E402


def rng(*seed):
    return np.random.default_rng(list(seed))


def reference(optimizer, workers, semantics):
    """Worker 0's pulled values in float64: MXNet's update rules or troupe's (PyTorch's), on the
    pushes kv_program.py makes (each step's gradient: every worker's two arrays, summed)."""
    p = PARAMS[optimizer]
    ws = [rng(0, k).standard_normal(s) for k, s in enumerate(SHAPES)]
    state = [(np.zeros(s), np.zeros(s)) for s in SHAPES]
    out = []
    for t in range(STEPS):
        for k, s in enumerate(SHAPES):
            g = sum(rng(1, r, t, k, d).standard_normal(s) for r in range(workers) for d in (0, 1))
            g = p["rescale_grad"] * g + p["wd"] * ws[k]
            m, v = state[k]
            lr = p["learning_rate"]
            if optimizer == "sgd":
                # MXNet: mom = momentum * mom - lr * g; w += mom. PyTorch: v = momentum * v + g;
                # w -= lr * v. With a constant lr, mom = -lr * v: one rule.
                m = p["momentum"] * m + g
                ws[k] = ws[k] - lr * m
            else:
                b1, b2, eps = p["beta1"], p["beta2"], p["epsilon"]
                m = b1 * m + (1 - b1) * g
                v = b2 * v + (1 - b2) * g * g
                c1, c2 = 1 - b1 ** (t + 1), 1 - b2 ** (t + 1)
                if semantics == "mxnet":  # eps added to sqrt(v), the correction in lr
                    ws[k] = ws[k] - lr * np.sqrt(c2) / c1 * m / (np.sqrt(v) + eps)
                else:  # PyTorch's: eps added to sqrt(v / c2)
                    ws[k] = ws[k] - lr * (m / c1) / (np.sqrt(v / c2) + eps)
            state[k] = (m, v)
        out.append([w.copy() for w in ws])
    return out, state


def bound(optimizer, workers):
    """Per element of each step's values: where MXNet's rule and troupe's differ (Adam's eps:
    |their float64 trajectories' difference|), plus the roundings of two float32 programs. SGD:
    each step rounds the 4-array sum, the decay, the momentum and the weight, each within eps32 of
    magnitudes at most M = max |w| + lr max |v| + lr max |g|; an error in v is carried into every
    later step (at most STEPS times), so STEPS^2 x 8 x eps32 x M. Adam: its step is at most
    lr x |m| / sqrt(v) <= lr / sqrt(1 - beta2) in size; its ~12 roundings a step are relative to
    that step, and w's own rounding to |w|: STEPS x (|w| + 12 x step) x eps32 x 2."""
    mx, state = reference(optimizer, workers, "mxnet")
    pt, _ = reference(optimizer, workers, "pytorch")
    p = PARAMS[optimizer]
    lr = p["learning_rate"]
    w_max = max(np.abs(w).max() for step in mx for w in step)
    if optimizer == "sgd":
        v_max = max(np.abs(m).max() for m, _ in state)
        g_max = max(np.abs(sum(rng(1, r, t, k, d).standard_normal(s) for r in range(workers)
                                for d in (0, 1))).max() * p["rescale_grad"]
                    for t in range(STEPS) for k, s in enumerate(SHAPES))
        rounding = STEPS ** 2 * 8 * EPS32 * (w_max + lr * v_max / (1 - p["momentum"]) + lr * g_max)
    else:
        step = lr / np.sqrt(1 - p["beta2"])
        rounding = STEPS * (w_max + 12 * step) * EPS32 * 2
    return [[np.abs(a - b) + rounding for a, b in zip(sa, sb)] for sa, sb in zip(mx, pt)]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_mxnet(store, optimizer, out):
    if not os.path.exists(MXNET_PYTHON):
        pytest.fail(f"{MXNET_PYTHON} is missing: scripts/setup.sh installs MXNet 1.9.1 there")
    cmd = [MXNET_PYTHON, PROGRAM, "mxnet", store, optimizer, out]
    if store == "local":
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout
        return
    # ps-lite's scheduler, one server and two workers, as MXNet's tools/launch.py starts them.
    env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(free_port()),
               DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="2", OMP_NUM_THREADS="1", PS_VERBOSE="0")
    helpers = [subprocess.Popen([MXNET_PYTHON, "-c", "import mxnet"], env=dict(env, DMLC_ROLE=role),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for role in ("scheduler", "server")]
    workers = [subprocess.Popen(cmd, env=dict(env, DMLC_ROLE="worker"), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    try:
        outputs = [w.communicate(timeout=120)[0] for w in workers]
        for w, o in zip(workers, outputs):
            assert w.returncode == 0, o
        for h in helpers:
            h.wait(timeout=60)
    finally:
        for p in helpers + workers:
            if p.poll() is None:
                p.kill()


def run_troupe(store, optimizer, out):
    cmd = [sys.executable, PROGRAM, "troupe", store, optimizer, out]
    if store != "local":
        cmd = [os.environ.get("TROUPE", "troupe"), "launch", "-n", "2", "-s", "1", "--"] + cmd
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout


@pytest.mark.parametrize("store", ["local", "dist_sync"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_troupe_pulls_what_mxnet_pulls(store, optimizer, tmp_path):
    mx_out, tr_out = str(tmp_path / "mxnet.npz"), str(tmp_path / "troupe.npz")
    run_mxnet(store, optimizer, mx_out)
    run_troupe(store, optimizer, tr_out)
    mx, tr = np.load(mx_out), np.load(tr_out)
    limits = bound(optimizer, 1 if store == "local" else 2)
    worst = 0.0
    for t in range(STEPS):
        for k in range(len(SHAPES)):
            name = f"step{t}_key{k}"
            diff = np.abs(mx[name].astype(np.float64) - tr[name])
            assert (diff <= limits[t][k]).all(), (name, diff.max(), limits[t][k].max())
            worst = max(worst, float((diff / limits[t][k]).max()))
    print(f"[ measured ] {store} {optimizer}: the largest difference is {worst:.3f} of its bound")
