// The launcher's output. Every line the launcher prints, and every line it relays from its
// processes, goes through one OutputRelay, so that supervising never waits on whoever reads the
// launcher's stdout and stderr (a `| sleep`, a terminal stopped with Ctrl-S).
//
// Each stream has a bounded queue, emptied by a writer thread of its own that does the blocking
// writes. When a queue is full (its reader stalled), relayed lines are dropped and counted until
// the queue is half empty again; where they were, the reader later finds
// "[launcher] N lines dropped: the launcher's output was not read for S s". The launcher's own
// lines have reserve room beyond that, so a summary outlives a flood. When a write fails (EPIPE:
// the reader is gone; the process must ignore SIGPIPE) every later line of that stream is dropped
// and counted. When stdout and stderr are one file (2>&1, one terminal), one queue keeps their
// order.
//
// finish() (or the destructor) waits for the queues to empty for at most flush_limit, says on the
// other stream what a stalled or failed stream could not take, and returns: a writer still blocked
// then is left behind, to end with the process.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace spdlog {
class logger;
}  // namespace spdlog

namespace troupe::apps {

struct OutputRelayOptions {
  int out_fd = STDOUT_FILENO;
  int err_fd = STDERR_FILENO;
  std::size_t capacity = 4u << 20;   // bytes queued per stream before relayed lines are dropped
  std::size_t reserve = 256u << 10;  // more room for the launcher's own lines
  std::chrono::milliseconds flush_limit{5000};
  // Whose output it is, in the notices: "[launcher] 3 lines dropped: the launcher's output ...".
  std::string tag = "launcher";
  std::string owner = "the launcher's";
};

class OutputRelay {
 public:
  enum class Stream { kOut, kErr };

  // Starts the writer threads (with every signal blocked: they never take the process's).
  explicit OutputRelay(OutputRelayOptions options = OutputRelayOptions());
  ~OutputRelay();
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // Every method below: any thread; never blocks on the output.

  // "[who] line\n", a line of a process; dropped when the queue is full.
  void relay(Stream stream, std::string_view who, std::string_view line);
  // The launcher's own line(s); a newline is added if `text` lacks one.
  void say(Stream stream, std::string_view text);

  template <typename... Args>
  void out(fmt::format_string<Args...> format, Args&&... args) {
    say(Stream::kOut, fmt::format(format, std::forward<Args>(args)...));
  }
  template <typename... Args>
  void err(fmt::format_string<Args...> format, Args&&... args) {
    say(Stream::kErr, fmt::format(format, std::forward<Args>(args)...));
  }

  // Flushes for at most flush_limit, then gives up on what is left; later lines are dropped. Call
  // from the thread that owns the relay; idempotent.
  void finish();

 private:
  struct Queue;
  Queue& queueOf(Stream stream) const;

  OutputRelayOptions options_;
  std::shared_ptr<Queue> out_, err_;  // one queue when both name the same file
  std::thread out_writer_, err_writer_;
  bool finished_ = false;
};

// While it lives, spdlog's default logger writes through `relay`'s stderr (the embedded store
// logs from its own thread); the logger before it comes back after.
class LogThroughRelay {
 public:
  explicit LogThroughRelay(OutputRelay& relay);
  ~LogThroughRelay();
  LogThroughRelay(const LogThroughRelay&) = delete;
  LogThroughRelay& operator=(const LogThroughRelay&) = delete;

 private:
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace troupe::apps
