#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/core/lease.h"
#include "actors/core/messages.h"
#include "actors/core/trace.h"
#include "actors/roles/grad_slots.h"
#include "actors/roles/hierarchical_allreduce.h"
#include "actors/roles/ring_allreduce.h"
#include "actors/roles/roles.h"
#include "actors/run/run_layout.h"
#include "kernels/backend.h"
#include "kernels/cuda_plugin.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// Reducer -> itself: the copy of bucket [begin, ...) of `step` to host memory is done (or
// failed: `error`), so its ring may start.
struct OnHost {
  std::int64_t step = 0;
  std::int64_t begin = 0;
  std::string error;
};

// Waits for events, in the order given, on a thread of its own, and calls `done` for each as it
// completes (with what the work threw, if it failed): so that the reducer's thread goes on
// taking ring chunks of other buckets while a copy from the GPU runs.
class EventWaiter {
 public:
  using Done = std::function<void(std::int64_t step, std::int64_t begin, std::string error)>;
  explicit EventWaiter(Done done) : done_(std::move(done)), thread_([this] { run(); }) {}
  ~EventWaiter() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void add(kernels::Event event, std::int64_t step, std::int64_t begin) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back({std::move(event), step, begin});
    }
    wake_.notify_all();
  }

 private:
  struct Waiting {
    kernels::Event event;
    std::int64_t step = 0, begin = 0;
  };

  void run() {
    for (;;) {
      Waiting w;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (stopping_ || queue_.empty()) return;  // the reducer is gone: its copies with it
        w = std::move(queue_.front());
        queue_.pop_front();
      }
      std::string error;
      try {
        w.event.wait();
      } catch (const std::exception& e) {
        error = e.what();
      }
      try {
        done_(w.step, w.begin, std::move(error));
      } catch (const std::exception&) {
        // The run is over (its actors stopped): nobody is left to tell.
      }
    }
  }

  Done done_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Waiting> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// Sums each gradient bucket over the replicas of this process, in replica order (so the result
// does not depend on arrival order), as soon as the last replica's part of it arrives; then, with
// several processes, over all of them by ring allreduce, while backward goes on. With
// reducer = nccl, NCCL sums the replicas' buckets over every GPU of the run instead, or, with
// the allreduce named (ring, hierarchical), over this process's GPUs before the ring. With the
// optimizer's state sharded (ZeRO, ReducerConfig::shards) the ring only reduce-scatters, and the
// updated weights come back to be all-gathered.
class Reducer final : public Actor {
 private:
  struct InRing {
    kernels::Tensor sum;
    kernels::Event ready;  // after the work that wrote `sum`
    Trace::Clock::time_point started;
    bool warned = false;   // the stall report for it was logged
    bool reduced = false;  // the ring is done with it
    int unwritten = 0;     // chunks sent from it that the transport has not released yet
    // What it is: gradients to sum, or with sharded state (ZeRO) weights to all-gather
    // (GatherWeights) or an updater's figures to sum (SumAcrossWorkers).
    enum class Kind : std::uint8_t { kGradients, kWeights, kFigures } kind = Kind::kGradients;
    kernels::Tensor device_weights;  // weights on a GPU whose host copy `sum` goes round
    std::int64_t bucket = -1;        // ZeRO stage 2: the begin of the bucket it is a piece of
  };
  // The key of a step's figures in in_ring_ (no bucket begins there).
  static constexpr std::int64_t kFiguresKey = -1;
  using InRings = std::map<std::pair<std::int64_t, std::int64_t>, InRing>;
  // A bucket's parts from this process's replicas, as they arrive.
  struct Pending {
    std::vector<kernels::Tensor> parts;
    std::vector<kernels::Event> ready;  // reducer = nccl: each part's event
    int count = 0;
  };
  struct NcclSum {
    std::int64_t step = 0, begin = 0, end = 0;
    kernels::Event summed;
    Trace::Clock::time_point started;
  };

