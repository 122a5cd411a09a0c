#include <fmt/format.h>

#include "actors/messages.h"
#include "actors/roles.h"
#include "actors/trace.h"
#include "kernels/backend.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// Owns the master weights and the optimizer. Applies a step once every bucket of it is reduced,
// then hands the new weights to the replicas; at an epoch's end it pauses for the coordinator.
class Updater final : public Actor {
 public:
  Updater(std::string name, UpdaterConfig config)
      : Actor(std::move(name)), config_(std::move(config)), step_(config_.plan.first_step) {
    on<Reduced>([this](Reduced& r) { add(r); });
    // One replica in a one-process run hands its buckets straight here: nothing to sum.
    on<GradBucket>([this](GradBucket& b) { add(Reduced{b.step, b.begin, b.end, b.grads}); });
    on<Resume>([this](Resume&) { broadcast(); });
  }

  void started() override {
    backend_ = kernels::makeCpuBackend(config_.threads);
    const auto n = config_.initial_weights.numel();
    weights_ = backend_->empty({n});
    backend_->copy(config_.initial_weights, weights_);
    optimizer_ = kernels::makeSgd(*backend_, n, config_.sgd);
    if (config_.initial_momentum.defined() && config_.initial_momentum.numel() > 0) {
      TROUPE_ENFORCE_EQ(config_.initial_momentum.numel(), n);
      backend_->copy(config_.initial_momentum, optimizer_->state());
    }
    buffers_ = config_.initial_buffers;
    backend_->synchronize();
    if (step_ < config_.plan.last_step) broadcast();
  }

 private:
  // Updates each bucket as soon as it is reduced (the optimizer is elementwise, so this is the
  // same as one update of the whole step), reading the gradient where it lies: no copy.
  void add(const Reduced& r) {
    TROUPE_ENFORCE_EQ(r.step, step_);
    {
      TraceScope span(config_.trace, name(), "update");
      const float lr = kernels::learningRate(config_.lr, step_);
      const bool finite =
          optimizer_->stepRange(weights_.slice(r.begin, r.end), r.grads, r.begin, r.end, lr);
      backend_->synchronize();
      if (!finite) {
        throw NumericError(fmt::format(
            "training diverged: the update of {} on worker {} left inf or NaN in weights [{},{}) "
            "(learning rate {:g}; a gradient was not finite, or too large)",
            describeStep(step_, config_.plan.steps_per_epoch), config_.worker, r.begin, r.end, lr));
      }
    }
    reduced_ += r.end - r.begin;
    TROUPE_ENFORCE_LE(reduced_, weights_.numel());
    if (reduced_ < weights_.numel()) return;

    reduced_ = 0;
    ++step_;
    const bool epoch_end = step_ % config_.plan.steps_per_epoch == 0;
    if (epoch_end || step_ == config_.plan.last_step) {
      send(config_.coordinator, EpochEnd{step_, weights_, optimizer_->state()});
    } else {
      broadcast();
    }
  }

  void broadcast() {
    if (step_ >= config_.plan.last_step) return;
    for (const auto& replica : config_.replicas)
      send(replica, Weights{step_, weights_, buffers_});
    buffers_ = kernels::Tensor();  // adopted once, at the start
  }

  UpdaterConfig config_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<kernels::Optimizer> optimizer_;
  kernels::Tensor weights_, buffers_;
  std::int64_t step_;
  std::int64_t reduced_ = 0;
};

}  // namespace

std::unique_ptr<Actor> makeUpdater(std::string name, UpdaterConfig config) {
  return std::make_unique<Updater>(std::move(name), std::move(config));
}

}  // namespace troupe::actors
