// `troupe train --dry-run`: the config resolved and checked as a run would, the model's layers,
// the data and the plan printed, nothing trained and nothing written.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "actors/run/checkpoint.h"
#include "cli_util.h"

namespace troupe {
namespace {

using namespace testing;

namespace fs = std::filesystem;

// troupe train in `cwd`, logging to cwd/logs.
testing::CommandResult train(const TempDir& cwd, const std::string& args,
                             const std::string& env = "") {
  return runCommand("cd " + cwd.str() + " && " + env + " " + troupeBinary() + " train " + args +
                    " --log_dir " + cwd.str() + "/logs");
}

std::string lenet() {
  return sourceDir() + "/configs/lenet.toml";
}

// The dry run of LeNet's config on the test data with `flags`, in `cwd`.
testing::CommandResult dryRunLenet(const TempDir& cwd, const std::string& flags,
                                   const std::string& env = "") {
  return train(cwd, lenet() + dataFlags() + flags + " --dry-run", env);
}

// The message of spdlog's "[time] [error] MESSAGE" line.
std::string errorMessage(const std::string& output) {
  const auto at = output.find("[error] ");
  if (at == std::string::npos) return "";
  return output.substr(at + 8, output.find('\n', at) - at - 8);
}

std::size_t filesIn(const fs::path& dir) {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::recursive_directory_iterator(dir))
    ++n;
  return n;
}

// The line of the model's table for `layer`: "#   conv1  20 x 24 x 24  520".
std::string layerLine(const std::string& output, const std::string& layer) {
  const auto at = output.find("#   " + layer + " ");
  if (at == std::string::npos) return "";
  return output.substr(at, output.find('\n', at) - at);
}

TEST(TrainDryRun, ListsLenetsLayersWithTheirShapesAndTheParameterTotalAndWritesNothing) {
  TempDir cwd("dry_lenet");
  const auto r = dryRunLenet(cwd, "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Caffe's LeNet on 1 x 28 x 28: conv 5x5 (20), max pool 2, conv 5x5 (50), max pool 2, fc 500,
  // relu, fc 10. A layer's parameters: weights and one bias per output.
  const std::int64_t conv1 = 20 * 1 * 5 * 5 + 20;
  const std::int64_t conv2 = 50 * 20 * 5 * 5 + 50;
  const std::int64_t ip1 = 500 * (50 * 4 * 4) + 500;
  const std::int64_t ip2 = 10 * 500 + 10;
  struct Row {
    const char* layer;
    const char* shape;
    std::int64_t params;
  };
  for (const Row& row : {Row{"conv1", "20 x 24 x 24", conv1}, Row{"pool1", "20 x 12 x 12", 0},
                         Row{"conv2", "50 x 8 x 8", conv2}, Row{"pool2", "50 x 4 x 4", 0},
                         Row{"ip1", "500", ip1}, Row{"relu1", "500", 0}, Row{"ip2", "10", ip2}}) {
    const auto line = layerLine(r.output, row.layer);
    EXPECT_TRUE(contains(line, std::string(" ") + row.shape + " ")) << row.layer << ": " << line;
    EXPECT_TRUE(line.ends_with(" " + std::to_string(row.params))) << row.layer << ": " << line;
  }
  EXPECT_TRUE(
      layerLine(r.output, "total").ends_with(" " + std::to_string(conv1 + conv2 + ip1 + ip2)))
      << r.output;
  // Fashion-MNIST (the test data is all of it), and the plan of configs/lenet.toml.
  EXPECT_TRUE(
      containsAll(r.output, {"#   train  60000 records  " + testData("lmdb") + "/train",
                             "#   test   10000 records  " + testData("lmdb") + "/test",
                             "59968 trained (937 steps of 64", "937 per epoch x 10 epochs = 9370",
                             "cosine from 0.05", "0.05 at step 0, ", " at step 9369"}));
  EXPECT_FALSE(fs::exists(cwd.path() / "logs")) << "the log folder was made";
  EXPECT_EQ(filesIn(cwd.path()), 0u) << "a file was written";
}

// The layers a batch norm computes in its own pass say so: in ResNet-20, a block's first ReLU,
// and its add and the ReLU after it.
TEST(TrainDryRun, SaysWhichLayersABatchNormComputes) {
  TempDir cwd("dry_fused");
  const auto r =
      train(cwd, "--model resnet20 --num_channels 3 --image_size 32 --dry-run" + dataFlags());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(layerLine(r.output, "stage1.block1.bn1").ends_with(" 32"))
      << layerLine(r.output, "stage1.block1.bn1");
  EXPECT_TRUE(
      layerLine(r.output, "stage1.block1.relu1").ends_with(" 0  (fused into stage1.block1.bn1)"))
      << r.output;
  EXPECT_TRUE(
      layerLine(r.output, "stage1.block1.add").ends_with(" 0  (fused into stage1.block1.bn2)"))
      << r.output;
}

TEST(TrainDryRun, ItsParameterTotalIsTheOneARealRunsCheckpointHolds) {
  TempDir cwd("dry_vs_real");
  const auto config = sourceDir() + "/configs/lenet_layers.toml";
  const auto dry = train(cwd, config + dataFlags() + " --dry-run");
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  const auto real = train(cwd, config + " --train_data " + testData("lmdb") +
                                   "/train --db_type lmdb --epoch_size 64 --num_epochs 1");
  ASSERT_EQ(real.exit_code, 0) << real.output;
  std::int64_t num_params = -1;
  for (const auto& e : fs::directory_iterator(cwd.path() / "logs")) {
    if (e.path().extension() == ".ckpt") {
      num_params = actors::loadCheckpoint(e.path().string()).metaInt("num_params");
    }
  }
  ASSERT_GT(num_params, 0) << real.output;
  EXPECT_TRUE(layerLine(dry.output, "total").ends_with(" " + std::to_string(num_params)))
      << dry.output;
}

TEST(TrainDryRun, MarksWhereEachValueCameFrom) {
  TempDir cwd("dry_origin");
  const auto r = dryRunLenet(cwd, " --num_epochs 2", "TROUPE_RUN_ID=r7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto line = [&](const std::string& key) {
    const auto at = r.output.find("\n" + key + " = ");
    return at == std::string::npos ? std::string()
                                   : r.output.substr(at + 1, r.output.find('\n', at + 1) - at - 1);
  };
  EXPECT_TRUE(line("batch_size").ends_with("# file")) << line("batch_size");
  EXPECT_TRUE(line("num_epochs").starts_with("num_epochs = 2 ")) << line("num_epochs");
  EXPECT_TRUE(line("num_epochs").ends_with("# --num_epochs")) << line("num_epochs");
  EXPECT_TRUE(line("run_id").starts_with("run_id = \"r7\"")) << line("run_id");
  EXPECT_TRUE(line("run_id").ends_with("# TROUPE_RUN_ID")) << line("run_id");
  EXPECT_TRUE(line("seed").ends_with("# default")) << line("seed");
  EXPECT_TRUE(line("lr_milestones").starts_with("lr_milestones = []")) << line("lr_milestones");
}

TEST(TrainDryRun, ItsOutputIsAConfigThatResolvesToTheSameValues) {
  TempDir cwd("dry_round_trip");
  // mean_per_channel and std_per_channel are troupe's keys, named after Caffe2's options.
  const auto first = dryRunLenet(cwd,
                                 " --replicas 2 --work_load_list 1,3 --mean_per_channel 0.5 "
                                 "--std_per_channel 0.25");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto saved = cwd.path() / "resolved.toml";
  std::ofstream(saved) << first.output;
  const auto second = train(cwd, saved.string() + " --dry-run");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  // Every key = value line (before its origin comment) is the same.
  auto values = [](const std::string& output) {
    std::string out;
    std::istringstream lines(output);
    for (std::string l; std::getline(lines, l);) {
      if (!l.empty() && l[0] != '#') out += l.substr(0, l.find(" #")) + "\n";
    }
    return out;
  };
  EXPECT_EQ(values(first.output), values(second.output));
  EXPECT_TRUE(containsAll(
      values(second.output),
      {"work_load_list = [1, 3]", "mean_per_channel = [0.5]", "std_per_channel = [0.25]"}));
  EXPECT_TRUE(contains(second.output, "batch shares 16, 48")) << second.output;
}

TEST(TrainDryRun, PlansAProcessOfSeveralWithoutMeetingTheOthers) {
  TempDir cwd("dry_world");
  const auto r = dryRunLenet(cwd,
                             " --schedule bsp-allreduce --num_shards 2 --shard_id 1 --run_id r1"
                             " --rendezvous tcp://127.0.0.1:1");
  ASSERT_TRUE(exitedWith(r, 0,
                         {"#   workers         2\n", "#   this process    worker 1\n",
                          "64 per worker, 128 global", "468 per epoch x 10 epochs = 4680",
                          "#   rendezvous      tcp://127.0.0.1:1\n", "#   run id          r1\n"}));
}

// Whatever a real run refuses before its first step, the dry run refuses with the same message.
TEST(TrainDryRun, ABadConfigFailsAsARealRunFails) {
  TempDir cwd("dry_bad");
  const auto misspelt = cwd.path() / "misspelt.toml";
  std::ofstream(misspelt) << "model = \"lenet\"\nbatch_sise = 64\n";
  const std::string cases[] = {
      misspelt.string() + dataFlags(),
      lenet() + dataFlags() + " --schedule foo",
      lenet() + dataFlags() + " --epoch_size 10",
      lenet() + dataFlags() + " --model vgg",
      lenet() + dataFlags() + " --lr_policy step",
      lenet() + " --train_data " + cwd.str() + "/missing",
  };
  for (const auto& args : cases) {
    const auto dry = train(cwd, args + " --dry-run");
    const auto real = train(cwd, args + " --num_epochs 1");
    EXPECT_EQ(dry.exit_code, 1) << args << "\n" << dry.output;
    EXPECT_EQ(real.exit_code, 1) << args << "\n" << real.output;
    EXPECT_FALSE(errorMessage(dry.output).empty()) << args << "\n" << dry.output;
    EXPECT_EQ(errorMessage(dry.output), errorMessage(real.output)) << args;
  }
  EXPECT_TRUE(contains(
      errorMessage(train(cwd, misspelt.string() + " --dry-run").output),
      "unknown key 'batch_sise' in " + misspelt.string() + ": did you mean 'batch_size'?"));
}

}  // namespace
}  // namespace troupe
