// Adagrad (Duchi, Hazan and Singer 2011), as torch.optim.Adagrad (lr_decay 0, accumulator from 0).
#include "kernels/optimizers/rules.h"

#include "kernels/optimizers/rule_optimizer.h"

namespace troupe::kernels {

OptimizerInfo adagradOptimizer() {
  return ruleOptimizer<AdagradRule>("adagrad",
                                    "Adagrad, as torch.optim.Adagrad and MXNet's AdaGrad",
                                    {kEpsilon}, 1e-10f, {"sum"});
}

}  // namespace troupe::kernels
