// `troupe docs config`: reference documents generated from the code (docs/config.md).
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include "actors/config/train_config.h"
#include "apps/commands.h"

namespace troupe::apps {

void addDocsCommand(CLI::App& app) {
  auto* docs = app.add_subcommand("docs", "Print troupe's reference documents, made from the code");
  docs->require_subcommand(1);
  docs->add_subcommand("config", "Every troupe train config key, in Markdown (docs/config.md)")
      ->callback([] { fmt::print("{}", actors::configReferenceMarkdown()); });
}

}  // namespace troupe::apps
