// The device-aware core (issue 12): replicas, reducer and updater on the devices the run's plan
// names, buckets and weights handed over with the events after which they are final. These
// tests run where there is no GPU, on troupe's emulated one (tests/emulated_gpu: memory the host
// may not touch, work that runs late on a stream thread, each piece of it delayed here so that a
// read that does not wait for its event reads stale values). The emulator computes with the CPU
// backend's ops on one thread, so a run on emulated GPUs must end with the weights of the same
// run on the CPU with one thread per replica, to the bit.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/run/checkpoint.h"
#include "cli_util.h"
#include "kernels/backend.h"
#include "kernels/net.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using testing::exitedWith;
using testing::failedWith;
using testing::runCommand;
using testing::TempDir;
using testing::testData;
using testing::troupeBinary;

// The emulated GPUs for one command: `gpus` of them, each piece of work delayed 100 us, and each
// copy from pinned host memory 2 ms more.
std::string emulated(int gpus = 2) {
  return "TROUPE_CUDA_LIBRARY=" + std::string(TROUPE_EMULATED_GPU) +
         " TROUPE_EMULATED_GPUS=" + std::to_string(gpus) +
         " TROUPE_EMULATED_GPU_DELAY_US=100 TROUPE_EMULATED_GPU_COPY_DELAY_US=2000 ";
}

// LeNet on Fashion-MNIST for 1280 inputs in steps of `batch` a process, its checkpoint in `dir`.
// `prefix` goes before the command: variables, a launcher (troupe launch ... --).
testing::CommandResult trainLenet(const TempDir& cwd, const std::string& dir,
                                  const std::string& prefix, const std::string& flags,
                                  int batch = 64) {
  return runCommand("cd " + cwd.str() + " && " + prefix + troupeBinary() +
                    " train --model lenet --train_data " + testData("lmdb") +
                    "/train --batch_size " + std::to_string(batch) +
                    " --epoch_size 1280 --num_epochs 1 --log_every 0 "
                    "--base_learning_rate 0.05 --momentum 0.9 --checkpoint_dir " +
                    dir + " " + flags);
}

actors::Checkpoint checkpointIn(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".ckpt") return actors::loadCheckpoint(e.path().string());
  }
  ADD_FAILURE() << "no checkpoint in " << dir;
  return {};
}

::testing::AssertionResult sameWeights(const fs::path& a, const fs::path& b) {
  const auto x = checkpointIn(a), y = checkpointIn(b);
  if (x.weights.numel() == 0 || x.weights.numel() != y.weights.numel()) {
    return ::testing::AssertionFailure()
           << "weights of " << x.weights.numel() << " and " << y.weights.numel() << " elements";
  }
  if (x.metaInt("step") != y.metaInt("step")) {
    return ::testing::AssertionFailure()
           << "steps " << x.metaInt("step") << " and " << y.metaInt("step");
  }
  if (std::memcmp(x.weights.raw(), y.weights.raw(), x.weights.bytes()) != 0) {
    return ::testing::AssertionFailure() << a << " and " << b << " hold different weights";
  }
  return ::testing::AssertionSuccess();
}

// The figure after `label` in `output` (0 when the label is missing, a failure then).
double figureAfter(const std::string& output, const std::string& label) {
  const auto at = output.find(label);
  EXPECT_NE(at, std::string::npos) << "no '" << label << "' in " << output;
  return at == std::string::npos ? 0.0 : std::stod(output.substr(at + label.size()));
}

// Trains on the CPU with `cpu` and on emulated GPUs with `gpu` (after `launch`, if any, in both),
// each run evaluating the test set at its end; the GPU run must say `placement` and end with the
// CPU run's weights and its test accuracy.
void expectTheCpusWeights(const std::string& name, const std::string& cpu, const std::string& gpu,
                          const std::string& placement, const std::string& launch = "",
                          int batch = 64) {
  TempDir cwd(name);
  const std::string evaluated = " --test_data " + testData("lmdb") + "/test";
  const auto cpu_run = trainLenet(cwd, "cpu", launch, cpu + evaluated, batch);
  ASSERT_EQ(cpu_run.exit_code, 0) << cpu_run.output;
  const auto gpu_run = trainLenet(cwd, "gpu", emulated() + launch, gpu + evaluated, batch);
  ASSERT_TRUE(exitedWith(gpu_run, 0, {placement, "epoch 1 gpu memory: peak "}));
  EXPECT_TRUE(sameWeights(cwd.path() / "cpu", cwd.path() / "gpu"));
  EXPECT_EQ(figureAfter(gpu_run.output, "final test_accuracy "),
            figureAfter(cpu_run.output, "final test_accuracy "))
      << cpu_run.output << gpu_run.output;
}

