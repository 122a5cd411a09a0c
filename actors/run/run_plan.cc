#include "actors/run/run_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <thread>

#include "actors/config/config_keys.h"
#include "actors/core/messages.h"
#include "actors/core/peer.h"
#include "actors/schedules/schedule.h"
#include "kernels/cuda_plugin.h"
#include "kernels/flat_params.h"
#include "rendezvous/store.h"
#include "rendezvous/url.h"
#include "rendezvous/value.h"
#include "troupe/error.h"

namespace troupe::actors {

namespace fs = std::filesystem;

// Seconds from a config value, as milliseconds.
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
  n.system = makeRuntime(options);
  return n;
}

ClusterOptions clusterOptions(const TrainOptions& o, const std::string& run_id, int rank, int nodes,
                              Runtime& system, const RunMembers& members) {
  ClusterOptions c;
  c.rank = rank;
  c.world = nodes;
  c.run_id = run_id;
  c.rendezvous = o.rendezvous;
  c.serve_store = o.serve_store;
  c.interface = o.interface;
  c.secret = o.secret;
  c.connections_per_peer = o.connections_per_peer;
  // The heartbeat watch is the backstop for a peer nobody waits on: it comes after the actors'
  // own watches (peerTimeoutGrace), which name the peer, the step and what they waited for.
  const auto stall_warning = fromSeconds(o.stall_warning_s);
  const auto peer_timeout = fromSeconds(o.peer_timeout_s);
  c.peer_timeout = peer_timeout + 2 * peerTimeoutGrace(stall_warning, peer_timeout) +
                   std::chrono::milliseconds(1000);  // + the transport's heartbeat interval
  c.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.rendezvous_timeout_s * 1000));
  c.on_peer_lost = [&system, &members](int peer, const std::string& address,
                                       const std::string& why) {
    system.fail(std::make_exception_ptr(
        lostLinkError(members.ofNode(static_cast<std::uint32_t>(peer), address), why)));
  };
  c.name_of = [&members](int node) {
    return members.ofNode(static_cast<std::uint32_t>(node)).str();
  };
  return c;
}

std::chrono::milliseconds fromSeconds(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

RoleContext roleContext(const TrainOptions& o, Trace* trace, std::int64_t steps_per_epoch,
                        RunMembersPtr members) {
  RoleContext run;
  run.trace = trace;
  run.stall_warning = fromSeconds(o.stall_warning_s);
  run.peer_timeout = fromSeconds(o.peer_timeout_s);
  run.steps_per_epoch = steps_per_epoch;
  run.members = std::move(members);
  return run;
}

ProcessDevices devicesOf(const TrainOptions& o, bool ps, int nodes) {
  ProcessDevices d;
  for (int r = 0; r < o.replicas; ++r) {
    d.replicas.push_back(o.gpus.empty() ? kernels::Device{}
                                        : kernels::Device{kernels::DeviceKind::kCuda,
                                                          o.gpus[static_cast<std::size_t>(r)]});
  }
  const bool on_gpu = !o.gpus.empty() && !ps && o.schedule.info().sums_on_gpu;
  d.reducer = on_gpu ? d.replicas[0] : kernels::Device{};
  d.updater = (o.replicas == 1 && nodes == 1) ? d.replicas[0] : d.reducer;
  return d;
}

std::string describe(const ProcessDevices& d, const TrainOptions& o, bool ps, int nodes) {
  std::vector<std::string> replicas;
  for (const auto& device : d.replicas)
    replicas.push_back(kernels::toString(device));
  if (o.schedule.nccl()) {
    const std::string summed =
        ncclSpansProcesses(o, nodes)
            ? fmt::format("by NCCL over the run's {} GPU(s)", o.replicas * nodes)
            : fmt::format(
                  "by NCCL over this process's {} GPU(s), then by troupe's {} across "
                  "processes",
                  o.replicas,
                  o.schedule.allreduce()->algorithm == Allreduce::kHierarchical
                      ? "hierarchical allreduce"
                      : "ring");
    return fmt::format("replica{} on {}; gradients summed {}, weights updated on {}",
                       replicas.size() == 1 ? "" : "s", fmt::join(replicas, ", "), summed,
                       kernels::toString(d.updater));
  }
  if (o.replicas == 1 && nodes == 1) {
    return fmt::format("replica on {}, weights updated there", replicas[0]);
  }
  const std::string servers = "the parameter servers";
  return fmt::format("replicas on {}; gradients summed on {}, weights updated on {}",
                     fmt::join(replicas, ", "), ps ? servers : kernels::toString(d.reducer),
                     ps ? servers : kernels::toString(d.updater));
}

void validateSchedule(const TrainOptions& o) {
  o.schedule.info().validate(o);
}

namespace {
int launcherLocalSize() {
  for (const char* var : {"TROUPE_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"}) {
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) return std::atoi(v);
  }
  return 0;
}
}  // namespace

int hostCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

bool launcherSharesCores() {
  return launcherLocalSize() > 0;
}

int defaultThreads() {
  return std::max(1, hostCores() / std::max(1, launcherLocalSize()));
}

std::string coreKey() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  cpu_set_t set;
  CPU_ZERO(&set);
  std::string mask;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      mask += CPU_ISSET(c, &set) ? '1' : '0';
    mask.erase(mask.find_last_not_of('0') + 1);
  }
  return fmt::format("{}/{}", boot.empty() ? "unknown" : boot, mask.empty() ? "all" : mask);
}

CoreShare shareCores(const std::vector<std::string>& keys, int rank, int cores) {
  CoreShare share;
  share.cores = std::max(1, cores);
  const auto keyOf = [&](int r) {
    const std::string& text = keys.at(static_cast<std::size_t>(r));
    return text.substr(0, text.rfind(' '));
  };
  const auto askedOf = [&](int r) {
    const std::string& text = keys.at(static_cast<std::size_t>(r));
    return std::atoll(text.c_str() + text.rfind(' ') + 1);
  };
  share.all_asked = true;
  for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
    if (keyOf(r) != keyOf(rank)) continue;
    share.sharers.push_back(r);
    share.asked_here += askedOf(r);
    share.all_asked = share.all_asked && askedOf(r) > 0;
  }
  const int n = static_cast<int>(share.sharers.size());
  const int index = static_cast<int>(std::find(share.sharers.begin(), share.sharers.end(), rank) -
                                     share.sharers.begin());
  share.threads = std::max(1, share.cores / n + (index < share.cores % n ? 1 : 0));
  return share;
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
  const auto d = datasetOptions(o, o.train_data, /*train=*/true);
  const double input = 4.0 * static_cast<double>(d.sampleSize() + d.labelsPerSample());
  const double need = static_cast<double>(o.prefetch) * static_cast<double>(o.batch_size) * input;
  if (need > host) {
    throw InputError(fmt::format(
        "batch_size {} needs {:.0f} bytes ({:.1f} GiB) for the input batches in flight (prefetch "
        "{} x {} inputs of {} values and {} label(s) each), more than the {:.0f} bytes ({:.1f} "
        "GiB) of memory this host has",
        o.batch_size, need, need / (1 << 30), o.prefetch, o.batch_size, d.sampleSize(),
        d.labelsPerSample(), host, host / (1 << 30)));
  }
}

std::string memorySize(double bytes) {
  return bytes < (1 << 30) ? fmt::format("{:.1f} MiB", bytes / (1 << 20))
                           : fmt::format("{:.2f} GiB", bytes / (1 << 30));
}

