#include "apps/log_level.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/config/nearest_name.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

constexpr std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
    {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
    {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
    {"error", spdlog::level::err},   {"critical", spdlog::level::critical},
    {"off", spdlog::level::off}};

void passOptionsUp(CLI::App& command) {
  for (auto* sub : command.get_subcommands([](CLI::App*) { return true; })) {
    sub->fallthrough();
    passOptionsUp(*sub);
  }
}

}  // namespace

spdlog::level::level_enum parseLogLevel(std::string_view text, std::string_view origin) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::vector<std::string> names;
  for (const auto& [name, level] : kLevels) {
    if (lower == name) return level;
    names.emplace_back(name);
  }
  const auto nearest = actors::nearestName(lower, names);
  throw InputError(fmt::format("{}: unknown log level '{}'{} (valid: {})", origin, text,
                               nearest ? fmt::format(": did you mean '{}'?", *nearest) : "",
                               fmt::join(names, ", ")));
}

void addLogLevelOptions(CLI::App& app) {
  struct State {
    std::string level;
    bool quiet = false;
  };
  auto state = std::make_shared<State>();
  auto* level = app.add_option("--log-level,--log_level", state->level,
                               "console log level: trace, debug, info, warn, error, critical or "
                               "off (default: $TROUPE_LOG_LEVEL, else info)");
  app.add_flag("--quiet", state->quiet, "warnings and errors only: --log-level warn")
      ->excludes(level);
  passOptionsUp(app);
  // Runs before the subcommands' callbacks (CLI11 calls the top level's first).
  app.parse_complete_callback([state] {
    if (!state->level.empty()) {
      spdlog::set_level(parseLogLevel(state->level, "--log-level"));
    } else if (state->quiet) {
      spdlog::set_level(spdlog::level::warn);
    } else if (const char* env = std::getenv("TROUPE_LOG_LEVEL"); env && *env) {
      spdlog::set_level(parseLogLevel(env, "TROUPE_LOG_LEVEL"));
    }
  });
}

}  // namespace troupe::apps
