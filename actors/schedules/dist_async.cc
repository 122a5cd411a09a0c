// dist_async (MXNet's): server shards apply each push as it arrives.
#include "actors/schedules/schedule.h"

namespace troupe::actors {

ScheduleInfo distAsyncSchedule() {
  ScheduleInfo row{
      "dist_async", "parameter servers; each push applied as it comes", {"dist_async"}};
  row.family = [](const ScheduleKeys& keys) {
    return serversFamily(keys, ParameterServers::Mode::kAsync);
  };
  row.validate = requireServers;
  return row;
}

}  // namespace troupe::actors
