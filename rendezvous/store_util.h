// Helpers shared by the Store backends (private to rendezvous/).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::rendezvous::detail {

// "5 s", "200 ms", "1.5 s".
std::string formatDuration(std::chrono::milliseconds d);

// "'a', 'b'"; bytes outside printable ASCII are written as \xNN.
std::string quoteKeys(const std::vector<std::string>& keys);

// Throws TimeoutError: "<store>: timed out after <d> waiting for key(s) <missing>".
[[noreturn]] void throwWaitTimeout(const std::string& store, std::chrono::milliseconds timeout,
                                   const std::vector<std::string>& missing);

// Parses a counter's decimal text; InputError naming the key and the store otherwise.
int64_t parseCounter(const std::string& store, const std::string& key, std::string_view text);

// Sleeps between polls: 1 ms, doubling up to 32 ms, never past the deadline.
class Backoff {
 public:
  explicit Backoff(std::chrono::steady_clock::time_point deadline) : deadline_(deadline) {}
  // Returns false, without sleeping, once the deadline has passed.
  bool sleep();

 private:
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::microseconds step_{1000};
};

}  // namespace troupe::rendezvous::detail
