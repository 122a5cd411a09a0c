#include "actors/schedules/schedule.h"

#include <fmt/format.h>

#include "actors/run/trainer.h"
#include "troupe/error.h"

namespace troupe::actors {

const ScheduleInfo* findSchedule(std::string_view name) {
  for (const auto& row : schedules()) {
    if (row.name == name) return &row;
  }
  for (const auto& row : schedules()) {
    for (const auto& mxnet : row.mxnet) {
      if (mxnet == name) return &row;
    }
  }
  return nullptr;
}

bool ScheduleInfo::parameterServers() const {
  return std::holds_alternative<ParameterServers>(family(ScheduleKeys{}));
}

bool ScheduleInfo::oneProcess() const {
  return std::holds_alternative<OneProcess>(family(ScheduleKeys{}));
}

Schedule::Schedule() : Schedule(scheduleNamed("local")) {}

Schedule::Schedule(const ScheduleInfo& row, ScheduleFamily family)
    : row_(&row), family_(std::move(family)) {}

bool Schedule::nccl() const {
  if (const auto* one = std::get_if<OneProcess>(&family_))
    return one->reducer == ReducerKind::kNccl;
  if (const auto* all = allreduce()) return all->reducer == ReducerKind::kNccl;
  return false;
}

ScheduleKeys Schedule::keys() const {
  ScheduleKeys keys;
  keys.schedule = name();
  keys.reducer = kernels::nameIn(kReducers, nccl() ? ReducerKind::kNccl : ReducerKind::kTroupe);
  if (const auto* all = allreduce()) {
    keys.allreduce = allreduceName(all->algorithm);
    keys.zero_stage = all->zero_stage;
  }
  if (const auto* ps = servers()) keys.staleness = ps->staleness;
  return keys;
}

ReducerKind reducerOf(const ScheduleKeys& keys) {
  if (const auto* reducer = kernels::valueNamed(kReducers, keys.reducer)) return *reducer;
  throw InputError(fmt::format("reducer '{}' is not one of troupe, nccl", keys.reducer));
}

ScheduleFamily oneProcessFamily(const ScheduleKeys& keys) {
  return OneProcess{reducerOf(keys)};
}

ScheduleFamily serversFamily(const ScheduleKeys& keys, ParameterServers::Mode mode) {
  if (reducerOf(keys) == ReducerKind::kNccl) {
    throw InputError(fmt::format(
        "reducer nccl: under schedule '{}' the parameter servers sum the gradients; use schedule "
        "bsp-allreduce, or reducer troupe",
        keys.schedule));
  }
  return ParameterServers{mode, static_cast<int>(keys.staleness)};
}

Allreduce allreduceOf(const ScheduleKeys& keys) {
  if (const auto* mode = kernels::valueNamed(kAllreduces, keys.allreduce)) return *mode;
  throw InputError(
      fmt::format("allreduce '{}' is not one of auto, ring, hierarchical", keys.allreduce));
}

Schedule makeSchedule(const ScheduleKeys& keys) {
  ScheduleKeys given = keys;
  if (given.schedule == "nccl") {  // MXNet's kvstore nccl
    given.schedule = "device";
    given.reducer = "nccl";
  }
  const ScheduleInfo& row = scheduleInfo(given.schedule);
  given.schedule = row.name;
  Schedule schedule(row, row.family(given));
  if (given.zero_stage > 0 && !schedule.allreduce()) {
    throw InputError(fmt::format(
        "zero_stage {} shards the optimizer's state over the workers of schedule bsp-allreduce; "
        "{}",
        given.zero_stage,
        schedule.servers()
            ? fmt::format("under '{}' the parameter servers shard it already (zero_stage 0)",
                          row.name)
            : fmt::format("'{}' runs one process, with nothing to shard it over (zero_stage 0)",
                          row.name)));
  }
  return schedule;
}

Schedule scheduleNamed(std::string_view name) {
  ScheduleKeys keys;
  keys.schedule = name;
  return makeSchedule(keys);
}

const ScheduleInfo& scheduleInfo(std::string_view name) {
  if (const auto* row = findSchedule(name)) return *row;
  throw InputError(fmt::format("unknown schedule '{}' (known: {})", name, scheduleNames()));
}

std::string scheduleNames() {
  return kernels::namesOf(schedules());
}

void requireServers(const TrainOptions& o) {
  if (o.num_servers < 1) {
    throw InputError(
        fmt::format("schedule '{}' needs parameter servers: troupe launch -s 1 (or --num_servers)",
                    o.schedule.name()));
  }
}

void requireOneProcess(const TrainOptions& o) {
  if (o.num_shards > 1 || o.num_servers > 0) {
    throw InputError(
        fmt::format("schedule '{}' runs in one process, and this run has {} worker(s) and {} "
                    "server(s); use bsp-allreduce, dist_sync, dist_async or ssp",
                    o.schedule.name(), o.num_shards, o.num_servers));
  }
}

}  // namespace troupe::actors
