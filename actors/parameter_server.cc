#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "actors/roles.h"
#include "actors/trace.h"
#include "kernels/backend.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

class Server final : public Actor {
 public:
  Server(std::string name, ServerConfig config)
      : Actor(std::move(name)),
        config_(std::move(config)),
        size_(config_.key_end - config_.key_begin),
        clocks_(static_cast<std::size_t>(config_.num_workers), config_.first_step - 1),
        applied_(config_.first_step) {
    on<Push>([this](Push& p) { push(p); });
    on<Pull>([this](Pull& p) {
      pending_.push_back(p);
      waiting_[{p.worker, p.step}] = {Clock::now(), false};
      answer();
    });
    on<StallCheck>([this](StallCheck&) { checkStalls(); });
    on<Shutdown>([this](Shutdown&) { system().shutdown(); });
  }

  void started() override {
    backend_ = kernels::makeCpuBackend(config_.threads);
    weights_ = backend_->empty({size_});
    momentum_ = backend_->empty({size_});
    backend_->copy(config_.initial_weights, weights_);
    if (config_.initial_momentum.defined() && config_.initial_momentum.numel() > 0) {
      backend_->copy(config_.initial_momentum, momentum_);
    }
    armStallCheck();
  }

 private:
  using Clock = std::chrono::steady_clock;

  void armStallCheck() {
    system().after(stallCheckPeriod(config_.stall_warning, config_.peer_timeout), self(),
                   StallCheck{});
  }

  // A worker that a pull waits for, and what the pull needs of it.
  struct Late {
    Peer worker;
    std::string state;    // "pushed through step 9"
    std::string missing;  // "its push of step 11 (it pushed through step 9)"
  };

