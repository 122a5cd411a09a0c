// The KVStore of type "ring" (troupe/kvstore.h): no servers. Each worker keeps every key's value;
// a push is summed over all workers by the ring allreduce that `troupe train --schedule
// bsp-allreduce` uses (actors/roles/ring_allreduce.h: every worker ends with bitwise the same sum),
// and each worker applies it to its own copy with the same optimizer, so the copies stay equal. A
// worker's actor (RingMember) holds its place in the ring; the caller's thread hands it the sums
// and waits for them when it pulls.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "actors/core/messages.h"
#include "actors/core/status_of.h"
#include "actors/kvstore/kvstore_dist.h"
#include "actors/kvstore/kvstore_options.h"
#include "actors/roles/ring_allreduce.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"
#include "rendezvous/exchange.h"
#include "rendezvous/store.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using std::chrono::milliseconds;

// Elements a ring segment holds (as the trainer's reducer's default, 4 MiB of floats).
constexpr std::int64_t kSegment = std::int64_t{1} << 20;

// Caller -> its RingMember (in-process): sum `values` over the workers, in place.
struct RingStart {
  std::int64_t step = 0;
  std::int64_t base = 0;
  kernels::Tensor values;
};
// Caller -> its RingMember (in-process): rings from now on encode their chunks so.
struct RingCompression {
  kernels::CompressionSpec spec;
};

// The sums done, by (step, base); shared by the caller and its RingMember.
struct RingDone {
  std::mutex mu;
  std::condition_variable changed;
  std::set<std::pair<std::int64_t, std::int64_t>> done;
};

class RingMember final : public Actor {
 public:
  RingMember(int rank, int world, Address next, std::shared_ptr<RingDone> done)
      : Actor(fmt::format("kvstore/ring/{}", rank)),
        rank_(rank),
        world_(world),
        next_(next),
        done_(std::move(done)) {
    on<RingStart>([this](RingStart& s) {
      if (world_ == 1) return finished(s.step, s.base);
      ring_->start(s.step, s.base, s.values);
    });
    on<RingChunk>([this](RingChunk& c) { ring_->receive(std::move(c)); });
    on<RingCompression>([this](RingCompression& c) { build(c.spec); });
  }

  void started() override { build({}); }

 private:
  void build(kernels::CompressionSpec spec) {
    if (world_ == 1) return;
    TROUPE_ENFORCE(!ring_ || ring_->pending() == 0, "a ring rebuilt with sums in flight");
    auto forward = [this](RingChunk chunk) {
      // A copy: the ring writes into the bucket again while the transport may still read it.
      if (chunk.data.dtype() == kernels::DType::kFloat32) {
        auto copy = kernels::Tensor::hostUninitialized({chunk.data.numel()});
        std::copy_n(chunk.data.f32(), chunk.data.numel(), copy.f32());
        chunk.data = std::move(copy);
      }
      send(next_, std::move(chunk));
    };
    ring_.emplace(
        rank_, world_, kSegment, forward,
        [this](std::int64_t step, std::int64_t base, std::int64_t) { finished(step, base); }, spec);
  }

  void finished(std::int64_t step, std::int64_t base) {
    std::lock_guard lock(done_->mu);
    done_->done.insert({step, base});
    done_->changed.notify_all();
  }

  int rank_, world_;
  Address next_;
  std::shared_ptr<RingDone> done_;
  std::optional<RingAllreduce> ring_;
};

class RingKVStore final : public KVStore {
 public:
  explicit RingKVStore(const TrainOptions& o)
      : options_(o),
        rank_(o.shard_id),
        world_(o.num_shards),
        wait_limit_(
            fromSeconds(o.peer_timeout_s) +
            peerTimeoutGrace(fromSeconds(o.stall_warning_s), fromSeconds(o.peer_timeout_s))),
        backend_(kernels::makeCpuBackend(1)) {
    if (o.num_servers > 0) {
      throw InputError(
          fmt::format("kvstore 'ring' has no servers, and this run has {} (-s 0, or num_servers 0)",
                      o.num_servers));
    }
    if (o.role != ProcessRole::kWorker) {
      throw InputError("kvstore 'ring' has no servers: every process is a worker (role worker)");
    }
    // Each worker's RingMember is its actor 0; the ring goes from rank to rank + 1.
    const Address next{static_cast<std::uint32_t>((rank_ + 1) % world_), 0};
    auto member = std::make_unique<RingMember>(rank_, world_, next, done_);
    member_ = Address{static_cast<std::uint32_t>(rank_), 0};
    if (world_ > 1) {
      node_ = joinStore("ring", o, rank_, std::move(member), SpawnOptions{.thread = "kvstore"},
                        std::make_shared<RunMembers>(world_, 0));
    } else {
      node_.node = makeNodeSystem(0, 1, false);
      node_.node.system->spawn(std::move(member), SpawnOptions{.thread = "kvstore"});
      node_.members = std::make_shared<RunMembers>(1, 0);
    }
    thread_ = std::thread([this] {
      try {
        node_.system().run();
      } catch (const std::exception& e) {
        std::lock_guard lock(done_->mu);
        failure_ = statusOf(e);
        done_->changed.notify_all();
      }
    });
  }

