#include "apps/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>

#include "actors/run_id.h"
#include "rendezvous/tcp_store.h"
#include "transport/auth.h"
#include "transport/link.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

// Lines a remote wrapper prints for the launcher alone; never relayed.
constexpr std::string_view kMarker = "@@troupe-launch@@";
// How long after a first failure the launcher waits for a process killed by a signal before it
// names the first failure and stops the others.
constexpr auto kSettle = std::chrono::milliseconds(500);

enum class Kind { kLocal, kSsh };

struct Child {
  std::string role;
  int rank = 0;
  std::string host = "localhost";
  pid_t pid = -1;
  int out = -1;  // stdout and stderr, merged
  std::string partial;
  bool running = false;
  int status = 0;
  // ssh only.
  const LaunchHost* remote = nullptr;
  long remote_pgid = 0;  // from the wrapper's first marker line; 0: not known yet
  std::optional<int> remote_exit;
  bool term_sent = false;
};

// How a process ended, as the launcher reports it.
struct Outcome {
  bool ok = true;
  int code = 0;  // the launcher's exit code when this one is the failure
  bool by_signal = false;
  std::string what;  // "exited with code 3"
};

// How one start of the whole world ended.
struct Attempt {
  int code = 0;              // 0: every process exited 0
  std::string failure;       // who failed and how: "worker 1 on localhost exited with code 3"
  bool interrupted = false;  // the launcher got SIGINT, SIGTERM or SIGHUP: never restarted
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

Outcome localOutcome(int status) {
  return {WIFEXITED(status) && WEXITSTATUS(status) == 0, exitCodeOf(status), WIFSIGNALED(status),
          describeExit(status)};
}

// A code a shell reports for a child it lost to a signal, spelled out.
std::string describeShellCode(int code) {
  if (code > 128 && code < 128 + NSIG) {
    return fmt::format("exited with code {} (128 + signal {}, {})", code, code - 128,
                       strsignal(code - 128));
  }
  return fmt::format("exited with code {}", code);
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

// Appends `data` to `partial` and hands each complete line to `on_line`.
template <typename F>
void splitLines(std::string& partial, const char* data, std::size_t n, F&& on_line) {
  partial.append(data, n);
  std::size_t start = 0;
  for (std::size_t nl; (nl = partial.find('\n', start)) != std::string::npos; start = nl + 1) {
    on_line(std::string_view(partial).substr(start, nl - start));
  }
  partial.erase(0, start);
}

void printLine(std::string_view who, std::string_view line) {
  fmt::print("[{}] {}\n", who, line);
}

// Handles a line of an ssh child: the wrapper's markers are recorded, anything else relayed.
void sshLine(Child& c, std::string_view line) {
  const auto at = line.find(kMarker);
  if (at == std::string_view::npos) {
    printLine(label(c), line);
    return;
  }
  // Output without a final newline runs into the exit marker.
  if (at > 0) printLine(label(c), line.substr(0, at));
  const std::string rest(line.substr(at + kMarker.size()));
  long value = 0;
  char what[8] = {};
  if (std::sscanf(rest.c_str(), " %7s %ld", what, &value) != 2) return;
  if (std::string_view(what) == "pid") c.remote_pgid = value;
  if (std::string_view(what) == "exit") c.remote_exit = static_cast<int>(value);
}

void relay(Child& c, Kind kind, const char* data, std::size_t n) {
  splitLines(c.partial, data, n, [&](std::string_view line) {
    if (kind == Kind::kSsh) {
      sshLine(c, line);
    } else {
      printLine(label(c), line);
    }
  });
  std::fflush(stdout);
}

std::vector<char*> argvOf(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const auto& a : command)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  return argv;
}

struct Spawned {
  pid_t pid = -1;
  int out = -1;
};

// Starts `command` in its own process group with `env` added, stdout and stderr into one pipe
// (returned). Its stdin is the launcher's, or, given `input`, that text and then the end (a few
// lines at most: they are written at once, into the pipe's buffer). The child gets SIGTERM when
// the launcher dies.
Spawned spawnPiped(const std::vector<std::string>& command, const Env& env,
                   const std::optional<std::string>& input) {
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
    for (const auto& [k, v] : env)
      ::setenv(k.c_str(), v.c_str(), 1);
    auto argv = argvOf(command);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot start '%s': %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  if (input) {
    ::close(in[0]);
    const ssize_t written = ::write(in[1], input->data(), input->size());
    ::close(in[1]);
    if (written != static_cast<ssize_t>(input->size())) {
      throw IoError(fmt::format("writing the input of '{}': {}", command[0],
                                written < 0 ? std::strerror(errno) : "short write"));
    }
  }
  ::setpgid(pid, pid);  // also here: a kill(-pid) may come before the child's own setpgid
  return {pid, fds[0]};
}

// Runs each command at once (stdout and stderr to /dev/null unless `show_output`) and waits for
// them all, killing what still runs after `timeout`. Returns their wait statuses.
std::vector<int> runAll(const std::vector<std::vector<std::string>>& commands,
                        std::chrono::milliseconds timeout, bool show_output) {
  std::vector<pid_t> pids;
  for (const auto& command : commands) {
    const pid_t pid = ::fork();
    if (pid < 0) throw IoError(fmt::format("fork: {}", std::strerror(errno)));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      const int null = ::open("/dev/null", O_RDWR);
      if (null >= 0) {
        ::dup2(null, STDIN_FILENO);
        if (!show_output) {
          ::dup2(null, STDOUT_FILENO);
          ::dup2(null, STDERR_FILENO);
        }
      }
      auto argv = argvOf(command);
      ::execvp(argv[0], argv.data());
      std::fprintf(stderr, "cannot start '%s': %s\n", argv[0], std::strerror(errno));
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> statuses(pids.size(), 0);
  std::vector<bool> done(pids.size(), false);
  const auto deadline = Clock::now() + timeout;
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      if (::waitpid(pids[i], &statuses[i], WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
      } else if (Clock::now() >= deadline) {
        ::kill(pids[i], SIGKILL);
        ::waitpid(pids[i], &statuses[i], 0);
        done[i] = true;
        --left;
      }
    }
    if (left > 0) ::usleep(10000);
  }
  return statuses;
}

std::string join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words)
    out += (out.empty() ? "" : " ") + shellQuote(w);
  return out;
}

