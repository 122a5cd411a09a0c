// `troupe report LOG... [-o FILE.md]`: the tables of MXNet's tools/parse_log.py, in Markdown, from
// troupe's CSV training logs (apps/log_report.h).
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "apps/log_report.h"
#include "troupe/error.h"

namespace troupe::apps {

void addReportCommand(CLI::App& app) {
  struct Args {
    std::vector<std::string> logs;
    std::string out;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "report", "Markdown tables of training logs: per epoch, and a summary of several runs");
  cmd->add_option("logs", args->logs, "CSV training logs (troupe train's *.log)")->required();
  cmd->add_option("-o,--out", args->out, "write the report here instead of to stdout");
  cmd->callback([args] {
    std::vector<TrainLogFile> logs;
    for (const auto& path : args->logs)
      logs.push_back(readTrainLog(path));  // every log is checked before anything is written
    const std::string report = reportMarkdown(logs);
    if (args->out.empty()) {
      fmt::print("{}", report);
      return;
    }
    std::ofstream out(args->out, std::ios::binary | std::ios::trunc);
    if (!(out << report) || !out.flush()) {
      throw IoError(
          fmt::format("cannot write the report to '{}': {}", args->out, std::strerror(errno)));
    }
  });
}

}  // namespace troupe::apps
