// ssp: stale-synchronous parameter servers; a worker runs at most `staleness` steps ahead.
#include "actors/schedules/schedule.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

void validate(const TrainOptions& o) {
  requireServers(o);
  if (o.staleness < 0) throw InputError("staleness must be >= 0");
}

}  // namespace

ScheduleInfo sspSchedule() {
  ScheduleInfo row{"ssp", "parameter servers; a worker runs at most `staleness` steps ahead", {}};
  row.parameter_servers = true;
  row.validate = validate;
  return row;
}

}  // namespace troupe::actors
