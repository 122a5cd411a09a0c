// Private to data/: a fixed team of threads that runs the iterations of a loop, the caller's
// thread among them (fork-join, as an OpenMP team, but apart from the OpenMP teams of the
// replicas' kernels). The record decoders of a Dataset use one.
// Thread safety: run() from one thread at a time (the team's owner).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace troupe::data {

class ThreadTeam {
 public:
  // threads >= 1: the caller and threads - 1 helpers, started now and joined by the destructor.
  explicit ThreadTeam(int threads);
  ~ThreadTeam();
  ThreadTeam(const ThreadTeam&) = delete;
  ThreadTeam& operator=(const ThreadTeam&) = delete;

  int size() const { return static_cast<int>(helpers_.size()) + 1; }

  // task(i, member) for every i in [0, n), each once, spread over the team as members become free
  // (member in [0, size()): which thread, for per-thread state). Returns when all have returned;
  // an exception of a task is rethrown then, the one of the smallest i when several threw.
  void run(std::int64_t n, const std::function<void(std::int64_t, int)>& task);

 private:
  void work(int member);
  void helper(int member);

  std::vector<std::thread> helpers_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(std::int64_t, int)>* task_ = nullptr;
  std::int64_t n_ = 0, next_ = 0;
  std::uint64_t generation_ = 0;
  int busy_ = 0;
  bool stop_ = false;
  std::int64_t error_index_ = -1;
  std::exception_ptr error_;
};

}  // namespace troupe::data