 public:
  Reducer(std::string name, ReducerConfig config)
      : Actor(std::move(name)), config_(std::move(config)) {
    on<GradBucket>([this](GradBucket& b) { add(b); });
    on<RingChunk>([this](RingChunk& c) {
      if (gather_ && c.ring == 1) {
        gather_->receive(std::move(c));
      } else if (figures_ && c.ring == 2) {
        figures_->receive(std::move(c));
      } else if (hierarchical_) {
        hierarchical_->receive(std::move(c));
      } else {
        flat_->receive(std::move(c));
      }
    });
    on<ChunkWritten>([this](ChunkWritten& w) { written(w); });
    on<StallCheck>([this](StallCheck&) { checkStalls(); });
    on<OnHost>([this](OnHost& h) { startRing(h); });
    on<GatherWeights>([this](GatherWeights& g) { gather(g); });
    on<SumAcrossWorkers>([this](SumAcrossWorkers& s) { sumFigures(s); });
  }

  void started() override {
    armStallCheck();
    if (config_.nccl && config_.nccl->spans_processes) return;  // NCCL sums, on its own streams
    backend_ = kernels::makeBackend(config_.device, config_.threads);
    device_copies_.resize(static_cast<std::size_t>(config_.num_replicas));
    buildRings();
  }

 private:
  void buildRings() {
    static const ReductionPlan kFlat;
    const ReductionPlan& plan = config_.reduction ? *config_.reduction : kFlat;
    const std::int64_t segment = config_.segment_bytes / static_cast<std::int64_t>(sizeof(float));
    auto send = [this](RingChunk chunk) { sendChunk(std::move(chunk)); };
    auto done = [this](std::int64_t step, std::int64_t begin, std::int64_t) {
      finished(step, begin);
    };
    const bool figures_apart = config_.figures_world > 0;  // pipeline stages' workers
    if (!config_.shards.empty() || figures_apart) {
      TROUPE_ENFORCE(plan.host_ranks.empty(), "sharded state over a hierarchical allreduce");
      const bool sharded = !config_.shards.empty();
      flat_.emplace(config_.rank, config_.world, segment, send, done, config_.compression,
                    sharded ? RingAllreduce::Mode::kReduceScatter : RingAllreduce::Mode::kAllreduce,
                    0, config_.shards);
      // The gradients' sums compressed as a whole allreduce's; the updated weights exact.
      if (sharded) {
        gather_.emplace(config_.rank, config_.world, segment, send, done,
                        kernels::CompressionSpec{}, RingAllreduce::Mode::kAllGather, 1,
                        config_.shards);
      }
      figures_.emplace(figures_apart ? config_.figures_rank : config_.rank,
                       figures_apart ? config_.figures_world : config_.world, segment, send, done,
                       kernels::CompressionSpec{}, RingAllreduce::Mode::kAllreduce, 2);
      nexts_ = {config_.next, config_.next, figures_apart ? config_.figures_next : config_.next};
      return;
    }
    if (plan.host_ranks.empty()) {
      flat_.emplace(config_.rank, config_.world, segment, send, done, config_.compression);
      nexts_ = {config_.next};
      return;
    }
    const auto& host = plan.host_ranks;
    const auto& across = plan.across_ranks;
    const int l = indexOf(host, config_.rank), h = indexOf(across, config_.rank);
    const int local = static_cast<int>(host.size()), hosts = static_cast<int>(across.size());
    hierarchical_.emplace(l, local, h, hosts, segment, send, done, config_.compression);
    const Address next_in_host = address(host[static_cast<std::size_t>((l + 1) % local)]);
    nexts_ = {next_in_host, address(across[static_cast<std::size_t>((h + 1) % hosts)]),
              next_in_host};
    const int previous_in_host = host[static_cast<std::size_t>((l + local - 1) % local)];
    previous_ = {previous_in_host, across[static_cast<std::size_t>((h + hosts - 1) % hosts)],
                 previous_in_host};
  }

