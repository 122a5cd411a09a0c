// Opening a Store from one URL, the form a config or a command line names it in:
//   tcp://HOST:PORT                  a client of the embedded TCP store (tcp_store.h); some
//   process,
//                                    the launcher or rank 0, runs its server
//   file:///shared/dir               a FileStore on that folder (file_store.h)
//   redis://[:PASSWORD@]HOST[:PORT]  a RedisStore (redis_store.h); PORT defaults to 6379; without
//                                    a PASSWORD, $REDISCLI_AUTH's (redis-cli's variable), which
//                                    keeps it off command lines and out of config files
// HOST may be a name, an IPv4 address or a bracketed IPv6 address ("[::1]").
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "rendezvous/store.h"
#include "rendezvous/value.h"  // redactedStoreUrl

namespace troupe::rendezvous {

struct StoreUrl {
  enum class Scheme { kTcp, kFile, kRedis };
  Scheme scheme = Scheme::kTcp;
  std::string host;      // tcp, redis
  uint16_t port = 0;     // tcp, redis
  std::string path;      // file: absolute
  std::string password;  // redis, may be empty
};

// Parses `url`; anything else is an InputError naming the URL (password masked) and listing the
// accepted forms. Any thread.
StoreUrl parseStoreUrl(std::string_view url);

// Parses `url` and opens its store; `timeout` bounds connecting (tcp, redis); `secret` is the
// run's, which the embedded TCP store checks (transport/auth.h). Throws what parseStoreUrl and the
// backend's factory throw. Any thread.
std::unique_ptr<Store> openStore(std::string_view url, std::chrono::milliseconds timeout,
                                 const std::string& secret = "");

}  // namespace troupe::rendezvous
