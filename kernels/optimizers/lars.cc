// LARS (You, Gitman and Ginsburg 2017), MLPerf's ResNet-50 optimizer: momentum SGD with a trust
// ratio per layer.
#include "kernels/optimizers/rules.h"

#include "kernels/optimizers/rule_optimizer.h"

namespace troupe::kernels {

OptimizerInfo larsOptimizer() {
  return ruleOptimizer<LarsRule>(
      "lars", "momentum SGD with a trust ratio per layer, MLPerf's ResNet-50 optimizer",
      {kMomentum, kEta, kEpsilon}, 0.0f, {"momentum_buffer"});
}

}  // namespace troupe::kernels
