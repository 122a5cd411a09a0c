#include "rendezvous/exchange.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rendezvous/store_util.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

void checkRank(std::string_view what, std::string_view name, int rank, int world_size) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw InputError(
        fmt::format("{} '{}': rank {} is outside a world of {}", what, name, rank, world_size));
  }
}

std::vector<std::string> rankKeys(std::string_view prefix, int world_size) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r)
    keys.push_back(fmt::format("{}/{}", prefix, r));
  return keys;
}

// After waiting `timeout` for every rank's key: TimeoutError naming the ranks whose keys are
// still missing. Returns normally if they all turned up after all.
void throwMissing(Store& store, std::string_view what, std::string_view name,
                  const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                  const std::function<std::string(int)>& who) {
  std::vector<int> missing;
  for (size_t r = 0; r < keys.size(); ++r) {
    if (!store.check({keys[r]})) missing.push_back(static_cast<int>(r));
  }
  if (missing.empty()) return;
  const std::string ranks = fmt::format("rank{} {} of {}", missing.size() == 1 ? "" : "s",
                                        fmt::join(missing, ", "), keys.size());
  std::vector<std::string> named;
  if (who) {
    for (const int r : missing)
      named.push_back(who(r));
  }
  throw TimeoutError(fmt::format(
      "{} '{}' timed out after {} waiting for {} ({})", what, name, detail::formatDuration(timeout),
      named.empty() ? ranks : fmt::format("{} ({})", fmt::join(named, ", "), ranks),
      store.describe()));
}

// Waits for every rank's key; on timeout names the ranks whose keys are still missing. Returns
// normally if they all turned up after all.
void waitForRanks(Store& store, std::string_view what, std::string_view name,
                  const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                  const std::function<std::string(int)>& who = {}) {
  try {
    store.wait(keys, timeout);
  } catch (const TimeoutError&) {
    throwMissing(store, what, name, keys, timeout, who);
  }
}

}  // namespace

std::vector<std::string> exchange(Store& store, int rank, int world_size, std::string_view my_value,
                                  std::chrono::milliseconds timeout, std::string_view name,
                                  const std::function<std::string(int)>& who) {
  checkRank("rendezvous", name, rank, world_size);
  const auto keys = rankKeys(name, world_size);
  store.set(keys[static_cast<size_t>(rank)], my_value);
  waitForRanks(store, "rendezvous", name, keys, timeout, who);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys)
    values.push_back(store.get(key, timeout));
  return values;
}

void barrier(Store& store, std::string_view name, int rank, int world_size,
             std::chrono::milliseconds timeout, const std::function<std::string(int rank)>& gone) {
  checkRank("barrier", name, rank, world_size);
  const auto keys = rankKeys(fmt::format("barrier/{}", name), world_size);
  store.set(keys[static_cast<size_t>(rank)], "");
  if (!gone) {
    waitForRanks(store, "barrier", name, keys, timeout);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const auto slice = std::min(left, std::chrono::milliseconds(100));
    if (slice.count() <= 0) break;
    try {
      store.wait(keys, slice);
      return;
    } catch (const TimeoutError&) {
    }
    for (size_t r = 0; r < keys.size(); ++r) {
      if (store.check({keys[r]})) continue;
      if (const std::string why = gone(static_cast<int>(r)); !why.empty()) {
        throw Error(
            fmt::format("barrier '{}': rank {} of {} never comes: {}", name, r, keys.size(), why));
      }
    }
  }
  throwMissing(store, "barrier", name, keys, timeout, {});
}

}  // namespace troupe::rendezvous
