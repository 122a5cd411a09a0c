// troupe::Topology (troupe/topology.h); actors/run/run_layout.h is its throwing face inside troupe.
#include "troupe/topology.h"

#include <fmt/format.h>

#include <charconv>
#include <vector>

namespace troupe {
namespace {

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
  if (i.size() == 1 && in(i[0], workers_)) {
    if (p.role == "coordinator") return coordinator(i[0]);
    if (p.role == "updater") return updater(i[0]);
    if (p.role == "reducer") return reducer(i[0]);
  }
  if (i.size() == 2 && in(i[0], workers_) && in(i[1], replicas_)) {
    if (p.role == "replica") return replica(i[0], i[1]);
    if (p.role == "reader") return reader(i[0], i[1]);
  }
  if (i.size() == 1 && p.role == "server" && in(i[0], servers_)) return server(i[0]);
  return Status(ErrorKind::kInput,
                fmt::format("no actor '{}' in a run of {} worker(s), {} server(s) and {} "
                            "replica(s) a worker (names: coordinator/N, updater/N, reducer/N, "
                            "replica/N/I, reader/N/I, server/S)",
                            name, workers_, servers_, replicas_));
}

std::string Topology::nameOf(Address a) const {
  const int node = static_cast<int>(a.node), actor = static_cast<int>(a.actor);
  if (node >= workers_ && node < workers_ + servers_ && actor == 0) {
    return fmt::format("server/{}", node - workers_);
  }
  if (node < workers_) {
    if (actor == 0) return fmt::format("coordinator/{}", node);
    if (actor == 1) return fmt::format("updater/{}", node);
    if (actor == 2) return fmt::format("reducer/{}", node);
    if (actor >= 3 && actor < 3 + replicas_) return fmt::format("replica/{}/{}", node, actor - 3);
    if (actor >= 3 + replicas_ && actor < 3 + 2 * replicas_) {
      return fmt::format("reader/{}/{}", node, actor - 3 - replicas_);
    }
  }
  return fmt::format("node {} actor {}", node, actor);
}

std::vector<std::string> Topology::names() const {
  std::vector<std::string> all;
  for (int w = 0; w < workers_; ++w) {
    for (std::uint32_t a = 0; a < actorsPerWorker(); ++a)
      all.push_back(nameOf(at(w, static_cast<int>(a))));
  }
  for (int s = 0; s < servers_; ++s)
    all.push_back(nameOf(server(s)));
  return all;
}

}  // namespace troupe
