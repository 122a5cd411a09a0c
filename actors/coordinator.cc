#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <optional>

#include "actors/checkpoint.h"
#include "actors/messages.h"
#include "actors/roles.h"
#include "actors/train_log.h"
#include "actors/trainer.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;

// A pause for a joining worker comes this many steps after the last one the coordinator saw
// done: every updater is at most a step or two past it, so the PauseAt reaches each in time.
constexpr std::int64_t kPauseMargin = 8;

// Drives epochs: gathers step metrics, and at each epoch's end (the updater paused) evaluates,
// writes the log row and the checkpoint, then resumes the updater or ends the run. A watchdog
// fails the run, naming who is late, when nothing moves for step_timeout.
class Coordinator final : public Actor {
 public:
  Coordinator(std::string name, CoordinatorConfig config)
      : Actor(std::move(name)), config_(std::move(config)), options_(*config_.options) {
    on<StepDone>([this](StepDone& s) { stepDone(s); });
    on<EpochEnd>([this](EpochEnd& e) {
      ++progress_;
      ++epoch_ends_;
      // Every process's updater pauses; they hold bitwise the same weights, any one will do.
      if (!epoch_end_) epoch_end_ = std::move(e);
      maybeEndEpoch();
    });
    on<Buffers>([this](Buffers& b) {
      ++progress_;
      buffers_ = b.buffers;
      evaluate();
    });
    on<Evaluated>([this](Evaluated& e) {
      ++progress_;
      eval_.loss_sum += e.loss_sum;
      eval_.correct += e.correct;
      eval_.count += e.count;
      if (++evaluated_ == config_.num_replicas) endEpoch();
    });
    on<Watchdog>([this](Watchdog& w) { watchdog(w); });
  }

  // The epoch so far and the totals go on to the next generation (elastic runs).
  ~Coordinator() override {
    if (!config_.carry) return;
    auto& c = *config_.carry;
    c.epoch = epoch_;
    c.recent = recent_;
    c.partial = steps_;
    c.complete_through = complete_through_;
    c.global_batch = config_.plan.global_batch;
    c.epoch_index = config_.plan.epochOf(complete_through_);
    c.left = Clock::now();
    c.epoch_seconds =
        epoch_seconds_before_ + std::chrono::duration<double>(c.left - epoch_start_).count();
    c.cumulative_time = cumulative_time_;
    c.cumulative_inputs = cumulative_inputs_;
  }

  void started() override {
    epoch_start_ = Clock::now();
    // The epoch so far, from this process's coordinator of the last generation (a chief that
    // came in later starts counting where it came in).
    if (config_.carry && config_.carry->global_batch > 0 &&
        config_.carry->epoch_index == config_.plan.first_epoch) {
      epoch_ = config_.carry->epoch;
      // The epoch's time includes the re-forming between the generations.
      if (config_.carry->epoch_seconds > 0) {
        epoch_seconds_before_ =
            config_.carry->epoch_seconds +
            std::chrono::duration<double>(epoch_start_ - config_.carry->left).count();
      }
      cumulative_time_ = config_.carry->cumulative_time;
      cumulative_inputs_ = config_.carry->cumulative_inputs;
      // Steps done in the last generation that the state this one goes on from does not hold
      // (a peer died before their update) are trained again: count them once.
      for (const auto& [step, s] : config_.carry->recent) {
        if (step < config_.plan.first_step) continue;
        epoch_.loss_sum -= s.loss_sum;
        epoch_.correct -= s.correct;
        epoch_.count -= s.count;
        epoch_.skipped -= s.skipped;
      }
      // Steps the state holds that not every replica reported (a worker died before its report
      // came): their inputs were trained; loss and accuracy are those of the reports that came.
      // (none came: those of the epoch so far).
      const auto& carry = *config_.carry;
      for (auto step = carry.complete_through; step < config_.plan.first_step; ++step) {
        const auto it = carry.partial.find(step);
        EpochStats s = it != carry.partial.end() ? it->second : EpochStats{};
        if (s.count == 0) s = epoch_;
        const double scale =
            s.count > 0 ? static_cast<double>(carry.global_batch) / static_cast<double>(s.count)
                        : 0.0;
        epoch_.loss_sum += s.loss_sum * scale;
        epoch_.correct += s.correct * scale;
        epoch_.count += carry.global_batch;
      }
    }
    complete_through_ = config_.plan.first_step;
    armWatchdog();
    spdlog::info("{}: {} steps per epoch, global batch {}, {} replica(s), from step {} to {}",
                 config_.experiment_id, config_.plan.steps_per_epoch, config_.plan.global_batch,
                 config_.num_replicas, config_.plan.first_step, config_.plan.last_step);
  }

