// What the tests of whole nets share (kernels_net_test.cc, kernels_pipeline_test.cc): a built-in
// model's options for images, and random images with labels.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/net.h"
#include "kernels/random.h"
#include "kernels/tensor.h"

namespace troupe::testing {

// Built-in model `name` for batches of up to `batch` images of c x hw x hw.
inline kernels::NetOptions imageModel(const std::string& name, std::int64_t batch,
                                      std::int64_t c = 1, std::int64_t hw = 28) {
  kernels::NetOptions o;
  o.model.name = name;
  o.max_batch = batch;
  o.channels = c;
  o.height = o.width = hw;
  return o;
}

struct NetBatch {
  kernels::Tensor inputs, labels;
};

// n images of c x h x w, each value uniform in [-1, 1) from `seed`, labelled 0, 1, ..., 9, 0, ...
inline NetBatch randomImages(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                             std::uint64_t seed) {
  using kernels::Tensor;
  NetBatch b{Tensor::host({n, c, h, w}), Tensor::host({n}, kernels::DType::kInt32)};
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i)
    b.inputs.f32()[i] = 2.0f * kernels::uniform01(kernels::randomBits(seed, 0, i)) - 1.0f;
  for (std::int64_t i = 0; i < n; ++i)
    b.labels.i32()[i] = static_cast<int>(i % 10);
  return b;
}

}  // namespace troupe::testing
