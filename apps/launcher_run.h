// One start of a run's world (apps/launcher*.cc only; see launcher.h): the local and ssh
// launchers (launcher_children.cc) and the mpi launcher (launcher_mpi.cc). Each starts every
// process, relays their lines, names the failure, stops the rest and reaps everything before it
// returns; none of them ever waits on the launcher's own output.
#pragma once

#include <string>
#include <vector>

#include "apps/launcher.h"
#include "apps/launcher_failure.h"

namespace troupe::apps {
class OutputRelay;
}  // namespace troupe::apps

namespace troupe::apps::launch_detail {

struct RunContext {
  const LaunchOptions& options;  // with the run's secret (or its file) in env
  const std::vector<std::string>& command;
  const std::string& run_id;
  const std::string& rendezvous;
  const std::vector<LaunchHost>& hosts;  // ssh: required; mpi: may be empty
  int generation = 0;
  OutputRelay& relay;
};

enum class Kind { kLocal, kSsh };

// local and ssh: one child process per role and rank.
Attempt runChildren(Kind kind, const RunContext& run);

// mpi: one mpirun for the whole world.
Attempt runMpi(const RunContext& run);

}  // namespace troupe::apps::launch_detail
