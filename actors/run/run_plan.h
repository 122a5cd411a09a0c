// A training run's plan, before any actor runs: the options checked, each replica's share of the
// batch, the learning-rate schedule, the checkpoint a run continues from, and the agreement of
// every process on all of it (trainer.cc runs the plan; this is its first stage).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "actors/core/cluster.h"
#include "actors/roles/roles.h"
#include "actors/run/checkpoint.h"
#include "actors/run/trainer.h"
#include "data/dataset.h"
#include "kernels/compression.h"
#include "kernels/net.h"
#include "kernels/optimizer.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
class Store;
}

namespace troupe::actors {

// The actor system of node `rank`: with `multi_process`, its sends to other nodes go through the
// cluster put in `cluster` once joined (Runtime's RemoteSend and RemoteBuffer).
struct NodeSystem {
  std::shared_ptr<Cluster*> cluster = std::make_shared<Cluster*>(nullptr);
  std::unique_ptr<Runtime> system;
};
NodeSystem makeNodeSystem(int rank, int pool_threads, bool multi_process);

// How node `rank` of `nodes` joins run `run_id` with `o`'s rendezvous, secret, interface and
// timeouts; a link lost later fails `system` with the peer named by `members` (both must outlive
// the cluster).
ClusterOptions clusterOptions(const TrainOptions& o, const std::string& run_id, int rank, int nodes,
                              Runtime& system, const RunMembers& members);

// Seconds from a config value, as milliseconds.
std::chrono::milliseconds fromSeconds(double seconds);

// What every role of this process reads alike (roles.h): the trace, o's stall_warning and
// peer_timeout, the epoch's steps and the run's members.
RoleContext roleContext(const TrainOptions& o, Trace* trace, std::int64_t steps_per_epoch,
                        RunMembersPtr members);

// Where the compute actors of a worker process run. Replica r runs on GPU gpus[r], or on the CPU.
// Its buckets are summed on the first GPU under schedule device (and bsp-allreduce, whose ring
// then reads a copy on the host), on the CPU under local (MXNet's) and with parameter servers;
// the updater works where the sums are. A process's only replica, alone in the run, hands its
// buckets to the updater, which then works on that replica's device (as MXNet updates a single
// device's weights there, whatever the kvstore).
struct ProcessDevices {
  std::vector<kernels::Device> replicas;
  kernels::Device reducer, updater;
};
ProcessDevices devicesOf(const TrainOptions& o, bool ps, int nodes);
// "replicas on cuda:0, cuda:1; gradients summed on cuda:0, weights updated on cuda:0", for the
// log and --dry-run.
std::string describe(const ProcessDevices& d, const TrainOptions& o, bool ps, int nodes);

// InputError naming what does not fit the schedule (the processes it has, an unknown name).
void validateSchedule(const TrainOptions& o);

// An elastic run's options (actors/run/elastic.h), checked before any rendezvous: InputError.
void validateElastic(const TrainOptions& o);

// The checks of a process's options that need neither its data nor its peers: schedule, gradient
// compression, role and shard, replicas, batch, epochs, training data named, prefetch,
// generation. InputError naming the first that fails.
void checkProcessOptions(const TrainOptions& o);
// The training data is named: train_data, or a reader of one's own with epoch_size (InputError).
void checkTrainingData(const TrainOptions& o);

// The database at `path` as the run's readers open it (type, shape, labels, normalisation,
// transform, decode threads). `train`: the training set's, whose transform draws random crops,
// mirror and jitter, and which takes a folder of token shards' "train" split (else "val").
data::DatasetOptions datasetOptions(const TrainOptions& o, const std::string& path,
                                    bool train = false);

// The step plan of `workers` workers over a training set of `train_size` records, from step 0:
// global batch batch_size × workers, whole steps an epoch. InputError when an epoch is smaller than
// one global batch.
StepPlan stepPlan(const TrainOptions& o, int workers, std::int64_t train_size);

// The model as the run builds it, for batches of up to `max_batch`.
kernels::NetOptions netOptions(const TrainOptions& o, std::int64_t max_batch);

// Mixed precision (precision, loss_scale): the dtype a GPU replica computes in, and the loss scale
// of its updater. InputError for a precision below fp32 without GPUs, or fp16 under a parameter
// server schedule (whose servers, each holding a shard, cannot skip a step together).
// reducer nccl needs GPUs, and a schedule where the workers sum (device, bsp-allreduce), without
// compression unless troupe's allreduce sums across processes, and a fixed world: InputError
// saying what to change.
void checkReducer(const TrainOptions& o);
// reducer nccl: whether NCCL's group holds every GPU of the run (allreduce auto, or one
// process), or only each process's, troupe's allreduce (ring, hierarchical) summing across them.
bool ncclSpansProcesses(const TrainOptions& o, int nodes);
void checkPrecision(const TrainOptions& o);
kernels::DType precisionOf(const TrainOptions& o);
LossScale lossScaleOf(const TrainOptions& o);
// Whether GPU replicas keep images channels-last (memory_format), given why the model would change
// with it (kernels::Net::channelsLastMisfit; empty: it would not). InputError for nhwc without
// GPUs or for a model it would change.
bool channelsLastOf(const TrainOptions& o, const std::string& misfit);
// Whether GPU replicas train by CUDA graphs (cuda_graphs; kernels::NetOptions::graphs): unless
// cuda_graphs is false, wherever GPUs train, but not in a traced run, whose trace times each
// step's forward and backward apart. InputError for cuda_graphs true without GPUs (a parameter
// server, which trains none, is not asked).
bool cudaGraphsOf(const TrainOptions& o);
// "each step's forward and backward replayed from a CUDA graph, from ...", or why not.
std::string describeCudaGraphs(const TrainOptions& o);
// "bf16 activations, convolutions and products; fp32 weights, gradients and updates", or "fp32";
// with `channels_last`, "...; channels-last images".
std::string describePrecision(const TrainOptions& o, bool channels_last = false);

// The cores this process may run on (its CPU affinity: taskset, a cgroup's cpuset), shared out
// among the run's processes on this host when a launcher says how many there are
// (TROUPE_LOCAL_SIZE of troupe launch, OMPI_COMM_WORLD_LOCAL_SIZE of mpirun).
int defaultThreads();
// This process's cores, not shared out.
int hostCores();
// Whether a launcher said how many of the run's processes share this host (defaultThreads).
bool launcherSharesCores();

// A process's share of its machine's cores, among the run's processes on that machine: those
// whose coreKey() is the same (one boot of one kernel, the same CPUs; network namespaces share
// cores). `keys` are every process's "KEY THREADS" (THREADS: its --threads, 0 when not given),
// indexed by rank.
struct CoreShare {
  int cores = 1;                // this process's
  std::vector<int> sharers;     // the ranks on this machine, this one among them
  int threads = 1;              // this process's share: cores / sharers, the first ones +1
  std::int64_t asked_here = 0;  // the --threads of the sharers that gave one, summed
  bool all_asked = false;       // every sharer gave --threads
};
std::string coreKey();
CoreShare shareCores(const std::vector<std::string>& keys, int rank, int cores);

// Each replica's share of the global batch, as MXNet's work_load_list splits it.
std::vector<std::int64_t> splitBatch(std::int64_t batch, int replicas,
                                     const std::vector<double>& work_load);

// InputError when the input batches in flight cannot fit in the host's memory.
void checkBatchMemory(const TrainOptions& o);

// InputError, naming the bytes and the limit, when a worker process would hold more than
// max_memory for its model while it trains: the float32 weights and the optimizer's state rows
// (the updater's, its shard of them with zero_stage 1; none with parameter servers, which hold
// them), each replica's gradients (with pipeline stages, their sum and each stage's own and its
// tied weights', kernels::pipelineStageGrads; a stage in a worker of its own, `pipeline.stage`,
// its stage's alone), and its activations and their
// gradients at its share of the batch, from `whole`, the net at batch 1 (NetMemory::held and
// scratch; with pipeline stages, kernels::pipelineHeld). A checkpoint adds a piece of 256 KiB at
// most: a sharded state (ZeRO's, the parameter servers') is put together on disk, piece by piece.
// A pipeline stage's worker holds the state of `stage_state` parameters, its stage's (or its
// part of them, with ZeRO); -1: not one.
// Returns those bytes (0 without max_memory).
std::int64_t checkModelMemory(const TrainOptions& o, kernels::Net& whole,
                              const std::vector<std::int64_t>& shares,
                              const kernels::PipelineOptions& pipeline,
                              std::int64_t stage_state = -1);
// The same for a parameter server of `keys` keys: their weights, the optimizer's state rows, the
// pushes it holds at once (dist_sync: one from each of `workers` workers; else one), and a copy
// of the weights for each worker's pull answer. (A checkpoint takes the state piece by piece.)
// (The server holds nothing of the other keys: runServer hands it a copy of its shard.)
std::int64_t checkServerMemory(const TrainOptions& o, std::int64_t keys, int workers);
// "12.3 MiB", "1.50 GiB".
std::string memorySize(double bytes);

// IoError naming `what` folder when `dir` cannot be made or written.
void ensureWritableDir(const std::string& dir, const char* what);

// "lenet_cpu1_b64_L10_lr0.05_20260101_120000": Caffe2's experiment id.
std::string experimentId(const TrainOptions& o);

// Where the run's checkpoints go: checkpoint_dir, under log_dir when relative (the example
// configs' "checkpoints"); log_dir when empty.
std::string checkpointDir(const TrainOptions& o);
// The name that begins the experiment id: run_name, else the model's name ("custom" for layers).
std::string runName(const TrainOptions& o);

kernels::LrPolicy lrPolicy(const TrainOptions& o, std::int64_t steps_per_epoch);

kernels::CompressionSpec compressionOf(const TrainOptions& o);

// What the processes of a run must agree on, as (name, value): every key that changes a step's
// arithmetic (config::Key::agree: rates, batch, normalisation, model, precision, the exchange of
// gradients, the seed) as given.
using PlanValues = std::vector<std::pair<std::string, std::string>>;
PlanValues agreedValues(const TrainOptions& o);

// agreedValues, and what a process derives from them and its data: the steps, the model's size,
// the checkpoint it resumes from (by file name).
PlanValues planValues(const TrainOptions& o, const StepPlan& plan, std::int64_t num_params,
                      const std::string& resumed_from);

// A plan as a store holds it: the values shown (printable()) and their "name=value" lines.
struct StoredPlan {
  PlanValues shown;
  std::string text;
};
StoredPlan storedPlan(const PlanValues& values);

// "base_learning_rate: rank 0 has 0.01, this one 0.5; seed: ..." for every name whose values
// differ (one side's missing name shows as "(none)"; `who` the side of `theirs`), values shown
// printable; empty when they agree.
std::string planDifferences(const PlanValues& theirs, const PlanValues& mine,
                            std::string_view who = "rank 0");

// Rank 0's word that another rank refused its plan (agreeOnPlan): that rank leaves with its own
// InputError naming what differs; an elastic run's others re-form without it.
class PlanRefusedError : public InputError {
 public:
  using InputError::InputError;
};

// Rank 0 publishes its plan; every other rank checks its own against it, so a mismatch (another
// batch size, another dataset, another model, another learning rate) is one clear error instead
// of a hang mid-epoch or a run that trains on and diverges: the rank that differs names what
// differs and both values, and rank 0, which waits for every rank's verdict, names that rank
// ("rank 1 refused this run: ...", a PlanRefusedError). A plan in the store that does not parse
// is an InputError
// naming the key, its bytes escaped.
void agreeOnPlan(rendezvous::Store& store, int rank, int nodes, const PlanValues& mine,
                 std::chrono::milliseconds timeout);

// What a run continues from.
struct Resumed {
  std::string path;
  Checkpoint checkpoint;
  bool latest = false;  // found in the checkpoint folder, not named by the user
};

// `resume` as given, or (with "auto", and in every restarted generation) the newest complete
// checkpoint of this run in the checkpoint folder that fits this run's model and steps. A
// restarted generation whose run has no checkpoint yet falls back on an explicit `resume`, else
// starts from scratch (nullopt). With `state_columns`, the checkpoint's state holds those columns
// of its rows only (loadCheckpoint): a ZeRO worker's shard.
std::optional<Resumed> findResume(
    const TrainOptions& o, const std::string& dir, std::int64_t num_params, const StepPlan& plan,
    std::optional<std::pair<std::int64_t, std::int64_t>> state_columns = std::nullopt);

// InputError when `resumed` does not fit this run: other parameters, another global batch or
// epoch size, the state of another optimizer.
void checkResumable(const Resumed& resumed, std::int64_t num_params, const StepPlan& plan,
                    const kernels::OptimizerSettings& optimizer);

}  // namespace troupe::actors
