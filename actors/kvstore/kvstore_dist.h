// The distributed KVStore (troupe/kvstore.h: dist_sync, dist_async, ssp): a worker's store, whose
// client actor pushes to and pulls from the run's parameter servers (actors/roles/roles.h: the
// Server actor of `troupe train`, in its KVStore mode), and a server process's loop. The process's
// place comes from TrainOptions (loadTrainOptions: flags, TROUPE_*, DMLC_*, the cluster's
// variables).
#pragma once

#include <memory>
#include <string>

#include "actors/core/cluster.h"
#include "actors/core/peer.h"
#include "actors/run/run_plan.h"
#include "actors/run/trainer.h"
#include "troupe/kvstore.h"

namespace troupe::actors {

// A store's process in the run: its actor system, joined to the others.
struct Node {
  NodeSystem node;
  std::shared_ptr<RunMembers> members;
  std::unique_ptr<Cluster> cluster;
  Runtime& system() { return *node.system; }
};

// Spawns `actor` as actor 0 of node `rank`, joins the run's other processes (workers and
// servers), names them in `members`, and checks that they all make a store of `type` (worker 0's
// is the run's: InputError naming both otherwise). `lost` says what a lost link does.
enum class LostLinks {
  kFail,         // fails the node (a ring store's members need one another)
  kServersOnly,  // a dist store's worker: a server's fails it; another worker's is the servers'
                 // to judge (it may have left, done with the store)
  kActorJudges,  // goes to the actor as LinkLost (a server: it knows who is done)
};
Node joinStore(const std::string& type, const TrainOptions& o, int rank,
               std::unique_ptr<Actor> actor, SpawnOptions spawn,
               std::shared_ptr<RunMembers> members, LostLinks lost = LostLinks::kFail);

// Whether `type` is a distributed store's.
bool isDistributedKVStore(const std::string& type);

// A worker's refusal of key `key` when worker 0's outcome of its init (`got`, read from the
// store: "ok N at BASE") differs from this worker's (`placed`, of n values); the store's bytes
// are parsed and shown escaped, whatever they are.
std::string initMismatch(int key, const std::string& got, std::int64_t n,
                         const std::string& placed);

// A worker's store of a distributed `type`: joins the run (every worker and server must), then
// answers calls. InputError for a bad place (no servers, a server's role); the run's errors as
// Cluster's (TimeoutError naming who did not come).
std::unique_ptr<KVStore> makeDistKVStore(const std::string& type, const TrainOptions& options);

// A server process's loop: joins the run, serves its keys until every worker is done, leaves.
void serveKVStore(const std::string& type, const TrainOptions& options);

// A worker's store of type "ring" (actors/kvstore/kvstore_ring.cc): no servers; each push is summed
// over every worker by ring allreduce, and each worker applies the same update to its own copy.
std::unique_ptr<KVStore> makeRingKVStore(const TrainOptions& options);

}  // namespace troupe::actors
