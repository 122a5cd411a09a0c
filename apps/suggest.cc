#include "apps/suggest.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <vector>

#include "actors/config/config_keys.h"
#include "actors/config/nearest_name.h"

namespace troupe::apps {

std::optional<std::string> unknownFlagMessage(const CLI::App& app) {
  // The chosen command, innermost first, then those above it: with fallthrough, each takes the
  // flags its own options do not.
  std::vector<const CLI::App*> chain{&app};
  while (!chain.back()->get_subcommands().empty())
    chain.push_back(chain.back()->get_subcommands().front());
  std::string command = "troupe";
  for (std::size_t i = 1; i < chain.size(); ++i)
    command += " " + chain[i]->get_name();
  const auto remaining = app.remaining(true);
  std::string unknown;
  for (const auto& arg : remaining) {
    if (arg.size() > 2 && arg.starts_with("--")) {
      unknown = arg.substr(2, arg.find('=') - 2);  // --name=value
      break;
    }
  }
  if (unknown.empty()) {
    // launch takes its command after `--`; without it, the command's own options are left over.
    if (command == "troupe launch" && !remaining.empty()) {
      return fmt::format(
          "troupe launch: '{}' is no option of troupe launch: the command every process runs goes "
          "after --, as in troupe launch -n 2 -- python3 train.py",
          remaining.front());
    }
    return std::nullopt;
  }
  std::vector<std::string> flags;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    for (const auto* option : (*it)->get_options()) {
      for (const auto& name : option->get_lnames()) {
        if (std::find(flags.begin(), flags.end(), name) == flags.end()) flags.push_back(name);
      }
    }
  }
  std::string suggestion;
  if (const auto other = actors::config::keyForOtherName(unknown);
      other && std::find(flags.begin(), flags.end(), other->key) != flags.end()) {
    suggestion =
        fmt::format(": did you mean --{}? (--{} is {})", other->key, unknown, other->whose);
  } else if (const auto nearest = actors::nearestName(unknown, flags)) {
    suggestion = fmt::format(": did you mean --{}?", *nearest);
  }
  return fmt::format("unknown flag --{} of {}{} ({} --help lists its flags)", unknown, command,
                     suggestion, command);
}

std::optional<std::string> unknownCommandMessage(const CLI::App& app, std::string_view word) {
  if (word.empty() || word.starts_with("-")) return std::nullopt;
  std::vector<std::string> commands;
  for (const auto* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == word) return std::nullopt;
    commands.push_back(sub->get_name());
  }
  const auto nearest = actors::nearestName(word, commands);
  std::string list;
  for (const auto& c : commands)
    list += (list.empty() ? "" : ", ") + c;
  return fmt::format("unknown command '{}'{} (troupe's commands: {})", word,
                     nearest ? fmt::format(": did you mean 'troupe {}'?", *nearest) : "", list);
}

}  // namespace troupe::apps
