#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "actors/core/messages.h"
#include "actors/core/trace.h"
#include "actors/roles/observers.h"
#include "actors/roles/roles.h"
#include "kernels/backend.h"
#include "kernels/cuda_plugin.h"
#include "kernels/flat_params.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// Owns the master weights and the optimizer. Applies a step once every bucket of it is reduced,
// then hands the new weights to the replicas; at an epoch's end it pauses for the coordinator.
// With the state sharded (ZeRO), it updates its shard of each bucket, and the step ends once the
// reducer all-gathered every bucket's shards into its weights. A pipeline stage's worker
// (UpdaterConfig::stage_range) takes, updates and keeps current its stage's weights alone.
class Updater final : public Actor {
 public:
  Updater(std::string name, UpdaterConfig config)
      : Actor(std::move(name)),
        config_(std::move(config)),
        step_(config_.plan.first_step),
        loss_scale_(config_.loss_scale.initial),
        overflow_steps_(config_.loss_scale.skipped) {
    on<Reduced>([this](Reduced& r) { add(r); });
    // One replica in a one-process run hands its buckets straight here: nothing to sum.
    on<GradBucket>([this](GradBucket& b) {
      add(Reduced{b.step, b.begin, b.end, b.grads, b.ready});
    });
    on<Resume>([this](Resume&) { broadcast(); });
    on<PauseAt>([this](PauseAt& p) {
      if (p.step <= step_) {
        throw InvariantError(fmt::format("pause after step {} reached worker {} at step {}", p.step,
                                         config_.worker, step_));
      }
      pause_at_ = p.step;
    });
    on<Handover>([this](Handover& h) { adopt(h); });
    on<Subscribe>([this](Subscribe& s) {
      if (config_.stage_range) {  // its weights are its stage's (the chief's: at pauses, whole)
        spdlog::warn(
            "an observer (node {}) asked for the weights every {} step(s), but a pipeline stage's "
            "worker keeps only its own stage's current (pipeline_across processes): it gets none",
            s.node, s.every);
        return;
      }
      observers_.add(Address{s.node, s.actor}, s.every);
    });
    on<WeightsGathered>([this](WeightsGathered& g) { gathered(g); });
    on<StateRequest>([this](StateRequest& r) { sendState(r); });
    on<SummedAcrossWorkers>([this](SummedAcrossWorkers& s) {
      TROUPE_ENFORCE(figures_apart_ && s.step == step_ && reduced_ == expected_, "figures of step ",
                     s.step, " summed at step ", step_);
      applyHeldAndGather(Figures{
          config_.clip_grad_norm > 0 ? std::optional<double>(s.values.f32()[0]) : std::nullopt,
          loss_scale_ > 0 ? std::optional<bool>(s.values.f32()[1] == 0.0f) : std::nullopt});
      if (!sharded_) endStep();  // else its gathers come back next (gathered: endStep)
    });
  }

  // An elastic run's process keeps the last whole step's state for its next generation.
  ~Updater() override {
    if (!config_.state || !backend_) return;
    auto& s = *config_.state;
    const bool whole = reduced_ == 0 && !awaiting_;
    s.step = whole ? step_ : snapshot_step_;
    s.epoch = config_.plan.epochOf(s.step);
    s.epoch_records = config_.plan.recordOf(s.step);
    s.weights = hostCopy(whole ? weights_ : snapshot_weights_);
    s.state = hostCopy(whole ? optimizer_->state() : snapshot_state_);
    // Both change only at a step's end: the same for a partial step.
    s.loss_scale = loss_scale_;
    s.overflow_steps = overflow_steps_;
    if (awaiting_) s.step = -1;  // never got the state it was to go on from
  }