  // The workers a pull of step q waits for.
  std::vector<Late> lateWorkers(const Pull& q) const {
    std::int64_t need = q.step - 1;  // dist_sync and epoch ends: every push of step q-1
    if (config_.mode == "ssp" && !q.epoch_end) need = q.step - 1 - config_.staleness;
    std::vector<Late> late;
    for (std::size_t w = 0; w < clocks_.size(); ++w) {
      const Peer worker = peerOf(config_.members, "worker", static_cast<int>(w));
      if (clocks_[w] < need) {
        const auto state = fmt::format("pushed through step {}", clocks_[w]);
        late.push_back({worker, state, fmt::format("its push of step {} (it {})", need, state)});
      } else if (q.epoch_end && std::none_of(pending_.begin(), pending_.end(), [&](const Pull& p) {
                   return p.epoch_end && p.worker == w;
                 })) {
        late.push_back({worker, "not at the epoch's end", "its pull at the epoch's end"});
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
    const double limit = std::chrono::duration<double>(config_.peer_timeout).count();
    for (const auto& q : pending_) {
      auto& w = waiting_[{q.worker, q.step}];
      const double waited = std::chrono::duration<double>(now - w.since).count();
      const std::string when = describeStep(q.step, config_.steps_per_epoch);
      if (now - w.since >= config_.peer_timeout) {
        const auto late = lateWorkers(q);
        const std::string what =
            fmt::format("server {}: worker {}'s pull of {} waited {:.1f} s (peer_timeout) for {}",
                        config_.index, q.worker, when, waited, describe(late));
        if (late.empty()) throw TimeoutError(what);
        throw PeerError(late.front().worker,
                        fmt::format("server {} waited {:g} s (peer_timeout) for {}", config_.index,
                                    limit, late.front().missing),
                        what);
      }
      if (now - w.since >= config_.stall_warning && !w.warned) {
        w.warned = true;
        spdlog::warn(
            "stall: server {} has held worker {}'s pull of {} for {:.1f} s, waiting for {}; the "
            "run fails after {:g} s",
            config_.index, q.worker, when, waited, describe(lateWorkers(q)), limit);
      }
    }
    armStallCheck();
  }

  // Fails the run when an update left inf or NaN in the shard: it diverged.
  void checkFinite(bool finite, std::int64_t step, std::int64_t lo, std::int64_t hi,
                   float lr) const {
    if (finite) return;
    throw NumericError(fmt::format(
        "training diverged: server {}'s update of {} left inf or NaN in weights [{},{}) "
        "(learning rate {:g}; a gradient was not finite, or too large)",
        config_.index, describeStep(step, config_.steps_per_epoch), config_.key_begin + lo,
        config_.key_begin + hi, lr));
  }

  struct StepPushes {
    std::vector<kernels::Tensor> sums;  // per worker, this shard's gradient
    std::vector<std::int64_t> received;
  };

  void push(const Push& p) {
    TraceScope span(config_.trace, name(), config_.mode == "dist_sync" ? "push" : "apply push");
    TROUPE_ENFORCE(p.worker < clocks_.size(), "push from worker ", p.worker, " of ",
                   clocks_.size());
    TROUPE_ENFORCE(config_.key_begin <= p.key_begin && p.key_end <= config_.key_end,
                   "push of keys [", p.key_begin, ",", p.key_end, ") to the server of [",
                   config_.key_begin, ",", config_.key_end, ")");
    const std::int64_t lo = p.key_begin - config_.key_begin, hi = p.key_end - config_.key_begin;
    auto& step = steps_[p.step];
    if (step.sums.empty()) {
      step.sums.resize(clocks_.size());
      step.received.assign(clocks_.size(), 0);
    }
    const kernels::Tensor grads = gradientOf(p, hi - lo);
    if (config_.mode == "dist_sync") {
      auto& sum = step.sums[p.worker];
      if (!sum.defined() || sum.numel() == 0) sum = backend_->empty({size_});
      backend_->copy(grads, sum.slice(lo, hi));
    } else {
      const auto& sgd = config_.sgd;
      // Staleness-aware (Zhang et al. 2016): a push lands on weights about W-1 pushes newer
      // than the ones it was computed from, so its step is scaled by 1/W.
      const float lr =
          kernels::learningRate(config_.lr, p.step) / static_cast<float>(config_.num_workers);
      checkFinite(backend_->sgdUpdate(weights_.slice(lo, hi), grads, momentum_.slice(lo, hi), lr,
                                      sgd.momentum, sgd.weight_decay, sgd.nesterov),
                  p.step, lo, hi, lr);
    }
    step.received[p.worker] += hi - lo;
    TROUPE_ENFORCE_LE(step.received[p.worker], size_);
    if (step.received[p.worker] == size_) clocks_[p.worker] = p.step;
    if (config_.mode == "dist_sync" && std::all_of(step.received.begin(), step.received.end(),
                                                   [&](std::int64_t n) { return n == size_; })) {
      // Every worker's gradient of step t is in: sum in worker order, then one update.
      auto& total = step.sums[0];
      for (std::size_t w = 1; w < step.sums.size(); ++w)
        backend_->axpy(1.0f, step.sums[w], total);
      const auto& sgd = config_.sgd;
      const float lr = kernels::learningRate(config_.lr, p.step);
      checkFinite(backend_->sgdUpdate(weights_, total, momentum_, lr, sgd.momentum,
                                      sgd.weight_decay, sgd.nesterov),
                  p.step, 0, size_, lr);
      applied_ = p.step + 1;
    }
    if (std::all_of(step.received.begin(), step.received.end(),
                    [&](std::int64_t n) { return n == size_; })) {
      steps_.erase(p.step);
    }
    backend_->synchronize();
    answer();
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
      return p.data;
    }
    auto out = kernels::Tensor::hostUninitialized({n});
    kernels::decode(config_.compression, p.data, out.f32(), n, /*accumulate=*/false);
    return out;
  }

  // Pulls for step t need: dist_sync, the update of step t-1; dist_async, nothing (the worker's
  // own pushes came first on its link); ssp, every worker's pushes up to t-1-staleness.
  bool ready(const Pull& q) const {
    const std::int64_t min_clock = *std::min_element(clocks_.begin(), clocks_.end());
    if (q.epoch_end) {
      // Everyone has pushed everything before the epoch's end.
      return min_clock >= q.step - 1 && (config_.mode != "dist_sync" || applied_ >= q.step);
    }
    if (config_.mode == "dist_sync") return applied_ >= q.step;
    if (config_.mode == "ssp") return min_clock >= q.step - 1 - config_.staleness;
    return true;
  }

  void answer() {
    // Epoch-end pulls are answered together, once every worker's is in.
    std::int64_t epoch_end_pulls = 0;
    for (const auto& q : pending_)
      epoch_end_pulls += q.epoch_end ? 1 : 0;
    const bool barrier_complete = epoch_end_pulls == static_cast<std::int64_t>(clocks_.size());
    for (auto it = pending_.begin(); it != pending_.end();) {
      if ((it->epoch_end && !barrier_complete) || !ready(*it)) {
        ++it;
        continue;
      }
      PullReply reply;
      reply.step = it->step;
      reply.key_begin = config_.key_begin;
      reply.key_end = config_.key_end;
      reply.data = snapshot(weights_);
      if (it->epoch_end) reply.state = snapshot(momentum_);
      send(Address{it->worker, 1}, std::move(reply));
      waiting_.erase({it->worker, it->step});
      it = pending_.erase(it);
    }
  }

  // A copy: the weights go on changing while the transport writes (async schedules).
  kernels::Tensor snapshot(const kernels::Tensor& t) {
    auto copy = kernels::Tensor::host({t.numel()});
    backend_->copy(t, copy);
    backend_->synchronize();
    return copy;
  }

  ServerConfig config_;
  std::int64_t size_;
  std::unique_ptr<kernels::Backend> backend_;
  kernels::Tensor weights_, momentum_;
  std::map<std::int64_t, StepPushes> steps_;
  std::vector<std::int64_t> clocks_;  // per worker: the last step fully pushed here
  std::int64_t applied_;              // dist_sync: steps applied
  std::vector<Pull> pending_;
  struct Waited {
    Clock::time_point since;
    bool warned = false;
  };
  std::map<std::pair<std::uint32_t, std::int64_t>, Waited> waiting_;  // per pending pull
};

class PsClient final : public Actor {
 public:
  PsClient(std::string name, PsClientConfig config)
      : Actor(std::move(name)), config_(std::move(config)), step_(config_.plan.first_step) {
    on<Reduced>([this](Reduced& r) { pushReduced(r); });
    on<PullReply>([this](PullReply& r) { pulled(r); });
    on<Resume>([this](Resume&) { broadcast(); });
    on<StallCheck>([this](StallCheck&) { checkStall(); });
  }

