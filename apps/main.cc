// troupe: the command-line front of libtroupe. It only parses and wires; the work is in the
// library.
#include <sys/resource.h>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <exception>

#include "apps/commands.h"
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

}  // namespace

int main(int argc, char** argv) {
  raiseOpenFileLimit();
  CLI::App app{"troupe: distributed deep-learning training"};
  app.require_subcommand(1);
  troupe::apps::addConvertCommand(app);
  troupe::apps::addTrainCommand(app);
  troupe::apps::addLaunchCommand(app);
  troupe::apps::addInfoCommand(app);
  troupe::apps::addBenchCommand(app);
  try {
    troupe::kernels::cpu::cpuIsa();  // a bad TROUPE_MAX_CPU_ISA is refused before any work
    app.parse(argc, argv);
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
