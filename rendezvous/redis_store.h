// A Store on a Redis server (hiredis): SET and GET for values, INCRBY for add(), DEL for remove().
// get() and wait() poll with a short backoff (1 ms doubling to 32 ms) and never hold the
// connection while sleeping.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/store.h"

namespace troupe::rendezvous {

struct RedisOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 6379;
  // Sent with AUTH when not empty.
  std::string password;
  // How long to keep trying to reach the server, on first use and after a lost connection.
  std::chrono::milliseconds connect_timeout{30000};
  // How long one command may take before the connection is given up (IoError).
  std::chrono::milliseconds command_timeout{30000};
};

// Connects, retrying until options.connect_timeout runs out (TimeoutError naming host:port), and
// authenticates: a wrong or missing password is an InputError naming host:port. The store holds
// one connection under a mutex; any thread may call it. A connection lost mid-command is an
// IoError, and the next call connects again.
std::unique_ptr<Store> connectRedisStore(const RedisOptions& options);

}  // namespace troupe::rendezvous
