#!/usr/bin/env bash
# The GPU work of one call on the GPU machine (it has nvcc, PyTorch with the CUDA libraries as
# wheels, and none of troupe's Debian libraries): build and pack here, test and measure there.
#
#   bash scripts/gpu.sh bundle   # here: build with the CUDA plugin, pack .gpu/bundle.tar.xz
#                                # (binaries, the plugin, the Debian .so files they load,
#                                # Fashion-MNIST's IDX files): under 64 MiB
#   bash scripts/gpu.sh run      # there, in the repository's copy, with .gpu carried: unpacks,
#                                # then writes under $OUT (default out/gpu) what it ran and found
#
# run: `troupe info`, nvidia-smi, the CUDA op tests (troupe_cuda_tests: every op against the
# CPU's), ResNet-50 training steps troupe vs PyTorch eager (bench/gpu_vs_pytorch.py), and the
# input benchmark with 1, 8 and 16 decode threads against torchvision (bench/input_vs_peers.py;
# DALI is not on that machine). Each part's log is its own file; a part that fails does not stop
# the others, and the exit status says whether any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}

bundle() {
  set -e
  bash scripts/setup.sh
  local build=${BUILD_DIR:-build}
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTROUPE_USE_CUDA=ON >/dev/null
  ninja -C "$build" -j "${JOBS:-2}" troupe_cli troupe_cuda troupe_cuda_tests troupe_kernels_bench
  local stage
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" "$stage/data"
  cp "$build/bin/troupe" "$build/tests/troupe_cuda_tests" "$build/bench/troupe_kernels_bench" \
    "$stage/bin/"
  cp "$build/lib/libtroupe_cuda.so" "$stage/lib/"
  # The Debian libraries the binaries load, less the C runtime (newer there) and the CUDA
  # libraries (the wheels' there).
  ldd "$stage"/bin/* | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
    grep -v '/usr/local/cuda' | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
  cp /usr/share/datasets/fashion-mnist/*.gz "$stage/data/"
  mkdir -p .gpu
  tar -C "$stage" -cf - . | xz -T2 -6 > .gpu/bundle.tar.xz
  rm -rf "$stage"
  local mib=$(($(stat -c %s .gpu/bundle.tar.xz) / 1048576))
  echo "wrote .gpu/bundle.tar.xz: ${mib} MiB (a call carries at most 64 MiB)"
  ((mib < 64))
}

# The folders of the CUDA libraries that python3's PyTorch wheels ship (nvidia/*/lib).
wheel_libs() {
  python3 - <<'EOF'
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
dirs = set()
for root in roots:
    for pattern in ("libcudnn.so.9", "libcublas.so.*", "libcublasLt.so.*", "libnccl.so.2"):
        for f in glob.glob(os.path.join(root, "**", pattern), recursive=True):
            dirs.add(os.path.dirname(f))
print(":".join(sorted(dirs)))
EOF
}

part() {  # part NAME TIMEOUT COMMAND...: runs it, its output in $OUT/NAME.txt
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  tail -n 25 "$OUT/$name.txt"
  ((rc == 0)) || failed=$((failed + 1))
}

run() {
  OUT=${OUT:-out/gpu}
  mkdir -p "$OUT"
  local root=/tmp/troupe-gpu
  rm -rf "$root" && mkdir -p "$root"
  tar -C "$root" -xJf .gpu/bundle.tar.xz || { echo "no .gpu/bundle.tar.xz: carry .gpu"; exit 2; }
  export LD_LIBRARY_PATH="$root/lib:$(wheel_libs):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  export TROUPE_CUDA_LIBRARY="$root/lib/libtroupe_cuda.so"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >"$OUT/summary.txt"
  failed=0
  part nvidia-smi 30 nvidia-smi
  part info 30 "$root/bin/troupe" info
  part cuda_tests 300 "$root/bin/troupe_cuda_tests"
  part resnet50 420 python3 bench/gpu_vs_pytorch.py --bench "$root/bin/troupe_kernels_bench" \
    --batches "${BATCHES:-64,128,256}" --seconds "${SECONDS_PER_ROW:-6}"
  part input 300 python3 bench/input_vs_peers.py --troupe "$root/bin/troupe" --python python3 \
    --peers torchvision --threads 1,8,16 --rounds 2
  echo "failed parts: $failed" | tee -a "$OUT/summary.txt"
  ((failed == 0))
}

case "$mode" in
  bundle) bundle ;;
  run) run ;;
  *)
    echo "usage: bash scripts/gpu.sh bundle|run" >&2
    exit 2
    ;;
esac
