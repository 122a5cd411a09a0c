#include "actors/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include "actors/checkpoint.h"
#include "actors/cluster.h"
#include "actors/messages.h"
#include "actors/peer.h"
#include "actors/roles.h"
#include "actors/run_id.h"
#include "actors/system.h"
#include "actors/topology.h"
#include "actors/trace.h"
#include "actors/train_log.h"
#include "kernels/backend.h"
#include "rendezvous/store.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;

// Seconds from a config value, as milliseconds.
std::chrono::milliseconds milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

bool isParameterServerSchedule(const std::string& schedule) {
  return schedule == "dist_sync" || schedule == "dist_async" || schedule == "ssp";
}

void validateSchedule(const TrainOptions& o) {
  const auto& schedule = o.schedule;
  if (schedule == "local") {
    if (o.num_shards > 1 || o.num_servers > 0) {
      throw InputError(
          fmt::format("schedule 'local' runs in one process, and this run has {} "
                      "worker(s) and {} server(s); use bsp-allreduce, dist_sync, "
                      "dist_async or ssp",
                      o.num_shards, o.num_servers));
    }
    return;
  }
  if (schedule == "bsp-allreduce") {
    if (o.num_servers > 0) {
      throw InputError(
          fmt::format("schedule 'bsp-allreduce' has no parameter servers, and this "
                      "run has {}; drop -s or use dist_sync",
                      o.num_servers));
    }
    return;
  }
  if (isParameterServerSchedule(schedule)) {
    if (o.num_servers < 1) {
      throw InputError(
          fmt::format("schedule '{}' needs parameter servers: troupe launch -s 1 (or "
                      "--num_servers)",
                      schedule));
    }
    if (schedule == "ssp" && o.staleness < 0) throw InputError("staleness must be >= 0");
    return;
  }
  if (schedule == "device") {
    throw InputError(
        "schedule 'device' sums gradients on a GPU, and this build has no CUDA "
        "backend; use schedule 'local'");
  }
  throw InputError(
      fmt::format("unknown schedule '{}' (known: local, device, bsp-allreduce, "
                  "dist_sync, dist_async, ssp)",
                  schedule));
}

// All hardware threads, shared out among the run's processes on this host (troupe launch says how
// many there are in TROUPE_LOCAL_SIZE, mpirun in OMPI_COMM_WORLD_LOCAL_SIZE).
int defaultThreads() {
  int local = 1;
  for (const char* var : {"TROUPE_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) {
      local = std::atoi(v);
      break;
    }
  }
  const int hardware = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::max(1, hardware / local);
}

// Each replica's share of the global batch, as MXNet's work_load_list splits it.
std::vector<std::int64_t> splitBatch(std::int64_t batch, int replicas,
                                     const std::vector<double>& work_load) {
  std::vector<double> w = work_load;
  if (w.empty()) w.assign(static_cast<std::size_t>(replicas), 1.0);
  if (static_cast<int>(w.size()) != replicas) {
    throw InputError(
        fmt::format("work_load_list has {} entries for {} replicas", w.size(), replicas));
  }
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  for (double x : w) {
    if (!(x > 0)) throw InputError("work_load_list entries must be positive");
  }
  std::vector<std::int64_t> shares;
  std::int64_t given = 0;
  for (double x : w) {
    shares.push_back(static_cast<std::int64_t>(std::floor(static_cast<double>(batch) * x / total)));
    given += shares.back();
  }
  for (std::size_t i = 0; given < batch; i = (i + 1) % shares.size(), ++given)
    ++shares[i];
  for (std::size_t i = 0; i < shares.size(); ++i) {
    if (shares[i] == 0) {
      throw InputError(fmt::format("batch_size {} leaves replica {} with no inputs", batch, i));
    }
  }
  return shares;
}

