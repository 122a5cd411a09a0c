#include "apps/suggest.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <vector>

#include "actors/nearest_name.h"

namespace troupe::apps {

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
  const auto nearest = actors::nearestName(unknown, flags);
  std::string known;
  for (const auto& flag : flags)
    known += (known.empty() ? "--" : ", --") + flag;
  return fmt::format("unknown flag --{} of {}{} (known: {})", unknown, command,
                     nearest ? fmt::format(": did you mean --{}?", *nearest) : "", known);
}

}  // namespace troupe::apps
