// `troupe train [CONFIG.toml] [--key value ...] [--dry-run]`: one process, Readers -> Replicas ->
// Reducer -> Updater as actors; --dry-run checks and prints the plan instead (apps/dry_run.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <memory>
#include <new>

#include "actors/run/trainer.h"
#include "apps/commands.h"
#include "apps/config.h"
#include "apps/dry_run.h"
#include "troupe/error.h"

namespace troupe::apps {

void addTrainCommand(CLI::App& app) {
  struct State {
    std::string config;
    actors::ConfigOverrides overrides;
    bool dry_run = false;
  };
  auto state = std::make_shared<State>();
  auto* cmd = app.add_subcommand("train", "Train a model (Caffe2 trainer flags accepted)");
  cmd->add_option("config", state->config, "TOML config file (optional)");
  addConfigOptions(*cmd, &state->overrides);
  cmd->add_flag("--dry-run", state->dry_run,
                "Check the config as a run would, print it resolved with the model's layers, the "
                "data and the plan, and exit without training or writing anything");
  cmd->callback([state] {
    const auto options = actors::loadTrainOptions(state->config, state->overrides);
    if (state->dry_run) {
      fmt::print("{}", dryRunReport(state->config, state->overrides, options));
      return;
    }
    actors::TrainResult result;
    try {
      result = actors::runTraining(options);
    } catch (const std::bad_alloc&) {  // thrown on this thread: actors report theirs as errors
      throw Error(fmt::format(
          "out of memory (std::bad_alloc) setting up the run: lower batch_size ({}), prefetch "
          "({}) or the model's size",
          options.batch_size, options.prefetch));
    }
    if (result.epochs.empty() && options.max_workers > 0) {
      spdlog::info("done: an elastic run's worker, at step {}", result.steps);
      return;
    }
    if (result.epochs.empty()) {  // not the chief: rank 0 logs the run
      spdlog::info(
          "done: {} {} of {}", actors::roleName(options.role), options.shard_id,
          options.role == actors::ProcessRole::kServer ? options.num_servers : options.num_shards);
      return;
    }
    if (options.test_data.empty()) {
      spdlog::info("done: {} steps, log {}", result.steps, result.log_path);
    } else {
      spdlog::info("done: {} steps, final test_accuracy {:.4f}, log {}", result.steps,
                   result.epochs.back().test_accuracy, result.log_path);
    }
  });
}

}  // namespace troupe::apps
