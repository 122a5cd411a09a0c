#include "actors/kvstore/kvstore_dist.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "actors/core/cluster.h"
#include "actors/core/messages.h"
#include "actors/core/peer.h"
#include "actors/core/status_of.h"
#include "actors/kvstore/kvstore_options.h"
#include "actors/roles/roles.h"
#include "actors/run/run_layout.h"
#include "actors/run/run_plan.h"
#include "kernels/backend.h"
#include "kernels/compression.h"
#include "kernels/optimizer.h"
#include "rendezvous/exchange.h"
#include "rendezvous/store.h"
#include "rendezvous/value.h"
#include "transport/link.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using std::chrono::milliseconds;

// A part of a key pulled: its first server key, its size, where its values go in the answer.
struct PullTarget {
  std::int64_t base = 0;
  std::int64_t size = 0;
  std::int64_t offset = 0;
};

// What the caller waits for: the servers' answers to its pull, or to its init or configure
// requests. The caller puts it in the Inbox before it sends; the client actor fills it in.
struct Awaited {
  bool acks = false;                // KvAcks, else PullReplies
  std::vector<PullTarget> targets;  // a pull's
  std::vector<float> values;        // a pull's, all targets one after the other
  std::vector<std::string> errors;  // the acks'
  std::size_t remaining = 0;        // answers still to come
  std::optional<PullHeld> held;     // a pull's: a server holds it for another worker
  std::promise<void> done;
};
struct Inbox {
  std::mutex mu;
  std::shared_ptr<Awaited> awaited;  // null: nothing asked
};

// Where the servers' answers to a worker's store arrive. The store's caller sends its requests
// itself, from its own thread and in the order of its calls (Cluster::send); answers can only come
// in through an actor, whose handlers (a copy, a count) run on the transport's thread as they
// arrive (SpawnOptions::inline_handlers): the caller waits for one thread's wake-up, not two.
class KvClient final : public Actor {
 public:
  KvClient(std::uint32_t worker, std::shared_ptr<Inbox> inbox)
      : Actor(fmt::format("kvstore/worker/{}", worker)), worker_(worker), inbox_(std::move(inbox)) {
    on<PullReply>([this](PullReply& r) { pulled(r); });
    on<PullHeld>([this](PullHeld& h) {
      std::lock_guard lock(inbox_->mu);
      auto& w = inbox_->awaited;
      if (!w || w->acks || w->remaining == 0) return late("a held pull's notice", h.step);
      w->held = h;
      if (h.final) finish();  // the server gave up on it: the caller reads why
    });
    on<KvAck>([this](KvAck& a) {
      std::lock_guard lock(inbox_->mu);
      auto& w = inbox_->awaited;
      if (!w || !w->acks || w->remaining == 0) return late("an answer to a request", a.id);
      if (!a.error.empty()) w->errors.push_back(a.error);
      if (--w->remaining == 0) finish();
    });
  }

 private:
  // The caller gave up on it (its wait timed out, naming the server): nothing to do.
  void late(const char* what, std::uint64_t id) const {
    spdlog::debug("kvstore: worker {} dropped {} ({}) that came after its wait", worker_, what, id);
  }

  void finish() {
    inbox_->awaited->done.set_value();
    inbox_->awaited.reset();
  }

  void pulled(const PullReply& r) {
    std::lock_guard lock(inbox_->mu);
    auto& w = inbox_->awaited;
    if (!w || w->acks || w->remaining == 0)
      return late("a pull answer", static_cast<std::uint64_t>(r.key_begin));
    // One answer per Pull: the parts it asked for, one after the other.
    std::int64_t covered = 0;
    const bool fits = r.key_begin < r.key_end && r.data.numel() == r.key_end - r.key_begin &&
                      r.data.dtype() == kernels::DType::kFloat32;
    for (const auto& t : w->targets) {
      if (fits && r.key_begin <= t.base && t.base + t.size <= r.key_end) {
        std::copy_n(r.data.f32() + (t.base - r.key_begin), t.size, w->values.data() + t.offset);
        covered += t.size;
      }
    }
    if (!fits || covered != r.key_end - r.key_begin) {
      throw InputError(fmt::format(
          "worker {}: a pull answer of {} values for keys [{}, {}), not of the keys pulled",
          worker_, r.data.numel(), r.key_begin, r.key_end));
    }
    if (--w->remaining == 0) finish();
  }

