// A Reader actor of one's own (troupe::ReaderActor), fed from a service's in-memory data: the
// service's table of Fashion-MNIST records fills while training runs (a thread stands for the
// records arriving), and each replica's reader samples class-balanced batches from what has
// arrived (every step holds each class equally; which record of a class is drawn follows from the
// run's seed, the step and the slot). A reader whose class has no record yet waits for it
// (retryAfter) instead of sending a short batch. The test split is read through a RecordSource.
//
//   custom_reader --config configs/mlp.toml [--epochs 1] [--replicas 2]
//                 [--data /usr/share/datasets/fashion-mnist]
//
// Prints each epoch's loss, accuracy, test accuracy and inputs/s, then what the readers did; exits
// 1 with the error on one.
#include <troupe/reader.h>
#include <troupe/record_source.h>
#include <troupe/trainer.h>
#include <troupe/version.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/fashion_mnist.h"
#include "common/flags.h"

namespace {

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "custom_reader: %s\n", message.c_str());
  std::exit(1);
}

// The service's records, by class; they arrive while the run reads them.
class Table {
 public:
  void add(const examples::FashionMnist& set, int begin, int end) {
    std::lock_guard lock(mutex_);
    for (int i = begin; i < end; ++i) {
      const float* image = &set.images[static_cast<std::size_t>(i) * examples::kPixels];
      images_.insert(images_.end(), image, image + examples::kPixels);
      by_class_[static_cast<std::size_t>(set.labels[static_cast<std::size_t>(i)])].push_back(
          static_cast<int>(images_.size() / examples::kPixels) - 1);
    }
  }
  bool hasEveryClass() const {
    std::lock_guard lock(mutex_);
    return std::all_of(by_class_.begin(), by_class_.end(),
                       [](const std::vector<int>& c) { return !c.empty(); });
  }
  // Copies the `pick`-th record (modulo those there are) of class `label` to `out`.
  void copy(int label, std::uint64_t pick, float* out) const {
    std::lock_guard lock(mutex_);
    const auto& records = by_class_[static_cast<std::size_t>(label)];
    const int record = records[static_cast<std::size_t>(pick % records.size())];
    const float* from = &images_[static_cast<std::size_t>(record) * examples::kPixels];
    std::copy(from, from + examples::kPixels, out);
  }
  std::int64_t size() const {
    std::lock_guard lock(mutex_);
    return static_cast<std::int64_t>(images_.size() / examples::kPixels);
  }

 private:
  mutable std::mutex mutex_;
  std::vector<float> images_;
  std::array<std::vector<int>, examples::kClasses> by_class_;
};

struct ReaderStats {
  std::atomic<std::int64_t> batches{0}, waits{0};
};

class BalancedReader final : public troupe::ReaderActor {
 public:
  BalancedReader(const troupe::ReaderSpec& spec, const Table& table, ReaderStats& stats)
      : ReaderActor(spec), table_(table), stats_(stats) {}

 protected:
  troupe::Status open() override {
    const auto& s = spec();
    if (s.channels * s.height * s.width != examples::kPixels || s.num_labels != 10) {
      return troupe::Status(troupe::ErrorKind::kInput,
                            "the table holds 28x28 gray images of 10 classes; the model takes " +
                                std::to_string(s.channels) + "x" + std::to_string(s.height) + "x" +
                                std::to_string(s.width) + " of " + std::to_string(s.num_labels));
    }
    images_.resize(static_cast<std::size_t>(s.batch) * examples::kPixels);
    labels_.resize(static_cast<std::size_t>(s.batch));
    return {};
  }

