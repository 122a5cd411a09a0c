#!/usr/bin/env bash
# The whole test suite from a clean clone: set up, build, run every test with CTest, then a short
# fuzzing pass over every libFuzzer target (scripts/fuzz.sh; FUZZ_SECONDS per target, 15 by default).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
build_dir=${BUILD_DIR:-build}
# ctest runs two tests at once on two cores: OpenMP teams that spin-wait at their barriers then
# steal each other's cores for whole time slices (a kernel test: 0.1 s alone, 60 s and more beside
# another one). Waiting threads sleep instead.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600
# The numerically sensitive tests again with the CPU kernels held to AVX2 (troupe's own dispatch
# and oneDNN's), so that an AVX-512 machine also runs an AVX2 machine's code and rounding: the
# kernel tests (label numeric) and the training tests that compare parameters.
held=(env TROUPE_MAX_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
"${held[@]}" ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600 \
  -L numeric
"${held[@]}" ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 600 \
  -R 'Training[.](TwoReplicas|UnequalWork|Resuming)|DistributedTraining[.](TwoProcesses|Fp16Compression)|DistSyncTest|RestartTest'
bash scripts/fuzz.sh "${FUZZ_SECONDS:-15}"
