// "Did you mean ...?" for a misspelt flag of the command line: the nearest of the chosen command's
// flags (actors/nearest_name.h), offered only when it is near enough to be what was meant.
#pragma once

#include <optional>
#include <string>

namespace CLI {
class App;
}

namespace troupe::apps {

// After CLI11's ExtrasError from parsing `app`: "unknown flag --bach_size of troupe train: did you
// mean --batch_size? (known: ...)" for the first --flag that no option of the chosen command (or
// of a command above it) took, listing that command's flags. nullopt when every argument left over
// is a positional one, which CLI11's own message names well enough.
std::optional<std::string> unknownFlagMessage(const CLI::App& app);

}  // namespace troupe::apps
