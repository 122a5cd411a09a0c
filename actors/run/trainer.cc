#include "actors/run/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "actors/core/cluster.h"
#include "actors/core/hosts.h"
#include "actors/core/messages.h"
#include "actors/core/peer.h"
#include "actors/core/run_id.h"
#include "actors/core/system.h"
#include "actors/core/trace.h"
#include "actors/roles/observers.h"
#include "actors/roles/roles.h"
#include "actors/run/checkpoint.h"
#include "actors/run/elastic.h"
#include "actors/run/run_layout.h"
#include "actors/run/run_plan.h"
#include "actors/run/train_log.h"
#include "actors/schedules/schedule.h"
#include "kernels/backend.h"
#include "rendezvous/exchange.h"
#include "rendezvous/store.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// Processes of the run that share a machine's cores (started by hand: no launcher said how many
// share it) share them out, as a launcher does: two ranks on 2 cores each took both before, and a
// step took 10.8 s against 1.28 s under troupe launch. With --threads given everywhere, threads
// summing past the cores are said once, by the machine's lowest rank.
void settleThreads(const TrainOptions& o, rendezvous::Store& store, int rank, int nodes,
                   std::chrono::milliseconds timeout, ThreadBudget& budget) {
  const auto keys = rendezvous::exchange(
      store, rank, nodes, fmt::format("{} {}", coreKey(), o.threads), timeout, "cores");
  const CoreShare share = shareCores(keys, rank, hostCores());
  if (share.sharers.size() < 2) return;
  if (o.threads == 0 && !launcherSharesCores()) {
    budget.threads = share.threads;
    spdlog::info(
        "threads: {} of this machine's {} cores, which {} processes of the run share (ranks {}); "
        "--threads N sets it",
        share.threads, share.cores, share.sharers.size(), fmt::join(share.sharers, ", "));
  } else if (share.all_asked && share.asked_here > share.cores && rank == share.sharers[0]) {
    spdlog::warn(
        "ranks {} of the run share this machine's {} cores with {} threads together "
        "(--threads): their teams will wait on each other's cores",
        fmt::join(share.sharers, ", "), share.cores, share.asked_here);
  }
}

// Joins the run's other processes (every actor of this one already spawned), checks that all
// agree on the plan, shares the machine's cores out, and fills in where the members are.
std::unique_ptr<Cluster> joinRun(const TrainOptions& o, const std::string& run_id, int rank,
                                 int nodes, Trace* trace, NodeSystem& node, const StepPlan& plan,
                                 std::int64_t num_params, const std::string& resumed_from,
                                 RunMembers& members, ReductionPlan* reduction,
                                 ThreadBudget& budget) {
  ClusterOptions c = clusterOptions(o, run_id, rank, nodes, *node.system, members);
  c.trace = trace;
  auto cluster = joinCluster(c, *node.system);
  *node.cluster = cluster.get();
  agreeOnPlan(cluster->store(), rank, nodes, planValues(o, plan, num_params, resumed_from),
              c.timeout);
  settleThreads(o, cluster->store(), rank, nodes, c.timeout, budget);
  members.setAddresses(cluster->addresses());
  if (rank == 0) {
    // Where an observer (troupe/observer.h) finds the chief's weights: the actor that holds them
    // (the chief's updater or PS client), the plan, and the chief's address.
    cluster->store().set(
        kObserveKey,
        fmt::format("{} {} {} {} {} {}", RunLayout::updater(0).actor, plan.steps_per_epoch,
                    plan.first_step, plan.last_step, num_params, cluster->addresses()[0]));
  }
  if (reduction) {
    const auto hosts =
        groupHosts(exchangeHostKeys(cluster->store(), rank, o.num_shards, c.timeout));
    *reduction = planReduction(o.allreduce, hosts, rank);
    if (rank == 0) spdlog::info("allreduce: {}", reduction->description);
  }
  return cluster;
}

