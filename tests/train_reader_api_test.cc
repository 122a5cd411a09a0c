// troupe::ReaderActor (include/troupe/reader.h): readers of one's own feed a troupe::Trainer's
// replicas from memory with their own sampling, and learn; a batch of the wrong size, a label
// outside the run's, a batch past the credit and an error of the reader's own end the run with an
// error value naming the reader.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "troupe/reader.h"
#include "troupe/record_source.h"
#include "troupe/trainer.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using testing::sourceDir;
using testing::TempDir;

// Label L: rows 2L and 2L+1 of a 28x28 image bright, every other pixel dark.
void stripe(int label, std::span<float> image) {
  std::fill(image.begin(), image.end(), 0.0f);
  std::fill(image.begin() + 56 * label, image.begin() + 56 * (label + 1), 1.0f);
}

class StripeTest final : public RecordSource {
 public:
  std::int64_t size() const override { return 500; }
  Result<int> read(std::int64_t index, std::span<float> image) const override {
    stripe(static_cast<int>(index % 10), image);
    return static_cast<int>(index % 10);
  }
};

// Class-balanced: slot i of step t's global batch holds label (t * global_batch + i) mod 10, so
// every step sees each class equally, whatever the replica.
class BalancedReader final : public ReaderActor {
 public:
  explicit BalancedReader(const ReaderSpec& spec) : ReaderActor(spec) {}
  static inline std::atomic<int> sent_{0};  // batches sent, by every reader

 protected:
  Status onCredit() override {
    const auto& s = spec();
    const std::size_t image = static_cast<std::size_t>(s.channels) * s.height * s.width;
    images_.resize(static_cast<std::size_t>(s.batch) * image);
    labels_.resize(static_cast<std::size_t>(s.batch));
    while (credit() > 0 && !finished()) {
      for (std::int64_t i = 0; i < s.batch; ++i) {
        const int label = static_cast<int>((nextStep() * s.global_batch + s.offset + i) % 10);
        labels_[static_cast<std::size_t>(i)] = label;
        stripe(label, {images_.data() + static_cast<std::size_t>(i) * image, image});
      }
      if (auto sent = sendBatch(images_, labels_); !sent) return sent;
      ++sent_;
    }
    return {};
  }

 private:
  std::vector<float> images_;
  std::vector<std::int32_t> labels_;
};

Settings readerRun(const TempDir& dir) {
  return {{"num_epochs", "2"}, {"epoch_size", "2560"},       {"threads", "1"},
          {"log_every", "0"},  {"checkpoint_every", "0"},    {"log_dir", dir.str()},
          {"replicas", "2"},   {"base_learning_rate", "0.1"}};
}

std::string config() {
  return sourceDir() + "/configs/mlp.toml";
}

TEST(ReaderApi, ReadersOfOnesOwnFeedEveryReplicaInStepOrderAndTheRunLearns) {
  TempDir dir("reader_api_balanced");
  std::mutex mutex;
  std::vector<ReaderSpec> specs;
  TrainerData data;
  data.test = std::make_shared<StripeTest>();
  data.reader = [&](const ReaderSpec& s) {
    std::lock_guard lock(mutex);
    specs.push_back(s);
    return std::make_unique<BalancedReader>(s);
  };
  double test_accuracy = -1;
  TrainerCallbacks callbacks;
  callbacks.on_epoch = [&](const EpochMetrics& e) { test_accuracy = e.test_accuracy; };
  BalancedReader::sent_ = 0;
  auto started = Trainer::start(config(), readerRun(dir), callbacks, data);
  ASSERT_TRUE(started) << started.status().message();
  const Status done = started.value()->wait(120s);
  ASSERT_TRUE(done) << done.message();
  EXPECT_EQ(started.value()->steps(), 80);  // 2560 / 64 = 40 steps an epoch, 2 epochs
  ASSERT_EQ(specs.size(), 2u);
  std::sort(specs.begin(), specs.end(),
            [](const ReaderSpec& a, const ReaderSpec& b) { return a.replica < b.replica; });
  for (int r = 0; r < 2; ++r) {
    const auto& s = specs[static_cast<std::size_t>(r)];
    EXPECT_EQ(s.name, "reader/0/" + std::to_string(r));
    EXPECT_EQ(s.batch, 32);
    EXPECT_EQ(s.offset, 32 * r);
    EXPECT_EQ(s.global_batch, 64);
    EXPECT_EQ(s.first_step, 0);
    EXPECT_EQ(s.last_step, 80);
    EXPECT_EQ(s.steps_per_epoch, 40);
    EXPECT_EQ(s.channels * s.height * s.width, 784);
    EXPECT_EQ(s.num_labels, 10);
  }
  EXPECT_EQ(BalancedReader::sent_.load(), 2 * 80);  // each reader, each step, once
  // Ten patterns that a linear layer separates: an MLP gets nearly all in two epochs.
  EXPECT_GT(test_accuracy, 0.9);
}

