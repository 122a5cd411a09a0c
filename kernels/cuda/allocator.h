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
  };
  Stats stats() const;
  // Gives one cached block of `bytes` (rounded) back to the device, if there is one: for a
  // buffer that only grows (a workspace), whose outgrown block the cache would hold for nothing,
  // as it reuses blocks only at their own size. Work queued on it must be done.
  void freeCached(std::size_t bytes);

  // While a CUDA graph is captured: every block freed, or handed out, from beginHolding() to
  // endHolding() is kept out of the cache until the last of the returned handles goes (the
  // graph's), since the graph's replays still use it, whoever its tensor belonged to.
  void beginHolding();
  std::vector<std::shared_ptr<void>> endHolding();

 private:
  void release(void* p, std::size_t bytes);
  void emptyCache();  // with mu_ held

  int device_;
  mutable std::mutex mu_;
  std::multimap<std::size_t, void*> free_;
  bool holding_ = false;
  std::vector<std::pair<void*, std::size_t>> freed_while_holding_;
  std::vector<std::shared_ptr<void>> given_while_holding_;
  Stats stats_;
};

std::size_t roundedSize(std::size_t bytes);

}  // namespace troupe::kernels::cuda
