#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "actors/core/messages.h"
#include "actors/core/trace.h"
#include "actors/roles/observers.h"
#include "actors/roles/roles.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// Keys the server holds are segments: the trainer's server has one, its shard; the KVStore's has
// one per part of a KVStore key that it owns, one after the other in the order of their inits.
// Each segment keeps its own clocks, so a KVStore key is updated as soon as every worker pushed
// it, whatever the other keys do. A push may span adjacent segments (and parts of the first and
// last), a pull whole adjacent ones: one message for the keys a worker pushes or pulls together.
class Server final : public Actor {
 public:
  Server(std::string name, ServerConfig config)
      : Actor(std::move(name)), config_(std::move(config)) {
    on<Push>([this](Push& p) { push(p); });
    on<Pull>([this](Pull& p) {
      checkWorker(p.worker, "pull");
      cover(p.worker, "pulled", p.key_begin, p.key_end, /*whole=*/true);
      pending_.push_back(p);
      waiting_[{p.worker, p.key_begin, p.step}] = {Clock::now(), false};
      answer();
    });
    on<KvInit>([this](KvInit& m) { kvInit(m); });
    on<KvConfigure>([this](KvConfigure& m) { kvConfigure(m); });
    on<KvDone>([this](KvDone& m) {
      checkWorker(m.worker, "done");
      done_.insert(m.worker);
      if (static_cast<int>(done_.size()) == config_.num_workers) system().shutdown();
      answer();
    });
    on<StallCheck>([this](StallCheck&) { checkStalls(); });
    on<StateRequest>([this](StateRequest& r) { sendState(r); });
    on<Shutdown>([this](Shutdown&) { system().shutdown(); });
    on<LinkLost>([this](LinkLost& l) {
      // The loss comes after the link's last message: a KvDone came before it.
      if (l.node < static_cast<std::uint32_t>(config_.num_workers) && done_.count(l.node)) {
        spdlog::info("server {}: worker {} left, done with the store", config_.index, l.node);
        return;
      }
      system().fail(std::make_exception_ptr(
          lostLinkError(config_.run.members ? config_.run.members->ofNode(l.node, l.address)
                                            : Peer{"node", static_cast<int>(l.node), l.address},
                        l.why)));
    });
  }

