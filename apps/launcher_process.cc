#include "apps/launcher_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include "apps/launcher.h"
#include "apps/output_relay.h"
#include "troupe/error.h"

namespace troupe::apps::launch_detail {
namespace {

std::vector<char*> pointersTo(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& s : strings)
    pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// This process's environment with `env` set on top (a later K wins), as K=V strings.
std::vector<std::string> environmentWith(const Env& env) {
  std::vector<std::string> out;
  std::map<std::string, std::size_t, std::less<>> at;
  auto set = [&](std::string_view key, std::string entry) {
    if (const auto it = at.find(key); it != at.end()) {
      out[it->second] = std::move(entry);
    } else {
      at.emplace(std::string(key), out.size());
      out.push_back(std::move(entry));
    }
  };
  for (char** e = environ; e && *e; ++e) {
    const std::string_view entry(*e);
    set(entry.substr(0, entry.find('=')), std::string(entry));
  }
  for (const auto& [k, v] : env)
    set(k, k + "=" + v);
  return out;
}

// In a child between fork and exec (only async-signal-safe calls): execs `argv` with `envp`
// (PATH looked up in it), or says why not on stderr and exits 127.
[[noreturn]] void execOrExit(char** argv, char** envp) {
  ::signal(SIGPIPE, SIG_DFL);
  if (envp) environ = envp;
  ::execvp(argv[0], argv);
  const char* why = std::strerror(errno);
  for (const char* part : {"cannot start '", static_cast<const char*>(argv[0]), "': ", why, "\n"}) {
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, part, std::strlen(part));
  }
  ::_exit(127);
}

volatile sig_atomic_t g_stop_signal = 0;

extern "C" void onStopSignal(int signo) {
  g_stop_signal = signo;
}

// The stop handler, with no signal noted yet (cleared before the handler is in place).
void (*clearedStopHandler())(int) {
  g_stop_signal = 0;
  return onStopSignal;
}

}  // namespace

