#!/usr/bin/env bash
# The package a user installs, from a finished build (ctest InstalledPackage; also by hand:
# `bash tests/install/check.sh build .`):
#   1. `cmake --install BUILD --prefix P`, then tests/install/consumer built with find_package(troupe
#      COMPONENTS static) against P, linking troupe::troupe (shared) and troupe::troupe_static, and
#      run; tests/install/shared_only, with no component, looks for no third-party package;
#   2. examples/ built against P, and its KVStore training loop run for an epoch (it must learn),
#      alone (local), as 2 workers and 1 server (dist_sync) under the installed `troupe launch`,
#      and as 2 workers started by hand with MXNet's DMLC_* variables and examples/ps_service
#      (which, killed, each worker names at once);
#      examples/memory_reader trains on records from its memory, examples/custom_reader from a
#      Reader actor of its own; examples/evaluator joined to a
#      2-worker run of the installed troupe, its Prometheus metrics fetched over HTTP (also
#      behind 10 idle connections, in under 2 s);
#      the same program as in 1 built with `pkg-config --cflags --libs troupe` and run;
#   3. a project that takes troupe in with add_subdirectory configures (tests and benchmarks off);
#   4. `cpack -G DEB`: the package holds the library, headers, CMake and pkg-config files and the
#      CLI, not the CUDA plugin; unpacked, its troupe runs; apt resolves its dependencies from
#      Debian (simulated).
# Where the build has the CUDA plugin, `cmake --install BUILD --component cuda` installs it, and the
# installed troupe loads it.
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step() { echo "== $*"; }
quiet() { "$@" > "$tmp/out.log" 2>&1 || { cat "$tmp/out.log"; echo "failed: $*"; exit 1; }; }

step "cmake --install $build --prefix P"
quiet cmake --install "$build" --prefix "$tmp/prefix"
if [[ -f "$build/lib/libtroupe_cuda.so" ]]; then
  step "cmake --install $build --component cuda: the CUDA plugin, which the installed troupe loads"
  quiet cmake --install "$build" --prefix "$tmp/prefix" --component cuda
  "$tmp/prefix/bin/troupe" info | grep "cuda plugin: $tmp/prefix/lib/libtroupe_cuda.so" ||
    { "$tmp/prefix/bin/troupe" info; echo "the installed troupe does not load the installed plugin"; exit 1; }
fi
step "find_package(troupe): shared and static"
quiet cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix"
quiet cmake --build "$tmp/consumer" -j2
"$tmp/consumer/consumer_shared"
"$tmp/consumer/consumer_static"
# (grep > /dev/null, not grep -q: under pipefail, ldd killed by SIGPIPE would fail the line)
ldd "$tmp/consumer/consumer_shared" | grep "libtroupe.so.0 => $tmp/prefix/lib/" > /dev/null ||
  { echo "consumer_shared does not load the installed libtroupe.so"; exit 1; }
step "find_package(troupe) without components: the shared library only"
quiet cmake -S "$src/tests/install/shared_only" -B "$tmp/shared_only" -DCMAKE_PREFIX_PATH="$tmp/prefix"
quiet cmake --build "$tmp/shared_only"
"$tmp/shared_only/consumer"
if grep -E "^(dnnl|spdlog|CapnProto|leveldb)_DIR" "$tmp/shared_only/CMakeCache.txt"; then
  echo "find_package(troupe) looked for third-party packages without COMPONENTS static"
  exit 1
fi

