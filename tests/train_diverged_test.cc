// A run that diverges (inf or NaN in the loss or the weights) stops at the step where it happens,
// naming it, and leaves no checkpoint behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <regex>

#include "actors/run/trainer.h"
#include "cli_util.h"
#include "config_util.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using troupe::testing::fashionMnistOptions;
using troupe::testing::TempDir;

TrainOptions mlpOptions(const std::string& dir) {
  TrainOptions o = fashionMnistOptions("mlp", dir);
  o.batch_size = 64;
  o.epoch_size = 64 * 20;
  o.num_epochs = 2;
  o.checkpoint_every = 1;
  o.threads = 1;
  return o;
}

// The run's failure, "" if it ended normally.
std::string failureOf(const TrainOptions& o) {
  try {
    runTraining(o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Checkpoints and their temporaries in `dir`.
int checkpointFiles(const fs::path& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    n += e.path().filename().string().find(".ckpt") != std::string::npos ? 1 : 0;
  return n;
}

TEST(Divergence, AnAbsurdLearningRateStopsTheRunNamingTheStepAndWritesNoCheckpoint) {
  TempDir dir("diverged_lr");
  auto o = mlpOptions(dir.str());
  o.base_learning_rate = 1e30f;
  const std::string failure = failureOf(o);
  // Step 0 lands on weights of ~1e27; step 1's loss overflows.
  EXPECT_TRUE(std::regex_search(
      failure, std::regex(R"(training diverged: the loss of step 1 \(epoch 1\) is -?(nan|inf) on )"
                          R"(replica 0 of worker 0)")))
      << failure;
  // The error says which: the weights it was given were finite, so was the batch.
  EXPECT_NE(failure.find("weights and inputs are finite (largest |weight| "), std::string::npos)
      << failure;
  EXPECT_NE(failure.find("the forward pass overflowed"), std::string::npos) << failure;
  EXPECT_EQ(checkpointFiles(dir.path()), 0);
}

// An update that leaves inf in the weights (an infinite weight decay), on the replicas' device:
// the run stops at that update's step, naming it, and writes no checkpoint.
void expectAnUpdateOfInfStopsTheRunAtItsStep(const char* name, const std::vector<int>& gpus) {
  TempDir dir(name);
  auto o = mlpOptions(dir.str());
  o.gpus = gpus;
  o.optimizer.weight_decay = std::numeric_limits<float>::infinity();
  const std::string failure = failureOf(o);
  EXPECT_NE(failure.find("training diverged: the update of step 0 (epoch 1) on worker 0 left inf "
                         "or NaN in the weights (learning rate "),
            std::string::npos)
      << failure;
  EXPECT_EQ(checkpointFiles(dir.path()), 0);
}

// Checked in the update's own pass: the run stops at the update that broke the weights, before
// any replica computes with them.
TEST(Divergence, AnUpdateThatLeavesInfOrNanInTheWeightsStopsTheRunAtThatStep) {
  expectAnUpdateOfInfStopsTheRunAtItsStep("diverged_update", {});
}

// On a device the updater sends the replicas their next weights before it tests the update's
// finiteness (so that the next step queues during that wait): the run still stops at the
// update's step (an emulated GPU: tests/emulated_gpu).
TEST(Divergence, AnUpdateOnAGpuThatLeavesInfOrNanStopsTheRunAtThatStep) {
  setenv("TROUPE_CUDA_LIBRARY", TROUPE_EMULATED_GPU, 1);
  setenv("TROUPE_EMULATED_GPUS", "1", 1);
  expectAnUpdateOfInfStopsTheRunAtItsStep("diverged_update_gpu", {0});
}

}  // namespace
}  // namespace troupe::actors