// reducer nccl: this process's part of the NCCL group of the run's GPUs (replicas x processes of
// them, ranked by process, then replica), its id made by rank 0 and passed through the store.
// Or, where troupe's allreduce sums across processes (ncclSpansProcesses), a group of this
// process's GPUs alone.
std::unique_ptr<kernels::Communicator> formNcclGroup(const TrainOptions& o,
                                                     rendezvous::Store* store, int rank,
                                                     int nodes) {
  const auto timeout = fromSeconds(o.rendezvous_timeout_s);
  const bool spans = ncclSpansProcesses(o, nodes);
  kernels::CommunicatorSpec spec;
  if (rank == 0 || !spans) {
    spec.id = kernels::newNcclGroupId();
    if (store && spans) store->set("nccl-id", spec.id);
  } else {
    spec.id = store->get("nccl-id", timeout);
  }
  spec.ranks = spans ? o.replicas * nodes : o.replicas;
  spec.first_rank = spans ? o.replicas * rank : 0;
  spec.devices = o.gpus;
  spec.timeout = timeout;
  auto comm = kernels::makeNcclCommunicator(spec);
  if (rank == 0 && spans) {
    spdlog::info("NCCL: a group of {} GPU(s) in {} process(es) sums the gradients", spec.ranks,
                 nodes);
  } else if (rank == 0) {
    spdlog::info(
        "NCCL: a group of each process's {} GPU(s) sums their gradients, troupe's allreduce "
        "those of the {} processes",
        spec.ranks, nodes);
  }
  return comm;
}

// A parameter-server process: one Server actor owning a shard of the keys.
TrainResult runServer(const TrainOptions& o, int rank, int nodes, const StepPlan& plan,
                      const kernels::LrPolicy& lr, const kernels::OptimizerSettings& optimizer,
                      std::int64_t num_params, const kernels::Tensor& weights,
                      const kernels::Tensor& state, const std::string& resumed_from,
                      const std::shared_ptr<RunMembers>& members) {
  const int workers = o.num_shards;
  const auto shard =
      shardKeys(num_params, o.num_servers,
                kernels::optimizerInfo(optimizer.name).layerwise
                    ? optimizer.layers
                    : std::vector<kernels::ParamRange>{})[static_cast<std::size_t>(o.shard_id)];
  ServerConfig config;
  config.index = o.shard_id;
  config.num_workers = workers;
  config.mode = serverMode(scheduleInfo(o.schedule).name);
  config.compression = compressionOf(o);
  config.staleness = o.staleness;
  config.key_begin = shard.first;
  config.key_end = shard.second;
  config.initial_weights = weights.slice(shard.first, shard.second);
  if (state.defined() && state.numel() > 0) {
    config.initial_state = kernels::stateColumns(state, num_params, shard.first, shard.second);
  }
  config.optimizer = optimizer.within(shard.first, shard.second);
  config.lr = lr;
  config.first_step = plan.first_step;
  config.threads = o.threads > 0 ? o.threads : defaultThreads();
  auto budget = std::make_shared<ThreadBudget>();
  config.budget = budget;
  std::unique_ptr<Trace> trace;
  if (!o.trace.empty()) {
    trace = std::make_unique<Trace>(static_cast<std::uint32_t>(rank),
                                    fmt::format("server {}", o.shard_id));
  }
  config.run = roleContext(o, trace.get(), plan.steps_per_epoch, members);

  auto node = makeNodeSystem(rank, 1, true);
  auto& system = node.system;
  system->spawn(makeServer(fmt::format("server/{}", o.shard_id), config),
                SpawnOptions{.thread = "server"});
  auto cluster = joinRun(o, generationRunId(o.run_id, o.generation), rank, nodes, trace.get(), node,
                         plan, num_params, resumed_from, *members, nullptr, *budget);
  spdlog::info("server {} of {} owns keys [{}, {})", o.shard_id, o.num_servers, shard.first,
               shard.second);
  system->run();
  if (trace) trace->write(Trace::partPath(o.trace, static_cast<std::uint32_t>(rank)));
  cluster->finish();
  return TrainResult{};
}

