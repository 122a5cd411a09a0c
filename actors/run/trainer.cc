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
#include "actors/roles/grad_slots.h"
#include "actors/roles/observers.h"
#include "actors/roles/roles.h"
#include "actors/run/checkpoint.h"
#include "actors/run/elastic.h"
#include "actors/run/run_layout.h"
#include "actors/run/run_plan.h"
#include "actors/run/train_log.h"
#include "actors/run/worker_spawn.h"
#include "actors/schedules/schedule.h"
#include "kernels/backend.h"
#include "kernels/host_memory.h"
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
    // The workers' ring, flat or by host; auto for the schedules without the allreduce key.
    const auto* all = o.schedule.allreduce();
    *reduction = planReduction(all ? all->across() : Allreduce::kAuto, hosts, rank);
    if (rank == 0) {
      spdlog::info("allreduce: {}", reduction->description);
      if (const int zero = o.schedule.zeroStage(); zero > 0) {
        spdlog::info(
            "zero_stage {}: each of {} workers holds the optimizer's state{} of its shard, about "
            "{} of the {} parameters; gradients reduce-scattered{}, weights all-gathered",
            zero, nodes, zero > 1 ? " and the gradients' sums" : "",
            (num_params + nodes - 1) / nodes, num_params,
            zero > 1 ? fmt::format(" from {} bucket slots", kGradSlots) : "");
      }
    }
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

