// The four roles of a training run and its coordinator, as actor factories. Each config says whom
// the actor talks to; trainer.cc wires them for one process.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/core/hosts.h"
#include "actors/core/peer.h"
#include "actors/core/system.h"
#include "actors/schedules/schedule.h"
#include "data/dataset.h"
#include "kernels/communicator.h"
#include "kernels/compression.h"
#include "kernels/net.h"
#include "kernels/optimizer.h"
#include "kernels/tensor.h"

namespace troupe::actors {

struct TrainResult;
struct TrainOptions;
struct RunControl;
class GradSlots;
class TrainLog;
class Trace;

// Which records a step uses. Epoch e trains positions [0, epoch_size) of its order (a shuffle
// of the training set, data::epochOrder), global_batch of them a step; a replica takes the slice
// [offset, offset + n) of its step's batch. Usually the run starts at an epoch's start or at a
// whole step of it. An elastic run (actors/run/elastic.h) may start a generation with another
// global batch part way through an epoch: first_epoch_records of first_epoch's order are trained
// already, and the rest of that epoch is cut into steps of this generation's global batch (a tail
// shorter than one is left out, as every epoch's is).
struct StepPlan {
  std::int64_t steps_per_epoch = 0;  // of a whole epoch
  std::int64_t global_batch = 0;
  std::int64_t epoch_size = 0;  // records an epoch trains; 0: steps_per_epoch * global_batch
  std::int64_t first_step = 0;  // > 0 when resuming
  std::int64_t last_step = 0;   // exclusive
  std::int64_t first_epoch = 0;
  std::int64_t first_epoch_records = 0;
  std::int64_t first_epoch_steps = 0;  // steps of first_epoch from first_step on
  // What an epoch's end needs of the updaters' state: an evaluation every epoch (test data), a
  // checkpoint every checkpoint_every epochs (0: at the run's end only).
  bool evaluates = false;
  std::int64_t checkpoint_every = 0;

  // Starts at `step`, a whole number of steps into its epoch (a run from scratch or a resumed
  // one), and ends after `num_epochs` epochs.
  void start(std::int64_t step, std::int64_t num_epochs) {
    startAt(step, step / steps_per_epoch, (step % steps_per_epoch) * global_batch, num_epochs);
  }
  // Starts at `step` with `records` of epoch `epoch`'s order trained already.
  void startAt(std::int64_t step, std::int64_t epoch, std::int64_t records,
               std::int64_t num_epochs) {
    const std::int64_t size = epoch_size > 0 ? epoch_size : steps_per_epoch * global_batch;
    first_step = step;
    first_epoch = epoch;
    first_epoch_records = records;
    first_epoch_steps = std::max<std::int64_t>(0, (size - records) / global_batch);
    last_step = step + first_epoch_steps + (num_epochs - epoch - 1) * steps_per_epoch;
  }

