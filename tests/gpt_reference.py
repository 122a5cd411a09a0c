#!/usr/bin/python3
"""The reference side of the GPT test (tests/kernels_gpt_test.cc; tests/lm_reference.py gives how).

troupe's GPT is nanoGPT's layout: pre-norm blocks, causal attention, a GELU MLP, the output layer
tied to the token embedding. Its shape values: n_layer, n_head, n_embd.
"""
import math

import torch

from lm_reference import U, gamma, linear, run, softmax_loss


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

    def lin(x, name):
        return linear(track, x, p[name + ".weight"], p[name + ".bias"])

    for layer in range(n_layer):
        pre = "transformer.h.%d" % layer
        qkv = lin(layer_norm(x, pre + ".ln_1"), pre + ".attn.c_attn")
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
        a = lin(y, pre + ".attn.c_proj")
        x = x + a
        x = track.add(x, U * x.abs().detach())
        h = lin(layer_norm(x, pre + ".ln_2"), pre + ".mlp.c_fc")
        inner = math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)
        g = 0.5 * h * (1 + torch.tanh(inner))
        # tanh within 4 ulp of its argument, whose own 4 roundings move it by 4u |inner| at slope
        # at most 1; then 3 roundings of the product.
        g = track.add(g, (0.5 * h.abs() * (4 * U * inner.abs() + 4 * U) + 3 * U * g.abs()).detach())
        m = lin(g, pre + ".mlp.c_proj")
        x = x + m
        x = track.add(x, U * x.abs().detach())
    x = layer_norm(x, "transformer.ln_f")
    logits = linear(track, x, p["transformer.wte.weight"])
    return softmax_loss(logits, labels, vocab)


if __name__ == "__main__":
    run(b"TROUPEGPT1", 3, forward)