std::int64_t checkModelMemory(const TrainOptions& o, kernels::Net& whole,
                              const std::vector<std::int64_t>& shares,
                              const kernels::PipelineOptions& pipeline, std::int64_t stage_state) {
  if (o.max_memory <= 0) return 0;
  const std::int64_t num_params = whole.numParams();
  const bool staged = pipeline.stages > 1;
  // Pipeline stages: each stage's gradients (its own and those of the tied weights it reads) for
  // its backward, and their sums over the micro-batches; in a process of its own, its stage's
  // alone, both.
  const double stage_grads =
      staged ? 4.0 * static_cast<double>(kernels::pipelineStageGrads(whole, pipeline)) : 0.0;
  const auto& optimizer = o.optimizer.info();
  // With parameter servers the optimizer's state is theirs, sharded over them, and the servers'
  // answers to a pull (the new weights, decoded) arrive beside the weights they are copied into;
  // with zero_stage 1 each worker holds its shard (an even share: serverShards' cut moves only
  // to a layer bound).
  const bool ps = o.schedule.servers() != nullptr;
  const int sharing = o.schedule.zeroStage() > 0 ? std::max(1, o.num_shards) : 1;
  const double params = 4.0 * static_cast<double>(num_params);
  const double rows = static_cast<double>(optimizer.states.size());
  const double state = ps                 ? params
                       : stage_state >= 0 ? 4.0 * static_cast<double>(stage_state) * rows
                                          : params * rows / sharing;
  const auto replicas = static_cast<double>(shares.size());
  const double sums = pipeline.stage >= 0 ? stage_grads : params;
  double grads = replicas * (sums + stage_grads);
  // zero_stage 2: the replica's gradients in slots a bucket each, and the sums of its shard.
  const bool grad_slots = o.schedule.zeroStage() == 2 && sharing > 1;
  if (grad_slots) {
    const kernels::NetOptions::GradSlots slots{
        kGradSlots, static_cast<std::int64_t>(o.first_bucket_mb * (1 << 20)),
        static_cast<std::int64_t>(o.bucket_size_mb * (1 << 20))};
    grads = replicas * 4.0 * static_cast<double>(kernels::gradSlotLayout(whole, slots).size) +
            params / sharing;
  }
  const kernels::NetMemory memory = whole.memory();
  std::int64_t inputs = 0;
  double activations = 0;
  for (const auto share : shares) {
    inputs += share;
    activations += staged ? static_cast<double>(kernels::pipelineHeld(whole, pipeline, share))
                          : static_cast<double>((memory.held + memory.scratch) * share);
  }
  // A stage's worker holds its stage's weights and the tied ones it reads, the chief too (a
  // checkpoint's weights are put together on disk).
  double weights = params;
  if (pipeline.stage >= 0) {
    const auto windows = kernels::pipelineStageWindows(whole, pipeline.stages);
    weights = 4.0 * static_cast<double>(kernels::FlatParams::count(
                        windows[static_cast<std::size_t>(pipeline.stage)]));
  }
  const double need = weights + state + grads + activations;
  if (need <= static_cast<double>(o.max_memory)) return static_cast<std::int64_t>(need);
  const std::string state_text =
      ps ? fmt::format("{}'s state on the servers, their pull answers {}", optimizer.name,
                       memorySize(state))
         : fmt::format("{}'s {} state row(s) {}{}", optimizer.name, optimizer.states.size(),
                       memorySize(state),
                       stage_state >= 0
                           ? fmt::format(" (of its stage's {} parameters)", stage_state)
                       : sharing > 1 ? fmt::format(" (its shard of {})", sharing)
                                     : "");
  std::string advice =
      ps ? "a smaller model or batch fits (a parameter server's worker holds the whole weights; "
           "pipeline stages in workers of their own split them, under bsp-allreduce)"
      : pipeline.stage >= 0
          ? "more pipeline stages hold less each (--pipeline_stages K, troupe launch -n K), more "
            "pipelines shard each stage's state (--zero_stage 1), or a smaller model or batch fits"
      : sharing > 1 && !grad_slots
          ? "more workers shard the state finer, the gradients' sums sharded too (--zero_stage "
            "2) hold less, or a smaller model or batch fits"
      : sharing > 1
          ? "more workers shard the state and gradients finer, or a smaller model or batch fits"
          : "the optimizer's state sharded over the workers (--zero_stage 1 with bsp-allreduce, "
            "troupe launch -n N) or held by parameter servers (--schedule dist_sync, troupe "
            "launch -s N), the layers split over pipeline stages in workers of their own "
            "(--pipeline_stages K --pipeline_across processes with bsp-allreduce, troupe launch "
            "-n K), or a smaller model or batch fits";
  if (activations > weights + state + grads) {  // most of it: a batch's activations
    advice = fmt::format("{} hold fewer activations at once, {}",
                         staged ? "more micro-batches (--micro_batches)"
                                : "pipeline stages over micro-batches (--pipeline_stages 2 "
                                  "--micro_batches 8)",
                         advice);
  }
  throw InputError(fmt::format(
      "the model needs {:.0f} bytes ({}) in a worker, more than max_memory {} ({}): {} "
      "parameters' weights {}{}, {}, gradients {} ({} replica(s){}), activations {} ({} "
      "inputs{}); {}",
      need, memorySize(need), o.max_memory, memorySize(static_cast<double>(o.max_memory)),
      num_params, memorySize(weights), pipeline.stage < 0 ? "" : " (its stage's)", state_text,
      memorySize(grads), shares.size(),
      staged ? fmt::format(", each: the stages' {} and their sums over the micro-batches {}",
                           memorySize(stage_grads), memorySize(sums))
      : grad_slots
          ? fmt::format(": {} bucket slots and the sums of its shard of {}", kGradSlots, sharing)
          : "",
      memorySize(activations), inputs,
      staged ? fmt::format(" in {} micro-batches", pipeline.microBatches()) : "", advice));
}

