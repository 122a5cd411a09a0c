// LAMB (You et al. 2019): Adam's direction with a trust ratio per layer.
#include "kernels/optimizers/rules.h"

#include "kernels/optimizers/rule_optimizer.h"

namespace troupe::kernels {
namespace {

// c[3] 1 / (1 - b1^t), c[4] 1 / (1 - b2^t).
void atStep(const OptimizerSettings& s, float, std::int64_t t, UpdateScalars& c) {
  c.c[3] = static_cast<float>(1.0 / biasCorrection(s.beta1, t));
  c.c[4] = static_cast<float>(1.0 / biasCorrection(s.beta2, t));
}

}  // namespace

OptimizerInfo lambOptimizer() {
  return ruleOptimizer<LambRule>(
      "lamb", "Adam's direction with a trust ratio per layer, as MXNet's LAMB",
      {kBeta1, kBeta2, kEpsilon}, 1e-6f, {"exp_avg", "exp_avg_sq"}, atStep);
}

}  // namespace troupe::kernels
