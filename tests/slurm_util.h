// A real one-node Slurm for the tests: tests/slurm/start.sh (slurmctld, slurmd and munged of its
// own, on free ports, all under a temporary folder), stopped by tests/slurm/stop.sh.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>

#include "cli_util.h"

namespace troupe::testing {

// Starts in the constructor, stops (every job, the daemons, the folder) in the destructor. The
// constructor throws std::runtime_error with start.sh's report when Slurm is missing or does not
// come up within 60 s; tests must let that fail them, never skip. A test process killed with
// SIGKILL leaves the daemons behind (they run in sessions of their own); `tests/slurm/stop.sh
// /tmp/troupe_slurm_*` ends them.
class SlurmCluster {
 public:
  SlurmCluster() : dir_(makeDir()) {
    const auto r = runCommand("timeout -k 5 60 bash " + sourceDir() + "/tests/slurm/start.sh " +
                              dir_.string());
    if (r.exit_code != 0) {
      stop();
      throw std::runtime_error(
          (r.exit_code == 124 ? std::string("tests/slurm/start.sh did not finish within 60 s\n")
                              : std::string("tests/slurm/start.sh failed (exit ") +
                                    std::to_string(r.exit_code) + ")\n") +
          r.output);
    }
  }
  ~SlurmCluster() { stop(); }
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // "SLURM_CONF=... " to put before a command that talks to this cluster (srun, salloc, sbatch).
  std::string env() const { return "SLURM_CONF=" + (dir_ / "etc" / "slurm.conf").string() + " "; }

 private:
  static std::filesystem::path makeDir() {
    static int counter = 0;
    return std::filesystem::temp_directory_path() /
           ("troupe_slurm_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  }
  void stop() {
    runCommand("timeout -k 5 60 bash " + sourceDir() + "/tests/slurm/stop.sh " + dir_.string());
  }

  std::filesystem::path dir_;
};

// One cluster shared by every test of the binary, started on first use, stopped at exit.
inline SlurmCluster& sharedSlurmCluster() {
  static SlurmCluster cluster;
  return cluster;
}

}  // namespace troupe::testing