  void started() override {
    backend_ = kernels::makeCpuBackend(config_.budget ? config_.budget->teamOf(config_.threads, 1)
                                                      : config_.threads);
    if (!config_.kvstore) {
      Segment& s = addSegment(config_.key_begin, config_.key_end, config_.initial_weights,
                              config_.first_step);
      if (config_.initial_state.defined() && config_.initial_state.numel() > 0) {
        TROUPE_ENFORCE_EQ(config_.initial_state.numel(), s.optimizer->state().numel());
        backend_->copy(config_.initial_state, s.optimizer->state());
      }
    }
    // Copied: what they are views of (the whole model's weights, which every process plans from)
    // need not live on in a server that owns a shard of it.
    config_.initial_weights = config_.initial_state = kernels::Tensor();
    armStallCheck();
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct StepPushes {
    std::vector<kernels::Tensor> sums;  // per worker, this segment's gradient
    std::vector<std::int64_t> received;
  };

  struct Segment {
    std::int64_t begin = 0, end = 0;
    int key = -1;            // the KVStore's key
    std::int64_t first = 0;  // the index of the segment's first value in its key's
    kernels::Tensor weights;
    // The trainer's: config_.optimizer; a KVStore's: as set (kv_optimizer_), made anew when it is.
    std::unique_ptr<kernels::Optimizer> optimizer;
    // Updates applied to it so far (Adam's bias correction counts them): a step of dist_sync; a
    // worker's whole push of a step under dist_async and ssp, whose buckets share one count.
    std::int64_t updates = 0;
    std::vector<std::int64_t> clocks;  // per worker: the last step fully pushed here
    std::int64_t applied = 0;          // dist_sync: steps applied
    // The trainer's dist_async and ssp: `updates` when each (worker, step)'s pull was answered,
    // until that step's push: the push's staleness is the updates applied in between.
    std::map<std::pair<std::uint32_t, std::int64_t>, std::int64_t> read_at;
    std::map<std::int64_t, StepPushes> steps;
    std::int64_t size() const { return end - begin; }
  };

  Segment& addSegment(std::int64_t begin, std::int64_t end, const kernels::Tensor& value,
                      std::int64_t first_step, int key = -1, std::int64_t first = 0) {
    Segment s;
    s.begin = begin;
    s.end = end;
    s.key = key;
    s.first = first;
    s.weights = backend_->empty({end - begin});
    backend_->copy(value, s.weights);
    s.optimizer = kernels::makeOptimizer(*backend_, end - begin,
                                         config_.kvstore ? kv_optimizer_ : config_.optimizer);
    s.updates = config_.mode == ServerConfig::Mode::kSync
                    ? first_step
                    : first_step * static_cast<std::int64_t>(config_.num_workers);
    s.clocks.assign(static_cast<std::size_t>(config_.num_workers), first_step - 1);
    s.applied = first_step;
    return segments_.emplace(begin, std::move(s)).first->second;
  }

  void checkWorker(std::uint32_t worker, const char* what) const {
    if (worker >= static_cast<std::uint32_t>(config_.num_workers)) {
      throw InputError(fmt::format("server {}: a {} from worker {}, of a run of {} workers",
                                   config_.index, what, worker, config_.num_workers));
    }
  }

  // The segments that hold keys [lo, hi), in order, with no gap between them; `whole`: the
  // range begins and ends with theirs. InputError naming the worker otherwise.
  std::vector<Segment*> cover(std::uint32_t worker, const char* what, std::int64_t lo,
                              std::int64_t hi, bool whole) {
    std::vector<Segment*> segments;
    auto it = segments_.upper_bound(lo);
    if (lo < hi && it != segments_.begin()) {
      --it;
      std::int64_t at = lo;
      while (it != segments_.end() && it->second.begin <= at && at < hi) {
        segments.push_back(&it->second);
        at = it->second.end;
        ++it;
      }
      const bool covered = !segments.empty() && at >= hi;
      if (covered && (!whole || (segments.front()->begin == lo && segments.back()->end == hi)))
        return segments;
    }
    throw InputError(fmt::format(
        "worker {} {} keys [{}, {}), which are not {} of server {}{}", worker, what, lo, hi,
        whole ? "whole keys" : "keys", config_.index,
        config_.kvstore ? " (a KVStore key never initialised, or a message not from troupe)" : ""));
  }

  // "step 12 (epoch 1)" for the trainer, "push 12 of key 3" for the KVStore.
  std::string describe(const Segment& s, std::int64_t step) const {
    if (!config_.kvstore) return describeStep(step, config_.run.steps_per_epoch);
    return fmt::format("push {} of key {}", step, s.key);
  }

  void armStallCheck() {
    system().after(stallCheckPeriod(config_.run.stall_warning, config_.run.peer_timeout), self(),
                   StallCheck{});
  }

  // A worker that a pull waits for, and what the pull needs of it.
  struct Late {
    int rank = 0;
    Peer worker;
    std::string state;    // "pushed through step 9"
    std::string missing;  // "its push of step 11 (it pushed through step 9)"
  };

  // The workers a pull of step q waits for.
  std::vector<Late> lateWorkers(const Segment& s, const Pull& q) const {
    std::int64_t need = q.step - 1;  // dist_sync and epoch ends: every push of step q-1
    if (config_.mode == ServerConfig::Mode::kStale && !q.epoch_end)
      need = q.step - 1 - config_.staleness;
    std::vector<Late> late;
    for (std::size_t w = 0; w < s.clocks.size(); ++w) {
      const Peer worker = peerOf(config_.run.members, "worker", static_cast<int>(w));
      if (s.clocks[w] < need) {
        const auto state = config_.kvstore
                               ? fmt::format("pushed key {} {} times", s.key, s.clocks[w] + 1)
                               : fmt::format("pushed through step {}", s.clocks[w]);
        const auto push = config_.kvstore ? fmt::format("push {} of key {}", need, s.key)
                                          : fmt::format("push of step {}", need);
        late.push_back(
            {static_cast<int>(w), worker, state, fmt::format("its {} (it {})", push, state)});
      } else if (q.epoch_end && std::none_of(pending_.begin(), pending_.end(), [&](const Pull& p) {
                   return p.epoch_end && p.worker == w && p.key_begin == s.begin;
                 })) {
        late.push_back(
            {static_cast<int>(w), worker, "not at the epoch's end", "its pull at the epoch's end"});
      }
    }
    return late;
  }

  // "worker 1 (pushed through step 5), worker 2 (not at the epoch's end)".
  static std::string describe(const std::vector<Late>& late) {
    if (late.empty()) return "no worker (the update itself)";
    std::vector<std::string> parts;
    for (const auto& l : late)
      parts.push_back(fmt::format("{} ({})", l.worker.str(), l.state));
    return fmt::format("{}", fmt::join(parts, ", "));
  }

  // Horovod's stall report, for a parameter server: which workers a waiting pull waits for.
  void checkStalls() {
    const auto now = Clock::now();
    const double limit = std::chrono::duration<double>(config_.run.peer_timeout).count();
    for (const auto& q : pending_) {
      auto& w = waiting_[{q.worker, q.key_begin, q.step}];
      const double waited = std::chrono::duration<double>(now - w.since).count();
      const Segment& s = waitedSegment(q);
      const std::string when = describe(s, q.step);
      if (now - w.since >= config_.run.peer_timeout) {
        const auto late = lateWorkers(s, q);
        const std::string what =
            fmt::format("server {}: worker {}'s pull of {} waited {:.1f} s (peer_timeout) for {}",
                        config_.index, q.worker, when, waited, describe(late));
        // The workers whose pulls it held hear whom it gave up on before its links close.
        // Each with whom its own pull waits for (never itself), and why the server gives up.
        for (const auto& held : pending_) {
          auto theirs = lateWorkers(waitedSegment(held), held);
          std::erase_if(theirs,
                        [&](const Late& l) { return l.rank == static_cast<int>(held.worker); });
          tellHeld(held, theirs, true, what);
        }
        if (late.empty()) throw TimeoutError(what);
        throw PeerError(late.front().worker,
                        fmt::format("server {} waited {:g} s (peer_timeout) for {}", config_.index,
                                    limit, late.front().missing),
                        what);
      }
      if (!w.told &&
          now - w.since >= stallCheckPeriod(config_.run.stall_warning, config_.run.peer_timeout)) {
        w.told = true;
        const auto late = lateWorkers(s, q);
        tellHeld(q, late, false,
                 fmt::format("server {} holds worker {}'s pull of {} for {}", config_.index,
                             q.worker, when, describe(late)));
      }
      if (now - w.since >= config_.run.stall_warning && !w.warned) {
        w.warned = true;
        spdlog::warn(
            "stall: server {} has held worker {}'s pull of {} for {:.1f} s, waiting for {}; the "
            "run fails after {:g} s",
            config_.index, q.worker, when, waited, describe(lateWorkers(s, q)), limit);
      }
    }
    armStallCheck();
  }

  // Tells the worker of pull `q` whom the server holds it for.
  void tellHeld(const Pull& q, const std::vector<Late>& late, bool final, std::string reason) {
    send(Address{q.worker, q.reply_actor},
         PullHeld{q.step, q.key_begin, late.empty() ? -1 : late.front().rank, final,
                  std::move(reason)});
  }

  // Whether pull `q` waits for a worker that is done with the store (KvDone): it never comes.
  // Then its worker hears so at once, and the pull is dropped.
  bool hopeless(const Pull& q) {
    if (done_.empty() || q.epoch_end) return false;
    const Segment& s = waitedSegment(q);
    // Cheap first (answer() asks on every push): a done worker the pull could wait for at all.
    if (std::none_of(done_.begin(), done_.end(), [&](std::uint32_t w) {
          return w < s.clocks.size() && s.clocks[w] < q.step - 1;
        })) {
      return false;
    }
    for (const auto& l : lateWorkers(s, q)) {
      if (!done_.count(static_cast<std::uint32_t>(l.rank))) continue;
      tellHeld(q, {l}, true,
               fmt::format("server {}: worker {}'s pull of {} waits for {}, which is done with "
                           "the store: {} never comes ({} sums the n-th push of every worker, so "
                           "every worker must push a key as often)",
                           config_.index, q.worker, describe(s, q.step), l.worker.str(), l.missing,
                           modeName(config_.mode)));
      return true;
    }
    return false;
  }

  // The first segment of a pull that is not ready (the one its stall report names).
  const Segment& waitedSegment(const Pull& q) {
    const auto segments = cover(q.worker, "pulled", q.key_begin, q.key_end, true);
    for (const Segment* s : segments) {
      if (!ready(*s, q)) return *s;
    }
    return *segments.front();
  }

  // "worker 1's push holds NaN at key 17" for the first value of a worker's gradient (values
  // [lo, ...) of segment s, on the host) that is not finite; empty when all are.
  std::string nonFinitePush(const kernels::Tensor& grads, const Segment& s, std::int64_t lo,
                            std::uint32_t worker) const {
    const float* g = grads.f32();
    for (std::int64_t i = 0; i < grads.numel(); ++i) {
      if (std::isfinite(g[i])) continue;
      return fmt::format(
          "worker {}'s push holds {} at {} {}", worker, std::isnan(g[i]) ? "NaN" : "inf",
          config_.kvstore ? fmt::format("value {} of key", s.first + lo + i) : "key",
          config_.kvstore ? std::to_string(s.key) : std::to_string(s.begin + lo + i));
    }
    return {};
  }

  // Fails the run: an update left inf or NaN in the segment, it diverged. `culprit` names the push
  // that was not finite, where one was (an update may also overflow from finite ones).
  [[noreturn]] void failNonFinite(const Segment& s, std::int64_t step, std::int64_t lo,
                                  std::int64_t hi, float lr, const std::string& culprit) const {
    throw NumericError(fmt::format(
        "training diverged: server {}'s update of {} left inf or NaN in {} [{},{}) (learning rate "
        "{:g}): {}",
        config_.index, describe(s, step),
        config_.kvstore ? fmt::format("key {}'s values", s.key) : "weights",
        config_.kvstore ? s.first + lo : s.begin + lo,
        config_.kvstore ? s.first + hi : s.begin + hi, lr,
        culprit.empty() ? "every push was finite: an update too large" : culprit));
  }

  float learningRate(std::int64_t step) const {
    return config_.kvstore ? kv_.learning_rate : kernels::learningRate(config_.lr, step);
  }

  void push(const Push& p) {
    TraceScope span(config_.run.trace, name(),
                    config_.mode == ServerConfig::Mode::kSync ? "push" : "apply push");
    checkWorker(p.worker, "push");
    const auto segments = cover(p.worker, "pushed", p.key_begin, p.key_end, /*whole=*/false);
    const kernels::Tensor grads = gradientOf(p, p.key_end - p.key_begin);
    if (config_.kvstore && kv_.rescale_grad != 1.0f) backend_->scale(grads, kv_.rescale_grad);
    for (Segment* s : segments) {
      const std::int64_t b = std::max(p.key_begin, s->begin), e = std::min(p.key_end, s->end);
      pushSegment(*s, p, b - s->begin, e - s->begin, grads.slice(b - p.key_begin, e - p.key_begin));
    }
    backend_->synchronize();
    answer();
  }

  // The updates of `s` between the answer to the pull of `p`'s worker and step and this push (0
  // where that pull was not answered here: a run's first step, from the initial weights).
  static std::int64_t staleness(const Segment& s, const Push& p) {
    const auto it = s.read_at.find({p.worker, p.step});
    return it == s.read_at.end() ? 0 : s.updates - it->second;
  }

  // Values [lo, hi) of segment `s` from push `p`.
  void pushSegment(Segment& s, const Push& p, std::int64_t lo, std::int64_t hi,
                   const kernels::Tensor& grads) {
    auto& step = s.steps[p.step];
    if (step.sums.empty()) {
      step.sums.resize(s.clocks.size());
      step.received.assign(s.clocks.size(), 0);
    }
    if (config_.mode == ServerConfig::Mode::kSync) {
      auto& sum = step.sums[p.worker];
      if (!sum.defined() || sum.numel() == 0) sum = backend_->empty({s.size()});
      backend_->copy(grads, sum.slice(lo, hi));
    } else {
      if (config_.kvstore && !kv_.has_optimizer) {
        throw InputError(fmt::format(
            "worker {} pushed key {} to server {} of a {} store without an optimizer "
            "(setOptimizer first: an asynchronous store has no other way to apply a push)",
            p.worker, s.key, config_.index, modeName(config_.mode)));
      }
      // The trainer's asynchronous SGD is staleness-aware (Zhang et al. 2016): a push lands on
      // weights about W-1 pushes newer than the ones it was computed from, so its step is scaled
      // by 1/W, and by 1/(tau + 1) where its measured staleness tau was more (a worker that
      // stalled while the others pushed on: its late gradient, at 1/W with momentum, could throw
      // the weights off). The KVStore applies the optimizer as set, as MXNet's servers do.
      const float lr = config_.kvstore
                           ? learningRate(p.step)
                           : learningRate(p.step) / static_cast<float>(std::max<std::int64_t>(
                                                        config_.num_workers, staleness(s, p) + 1));
      s.optimizer->stepRange(s.weights.slice(lo, hi), grads, lo, hi, lr, s.updates + 1);
      if (!backend_->updatesFinite()) {
        failNonFinite(s, p.step, lo, hi, lr, nonFinitePush(grads, s, lo, p.worker));
      }
    }
    step.received[p.worker] += hi - lo;
    if (step.received[p.worker] > s.size()) {
      throw InputError(fmt::format("worker {} pushed keys [{}, {}) of {} twice", p.worker,
                                   p.key_begin, p.key_end, describe(s, p.step)));
    }
    if (step.received[p.worker] == s.size()) {
      s.clocks[p.worker] = p.step;
      s.read_at.erase(s.read_at.lower_bound({p.worker, std::numeric_limits<std::int64_t>::min()}),
                      s.read_at.upper_bound({p.worker, p.step}));
      if (config_.mode != ServerConfig::Mode::kSync) ++s.updates;  // the worker's whole push
    }
    const bool all_in = std::all_of(step.received.begin(), step.received.end(),
                                    [&](std::int64_t n) { return n == s.size(); });
    if (config_.mode == ServerConfig::Mode::kSync && all_in) {
      // Every worker's gradient of step t is in: sum in worker order, then one update.
      auto& total = step.sums[0];
      for (std::size_t w = 1; w < step.sums.size(); ++w)
        backend_->axpy(1.0f, step.sums[w], total);
      if (config_.kvstore && !kv_.has_optimizer) {
        backend_->copy(total, s.weights);  // MXNet's server without an updater: the sum
      } else {
        const float lr = learningRate(p.step);
        s.optimizer->stepRange(s.weights, total, 0, s.size(), lr, ++s.updates);
        if (!backend_->updatesFinite()) {
          // The other workers' pushes are as they came; worker 0's was summed into: what is not
          // finite in the sum but in none of theirs was in its push (or the sum overflowed).
          std::string culprit;
          for (std::size_t w = 1; w < step.sums.size() && culprit.empty(); ++w)
            culprit = nonFinitePush(step.sums[w], s, 0, static_cast<std::uint32_t>(w));
          if (culprit.empty()) {
            culprit = nonFinitePush(total, s, 0, 0);
            if (!culprit.empty()) culprit += " (or the sum of the pushes overflowed there)";
          }
          failNonFinite(s, p.step, 0, s.size(), lr, culprit);
        }
      }
      s.applied = p.step + 1;
    }
    if (all_in) s.steps.erase(p.step);
  }

  // A push's gradient in float: as it came, or decoded (the run's gradient compression).
  kernels::Tensor gradientOf(const Push& p, std::int64_t n) {
    if (config_.compression.type == kernels::GradientCompression::kNone) {
      if (p.data.dtype() != kernels::DType::kFloat32 || p.data.numel() != n) {
        throw InputError(fmt::format(
            "worker {} pushed keys [{}, {}) of step {} compressed or of the wrong size, to a "
            "server without gradient compression",
            p.worker, p.key_begin, p.key_end, p.step));
      }
      // The KVStore scales the push in place (rescale_grad): not the sender's memory.
      return config_.kvstore ? snapshot(p.data) : p.data;
    }
    auto out = kernels::Tensor::hostUninitialized({n});
    kernels::decode(config_.compression, p.data, out.f32(), n, /*accumulate=*/false);
    return out;
  }

  void kvInit(const KvInit& m) {
    checkWorker(m.worker, "KVStore init");
    KvAck ack{m.id, {}};
    const auto overlaps = [&] {
      auto it = segments_.lower_bound(m.key_end);
      return it != segments_.begin() && std::prev(it)->second.end > m.key_begin;
    };
    if (!config_.kvstore) {
      ack.error = fmt::format("server {} serves a training run, not a KVStore", config_.index);
    } else if (m.key_end <= m.key_begin || m.value.numel() != m.key_end - m.key_begin ||
               m.value.dtype() != kernels::DType::kFloat32) {
      ack.error = fmt::format("init of key {}: {} values for keys [{}, {})", m.key, m.value.numel(),
                              m.key_begin, m.key_end);
    } else if (overlaps()) {
      ack.error = fmt::format("init of key {}: server {} holds keys [{}, {}) already", m.key,
                              config_.index, m.key_begin, m.key_end);
    } else {
      addSegment(m.key_begin, m.key_end, m.value, 0, m.key, m.first);
    }
    send(Address{m.worker, m.reply_actor}, std::move(ack));
  }

  void kvConfigure(const KvConfigure& m) {
    checkWorker(m.worker, "KVStore configure");
    KvAck ack{m.id, {}};
    if (!config_.kvstore) {
      ack.error = fmt::format("server {} serves a training run, not a KVStore", config_.index);
    } else if (m.compression > static_cast<std::uint8_t>(kernels::GradientCompression::k2Bit)) {
      ack.error = fmt::format("gradient compression {} is none of troupe's", m.compression);
    } else if (const std::string bad = checkOptimizer(m); !bad.empty()) {
      ack.error = bad;
    } else {
      const kernels::OptimizerSettings& next = m.optimizer;
      if (m.new_optimizer) {
        // setOptimizer: its state and update count start anew, as MXNet's servers make a new
        // updater (setGradientCompression keeps them).
        kv_optimizer_ = next;
        for (auto& [begin, s] : segments_) {
          s.optimizer = kernels::makeOptimizer(*backend_, s.size(), kv_optimizer_);
          s.updates = 0;
        }
      }
      kv_ = m;
      config_.compression = {static_cast<kernels::GradientCompression>(m.compression), m.threshold};
    }
    send(Address{m.worker, m.reply_actor}, std::move(ack));
  }

  // Why the optimizer `m` asks for cannot be (an unknown name, a setting out of its range), or "".
  static std::string checkOptimizer(const KvConfigure& m) {
    if (!m.has_optimizer) return "";
    try {
      kernels::check(m.optimizer, 1);
      return "";
    } catch (const InputError& e) {
      return fmt::format("setOptimizer: {}", e.what());
    }
  }

  // Pulls for step t need: dist_sync, the update of step t-1; dist_async, nothing (the worker's
  // own pushes came first on its link); ssp, every worker's pushes up to t-1-staleness.
  bool ready(const Segment& s, const Pull& q) const {
    const std::int64_t min_clock = *std::min_element(s.clocks.begin(), s.clocks.end());
    if (q.epoch_end) {
      // Everyone has pushed everything before the epoch's end.
      return min_clock >= q.step - 1 &&
             (config_.mode != ServerConfig::Mode::kSync || s.applied >= q.step);
    }
    if (config_.mode == ServerConfig::Mode::kSync) return s.applied >= q.step;
    if (config_.mode == ServerConfig::Mode::kStale)
      return min_clock >= q.step - 1 - config_.staleness;
    return true;
  }

  void answer() {
    // Epoch-end pulls (the trainer's: one segment) are answered together, once every worker's
    // is in.
    std::map<std::int64_t, int> epoch_end_pulls;  // by segment
    for (const auto& q : pending_)
      epoch_end_pulls[q.key_begin] += q.epoch_end ? 1 : 0;
    for (auto it = pending_.begin(); it != pending_.end();) {
      const auto segments = cover(it->worker, "pulled", it->key_begin, it->key_end, true);
      const bool barrier_complete = epoch_end_pulls[it->key_begin] == config_.num_workers;
      const bool all_ready = std::all_of(segments.begin(), segments.end(),
                                         [&](const Segment* s) { return ready(*s, *it); });
      if ((it->epoch_end && !barrier_complete) || !all_ready) {
        if (!all_ready && hopeless(*it)) {
          waiting_.erase({it->worker, it->key_begin, it->step});
          it = pending_.erase(it);
          continue;
        }
        ++it;
        continue;
      }
      PullReply reply;
      reply.step = it->step;
      reply.key_begin = it->key_begin;
      reply.key_end = it->key_end;
      // A copy: the weights go on changing while the transport writes (async schedules).
      reply.data = kernels::Tensor::host({it->key_end - it->key_begin});
      for (Segment* s : segments) {
        backend_->copy(s->weights,
                       reply.data.slice(s->begin - it->key_begin, s->end - it->key_begin));
        // Only the trainer's pushes are scaled by it, and only its pulls are each of a step the
        // worker pushes next (a KVStore's would pile up).
        if (config_.mode != ServerConfig::Mode::kSync && !config_.kvstore)
          s->read_at[{it->worker, it->step}] = s->updates;
      }
      backend_->synchronize();
      send(Address{it->worker, it->reply_actor}, std::move(reply));
      waiting_.erase({it->worker, it->key_begin, it->step});
      it = pending_.erase(it);
    }
  }

  // A piece of the trainer's server's keys' optimizer state, for the chief's checkpoint: asked
  // while every worker is paused at an epoch's end, so that nothing changes it meanwhile.
  void sendState(const StateRequest& r) {
    if (config_.kvstore || segments_.size() != 1) {
      throw InvariantError(fmt::format(
          "server {}: asked for a piece of its optimizer state, which only a trainer's server of "
          "one segment gives",
          config_.index));
    }
    const kernels::Tensor& state = segments_.begin()->second.optimizer->state();
    if (r.offset < 0 || r.count <= 0 || r.count > state.numel() - r.offset) {
      throw InvariantError(fmt::format(
          "server {}: asked for {} elements of its optimizer state at {}, which holds {}",
          config_.index, r.count, r.offset, state.numel()));
    }
    auto piece = kernels::Tensor::host({r.count});
    backend_->copy(state.slice(r.offset, r.offset + r.count), piece);
    backend_->synchronize();
    send(config_.chief, StateChunk{r.step, r.shard, r.offset, piece});
  }

  // A copy: the weights go on changing while the transport writes (async schedules).
  kernels::Tensor snapshot(const kernels::Tensor& t) {
    auto copy = kernels::Tensor::host({t.numel()});
    backend_->copy(t, copy);
    backend_->synchronize();
    return copy;
  }

  ServerConfig config_;
  std::unique_ptr<kernels::Backend> backend_;
  std::map<std::int64_t, Segment> segments_;  // by first key
  KvConfigure kv_;                            // the KVStore's optimizer, as set
  kernels::OptimizerSettings kv_optimizer_;   // and as the segments' optimizers have it
  std::set<std::uint32_t> done_;              // workers done with the KVStore
  std::vector<Pull> pending_;
  struct Waited {
    Clock::time_point since;
    bool warned = false;
    bool told = false;  // its worker heard whom it waits for (PullHeld)
  };
  // Per pending pull: worker, segment, step.
  std::map<std::tuple<std::uint32_t, std::int64_t, std::int64_t>, Waited> waiting_;
};

class PsClient final : public Actor {
 public:
  PsClient(std::string name, PsClientConfig config)
      : Actor(std::move(name)), config_(std::move(config)), step_(config_.plan.first_step) {
    on<Reduced>([this](Reduced& r) { pushReduced(r); });
    // A worker with one replica has nothing to sum: its buckets come straight from the replica.
    on<GradBucket>([this](GradBucket& b) {
      pushReduced(Reduced{b.step, b.begin, b.end, b.grads, b.ready});
    });
    on<PullReply>([this](PullReply& r) { pulled(r); });
    on<PullHeld>([this](PullHeld& h) {
      if (!pulling_ || h.step != step_) return;  // a pull answered since
      held_ = h;
      if (h.final) throw heldError();
    });
    on<Resume>([this](Resume&) { broadcast(); });
    on<StallCheck>([this](StallCheck&) { checkStall(); });
    on<Subscribe>([this](Subscribe& s) { observers_.add(Address{s.node, s.actor}, s.every); });
  }

