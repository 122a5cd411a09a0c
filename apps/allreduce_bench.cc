#include "apps/allreduce_bench.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <utility>

#include "actors/core/cluster.h"
#include "actors/core/lease.h"
#include "actors/core/messages.h"
#include "actors/core/system.h"
#include "actors/roles/ring_allreduce.h"
#include "actors/roles/roles.h"
#include "kernels/tensor.h"
#include "rendezvous/exchange.h"
#include "rendezvous/value.h"
#include "transport/auth.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using Clock = std::chrono::steady_clock;
using actors::Address;
using actors::RingChunk;
using kernels::Tensor;

// Rank r contributes (r + 1) + (i % kPeriod) at element i; the sum over n ranks is
// n(n+1)/2 + n * (i % kPeriod), an integer well inside float's exact range. The period catches
// chunks written to the wrong place, the constant a missing or doubled contribution.
constexpr std::int64_t kPeriod = 1021;

void fill(const Tensor& t, int rank) {
  float* p = t.f32();
  const std::int64_t n = t.numel();
  const float base = static_cast<float>(rank + 1);
  for (std::int64_t start = 0; start < n; start += kPeriod) {
    const std::int64_t len = std::min(kPeriod, n - start);
    for (std::int64_t j = 0; j < len; ++j)
      p[start + j] = base + static_cast<float>(j);
  }
}

std::int64_t countWrong(const Tensor& t, int world) {
  const float* p = t.f32();
  const std::int64_t n = t.numel();
  const float base = static_cast<float>(world * (world + 1) / 2);
  const float w = static_cast<float>(world);
  std::int64_t wrong = 0;
  for (std::int64_t start = 0; start < n; start += kPeriod) {
    const std::int64_t len = std::min(kPeriod, n - start);
    for (std::int64_t j = 0; j < len; ++j)
      wrong += p[start + j] != base + w * static_cast<float>(j);
  }
  return wrong;
}

// What one rank measured for one size.
struct Measured {
  double sum_ms = 0;
  double min_ms = 0;
  std::int64_t wrong = 0;
};

struct BenchPlan {
  int rank = 0;
  int world = 1;
  std::vector<std::int64_t> counts;
  int warmup = 0;
  int iters = 1;
  std::int64_t segment_elements = 0;
  AllreduceBenchOptions::ChunkCopy copy = AllreduceBenchOptions::ChunkCopy::kSendBuffer;
};

// Send buffers that come back when the transport has written them (the last handle to a tensor
// goes away, on whichever thread), kept by size for the next chunk. Any thread.
class ChunkPool : public std::enable_shared_from_this<ChunkPool> {
 public:
  ~ChunkPool() {
    for (auto& [bytes, p] : free_)
      std::free(p);
  }

  Tensor take(std::int64_t n) {
    const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(float) + 63) / 64 * 64;
    void* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (auto it = free_.find(bytes); it != free_.end()) {
        p = it->second;
        free_.erase(it);
      }
    }
    if (!p) p = std::aligned_alloc(64, bytes);
    if (!p) throw Error(fmt::format("allreduce bench: out of memory for a {}-byte chunk", bytes));
    std::shared_ptr<void> storage(p, [pool = shared_from_this(), bytes](void* q) {
      std::lock_guard lock(pool->mutex_);
      pool->free_.emplace(bytes, q);
    });
    return Tensor(std::move(storage), p, {n}, kernels::DType::kFloat32, kernels::Device{});
  }

 private:
  std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
};

// The actor's note to itself that a ring finished; it goes on from its own handler, not from
// inside RingAllreduce's done callback.
struct RingDone {
  std::int64_t step = 0;
};

// Drives the whole benchmark from its own executor: per iteration a barrier ring, then the timed
// ring on the buffer; results go to `out`, read by the caller once the system has stopped.
// Two buffers alternate, and the one refilled is the one the previous iteration used: by then
// the barrier has proved every rank done with it, so the transport no longer reads it.
class AllreduceBenchActor final : public actors::Actor {
 public:
  AllreduceBenchActor(BenchPlan plan, std::shared_ptr<std::vector<Measured>> out)
      : Actor("allreduce-bench"),
        plan_(std::move(plan)),
        out_(std::move(out)),
        ring_(
            plan_.rank, plan_.world, plan_.segment_elements,
            [this](RingChunk chunk) { sendChunk(std::move(chunk)); },
            [this](std::int64_t step, std::int64_t, std::int64_t) {
              reduced_ = step;
              if (unwritten_ == 0) ringDone();
            }) {
    on<RingChunk>([this](RingChunk& c) { ring_.receive(std::move(c)); });
    on<actors::ChunkWritten>([this](actors::ChunkWritten&) {
      if (--unwritten_ == 0 && reduced_ >= 0) ringDone();
    });
    on<RingDone>([this](RingDone& d) { d.step % 2 == 0 ? startTimed() : finishTimed(); });
  }

