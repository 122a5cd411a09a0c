#include "actors/run/worker_spawn.h"

#include <fmt/format.h>

#include <algorithm>

#include "actors/core/messages.h"
#include "actors/roles/grad_slots.h"
#include "actors/run/elastic.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// A database reader's settings, less the replicas it feeds.
ReaderConfig readerConfig(const TrainOptions& o, const data::DatasetOptions& train,
                          const StepPlan& plan, Trace* trace) {
  ReaderConfig reader;
  reader.dataset = train;
  reader.seed = o.seed;
  reader.plan = plan;
  reader.prefetch = o.prefetch;
  reader.skip_bad_records = o.skip_bad_records;
  reader.synthetic = o.synthetic;
  reader.pinned = !o.gpus.empty();
  reader.run.trace = trace;
  return reader;
}

}  // namespace

WorkerAddresses addressesOf(const RunLayout& layout, int rank, int workers, int nodes,
                            int replicas) {
  WorkerAddresses a;
  a.chief = RunLayout::coordinator(0);
  a.updater = RunLayout::updater(rank);
  a.reducer = RunLayout::reducer(rank);
  for (int r = 0; r < replicas; ++r)
    a.local_replicas.push_back(RunLayout::replica(rank, r));
  for (int node = 0; node < workers; ++node) {
    for (int r = 0; r < replicas; ++r)
      a.all_replicas.push_back(RunLayout::replica(node, r));
    a.all_updaters.push_back(RunLayout::updater(node));
  }
  for (int node = 1; node < workers; ++node)
    a.followers.push_back(RunLayout::coordinator(node));
  for (int s = 0; s < nodes - workers; ++s) {
    a.servers.push_back(layout.server(s));
    a.followers.push_back(layout.server(s));
  }
  return a;
}

CoordinatorConfig WorkerSpawn::coordinator() const {
  CoordinatorConfig c;
  c.cumulative_time = p.cumulative_time;
  c.cumulative_inputs = p.cumulative_inputs;
  c.overflow_steps = p.overflow_steps;
  c.options = &o;
  c.plan = p.plan;
  c.lr = p.lr;
  c.num_replicas = o.replicas * p.workers;
  c.num_updaters = p.workers;
  c.has_test = !o.test_data.empty();
  c.has_buffers = p.has_buffers;
  c.experiment_id = result->experiment_id;
  c.log = log;
  c.checkpoint_dir = p.checkpoint_dir;
  c.num_params = p.num_params;
  if (p.ps) {
    c.shards = serverShards(p.num_params, o.num_servers, p.optimizer);
    c.state_holders = a.servers;
  } else if (!p.stage_ranges.empty()) {
    // Each stage's weights and state as its worker in the first pipeline keeps them, or with
    // ZeRO each worker's part of its stage's state.
    c.weight_ranges = p.stage_ranges;
    c.weight_holders.assign(
        a.all_updaters.begin(),
        a.all_updaters.begin() + static_cast<std::ptrdiff_t>(c.weight_ranges.size()));
    c.shards = zeroShards();
    c.state_holders = a.all_updaters;
    if (c.shards.empty()) {
      c.shards = c.weight_ranges;
      c.state_holders = c.weight_holders;
    }
    c.buffer_ranges = p.stage_buffer_ranges;
    c.chief_window = p.stage_windows.at(0);
  } else {
    c.shards = zeroShards();
    c.state_holders = a.all_updaters;
  }
  c.model_flops_per_sample = p.model_flops_per_sample;
  c.peak_flops = p.peak_flops;
  c.step_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.step_timeout_s * 1000));
  c.replicas = a.all_replicas;
  c.updaters = a.all_updaters;
  c.followers = a.followers;
  c.result = result;
  c.control = control;
  if (role) {
    c.joiner_waiting = role->joiner_waiting;
    c.carry = role->carry;
  }
  return c;
}

