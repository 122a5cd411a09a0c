// troupe::Trainer (include/troupe/trainer.h), the library's non-blocking trainer, on real
// Fashion-MNIST runs in this process: callbacks, a checkpoint asked for mid-epoch that a resumed
// run continues from to the same bits, a graceful stop, waits with a timeout, errors as values.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "actors/run/checkpoint.h"
#include "cli_util.h"
#include "data/token_shards.h"
#include "troupe/model.h"
#include "troupe/record_source.h"
#include "troupe/trainer.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using testing::sourceDir;
using testing::TempDir;
using testing::testData;

// MLP, 2 epochs of 2560 inputs at batch 64: 40 steps an epoch, 80 in all; one thread.
Settings mlpRun(const TempDir& dir) {
  return {{"train_data", testData("lmdb") + "/train"},
          {"test_data", testData("lmdb") + "/test"},
          {"db_type", "lmdb"},
          {"num_epochs", "2"},
          {"epoch_size", "2560"},
          {"threads", "1"},
          {"log_every", "0"},
          {"checkpoint_every", "0"},  // only the last step's, and those asked for
          {"log_dir", dir.str()}};
}

// mlpRun with `key` set to `value`.
Settings mlpRunWith(const TempDir& dir, const std::string& key, const std::string& value) {
  auto settings = mlpRun(dir);
  settings.insert_or_assign(key, value);
  return settings;
}

std::string config() {
  return sourceDir() + "/configs/mlp.toml";
}

TEST(TrainerApi, CallbacksSeeEveryStepAndEpochAndWaitReturnsOk) {
  TempDir dir("api_callbacks");
  std::vector<StepMetrics> steps;
  std::vector<EpochMetrics> epochs;
  std::vector<std::string> checkpoints;
  TrainerCallbacks callbacks;
  callbacks.on_step = [&](const StepMetrics& s) { steps.push_back(s); };
  callbacks.on_epoch = [&](const EpochMetrics& e) { epochs.push_back(e); };
  callbacks.on_checkpoint = [&](const std::string& path, std::int64_t) {
    checkpoints.push_back(path);
  };
  auto started = Trainer::start(config(), mlpRun(dir), callbacks);
  ASSERT_TRUE(started) << started.status().message();
  auto& trainer = *started.value();
  const Status done = trainer.wait(120s);
  ASSERT_TRUE(done) << done.message();
  EXPECT_FALSE(trainer.running());
  EXPECT_EQ(trainer.steps(), 80);
  ASSERT_EQ(steps.size(), 80u);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step, static_cast<std::int64_t>(i) + 1);
    EXPECT_EQ(steps[i].epoch, static_cast<std::int64_t>(i) / 40 + 1);
    EXPECT_EQ(steps[i].step_in_epoch, static_cast<std::int64_t>(i) % 40 + 1);
    EXPECT_EQ(steps[i].steps_in_epoch, 40);
    EXPECT_GT(steps[i].loss, 0);
  }
  EXPECT_LT(steps.back().loss, steps.front().loss);
  ASSERT_EQ(epochs.size(), 2u);
  EXPECT_EQ(epochs[1].epoch, 2);
  EXPECT_EQ(epochs[1].step, 80);
  EXPECT_GT(epochs[1].test_accuracy, 0.5);
  ASSERT_EQ(checkpoints.size(), 1u);  // the run's last step
  EXPECT_TRUE(std::filesystem::exists(checkpoints[0]));
  // The run's actors by name: one worker of one replica, no server.
  const auto topology = trainer.topology();
  ASSERT_TRUE(topology) << topology.status().message();
  EXPECT_EQ(topology.value().names(),
            (std::vector<std::string>{"coordinator/0", "updater/0", "reducer/0", "replica/0/0",
                                      "stage/0", "reader/0/0"}));
  const auto reader = topology.value().find("reader/0/0");
  ASSERT_TRUE(reader) << reader.status().message();
  EXPECT_EQ(reader.value(), (actors::Address{0, 5}));
  const auto server = topology.value().find("server/0");
  ASSERT_FALSE(server);
  EXPECT_EQ(server.status().kind(), ErrorKind::kInput);
  EXPECT_NE(server.status().message().find("no actor 'server/0' in a run of 1 worker(s), 0 "
                                           "server(s) and 1 replica(s) a worker"),
            std::string::npos)
      << server.status().message();
}

