// `troupe info [--json]`: this build and this machine, for bug reports (apps/system_info.h).
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <memory>

#include "apps/commands.h"
#include "apps/system_info.h"

namespace troupe::apps {

void addInfoCommand(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "info", "Print this build (version, compiler, libraries) and machine, for bug reports");
  cmd->add_flag("--json", *json, "One JSON object, for machines");
  cmd->callback([json] {
    const auto sections = systemInfo();
    fmt::print("{}", *json ? infoJson(sections) : infoText(sections));
  });
}

}  // namespace troupe::apps