// The input batches in flight (prefetch per reader; the readers share the batch) must fit in the
// host's memory: checked before any is allocated, so that too large a batch_size is one error
// naming it, not std::bad_alloc in an actor. A lower bound: the nets' activations come on top.
void checkBatchMemory(const TrainOptions& o) {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return;
  const double host = static_cast<double>(pages) * static_cast<double>(page);
  const double input =
      4.0 * (static_cast<double>(o.num_channels) * o.image_size * o.image_size + 1);  // + label
  const double need = static_cast<double>(o.prefetch) * static_cast<double>(o.batch_size) * input;
  if (need > host) {
    throw InputError(fmt::format(
        "batch_size {} needs {:.0f} bytes ({:.1f} GiB) for the input batches in flight (prefetch "
        "{} x {} inputs of {}x{}x{} floats and a label), more than the {:.0f} bytes ({:.1f} GiB) "
        "of memory this host has",
        o.batch_size, need, need / (1 << 30), o.prefetch, o.batch_size, o.num_channels,
        o.image_size, o.image_size, host, host / (1 << 30)));
  }
}

void ensureWritableDir(const std::string& dir, const char* what) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string probe = dir + "/.troupe-write-test";
  std::FILE* f = ec ? nullptr : std::fopen(probe.c_str(), "w");
  if (!f) throw IoError(fmt::format("{} folder '{}' is not writable", what, dir));
  std::fclose(f);
  fs::remove(probe, ec);
}

std::string experimentId(const TrainOptions& o) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &tm);
  const std::string name =
      !o.run_name.empty() ? o.run_name : (o.model.name.empty() ? "custom" : o.model.name);
  return fmt::format("{}_cpu{}_b{}_L{}_lr{:.2f}_{}", name, o.replicas, o.batch_size, o.num_labels,
                     o.base_learning_rate, stamp);
}

kernels::LrPolicy lrPolicy(const TrainOptions& o, std::int64_t steps_per_epoch) {
  kernels::LrPolicy lr;
  lr.policy = o.lr_policy;
  lr.base = o.base_learning_rate;
  lr.gamma = o.gamma;
  auto steps = [&](double epochs) {
    return static_cast<std::int64_t>(std::llround(epochs * static_cast<double>(steps_per_epoch)));
  };
  lr.stepsize = steps(o.lr_step_epochs);
  for (double e : o.lr_milestones)
    lr.stepvalues.push_back(steps(e));
  lr.max_steps = o.num_epochs * steps_per_epoch;
  lr.warmup_steps = steps(o.warmup_epochs);
  kernels::validate(lr);
  return lr;
}

kernels::CompressionSpec compressionOf(const TrainOptions& o) {
  return {kernels::parseGradientCompression(o.gradient_compression),
          o.gradient_compression_threshold};
}

// Rank 0 publishes its plan; every other rank checks its own against it, so a mismatch (another
// batch size, another dataset, another model) is one clear error instead of a hang mid-epoch.
void agreeOnPlan(rendezvous::Store& store, int rank, int nodes, const StepPlan& plan,
                 std::int64_t num_params, int replicas, const std::string& resumed_from,
                 const kernels::CompressionSpec& compression, const std::string& allreduce,
                 std::chrono::milliseconds timeout) {
  const std::string mine = fmt::format(
      "steps_per_epoch={} global_batch={} first_step={} last_step={} num_params={} "
      "replicas={} resume={} gradient_compression={} allreduce={}",
      plan.steps_per_epoch, plan.global_batch, plan.first_step, plan.last_step, num_params,
      replicas, resumed_from.empty() ? "none" : fs::path(resumed_from).filename().string(),
      kernels::describe(compression), allreduce);
  if (rank == 0) store.set("plan", mine);
  const std::string chief = store.get("plan", timeout);
  if (chief != mine) {
    // Name what differs first: "gradient_compression: rank 0 has fp16, this one none".
    std::vector<std::string> ours, theirs, differ;
    for (auto [text, words] : {std::pair{&mine, &ours}, std::pair{&chief, &theirs}}) {
      std::istringstream in(*text);
      for (std::string w; in >> w;)
        words->push_back(w);
    }
    for (std::size_t i = 0; i < ours.size() && i < theirs.size(); ++i) {
      if (ours[i] == theirs[i]) continue;
      const auto eq = ours[i].find('=');
      differ.push_back(fmt::format("{}: rank 0 has {}, this one {}", ours[i].substr(0, eq),
                                   theirs[i].substr(eq + 1), ours[i].substr(eq + 1)));
    }
    // The usual cause of a differing resume: checkpoints on a disk of rank 0's host only.
    const std::string hint =
        chief.find("resume=none") == std::string::npos &&
                mine.find("resume=none") != std::string::npos
            ? ". Only rank 0 writes checkpoints: put checkpoint_dir on storage every host sees "
              "(NFS), or copy rank 0's checkpoint there, for a restarted run to resume"
            : "";
    throw InputError(
        fmt::format("rank {} of {} disagrees with rank 0 on the run ({}): rank 0 has '{}', "
                    "this one '{}'{}",
                    rank, nodes, fmt::join(differ, "; "), chief, mine, hint));
  }
}

