// Training configuration: a TOML file of flat keys (plus [[layers]] for a custom model), any key
// overridable on the command line as --key VALUE. The keys are Caffe2's trainer flags where Caffe2
// has one (--train_data, --batch_size, --base_learning_rate ...), and troupe's own otherwise.
// Unknown keys and values of the wrong type are InputErrors naming the file (or flag) and the key.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "actors/trainer.h"

namespace CLI {
class App;
}

namespace troupe::apps {

// Every key, for --help and for error messages.
struct ConfigKey {
  std::string name;
  std::string kind;  // "integer", "number", "boolean", "string", "list of numbers"
  std::string help;
};
const std::vector<ConfigKey>& configKeys();

// Values given on the command line, by key, as text.
using Overrides = std::map<std::string, std::string>;

// Adds --key options for every config key to a subcommand; given ones land in *overrides.
void addConfigOptions(CLI::App& command, Overrides* overrides);

// defaults <- file (if not empty) <- overrides.
actors::TrainOptions loadTrainOptions(const std::string& file, const Overrides& overrides);

}  // namespace troupe::apps
