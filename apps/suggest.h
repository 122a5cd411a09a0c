// "Did you mean ...?" for a misspelt flag of the command line: the nearest of the chosen command's
// flags (actors/config/nearest_name.h), offered only when it is near enough to be what was meant.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace CLI {
class App;
}

namespace troupe::apps {

// After CLI11's ExtrasError from parsing `app`: "unknown flag --bach_size of troupe train: did you
// mean --batch_size? (troupe train --help lists its flags)" for the first --flag that no option of
// the chosen command (or of a command above it) took; another framework's name for a key is
// recognised (--lr: --base_learning_rate). For troupe launch, a command not after `--` is said so.
// nullopt when every argument left over is a positional one, which CLI11's own message names well
// enough.
std::optional<std::string> unknownFlagMessage(const CLI::App& app);

// "unknown command 'trian': did you mean 'troupe train'? (troupe's commands: ...)" for a first
// word that names no command of `app`; nullopt for a command or an option.
std::optional<std::string> unknownCommandMessage(const CLI::App& app, std::string_view word);

}  // namespace troupe::apps
