// Adam (Kingma and Ba 2015) and AdamW (Loshchilov and Hutter 2019), as torch.optim's.
#include "kernels/optimizers/rules.h"

#include "kernels/optimizers/rule_optimizer.h"

namespace troupe::kernels {
namespace {

// c[3] lr / (1 - b1^t), c[4] 1 / sqrt(1 - b2^t), c[5] AdamW's decoupled decay.
template <bool kDecoupled>
void atStep(const OptimizerSettings& s, float lr, std::int64_t t, UpdateScalars& c) {
  c.c[3] = static_cast<float>(lr / biasCorrection(s.beta1, t));
  c.c[4] = static_cast<float>(1.0 / std::sqrt(biasCorrection(s.beta2, t)));
  c.c[5] = kDecoupled ? 1.0f : 0.0f;
}

}  // namespace

OptimizerInfo adamOptimizer() {
  return ruleOptimizer<AdamRule>(
      "adam", "Adam with weight decay added to the gradient, as torch.optim.Adam",
      {kBeta1, kBeta2, kEpsilon}, 1e-8f, {"exp_avg", "exp_avg_sq"}, atStep<false>);
}

OptimizerInfo adamwOptimizer() {
  return ruleOptimizer<AdamRule>("adamw", "Adam with decoupled weight decay, as torch.optim.AdamW",
                                 {kBeta1, kBeta2, kEpsilon}, 1e-8f, {"exp_avg", "exp_avg_sq"},
                                 atStep<true>);
}

}  // namespace troupe::kernels
