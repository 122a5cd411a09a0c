#include "transport/accept_gate.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstring>

#include <algorithm>

#include "troupe/error.h"

namespace troupe::transport {

namespace {
constexpr std::chrono::milliseconds kFirstBackoff{10};
constexpr std::chrono::milliseconds kLastBackoff{1000};
constexpr std::chrono::seconds kLogEvery{1};
}  // namespace

void setCloseOnExec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags < 0 || ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != 0) {
    throw IoError(
        fmt::format("cannot mark descriptor {} close-on-exec: {}", fd, std::strerror(errno)));
  }
}

AcceptGate::AcceptGate(asio::any_io_executor executor, std::string name, int maxPending,
                       std::shared_ptr<spdlog::logger> log, RefusalReport::Limits limits)
    : backoffTimer_(executor),
      summaryTimer_(executor),
      report_(name, log, limits),
      name_(std::move(name)),
      maxPending_(std::max(1, maxPending)),
      log_(log ? std::move(log) : spdlog::default_logger()),
      pauseLogEvery_(limits.every) {}

void AcceptGate::next(std::function<void()> startAccept) {
  if (closed_) return;
  if (backoffDue_) {
    backoffDue_ = false;
    backoffTimer_.expires_after(backoff_);
    backoffTimer_.async_wait([this, startAccept = std::move(startAccept)](std::error_code e) {
      if (!e && !closed_) next(startAccept);
    });
    return;
  }
  if (pending_ >= maxPending_) {
    const auto now = std::chrono::steady_clock::now();
    if (pauseLogged_ == std::chrono::steady_clock::time_point{} ||
        now - pauseLogged_ >= pauseLogEvery_) {
      log_->warn(
          "{}: {} connections have not authenticated yet; accepting pauses until one does or "
          "times out{}",
          name_, pending_,
          unloggedPauses_ > 0
              ? fmt::format(" (it paused {} more times since the last report)", unloggedPauses_)
              : std::string());
      pauseLogged_ = now;
      unloggedPauses_ = 0;
    } else {
      ++unloggedPauses_;
    }
    waiting_ = std::move(startAccept);
    return;
  }
  startAccept();
}

void AcceptGate::accepted() {
  ++pending_;
  if (backoff_.count() > 0) {
    if (unlogged_ > 0) {
      log_->warn("{}: accepting again after {} more failed accepts", name_, unlogged_);
    }
    unlogged_ = 0;
  }
  backoff_ = std::chrono::milliseconds(0);
}

void AcceptGate::failed(const std::error_code& error) {
  backoff_ = backoff_.count() == 0 ? kFirstBackoff : std::min(backoff_ * 2, kLastBackoff);
  backoffDue_ = true;
  const auto now = std::chrono::steady_clock::now();
  if (now - lastLog_ >= kLogEvery) {
    log_->error("{}: accept failed: {}{}; retrying in {} ms", name_, error.message(),
                unlogged_ > 0 ? fmt::format(" ({} more failures since the last report)", unlogged_)
                              : std::string(),
                backoff_.count());
    lastLog_ = now;
    unlogged_ = 0;
  } else {
    ++unlogged_;
  }
}

void AcceptGate::release() {
  if (pending_ > 0) --pending_;
  resume();
}

void AcceptGate::resume() {
  if (!waiting_ || closed_ || pending_ >= maxPending_) return;
  auto start = std::move(waiting_);
  waiting_ = nullptr;
  start();
}

void AcceptGate::refused(std::string_view kind, std::string_view from, std::string_view why,
                         std::string_view line) {
  report_.refused(kind, from, why, line);
  armSummary();
}

void AcceptGate::armSummary() {
  if (summaryArmed_ || closed_) return;
  const auto due = report_.summaryDue();
  if (!due) return;
  summaryArmed_ = true;
  summaryTimer_.expires_at(*due);
  summaryTimer_.async_wait([this](std::error_code e) {
    summaryArmed_ = false;
    if (e || closed_) return;
    // Refusals since the timer was set may have sent the summary already.
    if (const auto due = report_.summaryDue(); due && *due <= std::chrono::steady_clock::now()) {
      report_.flush();
    }
    armSummary();
  });
}

void AcceptGate::close() {
  closed_ = true;
  waiting_ = nullptr;
  backoffTimer_.cancel();
  summaryTimer_.cancel();
  report_.flush();
}

}  // namespace troupe::transport
