// Adagrad (Duchi, Hazan and Singer 2011), as torch.optim.Adagrad (lr_decay 0, accumulator from 0).
#include "kernels/optimizers/rules.h"

#include "kernels/optimizers/rule_optimizer.h"

namespace troupe::kernels {
namespace {

// The settings give c[0] eps: it moves to c[1], and the squares are summed (a = b = 1).
void atStep(const OptimizerSettings&, float, std::int64_t, UpdateScalars& c) {
  c.c[1] = c.c[0];
  c.c[0] = 1.0f;
  c.c[2] = 1.0f;
}

}  // namespace

OptimizerInfo adagradOptimizer() {
  return ruleOptimizer<SquareSumRule>("adagrad",
                                      "Adagrad, as torch.optim.Adagrad and MXNet's AdaGrad",
                                      {kEpsilon}, 1e-10f, {"sum"}, atStep);
}

}  // namespace troupe::kernels
