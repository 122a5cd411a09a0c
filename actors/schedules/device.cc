// device (MXNet's device): one process, its replicas' gradients summed on a GPU.
#include "actors/run/trainer.h"
#include "actors/schedules/schedule.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

void validate(const TrainOptions& o) {
  requireOneProcess(o);
  if (o.gpus.empty()) {
    throw InputError(
        "schedule 'device' sums gradients on a GPU, and this run has none: name them with gpus "
        "(--gpus 0,1 or --num_gpus 2), or use schedule 'local'");
  }
}

}  // namespace

ScheduleInfo deviceSchedule() {
  ScheduleInfo row{"device",
                   "one process; its replicas' gradients summed on a GPU (by NCCL with --reducer "
                   "nccl)",
                   {"device"}};
  row.family = oneProcessFamily;
  row.validate = validate;
  return row;
}

}  // namespace troupe::actors
