#include "apps/output_relay.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

namespace troupe::apps {
namespace {

using Clock = std::chrono::steady_clock;

// Lines are appended to the last queued text until it holds this much: one write each.
constexpr std::size_t kChunk = 64u << 10;

// How long finish() waits, beyond its limit, for one stream to take what another could not.
constexpr auto kReportLimit = std::chrono::seconds(1);

std::uint64_t countLines(std::string_view text) {
  return static_cast<std::uint64_t>(std::count(text.begin(), text.end(), '\n'));
}

std::string lines(std::uint64_t n) {
  return fmt::format("{} line{}", n, n == 1 ? "" : "s");
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Writes all of `text` to `fd` (waiting where the fd is non-blocking): 0, or the errno that
// stopped it.
int writeAll(int fd, std::string_view text, const std::atomic<bool>& abandoned) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n >= 0) {
      text.remove_prefix(static_cast<std::size_t>(n));
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    if (abandoned) return ECANCELED;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, 100);
  }
  return 0;
}

}  // namespace

struct OutputRelay::Queue {
  // Where lines were dropped; the writer turns it into a notice when it gets there.
  struct Gap {
    std::uint64_t lines = 0;
    Clock::time_point since;  // when the reader stopped taking output, as far as is known
    Clock::time_point until;  // when it took output again; unset while lines are being dropped
  };
  struct Entry {
    std::string text;
    std::optional<Gap> gap;
  };

  Queue(int fd, const char* name, const OutputRelayOptions& o)
      : fd(fd), name(name), capacity(o.capacity), reserve(o.reserve), tag(o.tag), owner(o.owner) {}

  void push(std::string_view text, bool own) {
    const std::uint64_t n = countLines(text);
    std::lock_guard lock(mu);
    if (closing || abandoned) return;  // after finish(): nobody writes any more
    if (error != 0) {
      lost += n;
      return;
    }
    if ((dropping && !own) || bytes + text.size() > capacity + (own ? reserve : 0)) {
      dropLocked(n);
      return;
    }
    if (!entries.empty() && !entries.back().gap && entries.back().text.size() < kChunk) {
      entries.back().text.append(text);
    } else {
      entries.push_back({std::string(text), std::nullopt});
    }
    bytes += text.size();
    wake.notify_one();
  }

  void dropLocked(std::uint64_t n) {
    dropping = true;
    if (open_gap == nullptr) {
      entries.push_back({{}, Gap{0, writing ? writing_since : Clock::now(), {}}});
      open_gap = &*entries.back().gap;
      wake.notify_one();
    }
    open_gap->lines += n;
  }

  void closeGapLocked(Clock::time_point now) {
    if (open_gap != nullptr) open_gap->until = now;
    open_gap = nullptr;
    dropping = false;
  }

  // The writer thread.
  void run() {
    std::unique_lock lock(mu);
    for (;;) {
      wake.wait(lock, [&] { return !entries.empty() || closing || abandoned; });
      if (abandoned || entries.empty()) break;
      auto& front = entries.front();
      const auto now = Clock::now();
      std::string text;
      if (front.gap) {
        if (&*front.gap == open_gap) closeGapLocked(now);
        text = fmt::format("[{}] {} dropped: {} output was not read for {:.1f} s\n", tag,
                           lines(front.gap->lines), owner,
                           seconds(front.gap->until - front.gap->since));
      } else {
        text = std::move(front.text);
        bytes -= text.size();
      }
      entries.pop_front();
      writing = true;
      writing_since = now;
      in_flight = countLines(text);
      lock.unlock();
      const int failed = writeAll(fd, text, abandoned);
      lock.lock();
      writing = false;
      if (abandoned) break;
      if (failed != 0) {
        error = failed;
        lost += undeliveredLocked();
        entries.clear();
        bytes = 0;
        open_gap = nullptr;
        dropping = false;
      }
      in_flight = 0;
      if (dropping && bytes < capacity / 2) closeGapLocked(Clock::now());
      if (entries.empty()) idle.notify_all();
    }
    done = true;
    idle.notify_all();
  }

  // Everything queued is written (or lost to a failed write).
  bool drainedLocked() const { return done || (entries.empty() && !writing); }

  // Lines not written yet: queued, in flight, or dropped into a gap.
  std::uint64_t undeliveredLocked() const {
    std::uint64_t n = in_flight;
    for (const auto& e : entries)
      n += e.gap ? e.gap->lines : countLines(e.text);
    return n;
  }

  // Since when the reader has not taken this queue's output, as far as is known.
  Clock::time_point stalledSinceLocked() const {
    auto since = writing ? writing_since : Clock::now();
    for (const auto& e : entries) {
      if (e.gap) since = std::min(since, e.gap->since);
    }
    return since;
  }

  const int fd;
  const char* const name;
  const std::size_t capacity, reserve;
  const std::string tag, owner;

