// bsp-allreduce: every worker sums the gradients by ring or hierarchical allreduce each step and
// updates its own copy (Horovod's way); the one schedule whose workers may come and go.
#include <fmt/format.h>

#include "actors/run/trainer.h"
#include "actors/schedules/schedule.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

void validate(const TrainOptions& o) {
  if (o.num_servers > 0) {
    throw InputError(fmt::format(
        "schedule 'bsp-allreduce' has no parameter servers, and this run has {}; drop -s or use "
        "dist_sync",
        o.num_servers));
  }
}

}  // namespace

ScheduleInfo bspAllreduceSchedule() {
  ScheduleInfo row{
      "bsp-allreduce",
      "workers sum gradients by ring or hierarchical allreduce, every step (Horovod's way)",
      {}};
  row.elastic = true;
  row.family = [](const ScheduleKeys& keys) -> ScheduleFamily {
    return AllreduceWorkers{allreduceOf(keys), reducerOf(keys)};
  };
  row.validate = validate;
  return row;
}

}  // namespace troupe::actors