 private:
  void stepDone(const StepDone& s) {
    ++progress_;
    auto& agg = steps_[s.step];
    agg.loss_sum += s.loss_sum;
    agg.correct += s.correct;
    agg.count += s.count;
    agg.skipped += s.skipped;
    if (++replies_[s.step] < config_.num_replicas) return;
    // Steps complete in order: a replica cannot start step t+1 before step t is applied.
    TROUPE_ENFORCE_EQ(s.step, complete_through_);
    ++complete_through_;
    epoch_.loss_sum += agg.loss_sum;
    epoch_.correct += agg.correct;
    epoch_.count += agg.count;
    epoch_.skipped += agg.skipped;
    window_.loss_sum += agg.loss_sum;
    window_.correct += agg.correct;
    window_.count += agg.count;
    if (config_.carry) {
      recent_[s.step] = agg;
      recent_.erase(recent_.begin(), recent_.lower_bound(s.step - 2 * kPauseMargin));
    }
    steps_.erase(s.step);
    replies_.erase(s.step);
    const std::int64_t in_epoch = config_.plan.indexInEpoch(s.step);
    if (options_.log_every > 0 && complete_through_ % options_.log_every == 0) {
      const double secs = std::chrono::duration<double>(Clock::now() - window_start_).count();
      spdlog::info("epoch {} step {}/{}: loss {:.4f} accuracy {:.4f} lr {:.5g} {:.0f} inputs/s",
                   epochIndex() + 1, in_epoch, config_.plan.steps_per_epoch,
                   window_.loss_sum / std::max<std::int64_t>(1, window_.count),
                   window_.correct / std::max<std::int64_t>(1, window_.count),
                   kernels::learningRate(config_.lr, config_.plan.scheduleStep(s.step)),
                   static_cast<double>(window_.count) / std::max(secs, 1e-9));
      window_ = {};
      window_start_ = Clock::now();
    }
    maybePause();
    maybeEndEpoch();
  }

  std::int64_t epochIndex() const { return config_.plan.epochOf(complete_through_ - 1); }

  // Elastic runs: a worker waiting to join pauses every updater a few steps on.
  void maybePause() {
    if (!config_.joiner_waiting || pause_at_ >= 0 || Clock::now() < next_join_check_) return;
    next_join_check_ = Clock::now() + std::chrono::milliseconds(500);
    if (!config_.joiner_waiting()) return;
    const std::int64_t at = complete_through_ + kPauseMargin;
    if (at >= config_.plan.last_step) return;  // the run ends first
    pause_at_ = at;
    spdlog::info("a worker waits to join: every worker pauses after step {} to re-form", at);
    for (const auto& u : config_.updaters)
      send(u, PauseAt{at});
  }

  // The world re-forms: every process leaves this generation's system (trainer.cc goes on).
  void endGeneration(std::int64_t step) {
    spdlog::info("paused after step {}: this generation ends", step);
    for (const auto& f : config_.followers)
      send(f, Shutdown{});
    system().shutdown();
  }

