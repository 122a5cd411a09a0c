#!/usr/bin/env python3
"""Image input on the CPU: JPEG decode + the ResNet-50 training transform, images/s, troupe vs
torchvision's DataLoader (Pillow) vs NVIDIA DALI's CPU pipeline, at 1 and 2 threads.

The photographs: the colour sample photographs that scikit-image and scikit-learn ship in their
PyPI wheels (no network), each cut into --images crops of ImageNet's typical size (500x375 or
375x500, from a random part of 40-100% of the photograph's area, resized with Pillow's antialiased
filter) and re-encoded as baseline JPEG at quality 75-95 (4:2:0), as ImageNet's files are. troupe
reads them from an LMDB of encoded Datum records (`troupe convert images --encoded`); the peers
read the same JPEG bytes from memory (no file system, no database: they pay less than troupe).

The transform, the same for all three: random-resized crop (area 0.08-1, aspect 3/4-4/3) to
224x224 with a linear antialiased resize, random mirror, per-channel mean and std, float32 CHW.
  troupe:      `troupe bench input` (one reader's Dataset, decode_threads T: the reader's own
               thread team), batches of 64 in the epoch's order.
  torchvision: DataLoader(num_workers=T, batch_size=64, shuffle) over the bytes,
               Image.open(...).convert("RGB"), RandomResizedCrop(224), RandomHorizontalFlip,
               ToTensor, Normalize; torch.set_num_threads(1) in each worker.
  DALI-CPU:    pipeline(batch_size=64, num_threads=T, device_id=None): external_source of the
               bytes, decoders.image_random_crop (cpu), resize(224, 224, antialiased linear),
               crop_mirror_normalize(mirror=coin_flip, CHW float).
images/s of --batches batches after --warmup untimed ones; a cell is the median over --rounds
rounds [min-max], rounds alternating the three. per core = images/s / T. Goals (issue 14): troupe
>= 1.5x DALI-CPU and >= 3x torchvision per core.

    flock /tmp/troupe-build.lock ninja -C build -j2 troupe_cli
    python3 bench/input_vs_peers.py [--threads 1,2] [--rounds 3] [--images 512]
(.venv-torch is made with torch 2.15.0, torchvision, DALI, scikit-image and scikit-learn from PyPI
if it lacks them.)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from train_bench import add_int_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-torch")
VENV_PY = os.path.join(VENV, "bin/python")
PEERS = ["torch==2.15.0", "torchvision", "pillow", "nvidia-dali-cuda130", "scikit-image",
         "scikit-learn"]
MEAN = [0.485, 0.456, 0.406]  # RGB, of 0..1 values (torchvision's ImageNet normalisation)
STD = [0.229, 0.224, 0.225]

# --- run under .venv-torch's python ----------------------------------------------------------


def make_photos(out, count, seed):
    """Writes out/root/NNNNN.jpg and out/list.txt from the wheels' sample photographs."""
    import random
    from PIL import Image
    import numpy as np
    import skimage.data
    from sklearn.datasets import load_sample_images

    sources = [Image.fromarray(a) for a in load_sample_images().images]
    for name in ["astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry",
                 "hubble_deep_field", "retina", "motorcycle_left", "motorcycle_right"]:
        try:
            a = getattr(skimage.data, name)()
        except Exception:  # a sample a wheel fetches from the network: not used offline
            continue
        if a.ndim == 3 and a.shape[2] == 3 and min(a.shape[:2]) >= 300:
            sources.append(Image.fromarray(np.ascontiguousarray(a)))
    rng = random.Random(seed)
    os.makedirs(os.path.join(out, "root"), exist_ok=True)
    with open(os.path.join(out, "list.txt"), "w") as listing:
        for i in range(count):
            src = sources[i % len(sources)]
            w, h = src.size
            area = rng.uniform(0.4, 1.0) * w * h
            aspect = rng.choice([4 / 3, 3 / 4])
            cw = min(w, int(round((area * aspect) ** 0.5)))
            ch = min(h, int(round((area / aspect) ** 0.5)))
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            size = (500, 375) if cw >= ch else (375, 500)
            crop = src.crop((x, y, x + cw, y + ch)).resize(size, Image.BILINEAR)
            if rng.random() < 0.5:
                crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
            name = f"{i:05d}.jpg"
            crop.save(os.path.join(out, "root", name), quality=rng.randint(75, 95),
                      subsampling=2)
            listing.write(f"{name} {i % 1000}\n")
    print(json.dumps({"sources": len(sources), "images": count}))


