// `troupe plot LOG... -o FILE.svg|.png [--label NAME]... [--title T] [--size WxH]`: training logs
// drawn side by side (apps/plot.h), as MXNet users drew parse_log's output with matplotlib.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "apps/log_report.h"
#include "apps/plot.h"
#include "troupe/error.h"

namespace troupe::apps {

void addPlotCommand(CLI::App& app) {
  struct Args {
    std::vector<std::string> logs;
    std::vector<std::string> labels;
    PlotOptions plot;
    std::string size;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "plot", "Plot training logs: loss, accuracy and inputs/s against epoch and wall time");
  cmd->add_option("logs", args->logs, "CSV training logs (troupe train's *.log)")->required();
  cmd->add_option("-o,--out", args->plot.output, "FILE.svg or FILE.png")->required();
  cmd->add_option("--label", args->labels,
                  "a run's name in the legend, one per log in order (default: its experiment id)")
      ->allow_extra_args(false);
  cmd->add_option("--title", args->plot.title, "the plot's title");
  cmd->add_option("--size", args->size, "WIDTHxHEIGHT in pixels (default 1200x960)");
  cmd->callback([args] {
    auto& a = *args;
    if (!a.size.empty()) {
      int w = 0, h = 0;
      char tail = 0;
      if (std::sscanf(a.size.c_str(), "%dx%d%c", &w, &h, &tail) != 2 || w < 400 || h < 300 ||
          w > 8000 || h > 8000) {
        throw InputError(fmt::format(
            "--size {}: expected WIDTHxHEIGHT, 400x300 to 8000x8000 (e.g. 1600x1200)", a.size));
      }
      a.plot.width = w;
      a.plot.height = h;
    }
    if (!a.labels.empty() && a.labels.size() != a.logs.size()) {
      throw InputError(fmt::format("{} --label for {} logs: give one per log, or none",
                                   a.labels.size(), a.logs.size()));
    }
    std::vector<TrainLogFile> logs;
    for (const auto& path : a.logs)
      logs.push_back(readTrainLog(path));
    std::vector<std::string> labels = a.labels;
    for (std::size_t i = labels.size(); i < logs.size(); ++i)
      labels.push_back(logs[i].experiment_id);
    plotLogs(logs, labels, a.plot);
    fmt::print("{}: {} run(s), {} epoch(s) in all\n", a.plot.output, logs.size(), [&] {
      std::size_t n = 0;
      for (const auto& l : logs)
        n += l.rows.size();
      return n;
    }());
  });
}

}  // namespace troupe::apps
