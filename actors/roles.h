// The four roles of a training run and its coordinator, as actor factories. Each config says whom
// the actor talks to; trainer.cc wires them for one process.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/peer.h"
#include "actors/system.h"
#include "actors/topology.h"
#include "data/dataset.h"
#include "kernels/compression.h"
#include "kernels/net.h"
#include "kernels/optimizer.h"
#include "kernels/tensor.h"

namespace troupe::actors {

struct TrainResult;
struct TrainOptions;
class TrainLog;
class Trace;

// Which records a step uses: the global batch of step s is positions [s' * G, s' * G + G) of
// epoch e's order (s' = s mod steps_per_epoch), and a replica takes the slice [offset, offset+n).
struct StepPlan {
  std::int64_t steps_per_epoch = 0;
  std::int64_t global_batch = 0;
  std::int64_t first_step = 0;  // > 0 when resuming
  std::int64_t last_step = 0;   // exclusive
};

// "step 12 (epoch 1)": a step as errors and reports name it (epochs count from 1; without
// steps_per_epoch, the step alone).
inline std::string describeStep(std::int64_t step, std::int64_t steps_per_epoch) {
  std::string s = "step " + std::to_string(step);
  if (steps_per_epoch > 0) s += " (epoch " + std::to_string(step / steps_per_epoch + 1) + ")";
  return s;
}

struct ReaderConfig {
  data::DatasetOptions dataset;
  std::uint64_t seed = 1;
  StepPlan plan;
  std::int64_t offset = 0;  // of this replica's share within the global batch
  std::int64_t count = 0;
  int prefetch = 4;
  // A bad record's slot goes to the next good record of the epoch's order (see TrainOptions);
  // each batch says how many of its records were skipped.
  bool skip_bad_records = false;
  Address replica;
};
std::unique_ptr<Actor> makeReader(std::string name, ReaderConfig config);

// A step whose loss is inf or NaN fails the run (NumericError naming the step, the replica and the
// worker): the run diverged.
struct ReplicaConfig {
  int index = 0;        // among all replicas of all processes
  int local_index = 0;  // among this process's
  int num_replicas = 1;
  int worker = 0;                    // this process's rank, for errors
  std::int64_t steps_per_epoch = 0;  // for errors: the epoch of a step
  kernels::NetOptions net;
  int threads = 1;
  float grad_scale = 1.0f;  // 1 / global batch
  std::int64_t bucket_bytes = 25 << 20;
  std::int64_t first_bucket_bytes = 1 << 20;
  data::DatasetOptions test;      // path empty: no evaluation
  bool skip_bad_records = false;  // bad test records are left out of the evaluation
  Address reader, reducer, coordinator;
  Trace* trace = nullptr;  // spans go here when tracing
};
std::unique_ptr<Actor> makeReplica(std::string name, ReplicaConfig config);

// Sums buckets over this process's replicas, then (world > 1) over all processes by ring
// allreduce with the reducers of the other processes (the workers of the run, rank = worker).
struct ReducerConfig {
  int num_replicas = 1;  // in this process
  int threads = 1;
  Address updater;
  int rank = 0;
  int world = 1;
  Address next;                          // the reducer of rank (rank + 1) % world
  std::int64_t segment_bytes = 4 << 20;  // ring messages carry segment_bytes / world
  kernels::CompressionSpec compression;  // of the ring's chunks (kernels/compression.h)
  // Hierarchical reduction (NCCL's across nodes): with several processes on each of several hosts,
  // a bucket is reduce-scattered among the processes of this host (through shared memory), each
  // process allreduces the slice it finished with the processes of the same local index on the
  // other hosts (compressed, if compression is set), and the slices are all-gathered in the host.
  // Filled in (actors/topology.h) once the processes met, before the actors start; null, or
  // empty host_ranks: one flat ring over every worker.
  std::shared_ptr<const ReductionPlan> reduction;
  Trace* trace = nullptr;  // spans go here when tracing
  // A bucket whose allreduce has waited this long logs a stall report (which step, which
  // bucket, which worker it waits for), and fails the run after peer_timeout (PeerError naming
  // the previous worker of the ring).
  std::chrono::milliseconds stall_warning{30000};
  std::chrono::milliseconds peer_timeout{60000};
  std::int64_t steps_per_epoch = 0;  // for reports: the epoch of a step
  RunMembersPtr members;             // for reports: the workers' addresses
};
std::unique_ptr<Actor> makeReducer(std::string name, ReducerConfig config);

// An update that leaves an inf or NaN in the weights fails the run (NumericError naming the step
// and the worker): the run diverged, and nothing of it is sent on or saved.
struct UpdaterConfig {
  int worker = 0;                    // this process's rank, for errors
  kernels::Tensor initial_weights;   // host
  kernels::Tensor initial_momentum;  // host; undefined: zeros
  kernels::Tensor initial_buffers;   // host; undefined: replicas keep their own
  kernels::SgdOptions sgd;
  kernels::LrPolicy lr;
  StepPlan plan;
  int threads = 1;
  std::vector<Address> replicas;
  Address coordinator;
  Trace* trace = nullptr;  // spans go here when tracing
};
std::unique_ptr<Actor> makeUpdater(std::string name, UpdaterConfig config);

// A parameter server: owns keys [key_begin, key_end) of the flat parameters and their momentum.
//   dist_sync:  sums the pushes of every worker for step t (in worker order) and updates once;
//               answers a pull for step t+1 after that.
//   dist_async: updates on every push as it arrives, at 1/W of the learning rate (staleness-aware
//               asynchronous SGD: with W workers a push lands on weights ~W-1 pushes newer than
//               the ones it was computed from); answers pulls at once.
//   ssp:        as dist_async (same learning-rate scaling), but answers a pull for step t only
//               once every worker has pushed
//               step t - staleness - 1 (no worker runs more than `staleness` steps ahead).
// Epoch-end pulls wait for every worker and carry the momentum too. An update that leaves an inf
// or NaN in the shard fails the run (NumericError naming the step).
struct ServerConfig {
  int index = 0;
  int num_workers = 1;
  std::string mode = "dist_sync";
  kernels::CompressionSpec compression;  // of the workers' pushes (kernels/compression.h)
  int staleness = 0;
  std::int64_t key_begin = 0;
  std::int64_t key_end = 0;
  kernels::Tensor initial_weights;   // host, this shard's keys
  kernels::Tensor initial_momentum;  // host, this shard's keys; undefined: zeros
  kernels::SgdOptions sgd;
  kernels::LrPolicy lr;
  std::int64_t first_step = 0;  // > 0 when resuming
  int threads = 1;
  Trace* trace = nullptr;  // spans go here when tracing
  // A pull that has waited this long logs a stall report (which step, which workers have not
  // pushed it), and fails the run after peer_timeout (PeerError naming the first of them).
  std::chrono::milliseconds stall_warning{30000};
  std::chrono::milliseconds peer_timeout{60000};
  std::int64_t steps_per_epoch = 0;  // for reports: the epoch of a step
  RunMembersPtr members;             // for reports: the workers' addresses
};
std::unique_ptr<Actor> makeServer(std::string name, ServerConfig config);

// A worker's side of the parameter servers, in the updater's place: pushes reduced buckets to the
// servers that own their keys, pulls the next weights, hands them to the replicas. A pull that
// some server has not answered for stall_warning logs a stall report naming the server and the
// step; later it fails the run (PeerError naming the server).
struct PsClientConfig {
  kernels::CompressionSpec compression;  // of this worker's pushes (kernels/compression.h)
  std::uint32_t worker = 0;
  kernels::Tensor initial_weights;  // host, all keys
  std::vector<Address> servers;
  std::vector<std::pair<std::int64_t, std::int64_t>> shards;  // keys of each server
  StepPlan plan;
  std::vector<Address> replicas;
  Address coordinator;
  Trace* trace = nullptr;  // spans go here when tracing
  // The pull fails after peer_timeout and a grace (peerTimeoutGrace): a server that holds it for
  // a late worker names that worker first.
  std::chrono::milliseconds stall_warning{30000};
  std::chrono::milliseconds peer_timeout{60000};
  RunMembersPtr members;  // for reports: the servers' addresses
};
std::unique_ptr<Actor> makePsClient(std::string name, PsClientConfig config);

// Keys [0, num_params) cut into `servers` contiguous shards of (nearly) equal size.
std::vector<std::pair<std::int64_t, std::int64_t>> shardKeys(std::int64_t num_params, int servers);

struct CoordinatorConfig {
  const TrainOptions* options = nullptr;
  StepPlan plan;
  kernels::LrPolicy lr;
  int num_replicas = 1;  // in all processes
  int num_updaters = 1;  // one per process
  bool has_test = false;
  bool has_buffers = false;
  std::string experiment_id;
  TrainLog* log = nullptr;
  std::string checkpoint_dir;
  // Counters carried over from a resumed checkpoint.
  double cumulative_time = 0;
  std::int64_t cumulative_inputs = 0;
  std::int64_t num_params = 0;
  std::chrono::milliseconds step_timeout{300000};
  std::vector<Address> replicas;   // of every process
  std::vector<Address> updaters;   // of every process
  std::vector<Address> followers;  // the coordinators of the other processes
  TrainResult* result = nullptr;   // filled as epochs end; read after the system stopped
};
// The chief coordinator, on rank 0, drives the whole run.
std::unique_ptr<Actor> makeCoordinator(std::string name, CoordinatorConfig config);
// The coordinator of every other process: waits for the chief's Shutdown.
std::unique_ptr<Actor> makeFollower(std::string name);

}  // namespace troupe::actors
