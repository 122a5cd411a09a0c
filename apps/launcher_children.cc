// The local and ssh launchers: one child process per role and rank, supervised from one loop
// that polls their pipes, relays their lines, reaps them, names the failure and stops the rest.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "apps/launcher_run.h"
#include "apps/launcher_ssh.h"
#include "apps/output_relay.h"
#include "troupe/error.h"

namespace troupe::apps::launch_detail {
namespace {

struct Child {
  std::string role;
  int rank = 0;
  std::string host = "localhost";
  pid_t pid = -1;
  int out = -1;  // stdout and stderr, merged
  std::string partial;
  bool running = false;
  int status = 0;
  std::optional<Culprit> culprit;  // from its last culprit line
  std::string first_error;         // the first error line it logged (its message)
  // ssh only.
  const LaunchHost* remote = nullptr;
  long remote_pgid = 0;  // from the wrapper's first marker line; 0: not known yet
  std::optional<int> remote_exit;
  bool term_sent = false;
  bool unreachable = false;  // the ssh that carried SIGTERM could not reach the host (exit 255)
  // Elastic runs: ended by the launcher after the run finished without it (stopped, or late).
  bool ended_after_run = false;
  bool stopped_after_run = false;  // of those, one that was stopped (SIGSTOP)
};

// Elastic runs: how long a worker may go on after another finished the run (the last generation's
// others finish within a step of it; a joiner that came late is told at its next look).
constexpr auto kRunOverDrain = std::chrono::seconds(60);

std::string label(const Child& c) {
  return fmt::format("{} {}", c.role, c.rank);
}

Outcome localOutcome(int status) {
  return {WIFEXITED(status) && WEXITSTATUS(status) == 0, exitCodeOf(status), WIFSIGNALED(status),
          describeExit(status)};
}

Outcome sshOutcome(const Child& c) {
  if (c.remote_exit) {
    const int code = *c.remote_exit;
    return {code == 0, code, code > 128, describeShellCode(code)};
  }
  if (WIFSIGNALED(c.status)) {
    return {false, exitCodeOf(c.status), true,
            fmt::format("lost its ssh client, which {}", describeExit(c.status))};
  }
  const int code = WEXITSTATUS(c.status);
  if (c.remote_pgid == 0) {
    return {false, code ? code : 1, false,
            fmt::format("could not be reached or started: ssh exited with code {}", code)};
  }
  return {false, code ? code : 1, code == 255,
          fmt::format("ended without reporting an exit code (killed, or the connection was lost): "
                      "ssh exited with code {}",
                      code)};
}

class Supervisor {
 public:
  Supervisor(Kind kind, const RunContext& run)
      : kind_(kind), run_(run), o_(run.options), ssh_options_(userSshOptions(run.options)) {}

  Attempt run();

 private:
  void start();
  bool pump();  // false: no pipe left to poll
  void onLine(Child& c, std::string_view line);
  void relayText(Child& c, std::string_view text);
  void reap();
  void fail(std::size_t index);
  void leftOut(std::size_t index, const Outcome& outcome);
  void stopOthers();
  void endAfterRun();
  // ended_only: those endAfterRun ended; else every one still running.
  void killRemaining(bool ended_only = false);
  void signalRemote(const std::vector<Child*>& targets, const char* sig);
  void terminateRemote(bool ended_only = false);
  Outcome outcomeOf(const Child& c) const {
    return kind_ == Kind::kSsh ? sshOutcome(c) : localOutcome(c.status);
  }
  std::string pidOf(const Child& c) const;
  std::string culpritFirst(const Child& failed, const Outcome& outcome) const;
  const Child* failedOnItsOwn(const Child& failed) const;
  const Child* childNamed(const Culprit& line) const;

