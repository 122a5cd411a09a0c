#!/usr/bin/env bash
# The whole test suite from a clean clone: set up, build, run every test with CTest, then a short
# fuzzing pass over every libFuzzer target (scripts/fuzz.sh; FUZZ_SECONDS per target, 25 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build_dir=${BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600
bash scripts/fuzz.sh "${FUZZ_SECONDS:-25}"
