// torchrun's elastic model for `troupe launch --elastic MIN:MAX -- COMMAND` where COMMAND is not
// troupe's own (troupe train re-forms inside its processes instead, actors/run/elastic.h): a
// script written for torchrun, which resumes from its own checkpoint when it starts again.
//
// Each launcher of the run is an agent, as torchrun's are: the first one (it serves the embedded
// store, or was first on the store --rendezvous names) leads; another started with the same
// --run_id and --rendezvous joins with its -n workers. Whenever the members change (a worker
// fails, a launcher asks to join or stops beating), every agent stops all of its workers and the
// leader starts the next generation: a world of the workers left, ranked anew (the leader's
// first, then each joined launcher's in the order they joined), rank 0 on the leader's host with
// a fresh MASTER_PORT. A failed worker is left out of the next generation, as an elastic troupe
// train leaves out a failed process, and counts as a restart (TORCHELASTIC_RESTART_COUNT;
// --max-restarts of them at most); a join does not. Below MIN workers, the run fails.
//
// The agents meet on the run's store (under the run id, keys launch/...): the count of agents;
// each agent's record (its workers and host); each generation's record, written by the leader
// (world size, MASTER_ADDR and MASTER_PORT, restarts, and each member agent's id and workers);
// each joined agent's heartbeat and how its workers of a generation ended; the end of the run.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "actors/config/worker_bounds.h"
#include "actors/core/hosts.h"
#include "apps/launcher_run.h"
#include "apps/launcher_ssh.h"
#include "apps/output_relay.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/url.h"
#include "troupe/error.h"

namespace troupe::apps::launch_detail {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kTick = milliseconds(100);
// A joined launcher beats every kBeat; one that has not for kAgentTimeout is gone.
constexpr auto kBeat = milliseconds(500);
constexpr auto kAgentTimeout = seconds(10);
// How long a launcher waits to be admitted, and the leader for the others' workers to end once
// its own finished.
constexpr auto kRendezvousTimeout = seconds(60);
// After a failure of the leader's own workers: how long it looks for a cause elsewhere (another
// launcher's worker killed, or that launcher gone), which the failure may be a consequence of.
constexpr auto kSettle = milliseconds(1500);

std::string agentKey(int id) {
  return fmt::format("launch/agent/{}", id);
}
std::string beatKey(int id) {
  return fmt::format("launch/beat/{}", id);
}
std::string generationKey(int g) {
  return fmt::format("launch/generation/{}", g);
}
std::string endKey(int g, int id) {
  return fmt::format("launch/end/{}/{}", g, id);
}
constexpr const char* kAgents = "launch/agents";
constexpr const char* kOver = "launch/over";

// A generation as the leader writes it: "world=3 addr=10.0.0.2 port=29500 restarts=1
// members=0:2,1:1" (agent id:workers, in rank order).
struct Generation {
  int world = 0;
  std::string addr;
  int port = 0;
  int restarts = 0;
  std::vector<std::pair<int, int>> members;

  std::string encode() const {
    std::string m;
    for (const auto& [id, workers] : members)
      m += fmt::format("{}{}:{}", m.empty() ? "" : ",", id, workers);
    return fmt::format("world={} addr={} port={} restarts={} members={}", world, addr, port,
                       restarts, m);
  }
  // Error naming the record when it is not one.
  static Generation decode(const std::string& text) {
    try {
      return parse(text);
    } catch (const std::logic_error&) {  // std::stoi's
      throw Error(fmt::format("troupe launch: a malformed generation record '{}'", text));
    }
  }

 private:
  static Generation parse(const std::string& text) {
    Generation g;
    std::istringstream in(text);
    std::string word;
    while (in >> word) {
      const auto eq = word.find('=');
      if (eq == std::string::npos) continue;
      const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
      if (key == "world") g.world = std::stoi(value);
      if (key == "addr") g.addr = value;
      if (key == "port") g.port = std::stoi(value);
      if (key == "restarts") g.restarts = std::stoi(value);
      if (key == "members") {
        std::istringstream list(value);
        std::string member;
        while (std::getline(list, member, ',')) {
          const auto colon = member.find(':');
          g.members.emplace_back(std::stoi(member.substr(0, colon)),
                                 std::stoi(member.substr(colon + 1)));
        }
      }
    }
    if (g.world <= 0 || g.members.empty()) throw std::invalid_argument(text);
    return g;
  }

