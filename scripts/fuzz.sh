#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz into build-fuzz/ (clang, ASan, UBSan) and runs each on
# a copy of its seed corpus (tests/fuzz/corpus/<target>/) for SECONDS, two targets at a time.
# Exits non-zero on any finding: a crash, an exception other than troupe::Error, a sanitizer
# report, a leak, an input that runs over 10 s (-timeout) or needs over 2 GiB (-rss_limit_mb).
# Each run's logs, grown corpora and reproducers stay in build-fuzz/runs/<time>/<target>/.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (60)] [TARGET...]
#        JOBS (2): build jobs and targets run at once; FUZZ_BUILD_DIR overrides the folder; scratch
#        files go to /dev/shm where it is writable, else to $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
seconds=${1:-60}
shift $(($# > 0 ? 1 : 0))
targets=("$@")
((${#targets[@]})) || targets=(frame datum checkpoint config store_value image_header token_shard bpe)
parallel=${JOBS:-2}
build_dir=${FUZZ_BUILD_DIR:-build-fuzz}

started=$(date +%s)
cmake -S . -B "$build_dir" -G Ninja -DTROUPE_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
ninja -C "$build_dir" -j "$parallel" "${targets[@]/%/_fuzz}"
echo "fuzz: built in $(($(date +%s) - started)) s"

run_dir="$build_dir/runs/$(date +%Y%m%d-%H%M%S)"
# The checkpoint and config targets write each input to a scratch file: on tmpfs where there is one.
scratch=${TMPDIR:-/tmp}
if [[ -d /dev/shm && -w /dev/shm ]]; then scratch=/dev/shm; fi

# Runs one target; leaves its exit status, seconds and seed count in its folder.
fuzz_one() {
  local target=$1 dir="$run_dir/$1" begin rc=0
  mkdir -p "$dir/corpus"
  cp tests/fuzz/corpus/"$target"/* "$dir/corpus/"
  ls "$dir/corpus" | wc -l >"$dir/seeds"
  begin=$(date +%s)
  TMPDIR=$scratch "$build_dir/tests/fuzz/${target}_fuzz" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" \
    >"$dir/log" 2>&1 || rc=$?
  echo $(($(date +%s) - begin)) >"$dir/seconds"
  echo "$rc" >"$dir/rc"
}

echo "fuzz: ${targets[*]}, $seconds s each, $parallel at a time, in $run_dir"
for target in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  fuzz_one "$target" &
done
wait

final_stat() {  # final_stat NAME LOG: libFuzzer's final stat::NAME
  sed -n "s/^stat::$1: *//p" "$2" | tail -1
}
failed=0
printf '%-11s %-8s %8s %12s %8s %14s %s\n' target result seconds execs exec/s corpus coverage
for target in "${targets[@]}"; do
  dir="$run_dir/$target"
  rc=$(cat "$dir/rc")
  result=ok
  if [[ $rc != 0 ]]; then
    result="FAILED($rc)"
    failed=1
  fi
  coverage=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$dir/log" | tail -1 || true)
  printf '%-11s %-8s %8s %12s %8s %14s %s\n' "$target" "$result" "$(cat "$dir/seconds")" \
    "$(final_stat number_of_executed_units "$dir/log")" "$(final_stat average_exec_per_sec "$dir/log")" \
    "$(cat "$dir/seeds") -> $(ls "$dir/corpus" | wc -l)" "$coverage"
done
for target in "${targets[@]}"; do
  dir="$run_dir/$target"
  if [[ $(cat "$dir/rc") != 0 ]]; then
    echo "---- $target: the end of $dir/log (reproducer: $dir/crash-*, leak-*, timeout-*, oom-*)"
    tail -n 40 "$dir/log"
  fi
done
echo "fuzz: $(($(date +%s) - started)) s in all"
exit "$failed"
