// A training run in this process, started in the background: what `troupe train` does, for a
// service that embeds troupe. It reads the same settings (a TOML config file and key = value
// overrides, as `troupe train CONFIG --key value`), trains on threads of its own, reports each
// step and epoch to callbacks, checkpoints on request, stops gracefully, and is waited for with a
// timeout. Every error comes back as a Status; none is thrown at the caller.
//
//   auto started = troupe::Trainer::start("configs/mlp.toml",
//                                        {{"train_data", "/data/train"}, {"num_epochs", "2"}},
//                                        {.on_epoch = [](const troupe::EpochMetrics& e) { ... }});
//   if (!started) return fail(started.status().message());
//   auto& trainer = *started.value();
//   trainer.requestCheckpoint();                    // a few steps on; the run goes on
//   troupe::Status done = trainer.wait(std::chrono::minutes(10));
//
// In a run of several processes (num_shards > 1), each process runs its own Trainer; the callbacks
// fire in the chief (rank 0), whose requests pause every process.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/reader.h"
#include "troupe/record_source.h"
#include "troupe/settings.h"
#include "troupe/status.h"
#include "troupe/topology.h"

namespace troupe {

struct StepMetrics {
  std::int64_t step = 0;            // steps done in the run, this one included
  std::int64_t epoch = 0;           // 1-based
  std::int64_t step_in_epoch = 0;   // 1-based
  std::int64_t steps_in_epoch = 0;  // at this run's global batch
  double loss = 0;                  // of this step's global batch
  double accuracy = 0;
  double learning_rate = 0;
};

struct EpochMetrics {
  std::int64_t epoch = 0;  // 1-based
  std::int64_t step = 0;   // steps done in the run
  double loss = 0;
  double accuracy = 0;
  double test_accuracy = -1;  // -1: no test data
  double inputs_per_sec = 0;
  double seconds = 0;
  double test_loss = -1;  // a language model's, a token (-1: no test data, or images)
};

// Called on a thread of the run, between its steps: keep them short, and do not call the
// Trainer's wait() from them.
struct TrainerCallbacks {
  std::function<void(const StepMetrics&)> on_step;
  std::function<void(const EpochMetrics&)> on_epoch;
  std::function<void(const std::string& path, std::int64_t step)> on_checkpoint;
};

// Records of one's own (troupe/record_source.h) in place of train_data's and test_data's
// databases; null: the database the settings name.
struct TrainerData {
  std::shared_ptr<const RecordSource> train;
  std::shared_ptr<const RecordSource> test;
  // Readers of one's own (troupe/reader.h), one for each replica, in place of the training
  // database's: the run then needs epoch_size (the inputs an epoch trains: troupe cannot count
  // a reader's records), and train_data may stay unset. Test data is read as without it.
  std::function<std::unique_ptr<ReaderActor>(const ReaderSpec&)> reader;
};

class Trainer {
 public:
  // Loads `config_file` (TOML; empty: none) with `settings` over it, checks them, opens the data
  // and starts training. A bad setting or file is the error value, and nothing runs.
  static Result<std::unique_ptr<Trainer>> start(const std::string& config_file,
                                                const Settings& settings,
                                                TrainerCallbacks callbacks = {},
                                                TrainerData data = {});

  // Asks for a checkpoint a few steps on (every process pauses, the chief writes it, they go
  // on); on_checkpoint says where. Returns at once.
  void requestCheckpoint();
  // Asks the run to stop a few steps on, after a checkpoint when `checkpoint`. Returns at once;
  // wait() then returns ok. A run that ends first ends as it would have.
  void stop(bool checkpoint = true);
  // Waits up to `timeout` for the run to end: ok once it finished or stopped, its error if it
  // failed, a kTimeout status if it still runs (it goes on).
  Status wait(std::chrono::milliseconds timeout);
  bool running() const;
  // Steps the run has done (0 until its first step ends).
  std::int64_t steps() const;
  // Where the run's actors are (troupe/topology.h): an evaluator or a reader of one's own finds
  // them by name. An elastic run's is known once its current generation has formed (kInput
  // until then) and changes with it.
  Result<Topology> topology() const;

  // Stops the run (without a checkpoint) and waits for it.
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  struct State;

 private:
  explicit Trainer(std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

}  // namespace troupe
