// The mpi launcher: one Open MPI mpirun for the whole world, its tagged output relayed with role
// and rank, the failing rank named from the wrappers' markers or mpirun's own report.
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "apps/launcher_run.h"
#include "apps/launcher_ssh.h"
#include "apps/output_relay.h"
#include "troupe/error.h"

namespace troupe::apps::launch_detail {
namespace {

struct MpiRank {
  std::string role;
  int rank = 0;
  std::string host;
  long pid = 0;
  std::optional<int> exit;
  std::optional<Culprit> culprit;  // from its last culprit line
};

// What mpirun says about the rank that ended its job.
struct MpiFailure {
  int world_rank = -1;
  std::string host;
  std::string what;
  int code = 0;
};

// A removed-on-destruction Open MPI hostfile.
class MpiHostfile {
 public:
  explicit MpiHostfile(const std::vector<LaunchHost>& hosts) {
    std::vector<std::pair<std::string, int>> slots;
    for (const auto& h : hosts) {
      auto it = std::find_if(slots.begin(), slots.end(),
                             [&](const auto& s) { return s.first == h.name; });
      if (it == slots.end()) {
        slots.emplace_back(h.name, 1);
      } else {
        ++it->second;
      }
    }
    std::string text;
    for (const auto& [name, n] : slots)
      text += fmt::format("{} slots={}\n", name, n);
    char path[] = "/tmp/troupe_mpi_hosts_XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) throw IoError(fmt::format("mkstemp {}: {}", path, std::strerror(errno)));
    path_ = path;
    const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    ::close(fd);
    if (!ok) throw IoError(fmt::format("cannot write {}", path_));
  }
  ~MpiHostfile() { ::unlink(path_.c_str()); }
  MpiHostfile(const MpiHostfile&) = delete;
  MpiHostfile& operator=(const MpiHostfile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Maps OMPI_COMM_WORLD_RANK to TROUPE_ROLE and TROUPE_RANK, reports host and pid, runs "$@" and
// reports its exit code. Not exec: Open MPI signals each rank's process group, so the command
// goes with its shell, and the marker tells the launcher which rank failed first even when mpirun
// prints no report (it does not when it had to kill the other ranks).
std::string mpiWrapper(int num_servers) {
  return fmt::format(
      "r=${{OMPI_COMM_WORLD_RANK:?troupe launch: not started by mpirun}}; "
      "if [ \"$r\" -lt {0} ]; then TROUPE_ROLE=server; TROUPE_RANK=$r; "
      "else TROUPE_ROLE=worker; TROUPE_RANK=$((r - {0})); fi; "
      "export TROUPE_ROLE TROUPE_RANK; echo \"{1} host $(uname -n) pid $$\"; "
      "\"$@\"; rc=$?; echo \"{1} exit $rc\"; exit $rc",
      num_servers, kMarker);
}

// Parses "[JOB,RANK]<stream>:text" (mpirun --tag-output); false for mpirun's own lines.
bool parseTagged(std::string_view line, int& world_rank, std::string_view& text) {
  if (line.empty() || line[0] != '[') return false;
  const auto close = line.find("]<");
  const auto comma = line.find(',');
  if (close == std::string_view::npos || comma == std::string_view::npos || comma > close) {
    return false;
  }
  const auto body = line.find(">:", close);
  if (body == std::string_view::npos) return false;
  const std::string digits(line.substr(comma + 1, close - comma - 1));
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  world_rank = std::atoi(digits.c_str());
  text = line.substr(body + 2);
  return true;
}

// Reads mpirun's own report of the rank that failed (Open MPI 4 wording).
void parseMpirunLine(std::string_view line, std::optional<int>& pending_rank,
                     std::optional<MpiFailure>& failure) {
  if (failure) return;
  const std::string text(line);
  int job = 0, rank = 0, code = 0, sig = 0;
  long pid = 0;
  if (const auto at = text.find("Process name: [["); at != std::string::npos) {
    if (std::sscanf(text.c_str() + at, "Process name: [[%d,%*d],%d]", &job, &rank) == 2) {
      pending_rank = rank;
    }
  } else if (const auto at = text.find("Exit code:"); at != std::string::npos && pending_rank) {
    if (std::sscanf(text.c_str() + at, "Exit code: %d", &code) == 1) {
      failure = MpiFailure{*pending_rank, "", fmt::format("exited with code {}", code), code};
    }
  } else if (const auto at = text.find("noticed that process rank "); at != std::string::npos) {
    char host[256] = {};
    if (std::sscanf(text.c_str() + at,
                    "noticed that process rank %d with PID %ld on node %255s exited on signal %d",
                    &rank, &pid, host, &sig) == 4) {
      failure = MpiFailure{
          rank, host, fmt::format("was killed by signal {} ({})", sig, strsignal(sig)), 128 + sig};
    }
  }
}

std::string label(const MpiRank& r) {
  return fmt::format("{} {}", r.role, r.rank);
}

Named named(const MpiRank& r, const std::string& host_if_unknown) {
  return {label(r), r.host.empty() ? host_if_unknown : r.host,
          r.pid ? fmt::format("pid {}", r.pid) : ""};
}

// mpirun's command line (the values of `env` go in its environment: `-x NAME` only).
std::vector<std::string> mpirunCommand(const RunContext& run, const Env& env,
                                       const MpiHostfile* hostfile) {
  const auto& o = run.options;
  std::vector<std::string> argv{"mpirun",
                                "-np",
                                std::to_string(o.num_servers + o.num_workers),
                                "--tag-output",
                                "--oversubscribe",
                                "--allow-run-as-root"};
  if (hostfile) {
    argv.insert(argv.end(), {"--hostfile", hostfile->path()});
    auto agent_args = userSshOptions(o);
    const int port = run.hosts[0].port;
    for (const auto& h : run.hosts) {
      if (h.port != port) {
        throw InputError(fmt::format(
            "-H {}:{}: host {} has a different ssh port than {}: mpirun takes one port for all",
            o.hostfile, h.line, h.display(), run.hosts[0].display()));
      }
    }
    if (port) agent_args.insert(agent_args.end(), {"-p", std::to_string(port)});
    if (!agent_args.empty()) {
      argv.insert(argv.end(), {"--mca", "plm_rsh_args", join(agent_args)});
    }
  }
  // No value (the run's secret among them) stands on a command line.
  for (const auto& kv : env)
    argv.insert(argv.end(), {"-x", kv.first});
  argv.insert(argv.end(), {"sh", "-c", mpiWrapper(o.num_servers), "troupe-launch"});
  argv.insert(argv.end(), run.command.begin(), run.command.end());
  return argv;
}

class MpiSupervisor {
 public:
  explicit MpiSupervisor(const RunContext& run)
      : run_(run), world_(run.options.num_servers + run.options.num_workers) {
    for (int r = 0; r < world_; ++r) {
      const bool server = r < run.options.num_servers;
      MpiRank rank;
      rank.role = server ? "server" : "worker";
      rank.rank = server ? r : r - run.options.num_servers;
      ranks_.push_back(std::move(rank));
    }
  }

  Attempt run();

 private:
  void onLine(std::string_view line);
  Attempt summary(int status, int interrupted);
  const MpiRank* rankNamed(const Culprit& c) const;

  const RunContext& run_;
  const int world_;
  std::vector<MpiRank> ranks_;
  std::optional<int> pending_rank_;
  std::optional<MpiFailure> failure_;
  std::optional<int> first_failed_;  // the first rank whose wrapper reported a non-zero exit
};

void MpiSupervisor::onLine(std::string_view line) {
  int world_rank = -1;
  std::string_view text;
  if (!parseTagged(line, world_rank, text) || world_rank < 0 || world_rank >= world_) {
    run_.relay.relay(OutputRelay::Stream::kOut, "mpirun", line);
    parseMpirunLine(line, pending_rank_, failure_);
    return;
  }
  auto& r = ranks_[static_cast<std::size_t>(world_rank)];
  const auto at = text.find(kMarker);
  const auto relayed = text.substr(0, at);
  if (at == std::string_view::npos || at > 0) {
    if (auto culprit = parseCulprit(relayed)) r.culprit = std::move(culprit);
    run_.relay.relay(OutputRelay::Stream::kOut, label(r), relayed);
  }
  if (at == std::string_view::npos) return;
  const std::string rest(text.substr(at + kMarker.size()));
  char host[256] = {};
  long pid = 0;
  int code = 0;
  if (std::sscanf(rest.c_str(), " host %255s pid %ld", host, &pid) == 2) {
    r.host = host;
    r.pid = pid;
  } else if (std::sscanf(rest.c_str(), " exit %d", &code) == 1) {
    r.exit = code;
    if (code != 0 && !first_failed_) first_failed_ = world_rank;
  }
}

const MpiRank* MpiSupervisor::rankNamed(const Culprit& c) const {
  const auto it = std::find_if(ranks_.begin(), ranks_.end(), [&](const MpiRank& r) {
    return r.role == c.role && r.rank == c.rank;
  });
  return it == ranks_.end() ? nullptr : &*it;
}

Attempt MpiSupervisor::run() {
  auto env = run_.options.env;
  env.emplace_back("TROUPE_NUM_WORKERS", std::to_string(run_.options.num_workers));
  env.emplace_back("TROUPE_NUM_SERVERS", std::to_string(run_.options.num_servers));
  env.emplace_back("TROUPE_RUN_ID", run_.run_id);
  env.emplace_back("TROUPE_GENERATION", std::to_string(run_.generation));
  env.emplace_back("TROUPE_RENDEZVOUS", run_.rendezvous);
  std::unique_ptr<MpiHostfile> hostfile;
  if (!run_.hosts.empty()) hostfile = std::make_unique<MpiHostfile>(run_.hosts);
  const auto argv = mpirunCommand(run_, env, hostfile.get());

  StopSignals stop_signals;
  const auto mpirun = spawnPiped(argv, env, std::string());
  int out = mpirun.out;
  std::string partial;
  auto line = [&](std::string_view text) { onLine(text); };
  int status = 0;
  bool running = true;
  int interrupted = 0;
  Clock::time_point kill_at = Clock::time_point::max();
  while (running || out >= 0) {
    if (out >= 0) {
      pollfd fd{out, POLLIN, 0};
      ::poll(&fd, 1, 100);
      if (fd.revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[8192];
        const ssize_t n = ::read(out, buf, sizeof buf);
        if (n > 0) {
          splitLines(partial, buf, static_cast<std::size_t>(n), line);
        } else if (n == 0 || errno != EINTR) {
          if (!partial.empty()) splitLines(partial, "\n", 1, line);
          ::close(out);
          out = -1;
        }
      }
    } else {
      ::usleep(20000);
    }
    if (running && ::waitpid(mpirun.pid, &status, WNOHANG) == mpirun.pid) running = false;
    if (stopSignal() && !interrupted && running) {
      interrupted = stopSignal();
      run_.relay.err("[launcher] got signal {} ({}); stopping mpirun", interrupted,
                     strsignal(interrupted));
      ::kill(mpirun.pid, SIGTERM);  // mpirun ends its job on SIGTERM
      kill_at = Clock::now() + run_.options.grace;
    }
    if (running && Clock::now() >= kill_at) {
      ::kill(-mpirun.pid, SIGKILL);
      kill_at = Clock::time_point::max();
    }
  }
  return summary(status, interrupted);
}

Attempt MpiSupervisor::summary(int status, int interrupted) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    run_.relay.out("[launcher] all {} process(es) exited 0", world_);
    return {};
  }
  // The launcher's own bookkeeping first, then mpirun's report.
  if (first_failed_) {
    const int code = *ranks_[static_cast<std::size_t>(*first_failed_)].exit;
    failure_ = MpiFailure{*first_failed_, "", describeShellCode(code), code};
  }
  if (failure_ && failure_->world_rank >= 0 && failure_->world_rank < world_) {
    const auto& r = ranks_[static_cast<std::size_t>(failure_->world_rank)];
    const std::string host = !r.host.empty()           ? r.host
                             : !failure_->host.empty() ? failure_->host
                                                       : "an unknown host";
    const int code = failure_->code ? failure_->code : exitCodeOf(status);
    const std::string ended = fmt::format("mpirun {} and ended the job", describeExit(status));
    const MpiRank* culprit = r.culprit ? rankNamed(*r.culprit) : nullptr;
    if (r.culprit && culprit != &r) {
      std::optional<Named> named_culprit;
      if (culprit) named_culprit = named(*culprit, "an unknown host");
      std::optional<std::string> gone;
      if (culprit && culprit->exit) gone = describeShellCode(*culprit->exit);
      return {code, fmt::format("{}; {}",
                                blame(*r.culprit, named_culprit ? &*named_culprit : nullptr, false,
                                      gone, named(r, host), failure_->what),
                                ended)};
    }
    return {code, fmt::format("{} {} on {}{} {}; {}", r.role, r.rank, host,
                              r.pid ? fmt::format(" (pid {})", r.pid) : "", failure_->what, ended)};
  }
  if (interrupted) {
    run_.relay.err("[launcher] run stopped by signal {}; mpirun {}", interrupted,
                   describeExit(status));
    return {128 + interrupted, "", true};
  }
  return {exitCodeOf(status) ? exitCodeOf(status) : 1,
          fmt::format("mpirun {} (no failing rank in its report)", describeExit(status))};
}

}  // namespace

Attempt runMpi(const RunContext& run) {
  return MpiSupervisor(run).run();
}

}  // namespace troupe::apps::launch_detail
