#include "kernels/optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/backend.h"
#include "kernels/optimizers/rule_optimizer.h"
#include "troupe/error.h"

namespace troupe::kernels {

const OptimizerInfo& optimizerInfo(const std::string& name) {
  for (const auto& row : optimizers())
    if (row.name == name) return row;
  throw InputError(fmt::format("unknown optimizer '{}' (known: {})", name, optimizerNames()));
}

std::string optimizerNames() {
  return namesOf(optimizers());
}

std::vector<ParamRange> clipRanges(const std::vector<ParamRange>& ranges, std::int64_t begin,
                                   std::int64_t end) {
  std::vector<ParamRange> out;
  for (const auto& [lo, hi] : ranges) {
    if (hi <= begin || lo >= end) continue;
    out.emplace_back(std::max(lo, begin) - begin, std::min(hi, end) - begin);
  }
  return out;
}

bool setOptimizerName(OptimizerSettings& settings, const std::string& name) {
  if (name == "nag") {  // MXNet's name for SGD with Nesterov momentum
    settings.kind = &optimizerInfo("sgd");
    settings.nesterov = true;
    return true;
  }
  for (const auto& row : optimizers()) {
    if (row.name != name) continue;
    settings.kind = &row;
    return true;
  }
  return false;
}

OptimizerSettings optimizerNamed(const std::string& name) {
  OptimizerSettings s;
  if (!setOptimizerName(s, name)) optimizerInfo(name);  // throws, listing the known names
  return s;
}

const OptimizerInfo& OptimizerSettings::info() const {
  return kind ? *kind : optimizers().front();
}

const std::string& OptimizerSettings::name() const {
  return info().name;
}

OptimizerSettings OptimizerSettings::within(std::int64_t begin, std::int64_t end) const {
  OptimizerSettings part = *this;
  part.no_decay = clipRanges(no_decay, begin, end);
  part.layers = clipRanges(layers, begin, end);
  return part;
}

std::int64_t Optimizer::size() const {
  return state().numel() / static_cast<std::int64_t>(std::max<std::size_t>(1, states().size()));
}

bool Optimizer::step(const Tensor& weights, const Tensor& grads, float lr, std::int64_t t) {
  TROUPE_ENFORCE_EQ(weights.numel(), size());
  TROUPE_ENFORCE_EQ(grads.numel(), size());
  stepRange(weights, grads, 0, size(), lr, t);
  return finite();
}

OptimizerSettings sgdSettings(float momentum, float weight_decay, bool nesterov,
                              std::vector<ParamRange> no_decay) {
  OptimizerSettings s;
  s.momentum = momentum;
  s.weight_decay = weight_decay;
  s.nesterov = nesterov;
  s.no_decay = std::move(no_decay);
  return s;
}

RuleOptimizer::RuleOptimizer(Backend& backend, std::int64_t size, OptimizerSettings settings,
                             UpdateKernel kernel)
    : backend_(backend),
      settings_(std::move(settings)),
      info_(settings_.info()),
      kernel_(kernel),
      size_(size),
      state_(backend.empty({kernel.states * size})) {
  TROUPE_ENFORCE_EQ(static_cast<std::size_t>(kernel.states), info_.states.size());
}

void RuleOptimizer::stepRange(const Tensor& weights, const Tensor& grads, std::int64_t begin,
                              std::int64_t end, float lr, std::int64_t t) {
  TROUPE_ENFORCE(0 <= begin && begin <= end && end <= size_, "step of [", begin, ", ", end, ") of ",
                 size_, " weights");
  TROUPE_ENFORCE_EQ(weights.numel(), end - begin);
  TROUPE_ENFORCE_EQ(grads.numel(), end - begin);
  TROUPE_ENFORCE(t >= 1, settings_.name(), " update number ", t, " (they count from 1)");
  UpdateArgs a;
  a.w = weights;
  a.g = grads;
  a.state = state_;
  a.state_offset = begin;
  a.stride = size_;
  a.scalars.lr = lr;
  a.scalars.weight_decay = settings_.weight_decay;
  for (std::size_t k = 0; k < info_.settings.size(); ++k)
    a.scalars.c[k] = settings_.*(info_.settings[k].field);
  if (info_.at_step) info_.at_step(settings_, lr, t, a.scalars);
  a.no_decay = clipRanges(settings_.no_decay, begin, end);
  if (kernel_.layerwise) a.layers = clipRanges(settings_.layers, begin, end);
  backend_.update(kernel_, a);
}

bool RuleOptimizer::finite() {
  return backend_.updatesFinite();
}

void check(const OptimizerSettings& s, std::int64_t size) {
  const OptimizerInfo& info = s.info();
  // Not below 0 (nor NaN); an infinite decay is left to the run, which stops at its first update.
  if (!(s.weight_decay >= 0.0f))
    throw InputError(fmt::format("{} weight_decay = {:g} is not >= 0", s.name(), s.weight_decay));
  if (size < 0) throw InputError(fmt::format("{} over {} parameters", s.name(), size));
  for (const auto* ranges : {&s.no_decay, &s.layers}) {
    std::int64_t after = 0;
    for (const auto& [lo, hi] : *ranges) {
      if (!(after <= lo && lo < hi && hi <= size)) {
        throw InputError(
            fmt::format("{} {} range [{}, {}) is empty, out of order or outside the {} parameters",
                        s.name(), ranges == &s.layers ? "layer" : "no_decay", lo, hi, size));
      }
      after = hi;
    }
  }
  for (const OptimizerSetting& setting : info.settings) {
    float value = s.*(setting.field);
    if (setting.field == &OptimizerSettings::epsilon && value == 0.0f) value = info.epsilon;
    if (value >= setting.lo && (value < setting.hi || (setting.hi_closed && value == setting.hi)))
      continue;
    throw InputError(fmt::format("{} {} = {:g} is outside [{:g}, {:g}{}", s.name(), setting.key,
                                 value, setting.lo, setting.hi, setting.hi_closed ? "]" : ")"));
  }
  if (info.check) info.check(s);
}

std::unique_ptr<Optimizer> makeOptimizer(Backend& backend, std::int64_t size,
                                         const OptimizerSettings& settings) {
  check(settings, size);
  OptimizerSettings s = settings;
  if (s.epsilon == 0.0f) s.epsilon = s.info().epsilon;
  return s.info().make(backend, size, s);
}

std::string describe(const OptimizerSettings& s) {
  const OptimizerInfo& info = s.info();
  std::string out = s.name();
  std::string parts;
  for (const OptimizerSetting& setting : info.settings) {
    float value = s.*(setting.field);
    if (setting.field == &OptimizerSettings::epsilon && value == 0.0f) value = info.epsilon;
    parts += fmt::format("{}{} {:g}", parts.empty() ? "" : ", ", setting.key, value);
  }
  if (info.name == "sgd" && s.nesterov) parts += ", nesterov";
  if (!parts.empty()) out += " (" + parts + ")";
  return out + fmt::format(", weight decay {:g}", s.weight_decay);
}

void sgdUpdateRange(Backend& backend, const Tensor& weights, const Tensor& grads,
                    const Tensor& momentum, std::int64_t begin, std::int64_t end, float lr,
                    const OptimizerSettings& options) {
  if (options.no_decay.empty() || options.weight_decay == 0.0f) {
    backend.sgdUpdate(weights, grads, momentum, lr, options.momentum, options.weight_decay,
                      options.nesterov);
    return;
  }
  // The no-decay ranges within [begin, end), relative to it: one call (one pass on a device).
  backend.sgdUpdateExcept(weights, grads, momentum, lr, options.momentum, options.weight_decay,
                          options.nesterov, clipRanges(options.no_decay, begin, end));
}

void validate(const LrPolicy& p) {
  auto fail = [&](const std::string& what) {
    throw InputError(fmt::format("lr policy '{}': {}", nameIn(kLrPolicies, p.policy), what));
  };
  if (!(p.base > 0.0f) || !std::isfinite(p.base)) fail("base rate must be positive");
  if (p.warmup_steps < 0) fail("warmup_steps must not be negative");
  switch (p.policy) {
    case LrSchedule::kFixed:
      return;
    case LrSchedule::kStep:
      if (p.stepsize <= 0) fail("needs stepsize > 0");
      if (!(p.gamma > 0.0f)) fail("needs gamma > 0");
      return;
    case LrSchedule::kMultistep:
      if (p.stepvalues.empty()) fail("needs stepvalues");
      if (!std::is_sorted(p.stepvalues.begin(), p.stepvalues.end()))
        fail("stepvalues must be increasing");
      if (!(p.gamma > 0.0f)) fail("needs gamma > 0");
      return;
    case LrSchedule::kCosine:
      if (p.max_steps <= 0) fail("needs max_steps > 0");
      return;
    case LrSchedule::kPoly:
      if (p.max_steps <= 0) fail("needs max_steps > 0");
      if (!(p.power > 0.0f) || !std::isfinite(p.power)) fail("needs power > 0");
      if (!(p.end >= 0.0f && p.end <= p.base)) fail("needs 0 <= end rate <= base rate");
      return;
  }
}

float learningRate(const LrPolicy& p, std::int64_t step) {
  double lr = p.base;
  switch (p.policy) {
    case LrSchedule::kFixed:
      break;
    case LrSchedule::kStep:
      lr *= std::pow(static_cast<double>(p.gamma), static_cast<double>(step / p.stepsize));
      break;
    case LrSchedule::kMultistep: {
      const auto passed =
          std::upper_bound(p.stepvalues.begin(), p.stepvalues.end(), step) - p.stepvalues.begin();
      lr *= std::pow(static_cast<double>(p.gamma), static_cast<double>(passed));
      break;
    }
    case LrSchedule::kCosine: {
      const double t = static_cast<double>(std::min(step, p.max_steps)) / p.max_steps;
      lr *= 0.5 * (1.0 + std::cos(std::numbers::pi * t));
      break;
    }
    case LrSchedule::kPoly: {
      const double t = static_cast<double>(std::min(step, p.max_steps)) / p.max_steps;
      lr = p.end + (lr - p.end) * std::pow(1.0 - t, static_cast<double>(p.power));
      break;
    }
  }
  if (step < p.warmup_steps)
    lr *= static_cast<double>(step + 1) / static_cast<double>(p.warmup_steps);
  return static_cast<float>(lr);
}

}  // namespace troupe::kernels