UpdaterConfig WorkerSpawn::updater() const {
  UpdaterConfig u;
  u.initial_weights = p.weights;
  u.initial_state = p.state;
  u.initial_buffers = p.buffers;
  u.worker = p.rank;
  u.device = p.devices.updater;
  u.optimizer = p.optimizer;
  u.clip_grad_norm = o.clip_grad_norm;
  u.lr = p.lr;
  u.plan = p.plan;
  u.loss_scale = lossScaleOf(o);
  if (u.loss_scale.dynamic && p.loss_scale > 0) {
    u.loss_scale.initial = p.loss_scale;
    u.loss_scale.skipped = p.overflow_steps;
  }
  // It computes on replica 0's thread, with replica 0's team: a bigger one would spin on the
  // cores of the other replicas.
  u.threads = std::max(1, p.threads / o.replicas);
  u.budget = p.budget;
  u.budget_ways = o.replicas;
  u.replicas = a.local_replicas;
  u.coordinator = a.chief;
  u.run = run;
  u.nccl = nccl;
  u.shards = zeroShards();
  u.reducer = a.reducer;
  if (!p.stage_ranges.empty()) {
    u.stage_range = p.stage_ranges[static_cast<std::size_t>(p.net.pipeline.stage)];
    u.window = p.stage_windows[static_cast<std::size_t>(p.net.pipeline.stage)];
    u.figures_range = stagePartsOf(p)[static_cast<std::size_t>(p.rank)];
  }
  if (role) {
    u.state = role->state;
    u.await_handover = role->await_handover;
    for (const int r : role->handover_to)
      u.handover_to.push_back(RunLayout::updater(r));
  }
  return u;
}

// The parameter servers update; this worker's PS client stands where the updater would.
PsClientConfig WorkerSpawn::psClient() const {
  PsClientConfig c;
  c.worker = static_cast<std::uint32_t>(p.rank);
  c.compression = compressionOf(o);
  c.initial_weights = p.weights;
  c.servers = a.servers;
  c.shards = serverShards(p.num_params, o.num_servers, p.optimizer);
  c.plan = p.plan;
  c.replicas = a.local_replicas;
  c.coordinator = a.chief;
  c.run = run;
  return c;
}

ReducerConfig WorkerSpawn::reducer() const {
  ReducerConfig r;
  r.num_replicas = o.replicas;
  r.device = p.devices.reducer;
  r.threads = 1;
  r.updater = a.updater;
  r.run = run;
  if (nccl) {
    r.nccl = nccl;
    r.nccl->spans_processes = ncclSpansProcesses(o, p.nodes);
    r.nccl->timeout = run.peer_timeout;
    // Across processes, NCCL cannot say whom a sum waits for: it gives up two graces after the
    // links' heartbeat watch (peer_timeout, two graces and a heartbeat interval:
    // clusterOptions), which names a silent peer, as the backstop for a peer that still beats
    // but is hung in its GPU. A group of this process's GPUs waits for no peer: the ring's
    // watch keeps peer_timeout.
    if (r.nccl->spans_processes)
      r.nccl->timeout += 4 * peerTimeoutGrace(run.stall_warning, run.peer_timeout) +
                         std::chrono::milliseconds(1000);
  }
  if (!p.ps) {  // with parameter servers, the servers sum over workers
    r.rank = p.rank;
    r.world = p.workers;
    r.next = RunLayout::reducer((p.rank + 1) % p.workers);
    r.compression = compressionOf(o);
    r.segment_bytes = static_cast<std::int64_t>(o.ring_segment_mb * (1 << 20));
    r.reduction = reduction;
    r.shards = zeroShards();
    r.grad_slots = grad_slots;
  }
  if (!p.stage_ranges.empty()) stageRings(r);
  return r;
}

// Pipeline stages in workers of their own: the gradients of a stage go round its workers alone,
// one a pipeline (stage s of pipeline q is worker q K + s), each its part of them with ZeRO; the
// figures round every worker.
void WorkerSpawn::stageRings(ReducerConfig& r) const {
  const int stages = o.pipeline.stages, stage = p.net.pipeline.stage;
  const int pipelines = p.workers / stages;
  const auto shards = zeroShards();
  r.shards.clear();
  r.ring_workers.clear();
  for (int q = 0; q < pipelines; ++q) {
    const int worker = q * stages + stage;
    r.ring_workers.push_back(worker);
    if (!shards.empty()) r.shards.push_back(shards[static_cast<std::size_t>(worker)]);
  }
  r.rank = p.rank / stages;
  r.world = pipelines;
  r.next = RunLayout::reducer((r.rank + 1) % pipelines * stages + stage);
  r.reduction = nullptr;  // no hierarchical ring: the stage's workers are any of the run's
  r.figures_rank = p.rank;
  r.figures_world = p.workers;
  r.figures_next = RunLayout::reducer((p.rank + 1) % p.workers);
}