// The actor system of node `rank`: sends to other nodes go through the cluster, once joined.
struct NodeSystem {
  std::shared_ptr<Cluster*> cluster = std::make_shared<Cluster*>(nullptr);
  std::unique_ptr<ActorSystem> system;
};

NodeSystem makeNodeSystem(int rank, int pool_threads, bool multi_process) {
  NodeSystem n;
  SystemOptions options;
  options.node = static_cast<std::uint32_t>(rank);
  options.pool_threads = pool_threads;
  if (multi_process) {
    options.remote = [cluster = n.cluster](Address from, Address to,
                                           std::unique_ptr<Envelope> message) {
      (*cluster)->send(from, to, std::move(message));
    };
    options.remote_buffer = [cluster = n.cluster](Address to, kernels::Shape shape) {
      return *cluster ? (*cluster)->sharedBuffer(to, std::move(shape)) : kernels::Tensor();
    };
  }
  n.system = makeActorSystem(options);
  return n;
}

// Joins the run's other processes (every actor of this one already spawned), checks that all
// agree on the plan, and fills in where the members are.
std::unique_ptr<Cluster> joinRun(const TrainOptions& o, int rank, int nodes, Trace* trace,
                                 NodeSystem& node, const StepPlan& plan, std::int64_t num_params,
                                 const std::string& resumed_from, RunMembers& members,
                                 ReductionPlan* reduction) {
  ClusterOptions c;
  c.rank = rank;
  c.world = nodes;
  c.run_id = generationRunId(o.run_id, o.generation);
  c.rendezvous = o.rendezvous;
  c.serve_store = o.serve_store;
  c.interface = o.interface;
  c.secret = o.secret;
  c.connections_per_peer = o.connections_per_peer;
  // The heartbeat watch is the backstop for a peer nobody waits on: it comes after the actors'
  // own watches (peerTimeoutGrace), which name the peer, the step and what they waited for.
  const auto stall_warning = milliseconds(o.stall_warning_s);
  const auto peer_timeout = milliseconds(o.peer_timeout_s);
  c.peer_timeout = peer_timeout + 2 * peerTimeoutGrace(stall_warning, peer_timeout) +
                   std::chrono::milliseconds(1000);  // + the transport's heartbeat interval
  c.trace = trace;
  c.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.rendezvous_timeout_s * 1000));
  c.on_peer_lost = [&system = *node.system, &members](int peer, const std::string& address,
                                                      const std::string& why) {
    system.fail(std::make_exception_ptr(
        lostLinkError(members.ofNode(static_cast<std::uint32_t>(peer), address), why)));
  };
  auto cluster = joinCluster(c, *node.system);
  *node.cluster = cluster.get();
  agreeOnPlan(cluster->store(), rank, nodes, plan, num_params, o.replicas, resumed_from,
              compressionOf(o), o.allreduce, c.timeout);
  members.setAddresses(cluster->addresses());
  if (reduction) {
    const auto hosts =
        groupHosts(exchangeHostKeys(cluster->store(), rank, o.num_shards, c.timeout));
    *reduction = planReduction(o.allreduce, hosts, rank);
    if (rank == 0) spdlog::info("allreduce: {}", reduction->description);
  }
  return cluster;
}