  ~RingKVStore() override {
    try {
      if (node_.cluster && failure().isOk()) node_.cluster->finish();
    } catch (const std::exception& e) {
      spdlog::error("kvstore: worker {} leaving the ring: {}", rank_, e.what());
    }
    node_.system().shutdown();
    thread_.join();
    node_.cluster.reset();
  }

  using KVStore::pull;
  using KVStore::push;
  std::string type() const override { return "ring"; }
  int rank() const override { return rank_; }
  int numWorkers() const override { return world_; }

  Status init(int key, std::span<const float> value) override {
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    if (Status s = checkInit(key, value.size(), keys_.count(key) > 0); !s) return s;
    const auto n = static_cast<std::int64_t>(value.size());
    // Every worker inits the same keys in the same order; worker 0 says where the key went.
    const std::string placed = fmt::format("ok {} at {}", n, next_base_);
    if (node_.cluster) {
      const std::string outcome = fmt::format("kvstore-init-{}", key);
      try {
        if (rank_ == 0) {
          node_.cluster->store().set(outcome, placed);
        } else if (const auto got = node_.cluster->store().get(outcome, waitLimit());
                   got != placed) {
          return inputError(initMismatch(key, got, n, placed));
        }
      } catch (const std::exception& e) {
        return statusOf(e);
      }
    }
    // Worker 0's value: the sum of it and everyone else's zeros.
    Key k;
    k.base = next_base_;
    k.value = kernels::Tensor::host({n});
    if (rank_ == 0) std::copy(value.begin(), value.end(), k.value.f32());
    if (Status s = reduce(-1, k.base, k.value, fmt::format("init of key {}", key)); !s) return s;
    next_base_ += n;
    keys_.emplace(key, std::move(k));
    return {};
  }