  void armStallCheck() {
    if (config_.world > 1 || config_.nccl || config_.figures_world > 1) {
      system().after(stallCheckPeriod(config_.run.stall_warning, config_.run.peer_timeout), self(),
                     StallCheck{});
    }
  }

  // Horovod's stall report, for a ring: a bucket this worker has summed locally and started, that
  // has not come back from the ring, waits on the previous worker (directly, or through it).
  void checkStalls() {
    if (config_.nccl) checkNcclStalls();
    const auto now = Trace::Clock::now();
    const int previous = previousWorker(config_.rank, config_.world, config_.ring_workers);
    const int me = config_.ring_workers.empty()
                       ? config_.rank
                       : config_.ring_workers.at(static_cast<std::size_t>(config_.rank));
    const int previous_in_figures =
        config_.figures_world > 0 ? previousWorker(config_.figures_rank, config_.figures_world, {})
                                  : previous;
    const double limit = std::chrono::duration<double>(config_.run.peer_timeout).count();
    for (auto& [key, r] : in_ring_) {
      const auto& [step, begin] = key;
      // Hierarchical: the previous worker of the ring the bucket waits in.
      const int ring = hierarchical_ ? std::max(0, hierarchical_->ringOf(step, begin)) : 0;
      const Peer late = peerOf(config_.run.members, "worker",
                               hierarchical_          ? previous_[static_cast<std::size_t>(ring)]
                               : begin == kFiguresKey ? previous_in_figures
                                                      : previous);
      const double waited = std::chrono::duration<double>(now - r.started).count();
      const std::string when = describeStep(step, config_.run.steps_per_epoch);
      if (now - r.started >= config_.run.peer_timeout) {
        throw PeerError(
            late,
            fmt::format("no ring chunks of {} within {:g} s (peer_timeout): it, or a worker "
                        "before it in the ring, is hung or gone",
                        when, limit),
            fmt::format("worker {}: the allreduce of bucket [{},{}) of {} waited {:.1f} s for "
                        "ring chunks from {} (peer_timeout): that worker, or one before it in the "
                        "ring, is hung or gone",
                        me, begin, begin + r.sum.numel(), when, waited, late.str()));
      }
      if (now - r.started >= config_.run.stall_warning && !r.warned) {
        r.warned = true;
        spdlog::warn(
            "stall: worker {} has waited {:.1f} s in {} for {} to send ring chunks of bucket "
            "[{},{}); {} bucket(s) of this worker are unfinished; the run fails after {:g} s",
            me, waited, when, late.str(), begin, begin + r.sum.numel(), in_ring_.size(), limit);
      }
    }
    armStallCheck();
  }

  // A chunk views the bucket, which the replica's next backward overwrites once the updater has
  // the reduced bucket. To the next process on this host: copied into shared memory, which that
  // process reads in place. Across hosts: sent from the bucket itself (no copy), and the bucket
  // goes on to the updater only once the transport has written every such chunk (ChunkWritten).
  // (Compressed chunks are encoded into memory of their own.)
  void sendChunk(RingChunk chunk) {
    const Address next = nexts_.at(chunk.ring);
    if (chunk.data.dtype() == kernels::DType::kFloat32) {
      // Chunks of the ring across hosts name their slice's start; the others, their bucket.
      const std::pair<std::int64_t, std::int64_t> key{
          chunk.step, chunk.ring == 1 && hierarchical_
                          ? hierarchical_->bucketHolding(chunk.step, chunk.bucket)
                          : chunk.bucket};
      auto out = sendable(system(), next, chunk.data, [&system = system(), me = self(), key] {
        system.tell(me, ChunkWritten{key.first, key.second});
      });
      if (out.leased) ++in_ring_.at(key).unwritten;
      chunk.data = std::move(out.data);
    }
    send(next, std::move(chunk));
  }