// What one process of the run does, decided before anything runs: the options checked, its place
// in the world, the batch split, the data, the step plan and learning rates, the net, and the
// state it starts from (from scratch, a checkpoint, or an elastic generation's).
struct ProcessPlan {
  bool server = false, ps = false, chief = false;
  int workers = 0, nodes = 0, rank = 0, threads = 1;
  ProcessDevices devices;
  std::vector<std::int64_t> shares;  // of the batch, per replica
  data::DatasetOptions train, test;
  StepPlan plan;
  kernels::LrPolicy lr;
  kernels::OptimizerSettings optimizer;  // TrainOptions::optimizer, with the net's ranges
  kernels::NetOptions net;
  std::int64_t num_params = 0;
  bool has_buffers = false;
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

// The plan stage; with `role`, for one generation of an elastic run (actors/run/elastic.h).
ProcessPlan planProcess(const TrainOptions& o, GenerationRole* role) {
  checkProcessOptions(o);
  ProcessPlan p;
  const bool server = p.server = o.role == "server";
  const int workers = p.workers = o.num_shards;
  p.ps = isParameterServerSchedule(o.schedule);
  // Node ids: workers 0 .. W-1, then servers W .. W+S-1. Worker 0 is the chief.
  p.nodes = workers + o.num_servers;
  p.rank = server ? workers + o.shard_id : o.shard_id;
  p.chief = p.rank == 0;
  p.shares = splitBatch(o.batch_size, o.replicas, o.work_load_list);
  p.devices = devicesOf(o, p.ps, p.nodes);
  if (!o.gpus.empty() && !server) spdlog::info("{}", describe(p.devices, o, p.ps, p.nodes));
  checkBatchMemory(o);
  p.threads = o.threads > 0 ? o.threads : defaultThreads();

  p.train = datasetOptions(o, o.train_data, /*train=*/true);
  p.test = datasetOptions(o, o.test_data);
  // A reader of one's own reads no database: epoch_size says how many inputs an epoch trains.
  const std::int64_t train_size =
      o.reader_factory || o.synthetic ? o.epoch_size : data::openDataset(p.train)->size();
  if (!o.test_data.empty()) data::openDataset(p.test);
  // Every process computes the same plan from the same flags and data; rank 0's is checked
  // against the others' through the store before any step (joinRun).
  p.plan = stepPlan(o, workers, train_size);
  StepPlan& plan = p.plan;
  if (role) {
    plan.startAt(role->start.step, role->start.epoch, role->start.epoch_records, o.num_epochs);
    role->last_step = plan.last_step;
  } else {
    plan.start(0, o.num_epochs);
  }
  p.lr = lrPolicy(o, plan.steps_per_epoch);

  p.net = netOptions(o, *std::max_element(p.shares.begin(), p.shares.end()));
  const kernels::NetOptions& net = p.net;

  // The initial weights (and the size of everything): one net built here, on the CPU.
  auto init_backend = kernels::makeCpuBackend(1);
  kernels::NetOptions probe = net;
  probe.max_batch = 1;
  auto init_net = kernels::makeNet(*init_backend, probe);
  p.weights = kernels::Tensor::host({init_net->numParams()});
  init_backend->copy(init_net->weights(), p.weights);
  p.has_buffers = init_net->buffers().numel() > 0;
  const std::int64_t num_params = p.num_params = init_net->numParams();
  p.optimizer = o.optimizer;
  if (o.no_wd) p.optimizer.no_decay = kernels::noDecayRanges(init_net->params());
  p.optimizer.layers = kernels::paramRanges(init_net->params());
  kernels::makeOptimizer(*init_backend, 0, o.optimizer);  // refused here, not in an actor
  // How GPU replicas compute: the precision, and the images' layout, which the model decides too.
  p.net.precision = precisionOf(o);
  p.net.channels_last = channelsLastOf(o, init_net->channelsLastMisfit());
  if (!o.gpus.empty() && !server && (o.precision != "fp32" || p.net.channels_last))
    spdlog::info("precision: {}", describePrecision(o, p.net.channels_last));
  p.net.graphs = cudaGraphsOf(o);
  if (o.cuda_graphs == true && !server && !p.net.graphs)
    spdlog::warn("cuda_graphs: {}", describeCudaGraphs(o));
  init_net.reset();

  p.checkpoint_dir = checkpointDir(o);
  const auto resumed = role ? std::nullopt : findResume(o, p.checkpoint_dir, num_params, plan);
  p.resumed_from = resumed ? resumed->path : std::string();
  if (resumed) {
    const auto& ck = resumed->checkpoint;
    const std::string& path = resumed->path;
    checkResumable(*resumed, num_params, plan, p.optimizer);
    plan.start(ck.metaInt("step"), o.num_epochs);
    if (plan.first_step >= plan.last_step && resumed->latest) {
      // The run already ended (a restart after its last checkpoint): every process sees the
      // same checkpoint and stops here.
      spdlog::info("checkpoint {} holds the run's last step {}: nothing left to train", path,
                   plan.first_step);
      p.nothing_left = true;
      return p;
    }
    if (plan.first_step >= plan.last_step) {
      throw InputError(
          fmt::format("checkpoint '{}' is at step {}, and this run ends at step {}: "
                      "raise num_epochs to train further",
                      path, plan.first_step, plan.last_step));
    }
    p.weights = ck.weights;
    p.state = ck.state;
    if (ck.buffers.numel() > 0) p.buffers = ck.buffers;
    p.cumulative_time = ck.metaDouble("cumulative_time_spent");
    p.cumulative_inputs = ck.metaInt("cumulative_input_count");
    if (ck.meta.count("loss_scale")) p.loss_scale = static_cast<float>(ck.metaDouble("loss_scale"));
    if (ck.meta.count("overflow_steps")) p.overflow_steps = ck.metaInt("overflow_steps");
    spdlog::info("resuming from {} at step {}", path, plan.first_step);
  }
  // A generation of an elastic run goes on from this process's own state when it is the newest;
  // else its updater waits for the newest from the process that has it (Handover).
  if (role && role->state->step == plan.first_step && !role->await_handover) {
    p.weights = role->state->weights;
    p.state = role->state->state;
    if (role->state->buffers.defined()) p.buffers = role->state->buffers;
    if (role->state->loss_scale > 0 && lossScaleOf(o).dynamic) {
      p.loss_scale = role->state->loss_scale;
      p.overflow_steps = role->state->overflow_steps;
      spdlog::info("worker {}: the dynamic loss scale goes on from {:g}, the generation before's",
                   p.rank, p.loss_scale);
    }
  }
  return p;
}

// An elastic worker's run print (actors/run/elastic.h): the options every worker must share
// whatever the world's size, from this process's own full check (options, GPUs, data, model; as
// rank 0 of MIN workers) before it counts in any round. InputError, or IoError, when the check
// fails.
RunPrint elasticRunPrint(const TrainOptions& o) {
  TrainOptions probe = o;
  probe.num_shards = o.min_workers;
  probe.shard_id = 0;
  const ProcessPlan p = planProcess(probe, nullptr);
  RunPrint print = {{"epoch_inputs", std::to_string(p.plan.epoch_size)},
                    {"num_params", std::to_string(p.num_params)}};
  for (auto& value : agreedValues(o))
    print.push_back(std::move(value));
  return print;
}

// The spawn stage of a worker: its coordinator (or follower), updater (or parameter-server
// client), reducer, replicas and readers, spawned in the same order in every process so that
// every address is known everywhere. The reduction plan is filled in at the rendezvous.
struct WorkerActors {
  NodeSystem node;
  std::shared_ptr<ReductionPlan> reduction;
  std::shared_ptr<NcclGroup> nccl;  // reducer nccl: formed by formNcclGroup, before run()
};

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

// Whom a worker's actors send to, by the run's layout (actors/run/run_layout.h): every process
// spawns the same actors in the same order.
struct WorkerAddresses {
  Address chief, updater, reducer;
  std::vector<Address> local_replicas, all_replicas, all_updaters, servers;
  std::vector<Address> followers;  // the chief's Shutdown ends them: other coordinators, servers
};

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

// What one worker process spawns, with what it shares between its actors' configs.
struct WorkerSpawn {
  const TrainOptions& o;
  const ProcessPlan& p;
  const RunLayout& layout;
  const WorkerAddresses& a;
  GenerationRole* role;
  RoleContext run;                  // every role's
  std::shared_ptr<NcclGroup> nccl;  // reducer nccl: formed once the processes met, before run()