  const Kind kind_;
  const RunContext& run_;
  const LaunchOptions& o_;
  const std::vector<std::string> ssh_options_;
  std::vector<Child> children_;
  FailurePicker picker_;
  std::vector<std::string> left_out_;  // elastic runs: the failures the others went on without
  std::optional<Outcome> last_left_out_;
  int finished_ = 0;                                // elastic runs: processes that exited 0
  std::optional<Clock::time_point> run_over_at_;    // elastic runs: when the first exited 0
  std::optional<Clock::time_point> kill_ended_at_;  // SIGKILL for those endAfterRun ended
  std::optional<std::size_t> failed_;
  const Child* named_ = nullptr;  // the process the failure names (failed_'s, or its cause)
  bool named_by_signal_ = false;
  std::string changed_;  // torchrun's elastic model: why every process was stopped (AgentPlace)
  int code_ = 0;         // the exit code of the process named
  std::string failure_;  // the summary of the failure named
  bool killing_ = false;
  Clock::time_point kill_at_{};
  int interrupted_ = 0;
};

void Supervisor::start() {
  const std::string dir =
      o_.sync_dst_dir.empty() ? std::filesystem::current_path().string() : o_.sync_dst_dir;
  for (auto& p : planProcesses(kind_, run_)) {
    Child c;
    c.role = p.role;
    c.rank = p.rank;
    c.remote = p.remote;
    c.host = p.host;
    auto env = o_.env;
    env.insert(env.end(), p.env.begin(), p.env.end());
    const auto started = kind_ == Kind::kSsh
                             ? spawnSsh(ssh_options_, *c.remote, dir, env, run_.command)
                             : spawnPiped(run_.command, env, std::nullopt);
    c.pid = started.pid;
    c.out = started.out;
    c.running = true;
    children_.push_back(std::move(c));
  }
}

void Supervisor::relayText(Child& c, std::string_view text) {
  if (auto culprit = parseCulprit(text)) c.culprit = std::move(culprit);
  if (c.first_error.empty()) {
    if (auto error = parseErrorLine(text)) c.first_error = std::move(*error);
  }
  run_.relay.relay(OutputRelay::Stream::kOut, label(c), text);
}

// An ssh wrapper's marker lines are recorded; anything else is relayed.
void Supervisor::onLine(Child& c, std::string_view line) {
  const auto at = kind_ == Kind::kSsh ? line.find(kMarker) : std::string_view::npos;
  if (at == std::string_view::npos) {
    relayText(c, line);
    return;
  }
  // Output without a final newline runs into the exit marker.
  if (at > 0) relayText(c, line.substr(0, at));
  const std::string rest(line.substr(at + kMarker.size()));
  long value = 0;
  char what[8] = {};
  if (std::sscanf(rest.c_str(), " %7s %ld", what, &value) != 2) return;
  if (std::string_view(what) == "pid") c.remote_pgid = value;
  if (std::string_view(what) == "exit") c.remote_exit = static_cast<int>(value);
}

bool Supervisor::pump() {
  std::vector<pollfd> fds;
  std::vector<std::size_t> owners;
  for (std::size_t i = 0; i < children_.size(); ++i) {
    if (children_[i].out >= 0) {
      fds.push_back({children_[i].out, POLLIN, 0});
      owners.push_back(i);
    }
  }
  if (fds.empty()) return false;
  ::poll(fds.data(), fds.size(), 100);
  for (std::size_t k = 0; k < fds.size(); ++k) {
    if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto& c = children_[owners[k]];
    auto line = [&](std::string_view text) { onLine(c, text); };
    char buf[8192];
    const ssize_t n = ::read(c.out, buf, sizeof buf);
    if (n > 0) {
      splitLines(c.partial, buf, static_cast<std::size_t>(n), line);
    } else if (n == 0 || errno != EINTR) {
      if (!c.partial.empty()) splitLines(c.partial, "\n", 1, line);
      ::close(c.out);
      c.out = -1;
    }
  }
  return true;
}

// Reaps everyone who exited (once their output is drained: an ssh child's exit code comes in it).
void Supervisor::reap() {
  for (std::size_t i = 0; i < children_.size(); ++i) {
    auto& c = children_[i];
    if (!c.running || (kind_ == Kind::kSsh && c.out >= 0)) continue;
    int status = 0;
    if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    c.running = false;
    c.status = status;
    const Outcome outcome = outcomeOf(c);
    if (!o_.elastic.empty()) {
      leftOut(i, outcome);
    } else {
      picker_.ended(i, outcome);
    }
  }
}

std::string Supervisor::pidOf(const Child& c) const {
  if (kind_ == Kind::kSsh && c.remote_pgid > 0) return fmt::format("remote pid {}", c.remote_pgid);
  return fmt::format("{}pid {}", kind_ == Kind::kSsh ? "ssh " : "", c.pid);
}

// The process that `failed` blamed on a culprit line, if it is one of the run's and ended
// non-zero on its own (no culprit line of its own) after logging an error: the first cause.
const Child* Supervisor::failedOnItsOwn(const Child& failed) const {
  if (!failed.culprit) return nullptr;
  const Child* blamed = childNamed(*failed.culprit);
  if (blamed == nullptr || blamed == &failed || blamed->running || blamed->culprit ||
      blamed->first_error.empty() || outcomeOf(*blamed).ok) {
    return nullptr;
  }
  return blamed;
}

// The process of the run a culprit line names; null when it names none of them.
const Child* Supervisor::childNamed(const Culprit& line) const {
  const auto it = std::find_if(children_.begin(), children_.end(), [&](const Child& c) {
    return c.role == line.role && c.rank == line.rank;
  });
  return it == children_.end() ? nullptr : &*it;
}

// The failure named after the peer that `failed` blamed on a culprit line; empty if none.
std::string Supervisor::culpritFirst(const Child& failed, const Outcome& outcome) const {
  if (!failed.culprit) return "";
  const auto& line = *failed.culprit;
  const Child* blamed = childNamed(line);
  if (blamed == &failed) return "";  // blames itself: nothing to add
  const Named reporter{label(failed), failed.host, pidOf(failed)};
  if (blamed == nullptr) return blame(line, nullptr, false, std::nullopt, reporter, outcome.what);
  const Named culprit{label(*blamed), blamed->host, pidOf(*blamed)};
  const bool stopped = kind_ == Kind::kLocal && blamed->running && processGroupStopped(blamed->pid);
  std::optional<std::string> ended;
  if (!blamed->running) ended = outcomeOf(*blamed).what;
  return blame(line, &culprit, stopped, ended, reporter, outcome.what);
}

// Names the failure (before stopping anyone: a stopped culprit is seen as such) and stops the
// others. A process blamed by the one that failed, which failed on its own with an error, is
// named first, with its error: the others only lost it.
void Supervisor::fail(std::size_t index) {
  failed_ = index;
  const auto& c = children_[index];
  const Outcome& outcome = picker_.outcome();
  code_ = outcome.code;
  named_ = &c;
  named_by_signal_ = outcome.by_signal;
  if (const Child* cause = failedOnItsOwn(c)) {
    const Outcome own = outcomeOf(*cause);
    code_ = own.code;
    named_ = cause;
    named_by_signal_ = own.by_signal;
    const Named reporter{label(c), c.host, pidOf(c)};
    failure_ = ownFailure({label(*cause), cause->host, pidOf(*cause)}, own.what, cause->first_error,
                          &*c.culprit, &reporter, outcome.what);
  } else {
    failure_ = culpritFirst(c, outcome);
  }
  if (failure_.empty()) {
    if (c.first_error.empty()) {
      run_.relay.err("[launcher] {} on {} ({}) {}; stopping the others", label(c), c.host, pidOf(c),
                     outcome.what);
      failure_ = fmt::format("{} on {} {}", label(c), c.host, outcome.what);
    } else {
      failure_ = ownFailure({label(c), c.host, pidOf(c)}, outcome.what, c.first_error);
      run_.relay.err("[launcher] {}; stopping the others", failure_);
    }
  } else {
    run_.relay.err("[launcher] {}; stopping the others", failure_);
  }
  stopOthers();
}

// An elastic run goes on without a process that failed (the others re-form without it).
void Supervisor::leftOut(std::size_t index, const Outcome& outcome) {
  const auto& c = children_[index];
  if (outcome.ok) {
    ++finished_;
    // A worker exits 0 only once the run is over: the others follow, or are ended (endAfterRun).
    if (!run_over_at_) run_over_at_ = Clock::now();
    return;
  }
  if (c.ended_after_run) {
    const std::string what =
        c.stopped_after_run
            ? "was stopped (SIGSTOP) when the run finished; ended by the launcher"
            : fmt::format("was still running {} s after the run finished; ended by the launcher",
                          std::chrono::duration_cast<std::chrono::seconds>(
                              std::max<std::chrono::milliseconds>(o_.grace, kRunOverDrain))
                              .count());
    left_out_.push_back(fmt::format("{} on {} {}", label(c), c.host, what));
    run_.relay.err("[launcher] {} on {} ({}) {}", label(c), c.host, pidOf(c), what);
    return;
  }
  last_left_out_ = outcome;
  left_out_.push_back(fmt::format("{} on {} {}", label(c), c.host, outcome.what));
  run_.relay.err("[launcher] {} on {} ({}) {}; elastic run: the others go on without it", label(c),
                 c.host, pidOf(c), outcome.what);
}

// ssh: signals the remote process groups of `targets` through a second ssh each. TERM comes
// with a CONT, which a stopped process needs to act on it.
void Supervisor::signalRemote(const std::vector<Child*>& targets, const char* sig) {
  std::vector<std::vector<std::string>> commands;
  for (const auto* c : targets) {
    const std::string kill =
        std::string_view(sig) == "TERM"
            ? fmt::format(
                  "kill -s TERM -- -{0} 2>/dev/null; kill -s CONT -- -{0} 2>/dev/null; true",
                  c->remote_pgid)
            : fmt::format("kill -s {} -- -{} 2>/dev/null || true", sig, c->remote_pgid);
    commands.push_back(sshRun(ssh_options_, *c->remote, kill));
  }
  const auto statuses = runAll(commands, std::chrono::seconds(30));
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (WIFEXITED(statuses[i]) && WEXITSTATUS(statuses[i]) == 0) continue;
    // ssh's own failure (no route, refused, timed out): a second ssh would wait as long again.
    // Its local ssh client would wait for the dead connection too: end it now.
    if (WIFEXITED(statuses[i]) && WEXITSTATUS(statuses[i]) == 255) {
      targets[i]->unreachable = true;
      ::kill(-targets[i]->pid, SIGKILL);
    }
    run_.relay.err("[launcher] could not send SIG{} to {} on {} (remote pid {}): ssh {}", sig,
                   label(*targets[i]), targets[i]->host, targets[i]->remote_pgid,
                   describeExit(statuses[i]));
  }
}

// ssh: the remote groups not yet told to stop, now that their pid is known.
void Supervisor::terminateRemote(bool ended_only) {
  std::vector<Child*> targets;
  for (auto& c : children_) {
    if (c.running && (!ended_only || c.ended_after_run) && c.remote_pgid > 0 && !c.term_sent) {
      c.term_sent = true;
      targets.push_back(&c);
    }
  }
  if (!targets.empty()) signalRemote(targets, "TERM");
}

void Supervisor::stopOthers() {
  if (kind_ == Kind::kSsh) {
    terminateRemote();
  } else {
    for (auto& c : children_) {
      if (c.running) terminateGroup(c.pid);
    }
  }
  killing_ = true;
  kill_at_ = Clock::now() + o_.grace;
}

// Elastic runs, once a worker finished the run: a local worker that is stopped will never
// finish, and is ended at once; any worker still running after the drain is ended too (the run
// went on without it). SIGKILL follows after the grace period (killRemaining).
void Supervisor::endAfterRun() {
  if (!run_over_at_) return;
  const auto now = Clock::now();
  const bool drained =
      now - *run_over_at_ >= std::max<std::chrono::milliseconds>(o_.grace, kRunOverDrain);
  for (auto& c : children_) {
    if (!c.running || c.ended_after_run) continue;
    const bool stopped = kind_ == Kind::kLocal && processGroupStopped(c.pid);
    if (!stopped && !drained) continue;
    c.ended_after_run = true;
    c.stopped_after_run = stopped;
    if (kind_ == Kind::kLocal) terminateGroup(c.pid);
    kill_ended_at_ = now + o_.grace;
  }
  if (kind_ == Kind::kSsh) terminateRemote(/*ended_only=*/true);  // pids known late, too
  if (kill_ended_at_ && now >= *kill_ended_at_) {
    killRemaining(/*ended_only=*/true);
    kill_ended_at_.reset();
  }
}

void Supervisor::killRemaining(bool ended_only) {
  const auto target = [&](const Child& c) {
    return c.running && (!ended_only || c.ended_after_run);
  };
  if (kind_ == Kind::kSsh) {
    std::vector<Child*> targets;
    for (auto& c : children_) {
      if (target(c) && c.remote_pgid > 0 && !c.unreachable) targets.push_back(&c);
    }
    if (!targets.empty()) signalRemote(targets, "KILL");
  }
  for (auto& c : children_) {
    if (target(c)) ::kill(-c.pid, SIGKILL);
  }
  if (!ended_only) killing_ = false;
}

Attempt Supervisor::run() {
  start();
  std::optional<StopSignals> stop_signals;
  if (kind_ == Kind::kSsh) stop_signals.emplace();
  for (;;) {
    const bool polled = pump();
    reap();
    const bool all_done =
        std::none_of(children_.begin(), children_.end(), [](const Child& c) { return c.running; });
    if (!interrupted_ && changed_.empty()) {
      if (const auto failed = picker_.pick(all_done)) fail(*failed);
    }
    if (stopSignal() && !interrupted_) {
      interrupted_ = stopSignal();
      run_.relay.err("[launcher] got signal {} ({}); stopping every process", interrupted_,
                     strsignal(interrupted_));
      if (!killing_) stopOthers();
    }
    if (run_.agent && run_.agent->watch && !interrupted_ && !failed_ && changed_.empty() &&
        !all_done) {
      changed_ = run_.agent->watch();
      if (!changed_.empty()) {
        run_.relay.err("[launcher] {}: stopping this launcher's workers", changed_);
        stopOthers();
      }
    }
    if (!interrupted_ && !failed_) endAfterRun();
    if (killing_ && kind_ == Kind::kSsh) terminateRemote();
    if (killing_ && Clock::now() >= kill_at_) killRemaining();
    const bool any = std::any_of(children_.begin(), children_.end(),
                                 [](const Child& c) { return c.running || c.out >= 0; });
    if (!any) break;
    if (!polled) ::usleep(20000);
  }
  if (interrupted_) {
    run_.relay.err("[launcher] run stopped by signal {}", interrupted_);
    return {128 + interrupted_, "", true};
  }
  if (!changed_.empty()) return {0, changed_, false, /*changed=*/true};
  if (failed_) {
    const int rank = named_ && named_->role == "worker" ? named_->rank : -1;
    return {code_ ? code_ : 1, failure_, false, false, rank, named_by_signal_};
  }
  if (!left_out_.empty()) {
    if (finished_ == 0) {  // the last to fail is the one that gave up on the run, naming why
      const int code = last_left_out_->code;
      return {code ? code : 1,
              fmt::format("no process finished the elastic run; {}", fmt::join(left_out_, "; "))};
    }
    run_.relay.out("[launcher] {} of {} process(es) exited 0; left out: {}", finished_,
                   children_.size(), fmt::join(left_out_, "; "));
    return {};
  }
  run_.relay.out("[launcher] all {} process(es) exited 0", children_.size());
  return {};
}

// torchrun's variables for the local and ssh launchers, whose workers' places are known here:
// each worker's RANK, its LOCAL_RANK and LOCAL_WORLD_SIZE among the workers of its host, and the
// hosts' GROUP_RANK and GROUP_WORLD_SIZE (torchrunVariables says the rest).
void addTorchrunVariables(Kind kind, const RunContext& run, std::vector<PlannedProcess>& planned) {
  std::map<std::string, int> workers_on, host_index;
  for (const auto& p : planned) {
    if (p.role != "worker") continue;
    ++workers_on[p.host];
    host_index.emplace(p.host, static_cast<int>(host_index.size()));
  }
  const auto first = std::find_if(planned.begin(), planned.end(),
                                  [](const PlannedProcess& p) { return p.role == "worker"; });
  if (first == planned.end()) return;
  const AgentPlace* agent = run.agent;
  const std::string addr = agent                  ? agent->master_addr
                           : kind == Kind::kLocal ? "127.0.0.1"
                                                  : first->remote->name;
  const int port = agent ? agent->master_port : masterPort(run, kind == Kind::kLocal);
  std::map<std::string, int> local_rank;
  for (auto& p : planned) {
    if (p.role != "worker") continue;
    TorchrunPlace place{
        std::to_string(p.rank),
        std::to_string(local_rank[p.host]++),
        std::to_string(workers_on[p.host]),
        std::to_string(agent ? agent->group_rank : host_index[p.host]),
        std::to_string(agent ? agent->group_size : static_cast<int>(host_index.size())),
        addr};
    for (auto& kv : torchrunVariables(run, place, port))
      p.env.push_back(std::move(kv));
  }
}

}  // namespace

int freeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof at;
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&at), &size) == 0;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) {
    throw InputError(
        fmt::format("troupe launch: no free port on 127.0.0.1 for MASTER_PORT ({}); "
                    "name one with --master_port",
                    std::strerror(error)));
  }
  return ntohs(at.sin_port);
}

int masterPort(const RunContext& run, bool this_host) {
  if (run.options.master_port > 0) return run.options.master_port;
  return this_host ? freeLoopbackPort() : 29500;
}

std::vector<std::pair<std::string, std::string>> torchrunVariables(const RunContext& run,
                                                                   const TorchrunPlace& place,
                                                                   int port) {
  const LaunchOptions& o = run.options;
  const std::string world = std::to_string(run.agent ? run.agent->world_size : o.num_workers);
  const std::vector<std::pair<std::string, std::string>> all = {
      {"RANK", place.rank},
      {"WORLD_SIZE", world},
      {"LOCAL_RANK", place.local_rank},
      {"LOCAL_WORLD_SIZE", place.local_size},
      {"GROUP_RANK", place.group_rank},
      {"GROUP_WORLD_SIZE", place.group_size},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", place.rank},
      {"ROLE_WORLD_SIZE", world},
      {"MASTER_ADDR", o.master_addr.empty() ? place.master_addr : o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"TORCHELASTIC_RUN_ID", run.run_id},
      {"TORCHELASTIC_RESTART_COUNT",
       std::to_string(run.agent ? run.agent->restarts : run.generation)},
      {"TORCHELASTIC_MAX_RESTARTS",
       std::to_string(o.on_failure == "restart" || run.agent ? o.max_restarts : 0)}};
  std::vector<std::pair<std::string, std::string>> vars;
  for (const auto& [name, value] : all) {
    // What --env gave stays: every process gets the launch's own variables before these.
    const bool given =
        std::any_of(o.env.begin(), o.env.end(), [&](const auto& kv) { return kv.first == name; });
    if (!given && !value.empty()) vars.emplace_back(name, value);
  }
  return vars;
}

