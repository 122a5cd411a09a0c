// troupe::Trainer (include/troupe/trainer.h): runTraining on a thread of its own, steered through
// RunControl, its errors turned into Status values.
#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "actors/config/train_config.h"
#include "actors/core/peer.h"
#include "actors/core/status_of.h"
#include "actors/run/run_plan.h"
#include "actors/run/trainer.h"
#include "data/dataset.h"
#include "data/memory_dataset.h"
#include "troupe/error.h"
#include "troupe/trainer.h"

namespace troupe {

struct Trainer::State {
  ~State() {
    for (const auto& path : memory_datasets)
      data::unregisterMemoryDataset(path);
  }
  actors::RunControl control;
  std::vector<std::string> memory_datasets;  // registered for this run's TrainerData
  std::thread thread;
  mutable std::mutex mutex;
  std::condition_variable ended;
  bool done = false;
  Status status;
  // The world from the settings: fixed runs know it before they form.
  int workers = 1, servers = 0, replicas = 1;
  bool elastic = false;
};

Trainer::Trainer(std::shared_ptr<State> state) : state_(std::move(state)) {}

namespace {

// A RecordSource as the Reader actors read a database.
class SourceDataset final : public data::Dataset {
 public:
  SourceDataset(std::shared_ptr<const RecordSource> source, data::DatasetOptions options)
      : source_(std::move(source)), options_(std::move(options)) {}
  std::int64_t size() const override { return source_->size(); }
  const data::DatasetOptions& options() const override { return options_; }
  void read(const std::vector<std::int64_t>& indices, std::int64_t /*epoch*/, float* images,
            std::int32_t* labels) override {
    const std::size_t n =
        static_cast<std::size_t>(options_.channels) * options_.height * options_.width;
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::int64_t index = indices[i];
      if (index < 0 || index >= size()) {
        throw InputError(fmt::format("{}: index {} of {} records", options_.path, index, size()));
      }
      const Result<int> label = source_->read(index, {images + i * n, n});
      const std::string key = std::to_string(index);
      if (!label) throw data::BadRecordError(options_.path, key, label.status().message());
      if (label.value() < 0 || label.value() >= options_.num_labels) {
        throw data::BadRecordError(
            options_.path, key,
            fmt::format("label {} outside [0, {})", label.value(), options_.num_labels));
      }
      labels[i] = label.value();
    }
  }

 private:
  std::shared_ptr<const RecordSource> source_;
  data::DatasetOptions options_;
};

// Registers `source` as a memory dataset of the run's shape, and names it in `overrides[key]`.
void useSource(const std::shared_ptr<const RecordSource>& source, const char* key,
               const std::string& config_file, actors::ConfigOverrides& overrides,
               Trainer::State& state) {
  if (!source) return;
  static std::atomic<int> runs{0};
  const std::string path = fmt::format("{}trainer-{}-{}", data::kMemoryScheme, runs++, key);
  // The shape the run's model takes: the config's, as its databases would be read.
  auto probe = overrides;
  probe[key] = path;
  const auto options = actors::datasetOptions(actors::loadTrainOptions(config_file, probe), path);
  data::registerMemoryDataset(path, std::make_shared<SourceDataset>(source, options));
  state.memory_datasets.push_back(path);
  overrides[key] = path;
}

}  // namespace

Result<std::unique_ptr<Trainer>> Trainer::start(const std::string& config_file,
                                                const Settings& settings,
                                                TrainerCallbacks callbacks, TrainerData data) {
  actors::TrainOptions options;
  auto state = std::make_shared<State>();
  try {
    actors::ConfigOverrides overrides;
    for (const auto& [key, value] : settings)
      overrides.insert_or_assign(key, value);
    useSource(data.train, "train_data", config_file, overrides, *state);
    useSource(data.test, "test_data", config_file, overrides, *state);
    options = actors::loadTrainOptions(config_file, overrides);
    options.reader_factory = std::move(data.reader);
    // The data is opened here too, so that a missing database is the answer, not a failed run.
    actors::checkTrainingData(options);
    if (!options.train_data.empty()) {
      data::openDataset(actors::datasetOptions(options, options.train_data, /*train=*/true));
    }
    if (!options.test_data.empty()) {
      data::openDataset(actors::datasetOptions(options, options.test_data));
    }
  } catch (const std::exception& e) {
    return actors::statusOf(e);
  }
  state->workers = options.num_shards;
  state->servers = options.num_servers;
  state->replicas = options.replicas;
  state->elastic = options.min_workers > 0;
  state->control.callbacks = std::move(callbacks);
  state->thread = std::thread([state, options = std::move(options)] {
    Status status;
    try {
      actors::runTraining(options, &state->control);
    } catch (const std::exception& e) {
      status = actors::statusOf(e);
    } catch (...) {
      status = Status(ErrorKind::kInternal, "the run ended with an exception that is no error");
    }
    std::lock_guard lock(state->mutex);
    state->done = true;
    state->status = std::move(status);
    state->ended.notify_all();
  });
  return std::unique_ptr<Trainer>(new Trainer(std::move(state)));
}

void Trainer::requestCheckpoint() {
  state_->control.checkpoint.store(true);
}

void Trainer::stop(bool checkpoint) {
  state_->control.checkpoint_at_stop.store(checkpoint);
  state_->control.stop.store(true);
}

Status Trainer::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(state_->mutex);
  if (!state_->ended.wait_for(lock, timeout, [&] { return state_->done; })) {
    return {ErrorKind::kTimeout, "the run still goes after " + std::to_string(timeout.count()) +
                                     " ms (at step " +
                                     std::to_string(state_->control.steps.load()) + ")"};
  }
  return state_->status;
}

bool Trainer::running() const {
  std::lock_guard lock(state_->mutex);
  return !state_->done;
}

std::int64_t Trainer::steps() const {
  return state_->control.steps.load();
}

Result<Topology> Trainer::topology() const {
  const int workers = state_->control.workers.load();
  if (workers > 0) {
    return Topology::create(workers, state_->control.servers.load(), state_->replicas);
  }
  if (state_->elastic) {
    return Status(ErrorKind::kInput,
                  "an elastic run's topology is known once its generation has formed (its "
                  "workers meet at rendezvous): ask again after the first step");
  }
  return Topology::create(state_->workers, state_->servers, state_->replicas);
}

Trainer::~Trainer() {
  if (!state_) return;
  stop(false);
  if (state_->thread.joinable()) state_->thread.join();
}

}  // namespace troupe
