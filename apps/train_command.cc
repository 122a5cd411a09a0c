// `troupe train [CONFIG.toml] [--key value ...]`: one process, Readers -> Replicas -> Reducer ->
// Updater as actors.
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <memory>

#include "actors/trainer.h"
#include "apps/commands.h"
#include "apps/config.h"

namespace troupe::apps {

void addTrainCommand(CLI::App& app) {
  struct State {
    std::string config;
    Overrides overrides;
  };
  auto state = std::make_shared<State>();
  auto* cmd = app.add_subcommand("train", "Train a model (Caffe2 trainer flags accepted)");
  cmd->add_option("config", state->config, "TOML config file (optional)");
  addConfigOptions(*cmd, &state->overrides);
  cmd->callback([state] {
    const auto options = loadTrainOptions(state->config, state->overrides);
    const auto result = actors::runTraining(options);
    if (result.epochs.empty()) {  // not the chief: rank 0 logs the run
      spdlog::info("done: {} {} of {}", options.role, options.shard_id,
                   options.role == "server" ? options.num_servers : options.num_shards);
      return;
    }
    spdlog::info("done: {} steps, final test_accuracy {:.4f}, log {}", result.steps,
                 result.epochs.back().test_accuracy, result.log_path);
  });
}

}  // namespace troupe::apps
