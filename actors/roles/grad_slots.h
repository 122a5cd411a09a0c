// ZeRO stage 2: which of a replica's gradient slots (kernels::NetOptions::grad_slots) hold a
// bucket that its reducer has not taken yet. The replica fills a slot as it hands the bucket on;
// the reducer releases it once the ring reduce-scattered the bucket and this worker's shard of
// the sums is copied out; the replica's backward waits for a slot to be free before it writes
// into it. Thread safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace troupe::actors {

class GradSlots {
 public:
  // A bucket in a slot: its step and its first gradient's index.
  struct Bucket {
    std::int64_t step = -1, begin = -1;
  };

  explicit GradSlots(int count) : held_(static_cast<std::size_t>(count)) {}

  // The bucket of `step` starting at `begin` is in `slot` now.
  void fill(int slot, std::int64_t step, std::int64_t begin);
  // That bucket is taken: its slot, if it holds it, is free.
  void release(std::int64_t step, std::int64_t begin);
  // Waits until `slot` is free: nullopt once it is, the bucket it still holds after `timeout`.
  // Throws Error once abort() was called.
  std::optional<Bucket> waitFree(int slot, std::chrono::milliseconds timeout);
  // The run is failing: every wait ends, now and later.
  void abort();

 private:
  std::mutex mutex_;
  std::condition_variable freed_;
  std::vector<std::optional<Bucket>> held_;
  bool aborted_ = false;
};

}  // namespace troupe::actors