 public:
  // Agent `id`'s place; nullopt when it is no member.
  std::optional<std::pair<int, int>> placeOf(int id) const {  // (rank base, workers)
    int base = 0;
    for (const auto& [member, workers] : members) {
      if (member == id) return std::pair{base, workers};
      base += workers;
    }
    return std::nullopt;
  }
  int groupRankOf(int id) const {
    const auto it =
        std::find_if(members.begin(), members.end(), [&](const auto& m) { return m.first == id; });
    return static_cast<int>(it - members.begin());
  }
};

// A free TCP port of `addr` (an IPv4 address of this host), for MASTER_PORT; torchrun's 29500
// when `addr` is another host's.
int masterPortOn(const std::string& addr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  socklen_t size = sizeof at;
  const bool ok = fd >= 0 && ::inet_pton(AF_INET, addr.c_str(), &at.sin_addr) == 1 &&
                  ::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&at), &size) == 0;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!ok && error == EADDRNOTAVAIL) return 29500;
  if (!ok) {
    throw InputError(
        fmt::format("troupe launch: no free port on {} for MASTER_PORT ({}); name "
                    "one with --master_port",
                    addr, std::strerror(error)));
  }
  return ntohs(at.sin_port);
}

class Agent {
 public:
  Agent(const LaunchOptions& o, const std::vector<std::string>& command, const std::string& run_id,
        const std::string& secret, const std::vector<LaunchHost>& hosts, OutputRelay& relay)
      : o_(o),
        command_(command),
        run_id_(run_id),
        secret_(secret),
        hosts_(hosts),
        relay_(relay),
        bounds_(actors::parseNumWorkers(o.elastic)),
        kind_(o.launcher == "ssh" ? Kind::kSsh : Kind::kLocal) {
    own_ = o;
    own_.elastic.clear();  // each generation is a plain world to the supervisor
  }

  int run() {
    std::string rendezvous = o_.rendezvous;
    std::string bind = storeBindAddress(o_, hosts_);
    if (rendezvous.empty()) {
      server_ = rendezvous::startTcpStoreServer(bind, 0, secret_);
      rendezvous = "tcp://" + server_->address();
    }
    rendezvous_ = rendezvous;
    store_ = open();
    id_ = static_cast<int>(store_->add(kAgents, 1)) - 1;
    // Its workers, its host's name, and the address its rank 0 would serve MASTER_PORT on.
    store_->set(agentKey(id_), fmt::format("{} {} {}", o_.num_workers, actors::hostName(),
                                           kind_ == Kind::kSsh ? hosts_[0].name : bind));
    relay_.out(
        "[launcher] run {}: {} worker(s) {} an elastic run of {} (torchrun's model: every "
        "change of members restarts every worker), rendezvous {}{}",
        run_id_, o_.num_workers, id_ == 0 ? "lead" : "join", o_.elastic,
        rendezvous::redactedStoreUrl(rendezvous), server_ ? " (embedded store)" : "");
    return id_ == 0 ? lead(bind) : join();
  }

 private:
  std::unique_ptr<rendezvous::Store> open() const {
    return rendezvous::prefixStore(std::shared_ptr<rendezvous::Store>(
                                       rendezvous::openStore(rendezvous_, seconds(30), secret_)),
                                   run_id_);
  }

  // This launcher's workers of generation `g` (number `number`), `watch` polled meanwhile.
  Attempt runOwn(const Generation& g, int number, std::function<std::string()> watch) {
    const auto place = g.placeOf(id_);
    // A store that fails stops the workers (cleanly, remote ones too); the caller's next look at
    // it throws and says why.
    auto guarded = [watch = std::move(watch)]() -> std::string {
      try {
        return watch();
      } catch (const std::exception& e) {
        return fmt::format("the run's store failed ({})", e.what());
      }
    };
    AgentPlace agent{place->first, g.world, g.groupRankOf(id_), static_cast<int>(g.members.size()),
                     g.addr,       g.port,  g.restarts,         std::move(guarded)};
    own_.num_workers = place->second;
    const std::string ranks = place->second == 1 ? fmt::format("rank {}", place->first)
                                                 : fmt::format("ranks {} to {}", place->first,
                                                               place->first + place->second - 1);
    relay_.out(
        "[launcher] generation {}: {} worker(s) in all, this launcher's {}; MASTER_ADDR {} "
        "MASTER_PORT {}, restarts {}",
        number, g.world, ranks, g.addr, g.port, g.restarts);
    const RunContext run{own_, command_, run_id_, rendezvous_, hosts_, number, relay_, &agent};
    return runChildren(kind_, run);
  }

  // --- the leader ---