// The updaters pause at an epoch's end only where its state is kept or evaluated (a checkpoint,
// test data, the run's end): without either, epoch 2's steps go on while the coordinator still
// handles epoch 1's end (here its on_epoch callback, held); with a checkpoint every epoch, the
// replicas wait, and the readers send no more than their credit (prefetch 4) past epoch 1's last
// step. (Steps going on while the coordinator is held end when its mailbox of 64 is full of their
// StepDone messages, 2 a step, so not all 40 of epoch 2 need come: 20 of them tell.)
TEST(ReaderApi, AnEpochEndWithNothingToKeepDoesNotHoldUpTheNextEpochsSteps) {
  for (const bool checkpoint_every_epoch : {false, true}) {
    SCOPED_TRACE(checkpoint_every_epoch ? "checkpoint_every 1" : "checkpoint_every 0");
    TempDir dir("reader_api_epoch_end");
    TrainerData data;
    data.reader = [](const ReaderSpec& s) { return std::make_unique<BalancedReader>(s); };
    constexpr int kEpoch = 2 * 40;            // batches of an epoch: 2 readers, 40 steps
    constexpr int kGoneOn = kEpoch + 2 * 20;  // 20 steps into epoch 2
    int sent_in_epoch_1s_end = -1;
    TrainerCallbacks callbacks;
    callbacks.on_epoch = [&](const EpochMetrics& e) {
      if (e.epoch != 1) return;
      // Long enough for 20 MLP steps many times over where nothing holds them; where the
      // updaters pause, the wait cannot end early (nothing is sent until this callback returns).
      const auto until = std::chrono::steady_clock::now() + (checkpoint_every_epoch ? 2s : 60s);
      while (BalancedReader::sent_.load() < kGoneOn && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(5ms);
      sent_in_epoch_1s_end = BalancedReader::sent_.load();
    };
    BalancedReader::sent_ = 0;
    Settings settings = readerRun(dir);
    settings["checkpoint_every"] = checkpoint_every_epoch ? "1" : "0";
    settings["checkpoint_dir"] = dir.str();
    auto started = Trainer::start(config(), settings, callbacks, data);
    ASSERT_TRUE(started) << started.status().message();
    const Status done = started.value()->wait(120s);
    ASSERT_TRUE(done) << done.message();
    EXPECT_EQ(started.value()->steps(), 80);
    EXPECT_EQ(BalancedReader::sent_.load(), 2 * kEpoch);
    if (checkpoint_every_epoch) {
      EXPECT_GE(sent_in_epoch_1s_end, kEpoch);
      EXPECT_LE(sent_in_epoch_1s_end, kEpoch + 2 * 5);  // a reader's credit past the last step
    } else {
      EXPECT_GE(sent_in_epoch_1s_end, kGoneOn);
    }
  }
}

// Its data comes after three tries: each onCredit() before asks to be called again.
class LateReader final : public ReaderActor {
 public:
  explicit LateReader(const ReaderSpec& spec) : ReaderActor(spec) {}
  static inline std::atomic<int> tries_{0};

 protected:
  Status onCredit() override {
    if (++tries_ <= 3) {
      retryAfter(5ms);
      retryAfter(5ms);  // once is enough: a second ask while one waits changes nothing
      return {};
    }
    const auto& s = spec();
    std::vector<float> images(static_cast<std::size_t>(s.batch) * 784);
    std::vector<std::int32_t> labels(static_cast<std::size_t>(s.batch));
    while (credit() > 0 && !finished()) {
      for (std::int64_t i = 0; i < s.batch; ++i) {
        labels[static_cast<std::size_t>(i)] = static_cast<int>(i % 10);
        stripe(static_cast<int>(i % 10), {images.data() + i * 784, 784});
      }
      if (auto sent = sendBatch(images, labels); !sent) return sent;
    }
    return {};
  }
};

TEST(ReaderApi, AReaderWaitingForItsDataIsCalledAgainAndTheRunGoesOn) {
  TempDir dir("reader_api_late");
  Settings settings;
  for (auto& [key, value] : readerRun(dir)) {
    if (key != "replicas") settings.insert_or_assign(key, value);
  }
  TrainerData data;
  data.reader = [](const ReaderSpec& s) { return std::make_unique<LateReader>(s); };
  LateReader::tries_ = 0;
  auto started = Trainer::start(config(), settings, {}, data);
  ASSERT_TRUE(started) << started.status().message();
  const Status done = started.value()->wait(120s);
  ASSERT_TRUE(done) << done.message();
  EXPECT_EQ(started.value()->steps(), 80);
  // Calls: 3 that wait (a call each, the second retryAfter of each adding none), 1 that sends
  // the prefetch (4 batches), then 1 for each of the first 76 batches used (each sends one); the
  // last 4 used find every step sent, and call nothing. 3 + 1 + 76 = 80.
  EXPECT_EQ(LateReader::tries_.load(), 80);
}

// A reader that misbehaves in one way, chosen by `fault`.
class FaultyReader final : public ReaderActor {
 public:
  FaultyReader(const ReaderSpec& spec, std::string fault)
      : ReaderActor(spec), fault_(std::move(fault)) {}

 protected:
  Status open() override {
    if (fault_ == "open") return Status(ErrorKind::kIo, "the service's table is not loaded");
    return {};
  }
  Status onCredit() override {
    const auto& s = spec();
    const std::size_t n = static_cast<std::size_t>(s.batch);
    std::vector<float> images(n * 784, 0.5f);
    std::vector<std::int32_t> labels(n, 3);
    if (fault_ == "size") labels.resize(3);
    if (fault_ == "label") labels[5] = 12;
    if (fault_ == "nan") images[100] = std::numeric_limits<float>::quiet_NaN();
    if (fault_ == "credit") {
      for (;;) {  // ignores credit()
        if (auto sent = sendBatch(images, labels); !sent) return sent;
      }
    }
    return sendBatch(images, labels);
  }

 private:
  std::string fault_;
};

// Trainer::start with `settings` and, for each replica, a FaultyReader of `fault`.
Result<std::unique_ptr<Trainer>> startWith(const Settings& settings, const std::string& fault) {
  TrainerData data;
  data.reader = [fault](const ReaderSpec& s) { return std::make_unique<FaultyReader>(s, fault); };
  return Trainer::start(config(), settings, {}, data);
}

// How a run with prefetch 2 and FaultyReaders of `fault` ends.
Status runWith(const std::string& fault) {
  TempDir dir("reader_api_" + fault);
  auto settings = readerRun(dir);
  settings.insert_or_assign("prefetch", "2");
  auto started = startWith(settings, fault);
  if (!started) return started.status();
  return started.value()->wait(120s);
}

TEST(ReaderApi, ABatchOfTheWrongSizeEndsTheRunNamingTheReaderAndTheSizes) {
  const Status s = runWith("size");
  ASSERT_FALSE(s);
  EXPECT_EQ(s.kind(), ErrorKind::kInput) << s.message();
  // Both replicas' readers send such a batch at once: the run names whichever failed first.
  const std::string what =
      ": the batch of step 0 has 3 labels and 25088 image values; the replica takes 32 inputs of "
      "1x28x28 (25088 values)";
  EXPECT_TRUE(s.message().find("reader/0/0" + what) != std::string::npos ||
              s.message().find("reader/0/1" + what) != std::string::npos)
      << s.message();
}

// A fault of a reader, and the error that ends the run: its kind and what its message holds.
struct Fault {
  std::string name;   // the test's
  std::string fault;  // FaultyReader's
  ErrorKind kind;
  std::vector<std::string> parts;
};

void PrintTo(const Fault& f, std::ostream* out) {
  *out << f.name;
}

class ReaderFault : public ::testing::TestWithParam<Fault> {};

TEST_P(ReaderFault, EndsTheRunWithAnErrorOfItsKindSayingWhat) {
  const Status s = runWith(GetParam().fault);
  ASSERT_FALSE(s);
  EXPECT_EQ(s.kind(), GetParam().kind) << s.message();
  EXPECT_TRUE(testing::containsAll(s.message(), GetParam().parts));
}

INSTANTIATE_TEST_SUITE_P(
    ReaderApi, ReaderFault,
    ::testing::Values(Fault{"ALabelOutsideTheRunsIsRefusedNamingItsPlace",
                            "label",
                            ErrorKind::kInput,
                            {"the batch of step 0 has label 12 at 5, outside [0, 10)"}},
                      Fault{"ANonFiniteInputIsRefused",
                            "nan",
                            ErrorKind::kInput,
                            {"the batch of step 0 has nan at image value 100"}},
                      Fault{"ABatchBeyondTheCreditIsRefused",
                            "credit",
                            ErrorKind::kInput,
                            {"the batch of step 2 is 2 batches ahead of its replica (prefetch 2)"}},
                      Fault{"TheReadersOwnErrorEndsTheRunWithItsKind",
                            "open",
                            ErrorKind::kIo,
                            {"the service's table is not loaded", "reader/0/"}}),
    [](const ::testing::TestParamInfo<Fault>& info) { return info.param.name; });

TEST(ReaderApi, WithoutEpochSizeTheRunIsRefusedBeforeItStarts) {
  TempDir dir("reader_api_no_epoch_size");
  Settings settings;
  for (auto& [key, value] : readerRun(dir)) {
    if (key != "epoch_size") settings.insert_or_assign(key, value);
  }
  const auto started = startWith(settings, "");
  ASSERT_FALSE(started);
  EXPECT_EQ(started.status().kind(), ErrorKind::kInput);
  EXPECT_TRUE(testing::contains(started.status().message(), "needs epoch_size"))
      << started.status().message();
}

TEST(ReaderApi, SharedReaderWithAReaderOfOnesOwnIsRefusedBeforeItStarts) {
  TempDir dir("reader_api_shared");
  Settings settings = readerRun(dir);
  settings.insert_or_assign("shared_reader", "true");
  const auto started = startWith(settings, "");
  ASSERT_FALSE(started);
  EXPECT_EQ(started.status().kind(), ErrorKind::kInput);
  EXPECT_TRUE(testing::contains(started.status().message(), "shared_reader"))
      << started.status().message();
}

}  // namespace
}  // namespace troupe
