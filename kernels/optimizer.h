// Optimizers and learning-rate policies.
//
// An optimizer updates a flat weight tensor in place from a flat gradient tensor on one backend.
// Its state is `states` named rows of the weights' size, held as one flat tensor (row k of
// element i at k * size + i), so checkpoints, messages and parameter-server shards carry any
// slice of it by name. The optimizers are a table (optimizers()): one file each under
// kernels/optimizers/ defining its row, which the build lists (cmake/registry.cmake), with its rule
// (a header both the CPU and CUDA compile). Thread safety: like the backend it runs on, one thread
// at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/named.h"
#include "kernels/tensor.h"
#include "kernels/update.h"

namespace troupe::kernels {

class Backend;
struct OptimizerInfo;

// Every optimizer's settings; each reads the ones its row names (OptimizerInfo::settings).
struct OptimizerSettings {
  // The optimizer: its row of optimizers(), picked by name where names come in (a config key,
  // MXNet's optimizer name, a message, a checkpoint: setOptimizerName); null is SGD, the first.
  const OptimizerInfo* kind = nullptr;
  float weight_decay = 0.0f;
  float momentum = 0.9f;               // sgd, lars
  bool nesterov = false;               // sgd
  float beta1 = 0.9f, beta2 = 0.999f;  // adam, adamw, lamb
  // 0: the optimizer's own default (OptimizerInfo::epsilon): 1e-8 for Adam, AdamW and RMSProp,
  // 1e-10 for Adagrad (PyTorch's), 1e-6 for LAMB, 0 for LARS.
  float epsilon = 0.0f;
  float rho = 0.9f;    // rmsprop: the squares' decay (MXNet's gamma1; PyTorch's alpha)
  float eta = 0.001f;  // lars: the trust coefficient
  // Ranges of parameters that weight decay (and a layerwise trust ratio) leaves alone: biases
  // and batch-norm scales and shifts in Goyal et al.'s recipe (kernels::noDecayRanges). Sorted,
  // disjoint, relative to the optimizer's elements.
  std::vector<ParamRange> no_decay;
  // The parameter tensors' ranges: a layerwise optimizer's trust ratio is per range.
  std::vector<ParamRange> layers;

