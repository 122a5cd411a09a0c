#include "apps/config.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <string>

namespace troupe::apps {

void addConfigOptions(CLI::App& command, actors::ConfigOverrides* overrides) {
  for (const auto& k : actors::configKeys()) {
    const std::string name = k.name;
    std::string flags = "--" + name;
    if (name == "skip_bad_records") flags += ",--skip-bad-records";
    auto* opt = command.add_option_function<std::string>(
        flags, [overrides, name](const std::string& v) { (*overrides)[name] = v; },
        fmt::format("{} ({})", k.summary, k.accepted));
    if (k.kind == "boolean") opt->expected(0, 1);
  }
  command.add_option_function<std::string>(
      "--kv_store,--kv-store", [overrides](const std::string& v) { (*overrides)["schedule"] = v; },
      "MXNet's name for --schedule");
  command.add_option_function<std::string>(
      "--secret-file", [overrides](const std::string& v) { (*overrides)["secret_file"] = v; },
      "same as --secret_file");
}

}  // namespace troupe::apps
