#include "actors/run/elastic.h"

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

#include "actors/core/hosts.h"
#include "actors/core/peer.h"
#include "actors/core/run_id.h"
#include "actors/run/run_plan.h"
#include "actors/run/train_log.h"
#include "actors/run/trainer.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/url.h"
#include "rendezvous/value.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;

// How long a round's closer waits, once MIN live workers are in, for one more before it closes
// the round (torchelastic's last call). Survivors of a failure come within milliseconds of each
// other.
constexpr auto kLastCall = std::chrono::milliseconds(1000);
constexpr auto kPoll = std::chrono::milliseconds(20);
// A waiting member adds to its beat every kBeat; it is alive to the others while its beat moved
// within kStale (ten beats: a loaded host may miss a few). A round closes only while each of its
// live members is fresh, its beat moved within kFresh: one that stopped is left out once stale,
// not admitted in the meantime.
constexpr auto kBeat = std::chrono::milliseconds(200);
constexpr auto kStale = std::chrono::milliseconds(2000);
constexpr auto kFresh = std::chrono::milliseconds(600);
// The members of a round looked at, by index: more coming at once wait for a later round (and a
// count forged by a store client costs no more than this).
constexpr std::int64_t kMostComing = 256;

std::string roundKey(int round, std::string_view what) {
  return fmt::format("elastic/{}/{}", round, what);
}
std::string memberKey(int round, int index) {
  return roundKey(round, fmt::format("member/{}", index));
}
constexpr const char* kOpen = "elastic/open";      // the round new workers join
constexpr const char* kDone = "elastic/done";      // the run is over
constexpr const char* kFormed = "elastic/formed";  // a generation of the run formed
constexpr const char* kPrint = "elastic/plan";     // the run print, "name=value" lines
constexpr const char* kPrintClaim = "elastic/plan-claim";

std::string encode(const Member& m) {
  return fmt::format("{} {} {} {} {} {}", m.old_rank, m.launch_rank, m.step, m.epoch,
                     m.epoch_records, m.name);
}

// The indices a round's closer admitted ("0 2 3") as the store holds them; InputError naming the
// key for anything else (a store shared with something that is not troupe, or a corrupt value).
std::vector<int> parseAdmitted(const std::string& key, const std::string& text) {
  std::vector<int> admitted;
  std::istringstream in(text);
  for (std::string word; in >> word;) {
    int value = 0;
    const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
    if (ec != std::errc() || end != word.data() + word.size() || value < 0) {
      admitted.clear();
      break;
    }
    admitted.push_back(value);
  }
  if (admitted.empty()) {
    rendezvous::StoreValue("elastic rendezvous", key, text)
        .refuse("the indices of a round's members");
  }
  return admitted;
}

// One waiter's view of which members of a round are alive: those whose beat it saw move within
// kStale. A beat seen once, never moving, is no one's.
class Liveness {
 public:
  void observe(int index, std::int64_t beat, Clock::time_point now) {
    auto [it, first] = seen_.try_emplace(index, Seen{beat, Clock::time_point::min()});
    if (!first && beat >= 0 && it->second.beat != beat) it->second.moved = now;
    it->second.beat = beat;
  }
  // Its beat moved within `within`.
  bool moved(int index, Clock::time_point now, std::chrono::milliseconds within) const {
    const auto it = seen_.find(index);
    return it != seen_.end() && it->second.moved != Clock::time_point::min() &&
           now - it->second.moved <= within;
  }

 private:
  struct Seen {
    std::int64_t beat;
    Clock::time_point moved;
  };
  std::map<int, Seen> seen_;
};

