#!/usr/bin/env python3
"""ResNet-50's whole training loop on the GPU, `troupe train` vs a PyTorch training loop, side by
side in one run, with troupe_kernels_bench (the same steps without the actors) beside them.

Every row is one batch and precision (fp32 with TF32 off; bf16 and fp16: mixed precision, fp16
with a dynamic loss scale on both sides), SGD with momentum 0.9, learning rate 0.01, no weight
decay, 1000 classes, 224x224 images:
  kernels bench:   troupe_kernels_bench --device cuda:0 (forward, backward and SGD on inputs
                   already on the GPU): what the trainer's steps cost without the actors.
  troupe train:    (a) synthetic: `--train_data null` (the same random batch sent every step);
                   (b) JPEG: the database below, decoded by its reader's --decode_threads
                   threads, the Inception crop to 224, a random mirror, ImageNet's mean and std.
                   Each by CUDA graphs (cuda_graphs auto, the default on GPUs), and with
                   --op-by-op, synthetic, once op by op (--cuda_graphs false) too.
                   Two epochs each: the first warms up (cuDNN's plans, the
                   graph's recording); the figure is the second's inputs/s from the trainer's
                   own log line, and the peak of every tensor and workspace the process held on
                   the GPU in that epoch's steps (the replica's, the updater's: its allocators').
  PyTorch:         torchvision's resnet50, channels_last, cudnn.benchmark, autocast to the
                   row's type (fp16 with a GradScaler): (a) synthetic: random tensors made once
                   on the GPU; (b) DataLoader: torchvision's transforms of the same JPEG bytes
                   (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize) in
                   --threads worker processes, pinned, copied to the GPU each step. Timed after
                   warm-up steps (5; with the DataLoader, 2 a worker); peak =
                   torch.cuda.max_memory_allocated.
  torch.compile:   the synthetic loop compiled (a minute or more each), for --compile-rows.
The JPEGs: --images crops of ImageNet's typical size (500x375), cut from the sample photographs
of scikit-image's and scikit-learn's wheels, re-encoded at quality 75-95 (bench/input_vs_peers.py
makes them); troupe reads them from an LMDB of encoded Datum records, PyTorch from memory.
Goals (issue 34): troupe train within 5% of the kernels bench; at least 1.3x PyTorch eager and
1.1x torch.compile; peak memory at or below PyTorch's.

Run on the GPU machine by scripts/gpu.sh run; by hand:
    python3 bench/train_gpu_vs_pytorch.py --troupe build/bin/troupe \\
        --bench build/bench/troupe_kernels_bench --batches 64,128,256
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_vs_pytorch import pytorch_timed, troupe_rate  # noqa: E402
from input_vs_peers import MEAN, STD, jpeg_bytes, make_photos, torchvision_dataset  # noqa: E402


class Clock:
    """The run's budget: each subprocess gets what is left, and a row is not started without
    `least` seconds."""

    def __init__(self, budget):
        self.end = time.monotonic() + budget

    def left(self):
        return self.end - time.monotonic()


def run_logged(cmd, log, timeout):
    """Runs cmd, its output in the file log; (exit status or "timeout", output)."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=max(1, timeout))
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace"), "timeout"
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n" + out)
    return rc, out