  // The worker before rank `rank` in a ring of `world` whose ranks are `workers`' (empty: rank =
  // worker).
  static int previousWorker(int rank, int world, const std::vector<int>& workers) {
    const int previous = (rank + world - 1) % world;
    return workers.empty() ? previous : workers.at(static_cast<std::size_t>(previous));
  }

  static int indexOf(const std::vector<int>& ranks, int rank) {
    const auto it = std::find(ranks.begin(), ranks.end(), rank);
    TROUPE_ENFORCE(it != ranks.end(), "rank ", rank, " is not in its own ring");
    return static_cast<int>(it - ranks.begin());
  }

  static Address address(int rank) { return RunLayout::reducer(rank); }

  void written(const ChunkWritten& w) {
    auto it = in_ring_.find({w.step, w.begin});
    TROUPE_ENFORCE(it != in_ring_.end(), "a written chunk of an unknown bucket");
    --it->second.unwritten;
    if (it->second.reduced && it->second.unwritten == 0) handOn(it);
  }

  void finished(std::int64_t step, std::int64_t begin) {
    auto it = in_ring_.find({step, begin});
    TROUPE_ENFORCE(it != in_ring_.end(), "ring finished an unknown bucket");
    it->second.reduced = true;
    if (it->second.unwritten == 0) handOn(it);
  }

  void handOn(InRings::iterator it) {
    const auto [step, begin] = it->first;
    const std::int64_t end = begin + it->second.sum.numel();
    using Kind = InRing::Kind;
    const Kind kind = it->second.kind;
    if (config_.run.trace && config_.world > 1 && kind != Kind::kFigures) {
      const bool weights = kind == Kind::kWeights;
      const char* what = weights ? "all-gather" : gather_ ? "reduce-scatter" : "allreduce";
      config_.run.trace->asyncSpan(
          name(), fmt::format("{} [{},{})", what, begin, end),
          (static_cast<std::uint64_t>(step) * 1000003u + static_cast<std::uint64_t>(begin)) * 2u +
              (weights ? 1u : 0u),
          it->second.started, Trace::Clock::now());
    }
    if (kind == Kind::kWeights) {
      kernels::Event ready;
      if (it->second.device_weights.defined()) {  // back to the updater's GPU
        backend_->copy(it->second.sum, it->second.device_weights);
        ready = backend_->record();
      }
      send(config_.updater, WeightsGathered{step, begin, end, ready});
    } else if (kind == Kind::kFigures) {
      send(config_.updater, SummedAcrossWorkers{step, it->second.sum});
    } else if (config_.grad_slots) {
      takeShard(step, begin, it->second);
    } else {
      send(config_.updater, Reduced{step, begin, end, it->second.sum, it->second.ready});
    }
    in_ring_.erase(it);
  }

  // ZeRO stage 2: this rank's shard of a reduce-scattered piece's sums is copied out of the
  // replica's gradient slot, for the updater; the bucket's slot is free once its last piece is.
  void takeShard(std::int64_t step, std::int64_t begin, const InRing& piece) {
    const std::int64_t end = begin + piece.sum.numel();
    const auto [lo, hi] = config_.shards.at(static_cast<std::size_t>(config_.rank));
    if (shard_sums_.numel() != hi - lo) shard_sums_ = backend_->empty({hi - lo});
    const std::int64_t from = std::max(begin, lo), to = std::min(end, hi);
    kernels::Tensor mine;
    if (from < to) {
      mine = shard_sums_.slice(from - lo, to - lo);
      backend_->copy(piece.sum.slice(from - begin, to - begin), mine);
    }
    backend_->synchronize();
    const std::pair<std::int64_t, std::int64_t> bucket{step, piece.bucket};
    if (--pieces_left_.at(bucket) == 0) {
      pieces_left_.erase(bucket);
      config_.grad_slots->release(step, piece.bucket);
    }
    send(config_.updater, Reduced{step, begin, end, mine, {}, from < to ? from : -1});
  }

