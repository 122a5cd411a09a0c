// troupe::ReaderActor (include/troupe/reader.h): a reader of one's own, speaking the Reader's
// protocol with its replica (Batch out, BatchConsumed back: credit-based prefetch).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "actors/core/messages.h"
#include "actors/core/status_of.h"
#include "actors/core/system.h"
#include "troupe/reader.h"

namespace troupe {
namespace {

struct RetryCredit {};  // retryAfter's: call onCredit() again

}  // namespace

ReaderActor::ReaderActor(ReaderSpec spec)
    : Actor(spec.name), spec_(std::move(spec)), next_(spec_.first_step) {
  on<actors::BatchConsumed>([this](actors::BatchConsumed&) {
    --in_flight_;
    offer();
  });
  on<RetryCredit>([this](RetryCredit&) {
    retry_pending_ = false;
    offer();
  });
}

void ReaderActor::started() {
  actors::throwIfError(open());
  offer();
}

void ReaderActor::offer() {
  if (credit() > 0 && !finished() && !retry_pending_) actors::throwIfError(onCredit());
}

void ReaderActor::retryAfter(std::chrono::milliseconds delay) {
  if (retry_pending_) return;
  retry_pending_ = true;
  system().after(delay, self(), RetryCredit{});
}

Status ReaderActor::sendBatch(std::span<const float> images, std::span<const std::int32_t> labels) {
  const auto& s = spec_;
  const std::int64_t image_size = static_cast<std::int64_t>(s.channels) * s.height * s.width;
  auto refuse = [&](const std::string& why) {
    return Status(ErrorKind::kInput,
                  fmt::format("{}: the batch of step {} {}", name(), next_, why));
  };
  if (finished()) {
    return refuse(
        fmt::format("is past the run's last step ({} steps end at {})", s.name, s.last_step));
  }
  if (credit() <= 0) {
    return refuse(fmt::format("is {} batches ahead of its replica (prefetch {}): wait for credit",
                              in_flight_, s.prefetch));
  }
  if (static_cast<std::int64_t>(labels.size()) != s.batch ||
      static_cast<std::int64_t>(images.size()) != s.batch * image_size) {
    return refuse(fmt::format(
        "has {} labels and {} image values; the replica takes {} inputs of {}x{}x{} ({} values)",
        labels.size(), images.size(), s.batch, s.channels, s.height, s.width,
        s.batch * image_size));
  }
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || labels[i] >= s.num_labels) {
      return refuse(fmt::format("has label {} at {}, outside [0, {})", labels[i], i, s.num_labels));
    }
  }
  const auto bad =
      std::find_if(images.begin(), images.end(), [](float v) { return !std::isfinite(v); });
  if (bad != images.end()) {
    return refuse(fmt::format("has {} at image value {}", *bad, bad - images.begin()));
  }
  actors::Batch batch;
  batch.step = next_;
  batch.images = kernels::Tensor::hostUninitialized({s.batch, s.channels, s.height, s.width});
  batch.labels = kernels::Tensor::hostUninitialized({s.batch}, kernels::DType::kInt32);
  std::copy(images.begin(), images.end(), batch.images.f32());
  std::copy(labels.begin(), labels.end(), batch.labels.i32());
  send(s.to, std::move(batch));
  ++next_;
  ++in_flight_;
  return {};
}

}  // namespace troupe