def troupe_train(a, clock, name, batch, precision, epoch_size, data, graphs=True):
    """images/s and peak MiB of the second epoch of `troupe train`, from its own log lines."""
    cmd = [a.troupe, "train", "--model", "resnet50", "--num_channels", "3", "--num_labels", "1000",
           "--batch_size", str(batch), "--epoch_size", str(epoch_size), "--num_epochs", "2",
           "--gpus", "0", "--precision", precision, "--base_learning_rate", "0.01",
           "--momentum", "0.9", "--weight_decay", "0", "--log_every", "0",
           "--log_dir", os.path.join(a.work, name), "--checkpoint_dir",
           os.path.join(a.work, name, "ck")] + ([] if graphs else ["--cuda_graphs", "false"])
    if data is None:
        cmd += ["--train_data", "null", "--image_size", "224"]
    else:
        cmd += ["--train_data", data, "--crop", "224", "--random_resized_crop", "--mirror",
                "--mean_per_channel", ",".join(f"{255 * m:g}" for m in reversed(MEAN)),
                "--std_per_channel", ",".join(f"{255 * s:g}" for s in reversed(STD)),
                "--decode_threads", str(a.threads)]
    rc, out = run_logged(cmd, os.path.join(a.logs, name + ".txt"), min(a.row_limit, clock.left()))
    rate = re.search(r"epoch 2 done: .*, ([\d.]+) inputs/s", out)
    first = re.search(r"epoch 1 done: .*\(\d+ inputs in ([\d.]+) s", out)
    peak = re.findall(r"gpu memory: peak ([\d.]+) MiB", out)
    if rc != 0 or not rate:
        return {"error": f"exit {rc}: " + out[-1500:]}
    row = {"rate": float(rate.group(1)), "peak_mib": float(peak[-1]) if peak else None}
    if first:  # what the first epoch took beyond the second (cuDNN's plans, the first allocations)
        row["warmup_extra_s"] = float(first.group(1)) - epoch_size / row["rate"]
    waited = re.search(r"epoch 2 input: .* waited ([\d.]+) s for batches", out)
    if waited:
        row["input_wait_s"] = float(waited.group(1))
    if graphs:
        row["graphs"] = "replayed" if "steps replayed from a CUDA graph" in out else \
            "op by op: " + "; ".join(re.findall(r"cuda_graphs: (.*)", out))[:300]
    return row


