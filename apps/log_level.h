// The console's log level: --log-level LEVEL or --quiet (warn) on the troupe command, before or
// after the subcommand's name (`troupe --quiet train ...`, `troupe train --quiet ...`), else
// $TROUPE_LOG_LEVEL, else spdlog's default, info. It applies to this process only: a launcher's
// processes take theirs from their own command line or environment.
#pragma once

#include <spdlog/common.h>

#include <string_view>

namespace CLI {
class App;
}

namespace troupe::apps {

// Adds --log-level and --quiet to `app`, the top-level command, and lets every subcommand already
// added pass them up (CLI11's fallthrough; an unknown flag then reaches `app` too, whose
// ExtrasError names it). Once the command line is parsed, before any subcommand runs, sets the
// level of spdlog's loggers; an unknown level is an InputError then.
void addLogLevelOptions(CLI::App& app);

// The level called `text` (trace, debug, info, warn, error, critical, off; any case); otherwise an
// InputError naming `origin` (--log-level, TROUPE_LOG_LEVEL) and listing the levels.
spdlog::level::level_enum parseLogLevel(std::string_view text, std::string_view origin);

}  // namespace troupe::apps
