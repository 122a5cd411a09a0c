#include "actors/elastic.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <thread>
#include <tuple>

#include "actors/peer.h"
#include "actors/run_id.h"
#include "actors/run_plan.h"
#include "actors/train_log.h"
#include "actors/trainer.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/url.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;

// How long a round's leader waits, once MIN workers are in, for one more before it closes the
// round (torchelastic's last call). Survivors of a failure come within milliseconds of each other.
constexpr auto kLastCall = std::chrono::milliseconds(1000);
constexpr auto kPoll = std::chrono::milliseconds(20);

std::string roundKey(int round, std::string_view what) {
  return fmt::format("elastic/{}/{}", round, what);
}
constexpr const char* kOpen = "elastic/open";  // the round new workers join
constexpr const char* kDone = "elastic/done";

std::string encode(const Member& m) {
  return fmt::format("{} {} {} {} {} {}", m.old_rank, m.launch_rank, m.step, m.epoch,
                     m.epoch_records, m.name);
}

// A round's size as the store holds it; InputError naming the key for anything else (a store
// shared with something that is not troupe, or a corrupt value).
int roundSize(const std::string& key, const std::string& text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0) {
    throw InputError(fmt::format(
        "elastic rendezvous: the store's '{}' holds '{}', not a round's size", key, text));
  }
  return value;
}

Member decode(const std::string& text) {
  Member m;
  std::istringstream in(text);
  if (!(in >> m.old_rank >> m.launch_rank >> m.step >> m.epoch >> m.epoch_records >> m.name)) {
    throw InputError(fmt::format("elastic rendezvous: malformed member record '{}'", text));
  }
  return m;
}

// Whether `e`, or an exception nested in it, is a TimeoutError.
bool isTimeout(const std::exception& e) {
  return visitNested(
      e, [](const std::exception& x) { return dynamic_cast<const TimeoutError*>(&x) != nullptr; });
}

// Whether `e`, or an exception nested in it, is rank 0's word that another rank refused the plan.
bool isPlanRefused(const std::exception& e) {
  return visitNested(e, [](const std::exception& x) {
    return dynamic_cast<const PlanRefusedError*>(&x) != nullptr;
  });
}

std::string hostName() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// FNV-1a of the parameters' bytes: every worker's final parameters are bitwise the same.
std::uint64_t checksum(const kernels::Tensor& t) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(t.f32());
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()) * sizeof(float); ++i)
    h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

Generation overRun() {
  Generation g;
  g.run_over = true;
  return g;
}

}  // namespace

ElasticRendezvous::ElasticRendezvous(std::shared_ptr<rendezvous::Store> store, WorkerBounds bounds,
                                     std::chrono::milliseconds timeout)
    : store_(std::move(store)), bounds_(bounds), timeout_(timeout) {}

int ElasticRendezvous::lead(int round) {
  const auto start = Clock::now();
  std::int64_t last = -1;
  auto changed = start;
  for (;;) {
    const std::int64_t count = store_->add(roundKey(round, "count"), 0);
    if (count != last) {
      last = count;
      changed = Clock::now();
    }
    if (count >= bounds_.max) break;
    if (count >= bounds_.min && Clock::now() - changed >= kLastCall) break;
    if (store_->check({kDone})) return -1;  // the run ended while this worker waited to join
    if (Clock::now() - start > timeout_) {
      std::vector<std::string> names;
      for (std::int64_t i = 0; i < count; ++i) {
        if (store_->check({roundKey(round, fmt::format("member/{}", i))})) {
          names.push_back(
              decode(store_->get(roundKey(round, fmt::format("member/{}", i)), timeout_)).name);
        }
      }
      // A worker that came to join a running generation that has no room waits in vain.
      std::string why = "start more workers, or lower MIN";
      const std::string before = roundKey(round - 1, "closed");
      if (round > 0 && store_->check({before}) &&
          roundSize(before, store_->get(before, timeout_)) >= bounds_.max) {
        why = fmt::format(
            "the run's generation {} has MAX {} workers: none can join until one "
            "leaves",
            round - 1, bounds_.max);
      }
      throw TimeoutError(fmt::format(
          "elastic rendezvous round {}: {} of at least {} workers (num_workers {}:{}) came "
          "within {:g} s ({}); {}",
          round, count, bounds_.min, bounds_.min, bounds_.max,
          std::chrono::duration<double>(timeout_).count(), fmt::join(names, ", "), why));
    }
    std::this_thread::sleep_for(kPoll);
  }
  const std::int64_t size = std::min<std::int64_t>(last, bounds_.max);
  store_->set(roundKey(round, "closed"), std::to_string(size));
  store_->set(kOpen, std::to_string(round + 1));
  return static_cast<int>(size);
}

