#include "actors/schedules/schedule.h"

#include <fmt/format.h>

#include "troupe/error.h"

namespace troupe::actors {

// One row each, in actors/schedules/.
ScheduleInfo localSchedule();
ScheduleInfo deviceSchedule();
ScheduleInfo bspAllreduceSchedule();
ScheduleInfo distSyncSchedule();
ScheduleInfo distAsyncSchedule();
ScheduleInfo sspSchedule();

const std::vector<ScheduleInfo>& schedules() {
  static const std::vector<ScheduleInfo> table{localSchedule(),        deviceSchedule(),
                                               bspAllreduceSchedule(), distSyncSchedule(),
                                               distAsyncSchedule(),    sspSchedule()};
  return table;
}

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

const ScheduleInfo& scheduleInfo(std::string_view name) {
  if (const auto* row = findSchedule(name)) return *row;
  throw InputError(fmt::format("unknown schedule '{}' (known: {})", name, scheduleNames()));
}

std::string scheduleNames() {
  std::string names;
  for (const auto& row : schedules())
    names += (names.empty() ? "" : ", ") + row.name;
  return names;
}

void requireServers(const TrainOptions& o) {
  if (o.num_servers < 1) {
    throw InputError(
        fmt::format("schedule '{}' needs parameter servers: troupe launch -s 1 (or --num_servers)",
                    o.schedule));
  }
}

void requireOneProcess(const TrainOptions& o) {
  if (o.num_shards > 1 || o.num_servers > 0) {
    throw InputError(
        fmt::format("schedule '{}' runs in one process, and this run has {} worker(s) and {} "
                    "server(s); use bsp-allreduce, dist_sync, dist_async or ssp",
                    o.schedule, o.num_shards, o.num_servers));
  }
}

}  // namespace troupe::actors