  std::uint32_t worker_;
  std::shared_ptr<Inbox> inbox_;
};

void checkPlace(const std::string& type, const TrainOptions& o) {
  if (o.num_servers < 1) {
    throw InputError(fmt::format(
        "kvstore '{}' needs parameter servers, and this run has none: start it with troupe "
        "launch -n WORKERS -s SERVERS -- PROGRAM (or MXNet's tools/launch.py, or the settings "
        "num_shards, num_servers, role, shard_id, rendezvous)",
        type));
  }
}

class DistKVStore final : public KVStore {
 public:
  DistKVStore(const std::string& type, const TrainOptions& o)
      : type_(type),
        options_(o),
        rank_(o.shard_id),
        peer_timeout_(fromSeconds(o.peer_timeout_s)),
        wait_limit_(peer_timeout_ +
                    peerTimeoutGrace(fromSeconds(o.stall_warning_s), peer_timeout_)) {
    checkPlace(type, o);
    if (o.role != ProcessRole::kWorker) {
      throw InputError(
          fmt::format("this process is {} {} of the run (role '{}'): it serves with "
                      "troupe::KVStore::runServer(), not create()",
                      roleName(o.role), o.shard_id, roleName(o.role)));
    }
    if (const char* bound = std::getenv("MXNET_KVSTORE_BIGARRAY_BOUND")) {
      char* end = nullptr;
      const long long v = std::strtoll(bound, &end, 10);
      if (end == bound || *end != '\0' || v < 1) {
        throw InputError(
            fmt::format("MXNET_KVSTORE_BIGARRAY_BOUND={}: not a whole number >= 1", bound));
      }
      bigarray_bound_ = v;
    }
    SpawnOptions inline_handlers;
    inline_handlers.inline_handlers = true;
    node_ = joinStore(type, o, rank_, std::make_unique<KvClient>(rank_, inbox_), inline_handlers,
                      std::make_shared<RunMembers>(o.num_shards, o.num_servers),
                      LostLinks::kServersOnly);
    client_ = Address{static_cast<std::uint32_t>(rank_), 0};
    const RunLayout layout(o.num_shards, o.num_servers, 1);
    for (int s = 0; s < o.num_servers; ++s) {
      servers_.push_back(layout.server(s));
      server_next_.push_back(static_cast<std::int64_t>(s) << kKvKeyShift);
    }
    thread_ = std::thread([this] {
      try {
        node_.system().run();
      } catch (const std::exception& e) {
        std::lock_guard lock(failure_mu_);
        failure_ = statusOf(e);
      }
      stopped_ = true;
    });
  }

  ~DistKVStore() override {
    try {
      Status s = failure();
      for (std::size_t i = 0; s && i < servers_.size(); ++i)
        s = sendTo(servers_[i], KvDone{static_cast<std::uint32_t>(rank_)});
      if (s) {
        node_.cluster->finish();
      } else {
        spdlog::error("kvstore: worker {} leaving the run: {}", rank_, s.message());
      }
    } catch (const std::exception& e) {
      spdlog::error("kvstore: worker {} leaving the run: {}", rank_, e.what());
    }
    node_.system().shutdown();
    thread_.join();
    node_.cluster.reset();
  }

  std::string type() const override { return type_; }
  int rank() const override { return rank_; }
  int numWorkers() const override { return options_.num_shards; }

