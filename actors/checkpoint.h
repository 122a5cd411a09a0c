// Checkpoints: everything a run needs to continue exactly where it stopped.
//
// A checkpoint file is written atomically (a temporary file in the same folder, fsync, rename,
// fsync of the folder), so a crash leaves either the previous file or the new one, never a torn
// one. It ends with a CRC-32 of its contents; loading a truncated or corrupted file throws
// InputError naming it, and nothing is half-loaded.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kernels/tensor.h"

namespace troupe::actors {

struct Checkpoint {
  // Free-form facts: model name, step, cumulative counters ... (text, no '=' or newline in keys).
  std::map<std::string, std::string> meta;
  kernels::Tensor weights;   // host float
  kernels::Tensor momentum;  // host float, same size as weights
  kernels::Tensor buffers;   // host float, may be empty

  std::int64_t metaInt(const std::string& key) const;
  double metaDouble(const std::string& key) const;
};

// Writes path atomically. Refuses (IoError) to replace a file that exists.
void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint);
Checkpoint loadCheckpoint(const std::string& path);

}  // namespace troupe::actors