def loader_inputs(a, batch, jpegs):
    """A function giving the DataLoader's next batch on the GPU, channels-last."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    loader = DataLoader(torchvision_dataset(jpegs), batch_size=batch, num_workers=a.threads,
                        pin_memory=True, drop_last=True, persistent_workers=True, prefetch_factor=4,
                        sampler=RandomSampler(range(len(jpegs)), replacement=True,
                                              num_samples=1 << 30),
                        worker_init_fn=lambda _: torch.set_num_threads(1))
    it = iter(loader)

    def inputs():
        x, y = next(it)
        return (x.cuda(non_blocking=True).contiguous(memory_format=torch.channels_last),
                y.cuda(non_blocking=True))
    return inputs


def pytorch_loop(a, batch, precision, jpegs=None, compiled=False):
    try:
        inputs = loader_inputs(a, batch, jpegs) if jpegs is not None else None
        # A DataLoader's workers each make whole batches, slowly at first: every worker's second
        # batch is taken before the timing starts (at batch 64, 16 workers after 5 warm-up
        # steps gave 358 images/s, against the 1884 of bench/input_vs_peers.py's steady state).
        warmup = 5 if jpegs is None else max(5, 2 * a.threads)
        return pytorch_timed("resnet50", batch, a.seconds, False, compiled, precision=precision,
                             warmup=warmup, inputs=inputs)
    except Exception as e:  # a loop that fails is reported, the others still run
        return {"error": f"{type(e).__name__}: {e}"[-2000:]}
    finally:
        if "torch" in sys.modules:  # the next troupe process gets the memory back
            sys.modules["torch"].cuda.empty_cache()


def ratio(x, y):
    return f"{x['rate'] / y['rate']:.2f}" if "rate" in x and "rate" in y else "-"


def cell(d, key="rate"):
    if not d:
        return "-"
    return f"{d[key]:.0f}" if d.get(key) is not None else "failed" if "error" in d else "-"


def seconds(d):
    return f"{d['warmup_extra_s']:.1f}" if "warmup_extra_s" in d else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--troupe", default="build/bin/troupe")
    ap.add_argument("--bench", default="build/bench/troupe_kernels_bench")
    ap.add_argument("--batches", default="64,128,256")
    ap.add_argument("--precisions", default="fp16,bf16,fp32")
    ap.add_argument("--seconds", type=float, default=2,
                    help="timed seconds of each loop (troupe: its second epoch's length)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(),
                    help="JPEG decode threads (troupe) and DataLoader workers (PyTorch)")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--compile-rows", default="",
                    help="rows timed with torch.compile too, as PRECISION:BATCH,...")
    ap.add_argument("--op-by-op", action="store_true",
                    help="troupe train on synthetic input once more with --cuda_graphs false")
    ap.add_argument("--budget", type=float, default=1e9,
                    help="seconds for the whole run: rows are not started past it")
    ap.add_argument("--row-limit", type=float, default=120, help="seconds a process may take")
    ap.add_argument("--logs", default=None, help="folder of every process's output")
    a = ap.parse_args()
    clock = Clock(a.budget)
    with tempfile.TemporaryDirectory(prefix="train_gpu_vs_pytorch.") as tmp:
        a.work = tmp
        a.logs = a.logs or os.path.join(tmp, "logs")
        os.makedirs(a.logs, exist_ok=True)
        photos = os.path.join(tmp, "photos")
        make_photos(photos, a.images, 1)
        db = os.path.join(tmp, "db")
        rc, out = run_logged([a.troupe, "convert", "images", os.path.join(photos, "list.txt"),
                              os.path.join(photos, "root"), "--encoded", "--out", db],
                             os.path.join(a.logs, "convert.txt"), 300)
        if rc != 0:
            sys.exit(f"troupe convert images failed:\n{out[-2000:]}")
        jpegs = jpeg_bytes(photos)
        compile_rows = {tuple(r.split(":")) for r in a.compile_rows.split(",") if r}
        print(f"# {a.images} JPEGs, {a.threads} decode threads / DataLoader workers, "
              f"{a.seconds:g} s a loop; {os.cpu_count()} cores", flush=True)
        rows = []
        for precision in a.precisions.split(","):
            for batch in [int(b) for b in a.batches.split(",")]:
                if clock.left() < 30:
                    print(f"# stopped before {precision} batch {batch}: the budget is spent")
                    break
                tag = f"{precision}_b{batch}"
                row = {"batch": batch, "precision": precision}
                row["kernels"] = troupe_rate(a.bench, "resnet50", batch, a.seconds, False,
                                             precision)
                # Each troupe epoch about --seconds long at the kernels' pace.
                pace = row["kernels"].get("rate", 10 * batch / a.seconds)
                epoch = max(4, round(pace * a.seconds / batch)) * batch
                row["train"] = troupe_train(a, clock, "train_" + tag, batch, precision, epoch,
                                            None)
                if a.op_by_op:
                    row["train_op_by_op"] = troupe_train(a, clock, "train_op_by_op_" + tag, batch,
                                                         precision, epoch, None, graphs=False)
                row["train_jpeg"] = troupe_train(a, clock, "train_jpeg_" + tag, batch,
                                                 precision, epoch, db)
                row["pytorch"] = pytorch_loop(a, batch, precision)
                row["pytorch_loader"] = pytorch_loop(a, batch, precision, jpegs)
                if (precision, str(batch)) in compile_rows and clock.left() > 90:
                    row["pytorch_compile"] = pytorch_loop(a, batch, precision, compiled=True)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n| batch | precision | kernels bench | troupe train | op by op | train / kernels "
          "| troupe JPEG | PyTorch eager | PyTorch DataLoader | torch.compile | train / eager "
          "| JPEG / DataLoader | train / compile | troupe peak MiB | PyTorch peak MiB | "
          "troupe warm-up s | PyTorch warm-up s |")
    print("|---" * 17 + "|")
    for r in rows:
        comp = r.get("pytorch_compile", {})
        print(f"| {r['batch']} | {r['precision']} | {cell(r['kernels'])} | {cell(r['train'])} | "
              f"{cell(r.get('train_op_by_op'))} | {ratio(r['train'], r['kernels'])} | "
              f"{cell(r['train_jpeg'])} | {cell(r['pytorch'])} | {cell(r['pytorch_loader'])} | "
              f"{cell(comp)} | {ratio(r['train'], r['pytorch'])} | "
              f"{ratio(r['train_jpeg'], r['pytorch_loader'])} | "
              f"{ratio(r['train'], comp) if comp else '-'} | "
              f"{cell(r['train'], 'peak_mib')} | {cell(r['pytorch'], 'peak_mib')} | "
              f"{seconds(r['train'])} | {seconds(r['pytorch'])} |")
    print("\ntrain / kernels: troupe train (by CUDA graphs) against the kernels bench "
          "(goal >= 0.95); JPEG: troupe's reader vs the DataLoader, each with "
          f"{a.threads} threads/workers; warm-up: what troupe's first epoch took beyond its "
          "second, PyTorch's warm-up steps (5, the DataLoader's 2 a worker) beyond as many timed "
          "ones")
    failed = [(side, r) for r in rows for side, d in r.items()
              if isinstance(d, dict) and "error" in d]
    for side, r in failed[:3]:
        print(f"\n{side} failed at batch {r['batch']} {r['precision']}:\n{r[side]['error']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
