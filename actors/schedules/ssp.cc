// ssp: stale-synchronous parameter servers; a worker runs at most `staleness` steps ahead.
#include "actors/schedules/schedule.h"

namespace troupe::actors {

ScheduleInfo sspSchedule() {
  ScheduleInfo row{"ssp", "parameter servers; a worker runs at most `staleness` steps ahead", {}};
  row.family = [](const ScheduleKeys& keys) {
    return serversFamily(keys, ParameterServers::Mode::kStale);
  };
  row.validate = requireServers;
  return row;
}

}  // namespace troupe::actors