  void started() override {
    weights_ = kernels::Tensor::host({config_.initial_weights.numel()});
    std::copy_n(config_.initial_weights.f32(), weights_.numel(), weights_.f32());
    // Start once every server agrees on step 0's weights (they may have been resumed).
    pull(false);
    armStallCheck();
  }

 private:
  void armStallCheck() {
    system().after(stallCheckPeriod(config_.run.stall_warning, config_.run.peer_timeout), self(),
                   StallCheck{});
  }

  // The servers that have not answered the pull in flight.
  std::vector<Peer> silentServers() const {
    std::vector<Peer> silent;
    for (std::size_t s = 0; s < answered_.size(); ++s) {
      if (!answered_[s])
        silent.push_back(peerOf(config_.run.members, "server", static_cast<int>(s)));
    }
    return silent;
  }

  // A server holds this worker's pull for another worker (PullHeld): that one is the culprit.
  PeerError heldError() const {
    const Peer late = held_->late_worker >= 0
                          ? peerOf(config_.run.members, "worker", held_->late_worker)
                          : silentServers().front();
    return PeerError(late,
                     fmt::format("a server held worker {}'s pull of {} for it", config_.worker,
                                 describeStep(step_, config_.plan.steps_per_epoch)),
                     fmt::format("worker {}: {}", config_.worker, held_->reason));
  }

