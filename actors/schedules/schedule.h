// The schedules: how a run's processes wait for each other (DESIGN.md, "Schedules"). A table, as
// the optimizers' (kernels/optimizer.h): schedules() lists one row per schedule, each made in its
// own file of this folder and listed by the build (cmake/registry.cmake), and every list a user
// sees (the schedule key's help, docs/config.md, `troupe info`, the unknown-schedule error) comes
// from it.
//
// A run holds its schedule typed (TrainOptions::schedule): the row, and the row's family with
// what only that family reads: one process (local, device), an allreduce across processes
// (bsp-allreduce: ring or hierarchical, troupe's sums or NCCL's), or parameter servers (dist_sync,
// dist_async, ssp with its staleness). The keys schedule, allreduce, reducer and staleness are
// text only at the config's edge (makeSchedule); the rest of the run decides by the family, which
// also says what a worker spawns (a PS client or an updater: workerRolesOf,
// actors/run/worker_spawn.h). The table stays light: the config fuzzer links it to validate runs,
// without the actors.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "actors/core/hosts.h"

namespace troupe::actors {

struct TrainOptions;  // actors/run/trainer.h

// What sums the gradients of replicas on GPUs: troupe's own sums (on a GPU or the CPU) and ring,
// or NCCL over the run's GPUs (Caffe2's --use_nccl, MXNet's kvstore nccl).
enum class ReducerKind : std::uint8_t { kTroupe, kNccl };
inline constexpr kernels::Named<ReducerKind> kReducers[] = {{"troupe", ReducerKind::kTroupe},
                                                            {"nccl", ReducerKind::kNccl}};

// The families of schedules, each with its own settings.
struct OneProcess {  // local, device: one process; its replicas' gradients summed in it
  ReducerKind reducer = ReducerKind::kTroupe;
};
struct AllreduceWorkers {  // bsp-allreduce: workers sum their gradients and each updates
  Allreduce algorithm = Allreduce::kAuto;  // across processes (actors/core/hosts.h)
  ReducerKind reducer = ReducerKind::kTroupe;
  // ZeRO's stage (DeepSpeed's zero_optimization.stage, llm.c's -z): 1 shards the optimizer's
  // state over the workers (each updates its shard; gradients reduce-scattered, weights
  // all-gathered); 0: every worker holds all of it.
  int zero_stage = 0;
  // The allreduce across processes: sharded state reduce-scatters over one flat ring.
  Allreduce across() const { return zero_stage > 0 ? Allreduce::kRing : algorithm; }
};
struct ParameterServers {  // dist_sync, dist_async, ssp: server shards update, workers push
  // How a server applies pushes and answers pulls: once every worker pushed a step (sync), each
  // push as it comes (async), or as async with no worker more than `staleness` steps ahead.
  enum class Mode : std::uint8_t { kSync, kAsync, kStale };
  Mode mode = Mode::kSync;
  int staleness = 0;
};
using ScheduleFamily = std::variant<OneProcess, AllreduceWorkers, ParameterServers>;

// The keys that make a schedule, as the config gives them (its edge: actors/config/).
struct ScheduleKeys {
  std::string schedule = "local";  // a row's name or one of its MXNet names; "nccl": device
  std::string allreduce = "auto";  // auto, ring or hierarchical
  std::string reducer = "troupe";  // troupe or nccl
  std::int64_t staleness = 2;
  std::int64_t zero_stage = 0;
};

struct ScheduleInfo {
  std::string name;
  std::string summary;             // one line, for help texts and `troupe info`
  std::vector<std::string> mxnet;  // MXNet's kvstore names for it (accepted as schedules)
  bool sums_on_gpu = true;         // with GPUs, the replicas' gradients are summed on the first
  bool elastic = false;            // workers may die or join (num_workers MIN:MAX)
  // Its family, with the settings of `keys` that the family reads (InputError for a value the
  // family cannot take, naming the key).
  ScheduleFamily (*family)(const ScheduleKeys& keys) = nullptr;
  // InputError when the run's options do not fit the schedule, naming what to change.
  void (*validate)(const TrainOptions& o) = nullptr;

  bool parameterServers() const;  // its family is ParameterServers
  bool oneProcess() const;        // its family is OneProcess
};

// A run's schedule: its row and its family's settings. Default: local.
class Schedule {
 public:
  Schedule();
  Schedule(const ScheduleInfo& row, ScheduleFamily family);

  const ScheduleInfo& info() const { return *row_; }
  const std::string& name() const { return row_->name; }
  const ScheduleFamily& family() const { return family_; }
  // The family's settings where the run has that family; nullptr otherwise.
  const ParameterServers* servers() const { return std::get_if<ParameterServers>(&family_); }
  const AllreduceWorkers* allreduce() const { return std::get_if<AllreduceWorkers>(&family_); }
  // NCCL sums the GPU replicas' gradients (reducer nccl); never under parameter servers.
  bool nccl() const;
  // ZeRO's stage (AllreduceWorkers::zero_stage); 0 for the other families.
  int zeroStage() const { return allreduce() ? allreduce()->zero_stage : 0; }
  // The keys that give this schedule back (the log's parameters, the dry run).
  ScheduleKeys keys() const;

 private:
  const ScheduleInfo* row_;
  ScheduleFamily family_;
};

// The typed schedule of `keys`: InputError for an unknown schedule (listing the known ones), an
// unknown allreduce or reducer, or a setting the schedule's family refuses.
Schedule makeSchedule(const ScheduleKeys& keys);
// The row named `name` (or whose MXNet names hold it) and its family with the keys' defaults.
Schedule scheduleNamed(std::string_view name);

// Every schedule, in the order help texts list them: local, the default, then by file name
// (written by the build from actors/schedules/, cmake/registry.cmake).
const std::vector<ScheduleInfo>& schedules();
// The row named `name` (or whose MXNet names hold it); nullptr when there is none.
const ScheduleInfo* findSchedule(std::string_view name);
// The same; InputError listing the known names when there is none.
const ScheduleInfo& scheduleInfo(std::string_view name);
// The names, comma separated (for messages and help).
std::string scheduleNames();

// What the parameter-server schedules check alike (actors/schedules/dist_sync.cc).
void requireServers(const TrainOptions& o);
// What local and device check alike (actors/schedules/local.cc).
void requireOneProcess(const TrainOptions& o);
// The families' makers the rows share: one process with the reducer key, and parameter servers
// in `mode` (refusing reducer nccl: the servers sum the gradients).
ScheduleFamily oneProcessFamily(const ScheduleKeys& keys);
ScheduleFamily serversFamily(const ScheduleKeys& keys, ParameterServers::Mode mode);
// The allreduce and reducer keys' values (InputError naming the accepted ones).
Allreduce allreduceOf(const ScheduleKeys& keys);
ReducerKind reducerOf(const ScheduleKeys& keys);

}  // namespace troupe::actors
