#include "kernels/cuda/allocator.h"

#include <cuda_runtime_api.h>

#include <string>

#include "kernels/cuda/cuda_util.h"

namespace troupe::kernels::cuda {

std::size_t roundedSize(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = 2 << 20;
  if (bytes == 0) bytes = 1;
  const std::size_t granule = bytes < (1 << 20) ? kSmall : kLarge;
  return (bytes + granule - 1) / granule * granule;
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
    if (auto it = free_.find(size); it != free_.end()) {
      p = it->second;
      free_.erase(it);
    } else {
      TROUPE_CUDA_CHECK(cudaSetDevice(device_));
      cudaError_t e = cudaMalloc(&p, size);
      if (e == cudaErrorMemoryAllocation) {
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
    stats_.in_use += static_cast<std::int64_t>(size);
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
  }
  auto self = shared_from_this();
  std::shared_ptr<void> block(p, [self, size](void* q) { self->release(q, size); });
  std::lock_guard lock(mu_);
  if (holding_) given_while_holding_.push_back(block);
  return block;
}

void DeviceAllocator::release(void* p, std::size_t size) {
  std::lock_guard lock(mu_);
  if (holding_) {
    freed_while_holding_.emplace_back(p, size);
    return;
  }
  stats_.in_use -= static_cast<std::int64_t>(size);
  free_.emplace(size, p);
}

void DeviceAllocator::beginHolding() {
  std::lock_guard lock(mu_);
  holding_ = true;
}

std::vector<std::shared_ptr<void>> DeviceAllocator::endHolding() {
  std::vector<std::pair<void*, std::size_t>> freed;
  std::vector<std::shared_ptr<void>> held;
  {
    std::lock_guard lock(mu_);
    holding_ = false;
    freed.swap(freed_while_holding_);
    held.swap(given_while_holding_);
  }
  auto self = shared_from_this();
  for (const auto& [p, size] : freed)
    held.emplace_back(p, [self, size = size](void* q) { self->release(q, size); });
  return held;
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

DeviceAllocator::Stats DeviceAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace troupe::kernels::cuda
