#!/usr/bin/env bash
# The GPU work of one call on the GPU machine (it has nvcc, PyTorch with the CUDA libraries as
# wheels, and none of troupe's Debian libraries): build and pack here, test and measure there.
#
#   bash scripts/gpu.sh bundle   # here: build with the CUDA plugin, pack .gpu/bundle.tar.xz
#                                # (binaries, the plugin, the Debian .so files they load,
#                                # Fashion-MNIST's IDX files): under 64 MiB
#   bash scripts/gpu.sh run      # there, in the repository's copy, with .gpu carried: unpacks,
#                                # runs the parts, and leaves in $OUT (default out/gpu) two files:
#                                # summary.txt and results.tgz, every part's log and trace, packed
#                                # anew after each part (the device tool brings back at most 8
#                                # files, so a call that runs out of time still brings them all)
#
# run, most wanted first: a header in summary.txt (date, the bundle's commit, the GPU, driver, the
# CUDA, cuDNN, cuBLAS and NCCL that troupe and PyTorch load), nvidia-smi, `troupe info`, the CUDA op
# tests (troupe_cuda_tests: every op against the CPU's; those of the defaults new to a GPU, the
# graph-API convolutions, CUDA graphs and troupe's batch norm, in a process of their own), issue
# 34's table (bench/train_gpu_vs_pytorch.py: ResNet-50's whole loop, `troupe train` on synthetic
# input, by CUDA graphs and from a JPEG database, against PyTorch's loop on synthetic input and
# from a DataLoader, the kernels bench beside them, at batch 64, 128 and 256 in fp16, bf16 and
# fp32), where a mixed-precision step's memory goes (bn_ways: cuDNN's batch norm against troupe's),
# the trainer's traced steps at batch 256 beside the kernels bench's profile, ResNet-50 in 2
# processes sharing the GPU and in 1 (Chrome traces), torch.compile's figure; then earlier
# issues' parts: the host's and the device's time of single ops with a
# profile by kind of layer, the kernels bench against PyTorch eager with the convolutions the
# other way, LeNet on Fashion-MNIST on the GPU and the CPU (test accuracies), the input benchmark
# with 1 and 16 decode threads against torchvision, NCCL (a group of one GPU; 2 processes on one
# GPU, which NCCL must refuse, not hang), batch norm and ReLU variants. Each part's command, exit
# status and figures (its table's rows, or its last lines) go to summary.txt, its whole log to
# its own file; a part that fails does not stop the others, and the exit status says whether any
# failed.
# The parts share BUDGET seconds (default 570, under a call's 600): a part gets what is left, and
# none starts with less than 20 (or the part's own least, for the long ones).
#   bash scripts/gpu.sh keep FOLDER   # here, after the call: summary.txt and results.tgz to
#                                     # bench/results/gpu/DATE-DEVICE/, to be committed
# PARTS="resnet50_compile input" runs only the parts named (a second call going on where a first
# one's budget ran out; the names are those of summary.txt).
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
  # What was built: the summary's header names it (the copy there has no .git).
  {
    echo "commit $(git rev-parse HEAD) ($(git log -1 --format=%cd --date=iso-strict))"
    git status --porcelain | sed 's/^/uncommitted: /'
  } >"$stage/commit.txt"
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

