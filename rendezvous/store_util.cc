#include "rendezvous/store_util.h"

#include <charconv>
#include <thread>

#include <fmt/format.h>

#include "rendezvous/value.h"
#include "troupe/error.h"

namespace troupe::rendezvous::detail {

std::string formatDuration(std::chrono::milliseconds d) {
  const auto ms = d.count();
  if (ms < 1000) return fmt::format("{} ms", ms);
  if (ms % 1000 == 0) return fmt::format("{} s", ms / 1000);
  return fmt::format("{:g} s", static_cast<double>(ms) / 1000.0);
}

std::string quoteKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& key : keys) {
    if (!out.empty()) out += ", ";
    out += quoted(key, key.size());
  }
  return out;
}

void throwWaitTimeout(const std::string& store, std::chrono::milliseconds timeout,
                      const std::vector<std::string>& missing) {
  throw TimeoutError(fmt::format("{}: timed out after {} waiting for key{} {}", store,
                                 formatDuration(timeout), missing.size() == 1 ? "" : "s",
                                 quoteKeys(missing)));
}

int64_t parseCounter(const std::string& store, const std::string& key, std::string_view text) {
  int64_t value = 0;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw InputError(fmt::format("{}: key {} holds {} bytes that are not a decimal counter", store,
                                 quoteKeys({key}), text.size()));
  }
  return value;
}

bool Backoff::sleep() {
  const auto now = std::chrono::steady_clock::now();
  if (now >= deadline_) return false;
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - now);
  std::this_thread::sleep_for(std::min(step_, left));
  step_ = std::min(step_ * 2, std::chrono::microseconds(32000));
  return true;
}

}  // namespace troupe::rendezvous::detail