std::vector<std::pair<std::int64_t, std::int64_t>> stagePartsOf(const ProcessPlan& p) {
  const int stages = static_cast<int>(p.stage_ranges.size());
  const int pipelines = p.workers / stages;
  std::vector<std::pair<std::int64_t, std::int64_t>> parts(static_cast<std::size_t>(p.workers));
  for (int s = 0; s < stages; ++s) {
    const auto [lo, hi] = p.stage_ranges[static_cast<std::size_t>(s)];
    const auto cut = serverShards(hi - lo, pipelines, p.optimizer.within(lo, hi));
    for (int q = 0; q < pipelines; ++q) {
      const auto& [begin, end] = cut[static_cast<std::size_t>(q)];
      parts[static_cast<std::size_t>(q * stages + s)] = {lo + begin, lo + end};
    }
  }
  return parts;
}

std::vector<std::pair<std::int64_t, std::int64_t>> shardsOf(const TrainOptions& o,
                                                            const ProcessPlan& p) {
  if (o.schedule.zeroStage() == 0 || p.workers < 2 || p.server) return {};
  if (!p.stage_ranges.empty()) {  // within each stage, over its workers: with several pipelines
    if (p.workers == static_cast<int>(p.stage_ranges.size())) return {};
    return stagePartsOf(p);
  }
  return serverShards(p.num_params, p.workers, p.optimizer);
}

std::shared_ptr<GradSlots> gradSlotsOf(const TrainOptions& o, const ProcessPlan& p) {
  if (o.schedule.zeroStage() < 2 || shardsOf(o, p).empty()) return nullptr;
  return std::make_shared<GradSlots>(kGradSlots * o.replicas);
}

std::optional<std::pair<std::int64_t, std::int64_t>> stateColumnsOf(const TrainOptions& o,
                                                                    const ProcessPlan& p) {
  if (p.server) {
    return serverShards(p.num_params, o.num_servers,
                        p.optimizer)[static_cast<std::size_t>(o.shard_id)];
  }
  if (p.ps) return std::pair<std::int64_t, std::int64_t>{0, 0};  // the servers hold it
  const auto shards = shardsOf(o, p);
  if (!shards.empty()) return shards[static_cast<std::size_t>(p.rank)];
  if (!p.stage_ranges.empty())
    return p.stage_ranges[static_cast<std::size_t>(p.net.pipeline.stage)];
  return std::nullopt;
}

ReplicaConfig WorkerSpawn::replica(int r) const {
  ReplicaConfig c;
  c.index = p.rank * o.replicas + r;
  c.local_index = r;
  c.num_replicas = o.replicas * p.workers;
  const bool staged = p.net.pipeline.stage >= 0;  // one replica a worker
  c.test_part = staged ? p.data_rank : c.index;
  c.test_parts = staged ? p.data_workers : c.num_replicas;
  c.worker = p.rank;
  c.net = p.net;
  c.net.given_weights = true;  // the updater's, or its copy of them (Replica::adopt)
  c.net.pipeline.link = stage_link;
  c.device = p.devices.replicas[static_cast<std::size_t>(r)];
  c.tf32 = o.tf32;
  c.cudnn_deterministic = o.cudnn_deterministic;
  c.threads = std::max(1, p.threads / o.replicas);
  c.budget = p.budget;
  c.budget_ways = o.replicas;
  // Every schedule averages over the global batch: under dist_async and ssp each worker's push
  // is then 1/W of a synchronous step, so a learning rate means the same under every schedule.
  // A language model's loss is a sum over every token: it averages over the batch's tokens, as
  // PyTorch's cross_entropy over (B, T) and llm.c do.
  c.grad_scale = 1.0f / static_cast<float>(p.plan.global_batch * p.train.labelsPerSample());
  c.input = data::normalisationOf(p.train);
  c.bucket_bytes = static_cast<std::int64_t>(o.bucket_size_mb * (1 << 20));
  c.first_bucket_bytes = static_cast<std::int64_t>(o.first_bucket_mb * (1 << 20));
  if (grad_slots) {
    c.grad_slots = grad_slots;
    c.net.grad_slots = {kGradSlots, c.first_bucket_bytes, c.bucket_bytes};
  }
  c.test = p.test;
  c.skip_bad_records = o.skip_bad_records;
  c.reader = layout.reader(p.rank, o.shared_reader ? 0 : r);
  // A worker's only replica skips the reducer (two thread hops per bucket) where nothing is to
  // be summed with other workers' on the way: alone in the run, or with parameter servers
  // (they sum; the PS client runs on this replica's thread all the same).
  // NCCL sums even one GPU's buckets (a group of one), as asked.
  const bool alone = o.replicas == 1 && (p.nodes == 1 || p.ps) && !nccl;
  c.reducer = alone ? a.updater : a.reducer;
  // (Under parameter-server schedules the updater's device, the PS client's, is the CPU.)
  c.reduce_on = c.reducer == a.reducer ? p.devices.reducer : p.devices.updater;
  c.coordinator = a.chief;
  c.run = run;
  if (role) c.state = role->state;
  return c;
}