// A checkpoint asked for at step 5 is written after step 13 (kPauseMargin 8 steps on) while the
// run goes on; a run resumed from it ends bitwise where the uninterrupted one did.
TEST(TrainerApi, ACheckpointAskedForMidEpochResumesToTheSameBits) {
  TempDir dir("api_checkpoint");
  std::vector<std::pair<std::string, std::int64_t>> checkpoints;
  std::unique_ptr<Trainer>* self = nullptr;
  TrainerCallbacks callbacks;
  callbacks.on_step = [&](const StepMetrics& s) {
    if (s.step == 5) (*self)->requestCheckpoint();
  };
  callbacks.on_checkpoint = [&](const std::string& path, std::int64_t step) {
    checkpoints.emplace_back(path, step);
  };
  auto started = Trainer::start(config(), mlpRun(dir), callbacks);
  ASSERT_TRUE(started) << started.status().message();
  self = &started.value();
  const Status done = started.value()->wait(120s);
  ASSERT_TRUE(done) << done.message();
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[0].second, 13);
  EXPECT_NE(checkpoints[0].first.find("_step13.ckpt"), std::string::npos) << checkpoints[0].first;
  EXPECT_EQ(checkpoints[1].second, 80);
  const auto uninterrupted = actors::loadCheckpoint(checkpoints[1].first);

  TempDir resumed_dir("api_resumed");
  std::string last;
  TrainerCallbacks resumed_callbacks;
  resumed_callbacks.on_checkpoint = [&](const std::string& path, std::int64_t) { last = path; };
  auto resumed = Trainer::start(config(), mlpRunWith(resumed_dir, "resume", checkpoints[0].first),
                                resumed_callbacks);
  ASSERT_TRUE(resumed) << resumed.status().message();
  const Status resumed_done = resumed.value()->wait(120s);
  ASSERT_TRUE(resumed_done) << resumed_done.message();
  const auto after = actors::loadCheckpoint(last);
  EXPECT_EQ(after.metaInt("step"), 80);
  // One thread, the same kernels and data order from the same state: the same float operations.
  ASSERT_EQ(after.weights.numel(), uninterrupted.weights.numel());
  for (std::int64_t i = 0; i < after.weights.numel(); ++i) {
    ASSERT_EQ(after.weights.f32()[i], uninterrupted.weights.f32()[i]) << "weight " << i;
    ASSERT_EQ(after.state.f32()[i], uninterrupted.state.f32()[i]) << "momentum " << i;
  }
}

TEST(TrainerApi, AStopEndsTheRunAFewStepsOnWithACheckpoint) {
  TempDir dir("api_stop");
  std::unique_ptr<Trainer>* self = nullptr;
  std::vector<std::int64_t> checkpoint_steps;
  TrainerCallbacks callbacks;
  callbacks.on_step = [&](const StepMetrics& s) {
    if (s.step == 3) (*self)->stop();
  };
  callbacks.on_checkpoint = [&](const std::string&, std::int64_t step) {
    checkpoint_steps.push_back(step);
  };
  // One value a key: this one.
  auto started = Trainer::start(config(), mlpRunWith(dir, "num_epochs", "50"), callbacks);
  ASSERT_TRUE(started) << started.status().message();
  self = &started.value();
  const Status done = started.value()->wait(120s);
  ASSERT_TRUE(done) << done.message();
  EXPECT_EQ(started.value()->steps(), 11);
  EXPECT_EQ(checkpoint_steps, std::vector<std::int64_t>{11});
}

