"""What troupe's training benchmarks share (bench/train_vs_pytorch.py, ddp_vs_troupe.py,
ps_vs_mxnet.py, kvstore_vs_train.py, train_hosts.py): the troupe binary, the Fashion-MNIST data it
trains on (converted once by `troupe convert`), and the table of samples/s they print; and the
whole-number flags of most benchmarks here (add_int_flags)."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_troupe_and_data_flags(parser):
    """--troupe (the binary; build/bin/troupe) and --data (Fashion-MNIST as lmdb; made when
    missing, out/fashion-mnist-lmdb)."""
    parser.add_argument("--troupe", default=os.path.join(ROOT, "build/bin/troupe"))
    parser.add_argument("--data", default=os.path.join(ROOT, "out/fashion-mnist-lmdb"))


def add_int_flags(parser, **defaults):
    """A whole-number flag for each keyword, in their order: --NAME (its underscores as dashes)
    defaulting to the keyword's value; add_int_flags(p, batch_size=16) adds --batch-size, 16."""
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)


def ensure_data(troupe, data, **run_args):
    """Converts Fashion-MNIST into `data` (train and test, lmdb) with `troupe convert` unless both
    are there; run_args go to subprocess.run."""
    if not all(os.path.isdir(os.path.join(data, part)) for part in ("train", "test")):
        subprocess.run([troupe, "convert", "fashion-mnist", "--out", data, "--db", "lmdb"],
                       check=True, **run_args)


class RateTable:
    """Rows of samples/s printed as they come: a name `key_width` wide, troupe's rate, the other
    side's (its column headed `theirs`), their ratio, and with `baseline` (another troupe build)
    that build's rate and ours/baseline."""

    def __init__(self, key, key_width, theirs, baseline):
        self.key_width, self.theirs_width, self.baseline = key_width, len(theirs) + 1, baseline
        baseline_head = f" {'baseline samples/s':>19} {'ours/baseline':>14}" if baseline else ""
        print(f"{key:<{key_width}} {'troupe samples/s':>17} {theirs:>{self.theirs_width}} "
              f"{'ratio':>7}" + baseline_head)

    def row(self, name, ours, theirs, before=None):
        row = (f"{name:<{self.key_width}} {ours:>17.0f} {theirs:>{self.theirs_width}.0f} "
               f"{ours / theirs:>6.2f}x")
        if self.baseline:
            row += f" {before:>19.0f} {ours / before:>13.3f}x"
        print(row, flush=True)
