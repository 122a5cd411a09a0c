"""examples/python: MXNet's distributed MLP on troupe.kv, a PyTorch MLP on troupe's parameter
servers, and one under DDP on troupe's torch.distributed backend, as their docstrings start
them."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def epoch_one_accuracy(example, servers=("-s", "1"), flags=("--kv-store", "dist_sync")):
    r = subprocess.run([os.environ.get("TROUPE", "troupe"), "launch", "-n", "2", *servers, "--",
                        sys.executable, os.path.join(ROOT, "examples/python", example),
                        *flags, "--num-epochs", "1"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert r.returncode == 0, r.stdout
    lines = [line for line in r.stdout.splitlines() if line.startswith("[worker 0] epoch 1:")]
    assert len(lines) == 1, r.stdout
    return float(lines[0].split("test accuracy ")[1].split(",")[0]), lines[0]


# An MLP after one epoch of Fashion-MNIST (the numpy one: 0.83, the PyTorch ones: 0.82 and
# 0.815); chance is 0.1.
def test_the_dist_sync_mlp_learns_fashion_mnist_on_two_workers_and_a_server():
    accuracy, line = epoch_one_accuracy("kv_mlp.py")
    assert accuracy > 0.8, line


def test_a_pytorch_mlp_learns_fashion_mnist_on_the_parameter_servers():
    accuracy, line = epoch_one_accuracy("torch_ps_mlp.py")
    assert accuracy > 0.8, line


def test_a_pytorch_mlp_learns_fashion_mnist_under_ddp_on_the_troupe_backend():
    accuracy, line = epoch_one_accuracy("ddp_mlp.py", servers=(), flags=("--backend", "troupe"))
    assert accuracy > 0.8, line
