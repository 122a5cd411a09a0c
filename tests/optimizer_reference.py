#!/usr/bin/python3
"""The reference side of the optimizer tests (tests/kernels_optimizer_reference_test.cc).

Draws float32 weights and a float32 gradient for each of --steps steps, runs the optimizer on them
in float64 -- torch.optim's own for sgd, adam, adamw, rmsprop and adagrad; LARS and LAMB as their
papers write them, below -- and bounds what troupe's float32 computation may differ from that by a
running error analysis (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section
3.3): every float32 operation troupe does, in troupe's order (kernels/optimizers/*.h), adds half an
ulp of its result (u = 2^-24) to the error it inherits through the operation's derivatives. The
float64 value of that same computation must agree with torch's to 1e-9 (the formulas are the same);
the script fails otherwise.

Writes --out: b"TROUPEOPT1", int64 n, int64 steps, float32 w0[n], float32 g[steps][n],
float64 reference[n], float64 bound[n] (first order, per element), all little-endian.
Hyperparameters are taken as the float32 values troupe reads.
"""
import argparse
import struct
import sys

import numpy as np

U = 2.0**-24  # float32's unit roundoff


def f32(x):
    return float(np.float32(x))


class B:
    """A float32 computation's exact value (float64) and a first-order bound on its error."""

    def __init__(self, v, e=None):
        self.v = np.asarray(v, dtype=np.float64)
        self.e = np.zeros_like(self.v) if e is None else np.asarray(e, dtype=np.float64)

    @staticmethod
    def of(x):
        return x if isinstance(x, B) else B(x)

    @staticmethod
    def rounded(x):
        """A value computed in double and rounded once to float32 (troupe's scalars)."""
        return B(x, U * np.abs(x))

    def __add__(a, b):
        b = B.of(b)
        v = a.v + b.v
        return B(v, a.e + b.e + U * np.abs(v))

    __radd__ = __add__

    def __sub__(a, b):
        b = B.of(b)
        v = a.v - b.v
        return B(v, a.e + b.e + U * np.abs(v))

    def __rsub__(a, b):
        return B.of(b) - a

    def __mul__(a, b):
        b = B.of(b)
        v = a.v * b.v
        return B(v, np.abs(b.v) * a.e + np.abs(a.v) * b.e + U * np.abs(v))

    __rmul__ = __mul__

    def __truediv__(a, b):
        b = B.of(b)
        v = a.v / b.v
        return B(v, a.e / np.abs(b.v) + np.abs(a.v) * b.e / b.v**2 + U * np.abs(v))

    def __rtruediv__(a, b):
        return B.of(b) / a

    def sqrt(a):
        v = np.sqrt(a.v)
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.where(v > 0, a.e / (2 * v), np.sqrt(a.e))
        return B(v, e + U * v)

    def norm(a):
        """troupe's layer norm: a double sum of squares of float32 values, rounded to float."""
        v = np.sqrt(np.sum(a.v**2))
        return B(v, np.sqrt(np.sum(a.e**2)) + U * v)

    def __getitem__(a, k):
        return B(a.v[k], a.e[k])

    def set(a, k, b):
        a.v[k] = b.v
        a.e[k] = b.e


def ranges(text):
    out = []
    for part in filter(None, text.split(",")):
        lo, hi = part.split(":")
        out.append((int(lo), int(hi)))
    return out


def segments(n, layers, no_decay):
    """troupe's planUpdate: each listed layer and each gap, with whether it decays and adapts."""
    listed = {lo: hi for lo, hi in layers}
    out, at = [], 0
    while at < n:
        hi = listed.get(at)
        if hi is None:
            hi = min([lo for lo, _ in layers if lo > at] + [n])
        exempt = any(lo < hi and at < h for lo, h in no_decay)
        out.append((at, hi, not exempt))
        at = hi
    return out


def decays(n, no_decay):
    d = np.ones(n)
    for lo, hi in no_decay:
        d[lo:hi] = 0
    return d


