// A Backend is one device's kernels and memory: the CPU (a thread budget) or one GPU (a stream).
//
// Layers and actors reach a device only through this interface, so a CUDA backend slots in beside
// the CPU one without changing them. Work is queued in order on the backend's stream: calls return
// once the work is queued, not necessarily done (on the CPU they run at once). synchronize() is the
// only host wait, and callers make it explicit (after a step, before reading a metric).
// Thread safety: one backend belongs to one actor (one replica); call it from one thread at a time.
#pragma once

#include <memory>

#include "kernels/tensor.h"

namespace troupe::kernels {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // Threads (CPU) this backend computes with.
  virtual int threads() const = 0;

  // Memory owned by this backend, zero-filled.
  virtual Tensor empty(Shape shape, DType dtype = DType::kFloat32) = 0;
  // Copies src into dst (same dtype and element count); either may be on the host or this device.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& t, float value) = 0;
  // y += alpha * x over all elements.
  virtual void axpy(float alpha, const Tensor& x, const Tensor& y) = 0;
  // t *= alpha.
  virtual void scale(const Tensor& t, float alpha) = 0;
  // Waits until all queued work is done.
  virtual void synchronize() = 0;
};

// A CPU backend computing with `threads` threads (oneDNN / OpenBLAS / OpenMP underneath).
std::unique_ptr<Backend> makeCpuBackend(int threads);

}  // namespace troupe::kernels
