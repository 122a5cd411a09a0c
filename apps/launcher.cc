// `launch`: options, the run's secret and store, and the generations of a run; the work of one
// generation is in launcher_children.cc (local, ssh), launcher_mpi.cc and launcher_slurm.cc.
#include "apps/launcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <sstream>

#include "actors/config/worker_bounds.h"
#include "actors/core/run_id.h"
#include "apps/launcher_run.h"
#include "apps/launcher_slurm.h"
#include "apps/launcher_ssh.h"
#include "apps/output_relay.h"
#include "data/files.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/url.h"
#include "transport/auth.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using namespace launch_detail;

std::string makeRunId() {
  std::random_device rd;
  return fmt::format("run-{:08x}{:04x}", rd(), rd() & 0xffff);
}

// Whether `command` runs troupe's own training, whose elastic worlds re-form inside its processes
// (actors/run/elastic.h): troupe itself, or a wrapper whose words say `troupe train` (`bash -c
// 'echo on $(hostname); exec troupe train ...'`). Any other command gets torchrun's elastic
// model (launcher_elastic.cc).
bool isTroupe(const std::vector<std::string>& command) {
  const auto troupe = [](const std::string& word) {
    return word == selfExecutable() || std::filesystem::path(word).filename() == "troupe";
  };
  if (troupe(command[0])) return true;
  std::vector<std::string> words;
  for (const auto& arg : command) {
    std::string word;
    for (const char c : arg + " ") {
      if (std::string_view(" \t\n;&|()'\"`").find(c) == std::string_view::npos) {
        word += c;
      } else if (!word.empty()) {
        words.push_back(std::move(word));
        word.clear();
      }
    }
  }
  for (std::size_t i = 0; i + 1 < words.size(); ++i) {
    if (troupe(words[i]) && words[i + 1] == "train") return true;
  }
  return false;
}

void checkOptions(const LaunchOptions& o) {
  if (o.launcher == "local" && !o.hostfile.empty()) {
    throw InputError(
        "-H names other hosts, but --launcher local starts every process on this one: drop "
        "--launcher local (with -H the launcher is ssh, as MXNet's launch.py's), or name ssh or "
        "mpi");
  }
  if (o.num_workers < 1) throw InputError("-n: need at least one worker");
  if (o.num_servers < 0) throw InputError("-s: the number of servers cannot be negative");
  if (o.command.empty()) throw InputError("no command to launch: put it after --");
  if (o.launcher == "sge" || o.launcher == "yarn") {
    throw InputError(fmt::format(
        "--launcher {}: troupe has no {} launcher (MXNet's tools/launch.py has): on a cluster "
        "scheduler use --launcher slurm; on hosts you can reach, ssh or mpi with -H HOSTFILE",
        o.launcher, o.launcher == "sge" ? "Sun Grid Engine" : "YARN"));
  }
  if (o.launcher != "local" && o.launcher != "ssh" && o.launcher != "mpi" &&
      o.launcher != "slurm") {
    throw InputError(
        fmt::format("unknown launcher '{}' (known: local, ssh, mpi, slurm)", o.launcher));
  }
  if (o.launcher == "slurm" && !o.hostfile.empty()) {
    throw InputError("--launcher slurm takes no -H: the Slurm allocation decides the hosts");
  }
  if (o.launcher == "ssh" && o.hostfile.empty()) {
    throw InputError("--launcher ssh needs -H HOSTFILE (one host or host:port a line)");
  }
  if (o.on_failure != "abort" && o.on_failure != "restart") {
    throw InputError(fmt::format("--on-failure '{}': expected abort or restart", o.on_failure));
  }
  if (o.max_restarts < 0) {
    throw InputError(fmt::format("--max-restarts {}: cannot be negative", o.max_restarts));
  }
  if (!o.sync_dst_dir.empty() && o.launcher != "ssh") {
    throw InputError(
        fmt::format("--sync-dst-dir works with --launcher ssh only, not '{}'", o.launcher));
  }
  for (const auto* role_env : {&o.worker_env, &o.server_env}) {
    for (const auto& [name, value] : *role_env) {
      const bool ok = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                      std::all_of(name.begin(), name.end(), [](char c) {
                        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                      });
      if (!ok) {
        throw InputError(fmt::format("--env-{} '{}={}': '{}' is not a variable name",
                                     role_env == &o.worker_env ? "worker" : "server", name, value,
                                     name));
      }
    }
  }
  if (o.launcher == "slurm") checkSlurmLaunch(o);
  if (!o.elastic.empty()) {
    const auto bounds = actors::parseNumWorkers(o.elastic);
    if (!bounds.elastic()) {
      throw InputError(fmt::format("--elastic {}: expected MIN:MAX", o.elastic));
    }
    // torchrun's model: -n is this launcher's share; the run starts once MIN have come.
    const int fewest = isTroupe(o.command) ? bounds.min : 1;
    if (o.num_workers < fewest || o.num_workers > bounds.max) {
      throw InputError(fmt::format("-n {}: an elastic run of --elastic {} starts {} to {} workers",
                                   o.num_workers, o.elastic, bounds.min, bounds.max));
    }
    if (o.num_servers > 0) throw InputError("--elastic: an elastic run has no servers (-s)");
    if (o.launcher != "local" && o.launcher != "ssh") {
      throw InputError(fmt::format(
          "--elastic works with --launcher local or ssh ({} stops every process when one fails)",
          o.launcher));
    }
    if (o.on_failure == "restart") {
      throw InputError(
          "--elastic leaves a failed worker out and the others go on: --on-failure restart does "
          "not apply");
    }
  }
}