  // The worker's side of a stall: a server that does not answer a pull. A server that holds it
  // for a late worker reports that worker at peer_timeout; this one gives up a grace later.
  void checkStall() {
    if (pulling_) {
      const auto waited = std::chrono::steady_clock::now() - pull_since_;
      const auto limit = config_.run.peer_timeout +
                         peerTimeoutGrace(config_.run.stall_warning, config_.run.peer_timeout);
      const double seconds = std::chrono::duration<double>(waited).count();
      const std::string when = describeStep(step_, config_.plan.steps_per_epoch);
      const auto silent = silentServers();
      std::vector<std::string> names;
      for (const auto& p : silent)
        names.push_back(p.str());
      if (waited >= limit && !silent.empty() && held_ && held_->late_worker >= 0) {
        throw heldError();
      }
      if (waited >= limit && !silent.empty()) {
        const double peer_timeout = std::chrono::duration<double>(config_.run.peer_timeout).count();
        const double total = std::chrono::duration<double>(limit).count();
        throw PeerError(
            silent.front(),
            fmt::format("no pull answer for {} within {:g} s (peer_timeout {:g} s + grace)", when,
                        total, peer_timeout),
            fmt::format("worker {}: no answer from {} to its pull of {} for {:.1f} s "
                        "(peer_timeout {:g} s + grace): hung or gone",
                        config_.worker, fmt::join(names, ", "), when, seconds, peer_timeout));
      }
      if (waited >= config_.run.stall_warning && !warned_) {
        warned_ = true;
        spdlog::warn(
            "stall: worker {} has waited {:.1f} s for {} to answer its pull of {}; the run fails "
            "after {:g} s",
            config_.worker, seconds, fmt::join(names, ", "), when,
            std::chrono::duration<double>(limit).count());
      }
    }
    armStallCheck();
  }