  void started() override {
    weights_ = kernels::Tensor::host({config_.initial_weights.numel()});
    std::copy_n(config_.initial_weights.f32(), weights_.numel(), weights_.f32());
    momentum_ = kernels::Tensor::host({weights_.numel()});
    // Start once every server agrees on step 0's weights (they may have been resumed).
    pull(false);
    armStallCheck();
  }

 private:
  void armStallCheck() {
    system().after(stallCheckPeriod(config_.stall_warning, config_.peer_timeout), self(),
                   StallCheck{});
  }

  // The servers that have not answered the pull in flight.
  std::vector<Peer> silentServers() const {
    std::vector<Peer> silent;
    for (std::size_t s = 0; s < answered_.size(); ++s) {
      if (!answered_[s]) silent.push_back(peerOf(config_.members, "server", static_cast<int>(s)));
    }
    return silent;
  }

  // The worker's side of a stall: a server that does not answer a pull. A server that holds it
  // for a late worker reports that worker at peer_timeout; this one gives up a grace later.
  void checkStall() {
    if (pulling_) {
      const auto waited = std::chrono::steady_clock::now() - pull_since_;
      const auto limit =
          config_.peer_timeout + peerTimeoutGrace(config_.stall_warning, config_.peer_timeout);
      const double seconds = std::chrono::duration<double>(waited).count();
      const std::string when = describeStep(step_, config_.plan.steps_per_epoch);
      const auto silent = silentServers();
      std::vector<std::string> names;
      for (const auto& p : silent)
        names.push_back(p.str());
      if (waited >= limit && !silent.empty()) {
        const double peer_timeout = std::chrono::duration<double>(config_.peer_timeout).count();
        const double total = std::chrono::duration<double>(limit).count();
        throw PeerError(
            silent.front(),
            fmt::format("no pull answer for {} within {:g} s (peer_timeout {:g} s + grace)", when,
                        total, peer_timeout),
            fmt::format("worker {}: no answer from {} to its pull of {} for {:.1f} s "
                        "(peer_timeout {:g} s + grace): hung or gone",
                        config_.worker, fmt::join(names, ", "), when, seconds, peer_timeout));
      }
      if (waited >= config_.stall_warning && !warned_) {
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

  void pushReduced(const Reduced& r) {
    TROUPE_ENFORCE_EQ(r.step, step_);
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
    answered_.assign(config_.servers.size(), false);
    pull_since_ = std::chrono::steady_clock::now();
    pull_started_ = Trace::Clock::now();
    for (const auto& server : config_.servers) {
      send(server, Pull{step_, config_.worker, epoch_end});
    }
  }

  void pulled(const PullReply& r) {
    TROUPE_ENFORCE_EQ(r.step, step_);
    std::copy_n(r.data.f32(), r.data.numel(), weights_.f32() + r.key_begin);
    if (r.state.defined() && r.state.numel() > 0) {
      std::copy_n(r.state.f32(), r.state.numel(), momentum_.f32() + r.key_begin);
    }
    for (std::size_t s = 0; s < config_.shards.size(); ++s) {
      if (!answered_[s] && config_.shards[s] == std::make_pair(r.key_begin, r.key_end)) {
        answered_[s] = true;
        break;
      }
    }
    if (++replies_ < static_cast<int>(config_.servers.size())) return;
    pulling_ = false;
    if (config_.trace) {
      config_.trace->asyncSpan(name(), "pull", static_cast<std::uint64_t>(step_), pull_started_,
                               Trace::Clock::now());
    }
    if (pulling_epoch_end_) {
      send(config_.coordinator, EpochEnd{step_, weights_, momentum_});
    } else {
      broadcast();
    }
  }

  void broadcast() {
    if (step_ >= config_.plan.last_step) return;
    for (const auto& replica : config_.replicas) {
      send(replica, Weights{step_, weights_, kernels::Tensor()});
    }
  }

  PsClientConfig config_;
  kernels::Tensor weights_, momentum_;
  std::int64_t step_;
  std::int64_t pushed_ = 0;
  std::vector<float> residual_;  // 2bit compression: per key of the model
  int replies_ = 0;
  bool pulling_epoch_end_ = false;
  bool pulling_ = false;                              // a pull is in flight
  bool warned_ = false;                               // its stall report was logged
  std::vector<bool> answered_;                        // per server, for the pull in flight
  Trace::Clock::time_point pull_started_;             // for the trace
  std::chrono::steady_clock::time_point pull_since_;  // for the stall watch
};

}  // namespace

std::vector<std::pair<std::int64_t, std::int64_t>> shardKeys(std::int64_t num_params, int servers) {
  std::vector<std::pair<std::int64_t, std::int64_t>> shards;
  for (int s = 0; s < servers; ++s) {
    shards.emplace_back(num_params * s / servers, num_params * (s + 1) / servers);
  }
  return shards;
}

std::unique_ptr<Actor> makeServer(std::string name, ServerConfig config) {
  return std::make_unique<Server>(std::move(name), std::move(config));
}

std::unique_ptr<Actor> makePsClient(std::string name, PsClientConfig config) {
  return std::make_unique<PsClient>(std::move(name), std::move(config));
}

}  // namespace troupe::actors