// `command` under `sh -c`, which exports the variables of the process's role (TROUPE_ROLE, which
// every launcher sets) and execs it; `command` itself without role variables.
std::vector<std::string> withRoleEnvironment(const LaunchOptions& o,
                                             std::vector<std::string> command) {
  if (o.worker_env.empty() && o.server_env.empty()) return command;
  auto exports = [](const std::vector<std::pair<std::string, std::string>>& env) {
    std::string out;
    for (const auto& [name, value] : env)
      out += fmt::format("export {}={}; ", name, shellQuote(value));
    return out;
  };
  const std::string script =
      fmt::format("case \"$TROUPE_ROLE\" in server) {};; *) {};; esac; exec \"$@\"",
                  exports(o.server_env), exports(o.worker_env));
  command.insert(command.begin(), {"sh", "-c", script, "troupe-role-env"});
  return command;
}

// Runs the generations of the run until one ends well, the launcher is stopped, or the failure
// policy gives up; see launch().
int runGenerations(const LaunchOptions& o, OutputRelay& relay) {
  std::vector<std::string> command = o.command;
  // "troupe" means this troupe, whether or not it is on PATH.
  if (command[0] == "troupe") command[0] = selfExecutable();
  command = withRoleEnvironment(o, std::move(command));

  std::vector<LaunchHost> hosts;
  if (o.launcher != "local" && !o.hostfile.empty()) hosts = readHostfile(o.hostfile);
  if (!o.sync_dst_dir.empty()) {
    syncFolder(hosts, userSshOptions(o), o.sync_dst_dir, o.hostfile, relay);
  }

  const std::string run_id = o.run_id.empty() ? makeRunId() : o.run_id;
  actors::checkRunId(run_id);
  // The run's secret: the embedded store and every link refuse whoever cannot prove it.
  std::string secret = transport::loadSecret(o.secret_file);
  if (secret.empty()) secret = transport::makeSecret();
  LaunchOptions options = o;
  if (o.secret_file.empty()) {
    options.env.emplace_back("TROUPE_SECRET", secret);
  } else {  // the processes read the file themselves: the secret stays off command lines
    options.env.emplace_back("TROUPE_SECRET_FILE",
                             std::filesystem::absolute(o.secret_file).string());
  }
  if (!o.elastic.empty() && !isTroupe(o.command)) {
    return runElasticAgents(options, command, run_id, secret, hosts, relay);
  }
  for (int generation = 0;; ++generation) {
    // The embedded store, served here for as long as this generation's processes run; a fresh
    // one (another port) each generation, so a straggler of the last one cannot join this one.
    std::unique_ptr<rendezvous::TcpStoreServer> store;
    std::string rendezvous = o.rendezvous;
    if (rendezvous.empty()) {
      const std::string bind =
          o.launcher == "slurm" ? slurmStoreBindAddress(o) : storeBindAddress(o, hosts);
      store = rendezvous::startTcpStoreServer(bind, 0, secret);
      rendezvous = "tcp://" + store->address();
    }
    relay.out(
        "[launcher] run {}{}: {} worker(s), {} server(s), rendezvous {}{}{}", run_id,
        generation > 0 ? fmt::format(" (restart {} of {})", generation, o.max_restarts) : "",
        o.num_workers, o.num_servers, rendezvous::redactedStoreUrl(rendezvous),
        store ? " (embedded store)" : "",
        o.launcher == "local"
            ? ""
            : fmt::format(", {} launcher{}", o.launcher,
                          hosts.empty() ? "" : fmt::format(" over {} host line(s)", hosts.size())));

    const RunContext run{options, command, run_id, rendezvous, hosts, generation, relay};
    const Attempt attempt = o.launcher == "mpi" ? runMpi(run)
                            : o.launcher == "slurm"
                                ? runSlurm(run)
                                : runChildren(o.launcher == "ssh" ? Kind::kSsh : Kind::kLocal, run);
    if (attempt.code == 0 || attempt.interrupted) return attempt.code;
    if (o.on_failure == "restart" && generation < o.max_restarts) {
      relay.err("[launcher] {}; restarting every process ({} of {} restarts)", attempt.failure,
                generation + 1, o.max_restarts);
      continue;
    }
    if (o.on_failure == "restart") {
      relay.err("[launcher] run failed: {}; giving up after {} restart(s) (--max-restarts {})",
                attempt.failure, generation, o.max_restarts);
    } else {
      relay.err("[launcher] run failed: {}", attempt.failure);
    }
    return attempt.code;
  }
}

}  // namespace