TEST(TrainerApi, AWaitThatRunsOutSaysSoAndTheRunGoesOnUntilStopped) {
  TempDir dir("api_wait");
  auto started = Trainer::start(config(), mlpRunWith(dir, "num_epochs", "1000"));
  ASSERT_TRUE(started) << started.status().message();
  auto& trainer = *started.value();
  const Status early = trainer.wait(20ms);
  EXPECT_EQ(early.kind(), ErrorKind::kTimeout);
  EXPECT_NE(early.message().find("the run still goes after 20 ms"), std::string::npos)
      << early.message();
  EXPECT_TRUE(trainer.running());
  trainer.stop(false);
  const Status done = trainer.wait(120s);
  EXPECT_TRUE(done) << done.message();
  EXPECT_FALSE(trainer.running());
}

TEST(TrainerApi, BadSettingsAreAnErrorValueAndNothingRuns) {
  TempDir dir("api_bad");
  auto bad_key = Trainer::start(config(), mlpRunWith(dir, "bach_size", "3"));
  ASSERT_FALSE(bad_key);
  EXPECT_EQ(bad_key.status().kind(), ErrorKind::kInput);
  // A setting is named as a key, not as a flag ("unknown flag --bach_size" before), and one
  // copied from a command line with its dashes is that key ("----batch_size" before).
  EXPECT_EQ(bad_key.status().message(),
            "unknown setting 'bach_size': did you mean 'batch_size'? (docs/config.md lists the "
            "settings)");
  EXPECT_EQ(Trainer::start(config(), mlpRunWith(dir, "--bach_size", "3")).status().message(),
            "unknown setting '--bach_size': did you mean 'batch_size'? (docs/config.md lists the "
            "settings)");

  auto missing = Trainer::start(config(), mlpRunWith(dir, "train_data", dir.str() + "/missing"));
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find(dir.str() + "/missing"), std::string::npos)
      << missing.status().message();

  auto no_config = Trainer::start(dir.str() + "/none.toml", mlpRun(dir));
  ASSERT_FALSE(no_config);
  EXPECT_NE(no_config.status().message().find("none.toml"), std::string::npos)
      << no_config.status().message();
}

TEST(TrainerApi, ADivergedRunIsANumericErrorValue) {
  TempDir dir("api_diverged");
  auto started = Trainer::start(config(), mlpRunWith(dir, "base_learning_rate", "1e30"));
  ASSERT_TRUE(started) << started.status().message();
  const Status done = started.value()->wait(120s);
  EXPECT_EQ(done.kind(), ErrorKind::kNumeric) << done.message();
  EXPECT_NE(done.message().find("diverged"), std::string::npos) << done.message();
}

// Records from memory: label L is an image whose rows 2L and 2L+1 are bright, every other pixel
// dark; record `bad` (if any) cannot be read.
class Stripes final : public RecordSource {
 public:
  Stripes(std::int64_t size, std::int64_t bad = -1) : size_(size), bad_(bad) {}
  std::int64_t size() const override { return size_; }
  Result<int> read(std::int64_t index, std::span<float> image) const override {
    reads_.fetch_add(1);
    if (index == bad_) return Status(ErrorKind::kIo, "the service lost this record");
    const int label = static_cast<int>(index % 10);
    std::fill(image.begin(), image.end(), 0.0f);
    std::fill(image.begin() + 56 * label, image.begin() + 56 * (label + 1), 1.0f);
    return label;
  }
  std::int64_t reads() const { return reads_.load(); }

 private:
  std::int64_t size_, bad_;
  mutable std::atomic<std::int64_t> reads_{0};
};

// The run's settings without databases: the data is in memory.
Settings memoryRun(const TempDir& dir) {
  Settings settings;
  for (auto& [key, value] : mlpRun(dir)) {
    if (key != "train_data" && key != "test_data" && key != "db_type")
      settings.insert_or_assign(key, value);
  }
  return settings;
}