std::int64_t checkServerMemory(const TrainOptions& o, std::int64_t keys, int workers) {
  if (o.max_memory <= 0) return 0;
  const auto& optimizer = o.optimizer.info();
  const bool sync = o.schedule.servers()->mode == ParameterServers::Mode::kSync;
  const std::int64_t pushes = sync ? workers : 1;
  // A pull's answer is a copy of the weights (they go on changing while it is sent), one a
  // worker at once. (A checkpoint takes the state a piece of 256 KiB at a time: not counted.)
  const std::int64_t pulls = workers;
  const auto states = static_cast<std::int64_t>(optimizer.states.size());
  const double shard = 4.0 * static_cast<double>(keys);
  const double need = shard * static_cast<double>(1 + states + pushes + pulls);
  if (need <= static_cast<double>(o.max_memory)) return static_cast<std::int64_t>(need);
  throw InputError(fmt::format(
      "server {} needs {:.0f} bytes ({}) for its {} keys, more than max_memory {} ({}): weights "
      "{}, {}'s {} state row(s) {}, {} push buffer(s) {}, {} pull answer(s) {}; more servers "
      "(troupe launch -s N) shard the keys finer",
      o.shard_id, need, memorySize(need), keys, o.max_memory,
      memorySize(static_cast<double>(o.max_memory)), memorySize(shard), optimizer.name, states,
      memorySize(shard * static_cast<double>(states)), pushes,
      memorySize(shard * static_cast<double>(pushes)), pulls,
      memorySize(shard * static_cast<double>(pulls))));
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

namespace {

// What a label can be: one of the classes, or a language model's token of its vocabulary.
int labelsOf(const TrainOptions& o) {
  return o.block_size > 0 ? static_cast<int>(o.vocab_size) : o.num_labels;
}

}  // namespace

std::string runName(const TrainOptions& o) {
  return !o.run_name.empty() ? o.run_name : (o.model.name.empty() ? "custom" : o.model.name);
}

std::string experimentId(const TrainOptions& o) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d_%H%M%S", &tm);
  return fmt::format("{}_{}{}_b{}_L{}_lr{:.2f}_{}", runName(o), o.gpus.empty() ? "cpu" : "gpu",
                     o.replicas, o.batch_size, labelsOf(o), o.base_learning_rate, stamp);
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
  lr.power = o.lr_power;
  lr.end = o.lr_end;
  kernels::validate(lr);
  return lr;
}

kernels::CompressionSpec compressionOf(const TrainOptions& o) {
  return {o.gradient_compression, o.gradient_compression_threshold};
}

std::string checkpointDir(const TrainOptions& o) {
  if (o.checkpoint_dir.empty()) return o.log_dir;
  const fs::path dir(o.checkpoint_dir);
  if (dir.is_absolute() || o.log_dir.empty() || o.log_dir == ".") return o.checkpoint_dir;
  return (fs::path(o.log_dir) / dir).string();
}

PlanValues agreedValues(const TrainOptions& o) {
  PlanValues values;
  for (const auto& [name, value] : o.parameters) {
    if (const auto* key = config::findKey(name); key && key->agree)
      values.emplace_back(name, value);
  }
  return values;
}

PlanValues planValues(const TrainOptions& o, const StepPlan& plan, std::int64_t num_params,
                      const std::string& resumed_from) {
  PlanValues values = {
      {"steps_per_epoch", std::to_string(plan.steps_per_epoch)},
      {"global_batch", std::to_string(plan.global_batch)},
      {"first_step", std::to_string(plan.first_step)},
      {"last_step", std::to_string(plan.last_step)},
      {"num_params", std::to_string(num_params)},
      {"resume", resumed_from.empty() ? "none" : fs::path(resumed_from).filename().string()}};
  for (auto& value : agreedValues(o))
    values.push_back(std::move(value));
  return values;
}

