// A process's place in its run, taken from the engine that started it when no `troupe launch` did
// (see apps/launcher.h for what the launcher sets), so that `srun troupe train ...`, an Indexed Job
// of Kubernetes and `mpirun troupe train ...` need no troupe wrapper.
//
// Precedence, key by key: a flag (--shard_id ...) > troupe's own TROUPE_* variable > the engine's
// variables > the config file > the default. A process with TROUPE_RANK or TROUPE_ROLE in its
// environment was placed by troupe (`troupe launch`, any launcher), one with DMLC_ROLE by MXNet's
// tools/launch.py (train_config.h reads its DMLC_* variables): the engine's variables are not read
// at all. Otherwise the first engine found, in this order:
//  - mpi: OMPI_COMM_WORLD_RANK is set (Open MPI's mpirun; checked first because mpirun under
//    Slurm starts its daemons with srun, whose SLURM_PROCID is a node's, not the rank's). The
//    rank is OMPI_COMM_WORLD_RANK, the world OMPI_COMM_WORLD_SIZE. The rendezvous and run id
//    must be given (--rendezvous, --run_id).
//  - slurm: SLURM_STEP_ID and SLURM_PROCID are set (a task of an srun job step; a batch script's
//    own shell has SLURM_PROCID=0 and the allocation's SLURM_NTASKS but no SLURM_STEP_ID, and a
//    `troupe train` there runs alone). The rank is SLURM_PROCID, the world SLURM_NTASKS. When
//    none is given (flag, TROUPE_*, config file), the run id is "slurm-JOB.STEP" (SLURM_JOB_ID,
//    SLURM_STEP_ID) and the rendezvous tcp://NODE:PORT, NODE the first node of
//    SLURM_STEP_NODELIST (else SLURM_NODELIST, else SLURM_JOB_NODELIST; Slurm's compressed form
//    `node[01-04,07]` is expanded), where task 0 runs with Slurm's default distribution, and PORT
//    slurmRendezvousPort(job, step); rank 0 then serves the embedded store there, as a process
//    started by hand does (TrainOptions::serve_store).
//  - kubernetes: JOB_COMPLETION_INDEX is set (a pod of an Indexed Job). The rank is the index;
//    the world is num_shards + num_servers, which the manifest sets (TROUPE_NUM_WORKERS,
//    TROUPE_NUM_SERVERS, as deploy/kubernetes/ does), and so are the rendezvous and the run id.
// The engine's rank R becomes role and shard_id as the launchers map ranks: R < num_servers is
// server R, else worker R - num_servers; both are left alone when a flag or TROUPE_* variable
// gives either. The engine's world sets num_shards (world - num_servers); when num_shards is also
// given (--num_shards, TROUPE_NUM_WORKERS) and the two disagree, that is an InputError naming both
// numbers. So is a bad value (not a whole number, a rank not below the world, a nodelist that does
// not parse), naming the variable.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/run/trainer.h"

namespace troupe::actors {

// An environment variable's value; nullopt when it is unset or empty.
using EnvLookup = std::function<std::optional<std::string>(const char* name)>;

// The process's own environment (getenv).
EnvLookup processEnvironment();

// What gave a config key its value other than the engine: "--num_shards 4", "TROUPE_NUM_WORKERS=4";
// nullopt when only the config file or the default did.
using GivenBy = std::function<std::optional<std::string>(std::string_view key)>;

// Fills in `o` from the engine that started this process, as the header says, and returns the
// engine's name ("mpi", "slurm", "kubernetes"), or "" when there is none (or troupe placed the
// process). `o` holds the file's, TROUPE_* variables' and flags' values already. InputError as
// the header says. Any thread; reads nothing but `env`.
std::string applyClusterEnvironment(TrainOptions& o, const GivenBy& given_by, const EnvLookup& env);

// The default rendezvous port of a Slurm job step: 29500 + (16 * job + step) mod 2000, below
// Linux's ephemeral ports, the same for every task of the step and seldom the same for two steps
// that share a first node.
std::uint16_t slurmRendezvousPort(std::uint64_t job, std::uint64_t step);

// Expands a Slurm hostlist ("vm", "node[01-04,07],gpu3", "rack[1-2]-n[1-2]"), in its order, zero
// padding kept. InputError naming `what` (e.g. "SLURM_NODELIST=...") when it does not parse, is
// empty or names more than a million hosts.
std::vector<std::string> expandSlurmHostlist(std::string_view list, std::string_view what);

}  // namespace troupe::actors
