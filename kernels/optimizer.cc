#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/backend.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(Backend& backend, std::int64_t size, const SgdOptions& options)
      : backend_(backend), options_(options), state_(backend.empty({size})) {}

  bool step(const Tensor& weights, const Tensor& grads, float lr) override {
    TROUPE_ENFORCE_EQ(weights.numel(), state_.numel());
    TROUPE_ENFORCE_EQ(grads.numel(), state_.numel());
    sgdUpdateRange(backend_, weights, grads, state_, 0, state_.numel(), lr, options_);
    return finite();
  }

  void stepRange(const Tensor& weights, const Tensor& grads, std::int64_t begin, std::int64_t end,
                 float lr) override {
    TROUPE_ENFORCE_EQ(weights.numel(), end - begin);
    TROUPE_ENFORCE_EQ(grads.numel(), end - begin);
    sgdUpdateRange(backend_, weights, grads, state_.slice(begin, end), begin, end, lr, options_);
  }

  bool finite() override { return backend_.updatesFinite(); }

  const Tensor& state() const override { return state_; }

 private:
  Backend& backend_;
  SgdOptions options_;
  Tensor state_;
};

}  // namespace

void sgdUpdateRange(Backend& backend, const Tensor& weights, const Tensor& grads,
                    const Tensor& momentum, std::int64_t begin, std::int64_t end, float lr,
                    const SgdOptions& options) {
  if (options.no_decay.empty() || options.weight_decay == 0.0f) {
    backend.sgdUpdate(weights, grads, momentum, lr, options.momentum, options.weight_decay,
                      options.nesterov);
    return;
  }
  // The no-decay ranges within [begin, end), relative to it: one call (one pass on a device).
  std::vector<std::pair<std::int64_t, std::int64_t>> none;
  for (const auto& [lo, hi] : options.no_decay) {
    if (hi <= begin) continue;
    if (lo >= end) break;
    none.emplace_back(std::max(lo, begin) - begin, std::min(hi, end) - begin);
  }
  backend.sgdUpdateExcept(weights, grads, momentum, lr, options.momentum, options.weight_decay,
                          options.nesterov, none);
}

std::unique_ptr<Optimizer> makeSgd(Backend& backend, std::int64_t size, const SgdOptions& options) {
  if (!(options.momentum >= 0.0f && options.momentum < 1.0f))
    throw InputError("sgd momentum = " + std::to_string(options.momentum) + " is outside [0, 1)");
  if (!(options.weight_decay >= 0.0f))
    throw InputError("sgd weight_decay = " + std::to_string(options.weight_decay) + " is negative");
  if (options.nesterov && options.momentum == 0.0f)
    throw InputError("sgd nesterov needs a momentum above 0");
  if (size < 0) throw InputError("sgd over " + std::to_string(size) + " parameters");
  std::int64_t after = 0;
  for (const auto& [lo, hi] : options.no_decay) {
    if (!(after <= lo && lo < hi && hi <= size)) {
      throw InputError("sgd no_decay range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       ") is empty, out of order or outside the " + std::to_string(size) +
                       " parameters");
    }
    after = hi;
  }
  return std::make_unique<Sgd>(backend, size, options);
}

void validate(const LrPolicy& p) {
  auto fail = [&](const std::string& what) {
    throw InputError("lr policy '" + p.policy + "': " + what);
  };
  if (!(p.base > 0.0f) || !std::isfinite(p.base)) fail("base rate must be positive");
  if (p.warmup_steps < 0) fail("warmup_steps must not be negative");
  if (p.policy == "fixed") return;
  if (p.policy == "step") {
    if (p.stepsize <= 0) fail("needs stepsize > 0");
    if (!(p.gamma > 0.0f)) fail("needs gamma > 0");
  } else if (p.policy == "multistep") {
    if (p.stepvalues.empty()) fail("needs stepvalues");
    if (!std::is_sorted(p.stepvalues.begin(), p.stepvalues.end()))
      fail("stepvalues must be increasing");
    if (!(p.gamma > 0.0f)) fail("needs gamma > 0");
  } else if (p.policy == "cosine") {
    if (p.max_steps <= 0) fail("needs max_steps > 0");
  } else {
    throw InputError("unknown lr policy '" + p.policy +
                     "' (known: fixed, step, multistep, cosine)");
  }
}

float learningRate(const LrPolicy& p, std::int64_t step) {
  double lr = p.base;
  if (p.policy == "step") {
    lr *= std::pow(static_cast<double>(p.gamma), static_cast<double>(step / p.stepsize));
  } else if (p.policy == "multistep") {
    const auto passed =
        std::upper_bound(p.stepvalues.begin(), p.stepvalues.end(), step) - p.stepvalues.begin();
    lr *= std::pow(static_cast<double>(p.gamma), static_cast<double>(passed));
  } else if (p.policy == "cosine") {
    const double t = static_cast<double>(std::min(step, p.max_steps)) / p.max_steps;
    lr *= 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  } else if (p.policy != "fixed") {
    validate(p);
  }
  if (step < p.warmup_steps)
    lr *= static_cast<double>(step + 1) / static_cast<double>(p.warmup_steps);
  return static_cast<float>(lr);
}

}  // namespace troupe::kernels
