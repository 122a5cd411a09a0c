#!/usr/bin/python3
"""The reference side of the GPT test (tests/kernels_gpt_test.cc).

Reads troupe's GPT (nanoGPT's layout: pre-norm blocks, causal attention, a GELU MLP, tied output
layer), its batch, and its weights before each of its training steps; computes each step's loss
with PyTorch in float64 at those weights, and a first-order bound on what troupe's float32
computation of it may differ by (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
sections 3.1 and 3.3): every intermediate v troupe rounds carries a local error of at most e_v
elementwise (written beside each below: gamma_n of the magnitudes for a sum or dot product of n
terms, a few ulps for an element-wise function), and the loss moves by at most
sum_v sum_i |dL/dv_i| e_v,i of them, dL/dv from float64 autograd at the same point. It also runs
its own float64 training from the first weights with the same SGD steps, for the log.

Input --in: b"TROUPEGPT1", int64 n_layer, n_head, n_embd, block_size, vocab, batch, steps,
float32 lr, int64 params, then per parameter int64 name length, name, int64 rank, int64 dims
[rank] (in the flat weights' order); int32
tokens[batch * block_size], int32 labels[batch * block_size]; per step float32 weights[total].
Output --out: b"TROUPEGPTREF1", per step float64 loss, float64 bound; then per step float64 the
own training's loss.
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


def forward(p, cfg, tokens, labels, track):
    n_layer, n_head, c, t, vocab = cfg
    n = tokens.shape[0]
    hs = c // n_head
    # Embedding: one add.
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][:t]
    x = track.add(x, U * x.abs())

    def layer_norm(x, name):
        w, b = p[name + ".weight"], p[name + ".bias"]
        mean = x.mean(-1, keepdim=True)
        centred = x - mean
        rstd = 1 / torch.sqrt((centred * centred).mean(-1, keepdim=True) + 1e-5)
        y = centred * rstd * w + b
        # The mean's error (gamma_c of the mean of |x|, twice: it is subtracted), and rstd's
        # relative error (the variance's sum, halved by the root, plus 6 roundings), scale the
        # normalised value; 3 more roundings of y.
        e = (w.abs() * rstd * (2 * gamma(c) * x.abs().mean(-1, keepdim=True)
                               + (gamma(c) + 6 * U) * centred.abs())).detach()
        return track.add(y, e + 3 * U * y.abs().detach())

    def linear(x, name, weight=None, bias=True):
        w = p[name + ".weight"] if weight is None else weight
        y = x @ w.t()
        k = w.shape[1]
        mag = x.abs().detach() @ w.abs().detach().t()
        if bias:
            b = p[name + ".bias"]
            y = y + b
            mag = mag + b.abs().detach()
        # A dot product of k terms plus the bias: gamma_(k+1) of the magnitudes.
        return track.add(y, gamma(k + 1) * mag)

    for layer in range(n_layer):
        pre = "transformer.h.%d" % layer
        qkv = linear(layer_norm(x, pre + ".ln_1"), pre + ".attn.c_attn")
        q, k, v = qkv.split(c, dim=2)
        q = q.view(n, t, n_head, hs).transpose(1, 2)
        k = k.view(n, t, n_head, hs).transpose(1, 2)
        v = v.view(n, t, n_head, hs).transpose(1, 2)
        scale = 1 / math.sqrt(hs)
        s = (q @ k.transpose(-2, -1)) * scale
        # Scores: a dot product of hs terms and the scale, gamma_(hs+1).
        s = track.add(s, gamma(hs + 1) * (q.abs() @ k.abs().transpose(-2, -1)).detach() * scale)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
        att = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
        # Weights: exp within 4 ulp of the shifted score (the shift rounds too), a sum of up to t
        # terms, a reciprocal and a product: (8 + t + 2) u relative at most.
        att = track.add(att, (gamma(t) + 10 * U) * att.abs().detach())
        y = att @ v
        # A weighted sum of up to t values: gamma_t.
        y = track.add(y, gamma(t) * (att.abs() @ v.abs()).detach())
        y = y.transpose(1, 2).contiguous().view(n, t, c)
        a = linear(y, pre + ".attn.c_proj")
        x = x + a
        x = track.add(x, U * x.abs().detach())
        h = linear(layer_norm(x, pre + ".ln_2"), pre + ".mlp.c_fc")
        inner = math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)
        g = 0.5 * h * (1 + torch.tanh(inner))
        # tanh within 4 ulp of its argument, whose own 4 roundings move it by 4u |inner| at slope
        # at most 1; then 3 roundings of the product.
        g = track.add(g, (0.5 * h.abs() * (4 * U * inner.abs() + 4 * U) + 3 * U * g.abs()).detach())
        m = linear(g, pre + ".mlp.c_proj")
        x = x + m
        x = track.add(x, U * x.abs().detach())
    x = layer_norm(x, "transformer.ln_f")
    logits = linear(x, "lm_head", weight=p["transformer.wte.weight"], bias=False)
    z = logits.view(-1, vocab)
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(1, labels.view(-1, 1)).view(-1)
    rows = lse - picked
    # Each row's log-sum-exp: the shifted logits (one rounding each), exp within 4 ulp, a sum of
    # vocab terms (relative gamma_vocab, an absolute error of the log of that size), the log
    # within 4 ulp, then two subtractions. The rows are summed in double; the sum rounds to
    # float32 once; the mean divides in double.
    shift = (z - z.max(-1, keepdim=True).values).abs().max(-1).values.detach()
    e_rows = (gamma(vocab) + 6 * U + 4 * U * (lse - z.max(-1).values).abs() + 2 * U * shift
              + 2 * U * rows.abs()).detach()
    total = rows.sum()
    return total / rows.numel(), float((e_rows.sum() + U * total.abs()) / rows.numel())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="inp", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    r = Reader(open(args.inp, "rb").read())
    if r.data[:10] != b"TROUPEGPT1":
        sys.exit("gpt_reference: %s is not a troupe GPT dump" % args.inp)
    r.at = 10
    n_layer, n_head, c, t, vocab, n, steps = r.take("7q")
    (lr,) = r.take("f")
    (count,) = r.take("q")
    names = []
    for _ in range(count):
        (length,) = r.take("q")
        name = r.data[r.at:r.at + length].decode()
        r.at += length
        (rank,) = r.take("q")
        names.append((name, r.take("%dq" % rank)))
    total = sum(math.prod(shape) for _, shape in names)
    tokens = torch.from_numpy(r.array(np.int32, n * t).astype(np.int64)).view(n, t)
    labels = torch.from_numpy(r.array(np.int32, n * t).astype(np.int64))
    cfg = (n_layer, n_head, c, t, vocab)

    def params(flat):
        p, at = {}, 0
        for name, shape in names:
            size = math.prod(shape)
            p[name] = torch.tensor(flat[at:at + size]).view(*shape).requires_grad_(True)
            at += size
        return p

    out = [b"TROUPEGPTREF1"]
    first = None
    for step in range(steps):
        flat = r.array(np.float32, total).astype(np.float64)
        if first is None:
            first = flat
        p = params(flat)
        track = Tracked()
        loss, e_loss = forward(p, cfg, tokens, labels, track)
        loss.backward()
        bound = track.bound() + e_loss
        out.append(struct.pack("<dd", float(loss), bound))
    # The own float64 training from the first weights: plain SGD, as the test steps.
    p = params(first)
    for step in range(steps):
        loss, _ = forward(p, cfg, tokens, labels, Tracked())
        for v in p.values():
            v.grad = None
        loss.backward()
        with torch.no_grad():
            for v in p.values():
                v -= lr * v.grad
        out.append(struct.pack("<d", float(loss)))
    open(args.out, "wb").write(b"".join(out))


if __name__ == "__main__":
    main()
