// The distributed KVStore (troupe/kvstore.h: dist_sync, dist_async, ssp): a worker's store, whose
// client actor pushes to and pulls from the run's parameter servers (actors/roles.h: the Server
// actor of `troupe train`, in its KVStore mode), and a server process's loop. The process's place
// comes from TrainOptions (loadTrainOptions: flags, TROUPE_*, DMLC_*, the cluster's variables).
#pragma once

#include <memory>
#include <string>

#include "actors/trainer.h"
#include "troupe/kvstore.h"

namespace troupe::actors {

// Whether `type` is a distributed store's.
bool isDistributedKVStore(const std::string& type);

// A worker's store of a distributed `type`: joins the run (every worker and server must), then
// answers calls. InputError for a bad place (no servers, a server's role); the run's errors as
// Cluster's (TimeoutError naming who did not come).
std::unique_ptr<KVStore> makeDistKVStore(const std::string& type, const TrainOptions& options);

// A server process's loop: joins the run, serves its keys until every worker is done, leaves.
void serveKVStore(const std::string& type, const TrainOptions& options);

}  // namespace troupe::actors