// With input_dtype uint8, batches cross to each GPU as bytes and are normalised there.
TEST(Devices, TwoReplicasOnGpusSummingOnTheFirstTrainAsTwoOnTheCpu) {
  expectTheCpusWeights(
      "devices_device", "--replicas 2 --threads 2 --input_dtype uint8",
      "--gpus 0,1 --schedule device --threads 2 --input_dtype uint8",
      "replicas on cuda:0, cuda:1; gradients summed on cuda:0, weights updated on cuda:0");
}

// MXNet's local: the replicas' buckets go through pinned host memory to a reducer and updater on
// the CPU, and the weights back to each GPU. With prefetch 1 each reader writes its one pinned
// batch buffer again as soon as its replica's copy of the last batch is done, not before.
TEST(Devices, TwoReplicasOnGpusSummingOnTheCpuTrainAsTwoOnTheCpu) {
  expectTheCpusWeights("devices_local", "--replicas 2 --threads 2 --prefetch 1",
                       "--num_gpus 2 --threads 2 --prefetch 1",
                       "gradients summed on cpu, weights updated on cpu");
}

// A residual net: each block's input gradient is the sum of two layers' (the block's first
// convolution's and the shortcut's). On a GPU the convolution adds its part to the other's in
// its own pass (ConvOp::addsToDx), where the CPU sums through scratch; the emulated GPU adds as
// the CPU does, so the two runs end with the same weights; in either layout on the GPU.
TEST(Devices, AResidualNetOnAGpuSumsEachBlocksInputGradientAsTheCpu) {
  TempDir cwd("devices_resnet");
  const std::string run =
      " train --model resnet20 --train_data null --num_channels 3 --image_size 32 --num_labels 10 "
      "--batch_size 8 --epoch_size 64 --num_epochs 1 --log_every 0 --threads 1 --checkpoint_dir ";
  auto r = runCommand("cd " + cwd.str() + " && " + troupeBinary() + run + "cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string format : {"nchw", "nhwc"}) {
    r = runCommand("cd " + cwd.str() + " && " + emulated(1) + troupeBinary() + run + format +
                   " --gpus 0 --memory_format " + format);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(sameWeights(cwd.path() / "cpu", cwd.path() / format)) << format;
  }
}

// One replica alone hands its buckets to the updater, which then lives on its GPU too.
TEST(Devices, AReplicaAloneOnAGpuIsUpdatedThere) {
  expectTheCpusWeights("devices_one", "--threads 1", "--gpus 1 --threads 1",
                       "replica on cuda:1, weights updated there");
}

// Two processes, each with its replica on cuda:0 (two processes sharing one GPU, or two
// machines): the sums leave the GPU for the ring allreduce through pinned host memory and come
// back.
TEST(Devices, TwoProcessesWithAReplicaOnAGpuEachTrainAsTwoOnTheCpu) {
  expectTheCpusWeights("devices_processes", "--schedule bsp-allreduce --threads 1",
                       "--schedule bsp-allreduce --threads 1 --gpus 0",
                       "replicas on cuda:0; gradients summed on cuda:0, weights updated on cuda:0",
                       troupeBinary() + " launch -n 2 --launcher local -- ", 32);
}

// Buckets of LeNet (1.7 MB) in pieces of 0.1 MiB: each piece copies to pinned host memory on
// its own, starts its own ring once its copy is done, and goes on to the updater, which copies
// it back, as its ring ends. The emulated copies from pinned memory read late, so a piece whose
// ring started before its copy was done would change the weights.
TEST(Devices, TwoProcessesRingAGpusSumInPiecesAsTwoOnTheCpu) {
  expectTheCpusWeights("devices_pieces", "--schedule bsp-allreduce --threads 1",
                       "--schedule bsp-allreduce --threads 1 --gpus 0 --ring_segment_mb 0.1",
                       "replicas on cuda:0; gradients summed on cuda:0, weights updated on cuda:0",
                       troupeBinary() + " launch -n 2 --launcher local -- ", 32);
}