  // ZeRO: the updater's weights [begin, end), its own shard of them updated, all-gathered in
  // place (ring 1) with the same pieces as the sums came in. Weights on a GPU go round through
  // the host, as the sums do: copied there once updated (OnHost starts the ring), and back once
  // the ring is done.
  void gather(const GatherWeights& g) {
    TROUPE_ENFORCE_EQ(g.weights.numel(), g.end - g.begin);
    backend_->waitFor(g.ready);
    if (g.weights.device().kind == kernels::DeviceKind::kCpu) {
      startSharded(*gather_, g.step, g.begin, g.weights, InRing::Kind::kWeights);
      return;
    }
    TROUPE_ENFORCE(g.weights.device() == backend_->device(), "weights on ",
                   kernels::toString(g.weights.device()), " to all-gather through a reducer on ",
                   kernels::toString(backend_->device()));
    const kernels::Tensor host = staging(gather_host_, g.begin, g.weights.numel(), {});
    enter(g.step, g.begin, host, InRing::Kind::kWeights).device_weights = g.weights;
    backend_->copy(g.weights, host);
    waiter().add(backend_->record(), g.step, g.begin);
  }

  // ZeRO: an updater's figures of its shard, summed over the workers in place (ring 2).
  void sumFigures(const SumAcrossWorkers& s) {
    startSharded(*figures_, s.step, kFiguresKey, s.values, InRing::Kind::kFigures);
  }

  void startSharded(RingAllreduce& ring, std::int64_t step, std::int64_t begin,
                    const kernels::Tensor& values, InRing::Kind kind) {
    enter(step, begin, values, kind);
    ring.start(step, begin, values);
  }

  // A sharded ring's entry for [begin, begin + values.numel()) of `step`.
  InRing& enter(std::int64_t step, std::int64_t begin, const kernels::Tensor& values,
                InRing::Kind kind) {
    const auto [it, added] = in_ring_.try_emplace({step, begin});
    TROUPE_ENFORCE(added, "[", begin, ",", begin + values.numel(), ") of step ", step,
                   " started twice in the reducer's rings");
    it->second.sum = values;
    it->second.kind = kind;
    it->second.started = Trace::Clock::now();
    return it->second;
  }

  void add(GradBucket& b) {
    TROUPE_ENFORCE(0 <= b.replica && b.replica < config_.num_replicas, "bucket from replica ",
                   b.replica, " of ", config_.num_replicas);
    if (config_.run.trace) traceDeviceSums(b.step);
    const std::pair<std::int64_t, std::int64_t> key{b.step, b.begin};
    Pending& pending = pending_[key];
    if (pending.parts.empty()) {
      pending.parts.resize(static_cast<std::size_t>(config_.num_replicas));
      pending.ready.resize(pending.parts.size());
    }
    auto& slot = pending.parts[static_cast<std::size_t>(b.replica)];
    TROUPE_ENFORCE(!slot.defined() || slot.numel() == 0, "replica ", b.replica, " sent bucket [",
                   b.begin, ",", b.end, ") of step ", b.step, " twice");
    TROUPE_ENFORCE_EQ(b.grads.numel(), b.end - b.begin);
    if (config_.nccl) {
      // NCCL reads each replica's bucket on its own GPU once its event fired.
      slot = b.grads;
      pending.ready[static_cast<std::size_t>(b.replica)] = b.ready;
    } else {
      slot = here(b);
    }
    if (++pending.count < config_.num_replicas) return;
    const Pending parts = std::move(pending);
    pending_.erase(key);
    if (config_.nccl && config_.nccl->spans_processes) {
      ncclSum(b.step, b.begin, parts);
      return;
    }

    // The sum goes into replica 0's bucket (GradBucket lends it writable), or into the staging
    // copy of it here. NCCL in this process only: its sum, then the ring across processes.
    kernels::Tensor sum = parts.parts[0];
    if (config_.nccl) {
      backend_->waitFor(ncclQueue(b.step, b.begin, parts));
    } else if (parts.parts.size() > 1) {
      TraceScope span(config_.run.trace, name(), "reduce");
      const bool timed = config_.run.trace && sum.device().kind != kernels::DeviceKind::kCpu;
      const kernels::Event began = timed ? backend_->recordTimed() : kernels::Event();
      for (std::size_t r = 1; r < parts.parts.size(); ++r) {
        TROUPE_ENFORCE_EQ(parts.parts[r].numel(), sum.numel());
        backend_->axpy(1.0f, parts.parts[r], sum);
      }
      if (timed) {
        to_trace_.push_back({fmt::format("sum [{},{})", b.begin, b.begin + sum.numel()), began,
                             backend_->recordTimed()});
      }
    }
    const std::int64_t n = sum.numel();
    if (config_.world > 1 && sum.device().kind != kernels::DeviceKind::kCpu) {
      fromDevice(b.step, b.begin, sum);
      return;
    }
    // Here a sum on a GPU is of one process (no ring): the updater waits for its event.
    kernels::Event ready;
    if (sum.device().kind == kernels::DeviceKind::kCpu) {
      backend_->synchronize();
    } else {
      ready = backend_->record();
    }
    if (config_.grad_slots) pieces_left_[key] = (n + piece(n) - 1) / piece(n);
    for (std::int64_t at = 0; at < n; at += piece(n)) {
      InRing& entry = in_ring_[{b.step, b.begin + at}];
      entry.sum = sum.slice(at, std::min(n, at + piece(n)));
      entry.ready = ready;
      entry.bucket = b.begin;
      startRing(OnHost{b.step, b.begin + at, ""});
    }
  }