step "examples/ against the install: the KVStore training loop"
quiet cmake -S "$src/examples" -B "$tmp/examples" -DCMAKE_PREFIX_PATH="$tmp/prefix"
quiet cmake --build "$tmp/examples" -j2
"$tmp/examples/kvstore_softmax" --epochs 1 | tee "$tmp/softmax.txt"
# The test accuracy of the last line that matches $1 in file $2.
accuracy() { sed -n "s/.*$1.*test accuracy \([0-9.]*\).*/\1/p" "$2" | tail -1; }
# Fails, saying that $3 did not learn, unless that accuracy is at least 0.75.
learned() {
  awk -v a="$(accuracy "$1" "$2")" 'BEGIN { exit !(a + 0 >= 0.75) }' ||
    { echo "$3 did not learn"; exit 1; }
}
# A loopback port that was free a moment ago.
free_port() {
  python3 - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
PY
}
# Starts 2 KVStore workers (examples/kvstore_softmax, dist_sync) by hand, for $2 epochs, as MXNet's
# DMLC_* variables say: their server at 127.0.0.1:$port (a free port, set here), which ps_service
# serves with run id dmlc-127.0.0.1-$port. Worker w writes to $tmp/$1_w.txt; `workers` holds their
# pids.
start_dmlc_workers() {
  port=$(free_port)
  local dmlc=(DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=1 DMLC_PS_ROOT_URI=127.0.0.1
              DMLC_PS_ROOT_PORT="$port")
  local w
  workers=()
  for w in 0 1; do
    env "${dmlc[@]}" DMLC_ROLE=worker DMLC_WORKER_ID=$w timeout 120 \
      "$tmp/examples/kvstore_softmax" --kvstore dist_sync --epochs "$2" > "$tmp/$1_$w.txt" 2>&1 &
    workers+=($!)
  done
}
# Softmax regression reaches about 0.82 on Fashion-MNIST after one epoch; 0.75 leaves room for
# another machine's rounding and still fails a loop that does not learn.
learned epoch "$tmp/softmax.txt" "the KVStore loop"
step "the KVStore loop on 2 workers and 1 server (dist_sync), started by the installed troupe launch"
"$tmp/prefix/bin/troupe" launch -n 2 -s 1 -- "$tmp/examples/kvstore_softmax" --kvstore dist_sync \
  --epochs 1 > "$tmp/softmax_dist.txt" 2>&1 || { cat "$tmp/softmax_dist.txt"; exit 1; }
grep -E "epoch|launcher\] all" "$tmp/softmax_dist.txt"
learned "worker 0. epoch 1:" "$tmp/softmax_dist.txt" "the distributed KVStore loop"
grep -q "kvstore dist_sync, 2 worker(s)" "$tmp/softmax_dist.txt" ||
  { echo "the distributed KVStore loop did not run on 2 workers"; exit 1; }
grep -q "\[launcher\] all 3 process(es) exited 0" "$tmp/softmax_dist.txt" ||
  { echo "a worker or the server of the distributed KVStore loop failed"; exit 1; }
step "the standalone parameter-server service with 2 KVStore workers started by hand (MXNet's DMLC_*)"
start_dmlc_workers by_hand 1
timeout 120 "$tmp/examples/ps_service" --kvstore dist_sync --workers 2 --servers 1 --index 0 \
  --rendezvous "tcp://127.0.0.1:$port" --run_id "dmlc-127.0.0.1-$port" > "$tmp/ps_service.txt" 2>&1 ||
  { cat "$tmp/ps_service.txt" "$tmp"/by_hand_*.txt; exit 1; }
for pid in "${workers[@]}"; do
  wait "$pid" || { cat "$tmp/ps_service.txt" "$tmp"/by_hand_*.txt; echo "a worker failed"; exit 1; }
done
grep -E "parameter server|every worker" "$tmp/ps_service.txt"
grep "epoch 1" "$tmp/by_hand_0.txt"
learned "epoch 1:" "$tmp/by_hand_0.txt" "the KVStore loop on the parameter-server service"

step "a parameter server killed mid-run: each worker stops at once, naming it"
start_dmlc_workers orphan 100000
"$tmp/examples/ps_service" --workers 2 --servers 1 --index 0 --rendezvous "tcp://127.0.0.1:$port" \
  --run_id "dmlc-127.0.0.1-$port" > "$tmp/killed_service.txt" 2>&1 &
