"""troupe's module under NumPy 2 (.venv-numpy2, scripts/setup.sh), as PyTorch 2's users have it.
The module is built with Debian's pybind11 2.10, which predates NumPy 2's ABI: an array it made
itself had the wrong strides there (troupe.hooks' 2bit bytes past the first were read from the
wrong place, and DDP's 2bit hook averaged garbage). The program below checks the codec against
numpy references and a local store's push and pull, under NumPy 2."""
import os
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NUMPY2_PYTHON = os.path.join(ROOT, ".venv-numpy2", "bin", "python")

PROGRAM = r"""
import numpy as np
import troupe
from troupe import _troupe

assert np.__version__ >= "2", np.__version__
rng = np.random.default_rng(7)
for n in (1, 7, 37, 1000):
    values = (rng.standard_normal(n) * 0.1).astype(np.float32)
    # 2bit (MXNet's rule): +t, -t or 0, the rest left in the residual; each byte's values
    # decoded back must be those, and the residual what is left.
    t = np.float32(0.05)
    residual = np.zeros(n, np.float32)
    sent = _troupe.encode("2bit", float(t), values, residual)
    assert sent.dtype == np.uint8 and sent.size == _troupe.encoded_size("2bit", n), sent
    q = np.where(values >= t, t, np.where(values <= -t, -t, np.float32(0))).astype(np.float32)
    assert np.array_equal(residual, values - q), n
    got = np.zeros(n, np.float32)
    _troupe.decode("2bit", float(t), sent, got, False)
    assert np.array_equal(got, q), (n, got, q)
    # fp16: the values rounded to float16 and back.
    got = np.zeros(n, np.float32)
    _troupe.decode("fp16", 0.0, _troupe.encode("fp16", 0.0, values, None), got, False)
    assert np.array_equal(got, values.astype(np.float16).astype(np.float32)), n

kv = troupe.kv.create("local")
kv.init(3, np.zeros((2, 3)))
kv.push(3, [np.full((2, 3), 1.5), np.arange(6.0).reshape(2, 3)])
out = np.empty((2, 3), dtype=np.float32)
kv.pull(3, out=out)
assert np.array_equal(out, 1.5 + np.arange(6.0).reshape(2, 3)), out
assert np.array_equal(kv.pull(3), out)
print("numpy", np.__version__, "ok")
"""


def test_the_codec_and_a_local_store_under_numpy2():
    assert os.path.exists(NUMPY2_PYTHON), "run scripts/setup.sh: it makes .venv-numpy2"
    r = subprocess.run([NUMPY2_PYTHON, "-c", PROGRAM], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout
    assert "ok" in r.stdout, r.stdout
