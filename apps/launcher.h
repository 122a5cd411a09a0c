// Starting and watching the processes of a run, as MXNet's tools/launch.py does.
//
// Each process gets its role and rank in its environment (TROUPE_ROLE=worker|server, TROUPE_RANK,
// TROUPE_NUM_WORKERS, TROUPE_NUM_SERVERS, TROUPE_RUN_ID, TROUPE_RENDEZVOUS). Every line a process
// prints is relayed with its role and rank in front ("[worker 1] ..."). When any process exits
// non-zero or dies of a signal, the launcher stops the others (SIGTERM, then SIGKILL after a grace
// period), names the one that failed (host, role, rank, exit code or signal), and returns non-zero.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace troupe::apps {

struct LaunchOptions {
  int num_workers = 1;
  int num_servers = 0;
  std::string launcher = "local";  // local (ssh and mpi: not yet)
  std::string hostfile;
  std::string sync_dst_dir;
  std::vector<std::pair<std::string, std::string>> env;  // --env K=V
  std::vector<std::string> command;                      // what each process runs
  std::string rendezvous;  // given: use it; empty: serve an embedded store
  std::string run_id;      // empty: made up
  std::chrono::milliseconds grace{5000};
};

// Runs the processes to the end. Returns 0 when all exited 0, else the failing process's exit
// code (128 + signal for a signal), after stopping the rest.
int launch(const LaunchOptions& options);

}  // namespace troupe::apps