service=$!
for _ in $(seq 600); do grep -q "^epoch 1:" "$tmp/orphan_0.txt" && break; sleep 0.1; done
{ kill -9 "$service" && wait "$service"; } 2> /dev/null || true  # killed, as meant
for w in 0 1; do
  if wait "${workers[$w]}"; then
    cat "$tmp/orphan_$w.txt"; echo "worker $w went on without its server"; exit 1
  fi
  grep "kvstore_softmax: lost the link to server 0 at" "$tmp/orphan_$w.txt" ||
    { cat "$tmp/orphan_$w.txt"; echo "worker $w did not name the lost server"; exit 1; }
done

step "a service's in-memory records as the training data (examples/memory_reader)"
(cd "$tmp" && timeout 300 "$tmp/examples/memory_reader" --config "$src/configs/mlp.toml" \
  --epochs 1) > "$tmp/memory_reader.txt" 2>&1 || { cat "$tmp/memory_reader.txt"; exit 1; }
grep -E "records in memory|^epoch" "$tmp/memory_reader.txt"
# An MLP reaches about 0.84 on Fashion-MNIST's test set after an epoch.
learned "epoch 1:" "$tmp/memory_reader.txt" "training on records from memory"

step "a Reader actor of one's own feeds the replicas from a table that fills (examples/custom_reader)"
(cd "$tmp" && timeout 300 "$tmp/examples/custom_reader" --config "$src/configs/mlp.toml" \
  --epochs 1 --replicas 2) > "$tmp/custom_reader.txt" 2>&1 || { cat "$tmp/custom_reader.txt"; exit 1; }
grep -E "arrive|^epoch|^readers" "$tmp/custom_reader.txt"
# Class-balanced sampling from the same records: about the accuracy of the database run.
learned "epoch 1:" "$tmp/custom_reader.txt" "training from a reader of one's own"
# Each of the 2 readers sent each of the epoch's 937 steps once.
grep -q "^readers: 1874 batches sent" "$tmp/custom_reader.txt" ||
  { echo "the readers did not send one batch a step each"; exit 1; }

step "the evaluator service joins a running training and serves its scores over HTTP"
port=$(free_port)
data="$build/testdata/lmdb"
workers=()
for r in 0 1; do
  (cd "$tmp" && timeout 120 "$tmp/prefix/bin/troupe" train "$src/configs/mlp.toml" \
    --train_data "$data/train" --num_epochs 2 --epoch_size 12800 --num_shards 2 --shard_id $r \
    --run_id evaluated --rendezvous "tcp://127.0.0.1:$port" --schedule bsp-allreduce \
    --threads 1 --log_every 0 --checkpoint_every 0 > "$tmp/evaluated_$r.txt" 2>&1) &
  workers+=($!)
done
timeout 180 "$tmp/examples/evaluator" --config "$src/configs/mlp.toml" --data "$data/test" \
  --records 2000 --every 20 --port 0 --linger 60 --rendezvous "tcp://127.0.0.1:$port" \
  --run_id evaluated > "$tmp/evaluator.txt" 2>&1 &
evaluator=$!
for pid in "${workers[@]}"; do
  wait "$pid" || { cat "$tmp"/evaluated_*.txt "$tmp/evaluator.txt"; echo "a worker failed"; exit 1; }
done
# The scores of the run's last step (200), fetched over HTTP while the service lingers.
metrics_port=$(sed -n 's|.*serving http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$tmp/evaluator.txt")
for _ in $(seq 100); do
  python3 -c "import urllib.request, sys; sys.stdout.write(urllib.request.urlopen(
    'http://127.0.0.1:$metrics_port/metrics', timeout=5).read().decode())" > "$tmp/metrics.txt" || true
  grep -q '^troupe_eval_step{run="evaluated"} 200$' "$tmp/metrics.txt" && break
  sleep 0.1
