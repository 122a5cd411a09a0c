#!/usr/bin/env bash
# The elastic run of issue 11, as a user runs it: `troupe launch -n 3 --elastic 2:4` trains LeNet on
# Fashion-MNIST; worker 1 is killed (SIGKILL) part way through epoch 2; once the other two have
# re-formed, a fourth worker is started by hand with `troupe train --num_workers 2:4` and joins.
# The launcher's output, the fourth worker's and the chief's CSV log go to OUT (default
# out/elastic_demo). Run after scripts/build.sh; it converts Fashion-MNIST first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
troupe=$root/build/bin/troupe
data=${DATA_DIR:-$root/out/fashion-mnist-lmdb}
out=${1:-out/elastic_demo}
if [[ ! -d "$data/train" || ! -d "$data/test" ]]; then
  rm -rf "$data"
  "$troupe" convert fashion-mnist --out "$data" --db lmdb
fi
rm -rf "$out"
mkdir -p "$out"
cd "$out"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > secret
chmod 600 secret
args=("$root/configs/lenet.toml" --train_data "$data/train" --test_data "$data/test" --db_type lmdb
      --schedule bsp-allreduce --num_epochs 4 --threads 1 --log_every 100)

# Waits until file $1 has a line matching $2 (60 s at most).
wait_for() {
  for _ in $(seq 3000); do grep -q "$2" "$1" && return 0; sleep 0.02; done
  echo "never saw '$2' in $1" >&2
  exit 1
}
note() { echo "[demo $(date +%T.%3N)] $*" | tee -a demo.txt; }

note "troupe launch -n 3 --elastic 2:4 --run_id elastic-demo --secret-file secret -- troupe train ${args[*]}"
"$troupe" launch -n 3 --elastic 2:4 --run_id elastic-demo --secret-file secret -- troupe train \
  "${args[@]}" > launch.txt 2>&1 &
launcher=$!
wait_for launch.txt 'epoch 2 step [0-9]*/312'
# Rank 1's pid: the second name (host:pid) on a "generation 0: worker 0 of 3 (...)" line.
victim=$(grep -o "generation 0: worker 0 of 3 ([^)]*)" launch.txt | head -1 | sed 's/.*(//; s/)//' |
  cut -d, -f2 | cut -d: -f2)
note "kill -9 $victim (worker 1), part way through epoch 2"
kill -9 "$victim"
wait_for launch.txt 'generation 1: worker 0 of 2'
store=$(grep -o 'rendezvous tcp://[0-9.:]*' launch.txt | head -1 | cut -d' ' -f2)
note "a fourth worker: troupe train ${args[*]} --num_workers 2:4 --rendezvous $store --run_id elastic-demo --secret_file secret"
code=0
"$troupe" train "${args[@]}" --num_workers 2:4 --rendezvous "$store" --run_id elastic-demo \
  --secret_file secret > fourth.txt 2>&1 || code=$?
note "the fourth worker exited $code"
code=0
wait "$launcher" || code=$?
note "the launcher exited $code"
cp ./*.log chief_log.csv
echo "outputs in $PWD: demo.txt launch.txt fourth.txt chief_log.csv"
