// What the tests of `troupe launch` (launch_*_test.cc) check alike for every launcher.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_util.h"

namespace troupe::testing {

// A command for `troupe launch -- ...` that runs tests/torchrun_allreduce.py, a script written for
// torchrun: each rank adds rank + 1 by gloo's allreduce and prints what it saw.
inline std::string torchrunScript() {
  return "/usr/bin/python3 " + sourceDir() + "/tests/torchrun_allreduce.py";
}

// `r` is a launch of torchrunScript() by `local.size()` workers that exited 0, worker i printing
// its rank with torchrun's LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK as `local[i]` says them
// ("local 0 of 2, group 0") and the allreduce's sum, 1 + 2 + ... + the world size.
inline ::testing::AssertionResult ranTheTorchrunScript(const CommandResult& r,
                                                       const std::vector<std::string>& local) {
  const int world = static_cast<int>(local.size());
  std::vector<std::string> lines;
  for (int i = 0; i < world; ++i) {
    lines.push_back("[worker " + std::to_string(i) + "] rank " + std::to_string(i) + " of " +
                    std::to_string(world) + ", " + local[i] + ": sum " +
                    std::to_string(world * (world + 1) / 2));
  }
  return exitedWith(r, 0, lines);
}

// `r` is a launch of secretCensus() by `workers` workers that exited 0, every worker having the
// run's secret (64 characters) and finding it on none of this host's command lines.
inline ::testing::AssertionResult keptTheSecretOffCommandLines(const CommandResult& r,
                                                               int workers) {
  std::vector<std::string> lines;
  for (int i = 0; i < workers; ++i)
    lines.push_back("[worker " + std::to_string(i) + "] secret of 64 chars on 0 command lines");
  return exitedWith(r, 0, lines);
}

// Starts `launch` (a `troupe launch` command line up to its -n) in `cwd` with `processes`
// processes that each wait for a 60 s sleep, sends the launcher SIGTERM once every sleep runs (or
// after 10 s), and checks that it exits 143 saying "got signal 15" and that no sleep outlives it
// by 0.5 s.
inline ::testing::AssertionResult stoppingTheLauncherEndsEveryProcess(const TempDir& cwd,
                                                                      const std::string& launch,
                                                                      int processes) {
  const std::string pids = cwd.str() + "/pids";
  const std::string n = std::to_string(processes);
  const auto r = runCommand(
      "cd " + cwd.str() + " && { " + launch + " -n " + n + " -- bash -c 'sleep 60 & echo $! >> " +
      pids + "; wait' & L=$!; for i in $(seq 100); do [ $(cat " + pids +
      " 2>/dev/null | wc -l) = " + n +
      " ] && break; sleep 0.1; done; kill -TERM $L; wait $L; echo launcher exit $?; sleep 0.5; "
      "for p in $(cat " +
      pids +
      "); do [ -d /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status && echo alive $p; done; "
      "true; }");
  if (contains(r.output, "alive")) {
    return ::testing::AssertionFailure() << "a process outlived the launcher\n" << r.output;
  }
  return containsAll(r.output, {"launcher exit 143", "got signal 15"});
}

}  // namespace troupe::testing