  void started() override {
    backend_ = kernels::makeBackend(
        config_.device, config_.budget
                            ? config_.budget->teamOf(config_.threads, config_.budget_ways)
                            : config_.threads);
    const auto n = config_.initial_weights.numel();
    // A pipeline stage's worker: the ranges of its window alone (UpdaterConfig::window).
    if (config_.window.empty()) config_.window = {{0, n}};
    weights_ = backend_->empty({kernels::FlatParams::count(config_.window)});
    held_weights_ = kernels::FlatParams(weights_, config_.window);
    for (const auto& [begin, end] : config_.window)
      backend_->copy(config_.initial_weights.slice(begin, end), held_weights_.slice(begin, end));
    // Copied: this process's plan lets go of them too (trainProcess), so they are not held twice;
    // let go before the optimizer's state is made, so that the two are never held together.
    backend_->synchronize();
    config_.initial_weights = kernels::Tensor();
    sharded_ = !config_.shards.empty();
    const std::pair<std::int64_t, std::int64_t> whole{0, n};
    const auto stage = config_.stage_range.value_or(whole);
    shard_ = sharded_ ? config_.shards.at(static_cast<std::size_t>(config_.worker)) : stage;
    expected_ = stage.second - stage.first;
    figures_apart_ = sharded_ || config_.stage_range.has_value();
    figures_range_ = config_.stage_range ? config_.figures_range : shard_;
    partial_ = shard_ != whole;
    const auto [lo, hi] = shard_;
    optimizer_ = kernels::makeOptimizer(
        *backend_, hi - lo, partial_ ? config_.optimizer.within(lo, hi) : config_.optimizer);
    hold_ = loss_scale_ > 0 || config_.clip_grad_norm > 0 || optimizer_->layerwise();
    if (config_.initial_state.defined() && config_.initial_state.numel() > 0) {
      const std::int64_t rows = static_cast<std::int64_t>(optimizer_->states().size());
      TROUPE_ENFORCE_EQ(config_.initial_state.numel(), rows * (hi - lo));
      backend_->copy(config_.initial_state, optimizer_->state());
    }
    buffers_ = config_.initial_buffers;
    backend_->synchronize();
    config_.initial_state = kernels::Tensor();
    if (!config_.handover_to.empty()) {
      const Handover h{step_,    hostCopy(weights_), hostCopy(optimizer_->state()),
                       buffers_, loss_scale_,        overflow_steps_};
      for (const auto& to : config_.handover_to)
        send(to, h);
    }
    awaiting_ = config_.await_handover;
    if (!awaiting_) beginSteps();
  }

 private:
  // Updates each bucket as soon as it is reduced (the optimizer is elementwise, so this is the
  // same as one update of the whole step), reading the gradient where it lies if it is on this
  // updater's device (no copy), else from a copy here. The step's buckets are held until the last
  // one (hold_) with a loss scale, so that one test of them all decides whether the step is
  // applied; with clipping, whose norm is of them all; with a layerwise optimizer, whose layers a
  // bucket may cut.
  void add(const Reduced& r) {
    TROUPE_ENFORCE_EQ(r.step, step_);
    if (config_.state && reduced_ == 0) snapshot();
    {
      TraceScope span(config_.run.trace, name(), "update");
      backend_->waitFor(r.ready);
      kernels::Tensor grads = r.grads;
      const std::int64_t at = r.grads_at < 0 ? r.begin : r.grads_at;
      if (grads.device() != backend_->device()) {
        if (grads_here_.numel() == 0) grads_here_ = backend_->empty({weights_.numel()});
        grads = grads_here_.slice(at, at + r.grads.numel());
        backend_->copy(r.grads, grads);
      }
      if (hold_) {
        held_.push_back({r.begin, r.end, at, grads});
      } else {
        apply(r.begin, r.end, at, grads);
        gather(r.begin, r.end);
      }
    }
    reduced_ += r.end - r.begin;
    TROUPE_ENFORCE_LE(reduced_, expected_);
    if (reduced_ < expected_) return;
    if (cutShort(r)) return;
    if (hold_) {
      if (figures_apart_ && (config_.clip_grad_norm > 0 || loss_scale_ > 0)) {
        // The norm, and a loss scale's test, are of every shard's gradients: this shard's sum of
        // squares and whether it holds inf or NaN go round the workers first
        // (SummedAcrossWorkers).
        const std::vector<kernels::Tensor> shard = heldIn(figures_range_);
        auto figures = kernels::Tensor::host({2});
        figures.f32()[0] =
            config_.clip_grad_norm > 0 ? static_cast<float>(backend_->sumOfSquares(shard)) : 0.0f;
        figures.f32()[1] = loss_scale_ > 0 && !backend_->allFinite(shard) ? 1.0f : 0.0f;
        send(config_.reducer, SumAcrossWorkers{step_, figures});
        return;
      }
      applyHeldAndGather({});
    }
    if (sharded_ && gathered_ < expected_) return;  // endStep once all came back
    endStep();
  }

