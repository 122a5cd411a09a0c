#include "actors/roles/observers.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace troupe::actors {

void Observers::add(Address observer, std::int64_t every) {
  subscribers_.push_back({observer, std::max<std::int64_t>(1, every)});
  spdlog::info("observer node {} joined the run: the weights every {} steps", observer.node, every);
}

kernels::Tensor Observers::hostCopy(const kernels::Tensor& weights) {
  // The weights change with the next step while the transport writes these.
  auto copy = kernels::Tensor::host({weights.numel()});
  std::copy_n(weights.f32(), weights.numel(), copy.f32());
  return copy;
}

void Observers::dropped(const Subscriber& s, const char* why) {
  spdlog::info("observer node {} left the run ({}); the run goes on", s.address.node, why);
}

}  // namespace troupe::actors
