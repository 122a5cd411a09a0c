// The command line's side of a run's configuration (actors/config/train_config.h): every config key
// as a
// --key VALUE option of a subcommand, which wins over the config file and the environment.
#pragma once

#include "actors/config/train_config.h"

namespace CLI {
class App;
}

namespace troupe::apps {

// Adds --key options for every config key to a subcommand (a boolean's value optional; also
// --kv_store and --kv-store for schedule, --secret-file, --skip-bad-records); given ones land in
// *overrides, for actors::loadTrainOptions.
void addConfigOptions(CLI::App& command, actors::ConfigOverrides* overrides);

}  // namespace troupe::apps