done
# Clients that connect and say nothing hold no one up (before: 5 s each, one after the other).
python3 - "$metrics_port" <<'PY' || { cat "$tmp/evaluator.txt"; echo "idle connections held up GET /metrics"; exit 1; }
import socket, sys, time, urllib.request
port = int(sys.argv[1])
idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(10)]
start = time.monotonic()
body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
took = time.monotonic() - start
print(f"GET /metrics behind 10 idle connections: {took:.2f} s")
sys.exit(0 if took < 2 and "troupe_eval_step" in body else 1)
PY
kill "$evaluator" 2>/dev/null || true
grep -v "^#" "$tmp/metrics.txt" || { cat "$tmp/evaluator.txt"; echo "no metrics came"; exit 1; }
grep -q '^troupe_eval_step{run="evaluated"} 200$' "$tmp/metrics.txt" ||
  { cat "$tmp/evaluator.txt"; echo "the evaluator did not score the run's last step"; exit 1; }
grep -q '^# TYPE troupe_eval_accuracy gauge$' "$tmp/metrics.txt" ||
  { echo "the metrics are not in Prometheus's text format"; exit 1; }
# An MLP reaches about 0.8 after 200 steps of 128 images; chance is 0.1.
awk '/^troupe_eval_accuracy/ { ok = $2 + 0 >= 0.6 } END { exit !ok }' "$tmp/metrics.txt" ||
  { cat "$tmp/evaluator.txt"; echo "the scored weights did not learn"; exit 1; }

step "pkg-config --cflags --libs troupe"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
quiet g++ "$src/tests/install/consumer/main.cc" $(pkg-config --cflags --libs troupe) \
  -Wl,-rpath,"$tmp/prefix/lib" -o "$tmp/pc_consumer"
"$tmp/pc_consumer"

step "add_subdirectory(troupe)"
mkdir -p "$tmp/parent"
cat > "$tmp/parent/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(parent LANGUAGES C CXX)
add_subdirectory("$src" troupe)
foreach(target libtroupe libtroupe_shared troupe_cli)
  if(NOT TARGET \${target})
    message(FATAL_ERROR "add_subdirectory(troupe) made no target \${target}")
  endif()
endforeach()
if(TARGET troupe_apps_tests OR TARGET troupe_kernels_bench)
  message(FATAL_ERROR "a parent project got troupe's tests or benchmarks")
endif()
CMAKE
quiet cmake -S "$tmp/parent" -B "$tmp/parent-build"
echo "configured; targets libtroupe, libtroupe_shared and troupe_cli, no tests"

step "cpack -G DEB"
quiet cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/deb"
deb=$(ls "$tmp"/deb/troupe_*_amd64.deb)
dpkg-deb -c "$deb" > "$tmp/contents"
for path in ./usr/bin/troupe ./usr/lib/libtroupe.a ./usr/lib/libtroupe.so.0 ./usr/include/troupe/error.h \
  ./usr/include/troupe/config.h ./usr/lib/cmake/troupe/troupeConfig.cmake ./usr/lib/pkgconfig/troupe.pc; do
  grep -q " $path" "$tmp/contents" || { echo "$deb lacks $path"; cat "$tmp/contents"; exit 1; }
done
if grep -q "libtroupe_cuda" "$tmp/contents"; then
  echo "$deb holds the CUDA plugin, whose cuDNN and NCCL Debian lacks"; exit 1
fi
dpkg-deb -f "$deb" Depends
dpkg-deb -x "$deb" "$tmp/root"
# Into a file, not `| head -1`: under pipefail, troupe killed by SIGPIPE once head has its line
# would fail the step (the longer `troupe info` grows, the likelier).
LD_LIBRARY_PATH="$tmp/root/usr/lib" "$tmp/root/usr/bin/troupe" info > "$tmp/info.txt"
head -1 "$tmp/info.txt"
apt-get install --simulate --no-install-recommends "$deb" > "$tmp/apt.log" 2>&1 ||
  { cat "$tmp/apt.log"; echo "apt cannot install $deb"; exit 1; }
grep -q "^Inst troupe" "$tmp/apt.log" || grep -q "troupe is already the newest" "$tmp/apt.log" ||
  { cat "$tmp/apt.log"; echo "apt would not install troupe"; exit 1; }
echo "apt would install $(basename "$deb") with its dependencies"
echo "InstalledPackage: all checks passed"
