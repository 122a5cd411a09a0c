// What every listening socket of troupe (transport links, the embedded store) does between
// accepts, so that strangers cannot exhaust a process's descriptors or flood its log:
//  - at most `maxPending` accepted connections that have not authenticated yet; while that many
//    are pending, accepting pauses and newcomers wait in the kernel's backlog (said at most once
//    per RefusalReport::Limits::every, with the count of pauses since);
//  - a failed accept (EMFILE, ENFILE, ENOBUFS ...) is retried after a backoff that doubles from
//    10 ms to 1 s, and logged at most once a second, with the count of failures since;
//  - every refused connection is counted and logged through a RefusalReport (refusal_report.h):
//    one by one while the log is quiet, in summaries at a bounded rate under a flood.
// Threads: every method runs on `executor` (a strand, or an io_context run by one thread); post
// to it from elsewhere. Its timers' handlers run there too.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "transport/refusal_report.h"

namespace spdlog {
class logger;
}

namespace troupe::transport {

// Marks a descriptor close-on-exec (Asio opens and accepts without it), so that a process this
// one starts never inherits a listening socket or a link. IoError when fcntl fails.
void setCloseOnExec(int fd);

class AcceptGate {
 public:
  // `name` names the listener in log lines ("transport node 1 tcp://10.0.0.1:4000").
  AcceptGate(asio::any_io_executor executor, std::string name, int maxPending,
             std::shared_ptr<spdlog::logger> log, RefusalReport::Limits limits = {});

  // Calls `startAccept` now, or once a pending slot frees or the backoff has passed.
  void next(std::function<void()> startAccept);
  // An accept succeeded: the connection counts as pending until release().
  void accepted();
  // An accept failed: next() waits for the backoff.
  void failed(const std::error_code& error);
  // A pending connection authenticated or closed.
  void release();
  // A connection of this listener was refused (RefusalReport::refused; it may have been released
  // already, or never been pending).
  void refused(std::string_view kind, std::string_view from, std::string_view why,
               std::string_view line);
  // Stops accepting and logs the refusals not yet summarised.
  void close();

 private:
  void resume();
  void armSummary();

  asio::steady_timer backoffTimer_;
  asio::steady_timer summaryTimer_;
  bool summaryArmed_ = false;
  RefusalReport report_;
  std::string name_;
  int maxPending_;
  std::shared_ptr<spdlog::logger> log_;
  int pending_ = 0;
  bool closed_ = false;
  std::function<void()> waiting_;         // an accept that waits for a slot
  std::chrono::milliseconds backoff_{0};  // 0: accepts succeed
  bool backoffDue_ = false;               // the next accept waits backoff_ first
  std::chrono::steady_clock::time_point lastLog_{};
  long unlogged_ = 0;
  const std::chrono::milliseconds pauseLogEvery_;
  std::chrono::steady_clock::time_point pauseLogged_{};  // epoch: never
  long unloggedPauses_ = 0;
};

}  // namespace troupe::transport
