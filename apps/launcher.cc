#include "apps/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <random>

#include "rendezvous/tcp_store.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  std::string role;
  int rank = 0;
  std::string host = "localhost";
  pid_t pid = -1;
  int out = -1;  // stdout and stderr, merged
  std::string partial;
  bool running = false;
  int status = 0;
};

std::string label(const Child& c) {
  return fmt::format("{} {}", c.role, c.rank);
}

std::string describeExit(int status) {
  if (WIFSIGNALED(status)) {
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  }
  return fmt::format("exited with code {}", WEXITSTATUS(status));
}

int exitCodeOf(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

std::string selfExecutable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "troupe";
  return std::string(buf, static_cast<std::size_t>(n));
}

std::string makeRunId() {
  std::random_device rd;
  return fmt::format("run-{:08x}{:04x}", rd(), rd() & 0xffff);
}

void relay(Child& c, const char* data, std::size_t n) {
  c.partial.append(data, n);
  std::size_t start = 0;
  for (std::size_t nl; (nl = c.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    fmt::print("[{}] {}\n", label(c), std::string_view(c.partial).substr(start, nl - start));
  }
  c.partial.erase(0, start);
  std::fflush(stdout);
}

void spawn(Child& c, const std::vector<std::string>& command,
           const std::vector<std::pair<std::string, std::string>>& env) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw IoError(fmt::format("pipe: {}", std::strerror(errno)));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw IoError(fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    // The child dies with the launcher, so no process outlives a killed launcher.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    ::setpgid(0, 0);
    for (const auto& [k, v] : env)
      ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : command)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot start '%s': %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  ::setpgid(pid, pid);  // also here: a kill(-pid) may come before the child's own setpgid
  c.pid = pid;
  c.out = fds[0];
  c.running = true;
}

}  // namespace

int launch(const LaunchOptions& o) {
  if (o.num_workers < 1) throw InputError("-n: need at least one worker");
  if (o.num_servers < 0) throw InputError("-s: the number of servers cannot be negative");
  if (o.command.empty()) throw InputError("no command to launch: put it after --");
  if (o.launcher != "local") {
    throw InputError(
        fmt::format("launcher '{}' is not available in this version (known: local)", o.launcher));
  }
  std::vector<std::string> command = o.command;
  // "troupe" means this troupe, whether or not it is on PATH.
  if (command[0] == "troupe") command[0] = selfExecutable();

  const std::string run_id = o.run_id.empty() ? makeRunId() : o.run_id;
  // The embedded store, served here for as long as the processes run.
  std::unique_ptr<rendezvous::TcpStoreServer> store;
  std::string rendezvous = o.rendezvous;
  if (rendezvous.empty()) {
    store = rendezvous::startTcpStoreServer("127.0.0.1", 0);
    rendezvous = "tcp://" + store->address();
  }
  std::vector<Child> children;
  auto add = [&](const char* role, int count) {
    for (int r = 0; r < count; ++r) {
      Child c;
      c.role = role;
      c.rank = r;
      children.push_back(std::move(c));
    }
  };
  add("server", o.num_servers);
  add("worker", o.num_workers);
  fmt::print("[launcher] run {}: {} worker(s), {} server(s), rendezvous {}{}\n", run_id,
             o.num_workers, o.num_servers, rendezvous, store ? " (embedded store)" : "");
  std::fflush(stdout);

  for (auto& c : children) {
    auto env = o.env;
    env.emplace_back("TROUPE_ROLE", c.role);
    env.emplace_back("TROUPE_RANK", std::to_string(c.rank));
    env.emplace_back("TROUPE_NUM_WORKERS", std::to_string(o.num_workers));
    env.emplace_back("TROUPE_NUM_SERVERS", std::to_string(o.num_servers));
    env.emplace_back("TROUPE_RUN_ID", run_id);
    env.emplace_back("TROUPE_RENDEZVOUS", rendezvous);
    spawn(c, command, env);
  }

  std::optional<std::size_t> failed;
  bool killing = false;
  Clock::time_point kill_at{};
  auto stopOthers = [&] {
    for (auto& c : children) {
      if (c.running) ::kill(-c.pid, SIGTERM);
    }
    killing = true;
    kill_at = Clock::now() + o.grace;
  };

  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::size_t> owners;
    for (std::size_t i = 0; i < children.size(); ++i) {
      if (children[i].out >= 0) {
        fds.push_back({children[i].out, POLLIN, 0});
        owners.push_back(i);
      }
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 100);
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto& c = children[owners[k]];
      char buf[8192];
      const ssize_t n = ::read(c.out, buf, sizeof buf);
      if (n > 0) {
        relay(c, buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        if (!c.partial.empty()) relay(c, "\n", 1);
        ::close(c.out);
        c.out = -1;
      }
    }
    // Reap everyone who exited; when several failed at once, one killed by a signal is the
    // likelier cause (the others exit because they lost it), then the lowest.
    std::optional<std::size_t> first_failure;
    for (std::size_t i = 0; i < children.size(); ++i) {
      auto& c = children[i];
      if (!c.running) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.status = status;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok) continue;
      if (!first_failure ||
          (WIFSIGNALED(status) && !WIFSIGNALED(children[*first_failure].status))) {
        first_failure = i;
      }
    }
    if (first_failure && !failed) {
      failed = first_failure;
      const auto& c = children[*failed];
      fmt::print(stderr, "[launcher] {} {} on {} (pid {}) {}; stopping the others\n", c.role,
                 c.rank, c.host, c.pid, describeExit(c.status));
      std::fflush(stderr);
      stopOthers();
    }
    if (killing && Clock::now() >= kill_at) {
      for (auto& c : children) {
        if (c.running) ::kill(-c.pid, SIGKILL);
      }
      killing = false;
    }
    bool any = false;
    for (const auto& c : children)
      any = any || c.running || c.out >= 0;
    if (!any) break;
    if (fds.empty()) ::usleep(20000);
  }
  if (failed) {
    const auto& c = children[*failed];
    fmt::print(stderr, "[launcher] run failed: {} {} on {} {}\n", c.role, c.rank, c.host,
               describeExit(c.status));
    return exitCodeOf(c.status) ? exitCodeOf(c.status) : 1;
  }
  fmt::print("[launcher] all {} process(es) exited 0\n", children.size());
  return 0;
}

}  // namespace troupe::apps
