// "Did you mean ...?" for a misspelt config key, flag or name: the nearest known one by edit
// distance, offered only when it is near enough to be what was meant.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace troupe::apps {

// Edits (insert, delete or replace a character, swap two adjacent ones) that turn `a` into `b`,
// letters' case and '-' against '_' aside: Damerau-Levenshtein in its optimal-string-alignment
// form (no substring is edited twice).
std::size_t editDistance(std::string_view a, std::string_view b);

// The candidate nearest to `name` (the first of equals) when it is at most max(1, size / 3)
// edits away, size being name's; nullopt when none is that near.
std::optional<std::string> nearestName(std::string_view name,
                                       const std::vector<std::string>& candidates);

// After CLI11's ExtrasError from parsing `app`: "unknown flag --bach_size of troupe train: did you
// mean --batch_size? (known: ...)" for the first --flag that no option of the chosen command (or
// of a command above it) took, listing that command's flags. nullopt when every argument left over
// is a positional one, which CLI11's own message names well enough.
std::optional<std::string> unknownFlagMessage(const CLI::App& app);

}  // namespace troupe::apps
