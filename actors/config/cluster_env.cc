#include "actors/config/cluster_env.h"

#include <fmt/format.h>

#include <cstdlib>

#include "troupe/error.h"

namespace troupe::actors {
namespace {

constexpr std::size_t kMaxHosts = 1000000;

// VAR's value as a whole number in [lo, hi]: InputError naming VAR otherwise.
std::int64_t wholeNumber(const EnvLookup& env, const char* var, std::int64_t lo, std::int64_t hi,
                         std::string_view meaning) {
  const auto text = env(var);
  if (!text) throw InputError(fmt::format("{} is not set: expected {}", var, meaning));
  const bool digits =
      text->size() <= 18 && text->find_first_not_of("0123456789") == std::string::npos;
  const std::int64_t value = digits ? std::strtoll(text->c_str(), nullptr, 10) : -1;
  if (!digits || value < lo || value > hi) {
    throw InputError(fmt::format("{}='{}': expected {}, a whole number in [{}, {}]", var, *text,
                                 meaning, lo, hi));
  }
  return value;
}

// The engine's rank and world, and the names they came by (for error messages).
struct Placement {
  std::string engine;
  std::int64_t rank = 0;
  std::int64_t world = 0;  // 0: the engine does not say (kubernetes)
  std::string rank_var, world_var;
};

std::optional<Placement> placement(const EnvLookup& env) {
  // troupe placed it, or MXNet's launcher did (DMLC_ROLE: loadTrainOptions reads its variables)
  if (env("TROUPE_RANK") || env("TROUPE_ROLE") || env("DMLC_ROLE")) return std::nullopt;
  constexpr std::int64_t kMaxRank = 65535;  // the config's shard_id range
  if (env("OMPI_COMM_WORLD_RANK")) {
    Placement p{"mpi", 0, 0, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"};
    p.world = wholeNumber(env, "OMPI_COMM_WORLD_SIZE", 1, kMaxRank + 1, "the number of ranks");
    p.rank = wholeNumber(env, "OMPI_COMM_WORLD_RANK", 0, kMaxRank, "this process's rank");
    return p;
  }
  if (env("SLURM_STEP_ID") && env("SLURM_PROCID")) {
    Placement p{"slurm", 0, 0, "SLURM_PROCID", "SLURM_NTASKS"};
    p.world = wholeNumber(env, "SLURM_NTASKS", 1, kMaxRank + 1, "the number of tasks");
    p.rank = wholeNumber(env, "SLURM_PROCID", 0, kMaxRank, "this task's rank");
    return p;
  }
  if (env("JOB_COMPLETION_INDEX")) {
    Placement p{"kubernetes", 0, 0, "JOB_COMPLETION_INDEX", ""};
    p.rank = wholeNumber(env, "JOB_COMPLETION_INDEX", 0, kMaxRank, "this pod's index");
    return p;
  }
  return std::nullopt;
}

// The world as num_shards + num_servers: set from the engine's world, or checked against it.
void settleWorld(TrainOptions& o, const Placement& p, const GivenBy& given_by) {
  const auto servers_by = given_by("num_servers");
  const std::string servers =
      servers_by ? *servers_by : fmt::format("num_servers {}", o.num_servers);
  if (p.world == 0) {  // kubernetes: the manifest says
    if (p.rank >= o.num_shards + o.num_servers) {
      const auto workers_by = given_by("num_shards");
      throw InputError(fmt::format(
          "{}={} is not below the run's {} process(es) ({} and {}): set TROUPE_NUM_WORKERS and "
          "TROUPE_NUM_SERVERS to add up to the Job's completions",
          p.rank_var, p.rank, o.num_shards + o.num_servers,
          workers_by ? *workers_by : fmt::format("num_shards {}", o.num_shards), servers));
    }
    return;
  }
  if (p.rank >= p.world) {
    throw InputError(
        fmt::format("{}={} is not below {}={}", p.rank_var, p.rank, p.world_var, p.world));
  }
  if (o.num_servers >= p.world) {
    throw InputError(fmt::format("{}={} leaves no worker beside {} server(s) ({})", p.world_var,
                                 p.world, o.num_servers, servers));
  }
  const int workers = static_cast<int>(p.world) - o.num_servers;
  if (const auto workers_by = given_by("num_shards"); workers_by && o.num_shards != workers) {
    throw InputError(fmt::format(
        "{}={} process(es), but {} worker(s) ({}) and {} server(s) make {}: start as many "
        "processes as the run has, or leave the number of workers to {}",
        p.world_var, p.world, o.num_shards, *workers_by, o.num_servers,
        o.num_shards + o.num_servers, p.world_var));
  }
  o.num_shards = workers;
}

// Slurm's defaults for the run id and the rendezvous, when none is given.
void slurmRendezvous(TrainOptions& o, const EnvLookup& env) {
  if (!o.run_id.empty() && !o.rendezvous.empty()) return;
  constexpr std::int64_t kMaxId = 999999999999999LL;
  const auto job = wholeNumber(env, "SLURM_JOB_ID", 0, kMaxId, "the job's id");
  const auto step = wholeNumber(env, "SLURM_STEP_ID", 0, kMaxId, "the job step's id");
  if (o.run_id.empty()) o.run_id = fmt::format("slurm-{}.{}", job, step);
  if (!o.rendezvous.empty()) return;
  for (const char* var : {"SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"}) {
    if (const auto list = env(var)) {
      const auto hosts = expandSlurmHostlist(*list, fmt::format("{}={}", var, *list));
      o.rendezvous = fmt::format(
          "tcp://{}:{}", hosts.front(),
          slurmRendezvousPort(static_cast<std::uint64_t>(job), static_cast<std::uint64_t>(step)));
      return;
    }
  }
  throw InputError(
      "SLURM_STEP_NODELIST, SLURM_NODELIST and SLURM_JOB_NODELIST are all unset: no node to meet "
      "on; give --rendezvous tcp://HOST:PORT");
}

// Appends to every name of `names` each number of a bracket's ranges ("01-04,07").
std::vector<std::string> expandBracket(const std::vector<std::string>& names,
                                       std::string_view ranges, std::string_view what) {
  std::vector<std::string> out;
  auto bad = [&](std::string_view why) {
    return InputError(fmt::format("{}: not a Slurm hostlist ({}: '[{}]')", what, why, ranges));
  };
  std::vector<std::pair<std::string, std::string>> parsed;
  std::size_t start = 0;
  while (start <= ranges.size()) {
    const auto end = std::min(ranges.find(',', start), ranges.size());
    const std::string_view range = ranges.substr(start, end - start);
    const auto dash = range.find('-');
    std::string lo(range.substr(0, dash));
    std::string hi(dash == std::string_view::npos ? lo : std::string(range.substr(dash + 1)));
    for (const auto* n : {&lo, &hi}) {
      if (n->empty() || n->size() > 9 || n->find_first_not_of("0123456789") != std::string::npos) {
        throw bad("a range is N or N-M");
      }
    }
    if (std::stol(hi) < std::stol(lo)) throw bad("a range goes up");
    parsed.emplace_back(std::move(lo), std::move(hi));
    start = end + 1;
  }
  for (const auto& name : names) {
    for (const auto& [lo, hi] : parsed) {
      for (long n = std::stol(lo); n <= std::stol(hi); ++n) {
        if (out.size() >= kMaxHosts) throw bad("more than a million hosts");
        out.push_back(fmt::format("{}{:0{}}", name, n, lo.size()));
      }
    }
  }
  return out;
}

}  // namespace

EnvLookup processEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    return v && *v ? std::optional<std::string>(v) : std::nullopt;
  };
}