  std::mutex mu;
  std::condition_variable wake, idle;
  std::deque<Entry> entries;
  std::size_t bytes = 0;    // text queued
  bool dropping = false;    // relayed lines are dropped until the queue is half empty again
  Gap* open_gap = nullptr;  // the gap drops count into: the gap of an entry of `entries`
  bool writing = false;     // a write is under way
  Clock::time_point writing_since;
  std::uint64_t in_flight = 0;         // lines of the write under way
  int error = 0;                       // the errno of a failed write; every later line is lost
  std::uint64_t lost = 0;              // lines lost to that failure
  bool closing = false;                // finish() was called: empty the queue, then stop
  bool done = false;                   // the writer has stopped
  std::atomic<bool> abandoned{false};  // finish() gave up on this queue
};

OutputRelay::OutputRelay(OutputRelayOptions options) : options_(options) {
  struct stat out {
  }, err{};
  const bool same = ::fstat(options.out_fd, &out) == 0 && ::fstat(options.err_fd, &err) == 0 &&
                    out.st_dev == err.st_dev && out.st_ino == err.st_ino;
  out_ = std::make_shared<Queue>(options.out_fd, same ? "output" : "stdout", options);
  err_ = same ? out_ : std::make_shared<Queue>(options.err_fd, "stderr", options);
  // The writers inherit a mask that blocks everything: SIGINT and the like go to the launcher's
  // own thread, and a write to a reader that is gone fails with EPIPE.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  out_writer_ = std::thread([q = out_] { q->run(); });
  if (err_ != out_) err_writer_ = std::thread([q = err_] { q->run(); });
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

OutputRelay::~OutputRelay() {
  finish();
}

OutputRelay::Queue& OutputRelay::queueOf(Stream stream) const {
  return stream == Stream::kOut ? *out_ : *err_;
}

void OutputRelay::relay(Stream stream, std::string_view who, std::string_view line) {
  queueOf(stream).push(fmt::format("[{}] {}\n", who, line), false);
}

void OutputRelay::say(Stream stream, std::string_view text) {
  if (!text.empty() && text.back() == '\n') {
    queueOf(stream).push(text, true);
  } else {
    queueOf(stream).push(std::string(text) + "\n", true);
  }
}

void OutputRelay::finish() {
  if (finished_) return;
  finished_ = true;
  std::vector<Queue*> queues{out_.get()};
  if (err_ != out_) queues.push_back(err_.get());
  auto waitDrained = [](Queue& q, Clock::time_point deadline) {
    std::unique_lock lock(q.mu);
    return q.idle.wait_until(lock, deadline, [&] { return q.drainedLocked(); });
  };
  const auto deadline = Clock::now() + options_.flush_limit;
  std::vector<bool> drained;
  for (auto* q : queues)
    drained.push_back(waitDrained(*q, deadline));
  // What a stream could not take is said on the other one, if that one is still written.
  if (queues.size() == 2) {
    for (std::size_t i = 0; i < 2; ++i) {
      auto& q = *queues[i];
      auto& other = *queues[1 - i];
      std::string report;
      {
        std::lock_guard lock(q.mu);
        if (!drained[i]) {
          if (const auto n = q.undeliveredLocked(); n > 0) {
            report =
                fmt::format("[{}] {} dropped: {} {} was not read for {:.1f} s\n", q.tag, lines(n),
                            q.owner, q.name, seconds(Clock::now() - q.stalledSinceLocked()));
          }
        } else if (q.lost > 0) {
          report = fmt::format("[{}] {} dropped: {} {} could not be written ({})\n", q.tag,
                               lines(q.lost), q.owner, q.name, std::strerror(q.error));
        }
      }
      if (report.empty() || !drained[1 - i]) continue;
      other.push(report, true);
      drained[1 - i] = waitDrained(other, Clock::now() + kReportLimit);
    }
  }
  for (std::size_t i = 0; i < queues.size(); ++i) {
    std::lock_guard lock(queues[i]->mu);
    queues[i]->closing = true;
    if (!drained[i]) queues[i]->abandoned = true;
    queues[i]->wake.notify_all();
  }
  // A writer still blocked in a write holds its queue (shared) and ends with the process.
  for (std::size_t i = 0; i < queues.size(); ++i) {
    auto& writer = i == 0 ? out_writer_ : err_writer_;
    if (drained[i]) {
      writer.join();
    } else {
      writer.detach();
    }
  }
}

namespace {

class RelaySink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit RelaySink(OutputRelay& relay) : relay_(relay) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(msg, formatted);
    relay_.say(OutputRelay::Stream::kErr, std::string_view(formatted.data(), formatted.size()));
  }
  void flush_() override {}

 private:
  OutputRelay& relay_;
};

}  // namespace

LogThroughRelay::LogThroughRelay(OutputRelay& relay) : previous_(spdlog::default_logger()) {
  auto logger =
      std::make_shared<spdlog::logger>(previous_->name(), std::make_shared<RelaySink>(relay));
  logger->set_level(previous_->level());
  spdlog::set_default_logger(std::move(logger));
}

LogThroughRelay::~LogThroughRelay() {
  spdlog::set_default_logger(previous_);
}

}  // namespace troupe::apps
