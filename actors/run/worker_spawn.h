// What a worker process spawns: its plan (ProcessPlan, decided before anything runs), whom its
// actors send to (WorkerAddresses), each role's config from the one RoleContext and the plan
// (WorkerSpawn), and the list of its actors (RoleSpawn) that its schedule runs (workerRolesOf)
// and spawnWorker spawns in a loop.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/core/system.h"
#include "actors/roles/roles.h"
#include "actors/run/run_layout.h"
#include "actors/run/run_plan.h"
#include "actors/run/trainer.h"
#include "actors/schedules/schedule.h"

namespace troupe::actors {

class TrainLog;
struct GenerationRole;

// What one process of the run does, decided before anything runs: the options checked, its place
// in the world, the batch split, the data, the step plan and learning rates, the net, and the
// state it starts from (from scratch, a checkpoint, or an elastic generation's).
struct ProcessPlan {
  bool server = false, ps = false, chief = false;
  int workers = 0, nodes = 0, rank = 0, threads = 1;
  // The data-parallel world the batch is split over: the workers, or with pipeline stages in
  // processes of their own (pipeline_across processes), the pipelines (stage workers in a row).
  int data_workers = 1, data_rank = 0;
  ProcessDevices devices;
  std::vector<std::int64_t> shares;  // of the batch, per replica
  data::DatasetOptions train, test;
  StepPlan plan;
  kernels::LrPolicy lr;
  kernels::OptimizerSettings optimizer;  // TrainOptions::optimizer, with the net's ranges
  kernels::NetOptions net;
  std::int64_t num_params = 0;
  // Pipeline stages in processes of their own: each stage's range of the flat parameters
  // (kernels::pipelineParamRanges); else empty.
  std::vector<std::pair<std::int64_t, std::int64_t>> stage_ranges;
  // ... and of the flat buffers (batch-norm statistics), with has_buffers; and the ranges of the
  // weights each stage's worker holds, its own and the tied ones it reads
  // (kernels::pipelineStageWindows).
  std::vector<std::pair<std::int64_t, std::int64_t>> stage_buffer_ranges;
  std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> stage_windows;
  std::int64_t memory_estimate = 0;  // with max_memory: the bytes this process's plan needs
  bool has_buffers = false;
  // Model FLOPs utilisation (the coordinator's lines): the net's training FLOPs a sample
  // (Net::trainingFlopsPerSample) and, in a run of one CPU process, its sgemm's peak
  // (kernels::cpuSgemmPeak; 0: no MFU is shown).
  double model_flops_per_sample = 0, peak_flops = 0;
  kernels::Tensor weights, state, buffers;  // to start from; state, buffers may be empty
  std::string checkpoint_dir, resumed_from;
  double cumulative_time = 0;  // carried over from a resumed checkpoint
  std::int64_t cumulative_inputs = 0;
  float loss_scale = 0;             // a resumed checkpoint's dynamic loss scale; 0: none there
  std::int64_t overflow_steps = 0;  // the steps it skipped for inf or NaN gradients
  bool nothing_left = false;        // the newest checkpoint holds the run's last step already
  // The compute threads, once the run's processes met (joinRun), where no flag or launcher gave
  // them: the replicas' and the updater's teams read it when they start.
  std::shared_ptr<ThreadBudget> budget = std::make_shared<ThreadBudget>();
};

// Whom a worker's actors send to, by the run's layout (actors/run/run_layout.h): every process
// spawns the same actors in the same order.
struct WorkerAddresses {
  Address chief, updater, reducer;
  std::vector<Address> local_replicas, all_replicas, all_updaters, servers;
  std::vector<Address> followers;  // the chief's Shutdown ends them: other coordinators, servers
};

WorkerAddresses addressesOf(const RunLayout& layout, int rank, int workers, int nodes,
                            int replicas);

// Pipeline stages in processes of their own (ProcessPlan::stage_ranges): stage s of pipeline q
// is worker q K + s, and each worker's part of its stage's parameters is part q of them, cut as
// parameter servers' keys are (at layer bounds for a layerwise optimizer); by worker.
std::vector<std::pair<std::int64_t, std::int64_t>> stagePartsOf(const ProcessPlan& p);
// What one worker process spawns, with what it shares between its actors' configs.
// ZeRO (zero_stage 1, several workers): each worker's shard of the optimizer's state, cut as
// parameter servers' (at layer bounds for a layerwise optimizer), or with pipeline stages in
// processes of their own, its part of its stage's (with several pipelines); else empty.
std::vector<std::pair<std::int64_t, std::int64_t>> shardsOf(const TrainOptions& o,
                                                            const ProcessPlan& p);
// ZeRO stage 2 (zero_stage 2, several workers): the record of the replica's gradient slots that
// its reducer shares; else null.
std::shared_ptr<GradSlots> gradSlotsOf(const TrainOptions& o, const ProcessPlan& p);
// The columns of the optimizer's state rows that this process holds: a parameter server's keys,
// a ZeRO worker's shard, a pipeline stage's worker's stage's (or its part of them, with ZeRO),
// none (0, 0) for a worker of parameter servers; nullopt: all of them.
std::optional<std::pair<std::int64_t, std::int64_t>> stateColumnsOf(const TrainOptions& o,
                                                                    const ProcessPlan& p);

struct WorkerSpawn {
  const TrainOptions& o;
  const ProcessPlan& p;
  const RunLayout& layout;
  const WorkerAddresses& a;
  GenerationRole* role;
  RoleContext run;                  // every role's
  std::shared_ptr<NcclGroup> nccl;  // reducer nccl: formed once the processes met, before run()
  std::shared_ptr<ReductionPlan> reduction;  // filled in by joinRun, before run()
  // pipeline_across processes: this worker's stage's link to its pipeline's other stages.
  std::shared_ptr<kernels::StageLink> stage_link;
  RunControl* control = nullptr;  // the chief's, from the caller
  TrainLog* log = nullptr;        // the chief's
  TrainResult* result = nullptr;
  // zero_stage 2: the slots of the replica's gradients that hold a bucket the reducer has not
  // taken (gradSlotsOf).
  std::shared_ptr<GradSlots> grad_slots;