TEST(TrainerApi, RecordsFromMemoryAreReadAsADatabaseIsAndLearned) {
  TempDir dir("api_memory");
  auto train = std::make_shared<Stripes>(2560);
  auto test = std::make_shared<Stripes>(500);
  double test_accuracy = -1;
  TrainerCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics& e) { test_accuracy = e.test_accuracy; };
  TrainerData data;
  data.train = train;
  data.test = test;
  auto started = Trainer::start(config(), memoryRun(dir), callbacks, data);
  ASSERT_TRUE(started) << started.status().message();
  const Status done = started.value()->wait(120s);
  ASSERT_TRUE(done) << done.message();
  EXPECT_EQ(started.value()->steps(), 80);
  // Every record of both epochs was read (2 x 40 steps x 64), and the test set after each epoch.
  EXPECT_EQ(train->reads(), 2 * 2560);
  EXPECT_EQ(test->reads(), 2 * 500);
  // Ten patterns that a linear layer separates: an MLP gets nearly all of them in two epochs.
  EXPECT_GT(test_accuracy, 0.9);
}

TEST(TrainerApi, ARecordTheSourceCannotReadEndsTheRunNamingIt) {
  TempDir dir("api_memory_bad");
  TrainerData data;
  data.train = std::make_shared<Stripes>(2560, 77);
  auto started = Trainer::start(config(), memoryRun(dir), {}, data);
  ASSERT_TRUE(started) << started.status().message();
  const Status done = started.value()->wait(120s);
  ASSERT_FALSE(done);
  EXPECT_EQ(done.kind(), ErrorKind::kInput) << done.message();
  EXPECT_NE(done.message().find("memory://trainer-"), std::string::npos) << done.message();
  EXPECT_NE(done.message().find("77"), std::string::npos) << done.message();
  EXPECT_NE(done.message().find("the service lost this record"), std::string::npos)
      << done.message();
}

// troupe::Model scores a language model per token, on its token shards, as the run scored its
// test set: the same batches of batch_size sequences from the first, on as many threads, so the
// same float32 sums, added in double in the same order: the same loss, to the bit.
TEST(ModelApi, ScoresALanguageModelPerTokenAsItsRunDid) {
  TempDir dir("api_language_model");
  const auto convert = testing::runCommand(testing::troupeBinary() +
                                           " convert text /usr/share/common-licenses/GPL-3 --out " +
                                           dir.str() + "/data --name lic");
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  const std::string lstm = sourceDir() + "/configs/lstm_layers.toml";
  const Settings run{{"train_data", dir.str() + "/data"},
                     {"test_data", dir.str() + "/data"},
                     {"num_epochs", "1"},
                     {"threads", "1"},
                     {"log_every", "0"},
                     {"log_dir", dir.str()}};
  std::vector<EpochMetrics> epochs;
  std::string checkpoint;
  TrainerCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics& e) { epochs.push_back(e); };
  callbacks.on_checkpoint = [&](const std::string& path, std::int64_t) { checkpoint = path; };
  auto started = Trainer::start(lstm, run, callbacks);
  ASSERT_TRUE(started) << started.status().message();
  const Status done = started.value()->wait(120s);
  ASSERT_TRUE(done) << done.message();
  ASSERT_EQ(epochs.size(), 1u);
  ASSERT_GT(epochs[0].test_loss, 0);

  auto model = Model::create(lstm, {{"threads", "1"}});
  ASSERT_TRUE(model) << model.status().message();
  const auto weights = actors::loadCheckpoint(checkpoint).weights;
  const auto score = model.value()->evaluate(
      std::span<const float>(weights.f32(), static_cast<std::size_t>(weights.numel())),
      dir.str() + "/data");
  ASSERT_TRUE(score) << score.status().message();
  EXPECT_EQ(score.value().loss, epochs[0].test_loss);
  EXPECT_EQ(score.value().accuracy, epochs[0].test_accuracy);
  // The validation shard's tokens in sequences of 35, each labelled with the next token.
  const auto val = data::readTokenShard(dir.str() + "/data/lic_val_000000.bin").tokens.size();
  EXPECT_EQ(score.value().count, static_cast<std::int64_t>(val - 1) / 35);
}

}  // namespace
}  // namespace troupe
