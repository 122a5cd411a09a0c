// A caching allocator of one GPU's memory: blocks freed go back to a free list of their size and
// serve the next request of that size, so a steady-state step calls no cudaMalloc. Sizes round up
// (512 B granules below 1 MiB, 2 MiB granules above) so that a step's shapes hit the same lists.
// A block is reused only by work queued on the same stream, in stream order, so that reuse is
// safe without events: one allocator per backend (per stream). When cudaMalloc fails, the cache
// is released and the allocation tried once more, then a ResourceError says how much was asked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace troupe::kernels::cuda {

class DeviceAllocator : public std::enable_shared_from_this<DeviceAllocator> {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // Device memory of at least `bytes`, freed back to this cache when the last owner lets go.
  std::shared_ptr<void> allocate(std::size_t bytes);

  struct Stats {
    std::int64_t in_use = 0, reserved = 0, peak_in_use = 0, device_mallocs = 0;
    // The most every allocator of this process on the device held together.
    std::int64_t device_peak = 0;
  };
  Stats stats() const;
  // Both peaks from what is in use now: this allocator's, and the device's (every allocator's).
  void resetPeak();
  // Gives one cached block of `bytes` (rounded) back to the device, if there is one: for a
  // buffer that only grows (a workspace), whose outgrown block the cache would hold for nothing,
  // as it reuses blocks only at their own size. Work queued on it must be done.
  void freeCached(std::size_t bytes);

  // The blocks a CUDA graph's replays use that nobody else may, kept until the graph goes (its
  // handle): those freed during its capture. Blocks handed out during a capture and freed later
  // (in a tensor at its end) may be used by any graph captured since: they wait until no graph
  // lives. Then back in the cache.
  class Held;
  // While a CUDA graph is captured: a block freed goes to the capture's own free list, which
  // serves the capture's next requests of its size first (its work runs in stream order, as a
  // step's does), and never to another's until endHolding()'s handle goes.
  void beginHolding();
  std::shared_ptr<Held> endHolding();

 private:
  void release(void* p, std::size_t bytes);
  void count(std::int64_t delta);  // bytes in use, with mu_ held
  void emptyCache();               // with mu_ held

  int device_;
  mutable std::mutex mu_;
  std::multimap<std::size_t, void*> free_;
  bool holding_ = false;
  std::multimap<std::size_t, void*> capture_free_;            // freed while holding
  std::vector<std::pair<void*, std::size_t>> capture_given_;  // handed out while holding
  // Handed out during a capture and still in a tensor at its end; those of them freed since,
  // while a graph lives (`graphs_`: Helds alive).
  std::set<void*> kept_;
  std::vector<std::pair<void*, std::size_t>> kept_freed_;
  int graphs_ = 0;
  Stats stats_;
};

class DeviceAllocator::Held {
 public:
  explicit Held(std::shared_ptr<DeviceAllocator> owner) : owner_(std::move(owner)) {}
  ~Held();
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
  friend class DeviceAllocator;
  std::shared_ptr<DeviceAllocator> owner_;
  std::vector<std::pair<void*, std::size_t>> blocks_;  // with the owner's mu_ held
};

std::size_t roundedSize(std::size_t bytes);

}  // namespace troupe::kernels::cuda
