// A flat tensor that holds some ranges of a model's flat parameters, or of their gradients, laid
// one after another in order: a pipeline stage's net keeps the gradients of its own stage's
// parameters and of the tied weights it reads, and no others (NetOptions::stage_grads). Layers
// take their parameters from it by their place in the whole model's (Layer::bind). Or each range
// at a place of its own, shared with others (ZeRO stage 2's gradient slots).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/tensor.h"

namespace troupe::kernels {

class FlatParams {
 public:
  using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

  FlatParams() = default;
  // Every one: [0, values.numel()) of the model's.
  explicit FlatParams(Tensor values) : values_(std::move(values)) {}
  // `held`, sorted and apart, one after another in `values` (which must hold them all, or be a
  // tensor without memory).
  FlatParams(Tensor values, Ranges held);
  // `held`, sorted and apart, range i at offset at[i] of `values`: ranges may share memory (a
  // net's gradient slots, NetOptions::grad_slots, each holding one bucket at a time).
  FlatParams(Tensor values, Ranges held, std::vector<std::int64_t> at);

  // [begin, end) of the model's flat parameters, which must lie in one held range; a tensor
  // without memory where `values` has none (a net that runs no backward binds its layers to it).
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  // How many values `ranges` span.
  static std::int64_t count(const Ranges& ranges) {
    std::int64_t n = 0;
    for (const auto& [begin, end] : ranges)
      n += end - begin;
    return n;
  }

  // The ranges held, in order ({0, values.numel()} for every one).
  Ranges window() const { return every_ ? Ranges{{0, values_.numel()}} : held_; }

 private:
  Tensor values_;
  bool every_ = true;
  Ranges held_;
  std::vector<std::int64_t> at_;  // where held_[i] starts in values_
};

}  // namespace troupe::kernels