  CoordinatorConfig coordinator() const;
  UpdaterConfig updater() const;
  // The parameter servers update; this worker's PS client stands where the updater would.
  PsClientConfig psClient() const;
  ReducerConfig reducer() const;
  void stageRings(ReducerConfig& r) const;
  // ZeRO (zero_stage 1, several workers): each worker's shard of the optimizer's state; else
  // empty.
  std::vector<std::pair<std::int64_t, std::int64_t>> zeroShards() const { return shardsOf(o, p); }
  ReplicaConfig replica(int r) const;
  // Reader r of this process: one on the training database feeding `targets` (one replica's
  // share of the batch, or every replica's: shared_reader), else the caller's (troupe/reader.h).
  std::unique_ptr<Actor> reader(int r, const std::vector<ReaderTarget>& targets) const;
  int gpuOf(int r) const;  // replica r's GPU, or -1
  // Compute actors get threads of their own, so their OpenMP teams stay put; the updater shares
  // replica 0's (they never compute at once), so a process has one team per replica.
  static SpawnOptions computeThread(int replica);
  SpawnOptions readerThread(int r) const;
  // The mailbox of the reducer and of the updater: room for every message a step sends between
  // them, beside the system's usual room. The reducer sends the updater each piece of the step's
  // sums (a ring segment of a bucket) and, with ZeRO, each piece of its weights gathered; the
  // updater sends the reducer each piece to gather. With both mailboxes full each would wait for
  // the other for ever (a bucket of 165 segments did, the usual room being 64).
  std::size_t stepMailbox() const;
};

// One actor of a worker process: its role (for messages), where the layout places it, the thread
// it runs on, and how it is made (called once, while `spawn` lives).
struct RoleSpawn {
  std::string role;
  Address at;
  SpawnOptions thread;
  std::function<std::unique_ptr<Actor>()> make;
};

// A training worker's actors in the layout's order (actors/run/run_layout.h): the coordinator
// (a follower but on the chief), `weights` in the updater's slot, the reducer, the replicas and
// their readers.
std::vector<RoleSpawn> trainingRoles(const WorkerSpawn& spawn, RoleSpawn weights);
// Those of a worker that updates its weights itself (an updater in the slot: local, device,
// bsp-allreduce), and of one whose parameter servers update them (a PS client there: dist_sync,
// dist_async, ssp).
std::vector<RoleSpawn> updatingWorkerRoles(const WorkerSpawn& spawn);
std::vector<RoleSpawn> pushingWorkerRoles(const WorkerSpawn& spawn);
// The actors a worker of `schedule` runs, by its family (actors/schedules/schedule.h): with
// parameter servers, a PS client in the updater's slot. A family that spawns other actors (a
// pipeline's stages) adds its overload here.
std::vector<RoleSpawn> workerRolesOf(const Schedule& schedule, const WorkerSpawn& spawn);
std::vector<RoleSpawn> workerRolesOf(const OneProcess& family, const WorkerSpawn& spawn);
std::vector<RoleSpawn> workerRolesOf(const AllreduceWorkers& family, const WorkerSpawn& spawn);
std::vector<RoleSpawn> workerRolesOf(const ParameterServers& family, const WorkerSpawn& spawn);

}  // namespace troupe::actors