Spawned spawnPiped(const std::vector<std::string>& command, const Env& env,
                   const std::optional<std::string>& input) {
  // Built before the fork: the child may only make async-signal-safe calls.
  std::vector<std::string> args = command, environment = environmentWith(env);
  auto argv = pointersTo(args);
  auto envp = pointersTo(environment);
  int fds[2], in[2] = {-1, -1};
  if (::pipe2(fds, O_CLOEXEC) != 0) throw IoError(fmt::format("pipe: {}", std::strerror(errno)));
  if (input && ::pipe2(in, O_CLOEXEC) != 0) {
    throw IoError(fmt::format("pipe: {}", std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw IoError(fmt::format("fork: {}", std::strerror(errno)));
  if (pid == 0) {
    // The child dies with the launcher, so no process outlives a killed launcher.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    ::dup2(fds[1], STDOUT_FILENO);
    ::dup2(fds[1], STDERR_FILENO);
    if (input) ::dup2(in[0], STDIN_FILENO);
    ::setpgid(0, 0);
    execOrExit(argv.data(), envp.data());
  }
  ::close(fds[1]);
  if (input) {
    ::close(in[0]);
    const ssize_t written = ::write(in[1], input->data(), input->size());
    const int err = errno;
    ::close(in[1]);
    if (written != static_cast<ssize_t>(input->size()) && !(written < 0 && err == EPIPE)) {
      throw IoError(fmt::format("writing the input of '{}': {}", command[0],
                                written < 0 ? std::strerror(err) : "short write"));
    }
  }
  ::setpgid(pid, pid);  // also here: a kill(-pid) may come before the child's own setpgid
  return {pid, fds[0]};
}

std::vector<int> runAll(const std::vector<std::vector<std::string>>& commands,
                        std::chrono::milliseconds timeout, OutputRelay* relay,
                        const std::vector<std::string>& labels) {
  struct Run {
    pid_t pid = -1;
    int out = -1;
    std::string partial;
    std::string label;
    int status = 0;
    bool done = false;
  };
  std::vector<Run> runs;
  for (std::size_t i = 0; i < commands.size(); ++i) {
    std::vector<std::string> args = commands[i];
    auto argv = pointersTo(args);
    int fds[2] = {-1, -1};
    if (relay && ::pipe2(fds, O_CLOEXEC) != 0) {
      throw IoError(fmt::format("pipe: {}", std::strerror(errno)));
    }
    const pid_t pid = ::fork();
    if (pid < 0) throw IoError(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      const int null = ::open("/dev/null", O_RDWR);
      if (null >= 0) ::dup2(null, STDIN_FILENO);
      const int out = relay ? fds[1] : null;
      if (out >= 0) {
        ::dup2(out, STDOUT_FILENO);
        ::dup2(out, STDERR_FILENO);
      }
      execOrExit(argv.data(), nullptr);
    }
    if (relay) ::close(fds[1]);
    runs.push_back({pid, fds[0], "", i < labels.size() ? labels[i] : commands[i][0], 0, false});
  }
  const auto deadline = Clock::now() + timeout;
  // Once every one has exited, what is left in the pipes is read (what a grandchild that still
  // holds one writes later is not waited for).
  for (std::size_t left = runs.size(), read_any = 1; left > 0 || read_any;) {
    read_any = 0;
    std::vector<pollfd> fds;
    std::vector<Run*> owners;
    for (auto& r : runs) {
      if (r.out >= 0) {
        fds.push_back({r.out, POLLIN, 0});
        owners.push_back(&r);
      }
    }
    if (fds.empty() && left > 0) {
      ::usleep(10000);
    } else if (!fds.empty()) {
      ::poll(fds.data(), fds.size(), left > 0 ? 10 : 0);
    }
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Run& r = *owners[k];
      char buf[8192];
      const ssize_t n = ::read(r.out, buf, sizeof buf);
      auto onLine = [&](std::string_view line) {
        relay->relay(OutputRelay::Stream::kErr, r.label, line);
      };
      if (n > 0) {
        read_any = 1;
        splitLines(r.partial, buf, static_cast<std::size_t>(n), onLine);
      } else if (n == 0 || errno != EINTR) {
        if (!r.partial.empty()) splitLines(r.partial, "\n", 1, onLine);
        ::close(r.out);
        r.out = -1;
      }
    }
    for (auto& r : runs) {
      if (r.done) continue;
      if (::waitpid(r.pid, &r.status, WNOHANG) == r.pid) {
        r.done = true;
        --left;
      } else if (Clock::now() >= deadline) {
        ::kill(r.pid, SIGKILL);
        ::waitpid(r.pid, &r.status, 0);
        r.done = true;
        --left;
      }
    }
  }
  std::vector<int> statuses;
  for (auto& r : runs) {
    if (r.out >= 0) ::close(r.out);
    statuses.push_back(r.status);
  }
  return statuses;
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

std::string describeShellCode(int code) {
  if (code > 128 && code < 128 + NSIG) {
    return fmt::format("exited with code {} (128 + signal {}, {})", code, code - 128,
                       strsignal(code - 128));
  }
  return fmt::format("exited with code {}", code);
}

bool processGroupStopped(pid_t pgid) {
  DIR* proc = ::opendir("/proc");
  if (!proc) return false;
  bool stopped = false;
  while (const dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string text;
    if (!std::getline(in, text)) continue;
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    const auto paren = text.rfind(')');
    if (paren == std::string::npos) continue;
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (std::sscanf(text.c_str() + paren + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3) continue;
    if (pgrp == pgid && state == 'T') {
      stopped = true;
      break;
    }
  }
  ::closedir(proc);
  return stopped;
}

void terminateGroup(pid_t pgid) {
  ::kill(-pgid, SIGTERM);
  ::kill(-pgid, SIGCONT);
}

HeldSignals::HeldSignals(std::vector<int> signals, void (*handler)(int))
    : signals_(std::move(signals)), previous_(signals_.size()) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  for (std::size_t i = 0; i < signals_.size(); ++i)
    ::sigaction(signals_[i], &sa, &previous_[i]);
}

HeldSignals::~HeldSignals() {
  for (std::size_t i = 0; i < signals_.size(); ++i)
    ::sigaction(signals_[i], &previous_[i], nullptr);
}

StopSignals::StopSignals() : HeldSignals({SIGINT, SIGTERM, SIGHUP}, clearedStopHandler()) {}

int stopSignal() {
  return g_stop_signal;
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words)
    out += (out.empty() ? "" : " ") + shellQuote(w);
  return out;
}

std::string selfExecutable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "troupe";
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace troupe::apps::launch_detail
