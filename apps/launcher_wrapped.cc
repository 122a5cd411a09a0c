#include "apps/launcher_wrapped.h"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "apps/launcher_run.h"
#include "apps/launcher_ssh.h"
#include "apps/output_relay.h"

namespace troupe::apps::launch_detail {
namespace {

struct Task {
  std::string role;
  int rank = 0;
  std::string host;
  long pid = 0;
  std::optional<int> exit;
  std::optional<Culprit> culprit;  // from its last culprit line
  std::string first_error;         // the first error line it logged (its message)
  std::string partial;             // the start of a line the starter cut (WrappedStarter::nextTag)
};

std::string label(const Task& t) {
  return fmt::format("{} {}", t.role, t.rank);
}

Named named(const Task& t, const std::string& host_if_unknown) {
  return {label(t), t.host.empty() ? host_if_unknown : t.host,
          t.pid ? fmt::format("pid {}", t.pid) : ""};
}

class WrappedSupervisor {
 public:
  WrappedSupervisor(const RunContext& run, const StarterWords& words, WrappedStarter& starter)
      : run_(run),
        words_(words),
        starter_(starter),
        world_(run.options.num_servers + run.options.num_workers) {
    for (int r = 0; r < world_; ++r) {
      const bool server = r < run.options.num_servers;
      Task task;
      task.role = server ? "server" : "worker";
      task.rank = server ? r : r - run.options.num_servers;
      tasks_.push_back(std::move(task));
    }
  }

  Attempt run();

 private:
  void onLine(std::string_view line);
  Attempt summary(int status);
  const Task* taskNamed(const Culprit& c) const;