  // What sharded state's figures say of every shard's gradients, summed over the workers:
  // clipping's sum of their squares, and whether they are all finite (a loss scale's test).
  struct Figures {
    std::optional<double> sum_of_squares;
    std::optional<bool> finite;
  };

  // The held gradients (applyHeld) with, where given, the step's figures over every shard;
  // sharded, each piece goes to be all-gathered then (unchanged where the step is skipped).
  void applyHeldAndGather(const Figures& figures) {
    std::vector<std::pair<std::int64_t, std::int64_t>> pieces;
    for (const auto& h : held_)
      pieces.emplace_back(h.begin, h.end);
    applyHeld(figures);
    for (const auto& [begin, end] : pieces)
      gather(begin, end);
  }

  // The held gradients' parts in [lo, hi): this updater's shard (all of them unsharded), or its
  // part of the sums over every worker.
  std::vector<kernels::Tensor> heldIn(std::pair<std::int64_t, std::int64_t> range) const {
    std::vector<kernels::Tensor> parts;
    const auto [lo, hi] = range;
    for (const auto& h : held_) {
      const std::int64_t from = std::max(h.begin, lo), to = std::min(h.end, hi);
      if (from < to) parts.push_back(h.grads.slice(from - h.at, to - h.at));
    }
    return parts;
  }

  // ZeRO: the piece [begin, end) of the weights, this updater's shard of it updated, goes to the
  // reducer to be all-gathered (WeightsGathered when done).
  void gather(std::int64_t begin, std::int64_t end) {
    if (!sharded_) return;
    send(config_.reducer,
         GatherWeights{step_, begin, end, held_weights_.slice(begin, end), backend_->record()});
  }

  void gathered(const WeightsGathered& g) {
    TROUPE_ENFORCE(sharded_ && g.step == step_, "weights of step ", g.step, " gathered at step ",
                   step_);
    backend_->waitFor(g.ready);
    gathered_ += g.end - g.begin;
    TROUPE_ENFORCE_LE(gathered_, reduced_);
    if (gathered_ == expected_) endStep();
  }

  // Every bucket of the step is applied (and, sharded, every shard of it gathered here).
  void endStep() {
    const std::int64_t applied = step_;
    reduced_ = 0;
    gathered_ = 0;
    ++step_;
    const bool ends =
        config_.plan.epochEndsAt(step_) || step_ == config_.plan.last_step || step_ == pause_at_;
    // At an epoch's end, the updater pauses only where the coordinator needs its state; else it
    // goes on (the next step's weights go out as any step's).
    const bool pauses = ends && (step_ == pause_at_ || config_.plan.pausesAt(step_));
    // On a device the replicas get the weights, with the event of their updates, before the
    // finiteness test waits for those updates: the next step queues meanwhile, and a failed test
    // still ends the run here, naming the step, long before that next step ends. What is kept (a
    // checkpoint at an epoch's end) or watched is tested first; so is everything in a traced run,
    // whose reducer dates the device's sums by this wait (Reducer::traceDeviceSums).
    const bool early =
        !pauses && !config_.run.trace && backend_->device().kind != kernels::DeviceKind::kCpu;
    if (early) broadcast();
    checkFinite(applied);
    observers_.offer(step_, step_ == config_.plan.last_step, weights_,
                     [this](Address to, std::int64_t step, const kernels::Tensor& weights) {
                       send(to, Weights{step, onHost(weights), kernels::Tensor(), {}});
                     });
    if (pauses) {
      send(config_.coordinator, pausedEnd());
      return;
    }
    if (ends) {
      send(config_.coordinator,
           EpochEnd{step_, {}, {}, loss_scale_, overflow_steps_, /*paused=*/false});
    }
    if (!early) broadcast();
  }

  // reducer nccl: the step's updates were queued behind NCCL's sums, which a failed group ends
  // with what they had. Once the step's last sum is done (NCCL's run in order on one stream), a
  // group that failed leaves the step partial: the run is failing (whoever saw the failure fails
  // it), and an elastic run goes on from the snapshot before this step, as from a step cut short
  // by a peer that never sent its buckets.
  bool cutShort(const Reduced& last) {
    if (!config_.nccl) return false;
    last.ready.wait();
    if (!config_.nccl->comm->failed()) return false;
    spdlog::warn(
        "worker {}: the NCCL group failed during {}; its sums are partial, the step is not "
        "counted",
        config_.worker, describeStep(step_, config_.plan.steps_per_epoch));
    return true;
  }

