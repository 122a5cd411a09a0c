// Opening a Store from one URL, the form a config or a command line names it in: SCHEME://...,
// each scheme a backend (StoreBackend) of rendezvous/stores/ (tcp.cc, file.cc, redis.cc). Their
// forms, listed by storeUrlForms() and `troupe info`:
//   tcp://HOST:PORT                  a client of the embedded TCP store (tcp_store.h); some
//                                    process, the launcher or rank 0, runs its server
//   file:///shared/dir               a FileStore on that folder (file_store.h)
//   redis://[:PASSWORD@]HOST[:PORT]  a RedisStore (redis_store.h); PORT defaults to 6379; without
//                                    a PASSWORD, $REDISCLI_AUTH's (redis-cli's variable), which
//                                    keeps it off command lines and out of config files
// HOST may be a name, an IPv4 address or a bracketed IPv6 address ("[::1]"). A URL's user
// information (SCHEME://USER:PASSWORD@...) is never shown (redactedStoreUrl, value.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store.h"
#include "rendezvous/value.h"  // redactedStoreUrl

namespace troupe::rendezvous {

struct StoreBackend;

struct StoreUrl {
  const StoreBackend* backend = nullptr;  // the scheme's
  std::string host;                       // tcp, redis
  uint16_t port = 0;                      // tcp, redis
  std::string path;                       // file: absolute
  std::string password;                   // redis, may be empty
};

// A kind of store: one file of rendezvous/stores/ returns its row, which storeBackends() lists.
struct StoreBackend {
  std::string_view scheme;   // "redis"
  std::string_view form;     // "redis://[:PASSWORD@]HOST[:PORT]"
  std::string_view summary;  // for `troupe info`
  // Fills `out` from `rest`, what follows "SCHEME://" in `url`; throws through badStoreUrl.
  void (*parse)(std::string_view url, std::string_view rest, StoreUrl& out);
  std::unique_ptr<Store> (*open)(const StoreUrl& url, std::chrono::milliseconds timeout,
                                 const std::string& secret);
  // A process of the run serves it (startTcpStoreServer: the launcher, or rank 0 when started
  // by hand).
  bool embedded = false;
  // A variable the backend reads its password from, which dry runs never show; empty: none.
  std::string_view password_variable = {};
};

// Every backend, in the order help texts list them: tcp, the embedded default, then by file name
// (written by the build from rendezvous/stores/, cmake/registry.cmake).
const std::vector<StoreBackend>& storeBackends();
// The backends' forms joined by `separator`: "tcp://HOST:PORT | file:///shared/dir | ...".
std::string storeUrlForms(std::string_view separator = " | ");

// For a backend's parse: an InputError naming `url` (its password masked) and why, with the
// accepted forms.
[[noreturn]] void badStoreUrl(std::string_view url, std::string_view why);
// For a backend's parse: "HOST:PORT" or "HOST" (then `default_port`, when there is one: >= 0).
void parseHostPort(std::string_view url, std::string_view text, int default_port, StoreUrl& out);

// Parses `url`; anything else is an InputError naming the URL (password masked) and listing the
// accepted forms. Any thread.
StoreUrl parseStoreUrl(std::string_view url);

// Parses `url` and opens its store; `timeout` bounds connecting (tcp, redis); `secret` is the
// run's, which the embedded TCP store checks (transport/auth.h). Throws what parseStoreUrl and the
// backend's factory throw. Any thread.
std::unique_ptr<Store> openStore(std::string_view url, std::chrono::milliseconds timeout,
                                 const std::string& secret = "");

}  // namespace troupe::rendezvous