  // What a bucket of n runs as rings of its own: each segment of the flat ring (which cuts a
  // bucket into the same segments, so the sums are the same to the bit), or the whole bucket.
  std::int64_t piece(std::int64_t n) const {
    return flat_ && config_.world > 1 ? flat_->segmentElements() : std::max<std::int64_t>(n, 1);
  }

  // A sum on a GPU goes to the host, where the ring reads and writes, piece by piece: each
  // piece's ring starts once its copy is done (OnHost), while the next piece copies, and each
  // goes on to the updater, which copies it back, as its ring ends. Chunks of other buckets go on
  // meanwhile.
  void fromDevice(std::int64_t step, std::int64_t begin, const kernels::Tensor& sum) {
    const std::int64_t n = sum.numel();
    const kernels::Tensor host = staging(host_, begin, n, kernels::Device{});
    for (std::int64_t at = 0; at < n; at += piece(n)) {
      const std::int64_t to = std::min(n, at + piece(n));
      InRing& entry = in_ring_[{step, begin + at}];
      entry.started = Trace::Clock::now();  // again at startRing
      entry.sum = host.slice(at, to);
      backend_->copy(sum.slice(at, to), entry.sum);
      waiter().add(backend_->record(), step, begin + at);
    }
  }

  // The ring's span and its stall watch start here, once the sum is on the host.
  void startRing(const OnHost& h) {
    if (!h.error.empty()) throw Error(h.error);
    InRing& entry = in_ring_.at({h.step, h.begin});
    entry.started = Trace::Clock::now();
    if (entry.kind == InRing::Kind::kWeights) {
      gather_->start(h.step, h.begin, entry.sum);
    } else if (hierarchical_) {
      hierarchical_->start(h.step, h.begin, entry.sum);
    } else {
      flat_->start(h.step, h.begin, entry.sum);
    }
  }

  // What tells the reducer (OnHost) that a copy from the GPU is done.
  EventWaiter& waiter() {
    if (!waiter_) {
      waiter_ = std::make_unique<EventWaiter>(
          [&system = system(), me = self()](std::int64_t s, std::int64_t at, std::string error) {
            system.tell(me, OnHost{s, at, std::move(error)});
          });
    }
    return *waiter_;
  }

