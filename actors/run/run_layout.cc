// troupe::Topology (troupe/topology.h); actors/run/run_layout.h is its throwing face inside troupe.
#include "troupe/topology.h"

#include <fmt/format.h>

#include <charconv>
#include <string_view>
#include <vector>

namespace troupe {
namespace {

// A worker's actors in the order every worker spawns them: one of each role, or one a replica.
// Where each actor is (its slot on its worker's node) follows from this table alone.
struct WorkerRole {
  std::string_view name;
  bool per_replica;
};
// The readers come last: a process of replicas fed by one reader (shared_reader) spawns fewer.
enum Role { kCoordinator, kUpdater, kReducer, kReplica, kStage, kReader, kRoles };
constexpr WorkerRole kWorkerRoles[kRoles] = {{"coordinator", false}, {"updater", false},
                                             {"reducer", false},     {"replica", true},
                                             {"stage", false},       {"reader", true}};

int countOf(int role, int replicas) {
  return kWorkerRoles[role].per_replica ? replicas : 1;
}

// Actor `index` of `role` on worker `worker`. The roles before the first one a replica have the
// same slots whatever the replicas (Topology's static accessors pass 0).
Topology::Address slot(int worker, int role, int index, int replicas) {
  int actor = index;
  for (int r = 0; r < role; ++r)
    actor += countOf(r, replicas);
  return Topology::Address{static_cast<std::uint32_t>(worker), static_cast<std::uint32_t>(actor)};
}

// "replica/1/0" -> {"replica", 1, 0}; the numbers are -1 when absent or not numbers.
struct Parsed {
  std::string role;
  std::vector<int> indices;
};

Parsed parse(const std::string& name) {
  Parsed p;
  std::size_t at = name.find('/');
  p.role = name.substr(0, at);
  while (at != std::string::npos) {
    const std::size_t next = name.find('/', at + 1);
    const std::string part = name.substr(at + 1, next == std::string::npos ? next : next - at - 1);
    int value = -1;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    p.indices.push_back(ec == std::errc() && end == part.data() + part.size() ? value : -1);
    at = next;
  }
  return p;
}

}  // namespace

Topology::Address Topology::coordinator(int worker) {
  return slot(worker, kCoordinator, 0, 0);
}
Topology::Address Topology::updater(int worker) {
  return slot(worker, kUpdater, 0, 0);
}
Topology::Address Topology::reducer(int worker) {
  return slot(worker, kReducer, 0, 0);
}
Topology::Address Topology::replica(int worker, int r) {
  return slot(worker, kReplica, r, 0);
}
Topology::Address Topology::reader(int worker, int r) const {
  return slot(worker, kReader, r, replicas_);
}
Topology::Address Topology::stage(int worker) const {
  return slot(worker, kStage, 0, replicas_);
}
Topology::Address Topology::server(int s) const {
  return Address{static_cast<std::uint32_t>(workers_ + s), 0};
}

std::uint32_t Topology::actorsPerWorker() const {
  return slot(0, kRoles, 0, replicas_).actor;
}

Result<Topology> Topology::create(int workers, int servers, int replicas) {
  if (workers < 1 || servers < 0 || replicas < 1) {
    return Status(ErrorKind::kInput,
                  fmt::format("no run has {} worker(s), {} server(s) and {} replica(s) a worker "
                              "(at least 1 worker, 0 servers and 1 replica)",
                              workers, servers, replicas));
  }
  return Topology(workers, servers, replicas);
}

Result<Topology::Address> Topology::find(const std::string& name) const {
  const Parsed p = parse(name);
  const auto in = [](int i, int n) { return i >= 0 && i < n; };
  const auto& i = p.indices;
  for (int role = 0; role < kRoles; ++role) {
    if (p.role != kWorkerRoles[role].name) continue;
    const bool per_replica = kWorkerRoles[role].per_replica;
    if (i.size() == (per_replica ? 2u : 1u) && in(i[0], workers_) &&
        (!per_replica || in(i[1], replicas_))) {
      return slot(i[0], role, per_replica ? i[1] : 0, replicas_);
    }
  }
  if (i.size() == 1 && p.role == "server" && in(i[0], servers_)) return server(i[0]);
  return Status(ErrorKind::kInput,
                fmt::format("no actor '{}' in a run of {} worker(s), {} server(s) and {} "
                            "replica(s) a worker (names: coordinator/N, updater/N, reducer/N, "
                            "replica/N/I, reader/N/I, stage/N, server/S)",
                            name, workers_, servers_, replicas_));
}

std::string Topology::nameOf(Address a) const {
  const int node = static_cast<int>(a.node), actor = static_cast<int>(a.actor);
  if (node >= workers_ && node < workers_ + servers_ && actor == 0) {
    return fmt::format("server/{}", node - workers_);
  }
  if (node < workers_) {
    for (int role = 0, first = 0; role < kRoles; first += countOf(role, replicas_), ++role) {
      if (actor < first || actor >= first + countOf(role, replicas_)) continue;
      if (!kWorkerRoles[role].per_replica)
        return fmt::format("{}/{}", kWorkerRoles[role].name, node);
      return fmt::format("{}/{}/{}", kWorkerRoles[role].name, node, actor - first);
    }
  }
  return fmt::format("node {} actor {}", node, actor);
}

std::vector<std::string> Topology::names() const {
  std::vector<std::string> all;
  for (int w = 0; w < workers_; ++w) {
    for (std::uint32_t a = 0; a < actorsPerWorker(); ++a)
      all.push_back(nameOf(Address{static_cast<std::uint32_t>(w), a}));
  }
  for (int s = 0; s < servers_; ++s)
    all.push_back(nameOf(server(s)));
  return all;
}

}  // namespace troupe