  int lead(const std::string& bind) {
    members_ = {{0, o_.num_workers}};
    addresses_[0] = kind_ == Kind::kSsh ? hosts_[0].name : bind;
    looked_ = 1;
    int restarts = 0;
    for (int number = 0;; ++number) {
      admit();
      // Fewer than MIN: torchrun's agents wait for more to join, as long as a rendezvous may last.
      const auto until = std::chrono::steady_clock::now() + kRendezvousTimeout;
      while (worldSize() < bounds_.min && std::chrono::steady_clock::now() < until) {
        if (stopSignal()) return over(128 + stopSignal(), "run stopped by a signal");
        std::this_thread::sleep_for(kTick);
        admit();
      }
      const int world = worldSize();
      if (world < bounds_.min) {
        return over(
            1, fmt::format("run failed: {} worker(s) within {} s, fewer than the {} of "
                           "--elastic {}{}",
                           world, std::chrono::duration_cast<seconds>(kRendezvousTimeout).count(),
                           bounds_.min, o_.elastic,
                           last_failure_.empty() ? "" : "; last: " + last_failure_));
      }
      // Rank 0: the first worker of the first launcher that has workers.
      const int first = std::find_if(members_.begin(), members_.end(), [](const auto& m) {
                          return m.second > 0;
                        })->first;
      Generation g;
      g.world = world;
      g.addr = o_.master_addr.empty() ? addresses_.at(first) : o_.master_addr;
      g.port = o_.master_port > 0                  ? o_.master_port
               : first == 0 && kind_ == Kind::kSsh ? 29500
                                                   : masterPortOn(g.addr);
      g.restarts = restarts;
      g.members.assign(members_.begin(), members_.end());
      store_->set(generationKey(number), g.encode());
      number_ = number;
      beats_.clear();
      change_ = {};
      Attempt a = members_.at(0) > 0 ? runOwn(g, number, [this] { return watchMembers(); })
                                     : waitForOthers();
      if (a.interrupted) return over(a.code, "run stopped by a signal");
      if (a.changed) {
        if (change_.failed >= 0) {
          leaveOut(change_.failed);
          ++restarts;
          last_failure_ = a.failure;
        }
        if (change_.gone >= 0) members_.erase(change_.gone);
        if (change_.failed >= 0 && restarts > o_.max_restarts) return giveUp(a, restarts);
        continue;
      }
      if (a.code == 0) return finish();
      // One of this launcher's workers failed: it may only have lost a peer of another launcher.
      const Change elsewhere = causeElsewhere(a);
      if (elsewhere.gone >= 0) {
        relay_.err("[launcher] {}; launcher {} is gone: the others restart without it", a.failure,
                   elsewhere.gone);
        members_.erase(elsewhere.gone);
        continue;
      }
      leaveOut(elsewhere.failed >= 0 ? elsewhere.failed : 0);
      ++restarts;
      last_failure_ = elsewhere.failed >= 0 ? elsewhere.what : a.failure;
      if (restarts > o_.max_restarts) return giveUp(a, restarts);
      relay_.err("[launcher] {}; restarting every worker without it (restart {} of {})",
                 last_failure_, restarts, o_.max_restarts);
    }
  }

  // One worker of launcher `id` failed: the next generation has one fewer of its workers (a
  // joined launcher with none left is no member; the leader stays, to lead).
  void leaveOut(int id) {
    if (--members_.at(id) == 0 && id != 0) members_.erase(id);
  }

  int worldSize() const {
    int world = 0;
    for (const auto& [id, workers] : members_)
      world += workers;
    return world;
  }

  // Launchers that asked to join since the last look: members while there is room, else told no.
  void admit() {
    const int registered = static_cast<int>(store_->add(kAgents, 0));
    for (int id = looked_; id < registered; ++id) {
      std::istringstream record(store_->get(agentKey(id), seconds(10)));
      int workers = 0;
      std::string host, address;
      record >> workers >> host >> address;
      if (workers < 1 || address.empty()) {
        store_->set(fmt::format("launch/refused/{}", id),
                    "its record on the store is no launcher's (workers, host, address)");
        relay_.err("[launcher] launcher {} is refused: a malformed record on the store", id);
        continue;
      }
      if (worldSize() + workers > bounds_.max) {
        store_->set(fmt::format("launch/refused/{}", id),
                    fmt::format("the run has {} worker(s) and takes at most {} (--elastic {})",
                                worldSize(), bounds_.max, o_.elastic));
        relay_.err(
            "[launcher] launcher {} on {} asks to join with {} worker(s): refused, the run "
            "has {} of at most {}",
            id, host, workers, worldSize(), bounds_.max);
        continue;
      }
      relay_.out("[launcher] launcher {} on {} joins with {} worker(s)", id, host, workers);
      members_[id] = workers;
      addresses_[id] = address;
    }
    looked_ = registered;
  }