// SIGINT, SIGTERM and SIGHUP to the launcher, noted for the main loop (ssh and mpi only: local
// processes die with the launcher through PR_SET_PDEATHSIG, remote ones need the launcher).
volatile sig_atomic_t g_stop_signal = 0;

extern "C" void onStopSignal(int signo) {
  g_stop_signal = signo;
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = onStopSignal;
    sigemptyset(&sa.sa_mask);
    for (std::size_t i = 0; i < kSignals.size(); ++i)
      ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~StopSignals() {
    for (std::size_t i = 0; i < kSignals.size(); ++i)
      ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  static constexpr std::array<int, 3> kSignals{SIGINT, SIGTERM, SIGHUP};
  std::array<struct sigaction, 3> old_{};
};

bool isLoopbackName(const std::string& host) {
  return host == "localhost" || host == "ip6-localhost" || host == "::1" ||
         host.rfind("127.", 0) == 0;
}

// The local address packets to `host` leave from (a UDP connect sends nothing).
std::string routeSourceAddress(const LaunchHost& host, const std::string& hostfile) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.name.c_str(), "9", &hints, &found); rc != 0) {
    throw InputError(fmt::format("-H {}:{}: cannot resolve host '{}': {}", hostfile, host.line,
                                 host.name, ::gai_strerror(rc)));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  const bool ok = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (!ok) {
    throw IoError(fmt::format("no route to host '{}' (-H {}:{}) for the rendezvous store: {}",
                              host.name, hostfile, host.line, std::strerror(err)));
  }
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text);
  return text;
}

// Where the embedded store listens so that every host can reach it.
std::string storeBindAddress(const LaunchOptions& o, const std::vector<LaunchHost>& hosts) {
  std::string interface = o.interface;
  if (interface.empty()) {
    if (const char* env = std::getenv("TROUPE_INTERFACE")) interface = env;
  }
  if (!interface.empty()) return transport::resolveInterface(interface);
  for (const auto& h : hosts) {
    if (!isLoopbackName(h.name)) return routeSourceAddress(h, o.hostfile);
  }
  return "127.0.0.1";
}