  // The gradients go out from host memory (the replicas copy theirs there for this client), once
  // final: a host wait on their event.
  void pushReduced(const Reduced& r) {
    TROUPE_ENFORCE_EQ(r.step, step_);
    r.ready.wait();
    for (std::size_t s = 0; s < config_.servers.size(); ++s) {
      const auto [lo, hi] = config_.shards[s];
      const std::int64_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
      if (b >= e) continue;
      // No copy: the replica writes these gradients again only after the servers answered the
      // pull below, which they do after reading this push (same link, in order).
      kernels::Tensor data = r.grads.slice(b - r.begin, e - r.begin);
      if (config_.compression.type != kernels::GradientCompression::kNone) {
        float* residual = nullptr;
        if (config_.compression.type == kernels::GradientCompression::k2Bit) {
          if (residual_.empty()) residual_.assign(static_cast<std::size_t>(weights_.numel()), 0);
          residual = residual_.data() + b;
        }
        data = kernels::encode(config_.compression, data.f32(), residual, e - b);
      }
      send(config_.servers[s], Push{r.step, config_.worker, b, e, std::move(data)});
    }
    pushed_ += r.end - r.begin;
    if (pushed_ < weights_.numel()) return;
    pushed_ = 0;
    ++step_;
    const bool epoch_end =
        step_ % config_.plan.steps_per_epoch == 0 || step_ == config_.plan.last_step;
    pull(epoch_end);
  }

