// troupe::Trainer (include/troupe/trainer.h): runTraining on a thread of its own, steered through
// RunControl, its errors turned into Status values.
#include <condition_variable>
#include <map>
#include <mutex>
#include <new>
#include <thread>

#include "actors/peer.h"
#include "actors/run_plan.h"
#include "actors/status_of.h"
#include "actors/train_config.h"
#include "actors/trainer.h"
#include "data/dataset.h"
#include "troupe/error.h"
#include "troupe/trainer.h"

namespace troupe {

struct Trainer::State {
  actors::RunControl control;
  std::thread thread;
  mutable std::mutex mutex;
  std::condition_variable ended;
  bool done = false;
  Status status;
};

Trainer::Trainer(std::shared_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<Trainer>> Trainer::start(const std::string& config_file,
                                                const Settings& settings,
                                                TrainerCallbacks callbacks) {
  actors::TrainOptions options;
  try {
    actors::ConfigOverrides overrides;
    for (const auto& [key, value] : settings)
      overrides.insert_or_assign(key, value);
    options = actors::loadTrainOptions(config_file, overrides);
    // The data is opened here too, so that a missing database is the answer, not a failed run.
    if (options.train_data.empty()) throw InputError("no training data: set train_data");
    data::openDataset(actors::datasetOptions(options, options.train_data));
    if (!options.test_data.empty()) {
      data::openDataset(actors::datasetOptions(options, options.test_data));
    }
  } catch (const std::exception& e) {
    return actors::statusOf(e);
  }
  auto state = std::make_shared<State>();
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

Trainer::~Trainer() {
  if (!state_) return;
  stop(false);
  if (state_->thread.joinable()) state_->thread.join();
}

}  // namespace troupe