std::vector<std::string> splitWords(const char* text) {
  std::vector<std::string> words;
  std::string word;
  for (const char* p = text; p && *p; ++p) {
    if (std::isspace(static_cast<unsigned char>(*p))) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += *p;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

// ssh options from $TROUPE_SSH_OPTS and --ssh-opt, first so that they override the defaults
// (ssh keeps the first value of each -o option).
std::vector<std::string> userSshOptions(const LaunchOptions& o) {
  auto opts = splitWords(std::getenv("TROUPE_SSH_OPTS"));
  opts.insert(opts.end(), o.ssh_options.begin(), o.ssh_options.end());
  return opts;
}

// `ssh [options] [-p PORT]` without the host.
std::vector<std::string> sshCommand(const std::vector<std::string>& user_options,
                                    const LaunchHost& host) {
  std::vector<std::string> cmd{"ssh"};
  cmd.insert(cmd.end(), user_options.begin(), user_options.end());
  for (const char* opt :
       {"BatchMode=yes", "StrictHostKeyChecking=no", "ConnectTimeout=20", "LogLevel=ERROR"}) {
    cmd.push_back("-o");
    cmd.push_back(opt);
  }
  if (host.port) {
    cmd.push_back("-p");
    cmd.push_back(std::to_string(host.port));
  }
  return cmd;
}

std::vector<std::string> sshRun(const std::vector<std::string>& user_options,
                                const LaunchHost& host, const std::string& script) {
  auto cmd = sshCommand(user_options, host);
  cmd.push_back(host.name);
  cmd.push_back(script);
  return cmd;
}

// Copies the current folder to `dir` on every host (MXNet's --sync-dst-dir), one host at a time.
void syncFolder(const std::vector<LaunchHost>& hosts, const std::vector<std::string>& user_options,
                const std::string& dir, const std::string& hostfile) {
  const std::string here = std::filesystem::current_path().string();
  std::vector<std::string> done;
  for (const auto& h : hosts) {
    if (std::find(done.begin(), done.end(), h.display()) != done.end()) continue;
    done.push_back(h.display());
    fmt::print("[launcher] syncing {} to {}:{}\n", here, h.display(), dir);
    std::fflush(stdout);
    const auto mkdir = runAll({sshRun(user_options, h, "mkdir -p " + shellQuote(dir))},
                              std::chrono::minutes(2), true)[0];
    if (!WIFEXITED(mkdir) || WEXITSTATUS(mkdir) != 0) {
      throw IoError(fmt::format("--sync-dst-dir: cannot create {} on host {} (-H {}:{}): ssh {}",
                                dir, h.display(), hostfile, h.line, describeExit(mkdir)));
    }
    const auto rsync = runAll(
        {{"rsync", "-az", "-e", join(sshCommand(user_options, h)), "./", h.name + ":" + dir + "/"}},
        std::chrono::hours(1), true)[0];
    if (!WIFEXITED(rsync) || WEXITSTATUS(rsync) != 0) {
      throw IoError(fmt::format("--sync-dst-dir: rsync of {} to host {}:{} (-H {}:{}) {}", here,
                                h.display(), dir, hostfile, h.line, describeExit(rsync)));
    }
  }
}

// The shell line an ssh process runs remotely; see launcher.h.
std::string remoteScript(const std::string& dir, const Env& env,
                         const std::vector<std::string>& command) {
  std::string script = fmt::format("cd {} && echo {} pid $$ && env", shellQuote(dir), kMarker);
  for (const auto& [k, v] : env)
    script += " " + shellQuote(k + "=" + v);
  script += " " + join(command);
  script += fmt::format("; rc=$?; echo {} exit $rc; exit $rc", kMarker);
  return script;
}

// ssh: starts `command` on `host` in `dir` with `env`. The run's secret goes through ssh's stdin,
// which the remote shell reads before anything else: it stands on no command line, here or there.
Spawned spawnSsh(const std::vector<std::string>& ssh_options, const LaunchHost& host,
                 const std::string& dir, Env env, const std::vector<std::string>& command) {
  std::string secret;
  const auto it = std::find_if(env.begin(), env.end(),
                               [](const auto& kv) { return kv.first == "TROUPE_SECRET"; });
  if (it != env.end()) {
    secret = it->second;
    env.erase(it);
  }
  std::string script = remoteScript(dir, env, command);
  if (!secret.empty()) script = "IFS= read -r TROUPE_SECRET && export TROUPE_SECRET && " + script;
  return spawnPiped(sshRun(ssh_options, host, script), {}, secret.empty() ? "" : secret + "\n");
}

// local and ssh: one child process per role and rank.
Attempt runChildren(Kind kind, const LaunchOptions& o, const std::vector<std::string>& command,
                    const std::string& run_id, const std::string& rendezvous,
                    const std::vector<LaunchHost>& hosts, int generation) {
  std::vector<Child> children;
  auto add = [&](const char* role, int count) {
    for (int r = 0; r < count; ++r) {
      Child c;
      c.role = role;
      c.rank = r;
      if (kind == Kind::kSsh) {
        c.remote = &hosts[static_cast<std::size_t>(r) % hosts.size()];
        c.host = c.remote->display();
      }
      children.push_back(std::move(c));
    }
  };
  add("server", o.num_servers);
  add("worker", o.num_workers);

  const auto ssh_options = userSshOptions(o);
  const std::string dir =
      o.sync_dst_dir.empty() ? std::filesystem::current_path().string() : o.sync_dst_dir;
  // How many of the run's processes share each host, so each can size its thread pool.
  std::map<std::string, int> per_host;
  for (const auto& c : children)
    ++per_host[c.host];
  for (auto& c : children) {
    auto env = o.env;
    env.emplace_back("TROUPE_LOCAL_SIZE", std::to_string(per_host[c.host]));
    env.emplace_back("TROUPE_ROLE", c.role);
    env.emplace_back("TROUPE_RANK", std::to_string(c.rank));
    env.emplace_back("TROUPE_NUM_WORKERS", std::to_string(o.num_workers));
    env.emplace_back("TROUPE_NUM_SERVERS", std::to_string(o.num_servers));
    env.emplace_back("TROUPE_RUN_ID", run_id);
    env.emplace_back("TROUPE_GENERATION", std::to_string(generation));
    env.emplace_back("TROUPE_RENDEZVOUS", rendezvous);
    const auto started = kind == Kind::kSsh ? spawnSsh(ssh_options, *c.remote, dir, env, command)
                                            : spawnPiped(command, env, std::nullopt);
    c.pid = started.pid;
    c.out = started.out;
    c.running = true;
  }

  // ssh: signals the remote process groups of `targets` through a second ssh each.
  auto signalRemote = [&](const std::vector<Child*>& targets, const char* sig) {
    std::vector<std::vector<std::string>> commands;
    for (const auto* c : targets) {
      commands.push_back(
          sshRun(ssh_options, *c->remote,
                 fmt::format("kill -s {} -- -{} 2>/dev/null || true", sig, c->remote_pgid)));
    }
    const auto statuses = runAll(commands, std::chrono::seconds(30), false);
    for (std::size_t i = 0; i < targets.size(); ++i) {
      if (WIFEXITED(statuses[i]) && WEXITSTATUS(statuses[i]) == 0) continue;
      fmt::print(stderr, "[launcher] could not send SIG{} to {} on {} (remote pid {}): ssh {}\n",
                 sig, label(*targets[i]), targets[i]->host, targets[i]->remote_pgid,
                 describeExit(statuses[i]));
    }
  };
  // ssh: the remote groups not yet told to stop, now that their pid is known.
  auto terminateRemote = [&] {
    std::vector<Child*> targets;
    for (auto& c : children) {
      if (c.running && c.remote_pgid > 0 && !c.term_sent) {
        c.term_sent = true;
        targets.push_back(&c);
      }
    }
    if (!targets.empty()) signalRemote(targets, "TERM");
  };

  std::optional<std::size_t> failed, candidate;
  Outcome failure, candidate_outcome;
  Clock::time_point settle_until{};
  bool killing = false;
  Clock::time_point kill_at{};
  auto stopOthers = [&] {
    if (kind == Kind::kSsh) {
      terminateRemote();
    } else {
      for (auto& c : children) {
        if (c.running) ::kill(-c.pid, SIGTERM);
      }
    }
    killing = true;
    kill_at = Clock::now() + o.grace;
  };
  std::optional<StopSignals> stop_signals;
  if (kind == Kind::kSsh) stop_signals.emplace();
  int interrupted = 0;

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
        relay(c, kind, buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        if (!c.partial.empty()) relay(c, kind, "\n", 1);
        ::close(c.out);
        c.out = -1;
      }
    }
    // Reap everyone who exited (once their output is drained: an ssh child's exit code comes in
    // it). The first failure opens a short window before the others are stopped: a process that
    // loses a peer may exit before the peer's own death is reaped, so within the window one
    // killed by a signal is the likelier cause (the others exit because they lost it), then the
    // one that failed first, then the lowest.
    for (std::size_t i = 0; i < children.size(); ++i) {
      auto& c = children[i];
      if (!c.running || (kind == Kind::kSsh && c.out >= 0)) continue;
      int status = 0;
      if (::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      c.status = status;
      const Outcome outcome = kind == Kind::kSsh ? sshOutcome(c) : localOutcome(status);
      if (outcome.ok || failed) continue;
      if (!candidate) settle_until = Clock::now() + kSettle;
      if (!candidate || (outcome.by_signal && !candidate_outcome.by_signal)) {
        candidate = i;
        candidate_outcome = outcome;
      }
    }
    const bool all_done =
        std::none_of(children.begin(), children.end(), [](const Child& c) { return c.running; });
    if (candidate && !failed && !interrupted &&
        (candidate_outcome.by_signal || all_done || Clock::now() >= settle_until)) {
      failed = candidate;
      failure = candidate_outcome;
      const auto& c = children[*failed];
      const std::string pid =
          kind == Kind::kSsh && c.remote_pgid > 0
              ? fmt::format("remote pid {}", c.remote_pgid)
              : fmt::format("{}pid {}", kind == Kind::kSsh ? "ssh " : "", c.pid);
      fmt::print(stderr, "[launcher] {} {} on {} ({}) {}; stopping the others\n", c.role, c.rank,
                 c.host, pid, failure.what);
      std::fflush(stderr);
      stopOthers();
    }
    if (g_stop_signal && !interrupted) {
      interrupted = g_stop_signal;
      fmt::print(stderr, "[launcher] got signal {} ({}); stopping every process\n", interrupted,
                 strsignal(interrupted));
      std::fflush(stderr);
      if (!killing) stopOthers();
    }
    if (killing && kind == Kind::kSsh) terminateRemote();
    if (killing && Clock::now() >= kill_at) {
      if (kind == Kind::kSsh) {
        std::vector<Child*> targets;
        for (auto& c : children) {
          if (c.running && c.remote_pgid > 0) targets.push_back(&c);
        }
        if (!targets.empty()) signalRemote(targets, "KILL");
      }
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
  if (interrupted) {
    fmt::print(stderr, "[launcher] run stopped by signal {}\n", interrupted);
    return {128 + interrupted, "", true};
  }
  if (failed) {
    const auto& c = children[*failed];
    return {failure.code ? failure.code : 1,
            fmt::format("{} {} on {} {}", c.role, c.rank, c.host, failure.what)};
  }
  fmt::print("[launcher] all {} process(es) exited 0\n", children.size());
  return {};
}

// ---- mpi ----

struct MpiRank {
  std::string role;
  int rank = 0;
  std::string host;
  long pid = 0;
  std::optional<int> exit;
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

Attempt runMpi(const LaunchOptions& o, const std::vector<std::string>& command,
               const std::string& run_id, const std::string& rendezvous,
               const std::vector<LaunchHost>& hosts, int generation) {
  const int world = o.num_servers + o.num_workers;
  std::vector<MpiRank> ranks;
  for (int r = 0; r < world; ++r) {
    const bool server = r < o.num_servers;
    ranks.push_back({server ? "server" : "worker", server ? r : r - o.num_servers, "", 0, {}});
  }
  std::vector<std::string> argv{"mpirun",
                                "-np",
                                std::to_string(world),
                                "--tag-output",
                                "--oversubscribe",
                                "--allow-run-as-root"};
  std::unique_ptr<MpiHostfile> mpi_hosts;
  if (!hosts.empty()) {
    mpi_hosts = std::make_unique<MpiHostfile>(hosts);
    argv.insert(argv.end(), {"--hostfile", mpi_hosts->path()});
    auto agent_args = userSshOptions(o);
    const int port = hosts[0].port;
    for (const auto& h : hosts) {
      if (h.port != port) {
        throw InputError(fmt::format(
            "-H {}:{}: host {} has a different ssh port than {}: mpirun takes one port for all",
            o.hostfile, h.line, h.display(), hosts[0].display()));
      }
    }
    if (port) agent_args.insert(agent_args.end(), {"-p", std::to_string(port)});
    if (!agent_args.empty()) {
      argv.insert(argv.end(), {"--mca", "plm_rsh_args", join(agent_args)});
    }
  }
  auto env = o.env;
  env.emplace_back("TROUPE_NUM_WORKERS", std::to_string(o.num_workers));
  env.emplace_back("TROUPE_NUM_SERVERS", std::to_string(o.num_servers));
  env.emplace_back("TROUPE_RUN_ID", run_id);
  env.emplace_back("TROUPE_GENERATION", std::to_string(generation));
  env.emplace_back("TROUPE_RENDEZVOUS", rendezvous);
  // The values go in mpirun's environment, and `-x NAME` has it pass each on: no value (the run's
  // secret among them) stands on a command line.
  for (const auto& [k, v] : env)
    argv.insert(argv.end(), {"-x", k});
  argv.insert(argv.end(), {"sh", "-c", mpiWrapper(o.num_servers), "troupe-launch"});
  argv.insert(argv.end(), command.begin(), command.end());

  StopSignals stop_signals;
  const auto mpirun = spawnPiped(argv, env, std::string());
  int out = mpirun.out;
  std::string partial;
  std::optional<int> pending_rank;
  std::optional<MpiFailure> failure;
  std::optional<int> first_failed;  // the first rank whose wrapper reported a non-zero exit
  auto onLine = [&](std::string_view line) {
    int world_rank = -1;
    std::string_view text;
    if (!parseTagged(line, world_rank, text) || world_rank < 0 || world_rank >= world) {
      printLine("mpirun", line);
      parseMpirunLine(line, pending_rank, failure);
      return;
    }
    auto& r = ranks[static_cast<std::size_t>(world_rank)];
    const auto at = text.find(kMarker);
    if (at == std::string_view::npos) {
      printLine(fmt::format("{} {}", r.role, r.rank), text);
      return;
    }
    if (at > 0) printLine(fmt::format("{} {}", r.role, r.rank), text.substr(0, at));
    const std::string rest(text.substr(at + kMarker.size()));
    char host[256] = {};
    long pid = 0;
    int code = 0;
    if (std::sscanf(rest.c_str(), " host %255s pid %ld", host, &pid) == 2) {
      r.host = host;
      r.pid = pid;
    } else if (std::sscanf(rest.c_str(), " exit %d", &code) == 1) {
      r.exit = code;
      if (code != 0 && !first_failed) first_failed = world_rank;
    }
  };

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
          splitLines(partial, buf, static_cast<std::size_t>(n), onLine);
        } else if (n == 0 || errno != EINTR) {
          if (!partial.empty()) splitLines(partial, "\n", 1, onLine);
          ::close(out);
          out = -1;
        }
        std::fflush(stdout);
      }
    } else {
      ::usleep(20000);
    }
    if (running && ::waitpid(mpirun.pid, &status, WNOHANG) == mpirun.pid) running = false;
    if (g_stop_signal && !interrupted && running) {
      interrupted = g_stop_signal;
      fmt::print(stderr, "[launcher] got signal {} ({}); stopping mpirun\n", interrupted,
                 strsignal(interrupted));
      std::fflush(stderr);
      ::kill(mpirun.pid, SIGTERM);  // mpirun ends its job on SIGTERM
      kill_at = Clock::now() + o.grace;
    }
    if (running && Clock::now() >= kill_at) {
      ::kill(-mpirun.pid, SIGKILL);
      kill_at = Clock::time_point::max();
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    fmt::print("[launcher] all {} process(es) exited 0\n", world);
    return {};
  }
  // The launcher's own bookkeeping first, then mpirun's report.
  if (first_failed) {
    const int code = *ranks[static_cast<std::size_t>(*first_failed)].exit;
    failure = MpiFailure{*first_failed, "", describeShellCode(code), code};
  }
  if (failure && failure->world_rank >= 0 && failure->world_rank < world) {
    const auto& r = ranks[static_cast<std::size_t>(failure->world_rank)];
    const std::string host = !r.host.empty()          ? r.host
                             : !failure->host.empty() ? failure->host
                                                      : "an unknown host";
    return {failure->code ? failure->code : exitCodeOf(status),
            fmt::format("{} {} on {}{} {}; mpirun {} and ended the job", r.role, r.rank, host,
                        r.pid ? fmt::format(" (pid {})", r.pid) : "", failure->what,
                        describeExit(status))};
  }
  if (interrupted) {
    fmt::print(stderr, "[launcher] run stopped by signal {}; mpirun {}\n", interrupted,
               describeExit(status));
    return {128 + interrupted, "", true};
  }
  return {exitCodeOf(status) ? exitCodeOf(status) : 1,
          fmt::format("mpirun {} (no failing rank in its report)", describeExit(status))};
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
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("-H {}: cannot read it: {}", path, std::strerror(errno)));
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

int launch(const LaunchOptions& o) {
  if (o.num_workers < 1) throw InputError("-n: need at least one worker");
  if (o.num_servers < 0) throw InputError("-s: the number of servers cannot be negative");
  if (o.command.empty()) throw InputError("no command to launch: put it after --");
  if (o.launcher != "local" && o.launcher != "ssh" && o.launcher != "mpi") {
    throw InputError(fmt::format("unknown launcher '{}' (known: local, ssh, mpi)", o.launcher));
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
  std::vector<std::string> command = o.command;
  // "troupe" means this troupe, whether or not it is on PATH.
  if (command[0] == "troupe") command[0] = selfExecutable();

  std::vector<LaunchHost> hosts;
  if (o.launcher != "local" && !o.hostfile.empty()) hosts = readHostfile(o.hostfile);
  const auto ssh_options = userSshOptions(o);
  if (!o.sync_dst_dir.empty()) syncFolder(hosts, ssh_options, o.sync_dst_dir, o.hostfile);

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
  for (int generation = 0;; ++generation) {
    // The embedded store, served here for as long as this generation's processes run; a fresh
    // one (another port) each generation, so a straggler of the last one cannot join this one.
    std::unique_ptr<rendezvous::TcpStoreServer> store;
    std::string rendezvous = o.rendezvous;
    if (rendezvous.empty()) {
      const std::string bind = o.launcher == "local" ? "127.0.0.1" : storeBindAddress(o, hosts);
      store = rendezvous::startTcpStoreServer(bind, 0, secret);
      rendezvous = "tcp://" + store->address();
    }
    fmt::print("[launcher] run {}{}: {} worker(s), {} server(s), rendezvous {}{}", run_id,
               generation > 0 ? fmt::format(" (restart {} of {})", generation, o.max_restarts) : "",
               o.num_workers, o.num_servers, rendezvous, store ? " (embedded store)" : "");
    if (o.launcher == "local") {
      fmt::print("\n");
    } else {
      fmt::print(", {} launcher{}\n", o.launcher,
                 hosts.empty() ? "" : fmt::format(" over {} host line(s)", hosts.size()));
    }
    std::fflush(stdout);

    const Attempt attempt =
        o.launcher == "mpi" ? runMpi(options, command, run_id, rendezvous, hosts, generation)
                            : runChildren(o.launcher == "ssh" ? Kind::kSsh : Kind::kLocal, options,
                                          command, run_id, rendezvous, hosts, generation);
    if (o.launcher == "local") {
      // Every process of the generation has exited: what a killed one left of the socket
      // folder is nobody's any more.
      std::error_code ignored;
      std::filesystem::remove_all(actors::socketFolder(actors::generationRunId(run_id, generation)),
                                  ignored);
    }
    if (attempt.code == 0 || attempt.interrupted) return attempt.code;
    if (o.on_failure == "restart" && generation < o.max_restarts) {
      fmt::print(stderr, "[launcher] {}; restarting every process ({} of {} restarts)\n",
                 attempt.failure, generation + 1, o.max_restarts);
      std::fflush(stderr);
      continue;
    }
    if (o.on_failure == "restart") {
      fmt::print(stderr,
                 "[launcher] run failed: {}; giving up after {} restart(s) (--max-restarts {})\n",
                 attempt.failure, generation, o.max_restarts);
    } else {
      fmt::print(stderr, "[launcher] run failed: {}\n", attempt.failure);
    }
    return attempt.code;
  }
}

}  // namespace troupe::apps
