// The emulated GPU's streams and events (tests/emulated_gpu): work queued on a thread of its own,
// and events that fire when that thread gets to them. Shared by its backends and its NCCL.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/event.h"
#include "kernels/tensor.h"
#include "troupe/error.h"

namespace troupe::kernels::emulated {

inline int envInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

inline bool onHost(const Tensor& t) {
  return t.device().kind == DeviceKind::kCpu;
}

// The same memory as a host tensor, holding `t` alive.
inline Tensor hostView(const Tensor& t) {
  if (t.raw() == nullptr || onHost(t)) return t;
  auto keep = std::make_shared<Tensor>(t);
  return Tensor(std::shared_ptr<void>(keep, t.raw()), t.raw(), t.shape(), t.dtype(), Device{});
}

// A stream: work runs in order on a thread of its own. The first failure is kept and thrown at
// the next host wait (work after it still runs, so that events still fire).
class Stream {
 public:
  Stream() : delay_(envInt("TROUPE_EMULATED_GPU_DELAY_US", 0)), thread_([this] { run(); }) {}
  ~Stream() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  void enqueue(std::function<void()> work) {
    {
      std::lock_guard lock(mutex_);
      if (recording_) {
        recorded_.push_back(std::move(work));
        return;
      }
      queue_.push_back(std::move(work));
      ++queued_;
    }
    wake_.notify_all();
  }

  // As CUDA stream capture: from begin to end, work is kept in order, not run (Backend::capture).
  void beginRecording() {
    std::lock_guard lock(mutex_);
    TROUPE_ENFORCE(!recording_, "a capture inside a capture");
    recording_ = true;
    recorded_.clear();
  }
  std::vector<std::function<void()>> endRecording() {
    std::lock_guard lock(mutex_);
    recording_ = false;
    return std::exchange(recorded_, {});
  }
  bool recording() const {
    std::lock_guard lock(mutex_);
    return recording_;
  }
  // Throws "`what` while a CUDA graph is captured" while recording: what CUDA refuses on a
  // capturing stream.
  void refuseWhileRecording(const std::string& what) const {
    if (recording()) throw InvariantError(what + " while a CUDA graph is captured");
  }

  // Blocks until everything queued so far ran; rethrows a failure.
  void drain() {
    refuseWhileRecording("a host wait (a synchronize, or a read of what the device computed)");
    std::unique_lock lock(mutex_);
    const std::uint64_t target = queued_;
    done_.wait(lock, [&] { return ran_ >= target; });
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = std::move(queue_.front());
        queue_.pop_front();
      }
      if (delay_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_));
      std::exception_ptr failure;
      try {
        work();
      } catch (...) {
        failure = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        if (failure && !failure_) failure_ = failure;
        ++ran_;
      }
      done_.notify_all();
    }
  }

  const int delay_;
  mutable std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t queued_ = 0, ran_ = 0;
  std::exception_ptr failure_;
  bool stopping_ = false;
  bool recording_ = false;
  std::vector<std::function<void()>> recorded_;
  std::thread thread_;
};

// Done once its stream ran everything queued before it. As a CUDA event, it may be recorded
// again (a graph's replay, rearm()): it is then done once the stream got to that last record, and
// a wait stands for the record that was last when the wait was made (waitAsQueued), as
// cudaStreamWaitEvent's does, not for one made after.
class StreamEvent final : public EventImpl {
 public:
  // recorded: queued once already (false: an event recorded into a graph, done until replayed).
  explicit StreamEvent(bool recorded = true) : armed_(recorded ? 1 : 0) {}
  bool done() const override {
    std::lock_guard lock(mutex_);
    return fired_ >= armed_;
  }
  void wait() const override { waitUntil(armed()); }
  // The records queued so far, and a wait until the stream got to the `target`-th.
  std::uint64_t armed() const {
    std::lock_guard lock(mutex_);
    return armed_;
  }
  void waitUntil(std::uint64_t target) const {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return fired_ >= target; });
  }
  void rearm() {
    std::lock_guard lock(mutex_);
    ++armed_;
  }
  void fire() {
    {
      std::lock_guard lock(mutex_);
      ++fired_;
      when_ = std::chrono::steady_clock::now();
    }
    cv_.notify_all();
  }
  std::chrono::steady_clock::time_point when() const {
    std::lock_guard lock(mutex_);
    return when_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::uint64_t armed_, fired_ = 0;  // records queued, and reached by the stream
  std::chrono::steady_clock::time_point when_;
};

// Work for a stream that waits for `e` as it stands now: the record of it queued last before this
// call, not one queued after (another replay's).
inline std::function<void()> waitAsQueued(const Event& e) {
  if (const auto* event = dynamic_cast<const StreamEvent*>(e.impl())) {
    const std::uint64_t target = event->armed();
    return [e, event, target] { event->waitUntil(target); };
  }
  return [e] { e.wait(); };
}

// Seconds from `from` to `to`, two done StreamEvents.
inline double secondsBetween(const Event& from, const Event& to) {
  const auto* a = dynamic_cast<const StreamEvent*>(from.impl());
  const auto* b = dynamic_cast<const StreamEvent*>(to.impl());
  TROUPE_ENFORCE(a != nullptr && b != nullptr && a->done() && b->done(),
                 "elapsed() between events not done, or of another kind");
  return std::chrono::duration<double>(b->when() - a->when()).count();
}

}  // namespace troupe::kernels::emulated