// A Chrome trace's complete spans ("ph":"X") of one name prefix: [begin, end) in microseconds.
std::vector<std::pair<std::int64_t, std::int64_t>> spansOf(const std::string& trace,
                                                           const std::string& prefix) {
  static const std::regex span(
      R"re("ph":"X","name":"([^"]*)","pid":\d+,"tid":\d+,"ts":(\d+),"dur":(\d+))re");
  std::vector<std::pair<std::int64_t, std::int64_t>> found;
  for (auto it = std::sregex_iterator(trace.begin(), trace.end(), span);
       it != std::sregex_iterator(); ++it) {
    if ((*it)[1].str().rfind(prefix, 0) != 0) continue;
    const std::int64_t ts = std::stoll((*it)[2].str()), dur = std::stoll((*it)[3].str());
    found.emplace_back(ts, ts + dur);
  }
  return found;
}

// LeNet on two GPUs (schedule device) with a trace, in buckets of 10 KB, then 50 KB (ip2, ip1,
// conv2, conv1), and `flags`: the trace, or "" (and a failure) when the run failed.
std::string traceOfLenet(const TempDir& cwd, const std::string& flags) {
  const auto r = trainLenet(cwd, "gpu", emulated(),
                            "--gpus 0,1 --schedule device --threads 2 --trace trace.json "
                            "--bucket_size_mb 0.05 --first_bucket_mb 0.01 " +
                                flags);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? testing::slurp(cwd.path() / "trace.json") : "";
}

// The trace has a track per GPU with the device's own times: forward, then backward in pieces,
// each ending as a bucket is final, beside the host's tracks.
TEST(Devices, ATraceShowsEachGpusForwardAndBackwardEndingAtEachBucket) {
  TempDir cwd("devices_trace");
  const std::string trace = traceOfLenet(cwd, "");
  ASSERT_FALSE(trace.empty());
  EXPECT_NE(trace.find("\"replica/0/0 cuda:0\""), std::string::npos);
  EXPECT_NE(trace.find("\"replica/0/1 cuda:1\""), std::string::npos);
  EXPECT_NE(trace.find("\"forward\""), std::string::npos);
  // LeNet's layers from the last, in buckets of 10 KB, then 50 KB: ip2, ip1, conv2, conv1.
  std::set<std::string> buckets;
  for (auto at = trace.find("backward, to bucket ["); at != std::string::npos;
       at = trace.find("backward, to bucket [", at + 1)) {
    buckets.insert(trace.substr(at, trace.find(')', at) - at + 1));
  }
  EXPECT_GE(buckets.size(), 3u) << trace.substr(0, 2000);
  // The reducer's sums on cuda:0, by its clock: a track of their own, a span a bucket and step
  // (the last step's left out).
  EXPECT_NE(trace.find("\"reducer cuda:0\""), std::string::npos);
  EXPECT_GE(spansOf(trace, "sum [").size(), buckets.size() * 19) << trace.substr(0, 2000);
}

// ---- reducer nccl: the emulated NCCL sums in rank order, which for two GPUs is the one sum
// a + b, as troupe's own sums and ring make it, so that the weights match the CPU's to the bit.

// MXNet's kvstore nccl: two GPUs of a process, each bucket summed over both by NCCL in place.
TEST(Devices, NcclSumsTheGpusOfAProcessAsTheCpuDoes) {
  expectTheCpusWeights("devices_nccl", "--replicas 2 --threads 2",
                       "--gpus 0,1 --schedule device --reducer nccl --threads 2",
                       "replicas on cuda:0, cuda:1; gradients summed by NCCL over the run's 2 "
                       "GPU(s), weights updated on cuda:0");
}

// Two processes with a GPU each (two machines): one NCCL group of two ranks, its id passed
// through the rendezvous store; Caffe2's --use_nccl asks for it.
TEST(Devices, NcclSumsAcrossProcessesAsTheRingDoes) {
  expectTheCpusWeights("devices_nccl_processes", "--schedule bsp-allreduce --threads 1",
                       "--schedule bsp-allreduce --threads 1 --gpus 0 --use_nccl",
                       "replica on cuda:0; gradients summed by NCCL over the run's 2 GPU(s), "
                       "weights updated on cuda:0",
                       troupeBinary() + " launch -n 2 --launcher local -- ", 32);
}

// Deliver 5's path between machines: NCCL sums each process's two GPUs, then troupe's ring the
// processes' sums through pinned host memory (allreduce ring names it), as two processes of
// two CPU replicas sum.
TEST(Devices, NcclInEachProcessThenTroupesRingAcrossThem) {
  expectTheCpusWeights("devices_nccl_ring", "--schedule bsp-allreduce --replicas 2 --threads 2",
                       "--schedule bsp-allreduce --gpus 0,1 --reducer nccl --allreduce ring "
                       "--threads 2",
                       "replicas on cuda:0, cuda:1; gradients summed by NCCL over this process's "
                       "2 GPU(s), then by troupe's ring across processes, weights updated on "
                       "cuda:0",
                       troupeBinary() + " launch -n 2 --launcher local -- ", 32);
}

// Two processes with two GPUs each are one group of four ranks, process by process: the
// emulated NCCL sums in rank order, so they end as one process with four GPUs does, to the bit
// (the replicas see the same inputs in the same order either way).
TEST(Devices, NcclRanksTheGpusOfSeveralProcessesInOrder) {
  TempDir cwd("devices_nccl_ranks");
  auto r = trainLenet(cwd, "one", emulated(4),
                      "--gpus 0,1,2,3 --schedule device --reducer nccl --threads 4", 128);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = trainLenet(cwd, "two", emulated(2) + troupeBinary() + " launch -n 2 --launcher local -- ",
                 "--gpus 0,1 --schedule bsp-allreduce --reducer nccl --threads 2", 64);
  ASSERT_TRUE(exitedWith(r, 0, {"NCCL: a group of 4 GPU(s) in 2 process(es) sums the gradients"}));
  EXPECT_TRUE(sameWeights(cwd.path() / "one", cwd.path() / "two"));
}

// NCCL's sums on a track of their own, by the device's clock, overlapping the replicas' backward
// passes: a bucket is summed while the layers before it still compute.
TEST(Devices, ATraceShowsNcclSumsOverlappingTheBackwardPass) {
  TempDir cwd("devices_nccl_trace");
  const std::string trace = traceOfLenet(cwd, "--reducer nccl");
  ASSERT_FALSE(trace.empty());
  EXPECT_NE(trace.find("\"reducer nccl cuda:0\""), std::string::npos);
  const auto sums = spansOf(trace, "nccl allreduce [");
  const auto backward = spansOf(trace, "backward, to bucket [");
  // LeNet in 3 or more buckets, over 19 traced steps (the last step's sums are left out).
  EXPECT_GE(sums.size(), 3u * 19) << trace.substr(0, 2000);
  int overlapping = 0;
  for (const auto& [begin, end] : sums) {
    for (const auto& [b, e] : backward)
      overlapping += begin < e && b < end;
  }
  EXPECT_GT(overlapping, 0) << "no NCCL sum ran during a backward pass";
}

// MXNet's --kv-store nccl: the schedule device, summed by NCCL.
TEST(Devices, MxnetsKvstoreNcclIsScheduleDeviceWithReducerNccl) {
  TempDir cwd("devices_kvstore_nccl");
  const auto r = trainLenet(cwd, "gpu", emulated(), "--gpus 0,1 --kv-store nccl --dry-run");
  ASSERT_TRUE(exitedWith(r, 0,
                         {"schedule = \"device\"", "reducer = \"nccl\"",
                          "#   devices         replicas on cuda:0, cuda:1; gradients summed by "
                          "NCCL over the run's 2 GPU(s), weights updated on cuda:0"}));
}

TEST(Devices, NcclWhereItCannotSumIsRefused) {
  const std::string data = " --model lenet --train_data " + testData("lmdb") + "/train";
  const std::pair<std::string, std::string> cases[] = {
      {" --reducer nccl",
       "[error] reducer nccl: NCCL sums on GPUs, and this run has none: name them with gpus "
       "(--gpus 0,1 or --num_gpus 2), or use reducer troupe"},
      {" --num_gpus 2 --reducer nccl",
       "[error] reducer nccl: schedule 'local' sums gradients on the CPU (MXNet's local); use "
       "schedule device (one process) or bsp-allreduce (several), where NCCL sums on the GPUs"},
      {" --num_gpus 1 --reducer nccl --schedule bsp-allreduce --gradient_compression 2bit",
       "[error] reducer nccl: NCCL sums float32 gradients, and gradient_compression is 2bit; to "
       "compress between processes, name troupe's allreduce for them (allreduce ring or "
       "hierarchical: NCCL sums each process's GPUs, troupe's ring the processes), or use "
       "gradient_compression none"},
      {" --num_gpus 1 --reducer gloo", "--reducer gloo: expected troupe or nccl"},
  };
  for (const auto& [flags, error] : cases) {
    const auto r = runCommand(emulated() + troupeBinary() + " train" + data + flags);
    EXPECT_EQ(r.exit_code, 1) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(error), std::string::npos) << flags << "\n" << r.output;
  }
  // Under parameter servers, which sum themselves.
  const auto r = runCommand(
      emulated(1) + troupeBinary() + " launch -n 1 -s 1 --launcher local -- " + troupeBinary() +
      " train" + data + " --gpus 0 --reducer nccl --schedule dist_sync --epoch_size 640");
  EXPECT_TRUE(
      failedWith(r, {"reducer nccl: under schedule 'dist_sync' the parameter servers sum the "
                     "gradients; use schedule bsp-allreduce, or reducer troupe"}));
}

TEST(Devices, TheDryRunShowsTheGpusAndTf32) {
  TempDir cwd("devices_dry_run");
  const auto r = trainLenet(cwd, "gpu", emulated(), "--num_gpus 2 --enable_tensor_core --dry-run");
  ASSERT_TRUE(exitedWith(r, 0,
                         {"#   devices         replicas on cuda:0, cuda:1; gradients summed on "
                          "cpu, weights updated on cpu; TF32 on",
                          "#   replicas        2 per worker"}));
  // Its output is a config that resolves to the same devices.
  std::ofstream(cwd.path() / "dry.toml") << r.output;
  const auto again = runCommand(emulated() + troupeBinary() + " train " +
                                (cwd.path() / "dry.toml").string() + " --dry-run");
  ASSERT_TRUE(exitedWith(again, 0,
                         {"#   devices         replicas on cuda:0, cuda:1; gradients summed "
                          "on cpu, weights updated on cpu; TF32 on"}));
}

TEST(Devices, AGpuTheMachineLacksIsNamedBeforeTheRun) {
  TempDir cwd("devices_missing");
  auto r = trainLenet(cwd, "gpu", emulated(1), "--gpus 0,1");
  EXPECT_TRUE(exitedWith(r, 1,
                         {"[error] gpus 0,1: there is no cuda:1 here: this machine has 1 GPU(s), "
                          "cuda:0 to cuda:0"}));
  // No CUDA backend at all: why not, from the loader.
  r = trainLenet(cwd, "gpu", "TROUPE_CUDA_LIBRARY=/nonexistent/libtroupe_cuda.so ", "--num_gpus 1");
  EXPECT_TRUE(
      exitedWith(r, 1,
                 {"[error] gpus 0: there is no cuda:0 here: the CUDA backend "
                  "(libtroupe_cuda.so) is not loadable: /nonexistent/libtroupe_cuda.so: "}));
  EXPECT_FALSE(fs::exists(cwd.path() / "gpu")) << "a refused run wrote its checkpoint folder";
}

TEST(Devices, ScheduleDeviceWithoutGpusSaysHowToNameThem) {
  TempDir cwd("devices_schedule");
  const auto r = trainLenet(cwd, "cpu", "", "--schedule device");
  EXPECT_TRUE(exitedWith(r, 1,
                         {"[error] schedule 'device' sums gradients on a GPU, and this run has "
                          "none: name them with gpus (--gpus 0,1 or --num_gpus 2), or use "
                          "schedule 'local'"}));
}

// ---- mixed precision (precision fp16 / bf16): the emulated GPU computes each op on float16 or
// bfloat16 tensors in float32 and rounds its outputs once, as cuDNN's float-accumulating
// configurations do.

// bf16 activations change the arithmetic, so the weights differ from float32's; and the run
// learns: its training loss ends below 0.9 ln 10 (chance is ln 10 = 2.303; this run in float32
// ends at 1.92).
TEST(Devices, Bf16ComputesInReducedPrecisionAndLearns) {
  TempDir cwd("devices_bf16");
  auto r = trainLenet(cwd, "fp32", emulated(1), "--gpus 0 --threads 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = trainLenet(cwd, "bf16", emulated(1), "--gpus 0 --threads 1 --precision bf16");
  ASSERT_TRUE(exitedWith(r, 0,
                         {"precision: bf16 activations, convolutions and products; fp32 weights, "
                          "gradients and updates\n"}));
  EXPECT_EQ(r.output.find("loss scale"), std::string::npos) << r.output;  // bf16 needs none
  EXPECT_FALSE(sameWeights(cwd.path() / "fp32", cwd.path() / "bf16"));
  EXPECT_LT(figureAfter(r.output, "epoch 1 done: loss "), 0.9 * std::log(10.0)) << r.output;
}

// A net that converts its images (bf16) gets them in one staging slot, which takes the next batch
// once this step's images are converted (Net::ownInput). Were the copy not to wait for that, a
// device that computes slowly and copies fast would convert the next batch's images in its place:
// each piece of work here sleeps 1 ms and copies not at all, and the weights must be those of the
// usual delays, to the bit.
TEST(Devices, OneStagingSlotOfImagesIsRefilledOnlyOnceTheyAreConverted) {
  TempDir cwd("devices_one_slot");
  const std::string bf16 = "--gpus 0 --threads 1 --precision bf16";
  auto r = trainLenet(cwd, "usual", emulated(1), bf16);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = trainLenet(cwd, "slow",
                 "TROUPE_CUDA_LIBRARY=" + std::string(TROUPE_EMULATED_GPU) +
                     " TROUPE_EMULATED_GPUS=1 TROUPE_EMULATED_GPU_DELAY_US=1000 ",
                 bf16);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(sameWeights(cwd.path() / "usual", cwd.path() / "slow"));
}

// A dynamic loss scale of 2^24 makes the first step's output gradients overflow float16: the
// softmax's 2^24 / 64 * (1 - p) is above 65504 for any p below 0.75, and at the first step p is
// about 0.1. Each such step is skipped and the scale halved; no step of the 20 doubles it (the
// window is 2000), so after K skipped steps the scale is 2^(24 - K).
TEST(Devices, Fp16SkipsStepsWhoseGradientsOverflowAndHalvesItsLossScale) {
  TempDir cwd("devices_fp16");
  const auto r = trainLenet(cwd, "fp16", emulated(1),
                            "--gpus 0 --threads 1 --precision fp16 --initial_scale_power 24");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string label = "epoch 1 loss scale ";
  const double scale = figureAfter(r.output, label);
  const double skipped = figureAfter(r.output.substr(r.output.find(label)), ": ");
  EXPECT_GE(skipped, 1) << r.output;
  EXPECT_LT(skipped, 20) << r.output;  // some steps trained
  EXPECT_EQ(scale, std::ldexp(1.0, 24 - static_cast<int>(skipped))) << r.output;
  EXPECT_NE(r.output.find(" step(s) skipped for inf or NaN gradients (" +
                          std::to_string(static_cast<int>(skipped)) + " in all)"),
            std::string::npos)
      << r.output;
}

// At 2^40 every step of the epoch overflows (2^40 / 64 / 2^20 is still above 65504): each is
// skipped, so the weights end as they began: LeNet's initial weights from seed 1, to the bit.
TEST(Devices, Fp16StepsSkippedForOverflowLeaveTheWeightsAlone) {
  TempDir cwd("devices_fp16_skipped");
  const auto r = trainLenet(cwd, "fp16", emulated(1),
                            "--gpus 0 --threads 1 --precision fp16 --initial_scale_power 40");
  ASSERT_TRUE(exitedWith(r, 0,
                         {"epoch 1 loss scale 1.04858e+06: 20 step(s) skipped for inf or NaN "
                          "gradients (20 in all)"}));
  kernels::NetOptions lenet;  // Fashion-MNIST's 1x28x28 and 10 labels, seed 1: the run's
  lenet.model.name = "lenet";
  auto cpu = kernels::makeCpuBackend(1);
  const auto initial = kernels::makeNet(*cpu, lenet);
  const auto ck = checkpointIn(cwd.path() / "fp16");
  ASSERT_EQ(ck.weights.numel(), initial->numParams());
  EXPECT_EQ(ck.metaInt("step"), 20);
  EXPECT_EQ(std::memcmp(ck.weights.raw(), initial->weights().raw(), ck.weights.bytes()), 0);
}

// The newest checkpoint in `dir` (the highest step).
actors::Checkpoint newestIn(const fs::path& dir) {
  actors::Checkpoint newest;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".ckpt") continue;
    auto ck = actors::loadCheckpoint(e.path().string());
    if (newest.weights.numel() == 0 || ck.metaInt("step") > newest.metaInt("step"))
      newest = std::move(ck);
  }
  EXPECT_GT(newest.weights.numel(), 0) << "no checkpoint in " << dir;
  return newest;
}