  Status init(int key, std::span<const float> value) override {
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    if (Status s = checkInit(key, value.size(), keys_.count(key) > 0); !s) return s;
    Key k;
    k.size = static_cast<std::int64_t>(value.size());
    const int servers = static_cast<int>(servers_.size());
    if (k.size >= bigarray_bound_ && servers > 1) {
      for (int s = 0; s < servers; ++s)
        k.parts.push_back({s, k.size * s / servers, k.size * (s + 1) / servers});
    } else {
      k.parts.push_back({key % servers, 0, k.size});
    }
    // Each part takes the next keys of its server: every worker inits the same keys in the
    // same order (worker 0's outcome names where the key went, so a different order is caught).
    std::vector<std::int64_t> next = server_next_;
    for (auto& p : k.parts) {
      auto& at = next[static_cast<std::size_t>(p.server)];
      p.at = at;
      at += p.hi - p.lo;
    }
    const std::string placed = fmt::format("ok {} at {}", k.size, k.parts.front().at);
    const std::string outcome = fmt::format("kvstore-init-{}", key);
    if (rank_ == 0) {
      std::vector<std::pair<Address, KvInit>> requests;
      for (const auto& p : k.parts) {
        auto part = kernels::Tensor::host({p.hi - p.lo});
        std::copy_n(value.data() + p.lo, p.hi - p.lo, part.f32());
        requests.emplace_back(servers_[static_cast<std::size_t>(p.server)],
                              KvInit{next_id_++, static_cast<std::uint32_t>(rank_), client_.actor,
                                     p.at, p.at + p.hi - p.lo, part, key, p.lo});
      }
      if (Status s = ask(std::move(requests), fmt::format("the init of key {}", key)); !s) {
        publish(outcome, "error " + s.message());
        return s;
      }
      publish(outcome, placed);
    } else {
      auto got = awaitWorker0(outcome, fmt::format("init of key {}", key));
      if (!got) return got.status();
      if (got->rfind("error ", 0) == 0) return inputError(rendezvous::printable(got->substr(6)));
      if (*got != placed) {
        try {
          return inputError(initMismatch(key, *got, k.size, placed));
        } catch (const std::exception& e) {  // worker 0's outcome does not parse
          return statusOf(e);
        }
      }
    }
    server_next_ = next;
    k.residual.assign(static_cast<std::size_t>(k.size), 0.0f);
    keys_.emplace(key, std::move(k));
    return {};
  }

  using KVStore::pull;
  using KVStore::push;

  Status push(int key, const std::vector<std::span<const float>>& values, int) override {
    std::lock_guard lock(mu_);
    if (Status s = checkPush(key, values); !s) return s;
    return sendPushes({key}, {values});
  }

