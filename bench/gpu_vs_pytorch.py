#!/usr/bin/env python3
"""GPU training-step throughput, troupe's CUDA backend vs PyTorch eager, side by side in one run.

troupe: troupe_kernels_bench --device cuda:0 (forward + backward + SGD with momentum, on random
inputs already on the GPU; the kernels-level figure, without the actors). PyTorch: torchvision's
model of the same name, cudnn.benchmark, channels_last, SGD with momentum 0.9, random inputs already
on the GPU, timed after warm-up steps with the GPU synchronised at both ends. Precision: fp32 with
TF32 off on both sides, fp32 with TF32 on (troupe --tf32; PyTorch's allow_tf32 flags), and mixed
precision: bf16 and fp16 (troupe --precision; PyTorch's autocast to the same type, fp16 with a
GradScaler, whose unscale and inf test troupe's fp16 step does too). troupe's images are NHWC where
tensor cores compute (tf32, bf16, fp16: its memory_format auto), NCHW in strict fp32.
torch.compile is timed too when --compile is given (it compiles for a minute or more), or alone
with --compile-only (beside the eager and troupe rows of an earlier run at the same batch). Peak GPU
memory: troupe's allocator's peak in use, torch.cuda.max_memory_allocated for PyTorch.
troupe's convolutions go its default way (TROUPE_CUDA_CONV=auto: cuDNN's graph-API plans for bf16
and fp16, its legacy calls for fp32 and tf32). With --other-conv, each troupe row runs a second time
the other way (legacy for bf16 and fp16, graph for fp32 and tf32), in a column of its own. With
--cuda-graphs, once more with each step's forward and backward by a CUDA graph (troupe_kernels_bench
--graphs; a run's cuda_graphs), its ratio to PyTorch eager beside it.

Run on the GPU machine by scripts/gpu.sh run; by hand:
    python3 bench/gpu_vs_pytorch.py --bench build/bench/troupe_kernels_bench --batches 64,128,256
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def troupe_rate(bench, model, batch, seconds, tf32, precision="fp32", conv=None, graphs=False):
    # troupe's memory_format auto: channels-last where tensor cores compute (tf32, bf16, fp16).
    nhwc = tf32 or precision != "fp32"
    cmd = [bench, "--device", "cuda:0", "--models", model, "--batch", str(batch), "--seconds",
           str(seconds), "--no-ops", "--precision", precision] + (["--tf32"] if tf32 else []) + \
          (["--channels-last"] if nhwc else []) + (["--graphs"] if graphs else [])
    env = dict(os.environ)
    env.pop("TROUPE_CUDA_CONV", None)  # the backend's default way, unless named
    if conv:
        env["TROUPE_CUDA_CONV"] = conv
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    m = re.search(r"samples/s=(\d+).*peak_memory_mib=(\d+)", p.stdout)
    if p.returncode != 0 or not m:
        return {"error": p.stdout[-2000:]}
    # What the CUDA backend said of its ways (a batch norm cuDNN refused for this type and layout,
    # which costs speed): kept with the row.
    notes = [line for line in p.stdout.splitlines() if line.startswith("troupe cuda:")]
    # The host's share of a step (the wall time it spent queueing the work): near the step's own
    # time, the host sets the pace.
    host = re.search(r"\(([\d.]+) ms/step, cpu [\d.]+ ms/step, host ([\d.]+) ms/step\)",
                     p.stdout)
    row = {"rate": float(m.group(1)), "peak_mib": float(m.group(2)), "notes": notes}
    # Steps replayed by CUDA graphs / graphs recorded, and why none were, if so.
    g = re.search(r"graphs=(\d+)/(\d+)(?: \(graphs off: (.*)\))?$", p.stdout, re.M)
    if g:
        row["graph_replays"], row["graphs"] = int(g.group(1)), int(g.group(2))
        if g.group(3):
            row["graphs_off"] = g.group(3)
    if host:
        row["step_ms"], row["host_ms"] = float(host.group(1)), float(host.group(2))
    # Where the peak goes: the net's activations and gradients, the parameters' tensors, the
    # convolutions' workspace (the rest: the images, scratch and the allocator's rounding).
    split = re.search(r"\(net (\d+), parameters (\d+), workspace (\d+)\)", p.stdout)
    if split:
        row["net_mib"], row["parameters_mib"], row["workspace_mib"] = map(float, split.groups())
    return row


def pytorch_rate(*args, **kwargs):
    try:
        return pytorch_timed(*args, **kwargs)
    except Exception as e:  # a row that fails is reported, the others still run
        return {"error": f"{type(e).__name__}: {e}"[-2000:]}


def pytorch_timed(model_name, batch, seconds, tf32, compile_model=False, precision="fp32",
                  warmup=10, inputs=None):
    """images/s and peak MiB of PyTorch's training loop. inputs: a function giving each step's
    images and labels on the GPU (a DataLoader's, say); default: the same random ones every
    step, made once on the GPU."""
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(1)
    model = getattr(torchvision.models, model_name)(num_classes=1000).cuda()
    model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if inputs is None:
        fixed = (torch.randn(batch, 3, 224, 224, device="cuda")
                 .to(memory_format=torch.channels_last),
                 torch.randint(0, 1000, (batch,), device="cuda"))
        inputs = lambda: fixed  # noqa: E731
    step_model = torch.compile(model) if compile_model else model
    loss_fn = torch.nn.CrossEntropyLoss()
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None

    def step():
        x, y = inputs()
        opt.zero_grad(set_to_none=True)
        if amp is None:
            loss_fn(step_model(x), y).backward()
            opt.step()
            return
        with torch.autocast("cuda", dtype=amp):
            loss = loss_fn(step_model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    began = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - began
    torch.cuda.reset_peak_memory_stats()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
        if steps % 5 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    rate = batch * steps / elapsed
    # What the warm-up steps took beyond as many timed ones (cudnn.benchmark's trials, the
    # allocator's first allocations, a compilation).
    return {"rate": rate, "peak_mib": torch.cuda.max_memory_allocated() / 2**20,
            "warmup_extra_s": warmup_s - warmup * batch / rate}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", default="build/bench/troupe_kernels_bench")
    ap.add_argument("--models", default="resnet50")
    ap.add_argument("--batches", default="64,128,256")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-only", action="store_true",
                    help="time torch.compile alone, not troupe or PyTorch eager")
    ap.add_argument("--other-conv", action="store_true",
                    help="troupe again with its convolutions the way its default does not take "
                         "for the row's type (legacy for bf16 and fp16, graph for fp32 and tf32), "
                         "in a column of its own")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="troupe again with each step by a CUDA graph, in a column of its own")
    ap.add_argument("--precisions", default="bf16,fp32,fp16,tf32",
                    help="rows to time, in this order: bf16 and fp16 (mixed precision), fp32 "
                         "(TF32 off), tf32")
    a = ap.parse_args()
    rows = []
    # Precision outermost: a run cut short by its time limit has every batch of the first ones.
    for model in a.models.split(","):
        for precision in a.precisions.split(","):
            for batch in [int(b) for b in a.batches.split(",")]:
                tf32 = precision == "tf32"
                kind = "fp32" if tf32 else precision
                row = {"model": model, "batch": batch, "precision": precision, "troupe": {},
                       "pytorch": {}}
                if not a.compile_only:
                    row["troupe"] = troupe_rate(a.bench, model, batch, a.seconds, tf32, kind)
                    if a.other_conv:
                        other = "graph" if kind == "fp32" else "legacy"
                        row["troupe_other_conv"] = troupe_rate(a.bench, model, batch, a.seconds,
                                                               tf32, kind, conv=other)
                        row["troupe_other_conv"]["conv"] = other
                    if a.cuda_graphs:
                        row["troupe_cuda_graphs"] = troupe_rate(a.bench, model, batch, a.seconds,
                                                                tf32, kind, graphs=True)
                    row["pytorch"] = pytorch_rate(model, batch, a.seconds, tf32, precision=kind)
                if a.compile or a.compile_only:
                    row["pytorch_compile"] = pytorch_rate(model, batch, a.seconds, tf32, True,
                                                          precision=kind)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| model | batch | precision | troupe images/s | PyTorch eager images/s | "
          "troupe / eager | troupe peak MiB | PyTorch peak MiB | torch.compile images/s | "
          "troupe ms/step (host's) | "
          "troupe, convolutions the other way: images/s (ms/step, host's) | "
          "troupe by CUDA graphs images/s (ms/step, host's) | CUDA graphs / eager |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    def graph_cell(g):
        if g is None:
            return " - |"
        if "rate" not in g:
            return " failed |"
        host = f", {g['step_ms']:.1f} ({g['host_ms']:.1f})" if "host_ms" in g else ""
        way = f" {g['conv']}" if "conv" in g else ""
        return f" {g['rate']:.0f}{host}{way} |"

    def cuda_graphs_ratio(r):
        g, p = r.get("troupe_cuda_graphs"), r["pytorch"]
        if g is None or "rate" not in g or "rate" not in p:
            return " - |"
        off = f" (off: {g['graphs_off']})" if "graphs_off" in g else \
            " (no step replayed)" if g.get("graph_replays") == 0 else ""
        return f" {g['rate'] / p['rate']:.2f}{off} |"

    def num(d, key):
        return f"{d[key]:.0f}" if key in d else "failed" if d else "-"

    for r in rows:
        t, p = r["troupe"], r["pytorch"]
        ratio = f"{t['rate'] / p['rate']:.2f}" if "rate" in t and "rate" in p else "-"
        comp = r.get("pytorch_compile", {})
        print(f"| {r['model']} | {r['batch']} | {r['precision']} | "
              f"{num(t, 'rate')} | {num(p, 'rate')} | {ratio} | {num(t, 'peak_mib')} | "
              f"{num(p, 'peak_mib')} | {num(comp, 'rate') if comp else '-'} | "
              + (f"{t['step_ms']:.1f} ({t['host_ms']:.1f}) |" if "host_ms" in t else "- |")
              + graph_cell(r.get("troupe_other_conv")) + graph_cell(r.get("troupe_cuda_graphs"))
              + cuda_graphs_ratio(r))
    failed = [(side, r) for r in rows
              for side in ("troupe", "troupe_other_conv", "troupe_cuda_graphs", "pytorch",
                           "pytorch_compile")
              if "error" in r.get(side, {})]
    for side, r in failed[:2]:
        print(f"\n{side} failed at {r['model']} batch {r['batch']}:\n{r[side]['error']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