std::vector<PlannedProcess> planProcesses(Kind kind, const RunContext& run) {
  const LaunchOptions& o = run.options;
  std::vector<PlannedProcess> planned;
  auto add = [&](const char* role, int count) {
    for (int r = 0; r < count; ++r) {
      PlannedProcess p;
      p.role = role;
      p.rank = r + (run.agent ? run.agent->rank_base : 0);
      if (kind == Kind::kSsh) {
        p.remote = &run.hosts[static_cast<std::size_t>(r) % run.hosts.size()];
        p.host = p.remote->display();
      }
      planned.push_back(std::move(p));
    }
  };
  add("server", o.num_servers);
  add("worker", o.num_workers);
  // How many of the run's processes share each host, so each can size its thread pool.
  std::map<std::string, int> per_host;
  for (const auto& p : planned)
    ++per_host[p.host];
  for (auto& p : planned) {
    p.env = {{"TROUPE_LOCAL_SIZE", std::to_string(per_host[p.host])},
             {"TROUPE_ROLE", p.role},
             {"TROUPE_RANK", std::to_string(p.rank)},
             {"TROUPE_NUM_WORKERS", run.agent           ? std::to_string(run.agent->world_size)
                                    : o.elastic.empty() ? std::to_string(o.num_workers)
                                                        : o.elastic},
             {"TROUPE_NUM_SERVERS", std::to_string(o.num_servers)},
             {"TROUPE_RUN_ID", run.run_id},
             {"TROUPE_GENERATION", std::to_string(run.generation)},
             {"TROUPE_RENDEZVOUS", run.rendezvous}};
  }
  addTorchrunVariables(kind, run, planned);
  return planned;
}

Attempt runChildren(Kind kind, const RunContext& run) {
  return Supervisor(kind, run).run();
}

}  // namespace troupe::apps::launch_detail
