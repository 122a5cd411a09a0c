// The slurm launcher (apps/launcher*.cc only; see launcher.h for what it does): one srun for the
// whole world, its labelled output relayed with role and rank, the failing rank named from the
// wrappers' markers or srun's own report.
#pragma once

#include <string>

#include "apps/launcher.h"
#include "apps/launcher_failure.h"

namespace troupe::apps::launch_detail {

struct RunContext;

// InputError when srun is not on PATH, or when the launcher runs inside a Slurm allocation
// (SLURM_JOB_ID is set) that has fewer tasks (SLURM_NTASKS) than the run's processes, naming both
// numbers: srun would refuse the step ("More processors requested than permitted") or wait for it
// forever. The size is not checked outside an allocation (srun asks for one of the right size) or
// when the allocation does not say (no SLURM_NTASKS: sbatch -N without -n). InputError naming the
// variable for a bad value. Main thread, before anything starts.
void checkSlurmLaunch(const LaunchOptions& o);

// Where the embedded store listens so that every node of the allocation reaches it: the address of
// --interface / $TROUPE_INTERFACE if given; else loopback when every node of SLURM_JOB_NODELIST
// is this host; else the address this host's route to the first other node leaves from; outside
// an allocation (the nodes are not known yet), the address this host's name resolves to, loopback
// if it resolves to none. IoError when there is no route; InputError for a bad nodelist.
std::string slurmStoreBindAddress(const LaunchOptions& o);

// One start of the world under srun; see launcher_run.h.
Attempt runSlurm(const RunContext& run);

}  // namespace troupe::apps::launch_detail