  // reducer = nccl: the replicas' buckets are summed in place over every GPU of the run, queued
  // on NCCL's streams; the updater gets replica 0's with the event of the sums, at once.
  void ncclSum(std::int64_t step, std::int64_t begin, const Pending& parts) {
    const std::int64_t end = begin + parts.parts[0].numel();
    send(config_.updater, Reduced{step, begin, end, parts.parts[0], ncclQueue(step, begin, parts)});
  }

  // The NCCL sums of a bucket queued, watched (checkNcclStalls) and, with a trace, kept for it;
  // the event of the sums.
  kernels::Event ncclQueue(std::int64_t step, std::int64_t begin, const Pending& parts) {
    TROUPE_ENFORCE(config_.nccl->comm != nullptr, "reducer nccl without its NCCL group");
    auto& comm = *config_.nccl->comm;
    const std::int64_t end = begin + parts.parts[0].numel();
    kernels::Event began;
    kernels::Event summed =
        comm.allreduce(parts.parts, parts.ready, config_.run.trace ? &began : nullptr);
    if (config_.run.trace) {
      to_trace_.push_back({fmt::format("nccl allreduce [{},{})", begin, end), began, summed});
    }
    forgetSummed();
    in_nccl_.push_back({step, begin, end, summed, Trace::Clock::now()});
    return summed;
  }

  // With a trace, at the first bucket of a step: the last step's sums on a GPU by the device's own
  // clock, on a track of their own beside the replicas' compute ("reducer nccl cuda:0" for
  // NCCL's, "reducer cuda:0" for this reducer's sums on its GPU). They are done (this bucket
  // comes from a backward that began after the updater applied them) and nothing of this step is
  // queued yet, so a mark on the idle stream is reached at once: the host's time of that wait
  // anchors them. The run's last step is left out.
  void traceDeviceSums(std::int64_t step) {
    if (step == traced_step_) return;
    traced_step_ = step;
    // Sums not done (a hung peer, which the stall watch handles) are not waited for here.
    const bool done = std::all_of(to_trace_.begin(), to_trace_.end(),
                                  [](const TracedSum& s) { return s.summed.done(); });
    if (!done) to_trace_.clear();
    if (to_trace_.empty()) return;
    kernels::Communicator* comm = config_.nccl ? config_.nccl->comm.get() : nullptr;
    const kernels::Event now = comm ? comm->mark() : backend_->recordTimed();
    now.wait();
    const auto end = Trace::Clock::now();
    auto at = [&](const kernels::Event& e) {
      return Trace::secondsBefore(end, comm ? comm->elapsed(e, now) : backend_->elapsed(e, now));
    };
    const std::string track =
        fmt::format("{}{} {}", name(), comm ? " nccl" : "", kernels::toString(config_.device));
    for (const auto& s : to_trace_)
      config_.run.trace->span(track, s.what, at(s.began), at(s.summed));
    to_trace_.clear();
  }

  // The NCCL sums done by now leave the watch (checkNcclStalls).
  void forgetSummed() {
    while (!in_nccl_.empty() && in_nccl_.front().summed.done())
      in_nccl_.pop_front();
  }

  // reducer = nccl: NCCL reports what it found wrong (a peer's connection closed) but says not
  // who is late, and its kernels wait for ever on a hung peer: a sum still running after the
  // group's timeout aborts the group (so that the updater's wait for it ends) and fails the run.
  void checkNcclStalls() {
    auto& comm = *config_.nccl->comm;
    if (const std::string error = comm.error(); !error.empty()) {
      comm.abort();
      throw Error(fmt::format("worker {}: {}; the NCCL group was aborted", config_.rank, error));
    }
    forgetSummed();
    if (in_nccl_.empty()) return;
    const NcclSum& oldest = in_nccl_.front();
    const auto waited = Trace::Clock::now() - oldest.started;
    const double seconds = std::chrono::duration<double>(waited).count();
    const std::string when = describeStep(oldest.step, config_.run.steps_per_epoch);
    const auto timeout = config_.nccl->timeout;
    if (waited >= timeout) {
      comm.abort();
      const char* culprit = config_.nccl->spans_processes
                                ? "a process of the run is hung or gone (NCCL does not say which)"
                                : "a GPU of this process is hung (the group has no other process)";
      throw TimeoutError(fmt::format(
          "worker {}: the NCCL sum of bucket [{},{}) of {} did not finish within {:.1f} s "
          "(peer_timeout): {}; the NCCL group was aborted",
          config_.rank, oldest.begin, oldest.end, when, seconds, culprit));
    }
    if (waited >= config_.run.stall_warning && oldest.step != warned_nccl_step_) {
      warned_nccl_step_ = oldest.step;
      spdlog::warn(
          "stall: worker {} has waited {:.1f} s in {} for NCCL to sum bucket [{},{}); {} sum(s) "
          "of this worker are unfinished; the run fails after {:g} s",
          config_.rank, seconds, when, oldest.begin, oldest.end, in_nccl_.size(),
          std::chrono::duration<double>(timeout).count());
    }
  }

