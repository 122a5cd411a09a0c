// What the optimizers of kernels/optimizers/ share: ruleOptimizer<Rule>(...) makes a table row
// (kernels/optimizer.h) whose optimizer holds the rule's state rows and hands each step range to
// the backend as one UpdateArgs, and the settings' ranges as rows name them.
#pragma once

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/update_loop.h"
#include "kernels/optimizer.h"

namespace troupe::kernels {

// The settings optimizers read, with their ranges: at 1 a decay never decays, an epsilon of 1 is
// as large as a normalised step; a trust coefficient has no natural bound but must be finite.
inline constexpr OptimizerSetting kMomentum{"momentum", &OptimizerSettings::momentum, 0, 1, false};
inline constexpr OptimizerSetting kBeta1{"beta1", &OptimizerSettings::beta1, 0, 1, false};
inline constexpr OptimizerSetting kBeta2{"beta2", &OptimizerSettings::beta2, 0, 1, false};
inline constexpr OptimizerSetting kEpsilon{"epsilon", &OptimizerSettings::epsilon, 0, 1, true};
inline constexpr OptimizerSetting kRho{"rho", &OptimizerSettings::rho, 0, 1, false};
inline constexpr OptimizerSetting kEta{"eta", &OptimizerSettings::eta, 0, 1e6f, true};

class RuleOptimizer final : public Optimizer {
 public:
  RuleOptimizer(Backend& backend, std::int64_t size, OptimizerSettings settings,
                UpdateKernel kernel);

  void stepRange(const Tensor& weights, const Tensor& grads, std::int64_t begin, std::int64_t end,
                 float lr, std::int64_t t) override;
  bool finite() override;
  const Tensor& state() const override { return state_; }
  const std::vector<std::string>& states() const override { return info_.states; }
  bool layerwise() const override { return kernel_.layerwise; }

 private:
  Backend& backend_;
  OptimizerSettings settings_;
  const OptimizerInfo& info_;
  UpdateKernel kernel_;
  std::int64_t size_;
  Tensor state_;
};

template <typename Rule>
std::unique_ptr<Optimizer> makeRuleOptimizer(Backend& backend, std::int64_t size,
                                             const OptimizerSettings& settings) {
  return std::make_unique<RuleOptimizer>(backend, size, settings, cpuUpdateKernel<Rule>());
}

// The table row of an optimizer that updates by `Rule`.
template <typename Rule>
OptimizerInfo ruleOptimizer(std::string name, std::string summary,
                            std::vector<OptimizerSetting> settings, float epsilon,
                            std::vector<std::string> states,
                            void (*at_step)(const OptimizerSettings&, float, std::int64_t,
                                            UpdateScalars&) = nullptr) {
  static_assert(Rule::kStates >= 1);
  OptimizerInfo row{std::move(name),   std::move(summary), std::move(settings),     epsilon,
                    std::move(states), Rule::kLayerwise,   makeRuleOptimizer<Rule>, at_step};
  return row;
}

// 1 - beta^t in double, as PyTorch computes its bias corrections.
inline double biasCorrection(float beta, std::int64_t t) {
  return 1.0 - std::pow(static_cast<double>(beta), static_cast<double>(t));
}

}  // namespace troupe::kernels
