#include "actors/config/nearest_name.h"

#include <algorithm>
#include <cctype>

namespace troupe::actors {
namespace {

char folded(char c) {
  return c == '-' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
}

}  // namespace

std::size_t editDistance(std::string_view a, std::string_view b) {
  // d[i][j]: edits from a's first i characters to b's first j, three rows kept.
  std::vector<std::size_t> before(b.size() + 1), last(b.size() + 1), row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j)
    last[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const bool same = folded(a[i - 1]) == folded(b[j - 1]);
      row[j] = std::min({last[j] + 1, row[j - 1] + 1, last[j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && folded(a[i - 1]) == folded(b[j - 2]) &&
          folded(a[i - 2]) == folded(b[j - 1])) {
        row[j] = std::min(row[j], before[j - 2] + 1);
      }
    }
    std::swap(before, last);
    std::swap(last, row);
  }
  return last[b.size()];
}

std::optional<std::string> nearestName(std::string_view name,
                                       const std::vector<std::string>& candidates) {
  const std::size_t most = std::max<std::size_t>(1, name.size() / 3);
  std::optional<std::string> best;
  std::size_t best_distance = most + 1;
  for (const auto& candidate : candidates) {
    const std::size_t d = editDistance(name, candidate);
    if (d < best_distance) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace troupe::actors
