// RMSProp (Tieleman and Hinton 2012), as torch.optim.RMSprop without momentum or centering.
#include "kernels/optimizers/rules.h"

#include "kernels/optimizers/rule_optimizer.h"

namespace troupe::kernels {

OptimizerInfo rmspropOptimizer() {
  return ruleOptimizer<RmsPropRule>(
      "rmsprop", "RMSProp, as torch.optim.RMSprop with alpha = rho and MXNet's RMSProp",
      {kRho, kEpsilon}, 1e-8f, {"square_avg"});
}

}  // namespace troupe::kernels
