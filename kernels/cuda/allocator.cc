#include "kernels/cuda/allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "kernels/cuda/cuda_util.h"

namespace troupe::kernels::cuda {

std::size_t roundedSize(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = 2 << 20;
  if (bytes == 0) bytes = 1;
  const std::size_t granule = bytes < (1 << 20) ? kSmall : kLarge;
  return (bytes + granule - 1) / granule * granule;
}

namespace {

// Every allocator's blocks in use on one device, this process's (a replica's, its updater's, its
// copier's): what torch.cuda.max_memory_allocated counts of a process. Locked apart from any
// allocator's mutex, and only inside one.
struct DeviceTotals {
  std::mutex mu;
  std::map<int, std::pair<std::int64_t, std::int64_t>> in_use_and_peak;
};

DeviceTotals& deviceTotals() {
  static DeviceTotals totals;
  return totals;
}

void countOnDevice(int device, std::int64_t delta) {
  DeviceTotals& t = deviceTotals();
  std::lock_guard lock(t.mu);
  auto& [in_use, peak] = t.in_use_and_peak[device];
  in_use += delta;
  peak = std::max(peak, in_use);
}

}  // namespace

void DeviceAllocator::count(std::int64_t delta) {
  stats_.in_use += delta;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  countOnDevice(device_, delta);
}

DeviceAllocator::~DeviceAllocator() {
  std::lock_guard lock(mu_);
  cudaSetDevice(device_);
  for (auto& [size, p] : free_)
    cudaFree(p);  // at exit, a failure has nobody to tell
}

std::shared_ptr<void> DeviceAllocator::allocate(std::size_t bytes) {
  const std::size_t size = roundedSize(bytes);
  void* p = nullptr;
  {
    std::lock_guard lock(mu_);
    // While a graph is captured, the blocks its work freed first (still counted in use).
    const auto own = holding_ ? capture_free_.find(size) : capture_free_.end();
    if (own != capture_free_.end()) {
      p = own->second;
      capture_free_.erase(own);
      count(-static_cast<std::int64_t>(size));  // counted again below
    } else if (auto it = free_.find(size); it != free_.end()) {
      p = it->second;
      free_.erase(it);
    } else {
      TROUPE_CUDA_CHECK(cudaSetDevice(device_));
      cudaError_t e = cudaSuccess;
      if (holding_) {
        // cudaMalloc would end a capture in this thread's mode: relaxed around it (the memory is
        // the graph's from now on, never freed while it lives), and no retry, whose
        // synchronize and frees a capture cannot hold.
        cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
        TROUPE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
        e = cudaMalloc(&p, size);
        TROUPE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      } else {
        e = cudaMalloc(&p, size);
      }
      if (e == cudaErrorMemoryAllocation && !holding_) {
        cudaGetLastError();  // clears the failed call's error before the retry
        TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
        emptyCache();
        e = cudaMalloc(&p, size);
      }
      // Another error is not this call's: a kernel's fault, say, which CUDA returns from every
      // call after it. Named as it is, not as memory.
      if (e != cudaSuccess && e != cudaErrorMemoryAllocation) {
        cudaGetLastError();  // thrown once, here, not again by the next check
        check(e, "cudaMalloc", __FILE__, __LINE__);
      }
      if (e != cudaSuccess) {
        cudaGetLastError();
        throw ResourceError("out of GPU memory on cuda:" + std::to_string(device_) +
                            ": asked for " + std::to_string(size) + " bytes with " +
                            std::to_string(stats_.in_use) + " in use (" + cudaGetErrorString(e) +
                            ")");
      }
      stats_.reserved += static_cast<std::int64_t>(size);
      ++stats_.device_mallocs;
    }
    if (holding_) capture_given_.emplace_back(p, size);
    count(static_cast<std::int64_t>(size));
  }
  auto self = shared_from_this();
  return std::shared_ptr<void>(p, [self, size](void* q) { self->release(q, size); });
}

void DeviceAllocator::release(void* p, std::size_t size) {
  std::lock_guard lock(mu_);
  // A block handed out during a capture: a graph's replays may use it while any graph lives
  // (kept_ holds blocks only then: the last graph's Held clears it).
  if (kept_.erase(p) > 0) {
    kept_freed_.emplace_back(p, size);
    return;
  }
  if (holding_) {
    capture_free_.emplace(size, p);
    return;
  }
  count(-static_cast<std::int64_t>(size));
  free_.emplace(size, p);
}

void DeviceAllocator::beginHolding() {
  std::lock_guard lock(mu_);
  holding_ = true;
}

std::shared_ptr<DeviceAllocator::Held> DeviceAllocator::endHolding() {
  auto held = std::make_shared<Held>(shared_from_this());
  std::lock_guard lock(mu_);
  holding_ = false;
  ++graphs_;
  std::set<void*> freed;
  for (const auto& [size, p] : capture_free_) {
    held->blocks_.emplace_back(p, size);
    freed.insert(p);
  }
  for (const auto& [p, size] : capture_given_)
    if (!freed.count(p)) kept_.insert(p);
  capture_free_.clear();
  capture_given_.clear();
  return held;
}

DeviceAllocator::Held::~Held() {
  std::lock_guard lock(owner_->mu_);
  auto giveBack = [&](const std::vector<std::pair<void*, std::size_t>>& blocks) {
    for (const auto& [p, size] : blocks) {
      owner_->count(-static_cast<std::int64_t>(size));
      owner_->free_.emplace(size, p);
    }
  };
  giveBack(blocks_);
  if (--owner_->graphs_ == 0) {  // no replay can use a block handed out in a capture any more
    giveBack(owner_->kept_freed_);
    owner_->kept_freed_.clear();
    owner_->kept_.clear();
  }
}

void DeviceAllocator::freeCached(std::size_t bytes) {
  std::lock_guard lock(mu_);
  const std::size_t size = roundedSize(bytes);
  const auto it = free_.find(size);
  if (it == free_.end()) return;
  TROUPE_CUDA_CHECK(cudaSetDevice(device_));
  TROUPE_CUDA_CHECK(cudaFree(it->second));
  free_.erase(it);
  stats_.reserved -= static_cast<std::int64_t>(size);
}

void DeviceAllocator::emptyCache() {
  for (auto& [size, p] : free_) {
    cudaFree(p);
    stats_.reserved -= static_cast<std::int64_t>(size);
  }
  free_.clear();
}

void DeviceAllocator::resetPeak() {
  std::lock_guard lock(mu_);
  stats_.peak_in_use = stats_.in_use;
  DeviceTotals& t = deviceTotals();
  std::lock_guard device_lock(t.mu);
  auto& [in_use, peak] = t.in_use_and_peak[device_];
  peak = in_use;
}

DeviceAllocator::Stats DeviceAllocator::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  DeviceTotals& t = deviceTotals();
  std::lock_guard device_lock(t.mu);
  s.device_peak = t.in_use_and_peak[device_].second;
  return s;
}

}  // namespace troupe::kernels::cuda
