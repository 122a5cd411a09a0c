// `troupe info`: what this build has (version, backends, threads), for bug reports.
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <thread>

#include "apps/commands.h"
#include "kernels/backend.h"
#include "kernels/cpu/isa.h"
#include "troupe/config.h"

namespace troupe::apps {

void addInfoCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print what this build of troupe has");
  cmd->callback([] {
    fmt::print("troupe {}\n", TROUPE_VERSION);
    fmt::print("cuda backend: {}\n", TROUPE_USE_CUDA ? "built" : "not built");
    fmt::print("hardware threads: {}\n", std::thread::hardware_concurrency());
    fmt::print("cpu kernels: {} (held lower by TROUPE_MAX_CPU_ISA or ONEDNN_MAX_CPU_ISA)\n",
               kernels::cpu::isaName(kernels::cpu::cpuIsa()));
  });
}

}  // namespace troupe::apps