// What a run continues from.
struct Resumed {
  std::string path;
  Checkpoint checkpoint;
  bool latest = false;  // found in the checkpoint folder, not named by the user
};

// `resume` as given, or (with "auto", and in every restarted generation) the newest complete
// checkpoint of this run in the checkpoint folder that fits this run's model and steps. A
// restarted generation whose run has no checkpoint yet falls back on an explicit `resume`, else
// starts from scratch (nullopt).
std::optional<Resumed> findResume(const TrainOptions& o, const std::string& dir,
                                  std::int64_t num_params, const StepPlan& plan) {
  if (o.resume == "auto" || o.generation > 0) {
    auto found = findLatestCheckpoint(dir, [&](const auto& meta) -> std::string {
      auto get = [&](const char* key) {
        const auto it = meta.find(key);
        return it == meta.end() ? std::string() : it->second;
      };
      auto name = [](const std::string& id) { return id.empty() ? "(none)" : id; };
      if (get("run_id") != o.run_id) {
        return fmt::format("it belongs to run_id {}, this run's is {}", name(get("run_id")),
                           name(o.run_id));
      }
      if (get("num_params") != std::to_string(num_params)) {
        return fmt::format("it holds {} parameters, this model has {}", get("num_params"),
                           num_params);
      }
      if (get("global_batch") != std::to_string(plan.global_batch) ||
          get("steps_per_epoch") != std::to_string(plan.steps_per_epoch)) {
        return fmt::format(
            "it was written with global batch {} and {} steps per epoch, this run has {} and {}",
            get("global_batch"), get("steps_per_epoch"), plan.global_batch, plan.steps_per_epoch);
      }
      return {};
    });
    if (found) return Resumed{found->path, std::move(found->checkpoint), true};
    if (o.resume.empty() || o.resume == "auto") {
      spdlog::info("no complete checkpoint of this run in '{}' yet: starting from scratch", dir);
      return std::nullopt;
    }
  }
  if (o.resume.empty()) return std::nullopt;
  return Resumed{o.resume, loadCheckpoint(o.resume), false};
}

// A parameter-server process: one Server actor owning a shard of the keys.
TrainResult runServer(const TrainOptions& o, int rank, int nodes, const StepPlan& plan,
                      const kernels::LrPolicy& lr, std::int64_t num_params,
                      const kernels::Tensor& weights, const kernels::Tensor& momentum,
                      const std::string& resumed_from, const std::shared_ptr<RunMembers>& members) {
  const int workers = o.num_shards;
  const auto shard = shardKeys(num_params, o.num_servers)[static_cast<std::size_t>(o.shard_id)];
  ServerConfig config;
  config.index = o.shard_id;
  config.num_workers = workers;
  config.mode = o.schedule;
  config.compression = compressionOf(o);
  config.staleness = o.staleness;
  config.key_begin = shard.first;
  config.key_end = shard.second;
  config.initial_weights = weights.slice(shard.first, shard.second);
  if (momentum.defined() && momentum.numel() > 0) {
    config.initial_momentum = momentum.slice(shard.first, shard.second);
  }
  config.sgd = o.sgd;
  config.lr = lr;
  config.first_step = plan.first_step;
  config.threads = o.threads > 0 ? o.threads : defaultThreads();
  config.stall_warning = milliseconds(o.stall_warning_s);
  config.peer_timeout = milliseconds(o.peer_timeout_s);
  config.steps_per_epoch = plan.steps_per_epoch;
  config.members = members;
  std::unique_ptr<Trace> trace;
  if (!o.trace.empty()) {
    trace = std::make_unique<Trace>(static_cast<std::uint32_t>(rank),
                                    fmt::format("server {}", o.shard_id));
  }
  config.trace = trace.get();

  auto node = makeNodeSystem(rank, 1, true);
  auto& system = node.system;
  system->spawn(makeServer(fmt::format("server/{}", o.shard_id), config),
                SpawnOptions{.thread = "server"});
  auto cluster =
      joinRun(o, rank, nodes, trace.get(), node, plan, num_params, resumed_from, *members, nullptr);
  spdlog::info("server {} of {} owns keys [{}, {})", o.shard_id, o.num_servers, shard.first,
               shard.second);
  system->run();
  if (trace) trace->write(Trace::partPath(o.trace, static_cast<std::uint32_t>(rank)));
  cluster->finish();
  return TrainResult{};
}

