// Which workers of a run share a host, and the reduction that follows from it.
//
// A host is a kernel boot, network namespace and pid namespace (the processes that can meet
// through abstract Unix sockets and each other's /proc: shared memory). Each worker publishes its
// host's key at rendezvous; every worker reads them all, so all arrive at the same topology.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/named.h"
#include "rendezvous/store.h"

namespace troupe::actors {

// This process's host key ("BOOT_ID net:[N] pid:[N]").
std::string hostKey();
// This host's name (gethostname), as logs and the launcher name it.
std::string hostName();

// Hosts in order of their lowest rank; each host's workers in rank order.
std::vector<std::vector<int>> groupHosts(const std::vector<std::string>& keys);

// How bsp-allreduce sums across processes (the allreduce key): one flat ring, a ring inside each
// host and one across them (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE), or auto.
enum class Allreduce : std::uint8_t { kAuto, kRing, kHierarchical };
inline constexpr kernels::Named<Allreduce> kAllreduces[] = {
    {"auto", Allreduce::kAuto},
    {"ring", Allreduce::kRing},
    {"hierarchical", Allreduce::kHierarchical}};
inline const char* allreduceName(Allreduce mode) {
  return kernels::nameIn(kAllreduces, mode);
}

// What the reducer of `rank` runs (ReducerConfig::host_ranks, across_ranks; both empty: the
// flat ring) for `mode`: ring (flat), hierarchical (InputError, naming the hosts and their
// worker counts, when the hosts hold different numbers of workers or nothing would be gained:
// one host, or one worker a host), auto (hierarchical where it applies, else flat).
struct ReductionPlan {
  std::vector<int> host_ranks;
  std::vector<int> across_ranks;
  std::string description;  // "hierarchical: 2 hosts x 2 workers" or "flat ring of 4 workers"
};
ReductionPlan planReduction(Allreduce mode, const std::vector<std::vector<int>>& hosts, int rank);

// Publishes this worker's host key under the run's store and reads every worker's (waiting up to
// `timeout`, TimeoutError naming who did not publish).
std::vector<std::string> exchangeHostKeys(rendezvous::Store& store, int rank, int workers,
                                          std::chrono::milliseconds timeout);

}  // namespace troupe::actors