  troupe::Status onCredit() override {
    if (!table_.hasEveryClass()) {  // the first records are on their way
      ++stats_.waits;
      retryAfter(std::chrono::milliseconds(10));
      return {};
    }
    const auto& s = spec();
    while (credit() > 0 && !finished()) {
      const std::int64_t step = nextStep();
      for (std::int64_t i = 0; i < s.batch; ++i) {
        const std::int64_t slot = step * s.global_batch + s.offset + i;  // in the whole run
        const int label = static_cast<int>(slot % examples::kClasses);
        std::mt19937_64 draw(s.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(slot));
        labels_[static_cast<std::size_t>(i)] = label;
        table_.copy(label, draw(), &images_[static_cast<std::size_t>(i) * examples::kPixels]);
      }
      if (auto sent = sendBatch(images_, labels_); !sent) return sent;
      ++stats_.batches;
    }
    return {};
  }

 private:
  const Table& table_;
  ReaderStats& stats_;
  std::vector<float> images_;
  std::vector<std::int32_t> labels_;
};

// The test split, read as a database would be.
class TestSet final : public troupe::RecordSource {
 public:
  explicit TestSet(examples::FashionMnist set) : set_(std::move(set)) {}
  std::int64_t size() const override { return set_.size(); }
  troupe::Result<int> read(std::int64_t index, std::span<float> image) const override {
    const float* from = &set_.images[static_cast<std::size_t>(index) * examples::kPixels];
    std::copy(from, from + examples::kPixels, image.begin());
    return set_.labels[static_cast<std::size_t>(index)];
  }

 private:
  examples::FashionMnist set_;
};

}  // namespace

int main(int argc, char** argv) {
  auto flags = examples::parseFlags(
      "custom_reader", argc, argv,
      {{"config", ""}, {"epochs", "1"}, {"replicas", "2"}, {"data", examples::kFashionMnist}});
  const std::string config = flags["config"], epochs = flags["epochs"],
                    replicas = flags["replicas"], data = flags["data"];
  if (config.empty()) fail("--config is needed");
  examples::FashionMnist train;
  std::shared_ptr<TestSet> test;
  try {
    train = examples::loadFashionMnist(data, "train");
    test = std::make_shared<TestSet>(examples::loadFashionMnist(data, "t10k"));
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::printf("%s; %d training records arrive while the run reads them\n",
              troupe::buildSummary().c_str(), train.size());
  std::fflush(stdout);

  // The records arrive in chunks, the first ones a moment after the run starts: its readers wait
  // for them.
  Table table;
  std::thread arrivals([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    constexpr int kChunk = 5000;
    for (int begin = 0; begin < train.size(); begin += kChunk) {
      table.add(train, begin, std::min(train.size(), begin + kChunk));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });

  ReaderStats stats;
  troupe::TrainerData sources;
  sources.test = test;
  sources.reader = [&](const troupe::ReaderSpec& spec) {
    return std::make_unique<BalancedReader>(spec, table, stats);
  };
  troupe::TrainerCallbacks callbacks;
  callbacks.on_epoch = [](const troupe::EpochMetrics& e) {
    std::printf("epoch %lld: loss %.4f, accuracy %.4f, test accuracy %.4f, inputs/s %.0f\n",
                static_cast<long long>(e.epoch), e.loss, e.accuracy, e.test_accuracy,
                e.inputs_per_sec);
    std::fflush(stdout);
  };
  // No train_data: the readers are the training data; epoch_size says how much an epoch trains.
  auto trainer = troupe::Trainer::start(config,
                                        {{"num_epochs", epochs},
                                         {"epoch_size", std::to_string(train.size())},
                                         {"replicas", replicas},
                                         {"checkpoint_every", "0"},
                                         {"log_every", "0"}},
                                        std::move(callbacks), std::move(sources));
  if (!trainer) {
    arrivals.join();
    fail(trainer.status().message());
  }
  const troupe::Status done = trainer.value()->wait(std::chrono::hours(1));
  arrivals.join();
  if (!done) fail(done.message());
  std::printf("readers: %lld batches sent, %lld waits for data, %lld records in the table\n",
              static_cast<long long>(stats.batches.load()),
              static_cast<long long>(stats.waits.load()), static_cast<long long>(table.size()));
  return 0;
}