  std::int64_t epochOf(std::int64_t step) const {
    const std::int64_t past = step - first_step - first_epoch_steps;
    return past < 0 ? first_epoch : first_epoch + 1 + past / steps_per_epoch;
  }
  // The position in its epoch's order of the step's first record.
  std::int64_t recordOf(std::int64_t step) const {
    const std::int64_t past = step - first_step - first_epoch_steps;
    return past < 0 ? first_epoch_records + (step - first_step) * global_batch
                    : (past % steps_per_epoch) * global_batch;
  }
  // Whether an epoch is over once `done` steps are.
  bool epochEndsAt(std::int64_t done) const {
    const std::int64_t past = done - first_step - first_epoch_steps;
    return past >= 0 && past % steps_per_epoch == 0;
  }
  // Whether the updaters pause at the epoch's end once `done` steps are, sending their weights
  // and state to the coordinator (an evaluation, a checkpoint, the run's end), or go on: an epoch
  // end without these costs the device no idle time.
  bool pausesAt(std::int64_t done) const {
    const std::int64_t epoch = epochOf(done - 1) + 1;  // epochs completed
    return done >= last_step || evaluates ||
           (checkpoint_every > 0 && epoch % checkpoint_every == 0);
  }
  // The step as a 1-based count in its epoch, in steps of this plan's global batch.
  std::int64_t indexInEpoch(std::int64_t step) const { return recordOf(step) / global_batch + 1; }
  // The step the learning-rate schedule sees: whole epochs of steps_per_epoch, plus the step's
  // place in its epoch. `step` itself unless a generation started part way through an epoch.
  std::int64_t scheduleStep(std::int64_t step) const {
    return epochOf(step) * steps_per_epoch + recordOf(step) / global_batch;
  }
};

// "step 12 (epoch 1)": a step as errors and reports name it (epochs count from 1; without
// steps_per_epoch, the step alone).
inline std::string describeStep(std::int64_t step, std::int64_t steps_per_epoch) {
  std::string s = "step " + std::to_string(step);
  if (steps_per_epoch > 0) s += " (epoch " + std::to_string(step / steps_per_epoch + 1) + ")";
  return s;
}

// Where a process of an elastic run stands between generations (actors/run/elastic.h): the state
// after `step` steps, with `epoch_records` of epoch `epoch`'s order trained. step -1: none.
struct TrainState {
  std::int64_t step = -1;
  std::int64_t epoch = 0;
  std::int64_t epoch_records = 0;
  kernels::Tensor weights, state, buffers;  // host; state: the optimizer's
  float loss_scale = 0;                     // the dynamic loss scale then; 0: none
  std::int64_t overflow_steps = 0;          // steps it skipped for inf or NaN gradients
};

// What every role of a run reads alike, set once for a process's roles (trainer.cc's WorkerSpawn,
// a KVStore's): where its trace goes, how long it waits on a peer before it reports the peer and
// before it fails the run, how long an epoch is (a report names a step's epoch), and the run's
// members (a report names a peer by its host and process).
struct RoleContext {
  Trace* trace = nullptr;  // spans go here when tracing
  // A wait on a peer (a bucket's allreduce, a pull, the pushes of a step) this long logs a stall
  // report naming whom it waits for; one of peer_timeout fails the run (PeerError naming the
  // peer).
  std::chrono::milliseconds stall_warning{30000};
  std::chrono::milliseconds peer_timeout{60000};
  std::int64_t steps_per_epoch = 0;  // 0: a step is named alone
  RunMembersPtr members;             // null: peers are named by their rank alone
};

// One replica a reader feeds: its share of each step's global batch.
struct ReaderTarget {
  Address replica;
  int local_index = 0;      // among its process's replicas (BatchConsumed::replica)
  std::int64_t offset = 0;  // of its share within the global batch
  std::int64_t count = 0;
};

// A reader feeds one replica, or (TrainOptions::shared_reader) all the replicas of its process:
// batches go out step by step, a replica's share after another's, `prefetch` in flight to each.
struct ReaderConfig {
  data::DatasetOptions dataset;
  std::uint64_t seed = 1;
  StepPlan plan;
  std::vector<ReaderTarget> targets;
  int prefetch = 4;
  // A bad record's slot goes to the next good record of the epoch's order (see TrainOptions);
  // each batch says how many of its records were skipped.
  bool skip_bad_records = false;
  // No database: each target gets one batch of random images and labels (from the seed), made at
  // the start and sent again every step (TrainOptions::synthetic). The replicas only read it.
  bool synthetic = false;
  // The targets compute on GPUs: batches go out in pinned host memory (kernels::pinnedHostBuffer),
  // which their copies to the device read asynchronously; `prefetch` buffers per target, each
  // written again once the BatchConsumed of its last batch came and its event is done.
  bool pinned = false;
  int device = -1;  // with pinned: the GPU of its (first) target, which its thread makes current
  RoleContext run;  // its trace: a span per batch read
};
std::unique_ptr<Actor> makeReader(std::string name, ReaderConfig config);

// A process's compute threads when they are settled only once the run's processes met: those
// that share a machine's cores share them out (run_plan.h: shareCores). 0 until then; the roles
// read it in started(), which runs after the meeting. Thread-safe.
struct ThreadBudget {
  std::atomic<int> threads{0};
  // `fallback` while unsettled; else the process's threads split `ways` (a replica's team of
  // its process's K replicas), at least 1.
  int teamOf(int fallback, int ways) const {
    const int t = threads.load();
    return t > 0 ? std::max(1, t / std::max(1, ways)) : fallback;
  }
};

// ZeRO stage 2: how many slots a replica's gradient buckets take turns in (two: the backward
// writes one while the ring reduce-scatters the other).
inline constexpr int kGradSlots = 2;

// A step whose loss is inf or NaN fails the run (NumericError naming the step, the replica and the
// worker): the run diverged.
struct ReplicaConfig {
  int index = 0;        // among all replicas of all processes
  int local_index = 0;  // among this process's
  int num_replicas = 1;
  // Its part of the test set: part test_part of test_parts, cut evenly (index and num_replicas;
  // with pipeline stages in workers of their own, its pipeline's, which its stages evaluate
  // together).
  int test_part = 0, test_parts = 1;
  int worker = 0;  // this process's rank, for errors
  kernels::NetOptions net;
  kernels::Device device;            // where its net lives and computes (the run's plan says)
  bool tf32 = false;                 // on a GPU (kernels::CudaOptions::tf32)
  bool cudnn_deterministic = false;  // on a GPU (kernels::CudaOptions::deterministic)
  // Where the receiver of its buckets computes: a bucket is copied to the host first when that is
  // the CPU and the replica is on a device (MXNet's `local`: gradients are summed on the CPU).
  kernels::Device reduce_on;
  int threads = 1;
  std::shared_ptr<const ThreadBudget> budget;  // when set and settled: its share, not `threads`
  int budget_ways = 1;
  float grad_scale = 1.0f;    // 1 / global batch (of tokens, for a language model)
  data::Normalisation input;  // what a batch of uint8 images becomes (input_dtype uint8)
  std::int64_t bucket_bytes = 25 << 20;
  std::int64_t first_bucket_bytes = 1 << 20;
  // ZeRO stage 2 (net.grad_slots): which slots of its net's gradients hold a bucket the reducer
  // has not taken (the process's replicas' in turn: this one's from local_index x
  // net.grad_slots.count on); its backward waits for a slot before it writes into it, up to
  // twice run.peer_timeout.
  std::shared_ptr<GradSlots> grad_slots;
  data::DatasetOptions test;      // path empty: no evaluation
  bool skip_bad_records = false;  // bad test records are left out of the evaluation
  Address reader, reducer, coordinator;
  RoleContext run;                    // its trace; an error names the step's epoch
  std::shared_ptr<TrainState> state;  // elastic runs: replica 0 leaves its buffers there
};
std::unique_ptr<Actor> makeReplica(std::string name, ReplicaConfig config);

// Sums buckets over this process's replicas, then (world > 1) over all processes by ring
// allreduce with the reducers of the other processes (the workers of the run, rank = worker).
// reducer = nccl: this process's part of the NCCL group of the run's GPUs, formed once the
// processes met (trainer.cc, before the actors run).
struct NcclGroup {
  std::unique_ptr<kernels::Communicator> comm;
  // Every GPU of the run (then NCCL's sum is the whole sum); false: this process's GPUs, whose
  // sum troupe's ring (or hierarchical allreduce) then sums across processes.
  bool spans_processes = true;
  // A sum still running after this aborts the group and fails the run (the reducer's watch).
  std::chrono::milliseconds timeout{30000};
};

struct ReducerConfig {
  int num_replicas = 1;  // in this process
  // Where it sums: the CPU, or the device of replica 0 (schedule `device`). The ring between
  // processes reads host memory: a sum on a device is copied to the host for it.
  kernels::Device device;
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
  // Filled in (actors/core/hosts.h) once the processes met, before the actors start; null, or
  // empty host_ranks: one flat ring over every worker.
  std::shared_ptr<const ReductionPlan> reduction;
  // Set (reducer = nccl): each bucket, once every replica of this process sent it, is summed in
  // place by NCCL, on its own streams: over every GPU of the run (no sum here, no ring), or over
  // this process's GPUs, then across processes by the ring (NcclGroup::spans_processes).
  std::shared_ptr<NcclGroup> nccl;
  // Sharded optimizer state (ZeRO stage 1; flat ring, CPU): per rank, the elements [begin, end) of
  // the flat parameters whose optimizer state it holds (serverShards). Each bucket is then
  // reduce-scattered (this rank's updater gets the finished sums of its shard only), and the
  // updater's GatherWeights all-gathered (a second ring, RingChunk::ring 1) before its
  // WeightsGathered. Empty: allreduce.
  std::vector<std::pair<std::int64_t, std::int64_t>> shards;
  // ZeRO stage 2 (with shards): the replicas' buckets lie in gradient slots that their next
  // buckets reuse. Once the ring reduce-scattered a bucket (summed over this process's replicas
  // into replica 0's first), this rank's shard of its sums is copied into memory of the shard's
  // size, which the updater reads (Reduced::grads_at), and the bucket's slots released.
  std::shared_ptr<GradSlots> grad_slots;
  // Pipeline stages in workers of their own (pipeline_across processes): rank, world and next are
  // of the ring of this stage's workers, one in each pipeline, which sums the stage's gradients
  // alone (shards, with ZeRO: the stage's, one a pipeline); ring_workers is the worker of each of
  // its ranks (empty: rank = worker). An updater's figures (SumAcrossWorkers) go round every
  // worker instead: this one's rank among them (its worker), their count, and the next.
  std::vector<int> ring_workers;
  int figures_rank = 0, figures_world = 0;  // 0: the ring above
  Address figures_next;
  // A bucket whose allreduce has waited run.stall_warning logs a stall report (which step, which
  // bucket, which worker it waits for), and fails the run after run.peer_timeout (PeerError
  // naming the previous worker of the ring).
  RoleContext run;
};
std::unique_ptr<Actor> makeReducer(std::string name, ReducerConfig config);

// An update that leaves an inf or NaN in the weights fails the run (NumericError naming the step
// and the worker): the run diverged, and nothing of it is sent on or saved.
// Mixed precision's loss scale (TrainOptions::loss_scale): the replicas' gradients come multiplied
// by it. Dynamic: halved, and the step skipped, when a step's reduced gradients hold inf or NaN;
// doubled after `window` steps in a row without. initial 0: none.
struct LossScale {
  float initial = 0;
  bool dynamic = false;
  std::int64_t window = 2000;
  // Steps skipped for inf or NaN gradients before this run (a resumed checkpoint's, an elastic
  // run's generations before), which the count goes on from.
  std::int64_t skipped = 0;
};

struct UpdaterConfig {
  int worker = 0;                   // this process's rank, for errors
  kernels::Tensor initial_weights;  // host
  // host, the optimizer's (with `shards`, this worker's shard of it: its rows' columns, one row
  // after another); undefined: zeros
  kernels::Tensor initial_state;
  kernels::Tensor initial_buffers;  // host; undefined: replicas keep their own
  kernels::OptimizerSettings optimizer;
  // Gradients scaled down to this global L2 norm where it is above (torch's clip_grad_norm_);
  // 0: no clipping. Clipping, a layerwise optimizer and a loss scale hold a step's buckets until
  // its last is reduced.
  float clip_grad_norm = 0;
  kernels::LrPolicy lr;
  StepPlan plan;
  kernels::Device device;  // where the weights and the optimizer live (the reducer's)
  int threads = 1;
  std::shared_ptr<const ThreadBudget> budget;  // as ReplicaConfig's
  int budget_ways = 1;
  LossScale loss_scale;
  std::vector<Address> replicas;
  Address coordinator;
  RoleContext run;  // its trace
  // Elastic runs. When the updater goes (the generation ended, or failed mid-step), it leaves its
  // last whole step's state in `state` (buffers: replica 0 leaves them). It waits for a Handover
  // before its first step when `await_handover`, and sends one to each of `handover_to` first.
  std::shared_ptr<TrainState> state;
  bool await_handover = false;
  std::vector<Address> handover_to;
  // reducer nccl: the group whose sums the buckets' events cover. A step whose sums ended because
  // the group failed is not whole (an elastic run goes on from the step before).
  std::shared_ptr<const NcclGroup> nccl;
  // Sharded optimizer state (ZeRO stage 1), as ReducerConfig::shards: this updater holds the
  // state of shards[worker] only, updates only those weights (the Reduced sums are final there
  // only), and sends each bucket to `reducer` to all-gather (GatherWeights); a step ends once every
  // bucket came back (WeightsGathered). Its EpochEnd carries its shard of the state. Empty: the
  // whole model. (Indexed by worker: with pipeline stages in workers of their own, each a part of
  // its stage's.)
  std::vector<std::pair<std::int64_t, std::int64_t>> shards;
  Address reducer;
  // Pipeline stages in workers of their own (pipeline_across processes): the flat parameters of
  // this worker's stage, whose buckets alone come each step, whose state it holds (its shard of
  // it with `shards`) and whose weights alone it keeps current (the others' are other workers':
  // the chief asks for them at a pause, StateRequest::weights). `figures_range` is its part of
  // the sums over every worker (SumAcrossWorkers: clipping's norm, a loss scale's test), which no
  // other worker's overlaps.
  std::optional<std::pair<std::int64_t, std::int64_t>> stage_range;
  std::pair<std::int64_t, std::int64_t> figures_range;
  // The ranges of the flat weights it holds, one after another (its stage's, and the tied ones
  // its stage reads: kernels::pipelineStageWindows); empty: all of them.
  std::vector<std::pair<std::int64_t, std::int64_t>> window;
};
std::unique_ptr<Actor> makeUpdater(std::string name, UpdaterConfig config);

// A parameter server: owns keys [key_begin, key_end) of the flat parameters and their optimizer
// state.
//   dist_sync:  sums the pushes of every worker for step t (in worker order) and updates once;
//               answers a pull for step t+1 after that.
//   dist_async: updates on every push as it arrives, at 1/W of the learning rate (staleness-aware
//               asynchronous SGD: with W workers a push lands on weights ~W-1 pushes newer than
//               the ones it was computed from), and at 1/(tau + 1) where the push's measured
//               staleness tau (updates since its pull was answered) is more; answers pulls at
//               once.
//   ssp:        as dist_async (same learning-rate scaling), but answers a pull for step t only
//               once every worker has pushed
//               step t - staleness - 1 (no worker runs more than `staleness` steps ahead).
// Epoch-end pulls wait for every worker; the optimizer state goes to the chief's coordinator for
// a checkpoint piece by piece, while the workers are paused (StateRequest). An update that leaves
// an inf or NaN in the shard fails the run (NumericError naming the step).
struct ServerConfig {
  int index = 0;
  // A KVStore's server (troupe/kvstore.h): it starts with no keys; KvInit messages bring them,
  // KvConfigure the optimizer (the learning rate is the one set, not `lr`; no optimizer: a
  // dist_sync update replaces the value by the sum of the pushes, as MXNet's); asynchronous
  // pushes apply at the learning rate as set. The server ends when every worker sent KvDone.
  // Otherwise a trainer's: keys [key_begin, key_end) from initial_weights.
  bool kvstore = false;
  int num_workers = 1;
  // How pushes are applied and pulls answered (the schedule's name, for messages: modeName).
  using Mode = ParameterServers::Mode;
  Mode mode = Mode::kSync;
  kernels::CompressionSpec compression;  // of the workers' pushes (kernels/compression.h)
  int staleness = 0;
  std::int64_t key_begin = 0;
  std::int64_t key_end = 0;
  kernels::Tensor initial_weights;  // host, this shard's keys
  kernels::Tensor initial_state;    // host, the optimizer's of this shard's keys; undefined: zeros
  kernels::OptimizerSettings optimizer;
  kernels::LrPolicy lr;
  std::int64_t first_step = 0;  // > 0 when resuming
  // The trainer's: the chief's coordinator, which asks for the keys' optimizer state piece by
  // piece for a checkpoint (StateRequest, answered with StateChunk).
  Address chief;
  int threads = 1;
  std::shared_ptr<const ThreadBudget> budget;  // as ReplicaConfig's (the whole of it)
  // A pull that has waited run.stall_warning logs a stall report (which step, which workers have
  // not pushed it), and fails the run after run.peer_timeout (PeerError naming the first of them).
  RoleContext run;
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
  // The pull fails after run.peer_timeout and a grace (peerTimeoutGrace): a server that holds it
  // for a late worker names that worker first.
  RoleContext run;
};
std::unique_ptr<Actor> makePsClient(std::string name, PsClientConfig config);

// A server mode's schedule, for messages: dist_sync, dist_async or ssp.
const char* modeName(ServerConfig::Mode mode);

// The KVStore's keys on server s are s << kKvKeyShift onwards: a KVStore key's part there is
// the range its init takes next.
inline constexpr int kKvKeyShift = 40;

// Keys [0, num_params) cut into `servers` contiguous shards of (nearly) equal size; with
// `layers` (a layerwise optimizer's), each cut moved to the nearest layer boundary, so that every
// layer's trust ratio is one server's.
std::vector<std::pair<std::int64_t, std::int64_t>> shardKeys(
    std::int64_t num_params, int servers, const std::vector<kernels::ParamRange>& layers = {});
// A run's servers' shards: shardKeys at `optimizer`'s layers where it is layerwise.
std::vector<std::pair<std::int64_t, std::int64_t>> serverShards(
    std::int64_t num_params, int servers, const kernels::OptimizerSettings& optimizer);

// A training epoch's figures so far.
struct EpochStats {
  double loss_sum = 0;
  double correct = 0;
  std::int64_t count = 0;
  std::int64_t skipped = 0;
  // The input, over the replicas' steps (StepDone): seconds waited and steps that waited, batches
  // held at a step's start (their sum and the fewest), the readers' seconds on the batches.
  double input_wait = 0;
  std::int64_t waited = 0;
  std::int64_t replica_steps = 0;
  std::int64_t ready_sum = 0;
  int fewest_ready = std::numeric_limits<int>::max();
  double read_seconds = 0;
  std::int64_t device_peak = 0;  // the most a process held on a replica's GPU in a step (bytes)