part() {  # part NAME LIMIT[:LEAST] COMMAND...: runs it, its output in $OUT/NAME.txt
  # LIMIT: seconds it may take; LEAST: it is not started with fewer left (default 20).
  local name=$1 limit=${2%%:*} least=20
  [[ $2 == *:* ]] && least=${2#*:}
  shift 2
  # PARTS="resnet50 input": only those (a second call goes on where a first one's budget ended).
  if [[ -n "${PARTS:-}" && " $PARTS " != *" $name "* ]]; then return; fi
  local left=$((BUDGET - (SECONDS - began)))
  if ((left < least)); then
    echo "== $name: skipped, ${left} s of the budget left" | tee -a "$OUT/summary.txt"
    skipped=$((skipped + 1))
    return
  fi
  ((limit > left)) && limit=$left
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  local start=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "   exit $rc after $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  figures "$OUT/$name.txt" | tee -a "$OUT/summary.txt"
  ((rc == 0)) || failed=$((failed + 1))
  pack
}

# A part's figures for the summary: its tables' rows and notes where it printed a table, else its
# last lines (a test run's count, a trainer's last epoch).
figures() {
  if grep -q '^|' "$1"; then
    grep -E '^(\||#|train / |[a-z_]+ failed at)' "$1" | sed 's/^/   /'
  else
    tail -n 6 "$1" | cut -c1-400 | sed 's/^/   /'
  fi
}

# The summary's header: when, what was built, and the machine's GPU, driver and CUDA libraries.
header() {
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    cat "$root/commit.txt"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader |
      sed 's/^/gpu, driver, memory: /'
    "$root/bin/troupe" info | grep -E '^  (cuda (runtime|driver|code)|cuDNN|cuBLAS|NCCL|cpu|physical cores):'
    python3 - <<'EOF'
import torch
nccl = ".".join(map(str, torch.cuda.nccl.version()))
print(f"  PyTorch {torch.__version__}: CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}, NCCL {nccl}")
EOF
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  } >>"$OUT/summary.txt" 2>&1
}

# Keeps a call's results in the repository: bash scripts/gpu.sh keep FOLDER (the folder the device
# tool brought summary.txt and results.tgz back to) copies them to
# bench/results/gpu/DATE-DEVICE[-N]/, named by the summary's date and GPU.
keep() {
  set -e
  local from=${1:?usage: bash scripts/gpu.sh keep FOLDER}
  local date device dest
  date=$(sed -n 's/^date: \([0-9-]*\)T.*/\1/p' "$from/summary.txt")
  device=$(sed -n 's/^gpu, driver, memory: \([^,]*\),.*/\1/p' "$from/summary.txt" |
    tr 'A-Z ' 'a-z-' | sed 's/^nvidia-//')
  dest=bench/results/gpu/${date:?no date in the summary}-${device:?no gpu in the summary}
  local n=1 base=$dest
  while [[ -e $dest ]]; do
    n=$((n + 1))
    dest=$base-$n
  done
  mkdir -p "$dest"
  cp "$from/summary.txt" "$from/results.tgz" "$dest/"
  echo "kept in $dest"
}

# Every part's files, in the work folder $OUT, packed into $final/results.tgz beside a copy of
# summary.txt: two files whatever the number of parts (the device tool brings back 8 at most).
pack() {
  tar -C "$OUT" -czf "$final/.results.tgz" . && mv "$final/.results.tgz" "$final/results.tgz"
  cp "$OUT/summary.txt" "$final/summary.txt"
}