def troupe_bound(a, w0, grads):
    """troupe's float32 computation, in its order, with its running error bound."""
    n = w0.size
    lr, wd = a.lr, a.weight_decay
    decay = B(decays(n, a.no_decay) * wd)
    w = B(w0.astype(np.float64))
    state = [B(np.zeros(n)), B(np.zeros(n))]
    for t in range(1, a.steps + 1):
        g = B(grads[t - 1].astype(np.float64))
        if a.optimizer == "sgd":
            grad = g + decay * w
            vel = a.momentum * state[0] + grad
            state[0] = vel
            w = w - lr * (grad + a.momentum * vel) if a.nesterov else w - lr * vel
        elif a.optimizer in ("adam", "adamw"):
            grad = g
            if a.optimizer == "adamw":
                w = w * (1.0 - lr * decay)
            else:
                grad = g + decay * w
            c3 = B.rounded(lr / (1 - a.beta1**t))
            c4 = B.rounded(1 / np.sqrt(1 - a.beta2**t))
            m = a.beta1 * state[0] + (1 - a.beta1) * grad
            v = a.beta2 * state[1] + ((1 - a.beta2) * grad) * grad
            state = [m, v]
            w = w - (c3 * m) / (v.sqrt() * c4 + a.epsilon)
        elif a.optimizer == "rmsprop":
            grad = g + decay * w
            v = a.rho * state[0] + ((1 - a.rho) * grad) * grad
            state[0] = v
            w = w - (lr * grad) / (v.sqrt() + a.epsilon)
        elif a.optimizer == "adagrad":
            grad = g + decay * w
            s = state[0] + grad * grad
            state[0] = s
            w = w - (lr * grad) / (s.sqrt() + a.epsilon)
        elif a.optimizer == "lars":
            new = B(np.zeros(n))
            for lo, hi, adapt in segments(n, a.layers, a.no_decay):
                k = slice(lo, hi)
                d = wd if adapt else 0.0
                ratio = B(1.0)
                if adapt:
                    wn, gn = w[k].norm(), g[k].norm()
                    if wn.v > 0 and gn.v > 0:
                        ratio = (a.eta * wn) / ((gn + d * wn) + a.epsilon)
                vel = a.momentum * state[0][k] + (lr * ratio) * (g[k] + d * w[k])
                state[0].set(k, vel)
                new.set(k, w[k] - vel)
            w = new
        elif a.optimizer == "lamb":
            c3 = B.rounded(1 / (1 - a.beta1**t))
            c4 = B.rounded(1 / (1 - a.beta2**t))
            new = B(np.zeros(n))
            for lo, hi, adapt in segments(n, a.layers, a.no_decay):
                k = slice(lo, hi)
                d = wd if adapt else 0.0
                m = a.beta1 * state[0][k] + (1 - a.beta1) * g[k]
                v = a.beta2 * state[1][k] + ((1 - a.beta2) * g[k]) * g[k]
                r = (m * c3) / ((v * c4).sqrt() + a.epsilon) + d * w[k]
                ratio = B(1.0)
                if adapt:
                    wn, rn = w[k].norm(), r.norm()
                    if wn.v > 0 and rn.v > 0:
                        ratio = wn / rn
                state[0].set(k, m)
                state[1].set(k, v)
                new.set(k, w[k] - (lr * ratio) * r)
            w = new
        else:
            sys.exit(f"optimizer_reference.py: no optimizer {a.optimizer}")
    return w


def torch_reference(a, w0, grads):
    import torch

    if a.optimizer not in ("sgd", "adam", "adamw", "rmsprop", "adagrad"):
        return None
    if a.no_decay and a.weight_decay:
        sys.exit("optimizer_reference.py: no_decay ranges are for lars and lamb here")
    p = torch.nn.Parameter(torch.tensor(w0, dtype=torch.float64))
    o = a.optimizer
    if o == "sgd":
        opt = torch.optim.SGD([p], lr=a.lr, momentum=a.momentum, nesterov=a.nesterov,
                              weight_decay=a.weight_decay)
    elif o == "adam":
        opt = torch.optim.Adam([p], lr=a.lr, betas=(a.beta1, a.beta2), eps=a.epsilon,
                               weight_decay=a.weight_decay)
    elif o == "adamw":
        opt = torch.optim.AdamW([p], lr=a.lr, betas=(a.beta1, a.beta2), eps=a.epsilon,
                                weight_decay=a.weight_decay)
    elif o == "rmsprop":
        opt = torch.optim.RMSprop([p], lr=a.lr, alpha=a.rho, eps=a.epsilon,
                                  weight_decay=a.weight_decay)
    elif o == "adagrad":
        opt = torch.optim.Adagrad([p], lr=a.lr, eps=a.epsilon, weight_decay=a.weight_decay)
    for t in range(a.steps):
        p.grad = torch.tensor(grads[t], dtype=torch.float64)
        opt.step()
    return p.detach().numpy()


