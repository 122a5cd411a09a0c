// troupe: the command-line front of libtroupe. It only parses and wires; the work is in the
// library.
#include <sys/resource.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "apps/commands.h"
#include "apps/help_format.h"
#include "apps/log_level.h"
#include "apps/output_relay.h"
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

// A store URL's password on the command line (--rendezvous redis://:PASSWORD@HOST) is readable
// by every user of the host in /proc/PID/cmdline for as long as the process runs: it is
// overwritten with '*' there, once the arguments are copied for parsing ($REDISCLI_AUTH keeps it
// off for good). A URL's user information (up to its last '@') is USER:PASSWORD or PASSWORD.
void hidePasswordsInOwnCommandLine(int argc, char** argv) {
  constexpr std::string_view kSeparator = "://";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    const auto begin = arg.find(kSeparator);
    // Up to the argument's last '@' (a password may hold '@' or "://", as parseStoreUrl reads
    // it): more than the password where the argument holds more after it, never less.
    const auto end = arg.rfind('@');
    if (begin == std::string_view::npos || end == std::string_view::npos || end < begin) continue;
    const auto colon = arg.substr(0, end).find(':', begin + kSeparator.size());
    for (auto j = colon == std::string_view::npos ? begin + kSeparator.size() : colon + 1; j < end;
         ++j)
      argv[i][j] = '*';
  }
}

}  // namespace

int main(int argc, char** argv) {
  raiseOpenFileLimit();
  plainLogsUnderALauncher();
  // A launched process never waits on its output: a launcher stopped (SIGSTOP, a suspended ssh)
  // or slow to read it left a process blocked in a write of a full pipe, which its peers then
  // took for a hung process. Its lines queue, and beyond a few MiB are dropped and counted.
  std::optional<troupe::apps::OutputRelay> relay;
  std::optional<troupe::apps::LogThroughRelay> logs;
  if (std::getenv("TROUPE_ROLE")) {
    std::signal(SIGPIPE, SIG_IGN);  // a reader gone is EPIPE, for the relay to count
    troupe::apps::OutputRelayOptions options;
    options.tag = "troupe";
    options.owner = "this process's";
    relay.emplace(options);
    logs.emplace(*relay);
  }
  std::vector<std::string> args(argv, argv + argc);  // what is parsed: the unmasked copies
  std::vector<char*> arg_pointers;
  for (auto& arg : args)
    arg_pointers.push_back(arg.data());
  hidePasswordsInOwnCommandLine(argc, argv);
  CLI::App app{"troupe: distributed deep-learning training"};
  app.formatter(std::make_shared<troupe::apps::HelpFormatter>());  // before the subcommands
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
  if (argc > 1) {
    if (const auto message = troupe::apps::unknownCommandMessage(app, argv[1])) {
      spdlog::error("{}", *message);
      return 1;
    }
  }
  try {
    troupe::kernels::cpu::cpuIsa();  // a bad TROUPE_MAX_CPU_ISA is refused before any work
    app.parse(argc, arg_pointers.data());
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