// The checkpoint keeps a dynamic loss scale, and a resumed run goes on from it: killed after
// epoch 1 and resumed, an fp16 run ends as the uninterrupted one, to the bit. (Restarted at 2^24,
// the resumed epoch would skip steps that the uninterrupted one trained.) The count of skipped
// steps goes on too: the resumed run's epoch 2 line is the uninterrupted one's.
TEST(Devices, Fp16ResumesWithItsLossScale) {
  TempDir cwd("devices_fp16_resume");
  const std::string run = "cd " + cwd.str() + " && " + emulated(1) + troupeBinary() +
                          " train --model lenet --train_data " + testData("lmdb") +
                          "/train --batch_size 64 --epoch_size 1280 --log_every 0 "
                          "--base_learning_rate 0.05 --momentum 0.9 --gpus 0 --threads 1 "
                          "--precision fp16 --initial_scale_power 24 ";
  auto r = runCommand(run + "--num_epochs 2 --checkpoint_dir whole");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto epoch2 = [](const std::string& output) {  // "epoch 2 loss scale S: K ... (T in all)"
    const auto at = output.find("epoch 2 loss scale ");
    return at == std::string::npos ? std::string() : output.substr(at, output.find('\n', at) - at);
  };
  const std::string whole_epoch2 = epoch2(r.output);
  EXPECT_NE(whole_epoch2, "") << r.output;
  r = runCommand(run + "--num_epochs 1 --checkpoint_dir parts");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto first = newestIn(cwd.path() / "parts");
  EXPECT_EQ(first.meta.at("loss_scale"),
            fmt::format("{:.9g}", figureAfter(r.output, "epoch 1 loss scale ")));
  r = runCommand(run + "--num_epochs 2 --checkpoint_dir parts --resume auto");
  ASSERT_TRUE(exitedWith(r, 0, {"resuming from "}));
  EXPECT_EQ(epoch2(r.output), whole_epoch2) << r.output;
  const auto whole = newestIn(cwd.path() / "whole"), parts = newestIn(cwd.path() / "parts");
  EXPECT_EQ(whole.metaInt("step"), 40);
  EXPECT_EQ(parts.metaInt("step"), 40);
  EXPECT_EQ(whole.meta.at("loss_scale"), parts.meta.at("loss_scale"));
  EXPECT_EQ(whole.meta.at("overflow_steps"), parts.meta.at("overflow_steps"));
  ASSERT_EQ(whole.weights.numel(), parts.weights.numel());
  EXPECT_EQ(std::memcmp(whole.weights.raw(), parts.weights.raw(), whole.weights.bytes()), 0);
}

