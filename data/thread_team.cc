#include "data/thread_team.h"

#include "troupe/error.h"

namespace troupe::data {

ThreadTeam::ThreadTeam(int threads) {
  TROUPE_ENFORCE_GE(threads, 1);
  for (int member = 1; member < threads; ++member)
    helpers_.emplace_back([this, member] { helper(member); });
}

ThreadTeam::~ThreadTeam() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : helpers_)
    t.join();
}

void ThreadTeam::run(std::int64_t n, const std::function<void(std::int64_t, int)>& task) {
  {
    std::lock_guard lock(mu_);
    task_ = &task;
    n_ = n;
    next_ = 0;
    error_index_ = -1;
    error_ = nullptr;
    busy_ = size();
    ++generation_;
  }
  start_.notify_all();
  work(0);
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return busy_ == 0; });
  task_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadTeam::work(int member) {
  std::unique_lock lock(mu_);
  while (next_ < n_) {
    const std::int64_t i = next_++;
    const auto* task = task_;
    lock.unlock();
    std::exception_ptr error;
    try {
      (*task)(i, member);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && (error_index_ < 0 || i < error_index_)) {
      error_index_ = i;
      error_ = error;
    }
  }
  if (--busy_ == 0) done_.notify_all();
}

void ThreadTeam::helper(int member) {
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work(member);
  }
}

}  // namespace troupe::data
