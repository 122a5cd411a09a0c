// SGD with momentum and Nesterov momentum, as torch.optim.SGD (dampening 0), on the backends' own
// tuned SGD loops (Backend::sgdUpdate).
#include "kernels/backend.h"
#include "kernels/optimizers/rule_optimizer.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

class Sgd final : public Optimizer {
 public:
  Sgd(Backend& backend, std::int64_t size, const OptimizerSettings& settings)
      : backend_(backend), settings_(settings), state_(backend.empty({size})) {}

  void stepRange(const Tensor& weights, const Tensor& grads, std::int64_t begin, std::int64_t end,
                 float lr, std::int64_t) override {
    TROUPE_ENFORCE_EQ(weights.numel(), end - begin);
    TROUPE_ENFORCE_EQ(grads.numel(), end - begin);
    sgdUpdateRange(backend_, weights, grads, state_.slice(begin, end), begin, end, lr, settings_);
  }
  bool finite() override { return backend_.updatesFinite(); }
  const Tensor& state() const override { return state_; }
  const std::vector<std::string>& states() const override { return states_; }
  bool layerwise() const override { return false; }

 private:
  Backend& backend_;
  OptimizerSettings settings_;
  Tensor state_;
  std::vector<std::string> states_{"momentum_buffer"};
};

void check(const OptimizerSettings& s) {
  if (s.nesterov && s.momentum == 0.0f) throw InputError("sgd nesterov needs a momentum above 0");
}

std::unique_ptr<Optimizer> make(Backend& backend, std::int64_t size, const OptimizerSettings& s) {
  return std::make_unique<Sgd>(backend, size, s);
}

}  // namespace

OptimizerInfo sgdOptimizer() {
  OptimizerInfo row{"sgd",
                    "momentum SGD, Nesterov's with nesterov, as torch.optim.SGD",
                    {kMomentum},
                    0.0f,
                    {"momentum_buffer"},
                    false,
                    make};
  row.check = check;
  return row;
}

}  // namespace troupe::kernels