  // send-buffer does what the reducer does in training (actors/roles/reducer.cc): into shared
  // memory for a process on this host, else straight from the buffer, done once the transport wrote
  // it.
  void sendChunk(RingChunk chunk) {
    using Copy = AllreduceBenchOptions::ChunkCopy;
    const std::int64_t n = chunk.data.numel();
    if (plan_.copy == Copy::kSendBuffer) {
      auto out = actors::sendable(system(), next_, chunk.data, [&system = system(), me = self()] {
        system.tell(me, actors::ChunkWritten{});
      });
      if (out.leased) ++unwritten_;
      chunk.data = std::move(out.data);
    } else if (plan_.copy != Copy::kNone) {
      auto copy = plan_.copy == Copy::kAlloc ? Tensor::host({n}) : pool_->take(n);
      std::copy_n(chunk.data.f32(), n, copy.f32());
      chunk.data = std::move(copy);
    }
    send(next_, std::move(chunk));
  }

  void ringDone() {
    const std::int64_t step = reduced_;
    reduced_ = -1;
    if (step % 2 == 1) elapsed_ = Clock::now() - t0_;
    send(self(), RingDone{step});
  }

  void started() override {
    const std::uint32_t next_node = static_cast<std::uint32_t>((plan_.rank + 1) % plan_.world);
    next_ = Address{next_node, self().actor};
    out_->assign(plan_.counts.size(), Measured{});
    startSize();
  }

 private:
  void startSize() {
    const std::int64_t n = plan_.counts[size_];
    for (auto& b : buffers_)
      b = Tensor::host({n});
    fill(buffers_[0], plan_.rank);
    iter_ = 0;
    current_ = 0;
    startBarrier();
  }

  void startBarrier() {
    barrier_ = Tensor::host({plan_.world});
    ring_.start(2 * step_, 0, barrier_);
  }

  void startTimed() {
    t0_ = Clock::now();
    ring_.start(2 * step_ + 1, 0, buffers_[current_]);
  }

  void finishTimed() {
    const double ms = std::chrono::duration<double, std::milli>(elapsed_).count();
    auto& m = (*out_)[size_];
    if (iter_ >= plan_.warmup) {
      m.min_ms = iter_ == plan_.warmup ? ms : std::min(m.min_ms, ms);
      m.sum_ms += ms;
    }
    m.wrong += countWrong(buffers_[current_], plan_.world);
    ++step_;
    ++iter_;
    current_ ^= 1;
    if (iter_ < plan_.warmup + plan_.iters) {
      fill(buffers_[current_], plan_.rank);
      startBarrier();
      return;
    }
    for (auto& b : buffers_)
      b = Tensor();
    if (++size_ < plan_.counts.size()) {
      startSize();
    } else {
      system().shutdown();
    }
  }

  BenchPlan plan_;
  std::shared_ptr<std::vector<Measured>> out_;
  std::shared_ptr<ChunkPool> pool_ = std::make_shared<ChunkPool>();
  actors::RingAllreduce ring_;
  std::int64_t reduced_ = -1;  // the step whose ring is done, until its chunks are written too
  int unwritten_ = 0;          // chunks sent from a buffer that the transport has not released
  Address next_;
  Tensor buffers_[2];
  Tensor barrier_;
  std::size_t size_ = 0;
  int iter_ = 0;
  int current_ = 0;
  std::int64_t step_ = 0;
  Clock::time_point t0_;
  Clock::duration elapsed_{};
};

std::string requireEnv(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    throw InputError(
        fmt::format("{} is not set: the allreduce worker is started by "
                    "`troupe bench allreduce`, not by hand",
                    name));
  }
  return v;
}

int intEnv(const char* name) {
  const std::string v = requireEnv(name);
  try {
    return std::stoi(v);
  } catch (const std::exception&) {
    throw InputError(fmt::format("{}='{}' is not an integer", name, v));
  }
}

}  // namespace

