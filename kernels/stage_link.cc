#include "kernels/stage_link.h"

#include <utility>

namespace troupe::kernels {

void StageLink::deliver(StageTensor message) {
  std::lock_guard lock(mutex_);
  if (aborted_) return;
  if (!receiver_) {
    early_.push_back(std::move(message));
    return;
  }
  receiver_(std::move(message));
}

void StageLink::receiveBy(std::function<void(StageTensor)> receiver) {
  std::lock_guard lock(mutex_);
  receiver_ = std::move(receiver);
  if (!receiver_) return;
  std::vector<StageTensor> early = std::move(early_);
  early_.clear();
  for (StageTensor& t : early)
    receiver_(std::move(t));
}

void StageLink::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  early_.clear();
  if (abort_hook_) abort_hook_();
}

void StageLink::onAbort(std::function<void()> hook) {
  std::lock_guard lock(mutex_);
  abort_hook_ = std::move(hook);
}

}  // namespace troupe::kernels