// Reader r of this process: one on the training database feeding `targets` (one replica's
// share of the batch, or every replica's: shared_reader), else the caller's (troupe/reader.h).
std::unique_ptr<Actor> WorkerSpawn::reader(int r, const std::vector<ReaderTarget>& targets) const {
  const std::string name = layout.nameOf(layout.reader(p.rank, r));
  if (!o.reader_factory || o.shared_reader) {
    ReaderConfig database = readerConfig(o, p.train, p.plan, run.trace);
    database.targets = targets;
    database.device = gpuOf(r);
    return makeReader(name, database);
  }
  const ReaderTarget& target = targets.front();
  ReaderSpec spec;
  spec.name = name;
  spec.worker = p.rank;
  spec.replica = target.local_index;
  spec.to = target.replica;
  spec.first_step = p.plan.first_step;
  spec.last_step = p.plan.last_step;
  spec.steps_per_epoch = p.plan.steps_per_epoch;
  spec.global_batch = p.plan.global_batch;
  spec.offset = target.offset;
  spec.batch = target.count;
  spec.channels = p.train.channels;
  spec.height = p.train.height;
  spec.width = p.train.width;
  spec.num_labels = p.train.num_labels;
  spec.seed = o.seed;
  spec.prefetch = o.prefetch;
  auto reader = o.reader_factory(spec);
  if (!reader) throw InputError(fmt::format("TrainerData::reader made no actor for {}", name));
  return reader;
}

int WorkerSpawn::gpuOf(int r) const {
  const kernels::Device& d = p.devices.replicas[static_cast<std::size_t>(r)];
  return d.kind == kernels::DeviceKind::kCuda ? d.index : -1;
}

// Compute actors get threads of their own, so their OpenMP teams stay put; the updater shares
// replica 0's (they never compute at once), so a process has one team per replica.
SpawnOptions WorkerSpawn::computeThread(int replica) {
  return SpawnOptions{.thread = fmt::format("compute/{}", replica)};
}

// With a core to spare, readers run on the pool, beside the compute. Without one, a reader
// woken on the pool takes a computing core at any moment, and the OpenMP team of that core
// waits for it at its next barrier: it then reads on its replica's thread, between steps
// (measured on the MLP, 2 threads on 2 cores: a step's reader wake-up cost 30 us of 235 us).
// Replicas on GPUs keep no OpenMP team: each reader then has a thread of its own, so that a
// batch is read while the GPU computes, not between steps on the replica's thread while the GPU
// waits; not the pool's, which it would hold while it waits for its pinned buffer's last copy.
SpawnOptions WorkerSpawn::readerThread(int r) const {
  if (gpuOf(r) >= 0) return SpawnOptions{.thread = layout.nameOf(layout.reader(p.rank, r))};
  return p.threads < defaultThreads() ? SpawnOptions{} : computeThread(r);
}

std::size_t WorkerSpawn::stepMailbox() const {
  const std::int64_t segment =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(o.ring_segment_mb * (1 << 20)) /
                                    static_cast<std::int64_t>(sizeof(float)));
  // A bucket ends at the end of one of the net's gradient ranges (a parameter tensor's at most),
  // and its last segment may be short: one piece more a bucket.
  const auto pieces = static_cast<std::size_t>((p.num_params + segment - 1) / segment) +
                      p.optimizer.layers.size() + 1;
  return SystemOptions{}.mailbox_capacity + 2 * pieces;
}