  void maybeEndEpoch() {
    if (!epoch_end_ || epoch_ends_ < config_.num_updaters || complete_through_ < epoch_end_->step) {
      return;
    }
    if (epoch_end_->step == pause_at_ && !config_.plan.epochEndsAt(pause_at_)) {
      endGeneration(pause_at_);
      return;
    }
    epoch_time_ =
        epoch_seconds_before_ + std::chrono::duration<double>(Clock::now() - epoch_start_).count();
    if (config_.has_buffers) {
      send(config_.replicas[0], BuffersRequest{});
    } else {
      evaluate();
    }
  }

  void evaluate() {
    eval_ = {};
    evaluated_ = 0;
    if (!config_.has_test) {
      endEpoch();
      return;
    }
    for (const auto& r : config_.replicas) {
      send(r, Evaluate{epochIndex(), epoch_end_->weights, buffers_});
    }
  }

  void endEpoch() {
    const std::int64_t step = epoch_end_->step;
    const std::int64_t epoch = config_.plan.epochOf(step - 1) + 1;  // epochs completed
    cumulative_time_ += epoch_time_;
    cumulative_inputs_ += epoch_.count;
    LogRow row;
    row.time_spent = epoch_time_;
    row.cumulative_time_spent = config_.cumulative_time + cumulative_time_;
    row.input_count = epoch_.count;
    row.cumulative_input_count = config_.cumulative_inputs + cumulative_inputs_;
    row.cumulative_batch_count = step;
    row.inputs_per_sec = static_cast<double>(epoch_.count) / std::max(epoch_time_, 1e-9);
    row.accuracy = epoch_.correct / std::max<std::int64_t>(1, epoch_.count);
    row.epoch = epoch;
    row.learning_rate = kernels::learningRate(config_.lr, config_.plan.scheduleStep(step - 1));
    row.loss = epoch_.loss_sum / std::max<std::int64_t>(1, epoch_.count);
    row.test_accuracy =
        config_.has_test ? eval_.correct / std::max<std::int64_t>(1, eval_.count) : -1.0;
    row.skipped_records = epoch_.skipped;
    config_.log->write(row);
    spdlog::info(
        "epoch {} done: loss {:.4f} accuracy {:.4f} test_accuracy {:.4f} ({} inputs in {:.2f} s, "
        "{:.0f} inputs/s{})",
        epoch, row.loss, row.accuracy, row.test_accuracy, row.input_count, row.time_spent,
        row.inputs_per_sec,
        options_.skip_bad_records ? fmt::format(", {} bad records skipped", epoch_.skipped) : "");
    auto& result = *config_.result;
    result.epochs.push_back(
        {epoch, row.loss, row.accuracy, row.test_accuracy, row.inputs_per_sec, epoch_.skipped});
    result.steps = step;

    const bool last = step >= config_.plan.last_step;
    const auto every = options_.checkpoint_every;
    if (last || (every > 0 && epoch % every == 0)) checkpoint(epoch, row);
    if (last) {
      auto weights = kernels::Tensor::host({epoch_end_->weights.numel()});
      std::copy_n(epoch_end_->weights.f32(), weights.numel(), weights.f32());
      result.weights = weights;
      for (const auto& f : config_.followers)
        send(f, Shutdown{});
      system().shutdown();
      return;
    }
    const bool pause = step == pause_at_;
    epoch_end_.reset();
    epoch_ends_ = 0;
    epoch_ = {};
    recent_.clear();
    epoch_seconds_before_ = 0;
    epoch_start_ = Clock::now();
    if (pause) {
      endGeneration(step);
      return;
    }
    window_start_ = epoch_start_;
    for (const auto& u : config_.updaters)
      send(u, Resume{});
  }