std::string LaunchHost::display() const {
  return port ? fmt::format("{}:{}", name, port) : name;
}

std::string shellQuote(std::string_view s) {
  const bool safe = !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) ||
           std::string_view("_@%+=:,./-").find(ch) != std::string_view::npos;
  });
  if (safe) return std::string(s);
  std::string out = "'";
  for (const char ch : s) {
    if (ch == '\'') {
      out += "'\\''";
    } else {
      out += ch;
    }
  }
  return out + "'";
}

std::vector<LaunchHost> readHostfile(const std::string& path) {
  std::istringstream in(data::readRegularFile(path, "-H hostfile", 16u << 20));
  std::vector<LaunchHost> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    const std::string entry = line.substr(first, last - first + 1);
    if (entry.find_first_of(" \t") != std::string::npos) {
      throw InputError(
          fmt::format("-H {}:{}: expected 'host' or 'host:port', got '{}'", path, number, entry));
    }
    LaunchHost host{entry, 0, number};
    const auto colon = entry.find(':');
    if (colon != std::string::npos && entry.find(':', colon + 1) == std::string::npos) {
      const std::string port = entry.substr(colon + 1);
      const bool digits = !port.empty() && port.size() <= 5 &&
                          port.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535 || colon == 0) {
        throw InputError(
            fmt::format("-H {}:{}: bad host:port '{}' (port 1..65535)", path, number, entry));
      }
      host.name = entry.substr(0, colon);
      host.port = std::stoi(port);
    }
    hosts.push_back(std::move(host));
  }
  if (hosts.empty()) throw InputError(fmt::format("-H {}: no hosts in it", path));
  return hosts;
}

