// The key-value store through which the processes of a run find each other.
//
// Keys are strings; values are binary-safe byte strings (embedded zero bytes are fine). A counter
// made by add() is stored as its decimal text, so get() of a counter returns e.g. "42".
// Backends: tcp_store.h (embedded, the default), file_store.h (shared folder), redis_store.h;
// url.h opens any of them from one URL, prefix_store.h puts a run's keys under its run id.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::rendezvous {

// Every method may be called from any thread, concurrently with the others, on the same Store.
// Methods that wait take a timeout and throw TimeoutError when it runs out; methods that do not
// wait may still throw IoError when the backend is unreachable (a peer store that went away),
// never hang past the backend's own I/O timeout.
class Store {
 public:
  virtual ~Store() = default;

  // Stores `value` under `key`, replacing any previous value, and wakes the waiters on `key`.
  virtual void set(const std::string& key, std::string_view value) = 0;

  // Returns the value of `key`, waiting until some process sets it. Throws TimeoutError naming
  // the key and the store when `timeout` runs out first.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;

  // Atomically adds `delta` to the counter `key` (created at 0) and returns the new value; never
  // waits. Throws InputError when `key` holds something that is not a decimal integer.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;

  // True when every key exists; never waits.
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Returns once every key exists. Throws TimeoutError listing exactly the keys still missing when
  // `timeout` runs out first.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;

  // Deletes `key`; returns whether it existed. Never waits.
  virtual bool remove(const std::string& key) = 0;

  // One line naming the store for messages, e.g. "tcp store 10.0.0.1:29500".
  virtual std::string describe() const = 0;
};

}  // namespace troupe::rendezvous
