#include "actors/roles/grad_slots.h"

#include "troupe/error.h"

namespace troupe::actors {

void GradSlots::fill(int slot, std::int64_t step, std::int64_t begin) {
  std::lock_guard lock(mutex_);
  auto& held = held_.at(static_cast<std::size_t>(slot));
  TROUPE_ENFORCE(!held, "gradient slot ", slot, " filled with bucket ", begin, " of step ", step,
                 " while it holds bucket ", held ? held->begin : -1, " of step ",
                 held ? held->step : -1);
  held = Bucket{step, begin};
}

void GradSlots::release(std::int64_t step, std::int64_t begin) {
  {
    std::lock_guard lock(mutex_);
    for (auto& held : held_)
      if (held && held->step == step && held->begin == begin) held.reset();
  }
  freed_.notify_all();
}

std::optional<GradSlots::Bucket> GradSlots::waitFree(int slot, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  const auto& held = held_.at(static_cast<std::size_t>(slot));
  if (freed_.wait_for(lock, timeout, [&] { return aborted_ || !held; })) {
    if (aborted_) throw Error("the run failed while a backward waited for a gradient slot");
    return std::nullopt;
  }
  return *held;
}

void GradSlots::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  freed_.notify_all();
}

}  // namespace troupe::actors
