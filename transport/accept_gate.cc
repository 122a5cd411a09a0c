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

AcceptGate::AcceptGate(asio::io_context& io, std::string name, int maxPending,
                       std::shared_ptr<spdlog::logger> log)
    : backoffTimer_(io),
      name_(std::move(name)),
      maxPending_(std::max(1, maxPending)),
      log_(log ? std::move(log) : spdlog::default_logger()) {}

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
    if (!fullLogged_) {
      log_->warn(
          "{}: {} connections have not authenticated yet; accepting pauses until one does or "
          "times out",
          name_, pending_);
      fullLogged_ = true;
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
  fullLogged_ = false;
  auto start = std::move(waiting_);
  waiting_ = nullptr;
  start();
}

void AcceptGate::close() {
  closed_ = true;
  waiting_ = nullptr;
  backoffTimer_.cancel();
}

}  // namespace troupe::transport
