// Training through the actors, in-process, on real Fashion-MNIST.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>

#include "actors/run/trainer.h"
#include "cli_util.h"
#include "config_util.h"
#include "float_bounds.h"
#include "kernels/backend.h"
#include "kernels/net.h"
#include "kernels/tensor.h"

namespace troupe::actors {
namespace {

using troupe::testing::fashionMnistOptions;
using troupe::testing::TempDir;
using troupe::testing::testData;

TrainOptions lenetOptions(const std::string& log_dir) {
  TrainOptions o = fashionMnistOptions("lenet", log_dir);
  o.base_learning_rate = 0.05f;
  o.optimizer.momentum = 0.9f;
  o.optimizer.weight_decay = 0.0005f;
  o.threads = 2;
  return o;
}

// max |a - b| / max |a|, and ||a - b|| / ||a||.
std::pair<double, double> relativeDifference(const kernels::Tensor& a, const kernels::Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double max_diff = 0, max_a = 0, sq_diff = 0, sq_a = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.f32()[i], y = b.f32()[i];
    max_diff = std::max(max_diff, std::abs(x - y));
    max_a = std::max(max_a, std::abs(x));
    sq_diff += (x - y) * (x - y);
    sq_a += x * x;
  }
  return {max_diff / max_a, std::sqrt(sq_diff / sq_a)};
}

// One replica of batch 64 against replicas whose batches add up to 64: the same sums in other
// orders (float_bounds.h; conv1's weight gradient sums 64 * 24 * 24 terms), momentum 0.9.
const double kReplicasBound = troupe::testing::sgdTrajectoryBound(64 * 24 * 24, 0.9);

// Caffe's LeNet learning rate, 0.01. (At 0.05 without warmup the first steps are chaotic enough
// that float rounding alone, e.g. 1 vs 2 threads in one replica, grows to ~4e-5 by step 20.)
TEST(Training, TwoReplicasOfBatch32GiveTheParametersOfOneReplicaOfBatch64) {
  TempDir dir("replicas");
  auto o = lenetOptions(dir.str());
  o.base_learning_rate = 0.01f;
  o.batch_size = 64;
  o.epoch_size = 64 * 20;  // 20 steps
  o.num_epochs = 1;
  o.replicas = 1;
  const auto one = runTraining(o);
  o.replicas = 2;
  const auto two = runTraining(o);
  ASSERT_EQ(one.steps, 20);
  ASSERT_EQ(two.steps, 20);
  const auto [max_rel, norm_rel] = relativeDifference(one.weights, two.weights);
  std::cout << "[ measured ] 2 replicas vs 1: relative difference max " << max_rel << ", norm "
            << norm_rel << " (bound " << kReplicasBound << ")\n";
  EXPECT_LE(max_rel, kReplicasBound);
  EXPECT_LE(norm_rel, kReplicasBound);
  // And the bound can tell: 18 steps of training move the weights ten times as far, so the
  // comparison is neither between two untouched inits nor blind to a lost step.
  o.num_epochs = 1;
  o.epoch_size = 64 * 2;
  o.replicas = 1;
  const auto early = runTraining(o);
  EXPECT_GT(relativeDifference(one.weights, early.weights).second, 10 * kReplicasBound);
}

// Pipeline stages (pipeline_stages): each batch of 64 in micro-batches whose gradients are summed,
// as replicas' are: the same sums in other orders, within kReplicasBound of one replica's run.
// Their checkpoint holds the whole model, and another number of stages resumes it.
TEST(Training, PipelineStagesTrainAsOneReplicaAndTheirCheckpointResumesWithOtherStages) {
  TempDir dir("pipeline");
  auto o = lenetOptions(dir.str());
  o.base_learning_rate = 0.01f;
  o.batch_size = 64;
  o.epoch_size = 64 * 10;
  o.num_epochs = 2;  // 20 steps
  o.checkpoint_every = 1;
  o.run_name = "one";
  const auto one = runTraining(o);
  o.pipeline.stages = 2;
  o.pipeline.micro_batches = 4;
  o.run_name = "staged";
  const auto staged = runTraining(o);
  ASSERT_EQ(staged.steps, 20);
  const auto [max_rel, norm_rel] = relativeDifference(one.weights, staged.weights);
  std::cout << "[ measured ] 2 stages of 4 micro-batches vs 1 replica: relative difference max "
            << max_rel << ", norm " << norm_rel << " (bound " << kReplicasBound << ")\n";
  EXPECT_LE(max_rel, kReplicasBound);
  EXPECT_LE(norm_rel, kReplicasBound);
  ASSERT_EQ(staged.checkpoints.size(), 2u);
  o.resume = staged.checkpoints[0];
  o.pipeline.stages = 3;
  o.pipeline.micro_batches = 2;
  o.run_name = "resumed";
  const auto resumed = runTraining(o);
  EXPECT_EQ(resumed.steps, 20);
  EXPECT_LE(relativeDifference(one.weights, resumed.weights).second, kReplicasBound);
}

TEST(Training, UnequalWorkLoadsStillMatchOneReplica) {
  TempDir dir("workload");
  auto o = lenetOptions(dir.str());
  o.base_learning_rate = 0.01f;
  o.batch_size = 64;
  o.epoch_size = 64 * 10;
  o.replicas = 1;
  const auto one = runTraining(o);
  o.replicas = 2;
  o.work_load_list = {1, 3};  // 16 + 48
  const auto two = runTraining(o);
  EXPECT_LE(relativeDifference(one.weights, two.weights).second, kReplicasBound);
}

TEST(Training, ResumingFromAMidRunCheckpointGivesTheUninterruptedResult) {
  TempDir dir("resume");
  auto o = lenetOptions(dir.str());
  o.batch_size = 32;
  o.epoch_size = 32 * 10;
  o.num_epochs = 3;
  o.checkpoint_every = 1;
  o.run_name = "full";
  const auto full = runTraining(o);
  ASSERT_EQ(full.checkpoints.size(), 3u);
  o.resume = full.checkpoints[0];  // after epoch 1 of 3
  o.run_name = "resumed";
  const auto resumed = runTraining(o);
  EXPECT_EQ(resumed.steps, full.steps);
  ASSERT_EQ(resumed.epochs.size(), 2u);
  EXPECT_EQ(resumed.epochs.front().epoch, 2);
  // The same kernels, thread count and order of every sum from the same checkpointed state: the
  // resumed run repeats the uninterrupted one's float operations exactly.
  const auto [max_rel, norm_rel] = relativeDifference(full.weights, resumed.weights);
  EXPECT_EQ(max_rel, 0.0);
  EXPECT_EQ(norm_rel, 0.0);
}

// An epoch end with nothing to keep (no checkpoint, no test data) lets the updaters go on; one
// with a checkpoint pauses them. Either way the same float operations run in the same order:
// the weights and every epoch's figures are the same bits.
TEST(Training, EpochEndsThatGoOnTrainAsThoseThatPause) {
  TempDir dir("epoch_ends");
  auto o = lenetOptions(dir.str());
  o.batch_size = 32;
  o.epoch_size = 32 * 10;
  o.num_epochs = 3;
  o.replicas = 2;
  o.checkpoint_every = 1;
  o.run_name = "paused";
  const auto paused = runTraining(o);
  o.checkpoint_every = 0;
  o.run_name = "went_on";
  const auto went_on = runTraining(o);
  EXPECT_EQ(paused.checkpoints.size(), 3u);
  EXPECT_EQ(went_on.checkpoints.size(), 1u);  // the run's end
  ASSERT_EQ(went_on.steps, paused.steps);
  ASSERT_EQ(went_on.epochs.size(), 3u);
  ASSERT_EQ(paused.epochs.size(), 3u);
  for (std::size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(went_on.epochs[e].epoch, static_cast<int>(e) + 1);
    EXPECT_EQ(went_on.epochs[e].loss, paused.epochs[e].loss) << "epoch " << e + 1;
    EXPECT_EQ(went_on.epochs[e].accuracy, paused.epochs[e].accuracy) << "epoch " << e + 1;
  }
  const auto [max_rel, norm_rel] = relativeDifference(paused.weights, went_on.weights);
  EXPECT_EQ(max_rel, 0.0);
  EXPECT_EQ(norm_rel, 0.0);
}

// no_wd (Goyal et al.): after one step, biases trained with weight decay and no_wd are those
// trained without weight decay, bit for bit (their gradient comes from the same initial weights),
// while the other weights decayed; without no_wd the biases decay too.
TEST(Training, NoWdKeepsWeightDecayOffTheBiases) {
  TempDir dir("no_wd");
  auto o = lenetOptions(dir.str());
  o.batch_size = 32;
  o.epoch_size = 32;  // one step
  o.num_epochs = 1;
  o.optimizer.momentum = 0.0f;
  o.optimizer.weight_decay = 0.5f;
  o.no_wd = true;
  const auto exempt = runTraining(o);
  o.no_wd = false;
  const auto decayed = runTraining(o);
  o.optimizer.weight_decay = 0.0f;
  const auto plain = runTraining(o);

  kernels::NetOptions net;
  net.model.name = "lenet";
  auto backend = kernels::makeCpuBackend(1);
  const auto params = kernels::makeNet(*backend, net)->params();
  int biases = 0;
  for (const auto& p : params) {
    auto same = [&](const TrainResult& a, const TrainResult& b) {
      return std::memcmp(a.weights.f32() + p.offset, b.weights.f32() + p.offset,
                         static_cast<std::size_t>(p.size) * sizeof(float)) == 0;
    };
    const bool bias = p.name.find(".bias") != std::string::npos;
    biases += bias ? 1 : 0;
    EXPECT_EQ(same(exempt, plain), bias) << p.name;
    EXPECT_FALSE(same(decayed, plain)) << p.name;
  }
  EXPECT_EQ(biases, 4);  // conv1, conv2, ip1, ip2
}

// clip_grad_norm (torch's clip_grad_norm_): a step whose gradient's global norm is above c moves
// the weights by lr * c / (norm + 1e-6) * g (SGD without momentum): a step of length lr * c, in
// the direction of the unclipped step; a c above the norm leaves the step as it was, to the bit.
TEST(Training, ClipGradNormScalesAStepDownToTheNormAndLeavesSmallerOnesAlone) {
  TempDir dir("clip");
  auto o = lenetOptions(dir.str());
  o.batch_size = 64;
  o.epoch_size = 64;  // one step
  o.num_epochs = 1;
  o.base_learning_rate = 0.1f;
  o.optimizer.momentum = 0.0f;
  o.optimizer.weight_decay = 0.0f;
  const auto plain = runTraining(o);
  o.clip_grad_norm = 0.05f;
  const auto clipped = runTraining(o);
  o.clip_grad_norm = 1e30f;
  const auto unclipped = runTraining(o);
  EXPECT_EQ(std::memcmp(plain.weights.raw(), unclipped.weights.raw(), plain.weights.bytes()), 0);

  kernels::NetOptions net;
  net.model.name = "lenet";
  net.max_batch = 1;
  auto backend = kernels::makeCpuBackend(1);
  const kernels::Tensor w0 = kernels::makeNet(*backend, net)->weights();
  double plain_sq = 0, clipped_sq = 0, dot = 0, w_sq = 0;
  for (std::int64_t i = 0; i < w0.numel(); ++i) {
    const double a = plain.weights.f32()[i] - w0.f32()[i];
    const double b = clipped.weights.f32()[i] - w0.f32()[i];
    plain_sq += a * a;
    clipped_sq += b * b;
    dot += a * b;
    w_sq += static_cast<double>(w0.f32()[i]) * w0.f32()[i];
  }
  const double step = std::sqrt(clipped_sq), expected = 0.1 * 0.05;
  ASSERT_GT(std::sqrt(plain_sq), 10 * expected) << "the gradient's norm is not above the clip";
  // Each element of w1 = w0 - lr * f * g rounds once (u |w|), and w1 - w0 then loses u |w0| and
  // u |w1| more: the step's norm is off by at most 3 u ||w|| (w1 ~ w0) plus a few roundings of
  // the step itself, and 1e-6 / norm of torch's epsilon, well below 1e-6 here.
  const double u = 1.0 / (1 << 24);
  const double bound = 3 * u * std::sqrt(w_sq) + 4 * u * expected + 1e-6 * expected;
  EXPECT_NEAR(step, expected, bound);
  // The same direction: each measured step is off its exact vector by at most `bound` (relative
  // bound / expected to the clipped one, less to the longer plain one), so the cosine is at
  // least 1 - 2 bound / expected.
  EXPECT_GE(dot / std::sqrt(plain_sq * clipped_sq), 1 - 2 * bound / expected);
}

// input_dtype uint8: readers send the raw records' bytes and the replica normalises them with
// the same (value - mean) * scale a float reader computes, so training is the same to the bit.
TEST(Training, Uint8InputTrainsAsFloatInputBitForBit) {
  TempDir dir("uint8");
  auto o = lenetOptions(dir.str());
  o.batch_size = 32;
  o.epoch_size = 32 * 10;
  o.num_epochs = 1;
  o.replicas = 2;
  const auto floats = runTraining(o);
  o.input_dtype = kernels::DType::kUInt8;
  const auto bytes = runTraining(o);
  ASSERT_EQ(floats.weights.numel(), bytes.weights.numel());
  EXPECT_EQ(0, std::memcmp(floats.weights.f32(), bytes.weights.f32(), floats.weights.bytes()));
}

std::string fileText(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// shared_reader: one reader reads every replica's share, with the same crops (drawn from seed,
// epoch and record), so training is the same to the bit as with a reader per replica. Unequal
// shares and prefetch 1 test that each replica's credit comes back to it.
TEST(Training, ASharedReaderFeedsItsReplicasWhatAReaderEachWould) {
  TempDir dir("shared_reader");
  auto o = lenetOptions(dir.str());
  o.model.name = "mlp";
  o.transform.crop = 24;
  o.transform.mirror = true;
  o.image_size = 24;
  o.decode_threads = 2;
  o.replicas = 2;
  o.work_load_list = {1, 3};
  o.prefetch = 1;
  o.batch_size = 32;
  o.epoch_size = 32 * 10;
  o.num_epochs = 2;
  const std::string each_json = (dir.path() / "each.json").string();
  const std::string shared_json = (dir.path() / "shared.json").string();
  o.trace = each_json;
  const auto each = runTraining(o);
  o.shared_reader = true;
  o.trace = shared_json;
  const auto shared = runTraining(o);
  ASSERT_EQ(each.weights.numel(), shared.weights.numel());
  EXPECT_EQ(0, std::memcmp(each.weights.f32(), shared.weights.f32(), each.weights.bytes()));
  const std::string each_trace = fileText(each_json), shared_trace = fileText(shared_json);
  EXPECT_NE(each_trace.find("\"reader/0/1\""), std::string::npos) << each_trace.substr(0, 2000);
  EXPECT_NE(shared_trace.find("\"reader/0/0\""), std::string::npos) << shared_trace.substr(0, 2000);
  EXPECT_EQ(shared_trace.find("\"reader/0/1\""), std::string::npos) << "one reader";
}

TEST(Training, LenetLearnsFashionMnistInOneEpoch) {
  TempDir dir("lenet");
  auto o = lenetOptions(dir.str());
  o.test_data = testData("lmdb") + "/test";
  o.lr_policy = kernels::LrSchedule::kCosine;  // as configs/lenet.toml
  o.num_epochs = 1;
  const auto r = runTraining(o);
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_GE(r.epochs[0].test_accuracy, 0.85);
  EXPECT_EQ(r.steps, 60000 / 64);
}

// Two replicas, each with its reader of the one LevelDB (which a process may open once: its
// readers share it) and each evaluating on the test set.
TEST(Training, MlpLearnsFashionMnistFromLevelDb) {
  TempDir dir("mlp");
  auto o = lenetOptions(dir.str());
  o.model.name = "mlp";
  o.train_data = testData("leveldb") + "/train";
  o.test_data = testData("leveldb") + "/test";
  o.db_type = data::DbType::kLevelDb;
  o.lr_policy = kernels::LrSchedule::kCosine;
  o.num_epochs = 1;
  o.replicas = 2;
  const auto r = runTraining(o);
  EXPECT_GE(r.epochs[0].test_accuracy, 0.83);
}

}  // namespace
}  // namespace troupe::actors