  // Queues the update of one bucket: no host wait (checkFinite, once the step's last is queued).
  // Sharded, only this updater's shard of them (the others' sums are partial here).
  // `grads` starts at `at` of the flat gradients (begin, or with ZeRO stage 2 the shard's part).
  void apply(std::int64_t begin, std::int64_t end, std::int64_t at, const kernels::Tensor& grads) {
    const auto [lo, hi] = shard_;
    const std::int64_t from = std::max(begin, lo), to = std::min(end, hi);
    if (from >= to) return;
    optimizer_->stepRange(held_weights_.slice(from, to), grads.slice(from - at, to - at), from - lo,
                          to - lo, learningRate(), update());
  }

  // This step's update of the optimizer's state, counting from 1: the steps before it that were
  // applied (a loss scale's skipped ones are not; PyTorch's GradScaler skips optimizer.step()).
  std::int64_t update() const { return step_ - overflow_steps_ + 1; }

  // The step's one host wait on a device: whether the updates of step `applied` left every
  // weight finite.
  void checkFinite(std::int64_t applied) {
    if (optimizer_->finite()) return;
    throw NumericError(fmt::format(
        "training diverged: the update of {} on worker {} left inf or NaN in the weights "
        "(learning rate {:g}; a gradient was not finite, or too large)",
        describeStep(applied, config_.plan.steps_per_epoch), config_.worker,
        learningRate(applied)));
  }

  float learningRate() const { return learningRate(step_); }
  float learningRate(std::int64_t step) const {
    return kernels::learningRate(config_.lr, config_.plan.scheduleStep(step));
  }

  // The step's gradients, all held. With a loss scale they are of the loss times loss_scale_: if
  // they are finite, divided by it and applied; else the step is skipped and a dynamic scale
  // halves (PyTorch's GradScaler). Clipping's sum of squares and the test are theirs unless given
  // (sharded: over every shard).
  void applyHeld(const Figures& figures) {
    const std::vector<kernels::Tensor> all = heldIn(shard_);
    const float scale = loss_scale_;
    // The step's one host wait for it.
    const bool finite =
        loss_scale_ > 0 ? (figures.finite ? *figures.finite : backend_->allFinite(all)) : true;
    if (finite) {
      applyWhole(all, loss_scale_ > 0 ? 1.0f / scale : 1.0f, figures.sum_of_squares);
      if (loss_scale_ > 0 && config_.loss_scale.dynamic &&
          ++clean_steps_ >= config_.loss_scale.window) {
        loss_scale_ *= 2.0f;
        clean_steps_ = 0;
      }
    } else {
      if (!config_.loss_scale.dynamic) {
        throw NumericError(fmt::format(
            "training diverged: the gradients of {} on worker {} hold inf or NaN at the fixed "
            "loss scale {:g} (a smaller loss_scale, or 0 for a dynamic one)",
            describeStep(step_, config_.plan.steps_per_epoch), config_.worker, scale));
      }
      ++overflow_steps_;
      clean_steps_ = 0;
      loss_scale_ = scale / 2.0f;
      // Below float16's smallest normal the scale shrinks gradients instead of keeping them: no
      // scale brings these back, the gradients themselves are inf or NaN.
      if (loss_scale_ < kSmallestLossScale) {
        throw NumericError(fmt::format(
            "training diverged: the gradients of {} on worker {} hold inf or NaN at every loss "
            "scale down to {:g} ({} steps skipped so far)",
            describeStep(step_, config_.plan.steps_per_epoch), config_.worker, scale,
            overflow_steps_));
      }
      spdlog::debug("{} skipped: inf or NaN gradients; loss scale now {:g}",
                    describeStep(step_, config_.plan.steps_per_epoch), loss_scale_);
    }
    held_.clear();
  }