namespace {

// A word of a command or a variable's value as the dry run shows it: a store URL's password
// redacted (rendezvous/value.h), where the URL starts after a '=' or at the word's start.
std::string redacted(std::string_view word) {
  const auto sep = word.find("://");
  if (sep == std::string_view::npos) return std::string(word);
  const auto eq = word.rfind('=', sep);
  const auto at = eq == std::string_view::npos ? 0 : eq + 1;
  return std::string(word.substr(0, at)) + rendezvous::redactedStoreUrl(word.substr(at));
}

// A variable whose value is a secret: the run's, or a store backend's password.
bool isSecretVariable(std::string_view name) {
  if (name == "TROUPE_SECRET") return true;
  const auto& backends = rendezvous::storeBackends();
  return std::any_of(backends.begin(), backends.end(),
                     [&](const auto& b) { return b.password_variable == name; });
}

// What launch(o) would start, without starting anything.
int dryRun(const LaunchOptions& o) {
  std::vector<LaunchHost> hosts;
  if (o.launcher != "local" && !o.hostfile.empty()) hosts = readHostfile(o.hostfile);
  const std::string run_id = o.run_id.empty() ? "(made up at start)" : o.run_id;
  const std::string rendezvous =
      !o.rendezvous.empty()
          ? rendezvous::redactedStoreUrl(o.rendezvous)
          : fmt::format("an embedded store this launcher serves on {} (its port chosen at start)",
                        o.launcher == "slurm" ? std::string("the first node's route")
                                              : storeBindAddress(o, hosts));
  const std::string secret =
      !o.secret_file.empty()         ? fmt::format("read from {} by every process", o.secret_file)
      : std::getenv("TROUPE_SECRET") ? std::string("$TROUPE_SECRET, in every process")
                                     : std::string("a fresh one made at start, in every process");
  std::string out = "# troupe launch --dry-run: nothing starts\n";
  const auto row = [&out](std::string_view what, const std::string& value) {
    out += fmt::format("{:<12} {}\n", what, value);
  };
  row("launcher", o.launcher + (hosts.empty() ? ""
                                              : fmt::format(" over {} host line(s) of {}",
                                                            hosts.size(), o.hostfile)));
  row("run id", run_id);
  row("rendezvous", rendezvous);
  row("secret", secret);
  row("on failure", o.on_failure == "restart"
                        ? fmt::format("restart (at most {} times)", o.max_restarts)
                        : std::string("abort"));
  if (!o.elastic.empty()) {
    row("elastic", o.elastic + (isTroupe(o.command)
                                    ? " workers: a failed one is left out, a joiner is let in, "
                                      "and the others go on"
                                    : " workers, torchrun's model: a failed one is left out, a "
                                      "launcher joining with --rendezvous adds its own, and "
                                      "every change restarts every worker with new ranks"));
  }
  std::string command;
  for (const auto& word : o.command)
    command += (command.empty() ? "" : " ") + shellQuote(redacted(word));
  row("command", command);
  for (const auto& [name, value] : o.env) {
    const bool secret = isSecretVariable(name);
    row("variable",
        fmt::format("{}={} (every process)", name, secret ? "***" : shellQuote(redacted(value))));
  }
  if (o.launcher == "mpi" || o.launcher == "slurm") {
    row("processes", fmt::format("{} server(s), then {} worker(s), placed by {}", o.num_servers,
                                 o.num_workers, o.launcher == "mpi" ? "mpirun" : "srun"));
  } else {
    OutputRelay quiet;
    const RunContext run{o, o.command, run_id, rendezvous, hosts, 0, quiet};
    for (const auto& p : planProcesses(o.launcher == "ssh" ? Kind::kSsh : Kind::kLocal, run)) {
      std::string env;
      for (const auto& [name, value] : p.env) {
        if (name != "TROUPE_RUN_ID" && name != "TROUPE_RENDEZVOUS") {
          env += fmt::format(" {}={}", name, value);
        }
      }
      row("process", fmt::format("{} {} on {}:{}", p.role, p.rank, p.host, env));
    }
  }
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace

int launch(const LaunchOptions& given) {
  LaunchOptions o = given;
  if (o.launcher.empty()) o.launcher = o.hostfile.empty() ? "local" : "ssh";
  checkOptions(o);
  // Every process listens on the interface asked for, as the store is served on its address.
  if (!o.interface.empty()) o.env.emplace_back("TROUPE_INTERFACE", o.interface);
  if (o.dry_run) return dryRun(o);
  // Whoever reads the launcher's output (or does not) never holds up its supervision: every
  // line goes through the relay, and a reader that is gone makes EPIPE, not SIGPIPE.
  IgnoreSigpipe ignore_sigpipe;
  OutputRelay relay;
  LogThroughRelay log(relay);
  return runGenerations(o, relay);
}

}  // namespace troupe::apps