  Status push(const std::vector<int>& keys, const std::vector<std::span<const float>>& values,
              int) override {
    if (keys.size() != values.size()) {
      return inputError(fmt::format("push of {} keys with {} arrays", keys.size(), values.size()));
    }
    std::lock_guard lock(mu_);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (Status s = checkPush(keys[i], {values[i]}); !s) return s;
    }
    std::vector<std::vector<std::span<const float>>> arrays;
    for (const auto& v : values)
      arrays.push_back({v});
    return sendPushes(keys, arrays);
  }

  Status pull(int key, std::span<float> out, int priority) override {
    return pull(std::vector<int>{key}, std::vector<std::span<float>>{out}, priority);
  }

  Status pull(const std::vector<int>& keys, const std::vector<std::span<float>>& outs,
              int) override {
    if (keys.size() != outs.size()) {
      return inputError(fmt::format("pull of {} keys into {} arrays", keys.size(), outs.size()));
    }
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    auto awaited = std::make_shared<Awaited>();
    std::vector<Piece> pieces;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const auto it = keys_.find(keys[i]);
      if (it == keys_.end()) return neverInitialised("pull", keys[i]);
      if (std::count(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(i), keys[i])) {
        return inputError(fmt::format("pull of key {}: twice in one pull", keys[i]));
      }
      const auto& k = it->second;
      if (static_cast<std::int64_t>(outs[i].size()) != k.size) {
        return inputError(fmt::format("pull of key {}: room for {} values, the key's has {}",
                                      keys[i], outs[i].size(), k.size));
      }
      const auto offset = static_cast<std::int64_t>(awaited->values.size());
      awaited->values.resize(awaited->values.size() + static_cast<std::size_t>(k.size));
      for (const auto& p : k.parts) {
        awaited->targets.push_back({p.at, p.hi - p.lo, offset + p.lo});
        pieces.push_back({p.server, p.at, p.hi - p.lo, k.pushes, nullptr});
      }
    }
    std::vector<std::pair<Address, Pull>> pulls;
    std::vector<Address> asked;
    for (const auto& run : runs(std::move(pieces))) {
      const Address server = servers_[static_cast<std::size_t>(run.front().server)];
      if (std::find(asked.begin(), asked.end(), server) == asked.end()) asked.push_back(server);
      pulls.emplace_back(
          server, Pull{run.front().step, static_cast<std::uint32_t>(rank_), false, run.front().at,
                       run.back().at + run.back().size, client_.actor});
    }
    awaited->remaining = pulls.size();
    const std::string what = keys.size() == 1 ? fmt::format("the pull of key {}", keys[0])
                                              : fmt::format("the pull of keys {}", keys);
    if (Status s = exchange(awaited, std::move(pulls), what, asked); !s) return s;
    std::size_t at = 0;
    for (const auto& out : outs) {
      std::copy_n(awaited->values.begin() + static_cast<std::ptrdiff_t>(at), out.size(),
                  out.begin());
      at += out.size();
    }
    return {};
  }

  Status setOptimizer(const OptimizerSpec& o) override {
    auto settings = optimizerOf(o);
    if (!settings) return settings.status();
    std::lock_guard lock(mu_);
    KvConfigure next = configure_;
    next.has_optimizer = true;
    next.learning_rate = o.learning_rate;
    next.rescale_grad = o.rescale_grad;
    next.optimizer = settings.value();
    next.new_optimizer = true;
    return configure(next, "setOptimizer");
  }

  Status setGradientCompression(const std::string& type, float threshold) override {
    auto spec = compressionSpecOf(type, threshold);
    if (!spec) return spec.status();
    std::lock_guard lock(mu_);
    KvConfigure next = configure_;
    next.new_optimizer = false;
    next.compression = static_cast<std::uint8_t>(spec->type);
    next.threshold = threshold;
    if (Status s = configure(next, "setGradientCompression"); !s) return s;
    compression_ = spec.value();
    return {};
  }

  Status barrier() override {
    std::lock_guard lock(mu_);
    if (Status s = failure(); !s) return s;
    try {
      rendezvous::barrier(node_.cluster->store(), fmt::format("kvstore-barrier-{}", barriers_++),
                          rank_, options_.num_shards, wait_limit_);
    } catch (const std::exception& e) {
      return statusOf(e);
    }
    return {};
  }

 private:
  struct Part {
    int server = 0;
    std::int64_t lo = 0, hi = 0;  // of the key's values
    std::int64_t at = 0;          // the server's key of value lo
  };
  struct Key {
    std::int64_t size = 0;
    std::vector<Part> parts;
    std::int64_t pushes = 0;      // by this worker
    std::vector<float> residual;  // 2bit compression
  };

  static Status inputError(std::string message) { return {ErrorKind::kInput, std::move(message)}; }
  static Status neverInitialised(const char* what, int key) {
    return inputError(
        fmt::format("{} of key {}: the key was never initialised (init it first)", what, key));
  }

  // A push's arrays fit the key, and the store can apply it.
  Status checkPush(int key, const std::vector<std::span<const float>>& values) const {
    if (Status s = failure(); !s) return s;
    const auto it = keys_.find(key);
    if (it == keys_.end()) return neverInitialised("push", key);
    if (values.empty()) return inputError(fmt::format("push of key {}: no array", key));
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (static_cast<std::int64_t>(values[i].size()) != it->second.size) {
        return inputError(fmt::format("push of key {}: array {} has {} values, the key's has {}",
                                      key, i, values[i].size(), it->second.size));
      }
    }
    if (type_ != "dist_sync" && !configure_.has_optimizer) {
      return inputError(fmt::format(
          "push of key {}: a {} store applies pushes with its optimizer, and none is set "
          "(setOptimizer first)",
          key, type_));
    }
    return {};
  }

  // Values of one server's keys [at, at + size) at push or pull `step`.
  struct Piece {
    int server = 0;
    std::int64_t at = 0, size = 0, step = 0;
    const float* values = nullptr;  // a push's
  };

  // Pieces in runs of adjacent keys of one server at one step: a message each.
  static std::vector<std::vector<Piece>> runs(std::vector<Piece> pieces) {
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
      return std::pair{a.server, a.at} < std::pair{b.server, b.at};
    });
    std::vector<std::vector<Piece>> out;
    for (const auto& p : pieces) {
      if (!out.empty()) {
        const Piece& last = out.back().back();
        if (last.server == p.server && last.at + last.size == p.at && last.step == p.step) {
          out.back().push_back(p);
          continue;
        }
      }
      out.push_back({p});
    }
    return out;
  }

  // Sends the sums of each key's arrays (checked) to the servers of its parts: uncompressed, the
  // parts of adjacent keys on one server in one message; compressed, a message a part.
  Status sendPushes(const std::vector<int>& keys,
                    const std::vector<std::vector<std::span<const float>>>& arrays) {
    std::vector<kernels::Tensor> sums;
    std::vector<Piece> pieces;
    std::vector<std::pair<Address, Push>> pushes;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto& k = keys_.at(keys[i]);
      const auto& values = arrays[i];
      auto sum = kernels::Tensor::host({k.size});
      float* s = sum.f32();
      std::copy(values[0].begin(), values[0].end(), s);
      for (std::size_t a = 1; a < values.size(); ++a) {
        for (std::int64_t j = 0; j < k.size; ++j)
          s[j] += values[a][static_cast<std::size_t>(j)];
      }
      for (const auto& p : k.parts) {
        if (compression_.type == kernels::GradientCompression::kNone) {
          pieces.push_back({p.server, p.at, p.hi - p.lo, k.pushes, s + p.lo});
          continue;
        }
        pushes.emplace_back(
            servers_[static_cast<std::size_t>(p.server)],
            Push{k.pushes, static_cast<std::uint32_t>(rank_), p.at, p.at + p.hi - p.lo,
                 kernels::encode(compression_, s + p.lo, k.residual.data() + p.lo, p.hi - p.lo)});
      }
      ++k.pushes;
      sums.push_back(std::move(sum));
    }
    for (const auto& run : runs(std::move(pieces))) {
      const std::int64_t begin = run.front().at, end = run.back().at + run.back().size;
      auto data = kernels::Tensor::host({end - begin});
      for (const auto& p : run)
        std::copy_n(p.values, p.size, data.f32() + (p.at - begin));
      pushes.emplace_back(
          servers_[static_cast<std::size_t>(run.front().server)],
          Push{run.front().step, static_cast<std::uint32_t>(rank_), begin, end, std::move(data)});
    }
    for (auto& [to, push] : pushes) {
      if (Status s = sendTo(to, std::move(push)); !s) return s;
    }
    return {};
  }

  Status failure() const {
    std::lock_guard lock(failure_mu_);
    if (!failure_.isOk()) return failure_;
    if (stopped_) return {ErrorKind::kInternal, "the store's actor system has stopped"};
    return {};
  }

  // Sends `message` to a server, from the caller's thread as from the client actor (where the
  // answers go).
  template <typename M>
  Status sendTo(Address to, M message) {
    try {
      node_.cluster->send(client_, to, std::make_unique<Typed<M>>(std::move(message)));
    } catch (const transport::LinkLostError& e) {
      // The server is gone: name it, as the run's failure (which may not be in yet) does.
      return statusOf(lostLinkError(node_.members->ofNode(to.node), e.what()));
    } catch (const std::exception& e) {
      if (Status s = failure(); !s) return s;  // the lost link's PeerError comes first
      return statusOf(e);
    }
    return {};
  }

  // Sends `requests`, then waits up to peer_timeout and a grace for `awaited` to be done; the
  // run's failure ends the wait too.
  template <typename M>
  Status exchange(const std::shared_ptr<Awaited>& awaited,
                  std::vector<std::pair<Address, M>> requests, const std::string& what,
                  const std::vector<Address>& asked) {
    auto done = awaited->done.get_future();
    {
      std::lock_guard lock(inbox_->mu);
      inbox_->awaited = awaited;
    }
    auto forget = [&] {
      std::lock_guard lock(inbox_->mu);
      if (inbox_->awaited == awaited) inbox_->awaited.reset();
    };
    for (auto& [to, request] : requests) {
      if (Status s = sendTo(to, std::move(request)); !s) {
        forget();
        return s;
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + wait_limit_;
    // A server that holds the pull for another worker named it: that worker is the culprit.
    const auto heldFor = [&](bool final) -> std::optional<Status> {
      std::lock_guard lock(inbox_->mu);
      if (!awaited->held || (final && !awaited->held->final)) return std::nullopt;
      const auto& reason = awaited->held->reason;
      return Status{ErrorKind::kPeer, fmt::format("worker {}: {}", rank_,
                                                  rendezvous::printable(reason, reason.size()))};
    };
    while (done.wait_for(milliseconds(20)) != std::future_status::ready) {
      if (Status s = failure(); !s) {
        forget();
        // A server that gave up on the pull said why before its link closed.
        if (auto held = heldFor(true)) return *held;
        return s;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        forget();
        if (auto held = heldFor(false)) return *held;
        std::vector<std::string> names;
        for (const auto& a : asked)
          names.push_back(node_.members->ofNode(a.node).str());
        return {ErrorKind::kPeer,
                fmt::format("worker {}: no answer from {} to {} within {:g} s (peer_timeout {:g} "
                            "s + grace): hung or gone",
                            rank_, fmt::join(names, ", "), what,
                            std::chrono::duration<double>(wait_limit_).count(),
                            options_.peer_timeout_s)};
      }
    }
    if (auto held = heldFor(true)) return *held;
    return {};
  }

  // Sends KvInit or KvConfigure requests and waits for every server's answer.
  template <typename M>
  Status ask(std::vector<std::pair<Address, M>> requests, const std::string& what) {
    std::vector<Address> asked;
    for (const auto& r : requests)
      asked.push_back(r.first);
    auto awaited = std::make_shared<Awaited>();
    awaited->acks = true;
    awaited->remaining = requests.size();
    if (Status s = exchange(awaited, std::move(requests), what, asked); !s) return s;
    if (!awaited->errors.empty())
      return inputError(fmt::format("{}", fmt::join(awaited->errors, "; ")));
    return {};
  }

  void publish(const std::string& key, const std::string& value) {
    node_.cluster->store().set(key, value);
  }

  // What worker 0 published under `key`, waiting up to the longer of peer_timeout and
  // rendezvous_timeout.
  Result<std::string> awaitWorker0(const std::string& key, const std::string& what) {
    const auto limit = std::max(wait_limit_, fromSeconds(options_.rendezvous_timeout_s));
    try {
      return node_.cluster->store().get(key, limit);
    } catch (const TimeoutError&) {
      return Status{ErrorKind::kPeer,
                    fmt::format("worker {}: {}: {} did not do it within {:g} s (every worker "
                                "makes the same calls; worker 0's count)",
                                rank_, what, node_.members->worker(0).str(),
                                std::chrono::duration<double>(limit).count())};
    } catch (const std::exception& e) {
      return statusOf(e);
    }
  }

  // Worker 0 sends the servers `next`; the others wait until it has.
  Status configure(const KvConfigure& next, const char* call) {
    if (Status s = failure(); !s) return s;
    const std::string outcome = fmt::format("kvstore-configure-{}", configures_++);
    if (rank_ == 0) {
      std::vector<std::pair<Address, KvConfigure>> requests;
      for (const auto& server : servers_) {
        KvConfigure m = next;
        m.id = next_id_++;
        m.worker = 0;
        m.reply_actor = client_.actor;
        requests.emplace_back(server, m);
      }
      if (Status s = ask(std::move(requests), call); !s) {
        publish(outcome, "error " + s.message());
        return s;
      }
      publish(outcome, "ok");
    } else {
      auto got = awaitWorker0(outcome, call);
      if (!got) return got.status();
      if (got->rfind("error ", 0) == 0) return inputError(rendezvous::printable(got->substr(6)));
    }
    configure_ = next;
    return {};
  }

  std::string type_;
  TrainOptions options_;
  int rank_;
  milliseconds peer_timeout_, wait_limit_;
  std::int64_t bigarray_bound_ = 1000000;  // MXNet's MXNET_KVSTORE_BIGARRAY_BOUND
  Node node_;
  Address client_;
  std::vector<Address> servers_;
  std::shared_ptr<Inbox> inbox_ = std::make_shared<Inbox>();
  std::vector<std::int64_t> server_next_;  // per server, the key its next part takes
  std::thread thread_;
  mutable std::mutex failure_mu_;
  Status failure_;
  std::atomic<bool> stopped_{false};

  std::mutex mu_;  // one call at a time
  std::map<int, Key> keys_;
  KvConfigure configure_;
  kernels::CompressionSpec compression_;
  std::uint64_t next_id_ = 1;
  int configures_ = 0;
  int barriers_ = 0;
};

}  // namespace