// ---- CUDA graphs (cuda_graphs) ----

// A step replayed from a CUDA graph is its work op by op, recorded once: the emulated GPU replays
// the recorded calls with the arguments they were recorded with, so a graph replayed for inputs it
// was not made for (the other of a replica's two staging buffers, another loss scale) would change
// the weights. fp16 with a dynamic loss scale of 2^24: the first steps overflow and are skipped,
// halving the scale, and a window of 4 clean steps doubles it again, each new scale a new graph.
// cuda_graphs is on by default on GPUs (auto); false goes op by op.
TEST(Devices, StepsByCudaGraphsEndWithTheWeightsOfStepsOpByOp) {
  TempDir cwd("devices_cuda_graphs");
  const std::string fp16 =
      "--gpus 0 --threads 1 --precision fp16 --initial_scale_power 24 --loss_scale_window 4";
  auto r = trainLenet(cwd, "fp16", emulated(1), fp16 + " --cuda_graphs false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("replayed from a CUDA graph"), std::string::npos) << r.output;
  r = trainLenet(cwd, "fp16_graphs", emulated(1), fp16);
  ASSERT_TRUE(
      exitedWith(r, 0, {"replica/0/0: cuda_graphs: steps replayed from a CUDA graph from step "}));
  EXPECT_TRUE(sameWeights(cwd.path() / "fp16", cwd.path() / "fp16_graphs"));
  // Two GPUs of a process, their bytes normalised there, summed on the first.
  const std::string two = "--gpus 0,1 --schedule device --threads 2 --input_dtype uint8";
  r = trainLenet(cwd, "two", emulated(), two + " --cuda_graphs false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = trainLenet(cwd, "two_graphs", emulated(), two + " --cuda_graphs");
  ASSERT_TRUE(exitedWith(r, 0, {"replica/0/1: cuda_graphs: steps replayed from a CUDA graph"}));
  EXPECT_TRUE(sameWeights(cwd.path() / "two", cwd.path() / "two_graphs"));
  // A loss scale of 2^40 overflows every step, halving the scale each time: no step's inputs
  // repeat, no graph is recorded, and the run says so.
  r = trainLenet(cwd, "never", emulated(1),
                 "--gpus 0 --threads 1 --precision fp16 --initial_scale_power 40 --cuda_graphs");
  ASSERT_TRUE(exitedWith(r, 0, {"replica/0/0: cuda_graphs: no step's inputs repeated in 8 steps"}));
}

TEST(Devices, CudaGraphsWithoutGpusAreRefusedUnlessAutoAndATracedRunGoesOpByOp) {
  TempDir cwd("devices_cuda_graphs_off");
  auto r = trainLenet(cwd, "cpu", "", "--cuda_graphs");
  EXPECT_TRUE(failedWith(r, {"[error] cuda_graphs records the steps of GPU replicas, and this run "
                             "has none"}));
  // The dry run says the same, and what a run with GPUs does.
  const std::string dry =
      troupeBinary() + " train --model lenet --train_data null --epoch_size 640 --dry-run";
  r = runCommand(dry + " --cuda_graphs");
  EXPECT_TRUE(failedWith(r, {"cuda_graphs records the steps of GPU replicas"}));
  // The dry run's row on an emulated GPU, with `flags`.
  const auto graphsRow = [&](const std::string& flags, const std::string& row) {
    const auto run = runCommand(emulated(1) + dry + " --gpus 0 " + flags);
    ASSERT_TRUE(exitedWith(run, 0, {"cuda graphs     " + row}));
  };
  const std::string replayed = "each step's forward and backward replayed from a CUDA graph";
  graphsRow("--cuda_graphs", replayed);
  // Unset (auto): on with GPUs, nothing said without them.
  r = runCommand(dry);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("cuda graphs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("# cuda_graphs = auto"), std::string::npos) << r.output;
  graphsRow("", replayed);
  graphsRow("--cuda_graphs false", "off (cuda_graphs false)");
  r = trainLenet(cwd, "traced", emulated(1),
                 "--gpus 0 --cuda_graphs --trace " + (cwd.path() / "trace.json").string());
  ASSERT_TRUE(exitedWith(r, 0, {"cuda_graphs: off in a traced run"}));
  EXPECT_EQ(r.output.find("replayed from a CUDA graph"), std::string::npos) << r.output;
}

// ---- channels-last images (memory_format) ----

// ResNet-20 for 2 steps of 16 synthetic images on an emulated GPU, its checkpoint in `dir`: the
// second step's forward reads the first's updated weights, so each layer's backward and update
// show in the weights.
testing::CommandResult trainResnet20(const TempDir& cwd, const std::string& dir,
                                     const std::string& flags) {
  return runCommand("cd " + cwd.str() + " && " + emulated(1) + troupeBinary() +
                    " train --model resnet20 --train_data null --num_channels 3 --image_size 32 "
                    "--num_labels 10 --epoch_size 32 --batch_size 16 --num_epochs 1 "
                    "--log_every 0 --gpus 0 --threads 1 --checkpoint_dir " +
                    dir + " " + flags);
}

// NHWC is a layout, not another model: the emulated GPU computes a channels-last op by the CPU's
// NCHW one between exact transposes, so every layer (convolution with its KRSC filter, batch
// norm, pooling, global pooling, the input's transpose, the filters' copies and their
// gradients' way back) must give the NCHW run's weights to the bit, in float32 and in bf16.
TEST(Devices, ChannelsLastImagesTrainAsNchwToTheBit) {
  TempDir cwd("devices_nhwc");
  for (const std::string precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    auto r =
        trainResnet20(cwd, precision + "_nchw", "--memory_format nchw --precision " + precision);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = trainResnet20(cwd, precision + "_nhwc", "--memory_format nhwc --precision " + precision);
    ASSERT_TRUE(exitedWith(r, 0, {"; channels-last images\n"}));
    EXPECT_TRUE(
        sameWeights(cwd.path() / (precision + "_nchw"), cwd.path() / (precision + "_nhwc")));
  }
}

// auto: channels last where tensor cores compute (bf16, fp16, tf32) and the model stays the same;
// LeNet's first inner product reads a 50x4x4 map, whose order NHWC would change.
TEST(Devices, ChannelsLastWhereTensorCoresComputeAndTheModelStaysTheSame) {
  const std::string dry = emulated(1) + troupeBinary() +
                          " train --train_data null --epoch_size 640 --gpus 0 --dry-run ";
  auto r = runCommand(dry + "--model resnet50 --num_channels 3 --image_size 224 --precision bf16");
  ASSERT_TRUE(exitedWith(r, 0,
                         {"#   precision       bf16 activations, convolutions and products; fp32 "
                          "weights, gradients and updates; channels-last images\n"}));
  r = runCommand(dry + "--model resnet50 --num_channels 3 --image_size 224");
  EXPECT_NE(r.output.find("#   precision       fp32\n"), std::string::npos) << r.output;
  r = runCommand(dry + "--model resnet50 --num_channels 3 --image_size 224 --tf32");
  EXPECT_NE(r.output.find("#   precision       fp32; channels-last images\n"), std::string::npos)
      << r.output;
  r = runCommand(dry + "--model lenet --precision bf16");
  EXPECT_NE(r.output.find("#   precision       bf16 activations, convolutions and products; fp32 "
                          "weights, gradients and updates\n"),
            std::string::npos)
      << r.output;
  r = runCommand(dry + "--model lenet --memory_format nhwc");
  EXPECT_TRUE(
      failedWith(r, {"[error] memory_format nhwc would change this model: its inner product "
                     "'ip1' reads a 50x4x4 map as a vector; use memory_format nchw (or "
                     "auto)"}));
  r = runCommand(troupeBinary() + " train --train_data null --epoch_size 640 --model lenet " +
                 "--memory_format nhwc");
  EXPECT_TRUE(
      failedWith(r, {"[error] memory_format nhwc lays images out for GPUs, and this run has "
                     "none"}));
}

TEST(Devices, ReducedPrecisionWithoutGpusOrUnderParameterServersIsRefused) {
  const std::string data = " --model lenet --train_data " + testData("lmdb") + "/train";
  auto r = runCommand(troupeBinary() + " train" + data + " --precision bf16");
  EXPECT_TRUE(failedWith(r, {"[error] precision bf16 computes on GPUs, and this run has none: name "
                             "them with gpus (--gpus 0 or --num_gpus 1), or use precision fp32"}));
  r = runCommand(emulated(1) + troupeBinary() + " launch -n 1 -s 1 --launcher local -- " +
                 troupeBinary() + " train" + data +
                 " --gpus 0 --precision fp16 --schedule dist_sync --epoch_size 640");
  EXPECT_TRUE(
      failedWith(r, {"precision fp16 with a loss scale under schedule 'dist_sync': the "
                     "parameter servers, each holding a shard, neither divide the scale out "
                     "nor skip an overflowing step together"}));
  r = runCommand(troupeBinary() + " train" + data + " --precision fp8");
  EXPECT_TRUE(failedWith(r, {"--precision fp8: expected fp32, fp16 or bf16"}));
}

}  // namespace
// A language model on a GPU is refused naming the op and the device: the sequence ops have CPU
// kernels only so far (kernels/backend.h).
TEST(Devices, AGptOnAGpuIsRefusedNamingTheOpAndTheDevice) {
  TempDir cwd("devices_gpt");
  ASSERT_EQ(runCommand(troupeBinary() + " convert text /usr/share/common-licenses/GPL-3 --out " +
                       cwd.str() + "/data --name lic")
                .exit_code,
            0);
  const auto run = runCommand("cd " + cwd.str() + " && " + emulated(1) + troupeBinary() +
                              " train --model gpt2 --train_data data --block_size 32 "
                              "--vocab_size 256 --n_layer 1 --n_head 1 --n_embd 8 --gpus 0");
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.output.find("has no kernel on cuda:0 yet: sequence models train on the CPU"),
            std::string::npos)
      << run.output;
}

}  // namespace troupe
