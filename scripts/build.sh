#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then configures and builds troupe into build/.
# Usage: scripts/build.sh [targets...]     BUILD_DIR overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
jobs=${JOBS:-$(nproc)}
ninja -C "$build_dir" -j "$jobs" "$@"
