#include "actors/core/hosts.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "troupe/error.h"

namespace troupe::actors {

std::string hostName() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return name;
}

std::string hostKey() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::error_code ec;
  const auto net = std::filesystem::read_symlink("/proc/self/ns/net", ec).string();
  const auto pid = std::filesystem::read_symlink("/proc/self/ns/pid", ec).string();
  return fmt::format("{} {} {}", boot, net, pid);
}

std::vector<std::vector<int>> groupHosts(const std::vector<std::string>& keys) {
  std::vector<std::vector<int>> hosts;
  std::map<std::string, std::size_t> index;
  for (std::size_t r = 0; r < keys.size(); ++r) {
    auto [it, inserted] = index.emplace(keys[r], hosts.size());
    if (inserted) hosts.emplace_back();
    hosts[it->second].push_back(static_cast<int>(r));
  }
  return hosts;
}

ReductionPlan planReduction(Allreduce mode, const std::vector<std::vector<int>>& hosts, int rank) {
  std::size_t workers = 0;
  std::vector<std::size_t> sizes;
  for (const auto& h : hosts) {
    workers += h.size();
    sizes.push_back(h.size());
  }
  ReductionPlan plan;
  plan.description = fmt::format("flat ring of {} workers", workers);
  if (mode == Allreduce::kRing) return plan;
  const bool even = std::all_of(sizes.begin(), sizes.end(), [&](auto n) { return n == sizes[0]; });
  const bool gains = hosts.size() > 1 && !sizes.empty() && sizes[0] > 1;
  if (!even || !gains) {
    if (mode == Allreduce::kAuto) return plan;
    throw InputError(fmt::format(
        "allreduce 'hierarchical' needs several hosts with the same number (2 or more) of "
        "workers each; this run's hosts hold {} worker(s) (hosts by their lowest rank: {})",
        fmt::join(sizes, ", "), fmt::join(hosts, "; ")));
  }
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    const auto it = std::find(hosts[h].begin(), hosts[h].end(), rank);
    if (it == hosts[h].end()) continue;
    plan.host_ranks = hosts[h];
    const auto l = static_cast<std::size_t>(it - hosts[h].begin());
    for (const auto& other : hosts)
      plan.across_ranks.push_back(other[l]);
  }
  TROUPE_ENFORCE(!plan.host_ranks.empty(), "rank ", rank, " is on none of the hosts");
  plan.description = fmt::format("hierarchical: {} hosts x {} workers", hosts.size(), sizes[0]);
  return plan;
}

std::vector<std::string> exchangeHostKeys(rendezvous::Store& store, int rank, int workers,
                                          std::chrono::milliseconds timeout) {
  store.set(fmt::format("host/{}", rank), hostKey());
  std::vector<std::string> keys;
  for (int r = 0; r < workers; ++r)
    keys.push_back(store.get(fmt::format("host/{}", r), timeout));
  return keys;
}

}  // namespace troupe::actors
