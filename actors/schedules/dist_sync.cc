// dist_sync (MXNet's dist_sync and dist_device_sync): server shards update once every worker
// pushed a step.
#include "actors/schedules/schedule.h"

namespace troupe::actors {

ScheduleInfo distSyncSchedule() {
  ScheduleInfo row{"dist_sync",
                   "parameter servers; every step waits for every worker's push",
                   {"dist_sync", "dist_device_sync"}};
  row.family = [](const ScheduleKeys& keys) {
    return serversFamily(keys, ParameterServers::Mode::kSync);
  };
  row.validate = requireServers;
  return row;
}

}  // namespace troupe::actors
