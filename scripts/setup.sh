#!/usr/bin/env bash
# Installs every Debian package that troupe's build and tests need. Idempotent: packages already
# present are skipped, and apt-get update runs only when something is missing.
# Usage: scripts/setup.sh   (--bench, once needed for MXNet, is still accepted: MXNet now always comes)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git file
  libasio-dev capnproto libcapnp-dev
  liblmdb-dev lmdb-utils libleveldb-dev libsnappy-dev
  libprotobuf-dev protobuf-compiler zlib1g-dev
  libturbojpeg0-dev libjpeg62-turbo-dev libpng-dev
  libdnnl-dev ocl-icd-opencl-dev opencl-headers
  libhiredis-dev redis-server libssl-dev
  openssh-client openssh-server rsync openmpi-bin iproute2 util-linux python3 slurm-wlm munge time
  libspdlog-dev libfmt-dev libtomlplusplus-dev libcli11-dev libcairo2-dev fonts-dejavu-core
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-format clang-14 libclang-rt-14-dev
  dataset-fashion-mnist dict-gcide
  python3-torch libtorch-dev python3-torchvision python3-numpy python3-dev pybind11-dev python3-pytest
)
# time: GNU time, each worker's peak memory in bench/zero_cpu.py.
# dict-gcide: the English corpus of the text tests and benchmarks (the Collaborative
# International Dictionary of English, Webster's 1913 with its quotations: 40 MB of text).
# python3-dev, pybind11-dev: the Python package (python/); python3-pytest runs its tests.
# python3-torch (Debian's 1.13, for /usr/bin/python3) is the suite's reference for the optimizers
# (tests/optimizer_reference.py: torch.optim in float64); benchmarks use PyPI's torch in a venv.
# python3-torchvision: examples/python/ddp_resnet18.py's model.
# libtorch-dev (torch's C++ headers): troupe.torch's C++ backend (python/troupe/csrc/c10d.cc),
# built against Debian's torch for the tests.

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

# The parameter-server peer, MXNet 1.9.1, comes from PyPI into its own virtual environment
# (.venv-mxnet, kept between runs): the suite's differential tests of troupe.kv run MXNet's own
# kvstore there (tests/python/test_kv_vs_mxnet.py), and so do the benchmarks.
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-mxnet"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import mxnet" 2>/dev/null; then
  echo "setup: installing MXNet 1.9.1 into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q mxnet==1.9.1 "numpy<1.24"
fi

# NumPy 2 (.venv-numpy2, about 20 MB): troupe's Python module is built with Debian's pybind11,
# which predates NumPy 2's ABI; tests/python/test_numpy2.py runs the module under it.
venv2="$(cd "$(dirname "$0")/.." && pwd)/.venv-numpy2"
if [[ ! -x "$venv2/bin/python" ]] || ! "$venv2/bin/python" -c "import numpy; assert numpy.__version__ >= '2'" 2>/dev/null; then
  echo "setup: installing NumPy 2 into $venv2"
  python3 -m venv "$venv2"
  "$venv2/bin/pip" install -q "numpy>=2,<3"
fi

# Hugging Face tokenizers (.venv-tokenizers, about 70 MB with its dependencies): the reference of troupe's GPT-2 BPE
# (tests/bpe_reference.py, tests/data_bpe_test.cc).
venv3="$(cd "$(dirname "$0")/.." && pwd)/.venv-tokenizers"
if [[ ! -x "$venv3/bin/python" ]] || ! "$venv3/bin/python" -c "import tokenizers" 2>/dev/null; then
  echo "setup: installing tokenizers 0.23.3 into $venv3"
  python3 -m venv "$venv3"
  "$venv3/bin/pip" install -q tokenizers==0.23.3
fi
