// The slurm launcher: one srun for the whole world, its labelled output relayed with role and
// rank, the failing rank named from the wrappers' markers or srun's own report.
#include "apps/launcher_slurm.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "apps/cluster_env.h"
#include "apps/launcher_run.h"
#include "apps/launcher_ssh.h"
#include "apps/output_relay.h"
#include "transport/link.h"
#include "troupe/error.h"

namespace troupe::apps::launch_detail {
namespace {

struct SlurmTask {
  std::string role;
  int rank = 0;
  std::string host;
  long pid = 0;
  std::optional<int> exit;
  std::optional<Culprit> culprit;  // from its last culprit line
};

// What srun says about the first task that ended badly.
struct SrunFailure {
  int task = -1;
  std::string host;
  std::string what;
  int code = 0;
};

std::optional<std::string> envValue(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

bool onPath(const std::string& program) {
  const std::string path = envValue("PATH").value_or("/usr/bin:/bin");
  for (std::size_t start = 0; start <= path.size();) {
    const auto end = std::min(path.find(':', start), path.size());
    const std::string dir = end > start ? path.substr(start, end - start) : ".";
    if (::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

// This host's name as Slurm likely calls it: SLURMD_NODENAME inside an allocation, else the
// host name up to its first dot.
std::string thisNode() {
  if (auto name = envValue("SLURMD_NODENAME")) return *name;
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  const std::string name(buf);
  return name.substr(0, name.find('.'));
}

// The IPv4 address of `host` (getaddrinfo), if it has one.
std::optional<sockaddr_in> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) return std::nullopt;
  sockaddr_in address{};
  std::memcpy(&address, found->ai_addr, sizeof address);
  ::freeaddrinfo(found);
  return address;
}

std::string text(const sockaddr_in& address) {
  char out[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &address.sin_addr, out, sizeof out);
  return out;
}

// The local address packets to `node` leave from (a UDP connect sends nothing).
std::string routeSourceAddress(const std::string& node) {
  const auto to = resolve(node);
  if (!to) {
    throw IoError(fmt::format(
        "--launcher slurm: cannot resolve node '{}' of SLURM_JOB_NODELIST for the rendezvous "
        "store; give --interface",
        node));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok = fd >= 0 &&
                  ::connect(fd, reinterpret_cast<const sockaddr*>(&*to), sizeof *to) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    throw IoError(
        fmt::format("--launcher slurm: no route to node '{}' for the rendezvous store: {}", node,
                    std::strerror(err)));
  }
  return text(local);
}

// Maps SLURM_PROCID to TROUPE_ROLE and TROUPE_RANK, reports node, pid and step, runs "$@" and
// reports its exit code. Not exec: Slurm signals every process of the step, so the command goes
// with its shell, and the marker tells the launcher which task failed first.
std::string slurmWrapper(int num_servers) {
  return fmt::format(
      "r=${{SLURM_PROCID:?troupe launch: not started by srun}}; "
      "if [ \"$r\" -lt {0} ]; then TROUPE_ROLE=server; TROUPE_RANK=$r; "
      "else TROUPE_ROLE=worker; TROUPE_RANK=$((r - {0})); fi; "
      "export TROUPE_ROLE TROUPE_RANK; "
      "echo \"{1} host ${{SLURMD_NODENAME:-$(uname -n)}} pid $$ step "
      "$SLURM_JOB_ID.$SLURM_STEP_ID\"; "
      "\"$@\"; rc=$?; echo \"{1} exit $rc\"; exit $rc",
      num_servers, kMarker);
}

// Parses "TASK: text" (srun --label pads TASK with spaces); false for srun's own lines.
bool parseLabelled(std::string_view line, int& task, std::string_view& text) {
  const auto first = line.find_first_not_of(' ');
  if (first == std::string_view::npos) return false;
  const auto colon = line.find(": ", first);
  if (colon == std::string_view::npos || colon == first || colon - first > 6) return false;
  const std::string digits(line.substr(first, colon - first));
  if (digits.find_first_not_of("0123456789") != std::string::npos) return false;
  task = std::atoi(digits.c_str());
  text = line.substr(colon + 2);
  return true;
}

// Reads srun's report of the first task that ended badly: "srun: error: HOST: task N: Exited
// with exit code C", or the name of the signal that killed it ("... task N: Killed"). Of tasks
// reported together ("tasks 0-1: Killed") the first is named, and the others said.
void parseSrunLine(std::string_view line, std::optional<SrunFailure>& failure) {
  if (failure || line.rfind("srun: error: ", 0) != 0) return;
  const std::string rest(line.substr(13));
  auto at = rest.find(": task ");
  const bool several = at == std::string::npos;
  if (several) at = rest.find(": tasks ");
  if (at == std::string::npos) return;
  const auto list_at = at + (several ? 8 : 7);
  const auto end = rest.find(": ", list_at);
  if (end == std::string::npos) return;
  const std::string list = rest.substr(list_at, end - list_at);
  int task = 0, code = 0;
  if (std::sscanf(list.c_str(), "%d", &task) != 1) return;
  const std::string what = rest.substr(end + 2);
  SrunFailure f{task, rest.substr(0, at), "", 1};
  if (std::sscanf(what.c_str(), "Exited with exit code %d", &code) == 1) {
    f.what = fmt::format("exited with code {}", code);
    f.code = code;
  } else {
    f.what = fmt::format("ended: {}", what);
    for (int sig = 1; sig < NSIG; ++sig) {
      if (what == strsignal(sig)) {
        f.what = fmt::format("was killed by signal {} ({})", sig, what);
        f.code = 128 + sig;
        break;
      }
    }
  }
  if (several) f.what += fmt::format(" (srun reports tasks {} so at once)", list);
  failure = std::move(f);
}

std::string label(const SlurmTask& t) {
  return fmt::format("{} {}", t.role, t.rank);
}

Named named(const SlurmTask& t, const std::string& host_if_unknown) {
  return {label(t), t.host.empty() ? host_if_unknown : t.host,
          t.pid ? fmt::format("pid {}", t.pid) : ""};
}

// srun's command line; the values of `env` go in its environment (srun --export=ALL).
std::vector<std::string> srunCommand(const RunContext& run) {
  const auto& o = run.options;
  std::vector<std::string> argv{"srun",
                                "--ntasks=" + std::to_string(o.num_servers + o.num_workers),
                                "--label",
                                "--kill-on-bad-exit=1",
                                "--export=ALL",
                                "--job-name=troupe-" + run.run_id,
                                "sh",
                                "-c",
                                slurmWrapper(o.num_servers),
                                "troupe-launch"};
  argv.insert(argv.end(), run.command.begin(), run.command.end());
  return argv;
}

class SlurmSupervisor {
 public:
  explicit SlurmSupervisor(const RunContext& run)
      : run_(run), world_(run.options.num_servers + run.options.num_workers) {
    for (int r = 0; r < world_; ++r) {
      const bool server = r < run.options.num_servers;
      SlurmTask task;
      task.role = server ? "server" : "worker";
      task.rank = server ? r : r - run.options.num_servers;
      tasks_.push_back(std::move(task));
    }
  }

  Attempt run();

 private:
  void onLine(std::string_view line);
  void killStep(pid_t srun);
  Attempt summary(int status);
  const SlurmTask* taskNamed(const Culprit& c) const;

  const RunContext& run_;
  const int world_;
  std::vector<SlurmTask> tasks_;
  std::string step_;     // "JOB.STEP", once a task reported it
  int interrupted_ = 0;  // the launcher's stop signal: what fails after it is no failure to name
  std::optional<SrunFailure> failure_;
  std::optional<int> first_failed_;  // the first task whose wrapper reported a non-zero exit
};

void SlurmSupervisor::onLine(std::string_view line) {
  int task = -1;
  std::string_view text;
  if (!parseLabelled(line, task, text) || task < 0 || task >= world_) {
    run_.relay.relay(OutputRelay::Stream::kOut, "srun", line);
    if (!interrupted_) parseSrunLine(line, failure_);
    return;
  }
  auto& t = tasks_[static_cast<std::size_t>(task)];
  const auto at = text.find(kMarker);
  const auto relayed = text.substr(0, at);
  if (at == std::string_view::npos || at > 0) {
    if (auto culprit = parseCulprit(relayed)) t.culprit = std::move(culprit);
    run_.relay.relay(OutputRelay::Stream::kOut, label(t), relayed);
  }
  if (at == std::string_view::npos) return;
  const std::string rest(text.substr(at + kMarker.size()));
  char host[256] = {}, step[64] = {};
  long pid = 0;
  int code = 0;
  if (std::sscanf(rest.c_str(), " host %255s pid %ld step %63s", host, &pid, step) == 3) {
    t.host = host;
    t.pid = pid;
    step_ = step;
  } else if (std::sscanf(rest.c_str(), " exit %d", &code) == 1) {
    t.exit = code;
    if (code != 0 && !first_failed_ && !interrupted_) first_failed_ = task;
  }
}

// After the grace period: the step by scancel (srun may be past taking signals), then srun.
void SlurmSupervisor::killStep(pid_t srun) {
  if (!step_.empty()) {
    runAll({{"scancel", "--signal=KILL", "--full", step_}}, std::chrono::seconds(30), &run_.relay,
           {"scancel"});
  }
  ::kill(-srun, SIGKILL);
}

const SlurmTask* SlurmSupervisor::taskNamed(const Culprit& c) const {
  const auto it = std::find_if(tasks_.begin(), tasks_.end(), [&](const SlurmTask& t) {
    return t.role == c.role && t.rank == c.rank;
  });
  return it == tasks_.end() ? nullptr : &*it;
}

Attempt SlurmSupervisor::run() {
  auto env = run_.options.env;
  env.emplace_back("TROUPE_NUM_WORKERS", std::to_string(run_.options.num_workers));
  env.emplace_back("TROUPE_NUM_SERVERS", std::to_string(run_.options.num_servers));
  env.emplace_back("TROUPE_RUN_ID", run_.run_id);
  env.emplace_back("TROUPE_GENERATION", std::to_string(run_.generation));
  env.emplace_back("TROUPE_RENDEZVOUS", run_.rendezvous);
  const auto argv = srunCommand(run_);

  StopSignals stop_signals;
  const auto srun = spawnPiped(argv, env, std::string());
  int out = srun.out;
  std::string partial;
  auto line = [&](std::string_view text) { onLine(text); };
  int status = 0;
  bool running = true;
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
    if (running && ::waitpid(srun.pid, &status, WNOHANG) == srun.pid) running = false;
    if (stopSignal() && !interrupted_ && running) {
      interrupted_ = stopSignal();
      run_.relay.err("[launcher] got signal {} ({}); stopping srun", interrupted_,
                     strsignal(interrupted_));
      ::kill(srun.pid, SIGTERM);  // srun cancels its step on SIGTERM
      kill_at = Clock::now() + run_.options.grace;
    }
    if (running && Clock::now() >= kill_at) {
      killStep(srun.pid);
      kill_at = Clock::time_point::max();
    }
  }
  return summary(status);
}

Attempt SlurmSupervisor::summary(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    run_.relay.out("[launcher] all {} process(es) exited 0", world_);
    return {};
  }
  // The launcher's own bookkeeping first, then srun's report.
  if (first_failed_) {
    const int code = *tasks_[static_cast<std::size_t>(*first_failed_)].exit;
    failure_ = SrunFailure{*first_failed_, "", describeShellCode(code), code};
  }
  if (failure_ && failure_->task >= 0 && failure_->task < world_) {
    const auto& t = tasks_[static_cast<std::size_t>(failure_->task)];
    const std::string host = !t.host.empty()           ? t.host
                             : !failure_->host.empty() ? failure_->host
                                                       : "an unknown node";
    const int code = failure_->code ? failure_->code : exitCodeOf(status);
    const std::string ended = fmt::format("srun {} and ended the step", describeExit(status));
    const SlurmTask* culprit = t.culprit ? taskNamed(*t.culprit) : nullptr;
    if (t.culprit && culprit != &t) {
      std::optional<Named> named_culprit;
      if (culprit) named_culprit = named(*culprit, "an unknown node");
      std::optional<std::string> gone;
      if (culprit && culprit->exit) gone = describeShellCode(*culprit->exit);
      return {code, fmt::format("{}; {}",
                                blame(*t.culprit, named_culprit ? &*named_culprit : nullptr, false,
                                      gone, named(t, host), failure_->what),
                                ended)};
    }
    return {code, fmt::format("{} {} on {}{} {}; {}", t.role, t.rank, host,
                              t.pid ? fmt::format(" (pid {})", t.pid) : "", failure_->what, ended)};
  }
  if (interrupted_) {
    run_.relay.err("[launcher] run stopped by signal {}; srun {}", interrupted_,
                   describeExit(status));
    return {128 + interrupted_, "", true};
  }
  return {exitCodeOf(status) ? exitCodeOf(status) : 1,
          fmt::format("srun {} (no failing task in its report)", describeExit(status))};
}

}  // namespace

void checkSlurmLaunch(const LaunchOptions& o) {
  if (!onPath("srun")) {
    throw InputError(
        "--launcher slurm: srun is not on PATH (install Slurm's client: Debian's slurm-client)");
  }
  if (!envValue("SLURM_JOB_ID")) return;
  const auto tasks = envValue("SLURM_NTASKS");
  if (!tasks) return;
  const bool digits =
      tasks->size() <= 9 && tasks->find_first_not_of("0123456789") == std::string::npos;
  if (!digits) {
    throw InputError(
        fmt::format("SLURM_NTASKS='{}': expected the allocation's number of tasks", *tasks));
  }
  const int have = std::atoi(tasks->c_str());
  const int want = o.num_workers + o.num_servers;
  if (have < want) {
    throw InputError(fmt::format(
        "--launcher slurm: the run has {} process(es) ({} worker(s), {} server(s)) but this Slurm "
        "allocation (job {}) has {} task(s) (SLURM_NTASKS={}): ask sbatch or salloc for -n {}, or "
        "launch fewer",
        want, o.num_workers, o.num_servers, *envValue("SLURM_JOB_ID"), have, have, want));
  }
}

std::string slurmStoreBindAddress(const LaunchOptions& o) {
  std::string interface = o.interface;
  if (interface.empty()) interface = envValue("TROUPE_INTERFACE").value_or("");
  if (!interface.empty()) return transport::resolveInterface(interface);
  const std::string self = thisNode();
  if (const auto list = envValue("SLURM_JOB_NODELIST")) {
    for (const auto& node : expandSlurmHostlist(*list, "SLURM_JOB_NODELIST=" + *list)) {
      if (node != self) return routeSourceAddress(node);
    }
    return "127.0.0.1";
  }
  // Not in an allocation: the nodes srun will get are not known yet.
  const auto address = resolve(self);
  return address ? text(*address) : "127.0.0.1";
}

Attempt runSlurm(const RunContext& run) {
  return SlurmSupervisor(run).run();
}

}  // namespace troupe::apps::launch_detail
