#include "apps/suggest.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>

namespace troupe::apps {
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

std::optional<std::string> unknownFlagMessage(const CLI::App& app) {
  std::string unknown;
  for (const auto& arg : app.remaining(true)) {
    if (arg.size() > 2 && arg.starts_with("--")) {
      unknown = arg.substr(2, arg.find('=') - 2);  // --name=value
      break;
    }
  }
  if (unknown.empty()) return std::nullopt;
  // The chosen command, innermost first, then those above it: with fallthrough, each takes the
  // flags its own options do not.
  std::vector<const CLI::App*> chain{&app};
  while (!chain.back()->get_subcommands().empty())
    chain.push_back(chain.back()->get_subcommands().front());
  std::string command = "troupe";
  for (std::size_t i = 1; i < chain.size(); ++i)
    command += " " + chain[i]->get_name();
  std::vector<std::string> flags;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    for (const auto* option : (*it)->get_options()) {
      for (const auto& name : option->get_lnames()) {
        if (std::find(flags.begin(), flags.end(), name) == flags.end()) flags.push_back(name);
      }
    }
  }
  const auto nearest = nearestName(unknown, flags);
  std::string known;
  for (const auto& flag : flags)
    known += (known.empty() ? "--" : ", --") + flag;
  return fmt::format("unknown flag --{} of {}{} (known: {})", unknown, command,
                     nearest ? fmt::format(": did you mean --{}?", *nearest) : "", known);
}

}  // namespace troupe::apps