Node joinStore(const std::string& type, const TrainOptions& o, int rank,
               std::unique_ptr<Actor> actor, SpawnOptions spawn,
               std::shared_ptr<RunMembers> members, LostLinks lost) {
  Node n;
  n.node = makeNodeSystem(rank, 1, true);
  const Address judge = n.node.system->spawn(std::move(actor), std::move(spawn));
  n.members = std::move(members);
  ClusterOptions c =
      clusterOptions(o, o.run_id, rank, o.num_shards + o.num_servers, *n.node.system, *n.members);
  if (lost == LostLinks::kActorJudges) {
    // Never blocks (a timer, not a mailbox with room to wait for): the loss may be reported on
    // the judge's own thread, by one of its sends.
    c.on_peer_lost = [system = n.node.system.get(), judge](int peer, const std::string& address,
                                                           const std::string& why) {
      system->after(std::chrono::milliseconds(0), judge,
                    LinkLost{static_cast<std::uint32_t>(peer), address, why});
    };
  } else if (lost == LostLinks::kServersOnly) {
    c.on_peer_lost = [fail = c.on_peer_lost, workers = o.num_shards](
                         int peer, const std::string& address, const std::string& why) {
      if (peer >= workers) return fail(peer, address, why);
      spdlog::info("kvstore: worker {} left ({}): the servers judge whether it was done", peer,
                   why);
    };
  }
  n.cluster = joinCluster(c, *n.node.system);
  *n.node.cluster = n.cluster.get();
  n.members->setAddresses(n.cluster->addresses());

  // Every process must run the same kind of store: worker 0's is the run's.
  const Peer me = n.members->ofNode(static_cast<std::uint32_t>(rank));
  if (rank == 0) {
    n.cluster->store().set("kvstore-type", type);
  } else {
    const auto theirs = n.cluster->store().get("kvstore-type", c.timeout);
    if (theirs != type) {
      throw InputError(
          fmt::format("{} made a '{}' store, worker 0 a {} one: every process of "
                      "a run must make the same kind",
                      me.str(), type, rendezvous::quoted(theirs)));
    }
  }
  return n;
}