  // Applies the held gradients times `factor`, scaled down to clip_grad_norm where their norm is
  // above it (as torch's clip_grad_norm_: by max_norm / (norm + 1e-6)); a layerwise optimizer's
  // in one update of the whole, gathered in order.
  void applyWhole(const std::vector<kernels::Tensor>& all, float factor,
                  std::optional<double> sum_of_squares) {
    if (config_.clip_grad_norm > 0) {
      const double norm =
          std::sqrt(sum_of_squares ? *sum_of_squares : backend_->sumOfSquares(all)) * factor;
      if (norm > config_.clip_grad_norm)
        factor = static_cast<float>(factor * (config_.clip_grad_norm / (norm + 1e-6)));
    }
    if (factor != 1.0f) {
      for (const auto& g : all)
        backend_->scale(g, factor);
    }
    if (!optimizer_->layerwise()) {
      for (const auto& h : held_)
        apply(h.begin, h.end, h.at, h.grads);
      return;
    }
    // Sharded: this updater's shard, whose bounds are the layers' (serverShards); its gradients
    // put together in order, and no others (a whole model's would undo ZeRO's saving).
    const auto [lo, hi] = shard_;
    if (layerwise_grads_.numel() != hi - lo) layerwise_grads_ = backend_->empty({hi - lo});
    for (const auto& h : held_) {
      const std::int64_t from = std::max(h.begin, lo), to = std::min(h.end, hi);
      if (from < to) {
        backend_->copy(h.grads.slice(from - h.at, to - h.at),
                       layerwise_grads_.slice(from - lo, to - lo));
      }
    }
    optimizer_->stepRange(held_weights_.slice(lo, hi), layerwise_grads_, 0, hi - lo, learningRate(),
                          update());
  }

  void broadcast() {
    if (step_ >= config_.plan.last_step) return;
    const kernels::Event ready = backend_->record();
    for (const auto& replica : config_.replicas)
      send(replica,
           Weights{step_, weights_, buffers_, ready, loss_scale_ > 0 ? loss_scale_ : 1.0f});
    buffers_ = kernels::Tensor();  // adopted once, at the start
  }

  // The state from the process that has the newest (elastic runs), before the first step.
  void adopt(const Handover& h) {
    TROUPE_ENFORCE(awaiting_, "worker ", config_.worker, " got a second handover");
    TROUPE_ENFORCE_EQ(h.step, step_);
    TROUPE_ENFORCE_EQ(h.weights.numel(), weights_.numel());
    backend_->copy(h.weights, weights_);
    TROUPE_ENFORCE_EQ(h.state.numel(), optimizer_->state().numel());
    backend_->copy(h.state, optimizer_->state());
    if (h.buffers.defined() && h.buffers.numel() > 0) buffers_ = h.buffers;
    if (config_.loss_scale.dynamic && h.loss_scale > 0) {
      loss_scale_ = h.loss_scale;
      overflow_steps_ = h.overflow_steps;
      spdlog::info("worker {}: the dynamic loss scale goes on from {:g}, the generation before's",
                   config_.worker, loss_scale_);
    }
    backend_->synchronize();
    awaiting_ = false;
    beginSteps();
  }

  // Once the state to go on from is here: the first step's weights go out. An elastic
  // generation may start where the one before left fewer of its epoch's records than one step of
  // this one's global batch (StepPlan::startAt: that epoch's tail goes untrained, as any epoch's
  // does): that epoch ends here, before any step, as at any epoch's end (its evaluation, log row
  // and checkpoint first where it pauses; Resume then sends the weights).
  void beginSteps() {
    if (step_ >= config_.plan.last_step) return;
    if (config_.plan.first_epoch_records > 0 && config_.plan.epochEndsAt(step_)) {
      if (config_.plan.pausesAt(step_)) {
        send(config_.coordinator, pausedEnd());
        return;
      }
      send(config_.coordinator,
           EpochEnd{step_, {}, {}, loss_scale_, overflow_steps_, /*paused=*/false});
    }
    broadcast();
  }

  // The epoch's end where the updater pauses: the chief's carries its weights and state (its
  // shard of it where it is sharded), the others' nothing (every updater holds the same bits:
  // one copy is all the coordinator needs; a shard of the state it asks for: sendState).
  EpochEnd pausedEnd() {
    const bool chief = config_.worker == 0;
    EpochEnd e{step_, {}, {}, loss_scale_, overflow_steps_, /*paused=*/true};
    if (chief) {
      e.weights = onHost(weights_);  // a pipeline stage's worker: its window's
      e.state = onHost(optimizer_->state());
    }
    if (partial_) std::tie(e.state_begin, e.state_end) = shard_;
    return e;
  }

