// One optimizer step as a backend runs it: an element-wise rule (kernels/optimizers/rule.h) over
// a range of flat weights, their gradients and the optimizer's state, with weight decay where the
// run wants it and, for a layerwise rule, a trust ratio per layer.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/optimizers/rule.h"
#include "kernels/tensor.h"

namespace troupe::kernels {

// A range [first, second) of a flat parameter tensor.
using ParamRange = std::pair<std::int64_t, std::int64_t>;

// Elements [0, w.numel()) of one update. Ranges are relative to w, sorted and disjoint.
struct UpdateArgs {
  Tensor w, g;  // float32, same size n, on the backend's device
  // The optimizer's whole state: element i's value k at state[state_offset + i + k * stride].
  Tensor state;
  std::int64_t state_offset = 0, stride = 0;
  UpdateScalars scalars;
  std::vector<ParamRange> no_decay;  // no weight decay here (and no trust ratio: ratio 1)
  std::vector<ParamRange> layers;    // layerwise rules: a trust ratio each (gaps are layers too)
};

// A rule as backends run it: by name on a device (its CUDA kernel is compiled under that name),
// by these functions on the CPU (kernels/cpu/update_loop.h makes them from the rule).
struct UpdateKernel {
  const char* name = "";
  int states = 0;
  bool layerwise = false;
  // Elements [b, e) on one thread; whether every new weight is finite.
  bool (*update)(const UpdateArgs& a, std::int64_t b, std::int64_t e, float decay,
                 float ratio) = nullptr;
  // Layerwise: adds the sums of w^2 and probe^2 over [b, e) to sums[0] and sums[1].
  void (*probe)(const UpdateArgs& a, std::int64_t b, std::int64_t e, float decay,
                double* sums) = nullptr;
  float (*ratio)(float w_norm, float probe_norm, const UpdateScalars& c, float decay) = nullptr;
};

// Where one decay and one trust ratio hold: [begin, end) with weight decay or none, in trust-ratio
// segment `segment` (an index into UpdatePlan::segments) or none (-1: ratio 1).
struct UpdatePiece {
  std::int64_t begin = 0, end = 0;
  int segment = -1;
  bool decay = true;
};
struct UpdatePlan {
  std::vector<UpdatePiece> pieces;   // in order, covering [0, n)
  std::vector<ParamRange> segments;  // layers that get a trust ratio (none but for layerwise)
};
// Checks the ranges (InvariantError) and cuts [0, n) where decay or layer changes; a layer with
// an element in no_decay gets no trust ratio.
UpdatePlan planUpdate(const UpdateArgs& a, bool layerwise);

}  // namespace troupe::kernels