  void pull(bool epoch_end) {
    pulling_epoch_end_ = epoch_end;
    replies_ = 0;
    pulling_ = true;
    warned_ = false;
    held_.reset();
    answered_.assign(config_.servers.size(), false);
    pull_since_ = std::chrono::steady_clock::now();
    pull_started_ = Trace::Clock::now();
    for (std::size_t s = 0; s < config_.servers.size(); ++s) {
      const auto [lo, hi] = config_.shards[s];
      send(config_.servers[s], Pull{step_, config_.worker, epoch_end, lo, hi, self().actor});
    }
  }

  void pulled(const PullReply& r) {
    TROUPE_ENFORCE_EQ(r.step, step_);
    std::copy_n(r.data.f32(), r.data.numel(), weights_.f32() + r.key_begin);
    for (std::size_t s = 0; s < config_.shards.size(); ++s) {
      if (!answered_[s] && config_.shards[s] == std::make_pair(r.key_begin, r.key_end)) {
        answered_[s] = true;
        break;
      }
    }
    if (++replies_ < static_cast<int>(config_.servers.size())) return;
    pulling_ = false;
    observers_.offer(step_, step_ == config_.plan.last_step, weights_,
                     [this](Address to, std::int64_t step, const kernels::Tensor& weights) {
                       send(to, Weights{step, weights, kernels::Tensor(), {}});
                     });
    if (config_.run.trace) {
      config_.run.trace->asyncSpan(name(), "pull", static_cast<std::uint64_t>(step_), pull_started_,
                                   Trace::Clock::now());
    }
    if (pulling_epoch_end_) {
      // The chief's carries the weights (every worker holds the same); the others', nothing. The
      // servers' state goes to the chief's coordinator piece by piece (StateRequest).
      if (config_.worker == 0) {
        send(config_.coordinator, EpochEnd{step_, weights_, {}});
      } else {
        send(config_.coordinator, EpochEnd{step_, {}, {}});
      }
    } else {
      broadcast();
    }
  }

