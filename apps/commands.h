// The troupe command line: one function per subcommand, each adding itself to the CLI11 app and
// running when chosen. main() lists them in one table; there is no registry.
#pragma once

namespace CLI {
class App;
}

namespace troupe::apps {

void addConvertCommand(CLI::App& app);
void addTrainCommand(CLI::App& app);
void addInfoCommand(CLI::App& app);
void addLaunchCommand(CLI::App& app);
void addBenchCommand(CLI::App& app);
// `troupe bench input`, under addBenchCommand's `bench` (apps/input_bench.cc).
void addInputBenchCommand(CLI::App& bench);
void addReportCommand(CLI::App& app);
void addPlotCommand(CLI::App& app);
void addDocsCommand(CLI::App& app);

}  // namespace troupe::apps