  void add(const EpochStats& s) {
    loss_sum += s.loss_sum;
    correct += s.correct;
    count += s.count;
    skipped += s.skipped;
    input_wait += s.input_wait;
    waited += s.waited;
    replica_steps += s.replica_steps;
    ready_sum += s.ready_sum;
    fewest_ready = std::min(fewest_ready, s.fewest_ready);
    read_seconds += s.read_seconds;
    device_peak = std::max(device_peak, s.device_peak);
  }
};

// What the chief's coordinator hands on to the next generation of an elastic run when the chief
// stays the same process: the epoch in progress, and the totals of the run in this process.
struct EpochCarry {
  EpochStats epoch;
  std::map<std::int64_t, EpochStats> recent;  // the epoch's last steps, included in `epoch`
  // Steps some replicas had not reported when the generation ended (a worker died with its
  // report), and the global batch they had.
  std::map<std::int64_t, EpochStats> partial;
  std::int64_t complete_through = 0;  // steps every replica had reported
  std::int64_t global_batch = 0;      // 0: no coordinator of this process has run yet
  std::int64_t epoch_index = 0;       // the epoch of `epoch`
  double epoch_seconds = 0;
  std::chrono::steady_clock::time_point left;  // when the last generation's coordinator went
  double cumulative_time = 0;
  std::int64_t cumulative_inputs = 0;
  std::int64_t overflow_logged = 0;  // skipped steps counted in the epoch logs so far
};

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
  // Counters carried over from a resumed checkpoint (or an elastic run's generation before).
  double cumulative_time = 0;
  std::int64_t cumulative_inputs = 0;
  std::int64_t overflow_steps = 0;  // skipped for inf or NaN gradients
  std::int64_t num_params = 0;
  // A sharded optimizer state: its shards (ZeRO stage 1's, as UpdaterConfig::shards; the
  // parameter servers' keys) and who holds each (the workers' updaters; the servers). A
  // checkpoint's state is put together on disk, from the chief's EpochEnd where it carries its
  // shard (ZeRO), and asked for piece by piece (StateRequest) from the holders of the others.
  // Empty: the chief's updater holds it all.
  std::vector<std::pair<std::int64_t, std::int64_t>> shards;
  std::vector<Address> state_holders;
  // Pipeline stages in workers of their own: each stage's range of the flat weights, and the
  // updater that keeps it current (the chief's, stage 0's, first). For a checkpoint the model's
  // weights are put together on disk from them, piece by piece (StateRequest::weights); an
  // evaluation runs on each stage's worker's own. Empty: the chief's are whole.
  std::vector<std::pair<std::int64_t, std::int64_t>> weight_ranges;
  std::vector<Address> weight_holders;
  // The same for the batch-norm statistics: each stage's range of the flat buffers, which stage
  // s's replica in the first pipeline (replicas[s]) keeps current. The evaluation and the
  // checkpoint take each stage's from its worker. Empty: replica 0's are whole.
  std::vector<std::pair<std::int64_t, std::int64_t>> buffer_ranges;
  // ... and the ranges of the weights the chief's worker holds (stage 0's UpdaterConfig::window),
  // which its EpochEnd at a pause carries.
  std::vector<std::pair<std::int64_t, std::int64_t>> chief_window;
  // Model FLOPs utilisation in the progress and log_every lines: the training FLOPs a sample, and
  // the peak they are a share of (0: none shown).
  double model_flops_per_sample = 0, peak_flops = 0;
  std::chrono::milliseconds step_timeout{300000};
  std::vector<Address> replicas;   // of every process
  std::vector<Address> updaters;   // of every process
  std::vector<Address> followers;  // the coordinators of the other processes
  TrainResult* result = nullptr;   // filled as epochs end; read after the system stopped
  // Elastic runs: whether a worker waits to join (asked at most twice a second, between steps);
  // then every updater pauses a few steps later and the generation ends there. `carry` is read
  // as the coordinator starts and written as it goes.
  std::function<bool()> joiner_waiting;
  std::shared_ptr<EpochCarry> carry;
  RunControl* control = nullptr;  // callbacks and requests of an embedding caller (trainer.h)
};
// Pipeline stages in processes of their own (pipeline_across processes): the link of this
// process's stage to the others' stage actors, by stage (`stages[s]` is stage s's, on worker
// `workers[s]`), sending from any thread through `runtime`; a wait on one logs a stall report
// after `stall_warning` and ends after `peer_timeout`.
std::shared_ptr<kernels::StageLink> makeStageLink(Runtime& runtime, std::vector<Address> stages,
                                                  std::vector<int> workers,
                                                  std::chrono::milliseconds peer_timeout,
                                                  std::chrono::milliseconds stall_warning);
// A worker's stage actor: hands what other processes' stages send to `link` (null: this run's
// stages are no processes of their own, and such a message is an error naming its sender).
std::unique_ptr<Actor> makeStage(std::string name, std::shared_ptr<kernels::StageLink> link);

// The chief coordinator, on rank 0, drives the whole run.
std::unique_ptr<Actor> makeCoordinator(std::string name, CoordinatorConfig config);
// The coordinator of every other process: waits for the chief's Shutdown.
std::unique_ptr<Actor> makeFollower(std::string name);

}  // namespace troupe::actors
