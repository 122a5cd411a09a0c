// RMSProp (Tieleman and Hinton 2012), as torch.optim.RMSprop without momentum or centering.
#include "kernels/optimizers/rules.h"

#include "kernels/optimizers/rule_optimizer.h"

namespace troupe::kernels {
namespace {

// c[0] rho and c[1] eps as the settings give them; c[2] 1 - rho.
void atStep(const OptimizerSettings&, float, std::int64_t, UpdateScalars& c) {
  c.c[2] = 1.0f - c.c[0];
}

}  // namespace

OptimizerInfo rmspropOptimizer() {
  return ruleOptimizer<SquareSumRule>(
      "rmsprop", "RMSProp, as torch.optim.RMSprop with alpha = rho and MXNet's RMSProp",
      {kRho, kEpsilon}, 1e-8f, {"square_avg"}, atStep);
}

}  // namespace troupe::kernels