def jpeg_bytes(folder):
    with open(os.path.join(folder, "list.txt")) as f:
        names = [line.split()[0] for line in f if line.strip()]
    out = []
    for name in names:
        with open(os.path.join(folder, "root", name), "rb") as f:
            out.append(f.read())
    return out


def torchvision_dataset(data):
    """A torch Dataset of the JPEG bytes `data`, each decoded by Pillow and given the ResNet-50
    training transform (torchvision's), labelled i % 1000."""
    import io
    from PIL import Image
    from torch.utils.data import Dataset
    from torchvision import transforms

    transform = transforms.Compose([
        transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(MEAN, STD)])

    class Jpegs(Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            return transform(Image.open(io.BytesIO(data[i])).convert("RGB")), i % 1000

    return Jpegs()


def torchvision_rate(folder, threads, batch, batches, warmup):
    import time
    import torch
    from torch.utils.data import DataLoader

    data = jpeg_bytes(folder)
    loader = DataLoader(torchvision_dataset(data), batch_size=batch, shuffle=True,
                        num_workers=threads, drop_last=True, persistent_workers=True,
                        prefetch_factor=2,
                        worker_init_fn=lambda _: torch.set_num_threads(1),
                        generator=torch.Generator().manual_seed(1))
    torch.set_num_threads(1)

    def batches_forever():
        while True:
            yield from loader

    it = batches_forever()
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batch * batches / (time.perf_counter() - start)


def dali_rate(folder, threads, batch, batches, warmup):
    import time
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    data = [np.frombuffer(b, dtype=np.uint8) for b in jpeg_bytes(folder)]
    rng = np.random.default_rng(1)

    def source():
        while True:
            order = rng.permutation(len(data))
            for k in range(0, len(order) - batch + 1, batch):
                yield [data[i] for i in order[k:k + batch]]

    feed = source()

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None, seed=1,
                  prefetch_queue_depth=2)
    def pipe():
        jpegs = fn.external_source(source=feed, dtype=types.UINT8, batch=True)
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3],
                                               num_attempts=10)
        images = fn.resize(images, resize_x=224, resize_y=224, interp_type=types.INTERP_LINEAR,
                           antialias=True)
        return fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(probability=0.5),
                                        mean=[255 * m for m in MEAN], std=[255 * s for s in STD],
                                        dtype=types.FLOAT, output_layout="CHW")

    p = pipe()
    p.build()
    for _ in range(warmup):
        p.run()
    start = time.perf_counter()
    for _ in range(batches):
        p.run()
    return batch * batches / (time.perf_counter() - start)


def peer_main(a):
    if a.make_photos:
        make_photos(a.make_photos, a.images, a.seed)
        return
    rate = {"torchvision": torchvision_rate, "dali": dali_rate}[a.peer](
        a.folder, a.threads_one, a.batch, a.batches, a.warmup)
    print(json.dumps({"rate": rate}))

# --- the driver (any python3) -----------------------------------------------------------------


def ensure_peers():
    check = [VENV_PY, "-c", "import torch, torchvision, nvidia.dali, skimage, sklearn, PIL"]
    if os.path.exists(VENV_PY) and subprocess.run(check, stderr=subprocess.DEVNULL).returncode == 0:
        return
    print(f"# installing the peers into {VENV}: {' '.join(PEERS)} (about 6 GB)", flush=True)
    if not os.path.exists(VENV_PY):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    subprocess.run([os.path.join(VENV, "bin/pip"), "install", "-q"] + PEERS, check=True)
    subprocess.run(check, check=True)


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=1800)
    if p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-4000:]}")
    return p.stdout


def last_json(text):
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def troupe_rates(troupe, db, threads, batch, batches, warmup):
    mean = ",".join(f"{255 * m:g}" for m in reversed(MEAN))  # the records are BGR
    std = ",".join(f"{255 * s:g}" for s in reversed(STD))
    out = run([troupe, "bench", "input", "--train_data", db, "--num_labels", "1000",
               "--num_channels", "3", "--crop",
               "224", "--random_resized_crop", "--mirror", "--mean_per_channel", mean,
               "--std_per_channel", std, "--batch_size", str(batch), "--batches", str(batches),
               "--warmup", str(warmup), "--sweep", ",".join(map(str, threads))])
    rates = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit():
            rates[int(cells[0])] = float(cells[1])
    if sorted(rates) != sorted(threads):
        sys.exit(f"troupe bench input printed rows for {sorted(rates)}, not {threads}:\n{out}")
    return rates


