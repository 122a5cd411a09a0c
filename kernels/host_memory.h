// The host memory of this process's tensors, counted by kernels/tensor.cc: what every Tensor::host
// and hostUninitialized (which the CPU backend and the actors allocate through) holds now, and its
// peak. A run logs its peak against max_memory (actors/run/trainer.cc), whose estimate
// (checkModelMemory) refuses a run before it starts. Thread safe.
#pragma once

#include <cstdint>

namespace troupe::kernels {

struct HostTensorMemory {
  static std::int64_t inUse();
  static std::int64_t peak();
  static void resetPeak();  // to what is in use now
};

}  // namespace troupe::kernels
