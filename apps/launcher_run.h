// One start of a run's world (apps/launcher*.cc only; see launcher.h): the local and ssh
// launchers (launcher_children.cc), one child process per role and rank; the mpi and slurm
// launchers (launcher_mpi.cc, launcher_slurm.cc), one mpirun or srun for the whole world whose
// tasks report host, pid and exit code on marker lines (launcher_wrapped.h). Each starts every
// process, relays their lines, names the failure, stops the rest and reaps everything before it
// returns; none of them ever waits on the launcher's own output.
//
// Every launcher gives each process its place in TROUPE_* variables (launcher.h); a process that
// has TROUPE_ROLE or TROUPE_RANK reads no cluster variables. One that no launcher started takes
// its place from the engine that did (actors/config/cluster_env.h): under srun, SLURM_PROCID and
// SLURM_NTASKS, task 0 serving the store on the first node of SLURM_STEP_NODELIST; in a Kubernetes
// Indexed Job, JOB_COMPLETION_INDEX; under mpirun, OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE.
// Precedence, key by key: flag > TROUPE_* > cluster variables > config file.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "apps/launcher.h"
#include "apps/launcher_failure.h"

namespace troupe::apps {
class OutputRelay;
}  // namespace troupe::apps

namespace troupe::apps::launch_detail {

// torchrun's elastic model (launcher_elastic.cc): this launcher's workers are ranks
// [rank_base, rank_base + num_workers) of a world of world_size, its launcher group
// `group_rank` of `group_size` (GROUP_RANK: each launcher is a torchrun agent), rank 0 serving
// torch.distributed's store at master_addr:master_port.
struct AgentPlace {
  int rank_base = 0;
  int world_size = 0;
  int group_rank = 0;
  int group_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restarts = 0;  // TORCHELASTIC_RESTART_COUNT: the restarts after a failure so far
  // Polled by the local and ssh launchers' loop while the processes run: a reason to stop every
  // one of them now (a launcher asks to join, a worker of another launcher failed), which ends
  // the attempt as `changed`, not failed; empty: go on.
  std::function<std::string()> watch;
};

struct RunContext {
  const LaunchOptions& options;  // with the run's secret (or its file) in env
  const std::vector<std::string>& command;
  const std::string& run_id;
  const std::string& rendezvous;
  const std::vector<LaunchHost>& hosts;  // ssh: required; mpi: may be empty; slurm: empty
  int generation = 0;
  OutputRelay& relay;
  const AgentPlace* agent = nullptr;  // local and ssh, under torchrun's elastic model
};

enum class Kind { kLocal, kSsh };

// A process of the world as the local and ssh launchers start it: servers first, then workers,
// each on its host (ssh: host r of the hostfile's lines, round robin) with the variables it gets
// on top of the launch's own --env.
struct PlannedProcess {
  std::string role;
  int rank = 0;
  const LaunchHost* remote = nullptr;  // ssh only
  std::string host = "localhost";
  std::vector<std::pair<std::string, std::string>> env;
};
std::vector<PlannedProcess> planProcesses(Kind kind, const RunContext& run);

// torchrun's variables, so that a script written for it runs under troupe launch as it is: each
// worker's RANK and WORLD_SIZE (servers are no ranks of torch.distributed), LOCAL_RANK and
// LOCAL_WORLD_SIZE among the workers of its host, GROUP_RANK and GROUP_WORLD_SIZE of the hosts,
// ROLE_* as torchrun's one role, MASTER_ADDR and MASTER_PORT (where rank 0 serves
// torch.distributed's store; --master_addr and --master_port win) and TORCHELASTIC_* (the run id,
// restarts so far and at most). A worker's place, as values or (the wrapped launchers', known only
// in the task) shell expressions; an empty one is left out.
struct TorchrunPlace {
  std::string rank, local_rank, local_size, group_rank, group_size, master_addr;
};
std::vector<std::pair<std::string, std::string>> torchrunVariables(const RunContext& run,
                                                                   const TorchrunPlace& place,
                                                                   int port);
// MASTER_PORT: --master_port, else a free port of 127.0.0.1 when rank 0 runs on this host, else
// torchrun's 29500. A free port: InputError when none can be had.
int masterPort(const RunContext& run, bool this_host);
int freeLoopbackPort();

// local and ssh: one child process per role and rank.
Attempt runChildren(Kind kind, const RunContext& run);

// `troupe launch --elastic MIN:MAX` of a command that is not troupe's own (a script written for
// torchrun): torchrun's elastic model, this launcher an agent of the run (launcher_elastic.cc).
// `secret` is the run's; `options` has it (or its file) in env.
int runElasticAgents(const LaunchOptions& options, const std::vector<std::string>& command,
                     const std::string& run_id, const std::string& secret,
                     const std::vector<LaunchHost>& hosts, OutputRelay& relay);

// mpi: one mpirun for the whole world (slurm: runSlurm, launcher_slurm.h).
Attempt runMpi(const RunContext& run);

}  // namespace troupe::apps::launch_detail