  const RunContext& run_;
  const StarterWords& words_;
  WrappedStarter& starter_;
  const int world_;
  std::vector<Task> tasks_;
  int interrupted_ = 0;  // the launcher's stop signal: what fails after it is no failure to name
  std::optional<TaskFailure> failure_;
  // The first task whose wrapper reported a non-zero exit before the starter reported another.
  std::optional<int> first_failed_;
};

void WrappedSupervisor::onLine(std::string_view line) {
  int index = -1;
  std::string_view text;
  if (!starter_.parseTag(line, index, text) || index < 0 || index >= world_) {
    run_.relay.relay(OutputRelay::Stream::kOut, words_.name, line);
    if (!interrupted_) starter_.parseOwnLine(line, failure_);
    return;
  }
  auto& t = tasks_[static_cast<std::size_t>(index)];
  // A line's first part, then another task's: kept until the rest of the line comes.
  if (const auto next = starter_.nextTag(text); next != std::string_view::npos) {
    t.partial += text.substr(0, next);
    onLine(text.substr(next));
    return;
  }
  std::string whole;
  if (!t.partial.empty()) {
    whole = std::move(t.partial) + std::string(text);
    t.partial.clear();
    text = whole;
  }
  const auto at = text.find(kMarker);
  const auto relayed = text.substr(0, at);
  if (at == std::string_view::npos || at > 0) {
    if (auto culprit = parseCulprit(relayed)) t.culprit = std::move(culprit);
    if (t.first_error.empty()) {
      if (auto error = parseErrorLine(relayed)) t.first_error = std::move(*error);
    }
    run_.relay.relay(OutputRelay::Stream::kOut, label(t), relayed);
  }
  if (at == std::string_view::npos) return;
  const std::string rest(text.substr(at + kMarker.size()));
  char host[256] = {};
  long pid = 0;
  int code = 0, used = 0;
  if (std::sscanf(rest.c_str(), " host %255s pid %ld%n", host, &pid, &used) == 2) {
    t.host = host;
    t.pid = pid;
    starter_.taskStarted(std::string_view(rest).substr(static_cast<std::size_t>(used)));
  } else if (std::sscanf(rest.c_str(), " exit %d", &code) == 1) {
    t.exit = code;
    // A task the starter reported failing first keeps the blame: this one may have ended of the
    // step's cancel that followed (srun's SIGTERM to the others when a task was killed).
    const bool reported_first = failure_ && failure_->task != index;
    if (code != 0 && !first_failed_ && !interrupted_ && !reported_first) first_failed_ = index;
  }
}

const Task* WrappedSupervisor::taskNamed(const Culprit& c) const {
  const auto it = std::find_if(tasks_.begin(), tasks_.end(),
                               [&](const Task& t) { return t.role == c.role && t.rank == c.rank; });
  return it == tasks_.end() ? nullptr : &*it;
}

Attempt WrappedSupervisor::run() {
  auto env = run_.options.env;
  env.emplace_back("TROUPE_NUM_WORKERS", std::to_string(run_.options.num_workers));
  env.emplace_back("TROUPE_NUM_SERVERS", std::to_string(run_.options.num_servers));
  env.emplace_back("TROUPE_RUN_ID", run_.run_id);
  env.emplace_back("TROUPE_GENERATION", std::to_string(run_.generation));
  env.emplace_back("TROUPE_RENDEZVOUS", run_.rendezvous);
  const auto argv = starter_.command(env);

  StopSignals stop_signals;
  const auto started = spawnPiped(argv, env, std::string());
  int out = started.out;
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
    if (running && ::waitpid(started.pid, &status, WNOHANG) == started.pid) running = false;
    if (stopSignal() && !interrupted_ && running) {
      interrupted_ = stopSignal();
      run_.relay.err("[launcher] got signal {} ({}); stopping {}", interrupted_,
                     strsignal(interrupted_), words_.name);
      ::kill(started.pid, SIGTERM);  // mpirun ends its job, srun cancels its step
      kill_at = Clock::now() + run_.options.grace;
    }
    if (running && Clock::now() >= kill_at) {
      starter_.kill(started.pid);
      kill_at = Clock::time_point::max();
    }
  }
  return summary(status);
}

Attempt WrappedSupervisor::summary(int status) {
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    run_.relay.out("[launcher] all {} process(es) exited 0", world_);
    return {};
  }
  // The launcher's own bookkeeping first, then the starter's report.
  if (first_failed_) {
    const int code = *tasks_[static_cast<std::size_t>(*first_failed_)].exit;
    failure_ = TaskFailure{*first_failed_, "", describeShellCode(code), code};
  }
  if (failure_ && failure_->task >= 0 && failure_->task < world_) {
    const auto& t = tasks_[static_cast<std::size_t>(failure_->task)];
    const std::string unknown = fmt::format("an unknown {}", words_.place);
    const std::string host = !t.host.empty()           ? t.host
                             : !failure_->host.empty() ? failure_->host
                                                       : unknown;
    const int code = failure_->code ? failure_->code : exitCodeOf(status);
    const std::string ended =
        fmt::format("{} {} and ended the {}", words_.name, describeExit(status), words_.group);
    const Task* culprit = t.culprit ? taskNamed(*t.culprit) : nullptr;
    // The task it blamed failed on its own, with an error: that is the first cause.
    if (culprit && culprit != &t && culprit->exit && *culprit->exit != 0 && !culprit->culprit &&
        !culprit->first_error.empty()) {
      const Named reporter = named(t, host);
      return {*culprit->exit,
              fmt::format("{}; {}",
                          ownFailure(named(*culprit, unknown), describeShellCode(*culprit->exit),
                                     culprit->first_error, &*t.culprit, &reporter, failure_->what),
                          ended)};
    }
    if (t.culprit && culprit != &t) {
      std::optional<Named> named_culprit;
      if (culprit) named_culprit = named(*culprit, unknown);
      std::optional<std::string> gone;
      if (culprit && culprit->exit) gone = describeShellCode(*culprit->exit);
      return {code, fmt::format("{}; {}",
                                blame(*t.culprit, named_culprit ? &*named_culprit : nullptr, false,
                                      gone, named(t, host), failure_->what),
                                ended)};
    }
    return {code, fmt::format("{} {} on {}{} {}{}; {}", t.role, t.rank, host,
                              t.pid ? fmt::format(" (pid {})", t.pid) : "", failure_->what,
                              t.first_error.empty() ? "" : ": " + t.first_error, ended)};
  }
  if (interrupted_) {
    run_.relay.err("[launcher] run stopped by signal {}; {} {}", interrupted_, words_.name,
                   describeExit(status));
    return {128 + interrupted_, "", true};
  }
  return {exitCodeOf(status) ? exitCodeOf(status) : 1,
          fmt::format("{} {} (no failing {} in its report)", words_.name, describeExit(status),
                      words_.task)};
}

}  // namespace

std::string wrapperScript(int num_servers, std::string_view rank_variable, std::string_view starter,
                          std::string_view host, std::string_view extra,
                          std::string_view worker_env) {
  return fmt::format(
      "r=${{{2}:?troupe launch: not started by {3}}}; "
      "if [ \"$r\" -lt {0} ]; then TROUPE_ROLE=server; TROUPE_RANK=$r; "
      "else TROUPE_ROLE=worker; TROUPE_RANK=$((r - {0})); {7}fi; "
      "export TROUPE_ROLE TROUPE_RANK; echo \"{1} host {4} pid $${5}{6}\"; "
      "\"$@\"; rc=$?; echo \"{1} exit $rc\"; exit $rc",
      num_servers, kMarker, rank_variable, starter, host, extra.empty() ? "" : " ", extra,
      worker_env);
}

std::string torchrunExports(const RunContext& run, std::string_view prelude,
                            const TorchrunPlace& place, int port) {
  if (run.options.num_servers > 0) return "";
  std::string names, out(prelude);
  for (const auto& [name, value] : torchrunVariables(run, place, port)) {
    out += fmt::format("{}=\"{}\"; ", name, value);
    names += " " + name;
  }
  return out + "export" + names + "; ";
}

Attempt runWrapped(const RunContext& run, const StarterWords& words, WrappedStarter& starter) {
  return WrappedSupervisor(run, words, starter).run();
}

}  // namespace troupe::apps::launch_detail
