#!/usr/bin/env bash
# The main job from a clean clone: set up, build, convert Fashion-MNIST into LMDB, train LeNet with
# a test after every epoch. Extra arguments go to `troupe train` (e.g. --num_epochs 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh troupe_cli
troupe=build/bin/troupe
data=${DATA_DIR:-out/fashion-mnist-lmdb}
if [[ ! -d "$data/train" || ! -d "$data/test" ]]; then
  rm -rf "$data"
  "$troupe" convert fashion-mnist --out "$data" --db lmdb
fi
mkdir -p out/logs
"$troupe" train configs/lenet.toml --train_data "$data/train" --test_data "$data/test" \
  --db_type lmdb --log_dir out/logs "$@"