  Status push(int key, const std::vector<std::span<const float>>& values, int) override {
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    const auto it = keys_.find(key);
    if (it == keys_.end()) return neverInitialised("push", key);
    auto& k = it->second;
    const std::int64_t n = k.value.numel();
    if (values.empty()) return inputError(fmt::format("push of key {}: no array", key));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (static_cast<std::int64_t>(values[i].size()) != n) {
        return inputError(fmt::format("push of key {}: array {} has {} values, the key's has {}",
                                      key, i, values[i].size(), n));
      }
    }
    // The first array copied, the others added: no zero fill to add them to.
    auto sum = kernels::Tensor::hostUninitialized({n});
    float* s = sum.f32();
    std::copy(values[0].begin(), values[0].end(), s);
    for (std::size_t i = 1; i < values.size(); ++i) {
      for (std::int64_t j = 0; j < n; ++j)
        s[j] += values[i][static_cast<std::size_t>(j)];
    }
    const std::int64_t step = k.pushes++;
    k.pending.push_back({step, sum});
    pushed_ = true;
    return tell(RingStart{step, k.base, sum});
  }

  Status pull(int key, std::span<float> out, int) override {
    std::lock_guard lock(mu_);
    const auto it = keys_.find(key);
    if (it == keys_.end()) return neverInitialised("pull", key);
    auto& k = it->second;
    if (static_cast<std::int64_t>(out.size()) != k.value.numel()) {
      return inputError(fmt::format("pull of key {}: room for {} values, the key's has {}", key,
                                    out.size(), k.value.numel()));
    }
    if (Status s = settle(key, k); !s) return s;
    std::copy_n(k.value.f32(), k.value.numel(), out.data());
    return {};
  }

  // This worker's copy of the states, once its pushes are applied.
  Status saveOptimizerStates(const std::string& path) override {
    std::lock_guard lock(mu_);
    if (Status s = settleAll(); !s) return s;
    return saveKeyStates(path, updater_, keyStates());
  }
  Status loadOptimizerStates(const std::string& path) override {
    std::lock_guard lock(mu_);
    if (Status s = settleAll(); !s) return s;
    return loadKeyStates(path, *backend_, updater_, keyStates());
  }

  Status setOptimizer(const OptimizerSpec& o) override {
    std::lock_guard lock(mu_);
    if (Status s = updater_.set(o); !s) return s;
    for (auto& [key, k] : keys_)
      k.updates = {};
    return {};
  }

  Status setGradientCompression(const std::string& type, float threshold) override {
    auto spec = compressionSpecOf(type, threshold);
    if (!spec) return spec.status();
    std::lock_guard lock(mu_);
    if (pushed_) {
      return inputError(
          "setGradientCompression: a ring store takes it before its first push (every worker's "
          "ring must encode alike)");
    }
    return tell(RingCompression{spec.value()});
  }

  Status barrier() override {
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    if (!node_.cluster) return {};
    try {
      rendezvous::barrier(node_.cluster->store(), fmt::format("kvstore-barrier-{}", barriers_++),
                          rank_, world_, waitLimit());
    } catch (const std::exception& e) {
      return statusOf(e);
    }
    return {};
  }

 private:
  struct Key {
    std::int64_t base = 0;  // its first element in the ring's space
    kernels::Tensor value;
    std::int64_t pushes = 0;
    std::deque<std::pair<std::int64_t, kernels::Tensor>> pending;  // pushes not yet applied
    KeyUpdates updates;
  };

  static Status inputError(std::string message) { return {ErrorKind::kInput, std::move(message)}; }
  static Status neverInitialised(const char* what, int key) {
    return inputError(
        fmt::format("{} of key {}: the key was never initialised (init it first)", what, key));
  }

  milliseconds waitLimit() const {
    return std::max(wait_limit_, fromSeconds(options_.rendezvous_timeout_s));
  }

  Status failure() const {
    std::lock_guard lock(done_->mu);
    return failure_;
  }

  template <typename M>
  Status tell(M message) {
    try {
      node_.system().tell(member_, std::move(message));
    } catch (const std::exception& e) {
      return statusOf(e);
    }
    return {};
  }

  // Waits until the sum (step, base) is done; the run's failure or the wait limit end it.
  Status awaitSum(std::int64_t step, std::int64_t base, const std::string& what) {
    std::unique_lock lock(done_->mu);
    const bool ended = done_->changed.wait_for(lock, wait_limit_, [&] {
      return done_->done.count({step, base}) || !failure_.isOk();
    });
    if (!failure_.isOk()) return failure_;
    if (!ended) {
      const int previous = (rank_ + world_ - 1) % world_;
      return {ErrorKind::kPeer,
              fmt::format("worker {}: {} waited {:g} s (peer_timeout + grace) for the ring's "
                          "chunks from {}: hung or gone",
                          rank_, what, std::chrono::duration<double>(wait_limit_).count(),
                          node_.members->worker(previous).str())};
    }
    done_->done.erase({step, base});
    return {};
  }

  // Sums `values` over the workers in place (step -1: an init's broadcast).
  Status reduce(std::int64_t step, std::int64_t base, const kernels::Tensor& values,
                const std::string& what) {
    if (Status s = tell(RingStart{step, base, values}); !s) return s;
    return awaitSum(step, base, what);
  }

  Status settleAll() {
    for (auto& [key, k] : keys_) {
      if (Status s = settle(key, k); !s) return s;
    }
    return {};
  }

  std::vector<KeyState> keyStates() {
    std::vector<KeyState> keys;
    for (auto& [key, k] : keys_)
      keys.push_back({key, k.value.numel(), &k.updates});
    return keys;
  }

  // Applies the key's pushes that this worker made, in order, once each is summed.
  Status settle(int key, Key& k) {
    while (!k.pending.empty()) {
      auto& [step, sum] = k.pending.front();
      if (Status s = awaitSum(step, k.base, fmt::format("push {} of key {}", step, key)); !s)
        return s;
      if (Status s = updater_.apply(*backend_, k.updates, k.value, sum,
                                    fmt::format("push {} of key {}", step, key));
          !s)
        return s;
      k.pending.pop_front();
    }
    return {};
  }

  TrainOptions options_;
  int rank_, world_;
  milliseconds wait_limit_;
  std::unique_ptr<kernels::Backend> backend_;
  std::shared_ptr<RingDone> done_ = std::make_shared<RingDone>();
  Status failure_;  // guarded by done_->mu
  Node node_;
  Address member_;
  std::thread thread_;

  std::mutex mu_;  // one call at a time
  std::map<int, Key> keys_;
  std::int64_t next_base_ = 0;
  StoreUpdater updater_;
  bool pushed_ = false;
  int barriers_ = 0;
};

}  // namespace

std::unique_ptr<KVStore> makeRingKVStore(const TrainOptions& options) {
  return std::make_unique<RingKVStore>(options);
}

}  // namespace troupe::actors
