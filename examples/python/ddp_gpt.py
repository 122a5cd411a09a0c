#!/usr/bin/env python3
"""A small GPT under PyTorch's DistributedDataParallel on troupe's torch.distributed backend, its
gradients sent 2-bit compressed by troupe's DDP communication hook (troupe.hooks).

    troupe launch -n 2 -- python3 examples/python/ddp_gpt.py                   # troupe, 2bit
    troupe launch -n 2 -- python3 examples/python/ddp_gpt.py --hook powersgd   # PyTorch's PowerSGD
    troupe launch -n 2 -- python3 examples/python/ddp_gpt.py --backend gloo --hook none

The model is GPT-2's layout as nanoGPT writes it (token and position embeddings; pre-norm blocks
of causal self-attention and a GELU MLP; the output layer tied to the token embedding), small
enough for a CPU core a rank, on byte-level tokens (256) of --text: English prose, by default the
licence texts every Debian system has (/usr/share/common-licenses, 0.3 MB; the suite's corpus,
--text /usr/share/dictd/gcide.dict.dz, is 40 MB, gzipped files read as such). The last tenth of the
bytes is held out. Each rank draws its own --batch-size windows of --block-size bytes a step;
DDP averages the gradients through --hook; AdamW. Rank 0 prints the held-out loss (nats per byte;
ln 256 = 5.55 at the start) every --eval-every steps and at the end.

  --hook 2bit      troupe.hooks: MXNet's 2-bit quantisation with error feedback (--threshold),
                   16x fewer bytes than float32;
  --hook fp16/bf16 troupe.hooks: 2x fewer bytes;
  --hook powersgd  torch.distributed.algorithms' PowerSGD (rank --powersgd-rank), for comparison;
  --hook none      DDP's own allreduce of float32.

Held-out loss after the default 300 steps on 2 ranks (torch 2.15; bench/ddp_gpt_hooks.py): 2.60
with none, 2.73 with PowerSGD, 3.41 with 2bit. MXNet's 2-bit quantisation sends +-threshold
or nothing for each value. A transformer under AdamW learns little beyond the bytes' frequencies
(3.45) that way, and other thresholds and SGD did no better. Least squares under DDP with it
converges (tests/python/test_hooks.py).
"""
import argparse
import glob
import gzip
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import troupe.hooks
import troupe.torch  # noqa: F401  (registers the "troupe" backend)


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def attention(self, x):
        b, t, c = x.shape
        q, k, v = (part.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for part in self.c_attn(x).split(c, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.n_head)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        y = scores.masked_fill(causal, float("-inf")).softmax(dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, mean=0.0, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        logits = self.ln_f(self.blocks(x)) @ self.wte.weight.t()  # tied to the token embedding
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def read_text(paths):
    # A folder's files, not its links (common-licenses links GPL to GPL-3: the text once).
    files = sorted(f for p in paths
                   for f in (glob.glob(os.path.join(p, "*")) if os.path.isdir(p) else [p])
                   if os.path.isfile(f) and not (os.path.isdir(p) and os.path.islink(f)))
    if not files:
        raise SystemExit(f"--text {' '.join(paths)}: no files")
    def contents(path):  # a gzipped file (dict-gcide's .dz) decompressed
        raw = open(path, "rb").read()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    data = b"".join(contents(f) for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def windows(data, generator, batch, block):
    starts = torch.randint(len(data) - block - 1, (batch,), generator=generator)
    x = torch.stack([data[s:s + block] for s in starts.tolist()])
    y = torch.stack([data[s + 1:s + 1 + block] for s in starts.tolist()])
    return x, y


def register_hook(model, a):
    if a.hook in ("2bit", "fp16", "bf16"):
        model.register_comm_hook(troupe.hooks.CompressionState(a.hook, threshold=a.threshold),
                                 troupe.hooks.compression_hook)
    elif a.hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None,
                                       matrix_approximation_rank=a.powersgd_rank,
                                       start_powerSGD_iter=2, use_error_feedback=True)
        model.register_comm_hook(state, powersgd.powerSGD_hook)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="troupe", help="troupe, or gloo to compare")
    ap.add_argument("--hook", default="2bit", choices=["2bit", "fp16", "bf16", "powersgd", "none"])
    ap.add_argument("--threshold", type=float, default=0.05, help="2bit's threshold")
    ap.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD's matrix rank")
    ap.add_argument("--text", nargs="+", default=["/usr/share/common-licenses"],
                    help="text files, or folders of them")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16, help="a rank's windows a step")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"],
                    help="AdamW (weight decay 0.1), or SGD with momentum 0.9")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=8)
    a = ap.parse_args()

    dist.init_process_group(a.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)  # the ranks share the machine's cores
    data = read_text(a.text)
    split = len(data) * 9 // 10
    train, held_out = data[:split], data[split:]
    torch.manual_seed(1)  # the same initial weights on every rank
    model = nn.parallel.DistributedDataParallel(
        GPT(256, a.block_size, a.n_layer, a.n_head, a.n_embd))
    register_hook(model, a)
    if a.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    draws = torch.Generator().manual_seed(1000 + rank)

    def held_out_loss():
        fixed = torch.Generator().manual_seed(7)
        with torch.no_grad():
            return sum(model.module(*windows(held_out, fixed, a.batch_size, a.block_size)).item()
                       for _ in range(a.eval_batches)) / a.eval_batches

    start, trained = time.perf_counter(), 0.0
    for step in range(1, a.steps + 1):
        began = time.perf_counter()
        opt.zero_grad()
        loss = model(*windows(train, draws, a.batch_size, a.block_size))
        loss.backward()
        opt.step()
        trained += time.perf_counter() - began
        if rank == 0 and (step % a.eval_every == 0 or step == a.steps):
            print(f"step {step}: train loss {loss.item():.3f}, held-out loss "
                  f"{held_out_loss():.3f}, {trained:.1f} s training", flush=True)
    if rank == 0:
        print(f"done: {a.steps} steps of {a.batch_size * world} windows, held-out loss "
              f"{held_out_loss():.3f}, {trained / a.steps * 1e3:.1f} ms a step ({world} rank(s), "
              f"{a.backend}, hook {a.hook}), {time.perf_counter() - start:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
