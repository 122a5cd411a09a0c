// The KVStore of type "ring" (troupe/kvstore.h): no servers. Each worker keeps every key's value;
// a push is summed over all workers by the ring allreduce that `troupe train --schedule
// bsp-allreduce` uses (actors/roles/ring_allreduce.h: every worker ends with bitwise the same sum),
// and each worker applies it to its own copy with the same optimizer, so the copies stay equal. A
// worker's actor (RingMember) holds its place in the ring; the caller's thread hands it the sums
// and waits for them when it pulls. More rings run the store's collectives: allgather and
// reduceScatter move each part once around (the second half of an allreduce, or its first), and
// broadcast passes the root's values along the ring from it, each in segments as the sums' so
// that the links stay busy.
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
#include <span>
#include <thread>
#include <tuple>

#include "actors/core/lease.h"
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

// A RingMember's rings (RingChunk::ring): the keys' sums, then the collectives: allgathers,
// reduce-scatters, allreduces, broadcasts (each numbered apart).
constexpr std::uint8_t kSumRing = 0, kGatherRing = 1, kScatterRing = 2, kAllreduceRing = 3,
                       kBroadcastRing = 4;
constexpr int kCollectives = 4;

// The broadcast ring is an all-gather whose worker w owns the shard [w K, (w + 1) K) of a space
// of world K elements (RingAllreduce's shards): a broadcast from root r is its work at base r K,
// of which r's shard holds every value and each other worker's shard none, so that only the
// root's chunks carry values, each passed on by every worker but the one before the root. K
// bounds a broadcast's size (4 TiB of floats).
constexpr std::int64_t kBroadcastShard = std::int64_t{1} << 40;

// Where each worker's part of a collective of `n` values a worker lies in the ring's buffer of
// world * n: segments of `segment` (a multiple of world) each give every worker one chunk,
// worker w's being chunk (w + 1) % world, the one the ring finishes there (RingAllreduce). Calls
// fn(worker, at, from, count): the buffer's [at, at + count) is the worker's [from, from + count).
template <typename Fn>
void forEachPart(int world, std::int64_t n, std::int64_t segment, const Fn& fn) {
  const std::int64_t total = world * n;
  for (std::int64_t begin = 0, from = 0; begin < total; begin += segment) {
    const std::int64_t part = std::min(segment, total - begin) / world;
    for (int w = 0; w < world; ++w)
      fn(w, begin + ((w + 1) % world) * part, from, part);
    from += part;
  }
}

// Caller -> its RingMember (in-process): sum `values` over the workers, in place.
struct RingStart {
  std::int64_t step = 0;
  std::int64_t base = 0;
  kernels::Tensor values;
};
// Caller -> its RingMember (in-process): the collective of ring `ring` numbered `step` (the
// store's allgathers, reduce-scatters, allreduces and broadcasts, each counted apart), on
// `values` in place, at `base` of the ring's space (a broadcast's root's shard; else 0).
struct RingCollective {
  std::uint8_t ring = kGatherRing;
  std::int64_t step = 0;
  std::int64_t base = 0;
  kernels::Tensor values;
};
// Caller -> its RingMember (in-process): rings from now on encode their chunks so.
struct RingCompression {
  kernels::CompressionSpec spec;
};

