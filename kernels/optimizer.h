// Optimizers and learning-rate policies.
//
// An optimizer updates a flat weight tensor in place from a flat gradient tensor on one backend.
// Its state (momentum) is a flat tensor too, so checkpoints and parameter-server shards can hold
// any slice of it. Thread safety: like the backend it runs on, one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/tensor.h"

namespace troupe::kernels {

class Backend;

// A range [first, second) of a flat parameter tensor.
using ParamRange = std::pair<std::int64_t, std::int64_t>;

struct SgdOptions {
  float momentum = 0.9f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  // Ranges of parameters that weight decay leaves alone (biases and batch-norm scales and shifts
  // in Goyal et al.'s recipe; kernels::noDecayRanges), sorted and disjoint.
  std::vector<ParamRange> no_decay;
};

// The SGD update of elements [begin, end) of the flat parameters (weights, grads and momentum are
// those elements), with no weight decay on options.no_decay: Backend::sgdUpdate over each piece.
// Whether every updated weight is finite is the backend's updatesFinite() to say.
void sgdUpdateRange(Backend& backend, const Tensor& weights, const Tensor& grads,
                    const Tensor& momentum, std::int64_t begin, std::int64_t end, float lr,
                    const SgdOptions& options);

// SGD with PyTorch's semantics: g' = g + weight_decay * w; v = momentum * v + g';
// w -= lr * v, or with nesterov w -= lr * (g' + momentum * v). The momentum buffer starts at zero.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // weights -= step computed from grads (+ weight decay) at learning rate lr. weights, grads and
  // state() have the same element count. Returns whether every weight updated since the last
  // finite() is finite (checked in the update's own pass; see Backend::sgdUpdate): false means the
  // run diverged. A host wait for the update on a device.
  virtual bool step(const Tensor& weights, const Tensor& grads, float lr) = 0;
  // The same for elements [begin, end) only: `weights` and `grads` are those elements (slices),
  // and no host wait: finite() says after the last range of a step. Optimizers here are
  // elementwise, so updating a bucket as soon as it is reduced gives exactly the result of one
  // step over the whole tensor.
  virtual void stepRange(const Tensor& weights, const Tensor& grads, std::int64_t begin,
                         std::int64_t end, float lr) = 0;
  // Whether every weight updated since the last call (or step()) is finite
  // (Backend::updatesFinite).
  virtual bool finite() = 0;
  // Momentum buffer; restore a checkpoint by copying into it.
  virtual const Tensor& state() const = 0;
};

// Throws InputError for a momentum outside [0, 1), a negative weight decay, or nesterov without
// momentum. The optimizer runs on `backend` (threaded and vectorised there).
std::unique_ptr<Optimizer> makeSgd(Backend& backend, std::int64_t size, const SgdOptions& options);

// Learning rate at a step, Caffe's policies plus linear warmup:
//   fixed:     base
//   step:      base * gamma^(floor(step / stepsize))
//   multistep: base * gamma^(number of stepvalues <= step)
//   cosine:    base * 0.5 * (1 + cos(pi * min(step, max_steps) / max_steps))
// Linear warmup multiplies that rate by (step + 1) / warmup_steps while step < warmup_steps, so the
// first step (step 0) runs at rate / warmup_steps and step warmup_steps - 1 at the full rate.
// Steps count from 0.
struct LrPolicy {
  std::string policy = "fixed";
  float base = 0.01f;
  float gamma = 0.1f;
  std::int64_t stepsize = 0;
  std::vector<std::int64_t> stepvalues;
  std::int64_t max_steps = 0;
  std::int64_t warmup_steps = 0;
};

// Throws InputError for an unknown policy or one missing its parameters.
void validate(const LrPolicy& policy);
float learningRate(const LrPolicy& policy, std::int64_t step);

}  // namespace troupe::kernels