  void broadcast() {
    if (step_ >= config_.plan.last_step) return;
    for (const auto& replica : config_.replicas) {
      send(replica, Weights{step_, weights_, kernels::Tensor(), {}});
    }
  }

  PsClientConfig config_;
  Observers observers_;  // the chief's: processes that watch the run
  kernels::Tensor weights_;
  std::int64_t step_;
  std::int64_t pushed_ = 0;
  std::vector<float> residual_;  // 2bit compression: per key of the model
  int replies_ = 0;
  bool pulling_epoch_end_ = false;
  bool pulling_ = false;                              // a pull is in flight
  bool warned_ = false;                               // its stall report was logged
  std::optional<PullHeld> held_;                      // a server's notice: whom it waits for
  std::vector<bool> answered_;                        // per server, for the pull in flight
  Trace::Clock::time_point pull_started_;             // for the trace
  std::chrono::steady_clock::time_point pull_since_;  // for the stall watch
};

}  // namespace

std::vector<std::pair<std::int64_t, std::int64_t>> serverShards(
    std::int64_t num_params, int servers, const kernels::OptimizerSettings& optimizer) {
  return shardKeys(
      num_params, servers,
      optimizer.info().layerwise ? optimizer.layers : std::vector<kernels::ParamRange>{});
}