  void checkpoint(std::int64_t epoch, const LogRow& row) {
    Checkpoint ck;
    ck.meta["model"] = options_.model.name.empty() ? "custom" : options_.model.name;
    ck.meta["step"] = std::to_string(epoch_end_->step);
    ck.meta["epoch"] = std::to_string(epoch);
    ck.meta["num_params"] = std::to_string(config_.num_params);
    ck.meta["global_batch"] = std::to_string(config_.plan.global_batch);
    ck.meta["steps_per_epoch"] = std::to_string(config_.plan.steps_per_epoch);
    ck.meta["seed"] = std::to_string(options_.seed);
    ck.meta["run_id"] = options_.run_id;  // what --resume auto matches
    ck.meta["experiment"] = config_.experiment_id;
    ck.meta["cumulative_time_spent"] = fmt::format("{:.6f}", row.cumulative_time_spent);
    ck.meta["cumulative_input_count"] = std::to_string(row.cumulative_input_count);
    ck.weights = epoch_end_->weights;
    ck.momentum = epoch_end_->momentum;
    ck.buffers = buffers_;
    const std::string path =
        fmt::format("{}/{}_epoch{}.ckpt", config_.checkpoint_dir, config_.experiment_id, epoch);
    saveCheckpoint(path, ck);
    config_.result->checkpoints.push_back(path);
    spdlog::info("checkpoint {}", path);
  }

  void armWatchdog() {
    system().after(std::chrono::duration_cast<std::chrono::milliseconds>(config_.step_timeout / 4),
                   self(), Watchdog{progress_});
  }

  void watchdog(const Watchdog& w) {
    if (w.progress_mark != progress_) {
      last_progress_ = Clock::now();
    } else if (Clock::now() - last_progress_ >= config_.step_timeout) {
      std::string late;
      const auto it = replies_.find(complete_through_);
      const int replied = it == replies_.end() ? 0 : it->second;
      if (epoch_end_) {
        late = config_.has_test ? "the replicas' evaluation" : "replica 0's buffers";
      } else if (replied < config_.num_replicas) {
        late = fmt::format("{} of {} replicas (step done)", config_.num_replicas - replied,
                           config_.num_replicas);
      } else {
        late = "the updater";
      }
      throw TimeoutError(fmt::format("no progress for {:.0f} s at step {}: waiting for {}",
                                     std::chrono::duration<double>(config_.step_timeout).count(),
                                     complete_through_, late));
    }
    armWatchdog();
  }

  CoordinatorConfig config_;
  const TrainOptions& options_;
  std::map<std::int64_t, EpochStats> steps_;
  std::map<std::int64_t, int> replies_;
  std::map<std::int64_t, EpochStats> recent_;  // the last steps done (elastic runs)
  std::int64_t complete_through_ = 0;
  EpochStats epoch_, window_, eval_;
  int evaluated_ = 0;
  std::optional<EpochEnd> epoch_end_;
  int epoch_ends_ = 0;
  kernels::Tensor buffers_;
  Clock::time_point epoch_start_, window_start_ = Clock::now(), last_progress_ = Clock::now();
  double epoch_time_ = 0;
  double epoch_seconds_before_ = 0;  // of the epoch, in earlier generations (elastic runs)
  std::int64_t pause_at_ = -1;
  Clock::time_point next_join_check_ = Clock::now();
  double cumulative_time_ = 0;
  std::int64_t cumulative_inputs_ = 0;
  std::int64_t progress_ = 0;
};

class Follower final : public Actor {
 public:
  explicit Follower(std::string name) : Actor(std::move(name)) {
    on<Shutdown>([this](Shutdown&) { system().shutdown(); });
  }
};

}  // namespace

std::unique_ptr<Actor> makeFollower(std::string name) {
  return std::make_unique<Follower>(std::move(name));
}

std::unique_ptr<Actor> makeCoordinator(std::string name, CoordinatorConfig config) {
  TROUPE_ENFORCE(config.options && config.log && config.result, "coordinator config incomplete");
  return std::make_unique<Coordinator>(std::move(name), std::move(config));
}

}  // namespace troupe::actors