run() {
  final=${OUT:-out/gpu}
  mkdir -p "$final"
  final=$(cd "$final" && pwd)
  local root=/tmp/troupe-gpu
  rm -rf "$root" && mkdir -p "$root"
  tar -C "$root" -xJf .gpu/bundle.tar.xz || { echo "no .gpu/bundle.tar.xz: carry .gpu"; exit 2; }
  # The parts write here; pack() copies it all to $final after each part.
  OUT=$root/out
  mkdir -p "$OUT"
  export LD_LIBRARY_PATH="$root/lib:$(wheel_libs):/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  # GPU_PLUGIN: another plugin, e.g. the tests' emulated GPU to rehearse the call here
  # (GPU_PLUGIN=$PWD/build/tests/libtroupe_emulated_gpu.so).
  export TROUPE_CUDA_LIBRARY="${GPU_PLUGIN:-$root/lib/libtroupe_cuda.so}"
  : >"$OUT/summary.txt"
  failed=0 skipped=0
  BUDGET=${BUDGET:-570}
  began=$SECONDS
  local troupe="$root/bin/troupe" fashion="$root/fashion"
  # Most wanted first, as one call of a session with 15 minutes of device time may be all there
  # is: every figure the issues must show (12: the CUDA op tests, ResNet-50 against PyTorch eager
  # in bf16 and fp32, LeNet's accuracy on the GPU and the CPU, 2 processes sharing the GPU beside
  # one alone, torch.compile's figure; 14: the input benchmark at 16 cores), then the rest.
  header
  part nvidia-smi 20 nvidia-smi
  part info 20 "$troupe" info
  # The tests of the defaults new to a GPU (the graph-API convolutions, CUDA graphs, batch norm in
  # troupe's kernels, which the batch norm tests take as one of their ways) in a process of their
  # own: if it crashes, it cannot take the other op tests' results with it.
  local new_tests='*ByGraphPlans*:*CudaGraphs*:*Capture*:*BatchNorm*'
  part cuda_tests 70 "$root/bin/troupe_cuda_tests" --gtest_filter="-$new_tests"
  part cuda_tests_new_defaults 50 "$root/bin/troupe_cuda_tests" --gtest_filter="$new_tests"
  # Issue 34's table: ResNet-50's whole loop, troupe train (synthetic, by CUDA graphs, from JPEGs)
  # against PyTorch's loop (synthetic, DataLoader), the kernels bench beside them, each batch and
  # precision, row by row (a part cut short keeps the rows it printed).
  part train_table "${TABLE_LIMIT:-420}:120" python3 bench/train_gpu_vs_pytorch.py \
    --troupe "$troupe" --bench "$root/bin/troupe_kernels_bench" --batches "${BATCHES:-64,128,256}" \
    --precisions "${PRECISIONS:-fp16,bf16,fp32}" --seconds "${SECONDS_PER_ROW:-1.5}" \
    --budget "$((${TABLE_LIMIT:-420} - 30))" --row-limit 90 --logs "$OUT/train_table" \
    --compile-rows "${TABLE_COMPILE_ROWS:-}"
  # Where a mixed-precision step's memory goes beside PyTorch's: ResNet-50 at batch 256 with
  # cuDNN's persistent batch norm (its ReLU in the same call, a reserve space kept from each
  # forward to its backward) and with troupe's batch norm kernels (no reserve), in the kernels
  # bench (its step's speed and peak, one backend) and in troupe train (the whole process's peak,
  # the updater's memory too).
  part bn_ways 160:60 bash -c '
    for precision in bf16 fp16; do
      for way in persistent troupe; do
        echo "-- $precision, TROUPE_CUDA_BATCH_NORM=$way"
        TROUPE_CUDA_BATCH_NORM=$way "$1" --device cuda:0 --models resnet50 --batch 256 \
          --seconds 2 --no-ops --precision $precision --channels-last --profile | grep -E "^resnet50|bn"
        [[ $precision == bf16 ]] || continue
        TROUPE_CUDA_BATCH_NORM=$way "$2" train --model resnet50 \
          --train_data null --num_channels 3 --image_size 224 --num_labels 1000 --batch_size 256 \
          --epoch_size 3840 --num_epochs 2 --gpus 0 --precision $precision --log_every 0 \
          --log_dir "$3/bn_ways_$way" --checkpoint_dir "/tmp/ck_bn_$way" 2>&1 |
          grep -E "epoch 2 (done|gpu memory)"
      done
    done' _ "$root/bin/troupe_kernels_bench" "$troupe" "$OUT"
  # The trainer's traced steps (op by op, with each step's device spans; bench/trace_steps.py: the
  # device's busy time a step against the period, the gap is the device waiting for the host)
  # beside the kernels bench's profile of the same batch, by kind of layer: where a step's time
  # goes (train / kernels was 0.91-0.96 until the epoch's end stopped pausing the device, 0.99-1.02
  # since).
  part trainer_trace_b256 100:60 env TRACE="$OUT/trace_trainer_b256.json" bash -c \
    '"$@" && python3 bench/trace_steps.py "$TRACE" --batch 256' _ "$troupe" train \
    --model resnet50 --train_data null --num_channels 3 --image_size 224 --num_labels 1000 \
    --batch_size 256 --epoch_size 5120 \
    --num_epochs 2 --gpus 0 --precision fp16 --log_every 5 --log_dir "$OUT/trainer_trace_b256" \
    --checkpoint_dir "$root/ck_trace_b256" --trace "$OUT/trace_trainer_b256.json"
  part kernels_profile_b256 60 "$root/bin/troupe_kernels_bench" --device cuda:0 \
    --models resnet50 --batch 256 --seconds 2 --no-ops --precision fp16 --channels-last --profile
  # Two processes sharing the GPU through troupe's own path (pinned host memory, the ring), and
  # one alone: ResNet-50 in mixed precision on synthetic input, 30 steps of 32 a process,
  # gradients of 100 MB a step whose ring the traces show beside the backward pass.
  local mixed=${MIXED:-fp16}
  local r50=(train --model resnet50 --train_data null --num_channels 3 --image_size 224
    --num_labels 1000 --batch_size 32 --num_epochs 1 --gpus 0 --precision "$mixed" --log_every 10
    --checkpoint_dir "$root/ck_r50_shared")
  part resnet50_two_processes 100:40 "$troupe" launch -n 2 --launcher local -- "$troupe" \
    "${r50[@]}" --epoch_size 1920 --schedule bsp-allreduce \
    --trace "$OUT/trace_resnet50_two_processes.json" --log_dir "$OUT/resnet50_two"
  part resnet50_one_process 60 "$troupe" "${r50[@]}" --epoch_size 960 \
    --trace "$OUT/trace_resnet50_one_process.json" --log_dir "$OUT/resnet50_one"
  # Issue 37's sharded state on GPUs: the same 2 processes with AdamW, its state whole in each and
  # sharded (--zero_stage 1): the chief process's peak on the GPU and the epoch's images/s.
  part zero_two_processes 120:60 bash -c '
    logs=$1
    shift
    for zero in 0 1; do
      echo "-- zero_stage $zero"
      "$@" --optimizer adamw --base_learning_rate 0.001 --zero_stage $zero \
        --log_dir "$logs/zero_$zero" 2>&1 | grep -E "epoch 1 (done|gpu memory)|zero_stage|error"
    done' _ "$OUT" "$troupe" launch -n 2 --launcher local -- "$troupe" "${r50[@]}" \
    --epoch_size 1920 --schedule bsp-allreduce
  local r50bench=(python3 bench/gpu_vs_pytorch.py --bench "$root/bin/troupe_kernels_bench"
    --batches "${BATCHES:-64,128,256}" --seconds "${SECONDS_PER_ROW:-3}")
  # torch.compile's figure beside the table's rows of that batch (it compiles for a minute or
  # more): not started with less than 120 s left.
  part resnet50_compile 200:120 "${r50bench[@]}" --batches "${COMPILE_BATCHES:-128}" \
    --precisions "${COMPILE_PRECISIONS:-$mixed}" --compile-only
  # What the table's parts do not show, for the speed work after it (earlier issues' parts).
  # First, in a minute, what decides the next step of the speed work. Where a step's host time
  # goes (troupe_kernels_bench's host figure beside its step's): the host and device time of single
  # convolution, batch norm and ReLU calls at batch 64, fp16 NHWC.
  # Each with --profile: the step's device time by kind of layer (convolutions, batch norms, the
  # weight copies, ...), which says where a GPU-bound step goes.
  part host_ops 60 "$root/bin/troupe_kernels_bench" --device cuda:0 --models resnet50 --batch 64 \
    --seconds 2 --no-ops --precision fp16 --channels-last --host-ops --profile
  # The same with the convolutions by cuDNN's legacy calls (TROUPE_CUDA_CONV=legacy), each of
  # which cost the H100's host as long as its kernel (stop 31); the resnet50 part's table has a
  # column of each row run the other way too (--other-conv).
  part host_ops_legacy 60 env TROUPE_CUDA_CONV=legacy "$root/bin/troupe_kernels_bench" \
    --device cuda:0 --models resnet50 --batch 64 --seconds 2 --no-ops --precision fp16 \
    --channels-last --host-ops
  # The same in fp32 NCHW, troupe's strict-fp32 layout, where cuDNN refuses its batch norm with the
  # ReLU and troupe's kernels take those batch norms (the ReLU and add in their pass): what the
  # convolutions and the batch norms each cost of an fp32 step, which the 1.1x goal in fp32 needs.
  part host_ops_fp32 60 "$root/bin/troupe_kernels_bench" --device cuda:0 --models resnet50 \
    --batch 64 --seconds 2 --no-ops --host-ops --profile
  # The same with cuDNN's batch norms throughout and troupe's ReLU kernels after them: the batch
  # norm rows beside host_ops_fp32's, and the step's.
  part host_ops_fp32_cudnn_bn 60 env TROUPE_CUDA_BATCH_NORM=persistent \
    "$root/bin/troupe_kernels_bench" --device cuda:0 --models resnet50 --batch 64 --seconds 2 \
    --no-ops --host-ops --profile
  # Kernels bench vs PyTorch eager, with its convolutions the other way and by CUDA graphs.
  local other=bf16
  [[ $mixed == bf16 ]] && other=fp16
  # Each troupe row three times: op by op, by CUDA graphs (--cuda-graphs: one launch a step for the
  # host), and with its convolutions the other way (--other-conv).
  part resnet50 380:240 "${r50bench[@]}" --cuda-graphs --other-conv \
    --precisions "${PRECISIONS:-$mixed,fp32}"
  # The trainer's steps by CUDA graphs (cuda_graphs), beside resnet50_trainer's op by op (which is
  # traced, and a traced run goes op by op).
  part resnet50_trainer_graphs 90:40 "$troupe" train --model resnet50 --train_data null \
    --num_channels 3 --image_size 224 --num_labels 1000 --batch_size 64 --epoch_size 3200 \
    --num_epochs 3 --gpus 0 --precision "$mixed" --log_every 10 --cuda_graphs \
    --log_dir "$OUT/resnet50_trainer_graphs" --checkpoint_dir "$root/ck_r50_graphs"
  # LeNet on the GPU must reach the CPU's test accuracy (issue 12).
  # The parts after it read its database: asked for by name (PARTS) too when one of them is.
  local parts=${PARTS:-}
  if [[ -n $parts && " $parts " =~ \ (lenet|nccl)[a-z0-9_]*\  ]]; then PARTS="$parts convert"; fi
  part convert 30 "$troupe" convert fashion-mnist --source "$root/data" --out "$fashion"
  PARTS=$parts
  local lenet=(configs/lenet.toml --train_data "$fashion/train" --test_data "$fashion/test"
    --log_every 0)
  part lenet_gpu 60 "$troupe" train "${lenet[@]}" --num_epochs 3 --gpus 0 \
    --log_dir "$OUT/lenet_gpu" --checkpoint_dir "$root/ck_gpu"
  part lenet_cpu 60 "$troupe" train "${lenet[@]}" --num_epochs 3 --log_dir "$OUT/lenet_cpu" \
    --checkpoint_dir "$root/ck_cpu"
  # Issue 14: decode and the ResNet-50 transform on 1 and 16 cores, against the resnet50 part's
  # images/s (DALI is not on that machine).
  part input 100:40 python3 bench/input_vs_peers.py --troupe "$troupe" --python python3 \
    --peers torchvision --threads 1,16 --rounds 1
  # The rest, for what the figures above do not show.
  part resnet50_more 200:40 "${r50bench[@]}" --precisions "${MORE_PRECISIONS:-$other,tf32}"
  part lenet_gpu_bf16 60 "$troupe" train "${lenet[@]}" --num_epochs 3 --gpus 0 --precision bf16 \
    --log_dir "$OUT/lenet_gpu_bf16" --checkpoint_dir "$root/ck_gpu_bf16"
  # reducer nccl: a group of one GPU in one process (NCCL refuses two ranks on one GPU, so two
  # processes here must fail at once, naming NCCL's refusal, rather than hang).
  part lenet_nccl 60 "$troupe" train "${lenet[@]}" --num_epochs 1 --gpus 0 --schedule device \
    --reducer nccl --log_dir "$OUT/lenet_nccl" --checkpoint_dir "$root/ck_nccl"
  part nccl_one_gpu_two_processes 60 bash -c \
    'out=$("$@" 2>&1); rc=$?; echo "$out"; ((rc != 0)) && grep -q "NCCL: the group" <<<"$out"' \
    _ "$troupe" launch -n 2 --launcher local \
    -- "$troupe" train "${lenet[@]}" --num_epochs 1 --gpus 0 --schedule bsp-allreduce \
    --reducer nccl --rendezvous_timeout 30 --log_dir "$OUT/nccl_two" \
    --checkpoint_dir "$root/ck_nccl_two"
  part resnet50_trainer 90:40 "$troupe" train --model resnet50 --train_data null --num_channels 3 \
    --image_size 224 --num_labels 1000 --batch_size 64 --epoch_size 3200 --num_epochs 3 \
    --gpus 0 --precision "$mixed" --log_every 10 --log_dir "$OUT/resnet50_trainer" \
    --checkpoint_dir "$root/ck_r50" \
    --trace "$OUT/trace_resnet50.json"
  # The same two-process comparison with LeNet (small gradients, short steps).
  local shared=(train "${lenet[@]}" --num_epochs 1 --epoch_size 19200 --gpus 0
    --checkpoint_dir "$root/ck_shared")
  part lenet_two_processes 90 "$troupe" launch -n 2 --launcher local -- "$troupe" "${shared[@]}" \
    --schedule bsp-allreduce --batch_size 32 --trace "$OUT/trace_two_processes.json" \
    --log_dir "$OUT/lenet_two"
  part lenet_one_process 60 "$troupe" "${shared[@]}" --trace "$OUT/trace_one_process.json" \
    --log_dir "$OUT/lenet_one"
  # troupe's ResNet-50 alone at batch 128 in bf16 and fp16, beside the resnet50 part's rows of
  # that batch, but with batch norm by cuDNN's spatial calls instead of its persistent Ex calls
  # (the default, as PyTorch trains), and with each ReLU (and add) apart from its batch norm (the
  # default fuses them).
  local variant=(bash -c 'for p in bf16 fp16; do "$@" --precision $p; done' _
    "$root/bin/troupe_kernels_bench" --device cuda:0 --models resnet50 --batch 128
    --seconds "${SECONDS_PER_ROW:-3}" --no-ops --channels-last)
  part resnet50_bn_spatial 60 env TROUPE_CUDA_BATCH_NORM=spatial "${variant[@]}"
  part resnet50_no_fuse 60 "${variant[@]}" --no-fuse
  # fp32 in channels-last, which troupe's resnet50 rows keep for the tensor-core types (PyTorch's
  # rows are channels-last in every type): is it the faster layout for float32 too?
  part resnet50_fp32_nhwc 30 "$root/bin/troupe_kernels_bench" --device cuda:0 --models resnet50 \
    --batch 128 --seconds "${SECONDS_PER_ROW:-3}" --no-ops --channels-last
  echo "failed parts: $failed; skipped for the budget: $skipped" | tee -a "$OUT/summary.txt"
  pack
  echo "results: $final/summary.txt and $final/results.tgz (tar -xzf it)"
  ((failed == 0))
}

case "$mode" in
  bundle) bundle ;;
  run) run ;;
  keep) keep "${2:-}" ;;
  *)
    echo "usage: bash scripts/gpu.sh bundle|run|keep FOLDER" >&2
    exit 2
    ;;
esac