  // A piece of this worker's shard of the state, or of its pipeline stage's weights, for the
  // chief's checkpoint, while paused.
  void sendState(const StateRequest& r) {
    const kernels::Tensor held =
        !r.weights ? optimizer_->state()
        : config_.stage_range
            ? held_weights_.slice(config_.stage_range->first, config_.stage_range->second)
            : kernels::Tensor();
    const bool asked = r.weights ? held.defined() : partial_;
    if (!asked || r.step != step_ || r.offset < 0 || r.count <= 0 ||
        r.count > held.numel() - r.offset) {
      throw InvariantError(fmt::format(
          "worker {}: asked for {} elements of its {} at {} after step {}, at step {} with {} "
          "elements{}",
          config_.worker, r.count, r.weights ? "stage's weights" : "optimizer state", r.offset,
          r.step, step_, held.defined() ? held.numel() : 0,
          asked       ? ""
          : r.weights ? " (it is no pipeline stage's worker)"
                      : " (the state is not sharded)"));
    }
    auto piece = kernels::Tensor::host({r.count});
    backend_->copy(held.slice(r.offset, r.offset + r.count), piece);
    backend_->synchronize();
    send(config_.coordinator, StateChunk{step_, r.shard, r.offset, piece});
  }

  // Elastic runs: the state before a step's first bucket is applied, for a generation that ends
  // part way through the step (a peer died).
  void snapshot() {
    if (snapshot_weights_.numel() != weights_.numel()) {
      snapshot_weights_ = backend_->empty({weights_.numel()});
      snapshot_state_ = backend_->empty({optimizer_->state().numel()});
    }
    backend_->copy(weights_, snapshot_weights_);
    backend_->copy(optimizer_->state(), snapshot_state_);
    snapshot_step_ = step_;
  }

  kernels::Tensor hostCopy(const kernels::Tensor& t) {
    auto copy = kernels::Tensor::host({t.numel()});
    backend_->copy(t, copy);
    backend_->synchronize();
    return copy;
  }
  // `t` itself on the CPU (the coordinator reads it while this updater waits for Resume), else a
  // copy on the host.
  kernels::Tensor onHost(const kernels::Tensor& t) {
    return t.device().kind == kernels::DeviceKind::kCpu ? t : hostCopy(t);
  }

  UpdaterConfig config_;
  Observers observers_;  // the chief's: processes that watch the run
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<kernels::Optimizer> optimizer_;
  kernels::Tensor weights_, buffers_;
  // The weights by their place in the model's (its window's ranges, UpdaterConfig::window), and
  // the model's count.
  kernels::FlatParams held_weights_;
  kernels::Tensor grads_here_;       // reduced gradients that arrive on another device, copied here
  kernels::Tensor layerwise_grads_;  // a layerwise step's: shard_'s, in order
  std::int64_t step_;
  std::int64_t reduced_ = 0;
  std::int64_t pause_at_ = -1;
  // ZeRO (UpdaterConfig::shards): this updater's shard of the weights, whose state it holds
  // (its pipeline stage's, or [0, n) otherwise), and the elements of this step all-gathered so
  // far. The elements a step's buckets bring (its stage's, or all), and its part of the figures
  // summed over every worker where they are summed so (SumAcrossWorkers).
  bool sharded_ = false;
  std::pair<std::int64_t, std::int64_t> shard_;
  bool partial_ = false;  // shard_ is not every weight: the state is of it alone
  std::int64_t gathered_ = 0;
  std::int64_t expected_ = 0;
  bool figures_apart_ = false;
  std::pair<std::int64_t, std::int64_t> figures_range_;
  bool awaiting_ = false;
  kernels::Tensor snapshot_weights_, snapshot_state_;
  std::int64_t snapshot_step_ = 0;
  // Mixed precision's loss scale (0: none), and the step's buckets held until its last.
  static constexpr float kSmallestLossScale = 0x1p-14f;
  struct Held {
    std::int64_t begin, end;
    std::int64_t at;  // where grads starts (Reduced::grads_at)
    kernels::Tensor grads;
  };
  float loss_scale_ = 0;
  std::int64_t clean_steps_ = 0, overflow_steps_;
  std::vector<Held> held_;
  bool hold_ = false;  // held until the step's last bucket (add)
};

}  // namespace

std::unique_ptr<Actor> makeUpdater(std::string name, UpdaterConfig config) {
  return std::make_unique<Updater>(std::move(name), std::move(config));
}

}  // namespace troupe::actors