// A parameter-server process: one Server actor owning a shard of the keys. `weights`: the whole
// model's; `state`: the optimizer's of the shard's keys alone (a resumed checkpoint's columns,
// stateColumnsOf), or undefined.
TrainResult runServer(const TrainOptions& o, int rank, int nodes, const StepPlan& plan,
                      const kernels::LrPolicy& lr, const kernels::OptimizerSettings& optimizer,
                      std::int64_t num_params, kernels::Tensor weights, kernels::Tensor state,
                      const std::string& resumed_from, const std::shared_ptr<RunMembers>& members) {
  const int workers = o.num_shards;
  const auto shard =
      serverShards(num_params, o.num_servers, optimizer)[static_cast<std::size_t>(o.shard_id)];
  ServerConfig config;
  config.index = o.shard_id;
  config.num_workers = workers;
  const ParameterServers& servers = *o.schedule.servers();
  config.mode = servers.mode;
  config.compression = compressionOf(o);
  config.staleness = servers.staleness;
  config.key_begin = shard.first;
  config.key_end = shard.second;
  config.initial_weights = kernels::Tensor::hostUninitialized({shard.second - shard.first});
  std::copy_n(weights.f32() + shard.first, shard.second - shard.first,
              config.initial_weights.f32());
  config.initial_state = state;  // a resumed checkpoint's columns of the keys (stateColumnsOf)
  // Its shard copied: this process holds the whole model's weights and state no longer (the
  // caller moved them here), and the server lets go of its copies once it has its own.
  weights = state = kernels::Tensor();
  config.optimizer = optimizer.within(shard.first, shard.second);
  config.lr = lr;
  config.first_step = plan.first_step;
  config.chief = RunLayout::coordinator(0);
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
  system->spawn(makeServer(fmt::format("server/{}", o.shard_id), std::move(config)),
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

// The model's part of the plan, from one net built here on the CPU: the initial weights and
// the size of everything, the optimizer's ranges, the memory checks, MFU's peak, and how GPU
// replicas compute.
void planModel(const TrainOptions& o, ProcessPlan& p) {
  const kernels::NetOptions& net = p.net;
  const bool server = p.server;
  auto init_backend = kernels::makeCpuBackend(1);
  kernels::NetOptions probe = net;
  probe.max_batch = 1;
  probe.pipeline = {};       // the same weights; a pipeline is checked, not built
  probe.given_grads = true;  // it runs no backward
  auto init_net = kernels::makeNet(*init_backend, probe);
  if (net.pipeline.stages > 1) {
    kernels::NetOptions smallest = net;  // the replica with the smallest share of the batch
    smallest.max_batch = *std::min_element(p.shares.begin(), p.shares.end());
    kernels::checkPipeline(
        *init_net, smallest,
        kernels::Device{o.gpus.empty() ? kernels::DeviceKind::kCpu : kernels::DeviceKind::kCuda,
                        0});
  }
  p.weights = init_net->weights();  // host memory, which outlives the net: not copied
  p.has_buffers = init_net->buffers().numel() > 0;
  const std::int64_t num_params = p.num_params = init_net->numParams();
  p.optimizer = o.optimizer;
  if (o.no_wd) p.optimizer.no_decay = kernels::noDecayRanges(init_net->params());
  p.optimizer.layers = kernels::paramRanges(init_net->params());
  kernels::makeOptimizer(*init_backend, 0, o.optimizer);  // refused here, not in an actor
  if (net.pipeline.stage >= 0) {
    p.stage_ranges = kernels::pipelineParamRanges(*init_net, net.pipeline.stages);
    p.stage_windows = kernels::pipelineStageWindows(*init_net, net.pipeline.stages);
    if (p.has_buffers)
      p.stage_buffer_ranges = kernels::pipelineBufferRanges(*init_net, net.pipeline.stages);
  }
  if (!server) {
    const auto columns = stateColumnsOf(o, p);
    p.memory_estimate = checkModelMemory(
        o, *init_net, p.shares, p.net.pipeline,
        columns && !p.stage_ranges.empty() ? columns->second - columns->first : -1);
  } else {
    const auto keys =
        serverShards(num_params, o.num_servers, p.optimizer)[static_cast<std::size_t>(o.shard_id)];
    p.memory_estimate = checkServerMemory(o, keys.second - keys.first, p.workers);
  }
  // MFU where the peak is this process's cores': a run of one CPU process.
  p.model_flops_per_sample = init_net->trainingFlopsPerSample();
  if (!server && p.workers == 1 && o.gpus.empty() && p.model_flops_per_sample > 0) {
    p.peak_flops = kernels::cpuSgemmPeak(p.threads);
    const bool tokens = o.block_size > 0;
    spdlog::info(
        "MFU: {:.4g} MFLOP {} in training, of this machine's sgemm: {:.1f} GFLOP/s on "
        "{} thread(s)",
        p.model_flops_per_sample / static_cast<double>(tokens ? o.block_size : 1) / 1e6,
        tokens ? "a token" : "an input", p.peak_flops / 1e9, p.threads);
  }
  // How GPU replicas compute: the precision, and the images' layout, which the model decides too.
  p.net.precision = precisionOf(o);
  p.net.channels_last = channelsLastOf(o, init_net->channelsLastMisfit());
  if (!o.gpus.empty() && !server &&
      (o.precision != kernels::DType::kFloat32 || p.net.channels_last))
    spdlog::info("precision: {}", describePrecision(o, p.net.channels_last));
  p.net.graphs = cudaGraphsOf(o);
  if (o.cuda_graphs == true && !server && !p.net.graphs)
    spdlog::warn("cuda_graphs: {}", describeCudaGraphs(o));
  init_net.reset();
}

// Where the plan starts: a resumed checkpoint's step and state, or, in an elastic run's
// generation, this process's own state. False when the checkpoint holds the run's last step:
// nothing is left to train.
bool startFrom(const TrainOptions& o, GenerationRole* role, ProcessPlan& p) {
  StepPlan& plan = p.plan;
  p.checkpoint_dir = checkpointDir(o);
  // A parameter server or a ZeRO worker reads its own columns of the saved state alone.
  const auto resumed =
      role ? std::nullopt
           : findResume(o, p.checkpoint_dir, p.num_params, plan, stateColumnsOf(o, p));
  p.resumed_from = resumed ? resumed->path : std::string();
  if (resumed) {
    const auto& ck = resumed->checkpoint;
    const std::string& path = resumed->path;
    checkResumable(*resumed, p.num_params, plan, p.optimizer);
    plan.start(ck.metaInt("step"), o.num_epochs);
    if (plan.first_step >= plan.last_step && resumed->latest) {
      // The run already ended (a restart after its last checkpoint): every process sees the
      // same checkpoint and stops here.
      spdlog::info("checkpoint {} holds the run's last step {}: nothing left to train", path,
                   plan.first_step);
      return false;
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
  return true;
}

// The plan stage; with `role`, for one generation of an elastic run (actors/run/elastic.h).
ProcessPlan planProcess(const TrainOptions& o, GenerationRole* role) {
  checkProcessOptions(o);
  ProcessPlan p;
  const bool server = p.server = o.role == ProcessRole::kServer;
  const int workers = p.workers = o.num_shards;
  p.ps = o.schedule.servers() != nullptr;
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
  const int stages = o.pipeline.stages;
  const bool stage_processes =
      !server && stages > 1 && o.pipeline.placement == kernels::StagePlacement::kProcesses;
  p.data_workers = stage_processes ? workers / stages : workers;
  p.data_rank = stage_processes ? p.rank / stages : p.rank;
  p.plan = stepPlan(o, p.data_workers, train_size);
  StepPlan& plan = p.plan;
  if (role) {
    plan.startAt(role->start.step, role->start.epoch, role->start.epoch_records, o.num_epochs);
    role->last_step = plan.last_step;
  } else {
    plan.start(0, o.num_epochs);
  }
  p.lr = lrPolicy(o, plan.steps_per_epoch);

  p.net = netOptions(o, *std::max_element(p.shares.begin(), p.shares.end()));
  if (stage_processes) p.net.pipeline.stage = p.rank % stages;
  planModel(o, p);
  p.nothing_left = !startFrom(o, role, p);
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
  std::shared_ptr<kernels::StageLink> stage_link;  // pipeline_across processes
  std::shared_ptr<GradSlots> grad_slots;           // zero_stage 2
};

WorkerActors spawnWorker(const TrainOptions& o, const ProcessPlan& p, GenerationRole* role,
                         RunControl* control, TrainLog* chief_log, TrainResult& result,
                         Trace* trace_ptr, const std::shared_ptr<RunMembers>& members) {
  const RunLayout layout(p.workers, p.nodes - p.workers, o.replicas);
  if (control != nullptr) {
    control->servers.store(layout.servers());
    control->workers.store(layout.workers());
  }
  const WorkerAddresses a = addressesOf(layout, p.rank, p.workers, p.nodes, o.replicas);
  // A run at a rendezvous joins it even alone (troupe launch -n 1): observers find it there.
  auto node = makeNodeSystem(p.rank, 2, p.nodes > 1 || !o.rendezvous.empty());
  const RoleContext context = roleContext(o, trace_ptr, p.plan.steps_per_epoch, members);
  std::shared_ptr<kernels::StageLink> stage_link;
  if (p.net.pipeline.stage >= 0) {  // this pipeline's stages: workers first .. first + K - 1
    const int stages = o.pipeline.stages, first = p.rank - p.net.pipeline.stage;
    std::vector<Address> at;
    std::vector<int> workers;
    for (int s = 0; s < stages; ++s) {
      at.push_back(layout.stage(first + s));
      workers.push_back(first + s);
    }
    stage_link = makeStageLink(*node.system, std::move(at), std::move(workers),
                               context.peer_timeout, context.stall_warning);
  }
  const WorkerSpawn spawn{o,
                          p,
                          layout,
                          a,
                          role,
                          context,
                          o.schedule.nccl() ? std::make_shared<NcclGroup>() : nullptr,
                          std::make_shared<ReductionPlan>(),
                          stage_link,
                          control,
                          chief_log,
                          &result,
                          gradSlotsOf(o, p)};
  // The schedule's roles, each where the layout (that every process computes alike) places it.
  for (const RoleSpawn& r : workerRolesOf(o.schedule, spawn))
    TROUPE_ENFORCE_EQ(node.system->spawn(r.make(), r.thread), r.at);
  return WorkerActors{std::move(node), spawn.reduction, spawn.nccl, stage_link, spawn.grad_slots};
}

// With max_memory: what this process's tensors peaked at since the run's actors were made,
// beside what its plan estimated (checkModelMemory, checkServerMemory).
void logMemoryPeak(const TrainOptions& o, std::int64_t estimate) {
  if (o.max_memory <= 0) return;
  const auto peak = kernels::HostTensorMemory::peak();
  spdlog::info(
      "memory: this process's tensors peaked at {} bytes ({}), estimated {} bytes ({}); "
      "max_memory {} ({})",
      peak, memorySize(static_cast<double>(peak)), estimate,
      memorySize(static_cast<double>(estimate)), o.max_memory,
      memorySize(static_cast<double>(o.max_memory)));
}

// With max_memory: this process's tensors held to it while the run's process lasts
// (HostTensorMemory::setLimit), so that an estimate that admitted a run short of what it holds
// stops it by an error naming the tensor, not by the host's out-of-memory killer.
class MemoryLimit {
 public:
  MemoryLimit(const TrainOptions& o, std::int64_t estimate) {
    if (o.max_memory <= 0) return;
    kernels::HostTensorMemory::setLimit(
        o.max_memory,
        fmt::format("max_memory {} ({}), which this process's estimate of {} bytes ({}) admitted: "
                    "troupe's estimate counted short (please report it with this command; a "
                    "larger max_memory lets the run go on)",
                    o.max_memory, memorySize(static_cast<double>(o.max_memory)), estimate,
                    memorySize(static_cast<double>(estimate))));
  }
  ~MemoryLimit() { kernels::HostTensorMemory::setLimit(0, ""); }
  MemoryLimit(const MemoryLimit&) = delete;
  MemoryLimit& operator=(const MemoryLimit&) = delete;
};

// One process of the run, in stages: plan (planProcess), the server's run or the worker's
// log and spawn (spawnWorker), rendezvous (joinRun), run, finish. With `role`, one generation of
// an elastic run.
TrainResult trainProcess(const TrainOptions& o, GenerationRole* role, RunControl* control) {
  ProcessPlan p = planProcess(o, role);
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

  kernels::HostTensorMemory::resetPeak();  // the peak of the run's tensors, from here
  const MemoryLimit limit(o, p.memory_estimate);
  const auto members = std::make_shared<RunMembers>(p.workers, o.num_servers);
  if (p.server) {
    TrainResult served = runServer(o, rank, nodes, p.plan, p.lr, p.optimizer, p.num_params,
                                   std::move(p.weights), std::move(p.state), resumed_from, members);
    logMemoryPeak(o, p.memory_estimate);
    return served;
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
      slot = std::make_unique<TrainLog>(o.log_dir, experimentId(o), o.parameters,
                                        o.skip_bad_records, o.block_size > 0);
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
  auto [node, reduction, nccl, stage_link, grad_slots] =
      spawnWorker(o, p, role, control, chief_log, result, trace.get(), members);
  // The actors' configs hold the weights and state to start from: the plan need not (the updater
  // copies them and lets go, so they are not held twice through the run).
  p.weights = p.state = kernels::Tensor();
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
  // A run that fails ends the pipeline stage's waits on the others (its replica's thread waits
  // in them). Stages run on the CPU: no NCCL group shares the hook.
  if (stage_link) system->onFailure([link = stage_link] { link->abort(); });
  // Likewise the backward's wait for a gradient slot (zero_stage 2: on the CPU, no stages).
  if (grad_slots) system->onFailure([slots = grad_slots] { slots->abort(); });

  system->run();
  logMemoryPeak(o, p.memory_estimate);
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