std::vector<RoleSpawn> updatingWorkerRoles(const WorkerSpawn& spawn) {
  SpawnOptions thread = WorkerSpawn::computeThread(0);
  thread.mailbox_capacity = spawn.stepMailbox();
  return trainingRoles(spawn, {"updater", spawn.a.updater, thread,
                               [&spawn] { return makeUpdater("updater", spawn.updater()); }});
}

std::vector<RoleSpawn> pushingWorkerRoles(const WorkerSpawn& spawn) {
  return trainingRoles(spawn, {"ps-client", spawn.a.updater, WorkerSpawn::computeThread(0),
                               [&spawn] { return makePsClient("ps-client", spawn.psClient()); }});
}

std::vector<RoleSpawn> workerRolesOf(const Schedule& schedule, const WorkerSpawn& spawn) {
  return std::visit([&spawn](const auto& family) { return workerRolesOf(family, spawn); },
                    schedule.family());
}

std::vector<RoleSpawn> workerRolesOf(const OneProcess&, const WorkerSpawn& spawn) {
  return updatingWorkerRoles(spawn);
}

std::vector<RoleSpawn> workerRolesOf(const AllreduceWorkers&, const WorkerSpawn& spawn) {
  return updatingWorkerRoles(spawn);
}

std::vector<RoleSpawn> workerRolesOf(const ParameterServers&, const WorkerSpawn& spawn) {
  return pushingWorkerRoles(spawn);
}

std::vector<RoleSpawn> trainingRoles(const WorkerSpawn& spawn, RoleSpawn weights) {
  const TrainOptions& o = spawn.o;
  const int rank = spawn.p.rank;
  std::vector<RoleSpawn> roles;
  roles.push_back({"coordinator", RunLayout::coordinator(rank), {}, [&spawn] {
                     return spawn.p.chief ? makeCoordinator("coordinator", spawn.coordinator())
                                          : makeFollower("coordinator");
                   }});
  roles.push_back(std::move(weights));
  // The reducer has a thread of its own: it must take buckets while replica 0 is still in its
  // backward pass, or nothing would overlap. Its work (sums, copies) is light: one thread.
  roles.push_back({"reducer", spawn.a.reducer,
                   SpawnOptions{.thread = "reducer", .mailbox_capacity = spawn.stepMailbox()},
                   [&spawn] { return makeReducer("reducer", spawn.reducer()); }});
  for (int r = 0; r < o.replicas; ++r) {
    const Address at = RunLayout::replica(rank, r);
    roles.push_back({"replica", at, WorkerSpawn::computeThread(r), [&spawn, at, r] {
                       return makeReplica(spawn.layout.nameOf(at), spawn.replica(r));
                     }});
  }
  // What the other processes' pipeline stages send, handed to the replica's net on the
  // transport's thread: the replica's own waits in the net's step for it.
  const Address stage = spawn.layout.stage(rank);
  roles.push_back(
      {"stage", stage, SpawnOptions{.thread = {}, .inline_handlers = true},
       [&spawn, stage] { return makeStage(spawn.layout.nameOf(stage), spawn.stage_link); }});
  // Each replica's share of the global batch, in replica order (a pipeline's stages read the
  // same).
  std::vector<ReaderTarget> targets;
  std::int64_t offset = o.batch_size * spawn.p.data_rank;
  for (int r = 0; r < o.replicas; ++r) {
    const auto share = spawn.p.shares[static_cast<std::size_t>(r)];
    targets.push_back({RunLayout::replica(rank, r), r, offset, share});
    offset += share;
  }
  // One reader feeds every replica of this process with shared_reader (planProcess checked it),
  // else one each.
  const int readers = o.shared_reader ? 1 : o.replicas;
  for (int r = 0; r < readers; ++r) {
    std::vector<ReaderTarget> fed =
        o.shared_reader ? targets : std::vector<ReaderTarget>{targets[static_cast<std::size_t>(r)]};
    roles.push_back({"reader", spawn.layout.reader(rank, r), spawn.readerThread(r),
                     [&spawn, r, fed = std::move(fed)] { return spawn.reader(r, fed); }});
  }
  return roles;
}

}  // namespace troupe::actors