  struct Change {
    int failed = -1;  // an agent one of whose workers failed
    int gone = -1;    // an agent that stopped beating
    std::string what;
  };

  // A joined launcher's workers of this generation ended: "ok", or "failed SIGNAL WHAT".
  std::optional<std::string> endOf(int id) {
    if (!store_->check({endKey(number_, id)})) return std::nullopt;
    return store_->get(endKey(number_, id), seconds(10));
  }

  // A launcher that has not beaten for kAgentTimeout (-1: none).
  int goneAgent(std::chrono::steady_clock::duration timeout) {
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [id, workers] : members_) {
      if (id == 0) continue;
      const auto beat = store_->add(beatKey(id), 0);
      auto& seen = beats_[id];
      if (seen.first != beat || seen.second == std::chrono::steady_clock::time_point{}) {
        seen = {beat, now};
      } else if (now - seen.second >= timeout) {
        return id;
      }
    }
    return -1;
  }

  // While the leader's workers run: why every worker must stop now; empty: none.
  std::string watchMembers() {
    if (static_cast<int>(store_->add(kAgents, 0)) > looked_) {
      const auto before = members_.size();
      admit();  // or refuses them, when the run is full
      if (members_.size() > before) return "a launcher joins the run";
    }
    for (const auto& [id, workers] : members_) {
      if (id == 0) continue;
      if (auto end = endOf(id); end && end->rfind("failed", 0) == 0) {
        change_.failed = id;
        return fmt::format("launcher {}: {}", id, end->substr(end->find(' ', 7) + 1));
      }
    }
    if (const int gone = goneAgent(kAgentTimeout); gone >= 0) {
      change_.gone = gone;
      return fmt::format("launcher {} has not been heard from for {} s", gone,
                         std::chrono::duration_cast<seconds>(kAgentTimeout).count());
    }
    return "";
  }

  // After one of the leader's own workers failed (not by a signal): a worker of another launcher
  // killed by a signal, or another launcher gone, within kSettle, is the cause.
  Change causeElsewhere(const Attempt& a) {
    Change c;
    if (a.by_signal) return c;
    const auto until = std::chrono::steady_clock::now() + kSettle;
    do {
      for (const auto& [id, workers] : members_) {
        if (id == 0) continue;
        if (auto end = endOf(id); end && end->rfind("failed 1 ", 0) == 0) {
          c.failed = id;
          c.what = fmt::format("launcher {}: {}", id, end->substr(9));
          return c;
        }
      }
      std::this_thread::sleep_for(kTick);
    } while (std::chrono::steady_clock::now() < until);
    c.gone = goneAgent(kSettle);
    return c;
  }

  // The leader has no workers left: it watches the others' until they end or something changes.
  Attempt waitForOthers() {
    for (;;) {
      if (const std::string why = watchMembers(); !why.empty()) return {0, why, false, true};
      const bool all_ok = std::all_of(members_.begin(), members_.end(), [&](const auto& m) {
        if (m.first == 0) return true;
        const auto end = endOf(m.first);
        return end && *end == "ok";
      });
      if (all_ok) return {};
      std::this_thread::sleep_for(kTick);
    }
  }

  // The leader's workers finished: the others' do too (they are one world); then the run is over.
  int finish() {
    const auto until = std::chrono::steady_clock::now() + kRendezvousTimeout;
    for (const auto& [id, workers] : members_) {
      if (id == 0) continue;
      while (!endOf(id) && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(kTick);
    }
    return over(0, "");
  }

  int giveUp(const Attempt& a, int restarts) {
    return over(a.code ? a.code : 1,
                fmt::format("run failed: {}; giving up after {} restart(s) (--max-restarts {})",
                            last_failure_.empty() ? a.failure : last_failure_, restarts - 1,
                            o_.max_restarts));
  }

  // Ends the run for every launcher: code and why ("" when it went well).
  int over(int code, const std::string& why) {
    store_->set(kOver, fmt::format("{} {}", code, why));
    if (why.empty()) {
      relay_.out("[launcher] the elastic run is over: every worker of generation {} exited 0",
                 number_);
    } else {
      relay_.err("[launcher] {}", why);
    }
    return code;
  }

  // --- a joined launcher ---

  int join() {
    // Beats from a thread (and a store client) of its own while this launcher lives.
    std::atomic<bool> stop{false};
    std::thread beat([this, &stop] {
      try {
        auto store = open();
        while (!stop) {
          store->add(beatKey(id_), 1);
          std::this_thread::sleep_for(kBeat);
        }
      } catch (const std::exception&) {
        // The leader is gone; the main loop finds out and says so.
      }
    });
    struct Joiner {
      std::atomic<bool>& stop;
      std::thread& t;
      ~Joiner() {
        stop = true;
        t.join();
      }
    } joined{stop, beat};
    try {
      return joinedRun();
    } catch (const Error& e) {
      relay_.err(
          "[launcher] launcher {}: the run's store at {} is gone or failed ({}): the run's "
          "leading launcher ended",
          id_, rendezvous::redactedStoreUrl(rendezvous_), e.what());
      return 1;
    }
  }

  // The first generation from `from` on that has this launcher, within the timeout; -1 when the
  // run is over first (`code` is then its exit code).
  int nextGeneration(int from, int& code) {
    const auto until = std::chrono::steady_clock::now() + kRendezvousTimeout;
    for (int g = from;;) {
      const std::string refused = fmt::format("launch/refused/{}", id_);
      if (store_->check({refused})) {
        code = 1;
        relay_.err("[launcher] launcher {} is refused: {}", id_, store_->get(refused, seconds(10)));
        return -1;
      }
      if (store_->check({kOver})) {
        std::istringstream(store_->get(kOver, seconds(10))) >> code;
        return -1;
      }
      if (store_->check({generationKey(g)})) {
        if (Generation::decode(store_->get(generationKey(g), seconds(10))).placeOf(id_)) return g;
        if (from > 0) {  // a member of the last one: its workers failed, and the run goes on
          code = 1;
          relay_.err(
              "[launcher] launcher {}: generation {} of run {} goes on without this "
              "launcher's workers, which failed",
              id_, g, run_id_);
          return -1;
        }
        ++g;
        continue;
      }
      if (std::chrono::steady_clock::now() >= until) {
        code = 1;
        relay_.err("[launcher] launcher {}: no generation of run {} took this launcher within {} s",
                   id_, run_id_, std::chrono::duration_cast<seconds>(kRendezvousTimeout).count());
        return -1;
      }
      std::this_thread::sleep_for(kTick);
    }
  }

  int joinedRun() {
    int code = 0;
    for (int number = nextGeneration(0, code); number >= 0;
         number = nextGeneration(number + 1, code)) {
      const Generation g = Generation::decode(store_->get(generationKey(number), seconds(10)));
      const std::string next = generationKey(number + 1);
      const Attempt a = runOwn(g, number, [&]() -> std::string {
        if (store_->check({next})) return "the run's leading launcher starts a new generation";
        if (store_->check({kOver})) return "the run is over";
        return "";
      });
      if (a.interrupted) return a.code;
      if (a.changed) continue;
      if (a.code == 0) {
        store_->set(endKey(number, id_), "ok");
        return 0;
      }
      store_->set(endKey(number, id_), fmt::format("failed {} {}", a.by_signal ? 1 : 0, a.failure));
    }
    return code;
  }

  const LaunchOptions& o_;
  LaunchOptions own_;
  const std::vector<std::string>& command_;
  const std::string& run_id_;
  const std::string& secret_;
  const std::vector<LaunchHost>& hosts_;
  OutputRelay& relay_;
  const actors::WorkerBounds bounds_;
  const Kind kind_;
  std::unique_ptr<rendezvous::TcpStoreServer> server_;
  std::string rendezvous_;
  std::unique_ptr<rendezvous::Store> store_;
  int id_ = 0;
  // The leader's.
  std::map<int, int> members_;            // agent id -> its workers, in rank order
  std::map<int, std::string> addresses_;  // agent id -> where its rank 0 would serve
  int looked_ = 1;                        // agents below it were admitted or refused
  int number_ = 0;                        // the generation running
  Change change_;                         // what a watch saw
  std::map<int, std::pair<std::int64_t, std::chrono::steady_clock::time_point>> beats_;
  std::string last_failure_;
};

}  // namespace

int runElasticAgents(const LaunchOptions& options, const std::vector<std::string>& command,
                     const std::string& run_id, const std::string& secret,
                     const std::vector<LaunchHost>& hosts, OutputRelay& relay) {
  return Agent(options, command, run_id, secret, hosts, relay).run();
}

}  // namespace troupe::apps::launch_detail