def cell(values, digits=1):
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}-{max(values):.{digits}f}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    add_int_flags(ap, rounds=3, images=512, batch=64, batches=12, warmup=2, seed=1)
    ap.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    # Where the peers are already installed (the GPU machine's python3 has torchvision and
    # scikit-image but no DALI): that python, and the peers to run.
    ap.add_argument("--python", help="a python with the peers; default: .venv-torch, installed")
    ap.add_argument("--peers", default="torchvision,dali")
    # Internal: the peers' side, under .venv-torch's python.
    ap.add_argument("--peer", choices=["torchvision", "dali"])
    ap.add_argument("--make-photos")
    ap.add_argument("--folder")
    ap.add_argument("--threads-one", type=int)
    a = ap.parse_args()
    if a.peer or a.make_photos:
        return peer_main(a)
    threads = [int(t) for t in a.threads.split(",")]
    if min(threads) < 1 or a.rounds < 1 or a.batches < 1 or a.images < a.batch:
        sys.exit("--threads >= 1, --rounds >= 1, --batches >= 1, --images >= --batch")
    if not os.path.exists(a.troupe):
        sys.exit(f"{a.troupe} is missing: build it first (see the top of this file)")
    peers = [p for p in a.peers.split(",") if p]
    if any(p not in ("torchvision", "dali") for p in peers):
        sys.exit(f"--peers: torchvision and/or dali, not {a.peers}")
    python = a.python or VENV_PY
    if not a.python:
        ensure_peers()
    me = os.path.abspath(__file__)
    common = ["--batch", str(a.batch), "--batches", str(a.batches), "--warmup", str(a.warmup)]
    with tempfile.TemporaryDirectory(prefix="input_vs_peers.") as tmp:
        made = last_json(run([python, me, "--make-photos", tmp, "--images", str(a.images),
                              "--seed", str(a.seed)]))
        db = os.path.join(tmp, "db")
        run([a.troupe, "convert", "images", os.path.join(tmp, "list.txt"),
             os.path.join(tmp, "root"), "--encoded", "--out", db])
        jpeg_mb = sum(os.path.getsize(os.path.join(tmp, "root", f))
                      for f in os.listdir(os.path.join(tmp, "root"))) / 1e6
        print(f"# {a.images} JPEGs (500x375 / 375x500, {jpeg_mb / a.images * 1e3:.0f} kB on "
              f"average) cut from {made['sources']} sample photographs; batch {a.batch}, "
              f"{a.warmup} + {a.batches} batches, {a.rounds} rounds; {os.cpu_count()} cores",
              flush=True)
        rates = {(p, t): [] for p in ["troupe"] + peers for t in threads}
        for r in range(a.rounds):
            for t, rate in troupe_rates(a.troupe, db, threads, a.batch, a.batches,
                                        a.warmup).items():
                rates[("troupe", t)].append(rate)
            for peer in peers:
                for t in threads:
                    rates[(peer, t)].append(last_json(run(
                        [python, me, "--peer", peer, "--folder", tmp, "--threads-one", str(t)]
                        + common))["rate"])
            print(f"round {r + 1}: " + ", ".join(
                f"{p} x{t} {rates[(p, t)][-1]:.0f}" for p in ["troupe"] + peers
                for t in threads), flush=True)
    names = {"torchvision": "torchvision", "dali": "DALI-CPU"}
    print("\n| threads | troupe images/s | " + " | ".join(f"{names[p]} images/s" for p in peers)
          + " | " + " | ".join(f"troupe / {names[p]}" for p in peers) + " | troupe per core |")
    print("|---" * (2 + 2 * len(peers) + 1) + "|")
    for t in threads:
        tr = rates[("troupe", t)]
        print(f"| {t} | {cell(tr)} | "
              + " | ".join(cell(rates[(p, t)]) for p in peers) + " | "
              + " | ".join(cell([x / y for x, y in zip(tr, rates[(p, t)])], 2) for p in peers)
              + f" | {statistics.median(tr) / t:.1f} |")


if __name__ == "__main__":
    main()