std::string initMismatch(int key, const std::string& got, std::int64_t n,
                         const std::string& placed) {
  const rendezvous::StoreValue value("worker", fmt::format("kvstore-init-{}", key), got);
  const auto words = value.words();
  if (words.size() != 4 || words[0] != "ok" || words[2] != "at") value.refuse("'ok N at BASE'");
  const auto theirs =
      value.integer(words[1], 0, std::numeric_limits<std::int64_t>::max(), "a count of values");
  return fmt::format(
      "init of key {}: worker 0 inited it with {} values, this worker with {}, or in another "
      "order of keys (worker 0: {}, here: '{}')",
      key, theirs, n, rendezvous::quoted(got), placed);
}

bool isDistributedKVStore(const std::string& type) {
  return type == "dist_sync" || type == "dist_async" || type == "ssp";
}

std::unique_ptr<KVStore> makeDistKVStore(const std::string& type, const TrainOptions& options) {
  return std::make_unique<DistKVStore>(type, options);
}

void serveKVStore(const std::string& type, const TrainOptions& o) {
  checkPlace(type, o);
  if (o.role != ProcessRole::kServer) {
    throw InputError(
        fmt::format("this process is worker {} of the run, not a server: it makes "
                    "its store with troupe::KVStore::create()",
                    o.shard_id));
  }
  ServerConfig config;
  config.kvstore = true;
  config.index = o.shard_id;
  config.num_workers = o.num_shards;
  // The server modes are the store types (whose servers sum on the CPU); the staleness is the
  // run's key.
  ScheduleKeys keys = o.schedule.keys();
  keys.schedule = type;
  keys.reducer = "troupe";
  const ParameterServers servers = *makeSchedule(keys).servers();
  config.mode = servers.mode;
  config.staleness = servers.staleness;
  config.threads = o.threads > 0 ? o.threads : 1;
  const int rank = o.num_shards + o.shard_id;
  auto members = std::make_shared<RunMembers>(o.num_shards, o.num_servers);
  config.run = roleContext(o, nullptr, 0, members);
  Node node =
      joinStore(type, o, rank, makeServer(fmt::format("kvstore/server/{}", o.shard_id), config),
                SpawnOptions{.thread = "server"}, members, LostLinks::kActorJudges);
  spdlog::info("kvstore server {} of {} ({}) serves {} workers", o.shard_id, o.num_servers, type,
               o.num_shards);
  node.system().run();
  node.cluster->finish();
}

}  // namespace troupe::actors