  CoordinatorConfig coordinator(RunControl* control, TrainLog* log, TrainResult& result) const {
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
    c.experiment_id = result.experiment_id;
    c.log = log;
    c.checkpoint_dir = p.checkpoint_dir;
    c.num_params = p.num_params;
    c.step_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.step_timeout_s * 1000));
    c.replicas = a.all_replicas;
    c.updaters = a.all_updaters;
    c.followers = a.followers;
    c.result = &result;
    c.control = control;
    if (role) {
      c.joiner_waiting = role->joiner_waiting;
      c.carry = role->carry;
    }
    return c;
  }

  UpdaterConfig updater() const {
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
    if (role) {
      u.state = role->state;
      u.await_handover = role->await_handover;
      for (const int r : role->handover_to)
        u.handover_to.push_back(RunLayout::updater(r));
    }
    return u;
  }

  // The parameter servers update; this worker's PS client stands where the updater would.
  PsClientConfig psClient() const {
    PsClientConfig c;
    c.worker = static_cast<std::uint32_t>(p.rank);
    c.compression = compressionOf(o);
    c.initial_weights = p.weights;
    c.servers = a.servers;
    c.shards = shardKeys(p.num_params, o.num_servers,
                         kernels::optimizerInfo(p.optimizer.name).layerwise
                             ? p.optimizer.layers
                             : std::vector<kernels::ParamRange>{});
    c.plan = p.plan;
    c.replicas = a.local_replicas;
    c.coordinator = a.chief;
    c.run = run;
    return c;
  }

  ReducerConfig reducer(const std::shared_ptr<ReductionPlan>& reduction) const {
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
    }
    return r;
  }

  ReplicaConfig replica(int r) const {
    ReplicaConfig c;
    c.index = p.rank * o.replicas + r;
    c.local_index = r;
    c.num_replicas = o.replicas * p.workers;
    c.worker = p.rank;
    c.net = p.net;
    c.device = p.devices.replicas[static_cast<std::size_t>(r)];
    c.tf32 = o.tf32;
    c.cudnn_deterministic = o.cudnn_deterministic;
    c.threads = std::max(1, p.threads / o.replicas);
    c.budget = p.budget;
    c.budget_ways = o.replicas;
    // Every schedule averages over the global batch: under dist_async and ssp each worker's push
    // is then 1/W of a synchronous step, so a learning rate means the same under every schedule.
    c.grad_scale = 1.0f / static_cast<float>(p.plan.global_batch);
    c.input = data::normalisationOf(p.train);
    c.bucket_bytes = static_cast<std::int64_t>(o.bucket_size_mb * (1 << 20));
    c.first_bucket_bytes = static_cast<std::int64_t>(o.first_bucket_mb * (1 << 20));
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
  std::unique_ptr<Actor> reader(int r, const std::vector<ReaderTarget>& targets) const {
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

  int gpuOf(int r) const {  // replica r's GPU, or -1
    const kernels::Device& d = p.devices.replicas[static_cast<std::size_t>(r)];
    return d.kind == kernels::DeviceKind::kCuda ? d.index : -1;
  }

  // Compute actors get threads of their own, so their OpenMP teams stay put; the updater shares
  // replica 0's (they never compute at once), so a process has one team per replica.
  static SpawnOptions computeThread(int replica) {
    return SpawnOptions{.thread = fmt::format("compute/{}", replica)};
  }

  // With a core to spare, readers run on the pool, beside the compute. Without one, a reader
  // woken on the pool takes a computing core at any moment, and the OpenMP team of that core
  // waits for it at its next barrier: it then reads on its replica's thread, between steps
  // (measured on the MLP, 2 threads on 2 cores: a step's reader wake-up cost 30 us of 235 us).
  // Replicas on GPUs keep no OpenMP team: each reader then has a thread of its own, so that a
  // batch is read while the GPU computes, not between steps on the replica's thread while the GPU
  // waits; not the pool's, which it would hold while it waits for its pinned buffer's last copy.
  SpawnOptions readerThread(int r) const {
    if (gpuOf(r) >= 0) return SpawnOptions{.thread = layout.nameOf(layout.reader(p.rank, r))};
    return p.threads < defaultThreads() ? SpawnOptions{} : computeThread(r);
  }
};

WorkerActors spawnWorker(const TrainOptions& o, const ProcessPlan& p, GenerationRole* role,
                         RunControl* control, TrainLog* chief_log, TrainResult& result,
                         Trace* trace_ptr, const std::shared_ptr<RunMembers>& members) {
  const int rank = p.rank;
  const RunLayout layout(p.workers, p.nodes - p.workers, o.replicas);
  if (control != nullptr) {
    control->servers.store(layout.servers());
    control->workers.store(layout.workers());
  }
  const WorkerAddresses a = addressesOf(layout, rank, p.workers, p.nodes, o.replicas);
  const WorkerSpawn spawn{o,
                          p,
                          layout,
                          a,
                          role,
                          roleContext(o, trace_ptr, p.plan.steps_per_epoch, members),
                          o.reducer == "nccl" ? std::make_shared<NcclGroup>() : nullptr};
  // A run at a rendezvous joins it even alone (troupe launch -n 1): observers find it there.
  auto node = makeNodeSystem(rank, 2, p.nodes > 1 || !o.rendezvous.empty());
  auto& system = *node.system;
  const auto expect = [](Address spawned, Address planned) { TROUPE_ENFORCE_EQ(spawned, planned); };

  expect(system.spawn(
             p.chief ? makeCoordinator("coordinator", spawn.coordinator(control, chief_log, result))
                     : makeFollower("coordinator")),
         RunLayout::coordinator(rank));
  expect(p.ps ? system.spawn(makePsClient("ps-client", spawn.psClient()), spawn.computeThread(0))
              : system.spawn(makeUpdater("updater", spawn.updater()), spawn.computeThread(0)),
         a.updater);
  auto reduction = std::make_shared<ReductionPlan>();  // filled in by joinRun, before run()
  // The reducer has a thread of its own: it must take buckets while replica 0 is still in its
  // backward pass, or nothing would overlap. Its work (sums, copies) is light: one thread.
  expect(system.spawn(makeReducer("reducer", spawn.reducer(reduction)),
                      SpawnOptions{.thread = "reducer"}),
         a.reducer);
  for (int r = 0; r < o.replicas; ++r) {
    const Address at = RunLayout::replica(rank, r);
    expect(system.spawn(makeReplica(layout.nameOf(at), spawn.replica(r)), spawn.computeThread(r)),
           at);
  }
  // Each replica's share of the global batch, in replica order.
  std::vector<ReaderTarget> targets;
  std::int64_t offset = o.batch_size * rank;
  for (int r = 0; r < o.replicas; ++r) {
    const auto share = p.shares[static_cast<std::size_t>(r)];
    targets.push_back({RunLayout::replica(rank, r), r, offset, share});
    offset += share;
  }
  if (o.shared_reader) {  // one reader feeds every replica of this process (planProcess checked)
    expect(system.spawn(spawn.reader(0, targets), spawn.readerThread(0)), layout.reader(rank, 0));
  } else {
    for (int r = 0; r < o.replicas; ++r) {
      expect(system.spawn(spawn.reader(r, {targets[static_cast<std::size_t>(r)]}),
                          spawn.readerThread(r)),
             layout.reader(rank, r));
    }
  }
  return WorkerActors{std::move(node), reduction, spawn.nccl};
}

// One process of the run, in stages: plan (planProcess), the server's run or the worker's
// log and spawn (spawnWorker), rendezvous (joinRun), run, finish. With `role`, one generation of
// an elastic run.
TrainResult trainProcess(const TrainOptions& o, GenerationRole* role, RunControl* control) {
  const ProcessPlan p = planProcess(o, role);
  if (p.nothing_left) {
    TrainResult done;
    done.resumed_from = p.resumed_from;
    done.steps = p.plan.first_step;
    return done;
  }
  const bool ps = p.ps, chief = p.chief;
  const int nodes = p.nodes, rank = p.rank;
  const std::string& checkpoint_dir = p.checkpoint_dir;
  const std::string& resumed_from = p.resumed_from;

  const auto members = std::make_shared<RunMembers>(p.workers, o.num_servers);
  if (p.server) {
    return runServer(o, rank, nodes, p.plan, p.lr, p.optimizer, p.num_params, p.weights, p.state,
                     resumed_from, members);
  }

  TrainResult result;
  result.resumed_from = resumed_from;
  std::unique_ptr<TrainLog> log;
  if (chief) {
    ensureWritableDir(o.log_dir, "log");
    ensureWritableDir(checkpoint_dir, "checkpoint");
    for (const auto& tmp : removeStaleTemporaries(checkpoint_dir)) {
      spdlog::info("removed {}, left by a checkpoint save that never finished", tmp);
    }
    // An elastic run's chief keeps one log through its generations.
    auto& slot = role ? *role->log : log;
    if (!slot) {
      slot =
          std::make_unique<TrainLog>(o.log_dir, experimentId(o), o.parameters, o.skip_bad_records);
    }
    result.log_path = slot->path();
    result.experiment_id = slot->id();
  }
  TrainLog* const chief_log = role && chief ? role->log->get() : log.get();

  std::unique_ptr<Trace> trace;
  if (!o.trace.empty()) {
    trace =
        std::make_unique<Trace>(static_cast<std::uint32_t>(rank), fmt::format("worker {}", rank));
  }
  auto [node, reduction, nccl] =
      spawnWorker(o, p, role, control, chief_log, result, trace.get(), members);
  auto& system = node.system;
  std::unique_ptr<Cluster> cluster;
  if (nodes > 1 || !o.rendezvous.empty()) {
    cluster = joinRun(o, role ? role->run_id : generationRunId(o.run_id, o.generation), rank, nodes,
                      trace.get(), node, p.plan, p.num_params, role ? "" : resumed_from, *members,
                      ps || (nccl && nccl->spans_processes) ? nullptr : reduction.get(), *p.budget);
  }
  if (nccl) {
    nccl->comm = formNcclGroup(o, cluster ? &cluster->store() : nullptr, rank, nodes);
    // A run that fails aborts the group first: NCCL's kernels wait for ever on a peer that is
    // gone, and so would the updater's wait for them, and the actors' ends with it.
    system->onFailure([group = nccl] { group->comm->abort(); });
  }

  system->run();
  if (trace && !cluster) trace->write(o.trace);
  if (trace && cluster) trace->write(Trace::partPath(o.trace, static_cast<std::uint32_t>(rank)));
  if (cluster) cluster->finish();  // the chief's Shutdown reached everyone before links close
  if (trace && cluster && chief) Trace::merge(o.trace, static_cast<std::uint32_t>(nodes));
  return result;
}

}  // namespace

TrainResult runTraining(const TrainOptions& o, RunControl* control) {
  try {
    if (o.max_workers > 0) {
      validateElastic(o);
      return runElastic(o, elasticRunPrint(o),
                        [control](const TrainOptions& g, GenerationRole& role) {
                          return trainProcess(g, &role, control);
                        });
    }
    return trainProcess(o, nullptr, control);
  } catch (const std::exception& e) {
    // The run failed for another process: one line that names it, for the launcher's summary.
    if (const auto peer = findPeerError(e)) {
      std::fprintf(stderr, "%s\n", peer->culpritLine().c_str());
      std::fflush(stderr);
    }
    throw;
  }
}

}  // namespace troupe::actors