Member decode(const std::string& text) {
  Member m;
  std::istringstream in(text);
  if (!(in >> m.old_rank >> m.launch_rank >> m.step >> m.epoch >> m.epoch_records >> m.name)) {
    throw InputError(
        fmt::format("elastic rendezvous: malformed member record {}", rendezvous::quoted(text)));
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

bool ElasticRendezvous::agreeOnRun(const std::string& run_id, const RunPrint& print) {
  if (store_->check({kDone})) return false;
  const auto [shown, mine] = storedPlan(print);
  if (store_->add(kPrintClaim, 1) == 1) {
    store_->set(kPrint, mine);
    return true;
  }
  const rendezvous::StoreValue run("elastic rendezvous", kPrint, store_->get(kPrint, timeout_));
  if (run.text() == mine) return true;
  const std::string differ = planDifferences(run.pairs(), shown, "the run");
  if (differ.empty()) run.refuse("a run print of name=value lines as this worker writes them");
  throw InputError(fmt::format("this worker disagrees with elastic run {} ({}); it was not counted",
                               run_id, differ));
}

std::int64_t ElasticRendezvous::beatOf(int round, int index) {
  // A beat is a counter: read by adding nothing, one round trip (0 where none beat yet, which
  // never moves). A key of another kind is an InputError naming it (parseCounter).
  return store_->add(roundKey(round, fmt::format("beat/{}", index)), 0);
}

// Members of the run (old rank >= 0) first, then newcomers, each in order of coming; at most MAX.
std::vector<int> ElasticRendezvous::admit(int round, const std::vector<int>& live) {
  std::vector<int> survivors, newcomers;
  for (const int i : live) {
    (decode(store_->get(memberKey(round, i), timeout_)).old_rank >= 0 ? survivors : newcomers)
        .push_back(i);
  }
  survivors.insert(survivors.end(), newcomers.begin(), newcomers.end());
  if (static_cast<int>(survivors.size()) > bounds_.max) survivors.resize(bounds_.max);
  std::sort(survivors.begin(), survivors.end());
  return survivors;
}

std::optional<std::vector<int>> ElasticRendezvous::awaitClose(int round, int index,
                                                              bool may_close) {
  const auto start = Clock::now();
  const std::string closed = roundKey(round, "closed");
  const std::string beat = roundKey(round, fmt::format("beat/{}", index));
  Liveness liveness;
  std::vector<int> live = {index}, last_live;
  auto changed = start, next_beat = start;
  bool fresh = true;        // every live member's beat moved within kFresh
  bool claim_lost = false;  // another waiter claimed the close: its list comes
  for (;;) {
    if (store_->check({closed})) return parseAdmitted(closed, store_->get(closed, timeout_));
    if (store_->check({kDone})) return std::nullopt;
    const auto now = Clock::now();
    if (now >= next_beat) {
      store_->add(beat, 1);
      next_beat = now + kBeat;
      if (may_close) {
        const auto count = std::min(store_->add(roundKey(round, "count"), 0), kMostComing);
        live.clear();
        for (int i = 0; i < static_cast<int>(count); ++i) {
          if (i != index) liveness.observe(i, beatOf(round, i), now);
          if (i == index || liveness.moved(i, now, kStale)) live.push_back(i);
        }
        if (index >= count) live.push_back(index);
        fresh = std::all_of(live.begin(), live.end(),
                            [&](int i) { return i == index || liveness.moved(i, now, kFresh); });
      }
    }
    if (may_close) {
      if (live != last_live) {
        last_live = live;
        changed = now;
      }
      const int n = static_cast<int>(live.size());
      const bool ready =
          fresh && (n >= bounds_.max || (n >= bounds_.min && now - changed >= kLastCall));
      if (ready && !claim_lost) {
        if (store_->add(roundKey(round, "close"), 1) == 1) {
          const auto admitted = admit(round, live);
          store_->set(closed, fmt::format("{}", fmt::join(admitted, " ")));
          store_->set(kFormed, "1");
          store_->set(kOpen, std::to_string(round + 1));
          return admitted;
        }
        claim_lost = true;
      }
    }
    if (now - start > timeout_) throwTimeout(round, may_close, live);
    std::this_thread::sleep_for(kPoll);
  }
}

void ElasticRendezvous::throwTimeout(int round, bool may_close, const std::vector<int>& live) {
  const double seconds = std::chrono::duration<double>(timeout_).count();
  if (may_close && store_->add(roundKey(round, "close"), 0) > 0) {
    throw TimeoutError(fmt::format(
        "elastic rendezvous round {}: the worker that claimed its close did not close it "
        "within {:g} s",
        round, seconds));
  }
  // A worker that came to join a running generation that has no room waits in vain.
  std::string why = may_close ? "start more workers, or lower MIN"
                              : "the run's workers are gone, or too busy to pause for it";
  const std::string before = roundKey(round - 1, "closed");
  if (round > 0 && store_->check({before}) &&
      static_cast<int>(parseAdmitted(before, store_->get(before, timeout_)).size()) >=
          bounds_.max) {
    why = fmt::format("the run's generation {} has MAX {} workers: none can join until one leaves",
                      round - 1, bounds_.max);
  }
  if (!may_close) {
    throw TimeoutError(fmt::format(
        "elastic rendezvous round {}: no worker of the run came to admit this one within {:g} s "
        "(num_workers {}:{}); {}",
        round, seconds, bounds_.min, bounds_.max, why));
  }
  std::vector<std::string> names;
  for (const int i : live) {
    if (store_->check({memberKey(round, i)}))
      names.push_back(decode(store_->get(memberKey(round, i), timeout_)).name);
  }
  throw TimeoutError(
      fmt::format("elastic rendezvous round {}: {} of at least {} workers (num_workers {}:{}) "
                  "came within {:g} s ({}); {}",
                  round, live.size(), bounds_.min, bounds_.min, bounds_.max, seconds,
                  fmt::join(names, ", "), why));
}

Generation ElasticRendezvous::join(const Member& me) {
  int round = static_cast<int>(store_->add(kOpen, 0));
  for (;;) {
    if (store_->check({kDone})) return overRun();
    // Only a member of the run closes a round once its first generation formed.
    const bool may_close = me.old_rank >= 0 || !store_->check({kFormed});
    const int index = static_cast<int>(store_->add(roundKey(round, "count"), 1) - 1);
    store_->set(memberKey(round, index), encode(me));
    const auto admitted = awaitClose(round, index, may_close);
    if (!admitted) return overRun();
    if (std::find(admitted->begin(), admitted->end(), index) == admitted->end()) {
      spdlog::info("elastic rendezvous round {} formed without this worker: waiting for the next",
                   round);
      ++round;
      continue;
    }
    std::vector<std::string> keys;
    for (const int i : *admitted)
      keys.push_back(memberKey(round, i));
    store_->wait(keys, timeout_);
    std::vector<Member> members;
    for (const auto& key : keys)
      members.push_back(decode(store_->get(key, timeout_)));
    const int size = static_cast<int>(members.size());
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
      if ((*admitted)[static_cast<std::size_t>(i)] == index)
        g.rank = static_cast<int>(g.members.size());
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
  if (world >= bounds_.max) return false;
  const int next = round + 1;
  const auto count = std::min(store_->add(roundKey(next, "count"), 0), kMostComing);
  std::lock_guard lock(mutex_);
  if (seen_round_ != next) {  // the rounds before are never looked at again: not kept
    seen_round_ = next;
    seen_.clear();
  }
  bool moved = false;
  for (int i = 0; i < static_cast<int>(count); ++i) {
    const std::int64_t beat = beatOf(next, i);
    const auto [it, first] = seen_.try_emplace(i, beat);
    if (!first && beat >= 0 && it->second != beat) moved = true;
    it->second = beat;
  }
  return moved;
}

void ElasticRendezvous::finishRun() {
  store_->set(kDone, "1");
}

TrainResult runElastic(
    const TrainOptions& o, const RunPrint& print,
    const std::function<TrainResult(const TrainOptions&, GenerationRole&)>& train) {
  const auto timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(o.rendezvous_timeout_s * 1000));
  // Started by hand, the worker that can bind the tcp:// address serves the store for the whole
  // run; the others (and workers of `troupe launch`, whose launcher serves it) are its clients.
  std::unique_ptr<rendezvous::TcpStoreServer> server;
  if (o.serve_store) {
    const auto url = rendezvous::parseStoreUrl(o.rendezvous);
    if (url.backend->embedded) {
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
  if (!rendezvous.agreeOnRun(o.run_id, print)) {
    spdlog::info("the run ended before this worker could join it");
    return {};
  }

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
