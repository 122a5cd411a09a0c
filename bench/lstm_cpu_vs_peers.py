#!/usr/bin/env python3
"""The LSTM language model's training on the CPU, troupe against PyTorch, side by side in one run.

The model of MXNet's and PyTorch's word language model examples (by default their medium one:
--nlayers 2 --nhid 650 --emsize 650, dropout 0.5, untied, PTB's vocabulary of 10,000 words),
their batch (--batch-size 20 sequences of --bptt 35 tokens) and optimizer (SGD, lr 20, gradient
clipping at a norm of 0.25), float32, the same thread count (--threads, every core by default),
timed per training step (forward, backward, clipping, update) after a warm-up step:
  troupe:  `troupe train --model lstm --train_data null` (random tokens made once: no reading),
           tokens/s of its second epoch from its CSV log (the first holds the warm-up);
  PyTorch: the examples' RNNModel written out (nn.Embedding, nn.Dropout, nn.LSTM with dropout
           between its layers, nn.Linear), in .venv-torch (torch 2.15 from PyPI, made if missing),
           eager, each sequence from a zero state as troupe's; the median step.
Each side's figure is printed as tokens/s, with the ratio.

    bash scripts/build.sh troupe_cli
    python3 bench/lstm_cpu_vs_peers.py [--steps 10] [--threads 2] [--nhid 650 --emsize 650]
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_bench_util import (median_step_seconds, parse_args_or_torch_side,  # noqa: E402
                           torch_median_step, troupe_tokens_per_sec)
from train_bench import add_int_flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-torch/bin/python")


# ---- PyTorch's side: run in .venv-torch by this file with --torch-side ----

def torch_side(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)

    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(a.dropout)
            self.encoder = nn.Embedding(a.vocab, a.emsize)
            self.rnn = nn.LSTM(a.emsize, a.nhid, a.nlayers, dropout=a.dropout, batch_first=True)
            self.decoder = nn.Linear(a.nhid, a.vocab)
            nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
            nn.init.zeros_(self.decoder.bias)

        def forward(self, tokens, targets):
            out, _ = self.rnn(self.drop(self.encoder(tokens)))
            logits = self.decoder(self.drop(out))
            return F.cross_entropy(logits.view(-1, a.vocab), targets.view(-1))

    model = RNNModel()
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    tokens = torch.randint(0, a.vocab, (a.batch_size, a.bptt + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()

    print(f"median_step_s {median_step_seconds(step, a.steps):.6f} torch {torch.__version__}")


def run_torch(a):
    return torch_median_step([VENV_PY, os.path.abspath(__file__), "--torch-side"] +
                             shared_args(a))


# ---- troupe ----

def run_troupe(a, work):
    cmd = [a.troupe, "train", "--model", "lstm", "--train_data", "null",
           "--epoch_size", str(a.steps * a.batch_size), "--num_epochs", "2",
           "--block_size", str(a.bptt), "--vocab_size", str(a.vocab), "--nlayers", str(a.nlayers),
           "--nhid", str(a.nhid), "--emsize", str(a.emsize), "--dropout", str(a.dropout),
           "--batch_size", str(a.batch_size), "--optimizer", "sgd", "--momentum", "0",
           "--base_learning_rate", str(a.lr), "--clip_grad_norm", str(a.clip),
           "--threads", str(a.threads), "--log_dir", work]
    return troupe_tokens_per_sec(cmd, work, "lstm")


def shared_args(a):
    return ["--steps", str(a.steps), "--bptt", str(a.bptt), "--batch-size", str(a.batch_size),
            "--threads", str(a.threads), "--nlayers", str(a.nlayers), "--nhid", str(a.nhid),
            "--emsize", str(a.emsize), "--vocab", str(a.vocab), "--dropout", str(a.dropout),
            "--lr", str(a.lr), "--clip", str(a.clip)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    add_int_flags(ap, steps=10, bptt=35, batch_size=20, threads=os.cpu_count(), nlayers=2,
                  nhid=650, emsize=650, vocab=10000)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=20.0)
    ap.add_argument("--clip", type=float, default=0.25)
    a, version = parse_args_or_torch_side(ap, torch_side)
    tokens = a.batch_size * a.bptt
    print(f"# LSTM LM {a.nlayers}x{a.nhid} (emsize {a.emsize}, vocabulary {a.vocab}, dropout "
          f"{a.dropout}), batch {a.batch_size} x {a.bptt} tokens, float32, SGD lr {a.lr} clip "
          f"{a.clip}, {a.threads} threads, {a.steps} steps; torch {version}", flush=True)
    with tempfile.TemporaryDirectory(prefix="troupe_lstm_bench_") as work:
        troupe = run_troupe(a, work)
    print(f"troupe             {troupe:10.0f} tokens/s", flush=True)
    torch_rate = tokens / run_torch(a)
    print(f"pytorch eager      {torch_rate:10.0f} tokens/s", flush=True)
    print(f"troupe / pytorch eager: {troupe / torch_rate:.2f}x")


if __name__ == "__main__":
    main()
