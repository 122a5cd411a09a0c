// The schedules: how a run's processes wait for each other (DESIGN.md, "Schedules"). A table, as
// the optimizers' (kernels/optimizer.h): schedules() lists one row per schedule, each made in its
// own file of this folder, and every list a user sees (the schedule key's help, docs/config.md,
// `troupe info`, the unknown-schedule error) comes from it. A row says what the rest of the run
// decides by: whether workers push to parameter servers (a PS client in the updater's slot),
// whether the gradients may be summed on a GPU, whether workers may come and go (and so which
// actors a worker runs: workerRolesOf, actors/run/worker_spawn.h). The table stays light: the
// config fuzzer links it to validate runs, without the actors.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "actors/run/trainer.h"

namespace troupe::actors {

struct RoleSpawn;  // actors/run/worker_spawn.h
struct WorkerSpawn;

struct ScheduleInfo {
  std::string name;
  std::string summary;             // one line, for help texts and `troupe info`
  std::vector<std::string> mxnet;  // MXNet's kvstore names for it (accepted as schedules)
  bool parameter_servers = false;  // server shards update; workers push and pull
  bool one_process = false;        // local, device: the run is one process
  bool sums_on_gpu = true;         // with GPUs, the replicas' gradients are summed on the first
  bool elastic = false;            // workers may die or join (num_workers MIN:MAX)
  // InputError when the run's options do not fit the schedule, naming what to change.
  void (*validate)(const TrainOptions& o) = nullptr;
};

// Every schedule, in the order help texts list them.
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

}  // namespace troupe::actors