int ElasticRendezvous::waitClosed(int round) {
  const auto deadline = Clock::now() + timeout_ + kLastCall;
  const std::string closed = roundKey(round, "closed");
  for (;;) {
    if (store_->check({closed})) return roundSize(closed, store_->get(closed, timeout_));
    if (store_->check({kDone})) return -1;
    if (Clock::now() > deadline) {
      throw TimeoutError(fmt::format(
          "elastic rendezvous round {}: its first worker did not close it within {:g} s", round,
          std::chrono::duration<double>(timeout_).count()));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

Generation ElasticRendezvous::join(const Member& me) {
  int round = static_cast<int>(store_->add(kOpen, 0));
  for (;;) {
    if (store_->check({kDone})) return overRun();
    const int index = static_cast<int>(store_->add(roundKey(round, "count"), 1) - 1);
    store_->set(roundKey(round, fmt::format("member/{}", index)), encode(me));
    const int size = index == 0 ? lead(round) : waitClosed(round);
    if (size < 0) return overRun();
    if (index >= size) {
      spdlog::info("elastic rendezvous round {} formed without this worker: waiting for the next",
                   round);
      ++round;
      continue;
    }
    std::vector<std::string> keys;
    for (int i = 0; i < size; ++i)
      keys.push_back(roundKey(round, fmt::format("member/{}", i)));
    store_->wait(keys, timeout_);
    std::vector<Member> members;
    for (const auto& key : keys)
      members.push_back(decode(store_->get(key, timeout_)));
    // Ranks: the old ones' order first (the chief stays the chief), newcomers in order of coming.
    std::vector<int> order(static_cast<std::size_t>(size));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& x = members[static_cast<std::size_t>(a)];
      const auto& y = members[static_cast<std::size_t>(b)];
      return std::tuple(x.old_rank < 0, x.old_rank, x.launch_rank < 0, x.launch_rank) <
             std::tuple(y.old_rank < 0, y.old_rank, y.launch_rank < 0, y.launch_rank);
    });
    Generation g;
    g.round = round;
    for (const int i : order) {
      if (i == index) g.rank = static_cast<int>(g.members.size());
      g.members.push_back(members[static_cast<std::size_t>(i)]);
    }
    // The newest state: the most steps, the lowest rank among equals.
    for (int r = 1; r < g.world(); ++r) {
      if (g.members[static_cast<std::size_t>(r)].step >
          g.members[static_cast<std::size_t>(g.source)].step) {
        g.source = r;
      }
    }
    return g;
  }
}

bool ElasticRendezvous::joinerWaiting(int round, int world) {
  return world < bounds_.max && store_->check({roundKey(round + 1, "member/0")});
}

void ElasticRendezvous::finishRun() {
  store_->set(kDone, "1");
}

TrainResult runElastic(
    const TrainOptions& o,
    const std::function<TrainResult(const TrainOptions&, GenerationRole&)>& train) {
  const auto timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(o.rendezvous_timeout_s * 1000));
  // Started by hand, the worker that can bind the tcp:// address serves the store for the whole
  // run; the others (and workers of `troupe launch`, whose launcher serves it) are its clients.
  std::unique_ptr<rendezvous::TcpStoreServer> server;
  if (o.serve_store) {
    const auto url = rendezvous::parseStoreUrl(o.rendezvous);
    if (url.scheme == rendezvous::StoreUrl::Scheme::kTcp) {
      try {
        server = rendezvous::startTcpStoreServer(url.host, url.port, o.secret);
        spdlog::info(
            "this worker serves the rendezvous store at tcp://{} (the run needs it "
            "until its end)",
            server->address());
      } catch (const IoError&) {
        // Another worker serves it, or the address is another host's.
      }
    }
  }
  std::shared_ptr<rendezvous::Store> store =
      rendezvous::prefixStore(rendezvous::openStore(o.rendezvous, timeout, o.secret),
                              generationRunId(o.run_id, o.generation));
  ElasticRendezvous rendezvous(store, WorkerBounds{0, o.min_workers, o.max_workers}, timeout);

  Member me;
  me.name = fmt::format("{}:{}", hostName(), ::getpid());
  if (std::getenv("TROUPE_RANK")) me.launch_rank = o.shard_id;
  auto state = std::make_shared<TrainState>();
  auto carry = std::make_shared<EpochCarry>();
  std::unique_ptr<TrainLog> log;
  TrainResult total;
  for (;;) {
    me.step = state->step;
    me.epoch = state->epoch;
    me.epoch_records = state->epoch_records;
    const Generation g = rendezvous.join(me);
    if (g.run_over) {
      spdlog::info("the run ended before this worker could join it");
      return total;
    }
    const auto& source = g.members[static_cast<std::size_t>(g.source)];
    std::vector<std::string> names;
    for (const auto& m : g.members)
      names.push_back(m.name);
    spdlog::info(
        "generation {}: worker {} of {} ({}), from step {} (epoch {}, {} of its records "
        "trained), state from {}",
        g.round, g.rank, g.world(), fmt::join(names, ", "), std::max<std::int64_t>(0, source.step),
        source.epoch + 1, source.epoch_records, source.step < 0 ? "scratch" : source.name);

    GenerationRole role;
    role.run_id = fmt::format("{}-e{}", generationRunId(o.run_id, o.generation), g.round);
    role.start.step = std::max<std::int64_t>(0, source.step);
    role.start.epoch = source.epoch;
    role.start.epoch_records = source.epoch_records;
    role.state = state;
    if (source.step >= 0) {
      role.await_handover = g.members[static_cast<std::size_t>(g.rank)].step != source.step;
      if (g.rank == g.source) {
        for (int r = 0; r < g.world(); ++r) {
          if (g.members[static_cast<std::size_t>(r)].step != source.step)
            role.handover_to.push_back(r);
        }
      }
    }
    const int round = g.round, world = g.world();
    role.joiner_waiting = [&rendezvous, round, world] {
      return rendezvous.joinerWaiting(round, world);
    };
    role.carry = carry;
    role.log = &log;
    TrainOptions options = o;
    options.num_shards = world;
    options.shard_id = g.rank;
    options.serve_store = false;
    try {
      auto result = train(options, role);
      for (auto& e : result.epochs)
        total.epochs.push_back(e);
      for (auto& c : result.checkpoints)
        total.checkpoints.push_back(c);
      if (!result.log_path.empty()) {
        total.log_path = result.log_path;
        total.experiment_id = result.experiment_id;
      }
      total.steps = state->step;
      if (result.weights.defined()) total.weights = result.weights;
    } catch (const std::exception& e) {
      // A worker died or hung (or died while the generation was linking), or one refused the
      // generation's plan (and leaves): the others re-form.
      if (!findPeerError(e) && !isTimeout(e) && !isPlanRefused(e)) throw;
      spdlog::warn("generation {} lost a worker ({}): re-forming from step {}", round, e.what(),
                   state->step);
      me.old_rank = g.rank;
      continue;
    }
    me.old_rank = g.rank;
    if (state->step >= role.last_step) {
      spdlog::info("elastic run done at step {}: parameters checksum {:016x}", state->step,
                   checksum(state->weights));
      if (g.rank == 0) rendezvous.finishRun();
      // The worker that serves the store stays until every worker of the last generation is done.
      store->add(roundKey(round, "left"), 1);
      const auto deadline = Clock::now() + timeout;
      while (server && store->add(roundKey(round, "left"), 0) < world && Clock::now() < deadline) {
        std::this_thread::sleep_for(kPoll);
      }
      return total;
    }
  }
}

}  // namespace troupe::actors
