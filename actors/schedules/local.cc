// local (MXNet's local): one process, its replicas' gradients summed in host memory.
#include "actors/schedules/schedule.h"

namespace troupe::actors {

ScheduleInfo localSchedule() {
  ScheduleInfo row{"local", "one process; its replicas' gradients summed in memory", {"local"}};
  row.sums_on_gpu = false;
  row.family = oneProcessFamily;
  row.validate = requireOneProcess;
  return row;
}

}  // namespace troupe::actors