TrainResult trainProcess(const TrainOptions& o) {
  validateSchedule(o);
  compressionOf(o);  // an unknown name fails here, before any rendezvous
  const bool server = o.role == "server";
  if (!server && o.role != "worker") {
    throw InputError(fmt::format("role '{}' is neither worker nor server", o.role));
  }
  const int workers = o.num_shards;
  const int shards_of_role = server ? o.num_servers : workers;
  if (o.shard_id < 0 || o.shard_id >= shards_of_role) {
    throw InputError(
        fmt::format("shard_id {} is not one of the {} {}(s)", o.shard_id, shards_of_role, o.role));
  }
  const bool ps = isParameterServerSchedule(o.schedule);
  // Node ids: workers 0 .. W-1, then servers W .. W+S-1. Worker 0 is the chief.
  const int nodes = workers + o.num_servers;
  const int rank = server ? workers + o.shard_id : o.shard_id;
  const bool chief = rank == 0;
  if (o.replicas < 1) throw InputError("replicas must be at least 1");
  if (o.batch_size < 1) throw InputError("batch_size must be at least 1");
  if (o.num_epochs < 1) throw InputError("num_epochs must be at least 1");
  if (o.train_data.empty()) throw InputError("no training data: set train_data");
  if (o.prefetch < 1) throw InputError("prefetch must be at least 1");
  if (o.generation < 0) throw InputError("generation must be at least 0");
  const auto shares = splitBatch(o.batch_size, o.replicas, o.work_load_list);
  checkBatchMemory(o);
  const int threads = o.threads > 0 ? o.threads : defaultThreads();

  data::DatasetOptions train;
  train.path = o.train_data;
  train.type = o.db_type;
  train.channels = o.num_channels;
  train.height = train.width = o.image_size;
  train.num_labels = o.num_labels;
  train.mean = o.mean;
  train.scale = o.scale;
  data::DatasetOptions test = train;
  test.path = o.test_data;

  const std::int64_t train_size = data::openDataset(train)->size();
  if (!o.test_data.empty()) data::openDataset(test);
  const std::int64_t epoch_size = o.epoch_size > 0 ? o.epoch_size : train_size;
  // Every process computes the same plan from the same flags and data; rank 0's is checked
  // against the others' through the store before any step (see the cluster below).
  StepPlan plan;
  plan.global_batch = o.batch_size * workers;
  plan.steps_per_epoch = epoch_size / plan.global_batch;
  if (plan.steps_per_epoch < 1) {
    throw InputError(fmt::format("epoch_size {} is smaller than the global batch {}", epoch_size,
                                 plan.global_batch));
  }
  plan.last_step = o.num_epochs * plan.steps_per_epoch;
  const auto lr = lrPolicy(o, plan.steps_per_epoch);

  kernels::NetOptions net;
  net.model = o.model;
  net.channels = o.num_channels;
  net.height = net.width = o.image_size;
  net.num_labels = o.num_labels;
  net.max_batch = *std::max_element(shares.begin(), shares.end());
  net.seed = o.seed;

  // The initial weights (and the size of everything): one net built here, on the CPU.
  auto init_backend = kernels::makeCpuBackend(1);
  kernels::NetOptions probe = net;
  probe.max_batch = 1;
  auto init_net = kernels::makeNet(*init_backend, probe);
  UpdaterConfig updater;
  updater.initial_weights = kernels::Tensor::host({init_net->numParams()});
  init_backend->copy(init_net->weights(), updater.initial_weights);
  const bool has_buffers = init_net->buffers().numel() > 0;
  const std::int64_t num_params = init_net->numParams();
  init_net.reset();

  const std::string checkpoint_dir = o.checkpoint_dir.empty() ? o.log_dir : o.checkpoint_dir;
  CoordinatorConfig coordinator;
  const auto resumed = findResume(o, checkpoint_dir, num_params, plan);
  const std::string resumed_from = resumed ? resumed->path : std::string();
  if (resumed) {
    const auto& ck = resumed->checkpoint;
    const std::string& path = resumed->path;
    if (ck.weights.numel() != num_params) {
      throw InputError(fmt::format("checkpoint '{}' holds {} parameters; this model has {}", path,
                                   ck.weights.numel(), num_params));
    }
    if (ck.metaInt("global_batch") != plan.global_batch ||
        ck.metaInt("steps_per_epoch") != plan.steps_per_epoch) {
      throw InputError(fmt::format(
          "checkpoint '{}' was written with batch_size {} and {} steps per epoch; this run has "
          "{} and {}: resume with the same batch_size and epoch_size",
          path, ck.metaInt("global_batch"), ck.metaInt("steps_per_epoch"), plan.global_batch,
          plan.steps_per_epoch));
    }
    plan.first_step = ck.metaInt("step");
    if (plan.first_step >= plan.last_step && resumed->latest) {
      // The run already ended (a restart after its last checkpoint): every process sees the
      // same checkpoint and stops here.
      spdlog::info("checkpoint {} holds the run's last step {}: nothing left to train", path,
                   plan.first_step);
      TrainResult done;
      done.resumed_from = path;
      done.steps = plan.first_step;
      return done;
    }
    if (plan.first_step >= plan.last_step) {
      throw InputError(
          fmt::format("checkpoint '{}' is at step {}, and this run ends at step {}: "
                      "raise num_epochs to train further",
                      path, plan.first_step, plan.last_step));
    }
    updater.initial_weights = ck.weights;
    updater.initial_momentum = ck.momentum;
    if (ck.buffers.numel() > 0) updater.initial_buffers = ck.buffers;
    coordinator.cumulative_time = ck.metaDouble("cumulative_time_spent");
    coordinator.cumulative_inputs = ck.metaInt("cumulative_input_count");
    spdlog::info("resuming from {} at step {}", path, plan.first_step);
  }

  const auto members = std::make_shared<RunMembers>(workers, o.num_servers);
  if (server) {
    return runServer(o, rank, nodes, plan, lr, num_params, updater.initial_weights,
                     updater.initial_momentum, resumed_from, members);
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
    log = std::make_unique<TrainLog>(o.log_dir, experimentId(o), o.parameters, o.skip_bad_records);
    result.log_path = log->path();
    result.experiment_id = log->id();
  }

  // Every process spawns the same actors in the same order, so an address is known everywhere:
  // 0 coordinator, 1 updater, 2 reducer, 3.. replicas, then readers.
  const auto k = static_cast<std::uint32_t>(o.replicas);
  auto address = [](int node, std::uint32_t i) {
    return Address{static_cast<std::uint32_t>(node), i};
  };
  const Address chief_address = address(0, 0);
  const Address updater_address = address(rank, 1);
  const Address reducer_address = address(rank, 2);
  auto replica_address = [&](int node, std::uint32_t r) { return address(node, 3 + r); };
  auto reader_address = [&](std::uint32_t r) { return address(rank, 3 + k + r); };
  std::vector<Address> local_replicas, all_replicas, all_updaters, followers;
  for (std::uint32_t r = 0; r < k; ++r)
    local_replicas.push_back(replica_address(rank, r));
  for (int node = 0; node < workers; ++node) {
    for (std::uint32_t r = 0; r < k; ++r)
      all_replicas.push_back(replica_address(node, r));
    all_updaters.push_back(address(node, 1));
  }
  std::vector<Address> servers;
  for (int node = 1; node < nodes; ++node)
    followers.push_back(address(node, 0));
  for (int node = workers; node < nodes; ++node)
    servers.push_back(address(node, 0));

  std::unique_ptr<Trace> trace;
  if (!o.trace.empty()) {
    trace =
        std::make_unique<Trace>(static_cast<std::uint32_t>(rank), fmt::format("worker {}", rank));
  }
  auto node = makeNodeSystem(rank, 2, nodes > 1);
  auto& system = node.system;
  // Compute actors get threads of their own, so their OpenMP teams stay put; the updater shares
  // replica 0's (they never compute at once), so a process has one team per replica.
  auto computeThread = [](std::uint32_t replica) {
    return SpawnOptions{.thread = fmt::format("compute/{}", replica)};
  };

  coordinator.options = &o;
  coordinator.plan = plan;
  coordinator.lr = lr;
  coordinator.num_replicas = o.replicas * workers;
  coordinator.num_updaters = workers;
  coordinator.has_test = !o.test_data.empty();
  coordinator.has_buffers = has_buffers;
  coordinator.experiment_id = result.experiment_id;
  coordinator.log = log.get();
  coordinator.checkpoint_dir = checkpoint_dir;
  coordinator.num_params = num_params;
  coordinator.step_timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(o.step_timeout_s * 1000));
  coordinator.replicas = all_replicas;
  coordinator.updaters = all_updaters;
  coordinator.followers = followers;
  coordinator.result = &result;
  TROUPE_ENFORCE_EQ(system->spawn(chief ? makeCoordinator("coordinator", coordinator)
                                        : makeFollower("coordinator")),
                    address(rank, 0));

  updater.worker = rank;
  updater.sgd = o.sgd;
  updater.lr = lr;
  updater.plan = plan;
  // It computes on replica 0's thread, with replica 0's team: a bigger one would spin on the
  // cores of the other replicas.
  updater.threads = std::max(1, threads / o.replicas);
  updater.replicas = local_replicas;
  updater.coordinator = chief_address;
  updater.trace = trace.get();
  if (ps) {
    // The parameter servers update; this worker's PS client stands where the updater would.
    PsClientConfig client;
    client.worker = static_cast<std::uint32_t>(rank);
    client.compression = compressionOf(o);
    client.initial_weights = updater.initial_weights;
    client.servers = servers;
    client.shards = shardKeys(num_params, o.num_servers);
    client.plan = plan;
    client.replicas = local_replicas;
    client.coordinator = chief_address;
    client.trace = trace.get();
    client.stall_warning = milliseconds(o.stall_warning_s);
    client.peer_timeout = milliseconds(o.peer_timeout_s);
    client.members = members;
    TROUPE_ENFORCE_EQ(system->spawn(makePsClient("ps-client", client), computeThread(0)),
                      updater_address);
  } else {
    TROUPE_ENFORCE_EQ(system->spawn(makeUpdater("updater", updater), computeThread(0)),
                      updater_address);
  }
  auto reduction = std::make_shared<ReductionPlan>();  // filled in by joinRun, before run()
  ReducerConfig reducer;
  reducer.num_replicas = o.replicas;
  reducer.threads = 1;
  reducer.updater = updater_address;
  reducer.trace = trace.get();
  reducer.stall_warning = milliseconds(o.stall_warning_s);
  reducer.peer_timeout = milliseconds(o.peer_timeout_s);
  reducer.steps_per_epoch = plan.steps_per_epoch;
  reducer.members = members;
  if (!ps) {  // with parameter servers, the servers sum over workers
    reducer.rank = rank;
    reducer.world = workers;
    reducer.next = address((rank + 1) % workers, 2);
    reducer.compression = compressionOf(o);
    reducer.reduction = reduction;
  }
  // The reducer has a thread of its own: it must take buckets while replica 0 is still in its
  // backward pass, or nothing would overlap. Its work (sums, copies) is light: one thread.
  TROUPE_ENFORCE_EQ(
      system->spawn(makeReducer("reducer", reducer), SpawnOptions{.thread = "reducer"}),
      reducer_address);

  // With a core to spare, readers run on the pool, beside the compute. Without one, a reader
  // woken on the pool takes a computing core at any moment, and the OpenMP team of that core
  // waits for it at its next barrier: it then reads on its replica's thread, between steps
  // (measured on the MLP, 2 threads on 2 cores: a step's reader wake-up cost 30 us of 235 us).
  const bool spare_core = threads < defaultThreads();
  std::int64_t offset = o.batch_size * rank;
  for (std::uint32_t r = 0; r < k; ++r) {
    ReplicaConfig replica;
    replica.index = rank * o.replicas + static_cast<int>(r);
    replica.local_index = static_cast<int>(r);
    replica.num_replicas = o.replicas * workers;
    replica.worker = rank;
    replica.steps_per_epoch = plan.steps_per_epoch;
    replica.net = net;
    replica.threads = std::max(1, threads / o.replicas);
    // Every schedule averages over the global batch: under dist_async and ssp each worker's push
    // is then 1/W of a synchronous step, so a learning rate means the same under every schedule.
    replica.grad_scale = 1.0f / static_cast<float>(plan.global_batch);
    replica.bucket_bytes = static_cast<std::int64_t>(o.bucket_size_mb * (1 << 20));
    replica.first_bucket_bytes = static_cast<std::int64_t>(o.first_bucket_mb * (1 << 20));
    replica.test = test;
    replica.skip_bad_records = o.skip_bad_records;
    replica.reader = reader_address(r);
    // Alone in a one-process run, a replica skips the reducer (and a thread hop per bucket).
    replica.reducer = (k == 1 && nodes == 1) ? updater_address : reducer_address;
    replica.coordinator = chief_address;
    replica.trace = trace.get();
    TROUPE_ENFORCE_EQ(system->spawn(makeReplica(fmt::format("replica/{}", replica.index), replica),
                                    computeThread(r)),
                      replica_address(rank, r));
  }
  for (std::uint32_t r = 0; r < k; ++r) {
    ReaderConfig reader;
    reader.dataset = train;
    reader.seed = o.seed;
    reader.plan = plan;
    reader.offset = offset;
    reader.count = shares[r];
    reader.prefetch = o.prefetch;
    reader.skip_bad_records = o.skip_bad_records;
    reader.replica = replica_address(rank, r);
    offset += shares[r];
    TROUPE_ENFORCE_EQ(
        system->spawn(makeReader(fmt::format("reader/{}", rank * o.replicas + r), reader),
                      spare_core ? SpawnOptions{} : computeThread(r)),
        reader_address(r));
  }

  std::unique_ptr<Cluster> cluster;
  if (nodes > 1) {
    cluster = joinRun(o, rank, nodes, trace.get(), node, plan, num_params, resumed_from, *members,
                      ps ? nullptr : reduction.get());
  }

  system->run();
  if (trace && !cluster) trace->write(o.trace);
  if (trace && cluster) trace->write(Trace::partPath(o.trace, static_cast<std::uint32_t>(rank)));
  if (cluster) cluster->finish();  // the chief's Shutdown reached everyone before links close
  if (trace && cluster && chief) Trace::merge(o.trace, static_cast<std::uint32_t>(nodes));
  return result;
}

}  // namespace

TrainResult runTraining(const TrainOptions& o) {
  try {
    return trainProcess(o);
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