std::uint16_t slurmRendezvousPort(std::uint64_t job, std::uint64_t step) {
  return static_cast<std::uint16_t>(29500 + (16 * job + step) % 2000);
}

std::vector<std::string> expandSlurmHostlist(std::string_view list, std::string_view what) {
  std::vector<std::string> hosts;
  std::vector<std::string> current{""};
  bool open = false;
  std::string_view::size_type bracket = 0;
  auto finish = [&] {
    if (current.size() == 1 && current[0].empty()) {
      throw InputError(fmt::format("{}: not a Slurm hostlist (an empty host name)", what));
    }
    if (hosts.size() + current.size() > kMaxHosts) {
      throw InputError(fmt::format("{}: more than a million hosts", what));
    }
    hosts.insert(hosts.end(), current.begin(), current.end());
    current = {""};
  };
  for (std::string_view::size_type i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (open) {
      if (c == ']') {
        current = expandBracket(current, list.substr(bracket + 1, i - bracket - 1), what);
        open = false;
      } else if (c == '[') {
        throw InputError(fmt::format("{}: not a Slurm hostlist (a '[' inside brackets)", what));
      }
    } else if (c == '[') {
      open = true;
      bracket = i;
    } else if (c == ']') {
      throw InputError(fmt::format("{}: not a Slurm hostlist (a ']' without '[')", what));
    } else if (c == ',') {
      finish();
    } else if (c == ' ' || c == '\t' || c == '\n') {
      throw InputError(fmt::format("{}: not a Slurm hostlist (white space in it)", what));
    } else {
      for (auto& name : current)
        name += c;
    }
  }
  if (open) throw InputError(fmt::format("{}: not a Slurm hostlist (a '[' without ']')", what));
  finish();
  return hosts;
}

std::string applyClusterEnvironment(TrainOptions& o, const GivenBy& given_by,
                                    const EnvLookup& env) {
  const auto p = placement(env);
  if (!p) return "";
  settleWorld(o, *p, given_by);
  if (!given_by("role") && !given_by("shard_id")) {
    const bool server = p->rank < o.num_servers;
    o.role = server ? ProcessRole::kServer : ProcessRole::kWorker;
    o.shard_id = static_cast<int>(server ? p->rank : p->rank - o.num_servers);
  }
  if (p->engine == "slurm" && o.num_shards + o.num_servers > 1) slurmRendezvous(o, env);
  return p->engine;
}

}  // namespace troupe::actors
