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
# Configs with overrides: the file's text, a NUL, then flags (key=value) and troupe launch's
# variables ($TROUPE_X=value), one a line (config_fuzz.cc).
printf 'model = "mlp"\nbatch_size = 32\nlr_milestones = [1, 2]\n\0momentum=0.9\nweight_decay=0.0005\nwork_load_list=1,2\n' \
  >"$corpus/config/overrides_file_and_flags"
printf '\0step_timeout=30\nseed=18446744073709551615\nthreads=4\nlr_policy=multistep\n$TROUPE_GENERATION=1\n' \
  >"$corpus/config/overrides_flags_only"
printf '\0$TROUPE_NUM_WORKERS=2\n$TROUPE_RANK=1\n$TROUPE_RENDEZVOUS=tcp://127.0.0.1:1\n$TROUPE_RUN_ID=r1\n' \
  >"$corpus/config/overrides_launch_variables"
printf 'momentum = 0.99999994\nscale = 1e6\npeer_timeout = 2592000\n\0epoch_size=1099511627776\nbatch_size=1048576\n' \
  >"$corpus/config/overrides_range_ends"
du -sh "$corpus"/*
