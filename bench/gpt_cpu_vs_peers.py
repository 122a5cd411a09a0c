#!/usr/bin/env python3
"""GPT-2 training on the CPU, troupe against PyTorch and llm.c, side by side in one run.

The same model (GPT-2's layout; by default 124M: --n-layer 12 --n-head 12 --n-embd 768, vocabulary
50257), batch (--batch-size 4 sequences of --seq 256 tokens), float32, AdamW (lr 1e-4, no weight
decay, as llm.c's train_gpt2.c steps) and thread count (--threads, every core by default), timed
per training step (forward, backward, update) after a warm-up step:
  troupe:  `troupe train --model gpt2 --train_data null` (random tokens made once: no reading),
           tokens/s of its second epoch from its CSV log (the first holds the warm-up);
  PyTorch: nanoGPT's model written out (F.scaled_dot_product_attention, GELU tanh, tied output
           layer) in .venv-torch (torch 2.15 from PyPI, made if missing), eager, and with
           --compile torch.compile's too;
  llm.c:   its CPU trainer train_gpt2.c, from a checkout or the mirror of karpathy/llm.c
           (--llmc), built here with its Makefile's flags (-Ofast -march=native -fopenmp), its B
           and T set to ours, its sampling and validation left out of the timed loop; its model
           file (random weights, llm.c's layout and padded vocabulary) and token files are
           written here, since nothing can be downloaded.
Each side's median step time over --steps steps is printed as tokens/s, with the ratios.

    bash scripts/build.sh troupe_cli
    python3 bench/gpt_cpu_vs_peers.py [--steps 5] [--seq 256] [--threads 2] [--compile]
        [--llmc /work/.mirror/karpathy+llm.c/repo]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lm_bench_util import (median_step_seconds, parse_args_or_torch_side,  # noqa: E402
                           torch_median_step, troupe_tokens_per_sec)
from train_bench import add_int_flags  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PY = os.path.join(ROOT, ".venv-torch/bin/python")
LLMC_MIRROR = "/work/.mirror/karpathy+llm.c/repo"
VOCAB = 50257


# ---- PyTorch's side: run in .venv-torch by this file with --torch-side ----

def torch_side(a):
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)

    class Block(nn.Module):
        def __init__(self, c, heads):
            super().__init__()
            self.heads = heads
            self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
            self.c_attn, self.c_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            n, t, c = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
            q, k, v = (z.view(n, t, self.heads, c // self.heads).transpose(1, 2)
                       for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(n, t, c))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(VOCAB, a.n_embd)
            self.wpe = nn.Embedding(a.seq, a.n_embd)
            self.blocks = nn.ModuleList(Block(a.n_embd, a.n_head) for _ in range(a.n_layer))
            self.ln_f = nn.LayerNorm(a.n_embd)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)
            for b in self.blocks:
                nn.init.normal_(b.c_proj.weight, std=0.02 / math.sqrt(2 * a.n_layer))
                nn.init.normal_(b.mlp_proj.weight, std=0.02 / math.sqrt(2 * a.n_layer))

        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()
            return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    step_fn = model
    if a.compile:
        step_fn = torch.compile(model)
    tokens = torch.randint(0, VOCAB, (a.batch_size, a.seq + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    print(f"median_step_s {median_step_seconds(step, a.steps):.6f} torch {torch.__version__}")


def run_torch(a, compiled):
    cmd = [VENV_PY, os.path.abspath(__file__), "--torch-side", "--steps", str(a.steps),
           "--seq", str(a.seq), "--batch-size", str(a.batch_size), "--threads", str(a.threads),
           "--n-layer", str(a.n_layer), "--n-head", str(a.n_head), "--n-embd", str(a.n_embd)]
    if compiled:
        cmd.append("--compile")
    return torch_median_step(cmd)


# ---- troupe ----

def run_troupe(a, work):
    steps_per_epoch = a.steps
    cmd = [a.troupe, "train", "--model", "gpt2", "--train_data", "null",
           "--epoch_size", str(steps_per_epoch * a.batch_size), "--num_epochs", "2",
           "--block_size", str(a.seq), "--vocab_size", str(VOCAB), "--n_layer", str(a.n_layer),
           "--n_head", str(a.n_head), "--n_embd", str(a.n_embd), "--batch_size",
           str(a.batch_size), "--optimizer", "adamw", "--base_learning_rate", "0.0001",
           "--weight_decay", "0", "--threads", str(a.threads), "--log_dir", work]
    return troupe_tokens_per_sec(cmd, work, "gpt2")


# ---- llm.c ----

def llmc_sources(llmc, into):
    """train_gpt2.c and its llmc/ headers from a checkout or a bare mirror."""
    if os.path.exists(os.path.join(llmc, "train_gpt2.c")):
        shutil.copy(os.path.join(llmc, "train_gpt2.c"), into)
        shutil.copytree(os.path.join(llmc, "llmc"), os.path.join(into, "llmc"))
    else:
        archive = subprocess.run(["git", "--git-dir", llmc, "archive", "HEAD", "train_gpt2.c",
                                  "llmc"], stdout=subprocess.PIPE, check=True).stdout
        subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    git_dir = os.path.join(llmc, ".git") if os.path.isdir(os.path.join(llmc, ".git")) else llmc
    return subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "--short", "HEAD"],
                          stdout=subprocess.PIPE, text=True).stdout.strip()


def write_llmc_inputs(a, work):
    """llm.c's model file (header 20240326 version 3, parameters in its order, the vocabulary
    padded to a multiple of 128) with random weights, and its token files."""
    import numpy as np
    rng = np.random.default_rng(1)
    c, layers, vp, maxt = a.n_embd, a.n_layer, (VOCAB + 127) // 128 * 128, max(a.seq, 1024)
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, maxt, VOCAB, layers, a.n_head, c, vp]
    shapes = [(vp, c), (maxt, c), (layers, c), (layers, c), (layers, 3 * c, c), (layers, 3 * c),
              (layers, c, c), (layers, c), (layers, c), (layers, c), (layers, 4 * c, c),
              (layers, 4 * c), (layers, c, 4 * c), (layers, c), (c,), (c,)]
    ones = {2, 8, 14}  # the layer norms' scales
    with open(os.path.join(work, "gpt2_124M.bin"), "wb") as f:
        f.write(header.tobytes())
        for i, shape in enumerate(shapes):
            if i in ones:
                f.write(np.ones(shape, np.float32).tobytes())
            elif len(shape) >= 2 and i not in (3, 5, 7, 9, 11, 13):
                f.write((rng.standard_normal(shape, np.float32) * 0.02).tobytes())
            else:
                f.write(np.zeros(shape, np.float32).tobytes())
    data = os.path.join(work, "dev/data/tinyshakespeare")
    os.makedirs(data, exist_ok=True)
    for split, count in (("train", 1 << 20), ("val", 1 << 16)):
        head = np.zeros(256, np.int32)
        head[:3] = [20240520, 1, count]
        tokens = rng.integers(0, VOCAB, count, dtype=np.uint16)
        with open(os.path.join(data, f"tiny_shakespeare_{split}.bin"), "wb") as f:
            f.write(head.tobytes() + tokens.tobytes())


def run_llmc(a, work):
    commit = llmc_sources(a.llmc, work)
    src = os.path.join(work, "train_gpt2.c")
    text = open(src).read()
    edits = (("int B = 4;", f"int B = {a.batch_size};"), ("int T = 64;", f"int T = {a.seq};"),
             ("step <= 40", f"step <= {a.steps}"), ("if (step % 10 == 0)", "if (0)"),
             ("if (step > 0 && step % 20 == 0)", "if (0)"))
    for old, new in edits:
        if old not in text:
            sys.exit(f"llm.c's train_gpt2.c (commit {commit}) no longer has '{old}'")
        text = text.replace(old, new)
    open(src, "w").write(text)
    subprocess.run(["gcc", "-Ofast", "-march=native", "-fopenmp", "-DOMP", "-Wno-unused-result",
                    "-I" + work, src, "-lm", "-o", os.path.join(work, "train_gpt2")], check=True)
    write_llmc_inputs(a, work)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    r = subprocess.run([os.path.join(work, "train_gpt2")], cwd=work, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    took = [float(t) for t in re.findall(r"step \d+: train loss \S+ \(took ([0-9.]+) ms\)",
                                         r.stdout)]
    if r.returncode != 0 or len(took) < 2:
        sys.exit(f"llm.c failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return statistics.median(took[1:]) / 1000, commit


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    ap.add_argument("--llmc", default=LLMC_MIRROR, help="llm.c checkout or mirror ('' to skip)")
    add_int_flags(ap, steps=5, seq=256, batch_size=4, threads=os.cpu_count(), n_layer=12,
                  n_head=12, n_embd=768)
    ap.add_argument("--compile", action="store_true", help="torch.compile's side too")
    a, version = parse_args_or_torch_side(ap, torch_side)
    tokens = a.batch_size * a.seq
    print(f"# GPT-2 L{a.n_layer} H{a.n_head} C{a.n_embd}, batch {a.batch_size} x {a.seq} tokens, "
          f"float32, AdamW, {a.threads} threads, median of {a.steps} steps; torch {version}",
          flush=True)
    rates = {}
    with tempfile.TemporaryDirectory(prefix="troupe_gpt_bench_") as work:
        rates["troupe"] = run_troupe(a, work)
        print(f"troupe             {rates['troupe']:10.0f} tokens/s", flush=True)
    rates["pytorch eager"] = tokens / run_torch(a, False)
    print(f"pytorch eager      {rates['pytorch eager']:10.0f} tokens/s", flush=True)
    if a.compile:
        rates["torch.compile"] = tokens / run_torch(a, True)
        print(f"torch.compile      {rates['torch.compile']:10.0f} tokens/s", flush=True)
    if a.llmc:
        with tempfile.TemporaryDirectory(prefix="troupe_llmc_") as work:
            seconds, commit = run_llmc(a, work)
        rates[f"llm.c {commit}"] = tokens / seconds
        print(f"llm.c {commit:12} {rates[f'llm.c {commit}']:10.0f} tokens/s", flush=True)
    for name, rate in rates.items():
        if name != "troupe":
            print(f"troupe / {name}: {rates['troupe'] / rate:.2f}x")


if __name__ == "__main__":
    main()
