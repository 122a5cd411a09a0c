"""examples/python/ddp_resnet18.py, torchvision's ResNet-18 under DDP, against gloo: a file of its
own, so that ctest runs it beside test_examples.py's."""
import math

from test_examples import launched


# torchvision's ResNet-18 under DDP, 6 steps of 32 images a rank: every parameter and buffer
# (the batch norms' statistics, which DDP broadcasts from rank 0 each step) ends with the same
# bits on troupe's backend as on gloo: a sum of two ranks' gradients is the same in either order.
def test_torchvisions_resnet18_under_ddp_ends_as_on_gloo_to_the_bit():
    flags = ["--steps", "6", "--batch-size", "32", "--test-images", "100"]
    digests = {}
    for backend in ("troupe", "gloo"):
        out = launched("ddp_resnet18.py", (), [*flags, "--backend", backend])
        lines = [line for line in out.splitlines() if line.startswith("[worker 0] digest ")]
        assert len(lines) == 1, out
        digests[backend] = lines[0].split()[3]
        loss = [line for line in out.splitlines() if line.startswith("[worker 0] epoch 1:")]
        assert len(loss) == 1 and math.isfinite(float(loss[0].split("train loss ")[1][:6])), out
    assert digests["troupe"] == digests["gloo"], digests