std::string planDifferences(const PlanValues& chief, const PlanValues& mine, std::string_view who) {
  const std::map<std::string, std::string> theirs(chief.begin(), chief.end());
  const std::map<std::string, std::string> ours(mine.begin(), mine.end());
  std::vector<std::string> differ;
  const auto valueOf = [](const std::map<std::string, std::string>& values,
                          const std::string& name) {
    const auto it = values.find(name);
    return it == values.end() ? std::string("(none)") : rendezvous::printable(it->second);
  };
  std::vector<std::string> names;
  for (const auto& values : {chief, mine}) {
    for (const auto& [name, value] : values) {
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  for (const auto& name : names) {
    if (valueOf(theirs, name) == valueOf(ours, name)) continue;
    differ.push_back(fmt::format("{}: {} has {}, this one {}", rendezvous::printable(name), who,
                                 valueOf(theirs, name), valueOf(ours, name)));
  }
  return fmt::format("{}", fmt::join(differ, "; "));
}

StoredPlan storedPlan(const PlanValues& values) {
  // One line a name, no byte a terminal would act on.
  StoredPlan plan;
  for (const auto& [name, value] : values) {
    plan.shown.emplace_back(rendezvous::printable(name, name.size()),
                            rendezvous::printable(value, value.size()));
    plan.text += fmt::format("{}={}\n", plan.shown.back().first, plan.shown.back().second);
  }
  return plan;
}

// Rank 0 publishes its plan as "name=value" lines; every other rank checks its own against it.
void agreeOnPlan(rendezvous::Store& store, int rank, int nodes, const PlanValues& mine,
                 std::chrono::milliseconds timeout) {
  const auto [shown, text] = storedPlan(mine);
  // Every other rank answers rank 0's plan with "ok" or its refusal, so that rank 0 names the
  // rank that refused at once instead of waiting for it at the next rendezvous.
  auto verdictKey = [](int r) { return fmt::format("plan-verdict/{}", r); };
  if (rank == 0) {
    store.set("plan", text);
    for (int r = 1; r < nodes; ++r) {
      const std::string verdict = store.get(verdictKey(r), timeout);
      if (verdict != "ok") {
        throw PlanRefusedError(
            fmt::format("rank {} refused this run: {}", r, rendezvous::printable(verdict, 4096)));
      }
    }
    return;
  }
  const rendezvous::StoreValue chief(fmt::format("rank {}", rank), "plan",
                                     store.get("plan", timeout));
  if (chief.text() == text) {
    store.set(verdictKey(rank), "ok");
    return;
  }
  const PlanValues theirs = chief.pairs();
  const std::string differ = planDifferences(theirs, shown);
  if (differ.empty()) chief.refuse("a plan of name=value lines as this rank writes them");
  // The usual cause of a differing resume: checkpoints on a disk of rank 0's host only.
  const auto resumes = [](const PlanValues& values) {
    return std::find(values.begin(), values.end(),
                     std::pair<std::string, std::string>("resume", "none")) == values.end();
  };
  const std::string hint =
      resumes(theirs) && !resumes(shown)
          ? ". Only rank 0 writes checkpoints: put checkpoint_dir on storage every host sees "
            "(NFS), or copy rank 0's checkpoint there, for a restarted run to resume"
          : "";
  const std::string refusal = fmt::format("rank {} of {} disagrees with rank 0 on the run: {}{}",
                                          rank, nodes, differ, hint);
  store.set(verdictKey(rank), refusal);
  throw InputError(refusal);
}

// `resume` as given, or (with "auto", and in every restarted generation) the newest complete
// checkpoint of this run in the checkpoint folder that fits this run's model and steps. A
// restarted generation whose run has no checkpoint yet falls back on an explicit `resume`, else
// starts from scratch (nullopt).
std::optional<Resumed> findResume(
    const TrainOptions& o, const std::string& dir, std::int64_t num_params, const StepPlan& plan,
    std::optional<std::pair<std::int64_t, std::int64_t>> state_columns) {
  if (o.resume == "auto" || o.generation > 0) {
    auto found = findLatestCheckpoint(
        dir,
        [&](const auto& meta) -> std::string {
          auto get = [&](const char* key) {
            const auto it = meta.find(key);
            return it == meta.end() ? std::string() : it->second;
          };
          auto name = [](const std::string& id) { return id.empty() ? "(none)" : id; };
          if (get("run_id") != o.run_id) {
            return fmt::format("it belongs to run_id {}, this run's is {}", name(get("run_id")),
                               name(o.run_id));
          }
          // Checkpoints written before run_name was recorded carry none: they match as before.
          if (const auto run_name = get("run_name"); !run_name.empty() && run_name != runName(o)) {
            return fmt::format("it belongs to run_name {}, this run's is {}", run_name, runName(o));
          }
          if (get("num_params") != std::to_string(num_params)) {
            return fmt::format("it holds {} parameters, this model has {}", get("num_params"),
                               num_params);
          }
          if (get("global_batch") != std::to_string(plan.global_batch) ||
              get("steps_per_epoch") != std::to_string(plan.steps_per_epoch)) {
            return fmt::format(
                "it was written with global batch {} and {} steps per epoch, this run has {} and "
                "{}",
                get("global_batch"), get("steps_per_epoch"), plan.global_batch,
                plan.steps_per_epoch);
          }
          return {};
        },
        state_columns);
    if (found) return Resumed{found->path, std::move(found->checkpoint), true};
    if (o.resume.empty() || o.resume == "auto") {
      spdlog::info("no complete checkpoint of this run in '{}' yet: starting from scratch", dir);
      return std::nullopt;
    }
  }
  if (o.resume.empty()) return std::nullopt;
  return Resumed{o.resume, loadCheckpoint(o.resume, state_columns), false};
}

// An elastic run's options, checked before any rendezvous.
void validateElastic(const TrainOptions& o) {
  const std::string bounds = fmt::format("num_workers {}:{}", o.min_workers, o.max_workers);
  if (o.min_workers < 1 || o.min_workers > o.max_workers) {
    throw InputError(fmt::format("{}: need 1 <= MIN <= MAX", bounds));
  }
  if (!o.schedule.info().elastic) {
    std::string elastic;
    for (const auto& s : schedules())
      if (s.elastic) elastic += (elastic.empty() ? "" : " or ") + s.name;
    throw InputError(fmt::format("{}: an elastic run needs schedule {} (this one has '{}')", bounds,
                                 elastic, o.schedule.name()));
  }
  if (o.role != ProcessRole::kWorker || o.num_servers > 0) {
    throw InputError(fmt::format("{}: an elastic run has no parameter servers", bounds));
  }
  if (!o.resume.empty() || o.generation > 0) {
    throw InputError(fmt::format(
        "{}: an elastic run starts from scratch and keeps its state in memory; to go on from a "
        "checkpoint, resume it with a fixed number of workers",
        bounds));
  }
  checkReducer(o);  // before any rendezvous
  if (o.rendezvous.empty() || o.run_id.empty()) {
    throw InputError(fmt::format(
        "{}: an elastic run needs --rendezvous ({}) and --run_id, the same for every worker",
        bounds, rendezvous::storeUrlForms()));
  }
}

void checkGpus(const TrainOptions& o) {
  if (o.gpus.empty()) return;
  const std::string list = fmt::format("{}", fmt::join(o.gpus, ","));
  if (static_cast<int>(o.gpus.size()) != o.replicas) {
    throw InputError(fmt::format("gpus {} names {} GPU(s) for {} replica(s): one replica a GPU",
                                 list, o.gpus.size(), o.replicas));
  }
  const auto& cuda = kernels::cudaInfo();
  for (const int id : o.gpus) {
    if (id < 0 || id >= static_cast<int>(cuda.devices.size())) {
      throw InputError(fmt::format(
          "gpus {}: there is no cuda:{} here: {}", list, id,
          cuda.devices.empty() ? cuda.problem
                               : fmt::format("this machine has {} GPU(s), cuda:0 to cuda:{}",
                                             cuda.devices.size(), cuda.devices.size() - 1)));
    }
  }
}

namespace {

// pipeline_across processes: InputError naming what does not fit a run whose workers each run
// one stage of a pipeline.
void checkStageProcesses(const TrainOptions& o) {
  const int stages = o.pipeline.stages;
  if (stages < 2) {
    throw InputError(
        "pipeline_across processes runs each pipeline stage in a worker of its own: set "
        "pipeline_stages 2 or more");
  }
  if (!o.schedule.allreduce()) {
    throw InputError(fmt::format(
        "pipeline_across processes: the stages' workers sum their gradients by bsp-allreduce, "
        "not by schedule {} (--schedule bsp-allreduce)",
        o.schedule.name()));
  }
  if (o.min_workers > 0) {
    throw InputError(
        "pipeline_across processes: an elastic run (num_workers MIN:MAX) cannot re-form its "
        "pipelines; give a fixed number of workers");
  }
  if (o.num_shards % stages != 0) {
    throw InputError(fmt::format(
        "pipeline_across processes: {} worker(s) do not make whole pipelines of {} stages (troupe "
        "launch -n {} or another multiple of {})",
        o.num_shards, stages, stages, stages));
  }
  if (o.replicas != 1) {
    throw InputError(fmt::format(
        "pipeline_across processes: each worker runs one stage of one replica, not of {} "
        "replicas",
        o.replicas));
  }
}

}  // namespace

void checkProcessOptions(const TrainOptions& o) {
  validateSchedule(o);
  compressionOf(o);  // an unknown name fails here, before any rendezvous
  const bool server = o.role == ProcessRole::kServer;
  const int shards_of_role = server ? o.num_servers : o.num_shards;
  if (o.shard_id < 0 || o.shard_id >= shards_of_role) {
    throw InputError(fmt::format("shard_id {} is not one of the {} {}(s)", o.shard_id,
                                 shards_of_role, roleName(o.role)));
  }
  if (o.replicas < 1) throw InputError("replicas must be at least 1");
  if (!server) {
    checkGpus(o);
    checkReducer(o);
    checkPrecision(o);
  }
  if (o.batch_size < 1) throw InputError("batch_size must be at least 1");
  if (o.num_epochs < 1) throw InputError("num_epochs must be at least 1");
  if (o.pipeline.micro_batches > 0 && o.pipeline.stages < 2) {
    throw InputError(fmt::format(
        "micro_batches {} cuts a batch for pipeline stages: set pipeline_stages 2 or more",
        o.pipeline.micro_batches));
  }
  if (o.pipeline.placement == kernels::StagePlacement::kProcesses) checkStageProcesses(o);
  kernels::checkNetInput(netOptions(o, 1));  // before the data is opened: tokens or images
  checkTrainingData(o);
  if (o.prefetch < 1) throw InputError("prefetch must be at least 1");
  if (o.generation < 0) throw InputError("generation must be at least 0");
}

void checkTrainingData(const TrainOptions& o) {
  if (o.synthetic) {
    if (!o.train_data.empty()) {
      throw InputError(
          fmt::format("synthetic input and train_data '{}' both give the training input: give one",
                      o.train_data));
    }
    if (o.reader_factory) {
      throw InputError(
          "synthetic input and a reader of one's own (TrainerData::reader) both give the "
          "training input: give one");
    }
    if (o.epoch_size <= 0) {
      throw InputError("synthetic input needs epoch_size, the inputs an epoch trains");
    }
  } else if (!o.reader_factory) {
    if (o.train_data.empty()) throw InputError("no training data: set train_data");
  } else if (o.epoch_size <= 0) {
    throw InputError(
        "a reader of one's own (TrainerData::reader) needs epoch_size, the inputs an epoch "
        "trains: troupe cannot count its records");
  } else if (o.shared_reader) {
    throw InputError(
        "shared_reader shares troupe's database reader among replicas; a reader of one's own "
        "(TrainerData::reader) feeds one replica each");
  }
}

data::DatasetOptions datasetOptions(const TrainOptions& o, const std::string& path, bool train) {
  data::DatasetOptions d;
  d.path = path;
  d.type = o.db_type;
  d.channels = o.num_channels;
  d.height = d.width = o.image_size;
  d.num_labels = labelsOf(o);
  d.mean = o.mean;
  d.scale = o.scale;
  d.mean_per_channel.assign(o.mean_per_channel.begin(), o.mean_per_channel.end());
  d.std_per_channel.assign(o.std_per_channel.begin(), o.std_per_channel.end());
  d.transform = o.transform;
  d.train = train;
  d.seed = o.seed;
  d.decode_threads = o.decode_threads;
  d.uint8 = train && o.input_dtype == kernels::DType::kUInt8 && o.block_size == 0;
  d.sequence_length = o.block_size;
  return d;
}

StepPlan stepPlan(const TrainOptions& o, int workers, std::int64_t train_size) {
  const std::int64_t epoch_size = o.epoch_size > 0 ? o.epoch_size : train_size;
  StepPlan plan;
  plan.global_batch = o.batch_size * workers;
  plan.steps_per_epoch = epoch_size / plan.global_batch;
  if (plan.steps_per_epoch < 1) {
    throw InputError(fmt::format("epoch_size {} is smaller than the global batch {}", epoch_size,
                                 plan.global_batch));
  }
  plan.epoch_size = epoch_size;
  plan.evaluates = !o.test_data.empty();
  plan.checkpoint_every = o.checkpoint_every;
  plan.start(0, o.num_epochs);
  return plan;
}

kernels::NetOptions netOptions(const TrainOptions& o, std::int64_t max_batch) {
  return {.model = o.model,
          .channels = o.num_channels,
          .height = o.image_size,
          .width = o.image_size,
          .num_labels = labelsOf(o),
          .sequence_length = o.block_size,
          .gpt = o.gpt,
          .lstm = o.lstm,
          .label_smoothing = o.label_smoothing,
          .max_batch = max_batch,
          .seed = o.seed,
          .zero_init_residual = o.zero_init_residual,
          .pipeline = o.pipeline};
}

bool ncclSpansProcesses(const TrainOptions& o, int nodes) {
  const auto* all = o.schedule.allreduce();
  return !all || all->algorithm == Allreduce::kAuto || nodes == 1;
}

void checkReducer(const TrainOptions& o) {
  if (!o.schedule.nccl()) return;
  auto refuse = [](const std::string& why) { throw InputError("reducer nccl: " + why); };
  if (o.gpus.empty()) {
    refuse(
        "NCCL sums on GPUs, and this run has none: name them with gpus (--gpus 0,1 or --num_gpus "
        "2), or use reducer troupe");
  }
  // Under parameter servers, makeSchedule refused it already.
  if (!o.schedule.info().sums_on_gpu) {
    refuse(fmt::format(
        "schedule '{}' sums gradients on the CPU (MXNet's local); use schedule device (one "
        "process) or bsp-allreduce (several), where NCCL sums on the GPUs",
        o.schedule.name()));
  }
  if (o.gradient_compression != kernels::GradientCompression::kNone && ncclSpansProcesses(o, 2)) {
    refuse(fmt::format(
        "NCCL sums float32 gradients, and gradient_compression is {}; to compress between "
        "processes, name troupe's allreduce for them (allreduce ring or hierarchical: NCCL sums "
        "each process's GPUs, troupe's ring the processes), or use gradient_compression none",
        kernels::toString(o.gradient_compression)));
  }
}

void checkPrecision(const TrainOptions& o) {
  const bool ps = o.schedule.servers() != nullptr;
  if (ps && (o.precision == kernels::DType::kFloat16 || o.loss_scale > 0)) {
    throw InputError(fmt::format(
        "precision {} with a loss scale under schedule '{}': the parameter servers, each holding "
        "a shard, neither divide the scale out nor skip an overflowing step together; use "
        "precision bf16 (no loss scale), or bsp-allreduce",
        precisionName(o.precision), o.schedule.name()));
  }
  if (ps && o.clip_grad_norm > 0) {
    throw InputError(fmt::format(
        "clip_grad_norm {:g} under schedule '{}': the gradients' global norm is of every shard, "
        "and each parameter server holds one; use bsp-allreduce, or clip_grad_norm 0",
        o.clip_grad_norm, o.schedule.name()));
  }
  if (o.precision != kernels::DType::kFloat32 && o.gpus.empty()) {
    throw InputError(fmt::format(
        "precision {} computes on GPUs, and this run has none: name them with gpus (--gpus 0 or "
        "--num_gpus 1), or use precision fp32 (CPU replicas compute in float32)",
        precisionName(o.precision)));
  }
}

kernels::DType precisionOf(const TrainOptions& o) {
  return o.gpus.empty() ? kernels::DType::kFloat32 : o.precision;
}

LossScale lossScaleOf(const TrainOptions& o) {
  LossScale scale;
  scale.window = o.loss_scale_window;
  if (o.loss_scale > 0) {
    scale.initial = static_cast<float>(o.loss_scale);
  } else if (precisionOf(o) == kernels::DType::kFloat16) {
    scale.initial = std::ldexp(1.0f, o.initial_scale_power);  // 2^16: PyTorch's GradScaler's
    scale.dynamic = true;
  }
  return scale;
}

bool channelsLastOf(const TrainOptions& o, const std::string& misfit) {
  if (o.memory_format == MemoryFormat::kNchw) return false;
  if (o.memory_format == MemoryFormat::kNhwc) {
    if (o.gpus.empty()) {
      throw InputError(
          "memory_format nhwc lays images out for GPUs, and this run has none (CPU replicas "
          "compute in NCHW): name them with gpus, or use memory_format auto or nchw");
    }
    if (!misfit.empty()) {
      throw InputError("memory_format nhwc would change this model: " + misfit +
                       "; use memory_format nchw (or auto)");
    }
    return true;
  }
  const bool tensor_cores = precisionOf(o) != kernels::DType::kFloat32 || o.tf32;
  return !o.gpus.empty() && tensor_cores && misfit.empty();
}

bool cudaGraphsOf(const TrainOptions& o) {
  if (o.cuda_graphs == false || o.role == ProcessRole::kServer) return false;
  if (!o.cuda_graphs) return !o.gpus.empty() && o.trace.empty();  // auto
  if (o.gpus.empty()) {
    throw InputError(
        "cuda_graphs records the steps of GPU replicas, and this run has none (CPU replicas queue "
        "no work to record): name them with gpus, or leave cuda_graphs off");
  }
  return o.trace.empty();
}

std::string describeCudaGraphs(const TrainOptions& o) {
  if (o.cuda_graphs == false) return "off (cuda_graphs false)";
  if (o.role == ProcessRole::kServer) return "off on a parameter server, which trains no replica";
  if (o.gpus.empty()) return "off: no GPU replicas";
  if (!cudaGraphsOf(o)) return "off in a traced run, whose trace times each step's parts apart";
  return "each step's forward and backward replayed from a CUDA graph, recorded at the second "
         "step with the same inputs (a model with dropout goes op by op)";
}

std::string describePrecision(const TrainOptions& o, bool channels_last) {
  const std::string layout = channels_last ? "; channels-last images" : "";
  if (precisionOf(o) == kernels::DType::kFloat32) return "fp32" + layout;
  const LossScale scale = lossScaleOf(o);
  return fmt::format(
      "{} activations, convolutions and products; fp32 weights, gradients and updates{}{}",
      precisionName(o.precision),
      scale.initial <= 0 ? std::string()
      : scale.dynamic ? fmt::format("; loss scale dynamic from {:g}, doubled after {} clean steps",
                                    scale.initial, scale.window)
                      : fmt::format("; loss scale {:g}", scale.initial),
      layout);
}

void checkResumable(const Resumed& resumed, std::int64_t num_params, const StepPlan& plan,
                    const kernels::OptimizerSettings& optimizer) {
  const auto& ck = resumed.checkpoint;
  const std::string& path = resumed.path;
  const auto& states = optimizer.info().states;
  if (ck.optimizer() != optimizer.name() || ck.stateNames() != states) {
    throw InputError(fmt::format(
        "checkpoint '{}' holds the state of optimizer {} ({}); this run's optimizer is {} ({}): "
        "resume with optimizer {}, or start afresh in another checkpoint_dir",
        path, ck.optimizer(), fmt::join(ck.stateNames(), ", "), optimizer.name(),
        fmt::join(states, ", "), ck.optimizer()));
  }
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
}

}  // namespace troupe::actors
