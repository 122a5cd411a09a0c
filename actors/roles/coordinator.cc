#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>

#include "actors/core/messages.h"
#include "actors/roles/roles.h"
#include "actors/run/checkpoint.h"
#include "actors/run/progress.h"
#include "actors/run/run_plan.h"
#include "actors/run/train_log.h"
#include "actors/run/trainer.h"
#include "kernels/flat_params.h"
#include "kernels/optimizer.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;

// A pause (a worker joining an elastic run, a checkpoint or a stop asked through RunControl)
// comes this many steps after the last one the coordinator saw done: every updater is at most a
// step or two past it, so the PauseAt reaches each in time.
constexpr std::int64_t kPauseMargin = 8;
// The elements of a piece of a worker's shard of the optimizer state (StateRequest): 256 KiB.
constexpr std::int64_t kStatePiece = std::int64_t{1} << 16;

enum class PauseFor { kNothing, kJoin, kCheckpoint, kStop };

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
      // Every process's updater sends one. Where it pauses, the chief's carries the weights (every
      // updater holds the same bits) and the optimizer's state, or its shard of it (ZeRO: the
      // others' shards are asked for when a checkpoint is written, gatherState); the others',
      // nothing.
      auto& [end, count] = ends_[e.step];
      if (count++ == 0) {
        end = EpochEnd{e.step, {}, {}, e.loss_scale, e.overflow_steps, e.paused};
      } else {
        TROUPE_ENFORCE(end.paused == e.paused, "the updaters disagree on pausing after step ",
                       e.step);
      }
      if (e.weights.defined()) end.weights = e.weights;
      if (e.state.defined()) end.state = e.state;
      maybeEndEpoch();
    });
    on<StateChunk>([this](StateChunk& c) {
      ++progress_;
      stateChunk(c);
    });
    on<Buffers>([this](Buffers& b) {
      ++progress_;
      if (!takeBuffers(b)) return;
      if (pause_buffers_) {
        pause_buffers_ = false;
        checkpointPaused();
      } else {
        evaluate();
      }
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

  // The epoch so far and the totals go on to the next generation (elastic runs). A coordinator
  // that never started (its generation failed to form) leaves the carry as it was.
  ~Coordinator() override {
    progress_line_.clear();
    if (!config_.carry || !started_) return;
    auto& c = *config_.carry;
    c.epoch = epoch_;
    c.recent = recent_;
    c.partial = steps_;
    c.complete_through = complete_through_;
    c.global_batch = config_.plan.global_batch;
    c.epoch_index = config_.plan.epochOf(complete_through_);
    c.left = Clock::now();
    c.epoch_seconds = epochSeconds(c.left);
    c.cumulative_time = cumulative_time_;
    c.cumulative_inputs = cumulative_inputs_;
    c.overflow_logged = overflow_logged_;
  }

  void started() override {
    started_ = true;
    epoch_start_ = Clock::now();
    overflow_logged_ = config_.overflow_steps;  // counted before this run
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
      overflow_logged_ = config_.carry->overflow_logged;
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
    // A generation that starts with no whole step of its first epoch left (Updater::beginSteps)
    // ends that epoch before any step: its updaters' EpochEnd for first_step comes next.
    if (config_.plan.first_epoch_records > 0 && config_.plan.epochEndsAt(complete_through_))
      closeEpoch();
    armWatchdog();
    spdlog::info("{}: {} steps per epoch, global batch {}, {} replica(s), from step {} to {}",
                 config_.experiment_id, config_.plan.steps_per_epoch, config_.plan.global_batch,
                 config_.num_replicas, config_.plan.first_step, config_.plan.last_step);
  }

 private:
  void stepDone(const StepDone& s) {
    ++progress_;
    auto& agg = steps_[s.step];
    agg.add(EpochStats{s.loss_sum, s.correct, s.count, s.skipped, s.input_wait,
                       s.input_wait > 0 ? 1 : 0, 1, s.ready, s.ready, s.read_seconds,
                       s.device_peak});
    if (++replies_[s.step] < config_.num_replicas) return;
    // Steps complete in order: a replica cannot start step t+1 before step t is applied.
    TROUPE_ENFORCE_EQ(s.step, complete_through_);
    ++complete_through_;
    epoch_.add(agg);
    if (config_.plan.epochEndsAt(complete_through_)) closeEpoch();
    window_.loss_sum += agg.loss_sum;
    window_.correct += agg.correct;
    window_.count += agg.count;
    if (config_.carry) {
      recent_[s.step] = agg;
      recent_.erase(recent_.begin(), recent_.lower_bound(s.step - 2 * kPauseMargin));
    }
    const std::int64_t in_epoch = config_.plan.indexInEpoch(s.step);
    if (config_.control) {
      config_.control->steps.store(complete_through_);
      if (const auto& on_step = config_.control->callbacks.on_step) {
        const auto n = std::max<std::int64_t>(1, agg.count);
        on_step(StepMetrics{complete_through_, epochIndex() + 1, in_epoch,
                            config_.plan.steps_per_epoch, agg.loss_sum / static_cast<double>(n),
                            agg.correct / static_cast<double>(n),
                            kernels::learningRate(config_.lr, config_.plan.scheduleStep(s.step))});
      }
    }
    steps_.erase(s.step);
    replies_.erase(s.step);
    showProgress(agg, in_epoch, s.step);
    if (options_.log_every > 0 && !progress_line_.on() &&
        complete_through_ % options_.log_every == 0) {
      const double secs = std::chrono::duration<double>(Clock::now() - window_start_).count();
      const double rate = static_cast<double>(window_.count) / std::max(secs, 1e-9);
      spdlog::info("epoch {} step {}/{}: loss {:.4f} accuracy {:.4f} lr {:.5g} {:.0f} {}/s{}",
                   epochIndex() + 1, in_epoch, config_.plan.steps_per_epoch,
                   window_.loss_sum / std::max<std::int64_t>(1, window_.count),
                   window_.correct / std::max<std::int64_t>(1, window_.count),
                   kernels::learningRate(config_.lr, config_.plan.scheduleStep(s.step)), rate,
                   units(), mfu(rate, " "));
      window_ = {};
      window_start_ = Clock::now();
    }
    maybePause();
    maybeEndEpoch();
  }

  std::int64_t epochIndex() const { return config_.plan.epochOf(complete_through_ - 1); }

  // The epoch's last step is done: its figures are kept for its end (maybeEndEpoch), and the next
  // epoch counts from here (its steps go on meanwhile where the updaters do not pause).
  void closeEpoch() {
    const auto now = Clock::now();
    closed_[complete_through_] = {epoch_, epochSeconds(now)};
    epoch_ = {};
    recent_.clear();
    epoch_seconds_before_ = 0;
    epoch_start_ = now;
  }

  // The epoch's time until `now`, earlier generations' part included (elastic runs).
  double epochSeconds(Clock::time_point now) const {
    return epoch_seconds_before_ + std::chrono::duration<double>(now - epoch_start_).count();
  }

  // On a terminal, the live line: averages over the last ten steps or so, and the time left at
  // that pace (evaluations not counted).
  void showProgress(const EpochStats& step_stats, std::int64_t in_epoch, std::int64_t step) {
    if (!progress_line_.on()) return;
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - last_step_at_).count();
    last_step_at_ = now;
    const double loss =
        step_stats.loss_sum / static_cast<double>(std::max<std::int64_t>(1, step_stats.count));
    step_seconds_ = step_seconds_ < 0 ? seconds : 0.9 * step_seconds_ + 0.1 * seconds;
    loss_average_ = loss_average_ < 0 ? loss : 0.9 * loss_average_ + 0.1 * loss;
    const double left =
        static_cast<double>(config_.plan.last_step - complete_through_) * step_seconds_;
    const double rate = static_cast<double>(config_.plan.global_batch *
                                            std::max<std::int64_t>(1, options_.block_size)) /
                        std::max(step_seconds_, 1e-9);
    progress_line_.show(fmt::format(
        "epoch {}/{}  step {}/{}  {:.0f} {}/s{}  loss {:.4f}  lr {:.4g}  ETA {}", epochIndex() + 1,
        options_.num_epochs, in_epoch, config_.plan.steps_per_epoch, rate, units(), mfu(rate, "  "),
        loss_average_, kernels::learningRate(config_.lr, config_.plan.scheduleStep(step)),
        formatDuration(left)));
  }

  // "MFU 41%" after `separator`, for `rate` inputs (tokens) a second: the model's training FLOPs
  // a second over the peak (CoordinatorConfig::peak_flops); empty without a peak.
  std::string mfu(double rate, const char* separator) const {
    if (config_.peak_flops <= 0 || config_.model_flops_per_sample <= 0) return "";
    const double samples =
        rate / static_cast<double>(std::max<std::int64_t>(1, options_.block_size));
    return fmt::format("{}MFU {:.0f}%", separator,
                       100 * samples * config_.model_flops_per_sample / config_.peak_flops);
  }

  // What the counts count: a language model's tokens, or inputs (images).
  const char* units() const { return options_.block_size > 0 ? "tokens" : "inputs"; }

  // A stop or a checkpoint asked through RunControl, or a worker waiting to join an elastic run,
  // pauses every updater a few steps on.
  void maybePause() {
    if (pause_at_ >= 0) return;
    PauseFor why = PauseFor::kNothing;
    if (config_.control && config_.control->stop.load()) {
      why = PauseFor::kStop;
    } else if (config_.control && config_.control->checkpoint.exchange(false)) {
      why = PauseFor::kCheckpoint;
    } else if (config_.joiner_waiting && Clock::now() >= next_join_check_) {
      next_join_check_ = Clock::now() + std::chrono::milliseconds(500);
      if (config_.joiner_waiting()) why = PauseFor::kJoin;
    }
    if (why == PauseFor::kNothing) return;
    const std::int64_t at = complete_through_ + kPauseMargin;
    // The run ends first, with its last checkpoint: that answers a checkpoint asked for, and a
    // stop has nothing left to stop.
    if (at >= config_.plan.last_step) return;
    progress_line_.clear();
    pause_at_ = at;
    pause_for_ = why;
    spdlog::info("{}: every worker pauses after step {}",
                 why == PauseFor::kJoin         ? "a worker waits to join"
                 : why == PauseFor::kCheckpoint ? "a checkpoint was asked for"
                                                : "a stop was asked for",
                 at);
    for (const auto& u : config_.updaters)
      send(u, PauseAt{at});
  }

  // Every updater paused part way through an epoch: re-form, checkpoint or stop.
  void paused() {
    if (pause_for_ == PauseFor::kJoin) {
      endGeneration(pause_at_);
      return;
    }
    if (pause_for_ == PauseFor::kStop && !config_.control->checkpoint_at_stop.load()) {
      stopRun();
      return;
    }
    if (config_.has_buffers) {  // the checkpoint needs the batch-norm statistics
      pause_buffers_ = true;
      requestBuffers();
      return;
    }
    checkpointPaused();
  }

  void checkpointPaused() {
    const std::int64_t step = epoch_end_->step;
    writeCheckpoint(fmt::format("{}_step{}.ckpt", config_.experiment_id, step),
                    config_.plan.epochOf(step),
                    config_.cumulative_time + cumulative_time_ + epochSeconds(Clock::now()),
                    config_.cumulative_inputs + cumulative_inputs_ + epoch_.count);
    if (pause_for_ == PauseFor::kStop) {
      stopRun();
      return;
    }
    epoch_end_.reset();
    pause_at_ = -1;
    pause_for_ = PauseFor::kNothing;
    for (const auto& u : config_.updaters)
      send(u, Resume{});
  }

  // Ends the run before its last step, as asked (RunControl::stop).
  void stopRun() {
    progress_line_.clear();
    const std::int64_t step = epoch_end_->step;
    spdlog::info("stopped after step {}, as asked", step);
    auto& result = *config_.result;
    result.stopped = true;
    result.steps = step;
    result.weights = wholeWeights();  // host memory no one writes any more
    for (const auto& f : config_.followers)
      send(f, Shutdown{});
    system().shutdown();
  }

  // The world re-forms: every process leaves this generation's system (trainer.cc goes on).
  void endGeneration(std::int64_t step) {
    progress_line_.clear();
    spdlog::info("paused after step {}: this generation ends", step);
    for (const auto& f : config_.followers)
      send(f, Shutdown{});
    system().shutdown();
  }

  // Once every updater sent its EpochEnd for the step and the step is done: a pause part way
  // through an epoch, or the epoch's end (evaluation, log row, checkpoint).
  void maybeEndEpoch() {
    if (epoch_end_ || ends_.empty()) return;  // one at a time
    auto first = ends_.begin();
    if (first->second.second < config_.num_updaters || complete_through_ < first->first) return;
    epoch_end_ = std::move(first->second.first);
    ends_.erase(first);
    TROUPE_ENFORCE(!epoch_end_->paused || epoch_end_->weights.defined(),
                   "the chief's updater paused after step ", epoch_end_->step,
                   " without its weights");
    if (epoch_end_->paused && !config_.weight_ranges.empty() &&
        checkpointsAfter(epoch_end_->step)) {
      gatherWeights();
      return;
    }
    weightsReady();
  }

  // Once the checkpoint's weights are at hand at a pause (the chief's, or on disk from the
  // pipeline stages' workers): the state's shards, where a checkpoint is written, then the
  // epoch's end.
  void weightsReady() {
    if (epoch_end_->paused && !config_.shards.empty() && checkpointsAfter(epoch_end_->step)) {
      gatherState();
      return;
    }
    epochEnds();
  }

  // Pipeline stages in workers of their own, for a checkpoint: the model's weights put together
  // on disk, the chief's own stage's from its EpochEnd (its window's), each other stage's from
  // its worker (CoordinatorConfig::weight_ranges) a piece at a time, each written where it goes
  // and let go, so that no process holds the whole model's.
  void gatherWeights() {
    const std::int64_t step = epoch_end_->step;
    weights_file_.emplace(fmt::format("{}/{}_step{}_weights.ckpt.tmp.{}", config_.checkpoint_dir,
                                      config_.experiment_id, step, ::getpid()),
                          1, config_.num_params);
    const auto [begin, end] = config_.weight_ranges[0];
    const kernels::Tensor own =
        kernels::FlatParams(epoch_end_->weights, config_.chief_window).slice(begin, end);
    weights_file_->write(begin, end, 0, own.f32(), end - begin);
    gathering_weights_ = true;
    gather_shard_ = 1;
    gather_offset_ = 0;
    requestState();
  }

  // Whether the pause after `step` writes a checkpoint: part way through an epoch, where one (or
  // a stop with one) was asked for; at an epoch's end, also at the run's last step and every
  // checkpoint_every epochs.
  bool checkpointsAfter(std::int64_t step) const {
    const PauseFor pause = step == pause_at_ ? pause_for_ : PauseFor::kNothing;
    const bool asked = pause == PauseFor::kCheckpoint ||
                       (pause == PauseFor::kStop && config_.control->checkpoint_at_stop.load());
    if (step == pause_at_ && !config_.plan.epochEndsAt(step)) return asked;
    const std::int64_t epoch = config_.plan.epochOf(step - 1) + 1;  // epochs completed
    const auto every = options_.checkpoint_every;
    return step >= config_.plan.last_step || asked || (every > 0 && epoch % every == 0);
  }

  // The checkpoint's optimizer state put together on disk from its shards (ZeRO's, the
  // parameter servers'): the chief's own from its EpochEnd where it carries it, each other one a
  // piece at a time from its holder (StateRequest, one in flight), every piece written where it
  // goes and let go, so that no process holds the whole state. Then the epoch's end goes on
  // (epochEnds).
  void gatherState() {
    const std::int64_t step = epoch_end_->step;
    const auto rows = static_cast<std::int64_t>(options_.optimizer.info().states.size());
    state_file_.emplace(fmt::format("{}/{}_step{}_state.ckpt.tmp.{}", config_.checkpoint_dir,
                                    config_.experiment_id, step, ::getpid()),
                        rows, config_.num_params);
    gather_shard_ = 0;
    gather_offset_ = 0;
    if (epoch_end_->state.defined()) {  // the chief's shard (ZeRO): written, not asked for
      const auto [begin, end] = config_.shards[0];
      TROUPE_ENFORCE(epoch_end_->state.numel() == rows * (end - begin),
                     "the chief's EpochEnd after step ", step, " carries ",
                     epoch_end_->state.numel(), " state elements, not its shard's ",
                     rows * (end - begin));
      if (end > begin)
        state_file_->write(begin, end, 0, epoch_end_->state.f32(), rows * (end - begin));
      epoch_end_->state = kernels::Tensor();
      gather_offset_ = rows * (end - begin);
    }
    requestState();
  }

  // What is being gathered: a stage's weights (gathering_weights_), or a shard of the state.
  const std::vector<std::pair<std::int64_t, std::int64_t>>& gatheredRanges() const {
    return gathering_weights_ ? config_.weight_ranges : config_.shards;
  }

  // Asks the holder of the next shard (or stage) for the next piece of it; once none is left,
  // goes on.
  void requestState() {
    const auto& ranges = gatheredRanges();
    const auto rows = gathering_weights_
                          ? std::int64_t{1}
                          : static_cast<std::int64_t>(options_.optimizer.info().states.size());
    for (;;) {
      const auto [begin, end] = ranges[static_cast<std::size_t>(gather_shard_)];
      if (gather_offset_ < rows * (end - begin)) break;
      gather_offset_ = 0;
      if (++gather_shard_ == static_cast<int>(ranges.size())) {
        gather_shard_ = -1;
        if (!gathering_weights_) {
          epochEnds();
          return;
        }
        gathering_weights_ = false;
        weightsReady();
        return;
      }
    }
    const auto [begin, end] = ranges[static_cast<std::size_t>(gather_shard_)];
    gather_count_ = std::min(kStatePiece, rows * (end - begin) - gather_offset_);
    const auto& holders = gathering_weights_ ? config_.weight_holders : config_.state_holders;
    send(holders[static_cast<std::size_t>(gather_shard_)],
         StateRequest{epoch_end_->step, gather_offset_, gather_count_, gathering_weights_,
                      gather_shard_});
  }

  void stateChunk(const StateChunk& c) {
    const char* what = gathering_weights_ ? "the weights of stage" : "the optimizer state's shard";
    if (gather_shard_ < 0 || !epoch_end_ || c.step != epoch_end_->step ||
        c.shard != gather_shard_ || c.offset != gather_offset_ ||
        c.values.numel() != gather_count_) {
      throw InvariantError(fmt::format(
          "a piece of {} {} ({} elements at {} after step {}) came unasked (asked: {}, {} at {})",
          what, c.shard, c.values.numel(), c.offset, c.step, gather_shard_, gather_count_,
          gather_offset_));
    }
    const auto [begin, end] = gatheredRanges()[static_cast<std::size_t>(c.shard)];
    (gathering_weights_ ? *weights_file_ : *state_file_)
        .write(begin, end, c.offset, c.values.f32(), c.values.numel());
    gather_offset_ += c.values.numel();
    requestState();
  }

  // Once every updater's EpochEnd for the step is in (and a sharded state gathered): a pause
  // part way through an epoch, or the epoch's end.
  void epochEnds() {
    if (epoch_end_->step == pause_at_ && !config_.plan.epochEndsAt(pause_at_)) {
      paused();
      return;
    }
    // The batch-norm statistics, for the evaluation and the checkpoint (requestBuffers): only
    // the updaters' pause (StepPlan::pausesAt) keeps the replicas from changing them meanwhile.
    if (config_.has_buffers && epoch_end_->paused) {
      requestBuffers();
    } else {
      evaluate();
    }
  }

  // The batch-norm statistics, for the evaluation and the checkpoint: replica 0's, or each
  // pipeline stage's from its worker in the first pipeline (CoordinatorConfig::buffer_ranges),
  // whose are the only current ones of its stage's layers.
  void requestBuffers() {
    buffers_taken_ = 0;
    if (config_.buffer_ranges.empty()) {
      send(config_.replicas[0], BuffersRequest{});
      return;
    }
    for (std::size_t s = 0; s < config_.buffer_ranges.size(); ++s)
      send(config_.replicas[s], BuffersRequest{});
  }

  // Whether the buffers are whole with `b`: each stage's range taken from its own worker's.
  bool takeBuffers(const Buffers& b) {
    if (config_.buffer_ranges.empty()) {
      buffers_ = b.buffers;
      return true;
    }
    const auto stage = static_cast<std::size_t>(b.replica);
    TROUPE_ENFORCE(stage < config_.buffer_ranges.size() && b.buffers.numel() > 0,
                   "batch-norm statistics from replica ", b.replica,
                   ", which runs no stage of the first pipeline");
    if (buffers_taken_ == 0) {
      buffers_ = b.buffers;  // a copy of the sender's: its stage's ranges are the current ones
    } else {
      const auto [begin, end] = config_.buffer_ranges[stage];
      std::copy(b.buffers.f32() + begin, b.buffers.f32() + end, buffers_.f32() + begin);
    }
    return ++buffers_taken_ == config_.buffer_ranges.size();
  }

  void evaluate() {
    eval_ = {};
    evaluated_ = 0;
    if (!config_.has_test) {
      endEpoch();
      return;
    }
    // Pipeline stages in workers of their own evaluate with the weights they hold, current at
    // the pause (the tied ones they read from their owners: Net::prepareEvaluation).
    for (const auto& replica : config_.replicas)
      send(replica, Evaluate{epochIndex(), wholeWeights(), buffers_});
  }

  // The epoch's input: whether the replicas waited for batches, how far ahead the readers were,
  // how fast they decode (readers of troupe's own; a caller's reader reports no time).
  void logInput(std::int64_t epoch, const EpochStats& e, int num_replicas) const {
    if (e.replica_steps == 0) return;
    // Counted per replica and step: "of their 2 x 25 steps" for 2 replicas of 25 steps.
    const int replicas = std::max(1, num_replicas);
    spdlog::info(
        "epoch {} input: {} waited {:.3f} s for batches (at {} of {} steps); {:.1f} batches "
        "ready at a step, {} at the fewest{}",
        epoch, replicas == 1 ? "the replica" : "replicas", e.input_wait, e.waited,
        replicas == 1 ? fmt::format("its {}", e.replica_steps)
                      : fmt::format("their {} x {}", replicas, e.replica_steps / replicas),
        static_cast<double>(e.ready_sum) / static_cast<double>(e.replica_steps), e.fewest_ready,
        e.read_seconds > 0 ? fmt::format("; a reader decodes {:.0f} {}/s",
                                         static_cast<double>(e.count) / e.read_seconds, units())
                           : std::string());
    // As torch.cuda.max_memory_allocated after reset_peak_memory_stats at the epoch's start: the
    // live tensors and workspaces at their most during this epoch's steps.
    if (e.device_peak > 0) {
      spdlog::info(
          "epoch {} gpu memory: peak {:.1f} MiB of this process's tensors and workspaces on a "
          "replica's GPU",
          epoch, static_cast<double>(e.device_peak) / (1 << 20));
    }
  }

  // Mixed precision with a loss scale: where it stands, and the steps skipped for inf or NaN
  // gradients (their batches trained nothing).
  void logLossScale(std::int64_t epoch) {
    if (epoch_end_->loss_scale <= 0) return;
    const std::int64_t total = epoch_end_->overflow_steps;
    spdlog::info(
        "epoch {} loss scale {:g}: {} step(s) skipped for inf or NaN gradients ({} in all)", epoch,
        epoch_end_->loss_scale, total - overflow_logged_, total);
    overflow_logged_ = total;
  }

  void endEpoch() {
    progress_line_.clear();
    const std::int64_t step = epoch_end_->step;
    const std::int64_t epoch = config_.plan.epochOf(step - 1) + 1;  // epochs completed
    const auto closed = closed_.find(step);
    TROUPE_ENFORCE(closed != closed_.end(), "epoch ", epoch, " ended before its last step");
    const EpochStats stats = closed->second.stats;
    const double epoch_time = closed->second.seconds;
    closed_.erase(closed);
    cumulative_time_ += epoch_time;
    cumulative_inputs_ += stats.count;
    LogRow row;
    row.time_spent = epoch_time;
    row.cumulative_time_spent = config_.cumulative_time + cumulative_time_;
    row.input_count = stats.count;
    row.cumulative_input_count = config_.cumulative_inputs + cumulative_inputs_;
    row.cumulative_batch_count = step;
    row.inputs_per_sec = static_cast<double>(stats.count) / std::max(epoch_time, 1e-9);
    row.accuracy = stats.correct / std::max<std::int64_t>(1, stats.count);
    row.epoch = epoch;
    row.learning_rate = kernels::learningRate(config_.lr, config_.plan.scheduleStep(step - 1));
    row.loss = stats.loss_sum / std::max<std::int64_t>(1, stats.count);
    row.test_accuracy =
        config_.has_test ? eval_.correct / std::max<std::int64_t>(1, eval_.count) : -1.0;
    row.skipped_records = stats.skipped;
    // Without test data, no test accuracy (the log's column holds -1, as Caffe2's did). A
    // language model's test loss is per token (its own column), with its perplexity.
    std::string test;
    if (config_.has_test && options_.block_size > 0) {
      row.test_loss = eval_.loss_sum / std::max<std::int64_t>(1, eval_.count);
      test = fmt::format(" test_loss {:.4f} (perplexity {:.2f})", row.test_loss,
                         std::exp(row.test_loss));
    }
    config_.log->write(row);
    if (config_.has_test) test += fmt::format(" test_accuracy {:.4f}", row.test_accuracy);
    spdlog::info(
        "epoch {} done: loss {:.4f} accuracy {:.4f}{} ({} {} in {:.2f} s, {:.0f} {}/s{})", epoch,
        row.loss, row.accuracy, test, row.input_count, units(), row.time_spent, row.inputs_per_sec,
        units(),
        options_.skip_bad_records ? fmt::format(", {} bad records skipped", stats.skipped) : "");
    logInput(epoch, stats, config_.num_replicas);
    logLossScale(epoch);
    auto& result = *config_.result;
    result.epochs.push_back(
        {epoch, row.loss, row.accuracy, row.test_accuracy, row.inputs_per_sec, stats.skipped});
    result.steps = step;

    if (config_.control && config_.control->callbacks.on_epoch) {
      config_.control->callbacks.on_epoch(EpochMetrics{epoch, step, row.loss, row.accuracy,
                                                       row.test_accuracy, row.inputs_per_sec,
                                                       row.time_spent, row.test_loss});
    }
    const bool last = step >= config_.plan.last_step;
    const auto every = options_.checkpoint_every;
    // A checkpoint or a stop asked for at this epoch's end: with the epoch's name.
    const PauseFor pause = step == pause_at_ ? pause_for_ : PauseFor::kNothing;
    const bool asked = pause == PauseFor::kCheckpoint ||
                       (pause == PauseFor::kStop && config_.control->checkpoint_at_stop.load());
    if (last || asked || (every > 0 && epoch % every == 0)) {
      // StepPlan::pausesAt said so to the updaters, which sent their weights and state.
      TROUPE_ENFORCE(epoch_end_->paused, "epoch ", epoch, "'s checkpoint: the updaters went on");
      writeCheckpoint(fmt::format("{}_epoch{}.ckpt", config_.experiment_id, epoch), epoch,
                      row.cumulative_time_spent, row.cumulative_input_count);
    }
    if (pause == PauseFor::kStop) {
      stopRun();
      return;
    }
    if (last) {
      // The chief's updater's weights (or their copy on the host), which no one writes any more:
      // the run is over.
      result.weights = wholeWeights();
      for (const auto& f : config_.followers)
        send(f, Shutdown{});
      system().shutdown();
      return;
    }
    const bool paused = epoch_end_->paused;
    epoch_end_.reset();
    if (pause == PauseFor::kJoin) {
      endGeneration(step);
      return;
    }
    if (pause == PauseFor::kCheckpoint) {
      pause_at_ = -1;
      pause_for_ = PauseFor::kNothing;
    }
    if (!paused) {  // the updaters went on: the next epoch's steps are under way
      maybeEndEpoch();
      return;
    }
    // The next epoch's time starts now, the pause's evaluation and checkpoint left out.
    epoch_start_ = window_start_ = Clock::now();
    for (const auto& u : config_.updaters)
      send(u, Resume{});
    maybeEndEpoch();
  }

  // The chief's weights at a pause where they are the whole model's; pipeline stages' workers
  // keep their own stage's alone, which the checkpoint puts together on disk: none.
  kernels::Tensor wholeWeights() const {
    return config_.weight_ranges.empty() ? epoch_end_->weights : kernels::Tensor();
  }

  // The paused updaters' state as `name` in the checkpoint folder; `epochs` completed so far.
  void writeCheckpoint(const std::string& name, std::int64_t epochs, double cumulative_time,
                       std::int64_t cumulative_inputs) {
    Checkpoint ck;
    ck.meta["model"] = options_.model.name.empty() ? "custom" : options_.model.name;
    ck.meta["step"] = std::to_string(epoch_end_->step);
    ck.meta["epoch"] = std::to_string(epochs);
    ck.meta["num_params"] = std::to_string(config_.num_params);
    ck.meta["global_batch"] = std::to_string(config_.plan.global_batch);
    ck.meta["steps_per_epoch"] = std::to_string(config_.plan.steps_per_epoch);
    ck.meta["seed"] = std::to_string(options_.seed);
    ck.meta["run_id"] = options_.run_id;  // what --resume auto matches, with run_name
    ck.meta["run_name"] = runName(options_);
    ck.meta["experiment"] = config_.experiment_id;
    ck.meta["cumulative_time_spent"] = fmt::format("{:.6f}", cumulative_time);
    ck.meta["cumulative_input_count"] = std::to_string(cumulative_inputs);
    // A dynamic loss scale goes on from where it was (PyTorch keeps its GradScaler's state_dict
    // beside the model's), so that a resumed run repeats an uninterrupted one.
    if (epoch_end_->loss_scale > 0) {
      ck.meta["loss_scale"] = fmt::format("{:.9g}", epoch_end_->loss_scale);
      ck.meta["overflow_steps"] = std::to_string(epoch_end_->overflow_steps);
    }
    if (config_.weight_ranges.empty()) {
      ck.weights = epoch_end_->weights;
    } else {
      TROUPE_ENFORCE(weights_file_.has_value(), "checkpoint ", name,
                     ": the pipeline stages' weights were not gathered");
      ck.weights_file = weights_file_->path();
    }
    ck.state = epoch_end_->state;
    if (!config_.shards.empty()) {
      TROUPE_ENFORCE(state_file_.has_value(), "checkpoint ", name,
                     ": the workers' shards of the state were not gathered");
      ck.state_file = state_file_->path();
    }
    ck.meta["optimizer"] = options_.optimizer.name();
    ck.meta["optimizer_state"] =
        fmt::format("{}", fmt::join(options_.optimizer.info().states, ","));
    ck.buffers = buffers_;
    progress_line_.clear();
    const std::string path = config_.checkpoint_dir + "/" + name;
    saveCheckpoint(path, ck);
    state_file_.reset();
    weights_file_.reset();
    config_.result->checkpoints.push_back(path);
    spdlog::info("checkpoint {}", path);
    if (config_.control && config_.control->callbacks.on_checkpoint) {
      config_.control->callbacks.on_checkpoint(path, epoch_end_->step);
    }
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
  // Epochs whose last step is done, by the step they end at, until their end is handled (where
  // the updaters go on, the next epoch's steps are done meanwhile).
  struct Closed {
    EpochStats stats;
    double seconds = 0;
  };
  std::map<std::int64_t, Closed> closed_;
  // The updaters' EpochEnds by step, and how many came; the first step's is handled (epoch_end_)
  // once every updater's came and its step is done.
  std::map<std::int64_t, std::pair<EpochEnd, int>> ends_;
  std::optional<EpochEnd> epoch_end_;
  // A sharded state being put together for a checkpoint (gatherState): the file, and the shard
  // (-1: none) and the elements of it asked for last.
  std::optional<StateFile> state_file_;
  std::optional<StateFile> weights_file_;  // pipeline stages' workers: a checkpoint's weights
  int gather_shard_ = -1;
  std::int64_t gather_offset_ = 0, gather_count_ = 0;
  bool gathering_weights_ = false;    // the stages' weights (gatherWeights), not the state's shards
  std::int64_t overflow_logged_ = 0;  // EpochEnd::overflow_steps at the last epoch's log
  kernels::Tensor buffers_;
  bool started_ = false;
  Clock::time_point epoch_start_ = Clock::now(), window_start_ = Clock::now(),
                    last_progress_ = Clock::now();
  double epoch_seconds_before_ = 0;  // of the epoch, in earlier generations (elastic runs)
  ProgressLine progress_line_;
  Clock::time_point last_step_at_ = Clock::now();
  double step_seconds_ = -1;  // moving averages for the progress line
  double loss_average_ = -1;
  std::int64_t pause_at_ = -1;
  PauseFor pause_for_ = PauseFor::kNothing;
  bool pause_buffers_ = false;     // the buffers were asked for a paused checkpoint
  std::size_t buffers_taken_ = 0;  // of the stages' (CoordinatorConfig::buffer_ranges)
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
