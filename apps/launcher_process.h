// Process supervision for the launcher (apps/launcher*.cc only; see launcher.h): starting
// processes with their output piped, waiting for them, splitting their output into lines, saying
// how they ended, stopping them, and the signals the launcher itself takes.
//
// Everything here runs on the launcher's main thread.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::apps {
class OutputRelay;
}  // namespace troupe::apps

namespace troupe::apps::launch_detail {

using Clock = std::chrono::steady_clock;
using Env = std::vector<std::pair<std::string, std::string>>;

struct Spawned {
  pid_t pid = -1;
  int out = -1;  // the read end of its stdout and stderr
};

// Starts `command` in its own process group with `env` added, stdout and stderr into one pipe
// (returned). Its stdin is the launcher's, or, given `input`, that text and then the end (a few
// lines at most: they are written at once, into the pipe's buffer; a child that is gone before
// reading them is no error here: its exit says what happened). The child gets SIGTERM when the
// launcher dies, and the default SIGPIPE back.
Spawned spawnPiped(const std::vector<std::string>& command, const Env& env,
                   const std::optional<std::string>& input);

// Runs each command at once (stdin /dev/null) and waits for them all, killing what still runs
// after `timeout`. Their stdout and stderr go to /dev/null, or, given `relay`, line by line to its
// stderr as "[labels[i]] line". Returns their wait statuses.
std::vector<int> runAll(const std::vector<std::vector<std::string>>& commands,
                        std::chrono::milliseconds timeout, OutputRelay* relay = nullptr,
                        const std::vector<std::string>& labels = {});

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

// "exited with code 3", "was killed by signal 9 (Killed)".
std::string describeExit(int status);
// The exit code, 128 + the signal for a signal.
int exitCodeOf(int status);
// A code a shell reports for a child it lost to a signal, spelled out.
std::string describeShellCode(int code);

// True when a process of group `pgid` on this host is stopped (state T: SIGSTOP, SIGTSTP, or
// SIGTTIN/SIGTTOU from a terminal).
bool processGroupStopped(pid_t pgid);

// Tells group `pgid` to end: SIGTERM, then SIGCONT, which a stopped process needs to act on it.
void terminateGroup(pid_t pgid);

// `signals` go to `handler` (a function, or SIG_IGN) while it lives; their actions before, after.
class HeldSignals {
 public:
  HeldSignals(std::vector<int> signals, void (*handler)(int));
  ~HeldSignals();
  HeldSignals(const HeldSignals&) = delete;
  HeldSignals& operator=(const HeldSignals&) = delete;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

// SIGINT, SIGTERM and SIGHUP to the launcher, noted for the main loop while one lives (ssh, mpi
// and slurm only: local processes die with the launcher through PR_SET_PDEATHSIG, remote ones
// need the launcher).
class StopSignals : HeldSignals {
 public:
  StopSignals();
};
// The signal noted since the last StopSignals began; 0: none.
int stopSignal();

// SIGPIPE ignored while it lives: a reader of the launcher's output that goes away must not end
// the launcher (the OutputRelay sees EPIPE instead). Children get the default back.
class IgnoreSigpipe : HeldSignals {
 public:
  IgnoreSigpipe() : HeldSignals({SIGPIPE}, SIG_IGN) {}
};

// The words, each shell-quoted, joined by spaces.
std::string join(const std::vector<std::string>& words);

// This executable's path (/proc/self/exe), else "troupe".
std::string selfExecutable();

}  // namespace troupe::apps::launch_detail