// The rings' work done, by (ring, step, base); shared by the caller and its RingMember.
struct RingDone {
  using Work = std::tuple<std::uint8_t, std::int64_t, std::int64_t>;
  std::mutex mu;
  std::condition_variable changed;
  std::set<Work> done;
};
// The transport -> a RingMember (in-process, as a chunk sent from the caller's memory is
// released): that chunk of `work` is written.
struct RingChunkWritten {
  RingDone::Work work;
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
      if (world_ == 1) return finished(kSumRing, s.step, s.base);
      ring_->start(s.step, s.base, s.values);
    });
    on<RingCollective>([this](RingCollective& c) {
      if (world_ == 1) return finished(c.ring, c.step, c.base);
      if (c.ring == kBroadcastRing) sameRoot(c.step, c.base, rank_);
      collectives_[c.ring - 1]->start(c.step, c.base, c.values);
    });
    on<RingChunk>([this](RingChunk& c) {
      if (c.ring == kSumRing) return ring_->receive(std::move(c));
      if (c.ring > kCollectives) {
        throw InputError(fmt::format(
            "kvstore: worker {} got a chunk of ring {}, which the ring store does not run", rank_,
            c.ring));
      }
      if (c.ring == kBroadcastRing) sameRoot(c.step, c.bucket, (rank_ + world_ - 1) % world_);
      collectives_[c.ring - 1]->receive(std::move(c));
    });
    on<RingCompression>([this](RingCompression& c) { build(c.spec); });
    on<RingChunkWritten>([this](RingChunkWritten& w) { written(w.work); });
  }

  void started() override {
    build({});
    if (world_ == 1) return;  // a collective ends where it starts
    using Mode = RingAllreduce::Mode;
    // The gathers and scatters write each part of their buffer once, before it is sent (no copy
    // needed: forwarder); an allreduce overwrites its partial sums.
    const std::pair<std::uint8_t, Mode> rings[kCollectives] = {{kGatherRing, Mode::kAllGather},
                                                               {kScatterRing, Mode::kReduceScatter},
                                                               {kAllreduceRing, Mode::kAllreduce},
                                                               {kBroadcastRing, Mode::kAllGather}};
    RingAllreduce::Shards broadcast_shards;
    for (std::int64_t w = 0; w < world_; ++w)
      broadcast_shards.emplace_back(w * kBroadcastShard, (w + 1) * kBroadcastShard);
    for (const auto& [ring, mode] : rings) {
      collectives_[ring - 1].emplace(
          rank_, world_, collectiveSegment(world_), forwarder(), doneOn(ring),
          kernels::CompressionSpec{}, mode, ring,
          ring == kBroadcastRing ? broadcast_shards : RingAllreduce::Shards{});
    }
  }

  // A collective's segment: about kSegment, a multiple of the world (forEachPart).
  static std::int64_t collectiveSegment(int world) {
    return world * std::max<std::int64_t>(1, kSegment / world);
  }

 private:
  void build(kernels::CompressionSpec spec) {
    if (world_ == 1) return;
    TROUPE_ENFORCE(!ring_ || ring_->pending() == 0, "a ring rebuilt with sums in flight");
    ring_.emplace(rank_, world_, kSegment, forwarder(), doneOn(kSumRing), spec);
  }

  // Sends a ring's chunks on as the trainer's ring does (sendable): a float chunk in memory
  // shared with the next worker's process where it runs on this host (read there in place: no
  // socket copies); else from the caller's memory itself, leased, and the work it is part of ends
  // (finished) only once the transport has written it, since the caller may change that memory
  // then. Within the work the ring writes a chunk's place again (an allreduce's all-gather over
  // its reduce-scatter's partial sums) only once the chunk went round, so after it was written.
  RingAllreduce::SendFn forwarder() {
    return [this](RingChunk chunk) {
      if (chunk.data.dtype() == kernels::DType::kFloat32) {
        const RingDone::Work work{chunk.ring, chunk.step, chunk.bucket};
        auto out = sendable(system(), next_, chunk.data, [&system = system(), me = self(), work] {
          system.tell(me, RingChunkWritten{work});
        });
        if (out.leased) ++unwritten_[work];
        chunk.data = std::move(out.data);
      }
      send(next_, std::move(chunk));
    };
  }

  // A chunk of `work` sent from the caller's memory is written: the work ends once its last is
  // and its ring is done.
  void written(const RingDone::Work& work) {
    auto it = unwritten_.find(work);
    TROUPE_ENFORCE(it != unwritten_.end(), "a written chunk of work no chunk was leased for");
    if (--it->second > 0) return;
    unwritten_.erase(it);
    if (ring_done_.erase(work) > 0) signal(work);
  }

  RingAllreduce::DoneFn doneOn(std::uint8_t ring) {
    return [this, ring](std::int64_t step, std::int64_t base, std::int64_t) {
      finished(ring, step, base);
    };
  }

  // A broadcast's root, as the work's base says it (kBroadcastShard), where `worker` (this one's,
  // or the previous one's whose chunk came) puts it: InputError naming both roots when another
  // worker's broadcast of the same number said another one (which would wait for chunks that
  // never come).
  void sameRoot(std::int64_t step, std::int64_t base, int worker) {
    const auto [it, first] = roots_.try_emplace(step, base, worker);
    if (first || it->second.first == base) return;
    // By worker, so that both workers name them alike.
    std::pair<int, std::int64_t> one{it->second.second, it->second.first / kBroadcastShard},
        other{worker, base / kBroadcastShard};
    if (other < one) std::swap(one, other);
    throw InputError(fmt::format(
        "kvstore: broadcast {}: worker {} broadcasts from root {}, worker {} from root {}: every "
        "worker must name the same root",
        step, one.first, one.second, other.first, other.second));
  }

  void finished(std::uint8_t ring, std::int64_t step, std::int64_t base) {
    if (ring == kBroadcastRing) roots_.erase(step);
    const RingDone::Work work{ring, step, base};
    if (unwritten_.count(work) > 0) {  // its chunks' memory is still the transport's
      ring_done_.insert(work);
      return;
    }
    signal(work);
  }

  void signal(const RingDone::Work& work) {
    std::lock_guard lock(done_->mu);
    done_->done.insert(work);
    done_->changed.notify_all();
  }

  int rank_, world_;
  Address next_;
  std::shared_ptr<RingDone> done_;
  std::optional<RingAllreduce> ring_;
  std::optional<RingAllreduce> collectives_[kCollectives];  // by ring - 1
  // Chunks sent from the caller's memory that the transport has not written yet, by work, and
  // the works whose ring is done that wait for them.
  std::map<RingDone::Work, int> unwritten_;
  std::set<RingDone::Work> ring_done_;
  // The broadcasts in flight: by number, their base (the root's shard) and the worker that first
  // said it (sameRoot).
  std::map<std::int64_t, std::pair<std::int64_t, int>> roots_;
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

  // In place: the ring sums the caller's memory (its chunks go out as copies, forwarder).
  Status allreduce(std::span<float> values) override {
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    return runCollective(kAllreduceRing, inPlace(values), "allreduce");
  }

  // In place: the root's chunks go out from its memory, the others' are written where they lie.
  Status broadcast(std::span<float> values, int root) override {
    if (Status s = rootOf("broadcast", root, world_); !s) return s;
    const auto n = static_cast<std::int64_t>(values.size());
    if (n >= kBroadcastShard) {
      return inputError(fmt::format("broadcast: {} values, more than the ring's {} at once", n,
                                    kBroadcastShard - 1));
    }
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    return runCollective(kBroadcastRing, inPlace(values), "broadcast", root * kBroadcastShard);
  }

  using KVStore::allgather;
  Status allgather(std::span<const float> mine,
                   const std::vector<std::span<float>>& parts) override {
    if (Status s = partSizes("allgather", parts, mine.size(), world_); !s) return s;
    return collective(
        kGatherRing, "allgather", mine.size() * parts.size(), mine.size(),
        [&](int w, float* part, std::int64_t from, std::int64_t count) {
          if (w == rank_) std::copy_n(mine.data() + from, count, part);
        },
        [&](int w, const float* part, std::int64_t from, std::int64_t count) {
          std::copy_n(part, count, parts[static_cast<std::size_t>(w)].data() + from);
        });
  }

  Status reduceScatter(std::span<const float> all, std::span<float> mine) override {
    const auto n = static_cast<std::int64_t>(mine.size());
    return collective(
        kScatterRing, "reduce_scatter", all.size(), mine.size(),
        [&](int w, float* part, std::int64_t from, std::int64_t count) {
          std::copy_n(all.data() + w * n + from, count, part);
        },
        [&](int w, const float* part, std::int64_t from, std::int64_t count) {
          if (w == rank_) std::copy_n(part, count, mine.data() + from);
        });
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
  // The caller's `values` as a tensor that the ring reads and writes where they lie (not owned).
  static kernels::Tensor inPlace(std::span<float> values) {
    return kernels::Tensor(std::shared_ptr<void>(values.data(), [](void*) {}), values.data(),
                           {static_cast<std::int64_t>(values.size())}, kernels::DType::kFloat32,
                           kernels::Device{});
  }
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

  // Waits until ring `ring`'s work (step, base) is done; the run's failure or the wait limit end
  // it.
  Status awaitRing(std::uint8_t ring, std::int64_t step, std::int64_t base,
                   const std::string& what) {
    const RingDone::Work work{ring, step, base};
    std::unique_lock lock(done_->mu);
    const bool ended = done_->changed.wait_for(
        lock, wait_limit_, [&] { return done_->done.count(work) || !failure_.isOk(); });
    if (!failure_.isOk()) return failure_;
    if (!ended) {
      const int previous = (rank_ + world_ - 1) % world_;
      return {ErrorKind::kPeer,
              fmt::format("worker {}: {} waited {:g} s (peer_timeout + grace) for the ring's "
                          "chunks from {}: hung or gone",
                          rank_, what, std::chrono::duration<double>(wait_limit_).count(),
                          node_.members->worker(previous).str())};
    }
    done_->done.erase(work);
    return {};
  }

  // Runs collective `ring` (kGatherRing, kScatterRing) of `mine` values a worker, `all` in all:
  // `in` fills each worker's parts of the ring's buffer (laid out by forEachPart) before, and
  // `out` reads them after, each called with (worker, part, from, count).
  template <typename In, typename Out>
  Status collective(std::uint8_t ring, const char* what, std::size_t all, std::size_t mine,
                    const In& in, const Out& out) {
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    if (Status s = collectiveSizes(what, all, mine, world_); !s) return s;
    const auto n = static_cast<std::int64_t>(mine);
    auto buffer = kernels::Tensor::hostUninitialized({world_ * n});
    float* b = buffer.f32();
    const std::int64_t segment = RingMember::collectiveSegment(world_);
    forEachPart(world_, n, segment,
                [&](int w, std::int64_t at, std::int64_t from, std::int64_t count) {
                  in(w, b + at, from, count);
                });
    if (Status s = runCollective(ring, buffer, what); !s) return s;
    forEachPart(world_, n, segment,
                [&](int w, std::int64_t at, std::int64_t from, std::int64_t count) {
                  out(w, b + at, from, count);
                });
    return {};
  }

  // Runs collective `ring` on `values` at `base` of its space, the next of its number.
  Status runCollective(std::uint8_t ring, const kernels::Tensor& values, const char* what,
                       std::int64_t base = 0) {
    const std::int64_t step = collectives_[ring - 1]++;
    if (Status s = tell(RingCollective{ring, step, base, values}); !s) return s;
    return awaitRing(ring, step, base, fmt::format("{} {}", what, step));
  }

  // Sums `values` over the workers in place (step -1: an init's broadcast).
  Status reduce(std::int64_t step, std::int64_t base, const kernels::Tensor& values,
                const std::string& what) {
    if (Status s = tell(RingStart{step, base, values}); !s) return s;
    return awaitRing(kSumRing, step, base, what);
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
      if (Status s = awaitRing(kSumRing, step, k.base, fmt::format("push {} of key {}", step, key));
          !s)
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
  std::int64_t collectives_[kCollectives] = {};  // the collectives run, by ring - 1
};

}  // namespace

std::unique_ptr<KVStore> makeRingKVStore(const TrainOptions& options) {
  return std::make_unique<RingKVStore>(options);
}

}  // namespace troupe::actors
