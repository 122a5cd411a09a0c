#!/usr/bin/env bash
# Rewrites tests/fuzz/corpus/ from troupe's own writers (make_seeds.cc, on Debian's Fashion-MNIST)
# and the repository's configs/*.toml. Builds into build/ as scripts/build.sh does.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/build.sh troupe_fuzz_seeds
build_dir=${BUILD_DIR:-build}
corpus=tests/fuzz/corpus
rm -rf "$corpus"
"$build_dir/tests/troupe_fuzz_seeds" /usr/share/datasets/fashion-mnist "$corpus"
mkdir -p "$corpus/config"
cp configs/*.toml "$corpus/config/"
du -sh "$corpus"/*
