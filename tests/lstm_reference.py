#!/usr/bin/python3
"""The reference side of the LSTM language model's test (tests/kernels_lstm_test.cc;
tests/lm_reference.py gives how).

troupe's model "lstm" without dropout: the encoder (a token embedding), nlayers layers of
torch.nn.LSTM, the decoder (tied to the encoder's weights, with its own bias, or not). Its shape
values: nlayers, nhid, emsize, tied. The loss is computed twice in float64: by torch.nn.LSTM
itself, and by the same equations written out step by step, whose intermediates carry the
rounding bound; the two must agree within 1e-9 relative (one computation in two orders), or the
script fails.
"""
import sys

import torch

from lm_reference import U, gamma, linear, run, softmax_loss


def lstm_layer(x, p, l, track):
    """nn.LSTM's layer l over x [n, t, input] from a zero state, step by step. Each step's gates
    are within gamma_(input + hidden + 3) of the magnitudes of their terms (two biases, two
    products); sigmoid 1 / (1 + e^-x) within 4 u relative and tanh 1 - 2 / (1 + e^2x) within 9 u
    absolute (kernels/cpu/vec.h); c = f c_prev + i g within gamma_2 of its terms; h = o tanh(c)
    one rounding."""
    w_ih, w_hh = p["rnn.weight_ih_l%d" % l], p["rnn.weight_hh_l%d" % l]
    b = p["rnn.bias_ih_l%d" % l] + p["rnn.bias_hh_l%d" % l]
    b_mag = (p["rnn.bias_ih_l%d" % l].abs() + p["rnn.bias_hh_l%d" % l].abs()).detach()
    n, t, _ = x.shape
    hid = w_hh.shape[1]
    k = w_ih.shape[1] + hid + 3
    h = torch.zeros(n, hid, dtype=torch.float64)
    c = torch.zeros(n, hid, dtype=torch.float64)
    out = []
    for s in range(t):
        xs = x[:, s]
        pre = xs @ w_ih.t() + h @ w_hh.t() + b
        mag = xs.abs() @ w_ih.abs().t() + h.abs() @ w_hh.abs().t() + b_mag
        pre = track.add(pre, gamma(k) * mag.detach())
        i, f, g, o = pre.split(hid, dim=1)
        i, f, o = torch.sigmoid(i), torch.sigmoid(f), torch.sigmoid(o)
        g = torch.tanh(g)
        i, f, o = (track.add(v, 4 * U * v.abs().detach()) for v in (i, f, o))
        g = track.add(g, torch.full_like(g, 9 * U))
        c_new = f * c + i * g
        c = track.add(c_new, gamma(2) * (f * c).abs().detach() + gamma(2) * (i * g).abs().detach())
        tc = track.add(torch.tanh(c), torch.full_like(c, 9 * U))
        h = o * tc
        h = track.add(h, U * h.abs().detach())
        out.append(h)
    return torch.stack(out, dim=1)


def forward(p, shape, tokens, labels, track):
    nlayers, nhid, emsize, tied, t, vocab = shape
    encoder = p["encoder.weight"]
    x = encoder[tokens]  # a copy: no rounding
    with torch.no_grad():
        module = torch.nn.LSTM(emsize, nhid, nlayers, batch_first=True).double()
        for name, value in module.named_parameters():
            value.copy_(p["rnn." + name])
        whole, _ = module(x)
    for l in range(nlayers):
        x = lstm_layer(x, p, l, track)
    difference = float((x - whole).abs().max())
    if difference > 1e-9 * max(1.0, float(whole.abs().max())):
        sys.exit("the LSTM written out differs from torch.nn.LSTM by %g" % difference)
    weight = encoder if tied else p["decoder.weight"]
    logits = linear(track, x, weight, p["decoder.bias"])
    return softmax_loss(logits, labels, vocab)


if __name__ == "__main__":
    run(b"TROUPELSTM1", 4, forward)