std::vector<std::pair<std::int64_t, std::int64_t>> shardKeys(
    std::int64_t num_params, int servers, const std::vector<kernels::ParamRange>& layers) {
  std::vector<std::pair<std::int64_t, std::int64_t>> shards;
  std::int64_t begin = 0;
  for (int s = 0; s < servers; ++s) {
    std::int64_t end = num_params * (s + 1) / servers;
    if (!layers.empty() && s + 1 < servers) {
      // The layer boundary nearest the even cut that leaves this shard and each one after it a
      // key at least; the even cut itself where no boundary does (a layer then spans servers).
      const std::int64_t last = num_params - (servers - s - 1);
      std::int64_t best = std::clamp(end, std::min(begin + 1, last), last), distance = -1;
      for (const auto& [lo, hi] : layers) {
        for (const std::int64_t at : {lo, hi}) {
          if (at <= begin || at > last) continue;
          const std::int64_t d = at > end ? at - end : end - at;
          if (distance < 0 || d < distance) {
            best = at;
            distance = d;
          }
        }
      }
      end = best;
    }
    shards.emplace_back(begin, end);
    begin = end;
  }
  return shards;
}

const char* modeName(ServerConfig::Mode mode) {
  static constexpr kernels::Named<ServerConfig::Mode> kNames[] = {
      {"dist_sync", ServerConfig::Mode::kSync},
      {"dist_async", ServerConfig::Mode::kAsync},
      {"ssp", ServerConfig::Mode::kStale}};
  return kernels::nameIn(kNames, mode);
}

std::unique_ptr<Actor> makeServer(std::string name, ServerConfig config) {
  return std::make_unique<Server>(std::move(name), std::move(config));
}

std::unique_ptr<Actor> makePsClient(std::string name, PsClientConfig config) {
  return std::make_unique<PsClient>(std::move(name), std::move(config));
}

}  // namespace troupe::actors
