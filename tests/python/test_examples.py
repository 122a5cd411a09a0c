"""examples/python: MXNet's distributed MLP on troupe.kv, a PyTorch MLP on troupe's parameter
servers, one under DDP on troupe's torch.distributed backend, and a small GPT under DDP with the
2-bit hook, as their docstrings start them (torchvision's ResNet-18: test_example_resnet18.py)."""
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launched(example, servers, flags):
    """The output of `troupe launch -n 2 [servers] -- python examples/python/EXAMPLE flags`."""
    r = subprocess.run([os.environ.get("TROUPE", "troupe"), "launch", "-n", "2", *servers, "--",
                        sys.executable, os.path.join(ROOT, "examples/python", example), *flags],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert r.returncode == 0, r.stdout
    return r.stdout


def epoch_one_accuracy(example, servers=("-s", "1"), flags=("--kv-store", "dist_sync")):
    out = launched(example, servers, [*flags, "--num-epochs", "1"])
    lines = [line for line in out.splitlines() if line.startswith("[worker 0] epoch 1:")]
    assert len(lines) == 1, out
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


# A smaller GPT than the example's default (Debian's torch multiplies matrices slowly), 100 steps
# of the 2-bit hook. Guessing bytes uniformly loses ln 256 = 5.55 nats a byte, and knowing only the
# bytes' frequencies 3.45 on this held-out tenth: the run must be at least 1.5 nats below the
# first (it ends near the second: 2-bit quantisation slows a transformer's learning, see
# bench/ddp_gpt_hooks.py).
def test_a_small_gpt_learns_english_bytes_under_ddp_with_the_2bit_hook():
    out = launched("ddp_gpt.py", (), ["--steps", "100", "--eval-every", "100", "--n-embd", "64",
                                      "--n-layer", "1", "--block-size", "32"])
    done = [line for line in out.splitlines() if line.startswith("[worker 0] done: ")]
    assert len(done) == 1 and "hook 2bit" in done[0], out
    loss = float(done[0].split("held-out loss ")[1].split(",")[0])
    assert loss < math.log(256) - 1.5, done[0]
