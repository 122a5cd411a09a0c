// A service's own data as troupe's training data: Fashion-MNIST held in this process's memory (as
// a service would hold records it received or generated) is read by troupe's Reader actors
// through a troupe::RecordSource, in place of a database, and trained on by troupe::Trainer with
// the config's model; the test split, also from memory, gives each epoch's test accuracy.
//
//   memory_reader --config configs/mlp.toml [--epochs 1] [--data /usr/share/datasets/fashion-mnist]
//
// Prints each epoch's loss, accuracy, test accuracy and inputs/s; exits 1 with the error on one.
#include <troupe/record_source.h>
#include <troupe/trainer.h>
#include <troupe/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/fashion_mnist.h"
#include "common/flags.h"

namespace {

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "memory_reader: %s\n", message.c_str());
  std::exit(1);
}

// Records from memory: the images already as the model takes them (scaled to [0, 1]).
class InMemory final : public troupe::RecordSource {
 public:
  explicit InMemory(examples::FashionMnist set) : set_(std::move(set)) {}
  std::int64_t size() const override { return set_.size(); }
  troupe::Result<int> read(std::int64_t index, std::span<float> image) const override {
    if (image.size() != static_cast<std::size_t>(examples::kPixels)) {
      return troupe::Status(troupe::ErrorKind::kInput,
                            "memory_reader holds 28x28 images, the model takes " +
                                std::to_string(image.size()) + " values");
    }
    const float* from = &set_.images[static_cast<std::size_t>(index) * examples::kPixels];
    std::copy(from, from + examples::kPixels, image.begin());
    return set_.labels[static_cast<std::size_t>(index)];
  }

 private:
  examples::FashionMnist set_;
};

}  // namespace

int main(int argc, char** argv) {
  auto flags =
      examples::parseFlags("memory_reader", argc, argv,
                           {{"config", ""}, {"epochs", "1"}, {"data", examples::kFashionMnist}});
  const std::string config = flags["config"], epochs = flags["epochs"], data = flags["data"];
  if (config.empty()) fail("--config is needed");
  std::shared_ptr<InMemory> train, test;
  try {
    train = std::make_shared<InMemory>(examples::loadFashionMnist(data, "train"));
    test = std::make_shared<InMemory>(examples::loadFashionMnist(data, "t10k"));
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::printf("%s; %lld training and %lld test records in memory\n", troupe::buildSummary().c_str(),
              static_cast<long long>(train->size()), static_cast<long long>(test->size()));
  std::fflush(stdout);
  troupe::TrainerCallbacks callbacks;
  callbacks.on_epoch = [](const troupe::EpochMetrics& e) {
    std::printf("epoch %lld: loss %.4f, accuracy %.4f, test accuracy %.4f, inputs/s %.0f\n",
                static_cast<long long>(e.epoch), e.loss, e.accuracy, e.test_accuracy,
                e.inputs_per_sec);
    std::fflush(stdout);
  };
  // No train_data or test_data setting: the records come from memory. Only the run's final
  // checkpoint is written (checkpoint_every 0), in the working directory.
  troupe::TrainerData sources;
  sources.train = train;
  sources.test = test;
  auto trainer = troupe::Trainer::start(
      config, {{"num_epochs", epochs}, {"checkpoint_every", "0"}, {"log_every", "0"}},
      std::move(callbacks), std::move(sources));
  if (!trainer) fail(trainer.status().message());
  const troupe::Status done = trainer.value()->wait(std::chrono::hours(1));
  if (!done) fail(done.message());
  return 0;
}
