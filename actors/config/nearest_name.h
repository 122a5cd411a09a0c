// "Did you mean ...?" for a misspelt config key, flag or name: the nearest known one by edit
// distance, offered only when it is near enough to be what was meant.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors {

// Edits (insert, delete or replace a character, swap two adjacent ones) that turn `a` into `b`,
// letters' case and '-' against '_' aside: Damerau-Levenshtein in its optimal-string-alignment
// form (no substring is edited twice).
std::size_t editDistance(std::string_view a, std::string_view b);

// The candidate nearest to `name` (the first of equals) when it is at most max(1, size / 3)
// edits away, size being name's; nullopt when none is that near.
std::optional<std::string> nearestName(std::string_view name,
                                       const std::vector<std::string>& candidates);

}  // namespace troupe::actors
