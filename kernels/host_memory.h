// The host memory of this process's tensors, counted by kernels/tensor.cc: what every Tensor::host
// and hostUninitialized (which the CPU backend and the actors allocate through) holds now, and its
// peak. A run logs its peak against max_memory (actors/run/trainer.cc), whose estimate
// (checkModelMemory) refuses a run before it starts, and holds its tensors to it (setLimit): an
// allocation that would take them past it fails, so that a run the estimate wrongly admitted
// stops with an error naming the tensor, not with the host's out-of-memory killer. Thread safe.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::kernels {

struct HostTensorMemory {
  static std::int64_t inUse();
  static std::int64_t peak();
  static void resetPeak();  // to what is in use now
  // From now on an allocation that would take inUse() above `bytes` throws ResourceError instead,
  // naming the tensor, what is in use, and `named` (the setting the limit comes from: "max_memory
  // 26214400 (25.0 MiB)"); 0: no limit (as at the start).
  static void setLimit(std::int64_t bytes, std::string named);
};

}  // namespace troupe::kernels
