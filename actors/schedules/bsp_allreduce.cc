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
  const int zero = o.schedule.allreduce()->zero_stage;
  if (zero == 0) return;
  // What the sharded update cannot do yet, each named.
  auto refuse = [&](const std::string& what, const char* instead) {
    throw InputError(
        fmt::format("zero_stage {} with {}: not supported yet; {}", zero, what, instead));
  };
  if (o.max_workers > 0) {
    refuse(fmt::format("an elastic run (num_workers {}:{})", o.min_workers, o.max_workers),
           "a fixed number of workers, or zero_stage 0");
  }
  if (o.schedule.allreduce()->reducer == ReducerKind::kNccl) {
    refuse("reducer nccl (NCCL sums every bucket whole in place)",
           "reducer troupe (GPUs summed through the host's ring), or zero_stage 0");
  }
  if (o.schedule.allreduce()->algorithm == Allreduce::kHierarchical)
    refuse("allreduce hierarchical", "allreduce ring (or auto), or zero_stage 0");
  if (zero < 2) return;
  // Stage 2's gradient slots: replicas' nets on the CPU, whole.
  if (!o.gpus.empty()) refuse("GPUs (--gpus)", "zero_stage 1 (the optimizer's state sharded)");
  if (o.pipeline.stages > 1) {
    refuse("pipeline stages (each stage's worker holds its stage's gradients alone already)",
           "zero_stage 1");
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
    if (keys.zero_stage > 2) {
      throw InputError(fmt::format(
          "zero_stage {}: troupe shards the optimizer's state (stage 1) and the gradients (2), "
          "not yet the weights (3); use zero_stage 2",
          keys.zero_stage));
    }
    return AllreduceWorkers{allreduceOf(keys), reducerOf(keys), static_cast<int>(keys.zero_stage)};
  };
  row.validate = validate;
  return row;
}

}  // namespace troupe::actors