def paper_reference(a, w0, grads):
    """LARS (You, Gitman and Ginsburg 2017, with MLPerf's momentum form) and LAMB (You et al.
    2019, Algorithm 2 with bias correction), in float64, per layer."""
    n = w0.size
    w = w0.astype(np.float64)
    m = np.zeros(n)
    v = np.zeros(n)
    for t in range(1, a.steps + 1):
        g = grads[t - 1].astype(np.float64)
        for lo, hi, adapt in segments(n, a.layers, a.no_decay):
            k = slice(lo, hi)
            wd = a.weight_decay if adapt else 0.0
            wn = np.linalg.norm(w[k])
            if a.optimizer == "lars":
                gn = np.linalg.norm(g[k])
                trust = a.eta * wn / (gn + wd * wn + a.epsilon) if adapt and wn > 0 and gn > 0 else 1
                m[k] = a.momentum * m[k] + a.lr * trust * (g[k] + wd * w[k])
                w[k] = w[k] - m[k]
            else:
                m[k] = a.beta1 * m[k] + (1 - a.beta1) * g[k]
                v[k] = a.beta2 * v[k] + (1 - a.beta2) * g[k] ** 2
                m_hat = m[k] / (1 - a.beta1**t)
                v_hat = v[k] / (1 - a.beta2**t)
                r = m_hat / (np.sqrt(v_hat) + a.epsilon) + wd * w[k]
                rn = np.linalg.norm(r)
                trust = wn / rn if adapt and wn > 0 and rn > 0 else 1
                w[k] = w[k] - a.lr * trust * r
    return w


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--optimizer", required=True)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--grad-scale", type=float, default=0.1)
    for name, default in [("lr", 0.01), ("weight-decay", 0.0), ("momentum", 0.9),
                          ("beta1", 0.9), ("beta2", 0.999), ("epsilon", 1e-8), ("rho", 0.9),
                          ("eta", 0.001)]:
        p.add_argument("--" + name, type=float, default=default)
    p.add_argument("--nesterov", type=int, default=0)
    p.add_argument("--layers", default="")
    p.add_argument("--no-decay", default="")
    a = p.parse_args()
    for name in ["lr", "weight_decay", "momentum", "beta1", "beta2", "epsilon", "rho", "eta"]:
        setattr(a, name, f32(getattr(a, name)))
    a.nesterov = bool(a.nesterov)
    a.layers, a.no_decay = ranges(a.layers), ranges(a.no_decay)

    rng = np.random.default_rng(a.seed)
    w0 = rng.standard_normal(a.n).astype(np.float32)
    grads = (rng.standard_normal((a.steps, a.n)) * a.grad_scale).astype(np.float32)

    bounded = troupe_bound(a, w0, grads)
    reference = torch_reference(a, w0, grads)
    if reference is None:
        reference = paper_reference(a, w0, grads)
    agreement = np.max(np.abs(bounded.v - reference) / (np.abs(reference) + 1e-30))
    if not agreement <= 1e-9:
        sys.exit(f"optimizer_reference.py: troupe's formula for {a.optimizer} in float64 differs "
                 f"from the reference by {agreement:.3g} (relative): not the same algorithm")
    with open(a.out, "wb") as f:
        f.write(b"TROUPEOPT1")
        f.write(struct.pack("<qq", a.n, a.steps))
        f.write(w0.astype("<f4").tobytes())
        f.write(grads.astype("<f4").tobytes())
        f.write(reference.astype("<f8").tobytes())
        f.write(bounded.e.astype("<f8").tobytes())


if __name__ == "__main__":
    main()
