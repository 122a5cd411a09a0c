"""What the language models' reference scripts share (tests/gpt_reference.py,
tests/lstm_reference.py; the C++ side is tests/language_model_util.h, which gives the format).

Each reads troupe's model shape, its batch, and its weights before each of its training steps;
computes each step's loss with PyTorch in float64 at those weights, and a first-order bound on
what troupe's float32 computation of it may differ by (Higham, Accuracy and Stability of Numerical
Algorithms, 2nd ed., sections 3.1 and 3.3): every intermediate v troupe rounds carries a local
error of at most e_v elementwise (written beside each: gamma_n of the magnitudes for a sum or dot
product of n terms, a few ulps for an element-wise function), and the loss moves by at most
sum_v sum_i |dL/dv_i| e_v,i of them, dL/dv from float64 autograd at the same point. It also runs
its own float64 training from the first weights with the same SGD steps, for the log.
"""
import argparse
import math
import struct
import sys

import numpy as np
import torch

U = 2.0**-24  # float32's unit roundoff


def gamma(n):
    return n * U / (1 - n * U)


class Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, fmt):
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values

    def array(self, dtype, count):
        a = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at += a.nbytes
        return a


class Tracked:
    """The intermediates troupe rounds, each with its local error bound e_v."""

    def __init__(self):
        self.items = []

    def add(self, v, e):
        v.retain_grad()
        self.items.append((v, e.detach()))
        return v

    def bound(self):
        return sum(float((v.grad.abs() * e).sum()) for v, e in self.items if v.grad is not None)


def linear(track, x, w, b=None):
    """x w^T (+ b), troupe's inner product: a dot product of k terms plus the bias is within
    gamma_(k+1) of the magnitudes."""
    y = x @ w.t()
    mag = x.abs().detach() @ w.abs().detach().t()
    if b is not None:
        y = y + b
        mag = mag + b.abs().detach()
    return track.add(y, gamma(w.shape[1] + 1) * mag)


def softmax_loss(logits, labels, vocab):
    """The mean cross-entropy over every token, and its own rounding bound: each row's
    log-sum-exp takes the shifted logits (one rounding each), exp within 4 ulp, a sum of vocab
    terms (relative gamma_vocab, an absolute error of the log of that size), the log within 4
    ulp, then two subtractions. The rows are summed in double; the sum rounds to float32 once; the
    mean divides in double."""
    z = logits.reshape(-1, vocab)
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(1, labels.view(-1, 1)).view(-1)
    rows = lse - picked
    shift = (z - z.max(-1, keepdim=True).values).abs().max(-1).values.detach()
    e_rows = (gamma(vocab) + 6 * U + 4 * U * (lse - z.max(-1).values).abs() + 2 * U * shift
              + 2 * U * rows.abs()).detach()
    total = rows.sum()
    return total / rows.numel(), float((e_rows.sum() + U * total.abs()) / rows.numel())


def run(magic, shape_values, forward):
    """Reads --in (magic, then shape_values int64 values: the model's shape), answers --out.
    forward(p, shape, tokens, labels, track) gives the loss and its own rounding bound."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="inp", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    r = Reader(open(args.inp, "rb").read())
    if r.data[:len(magic)] != magic:
        sys.exit("%s is not a troupe %s dump" % (args.inp, magic.decode()))
    r.at = len(magic)
    shape = r.take("%dq" % shape_values)
    t, vocab, n, steps = r.take("4q")
    (lr,) = r.take("f")
    (count,) = r.take("q")
    names = []
    for _ in range(count):
        (length,) = r.take("q")
        name = r.data[r.at:r.at + length].decode()
        r.at += length
        (rank,) = r.take("q")
        names.append((name, r.take("%dq" % rank)))
    total = sum(math.prod(dims) for _, dims in names)
    tokens = torch.from_numpy(r.array(np.int32, n * t).astype(np.int64)).view(n, t)
    labels = torch.from_numpy(r.array(np.int32, n * t).astype(np.int64))
    shape = tuple(shape) + (t, vocab)

    def params(flat):
        p, at = {}, 0
        for name, dims in names:
            size = math.prod(dims)
            p[name] = torch.tensor(flat[at:at + size]).view(*dims).requires_grad_(True)
            at += size
        return p

    out = [magic + b"REF"]
    first = None
    for step in range(steps):
        flat = r.array(np.float32, total).astype(np.float64)
        if first is None:
            first = flat
        p = params(flat)
        track = Tracked()
        loss, e_loss = forward(p, shape, tokens, labels, track)
        loss.backward()
        out.append(struct.pack("<dd", float(loss), track.bound() + e_loss))
    # The own float64 training from the first weights: plain SGD, as the test steps.
    p = params(first)
    for step in range(steps):
        loss, _ = forward(p, shape, tokens, labels, Tracked())
        for v in p.values():
            v.grad = None
        loss.backward()
        with torch.no_grad():
            for v in p.values():
                v -= lr * v.grad
        out.append(struct.pack("<d", float(loss)))
    open(args.out, "wb").write(b"".join(out))