std::vector<AllreduceBenchRow> runAllreduceWorker(const AllreduceBenchOptions& o) {
  if (o.iters < 1) throw InputError("--iters: need at least one timed iteration");
  if (o.warmup < 0) throw InputError("--warmup cannot be negative");
  if (o.sizes_mb.empty()) throw InputError("--sizes: give at least one size");

  actors::ClusterOptions c;
  c.rank = intEnv("TROUPE_RANK");
  c.world = intEnv("TROUPE_NUM_WORKERS");
  c.run_id = requireEnv("TROUPE_RUN_ID");
  c.rendezvous = requireEnv("TROUPE_RENDEZVOUS");
  c.interface = o.interface;
  c.connections_per_peer = o.connections;
  c.secret = transport::loadSecret("");

  BenchPlan plan;
  plan.rank = c.rank;
  plan.world = c.world;
  for (double mb : o.sizes_mb) {
    if (!(mb > 0)) throw InputError(fmt::format("--sizes: {} MB is not a positive size", mb));
    plan.counts.push_back(
        std::max<std::int64_t>(1, std::llround(mb * 1e6 / static_cast<double>(sizeof(float)))));
  }
  plan.warmup = o.warmup;
  plan.iters = o.iters;
  const std::int64_t segment_bytes =
      o.segment_bytes > 0 ? o.segment_bytes : actors::ReducerConfig{}.segment_bytes;
  plan.segment_elements = segment_bytes / static_cast<std::int64_t>(sizeof(float));
  plan.copy = o.copy;

  auto cluster_ref = std::make_shared<actors::Cluster*>(nullptr);
  actors::SystemOptions system_options;
  system_options.node = static_cast<std::uint32_t>(c.rank);
  system_options.remote = [cluster_ref](Address from, Address to,
                                        std::unique_ptr<actors::Envelope> message) {
    (*cluster_ref)->send(from, to, std::move(message));
  };
  system_options.remote_buffer = [cluster_ref](Address to, kernels::Shape shape) {
    return (*cluster_ref)->sharedBuffer(to, std::move(shape));
  };
  auto system = actors::makeRuntime(system_options);
  auto measured = std::make_shared<std::vector<Measured>>();
  // Its own thread, as the training reducer has (it shares a replica's compute thread).
  system->spawn(std::make_unique<AllreduceBenchActor>(plan, measured),
                actors::SpawnOptions{.thread = "allreduce"});
  auto cluster = actors::joinCluster(c, *system);
  *cluster_ref = cluster.get();
  system->run();

  const auto all = rendezvous::exchange(
      cluster->store(), c.rank, c.world, encodeAllreduceRows([&] {
        std::vector<AllreduceBenchRow> mine;
        for (std::size_t i = 0; i < plan.counts.size(); ++i) {
          const auto& m = (*measured)[i];
          mine.push_back({o.sizes_mb[i], plan.counts[i], m.sum_ms / o.iters, m.min_ms, m.wrong});
        }
        return mine;
      }()),
      c.timeout, "allreduce-bench-results");
  cluster->finish();

  std::vector<AllreduceBenchRow> rows;
  for (const auto& text : all) {
    const auto theirs = decodeAllreduceRows(text);
    if (theirs.size() != plan.counts.size()) {
      throw InputError(fmt::format("allreduce bench: a process reported {} sizes, this one {}",
                                   theirs.size(), plan.counts.size()));
    }
    if (rows.empty()) {
      rows = theirs;
      continue;
    }
    for (std::size_t i = 0; i < rows.size(); ++i) {
      rows[i].time_ms = std::max(rows[i].time_ms, theirs[i].time_ms);
      rows[i].min_ms = std::min(rows[i].min_ms, theirs[i].min_ms);
      rows[i].wrong += theirs[i].wrong;
    }
  }
  return rows;
}

std::string formatAllreduceTable(const std::vector<AllreduceBenchRow>& rows, int world) {
  const double factor = 2.0 * (world - 1) / world;
  std::string out =
      fmt::format("{:>10} {:>12} {:>10} {:>10} {:>12} {:>12}  {}\n", "size(MB)", "count",
                  "time(ms)", "min(ms)", "algbw(GB/s)", "busbw(GB/s)", "check");
  for (const auto& r : rows) {
    const double bytes = static_cast<double>(r.count) * sizeof(float);
    const double algbw = bytes / (r.time_ms * 1e-3) / 1e9;
    out += fmt::format("{:>10.3f} {:>12} {:>10.3f} {:>10.3f} {:>12.3f} {:>12.3f}  {}\n", r.size_mb,
                       r.count, r.time_ms, r.min_ms, algbw, algbw * factor,
                       r.wrong == 0 ? "OK" : fmt::format("WRONG({})", r.wrong));
  }
  return out;
}

std::string encodeAllreduceRows(const std::vector<AllreduceBenchRow>& rows) {
  std::string out;
  for (const auto& r : rows)
    out += fmt::format("{} {} {} {} {}\n", r.size_mb, r.count, r.time_ms, r.min_ms, r.wrong);
  return out;
}

std::vector<AllreduceBenchRow> decodeAllreduceRows(const std::string& text) {
  std::vector<AllreduceBenchRow> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    AllreduceBenchRow r;
    if (!(fields >> r.size_mb >> r.count >> r.time_ms >> r.min_ms >> r.wrong)) {
      throw InputError(
          fmt::format("allreduce bench: malformed result line {}", rendezvous::quoted(line)));
    }
    rows.push_back(r);
  }
  return rows;
}

}  // namespace troupe::apps
