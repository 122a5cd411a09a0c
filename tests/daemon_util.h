// Starting the servers that tests run beside them (redis_util.h, sshd_util.h): a child process
// that dies with the test process, and the wait until it answers.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe::testing {

// Forks and execs `args` (args[0] the binary's path) with its stdout and stderr appended to
// `output` (created if missing); the child gets `death_signal` when the test process dies, and
// exits 127 at once when that happened before it could ask for it. Returns the child's pid;
// throws std::runtime_error when fork fails.
inline pid_t spawnDaemon(std::vector<std::string> args, const std::string& output,
                         int death_signal) {
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, death_signal);
    if (::getppid() != parent) ::_exit(127);
    const int out = ::open(output.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

enum class DaemonStart { kReady, kExited, kTimedOut };

// Asks `ready()` every `poll` for up to 10 s: kReady once it says yes, kExited as soon as the
// child `pid` has exited (then reaped; maybe its port was taken), kTimedOut when neither came.
template <typename Ready>
DaemonStart awaitDaemon(pid_t pid, std::chrono::milliseconds poll, Ready&& ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, nullptr, WNOHANG) == pid) return DaemonStart::kExited;
    if (ready()) return DaemonStart::kReady;
    std::this_thread::sleep_for(poll);
  }
  return DaemonStart::kTimedOut;
}

}  // namespace troupe::testing
