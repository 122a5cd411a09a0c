"""examples/python: MXNet's distributed MLP on troupe.kv, as its docstring starts it."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_dist_sync_mlp_learns_fashion_mnist_on_two_workers_and_a_server():
    r = subprocess.run([os.environ.get("TROUPE", "troupe"), "launch", "-n", "2", "-s", "1", "--",
                        sys.executable, os.path.join(ROOT, "examples/python/kv_mlp.py"),
                        "--kv-store", "dist_sync", "--num-epochs", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert r.returncode == 0, r.stdout
    lines = [line for line in r.stdout.splitlines() if line.startswith("[worker 0] epoch 1:")]
    assert len(lines) == 1, r.stdout
    accuracy = float(lines[0].split("test accuracy ")[1].split(",")[0])
    # An MLP after one epoch of Fashion-MNIST (this one: 0.83); chance is 0.1.
    assert accuracy > 0.8, lines[0]
