// troupe: the command-line front of libtroupe. It only parses and wires; the work is in the
// library.
#include <sys/resource.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <exception>
#include <memory>

#include "apps/commands.h"
#include "apps/log_level.h"
#include "apps/suggest.h"
#include "kernels/cpu/isa.h"
#include "troupe/error.h"

namespace {

// Descriptors are what a run of many links (and a stranger flooding them) uses up first: take the
// hard limit, as Go's runtime and many servers do. Listeners bound what strangers may hold
// (transport/accept_gate.h), so this only gives the run's own links and files room.
void raiseOpenFileLimit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// A process of a launched run (TROUPE_ROLE set by any launcher) logs without colour codes: the
// launcher relays its lines, and Open MPI gives the ranks on mpirun's own host a terminal.
void plainLogsUnderALauncher() {
  if (!std::getenv("TROUPE_ROLE")) return;
  for (const auto& sink : spdlog::default_logger()->sinks()) {
    if (auto colour = std::dynamic_pointer_cast<spdlog::sinks::stdout_color_sink_mt>(sink)) {
      colour->set_color_mode(spdlog::color_mode::never);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  raiseOpenFileLimit();
  plainLogsUnderALauncher();
  CLI::App app{"troupe: distributed deep-learning training"};
  app.require_subcommand(1);
  troupe::apps::addConvertCommand(app);
  troupe::apps::addTrainCommand(app);
  troupe::apps::addLaunchCommand(app);
  troupe::apps::addInfoCommand(app);
  troupe::apps::addBenchCommand(app);
  troupe::apps::addReportCommand(app);
  troupe::apps::addPlotCommand(app);
  troupe::apps::addDocsCommand(app);
  troupe::apps::addLogLevelOptions(app);  // after the subcommands: each passes them up
  try {
    troupe::kernels::cpu::cpuIsa();  // a bad TROUPE_MAX_CPU_ISA is refused before any work
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    if (const auto message = troupe::apps::unknownFlagMessage(app)) {
      spdlog::error("{}", *message);
      return 1;
    }
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const troupe::Error& e) {
    spdlog::error("{}", e.what());
    return 1;
  } catch (const std::exception& e) {
    spdlog::error("unexpected error: {}", e.what());
    return 1;
  }
  return 0;
}