  // The bucket's gradients where this reducer computes, once their event fired there: in place
  // if on its device, else a copy in staging memory of its own.
  kernels::Tensor here(const GradBucket& b) {
    backend_->waitFor(b.ready);
    if (b.grads.device() == backend_->device()) return b.grads;
    auto copy = staging(device_copies_[static_cast<std::size_t>(b.replica)], b.begin,
                        b.grads.numel(), backend_->device());
    backend_->copy(b.grads, copy);
    return copy;
  }

  // Memory for the bucket starting at `begin`, made at the first step and reused after.
  kernels::Tensor staging(std::map<std::int64_t, kernels::Tensor>& buffers, std::int64_t begin,
                          std::int64_t numel, kernels::Device device) {
    auto& t = buffers[begin];
    if (t.numel() != numel) {
      t = device.kind == kernels::DeviceKind::kCpu ? backend_->hostBuffer({numel})
                                                   : backend_->empty({numel});
    }
    return t;
  }

  ReducerConfig config_;
  std::unique_ptr<kernels::Backend> backend_;
  // Staging: buckets of each replica copied to this device, and sums copied to the host.
  std::map<std::int64_t, kernels::Tensor> host_;
  std::map<std::int64_t, kernels::Tensor> gather_host_;  // ZeRO: weights from a GPU, by begin
  std::vector<std::map<std::int64_t, kernels::Tensor>> device_copies_;
  std::map<std::pair<std::int64_t, std::int64_t>, Pending> pending_;
  // ZeRO stage 2: the sums of this rank's shard, and each bucket's pieces still in the ring.
  kernels::Tensor shard_sums_;
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> pieces_left_;
  std::deque<NcclSum> in_nccl_;  // reducer = nccl: the sums queued, oldest first
  struct TracedSum {
    std::string what;
    kernels::Event began, summed;
  };
  std::vector<TracedSum> to_trace_;  // with a trace: sums on a GPU since step traced_step_ began
  std::int64_t traced_step_ = -1;
  std::int64_t warned_nccl_step_ = -1;
  // One of them, from the run's topology (ReducerConfig::reduction), once started.
  std::optional<RingAllreduce> flat_;
  std::optional<HierarchicalAllreduce> hierarchical_;
  // ZeRO: the weights' all-gather (flat_ reduce-scatters), and the updaters' figures' sums.
  std::optional<RingAllreduce> gather_, figures_;
  std::vector<Address> nexts_;  // where chunks of each ring (RingChunk::ring) go
  std::vector<int> previous_;   // hierarchical: whom each ring receives from
  InRings in_ring_;
  // Copies of sums to host memory for the ring, waited for off this thread (made at the first).
  // Last, so that it goes first: its thread tells this actor.
  std::unique_ptr<EventWaiter> waiter_;
};

}  // namespace

std::unique_ptr<Actor> makeReducer(std::string name, ReducerConfig config) {
  return std::make_unique<Reducer>(std::move(name), std::move(config));
}

}  // namespace troupe::actors