  // These settings for elements [begin, end) of the ones they were made for: the ranges clipped
  // to it and made relative to begin (a parameter server's shard, a bucket).
  OptimizerSettings within(std::int64_t begin, std::int64_t end) const;
  // The optimizer's row, and its name ("sgd", "adamw": what logs, messages and checkpoints say).
  const OptimizerInfo& info() const;
  const std::string& name() const;
};

// The ranges' parts within [begin, end), relative to begin.
std::vector<ParamRange> clipRanges(const std::vector<ParamRange>& ranges, std::int64_t begin,
                                   std::int64_t end);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Elements [begin, end) of the weights, one update (the t-th of this state, counting from 1:
  // Adam's bias correction) at learning rate lr: `weights` and `grads` are those elements. No host
  // wait; finite() says after the last range of a step. An element-wise optimizer gives for ranges
  // in any order what one update of the whole does; a layerwise one (layerwise()) needs whole
  // layers (a trust ratio of part of a layer is of that part).
  virtual void stepRange(const Tensor& weights, const Tensor& grads, std::int64_t begin,
                         std::int64_t end, float lr, std::int64_t t) = 0;
  // Whether every weight updated since the last call is finite (Backend::updatesFinite): false
  // means the run diverged. A host wait on a device.
  virtual bool finite() = 0;
  // The state: states().size() rows of size(); restore a checkpoint by copying into it.
  virtual const Tensor& state() const = 0;
  virtual const std::vector<std::string>& states() const = 0;
  virtual bool layerwise() const = 0;

  std::int64_t size() const;
  // All elements; whether every updated weight is finite (a host wait).
  bool step(const Tensor& weights, const Tensor& grads, float lr, std::int64_t t);
};

// A setting an optimizer reads (besides weight_decay), by its config key, with its range
// [lo, hi) (hi included where hi_closed).
struct OptimizerSetting {
  const char* key;
  float OptimizerSettings::*field;
  float lo, hi;
  bool hi_closed;
};

// A row of the optimizers' table.
struct OptimizerInfo {
  std::string name;
  std::string summary;  // one line for help texts, docs and `troupe info`
  // The settings it reads: checked against their ranges, shown by describe(), and for a rule
  // the first scalars of its UpdateScalars::c, in this order (kernels/optimizers/rule.h).
  std::vector<OptimizerSetting> settings;
  float epsilon = 0.0f;             // its default epsilon (OptimizerSettings::epsilon 0)
  std::vector<std::string> states;  // its state rows' names (PyTorch's: exp_avg, ...)
  bool layerwise = false;           // a trust ratio per layer (Optimizer::layerwise)
  // An optimizer over `size` elements with checked settings (epsilon resolved).
  std::unique_ptr<Optimizer> (*make)(Backend& backend, std::int64_t size,
                                     const OptimizerSettings& settings) = nullptr;
  // A rule's scalars that change with the step (Adam's bias corrections), after the settings'.
  void (*at_step)(const OptimizerSettings& settings, float lr, std::int64_t t,
                  UpdateScalars& c) = nullptr;
  // Checks beyond the settings' ranges (InputError); may be null.
  void (*check)(const OptimizerSettings& settings) = nullptr;
};

// Every optimizer troupe has, in the order help texts list them: SGD, the default, then by name
// (written by the build from kernels/optimizers/, cmake/registry.cmake).
const std::vector<OptimizerInfo>& optimizers();
// The row named `name`; InputError listing the known names when there is none.
const OptimizerInfo& optimizerInfo(const std::string& name);
// The names, comma separated (for messages).
std::string optimizerNames();
// Sets settings.kind to the row named `name`, or to sgd with nesterov for MXNet's nag; false,
// changing nothing, for a name that is neither (optimizerInfo's error lists the known ones).
bool setOptimizerName(OptimizerSettings& settings, const std::string& name);
// The settings of the optimizer named `name` (as setOptimizerName), the others at their defaults;
// InputError listing the known names for an unknown one.
OptimizerSettings optimizerNamed(const std::string& name);

// SGD's settings (torch.optim.SGD's momentum, weight_decay, nesterov).
OptimizerSettings sgdSettings(float momentum, float weight_decay = 0.0f, bool nesterov = false,
                              std::vector<ParamRange> no_decay = {});

// Checks `settings` for the optimizer it names (InputError naming the problem; an epsilon of 0 is
// the optimizer's default), and the ranges against `size` elements.
void check(const OptimizerSettings& settings, std::int64_t size);
// The checked optimizer `settings.kind` over `size` elements, its state zero (Adagrad's too).
std::unique_ptr<Optimizer> makeOptimizer(Backend& backend, std::int64_t size,
                                         const OptimizerSettings& settings);
// What a dry run and the log show: "adam (beta1 0.9, beta2 0.999, epsilon 1e-08), weight decay 0".
std::string describe(const OptimizerSettings& settings);

// The SGD update of elements [begin, end) of the flat parameters (weights, grads and momentum are
// those elements), with no weight decay on settings.no_decay (relative to the whole, as begin
// and end are): Backend::sgdUpdate over each piece, PyTorch's SGD.
void sgdUpdateRange(Backend& backend, const Tensor& weights, const Tensor& grads,
                    const Tensor& momentum, std::int64_t begin, std::int64_t end, float lr,
                    const OptimizerSettings& settings);

// Learning rate at a step, Caffe's policies plus linear warmup:
//   fixed:     base
//   step:      base * gamma^(floor(step / stepsize))
//   multistep: base * gamma^(number of stepvalues <= step)
//   cosine:    base * 0.5 * (1 + cos(pi * min(step, max_steps) / max_steps))
//   poly:      end + (base - end) * (1 - min(step, max_steps) / max_steps)^power (MLPerf's LARS
//              schedule: power 2; Caffe's poly with end 0)
// Linear warmup multiplies that rate by (step + 1) / warmup_steps while step < warmup_steps, so the
// first step (step 0) runs at rate / warmup_steps and step warmup_steps - 1 at the full rate.
// Steps count from 0.
enum class LrSchedule : std::uint8_t { kFixed, kStep, kMultistep, kCosine, kPoly };
inline constexpr Named<LrSchedule> kLrPolicies[] = {{"fixed", LrSchedule::kFixed},
                                                    {"step", LrSchedule::kStep},
                                                    {"multistep", LrSchedule::kMultistep},
                                                    {"cosine", LrSchedule::kCosine},
                                                    {"poly", LrSchedule::kPoly}};
struct LrPolicy {
  LrSchedule policy = LrSchedule::kFixed;
  float base = 0.01f;
  float gamma = 0.1f;
  std::int64_t stepsize = 0;
  std::vector<std::int64_t> stepvalues;
  std::int64_t max_steps = 0;
  std::int64_t warmup_steps = 0;
  float power = 2.0f;
  float end = 0.0f;
};

// Throws InputError for an unknown policy or one missing its parameters.
void validate(const LrPolicy& policy);
float learningRate(const LrPolicy& policy, std::int64_t step);

}  // namespace troupe::kernels
