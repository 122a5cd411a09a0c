// openStore (rendezvous/url.h): a URL's store opened, apart from the parsing in url.cc, which
// needs none of the backends.
#include <cstdlib>

#include "rendezvous/file_store.h"
#include "rendezvous/redis_store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/url.h"
#include "troupe/error.h"

namespace troupe::rendezvous {

std::unique_ptr<Store> openStore(std::string_view url, std::chrono::milliseconds timeout,
                                 const std::string& secret) {
  const auto parsed = parseStoreUrl(url);
  switch (parsed.scheme) {
    case StoreUrl::Scheme::kTcp:
      return connectTcpStore(parsed.host, parsed.port, timeout, secret);
    case StoreUrl::Scheme::kFile:
      return openFileStore(parsed.path);
    case StoreUrl::Scheme::kRedis: {
      RedisOptions options;
      options.host = parsed.host;
      options.port = parsed.port;
      options.password = parsed.password;
      if (const char* variable = std::getenv("REDISCLI_AUTH");
          variable && options.password.empty()) {
        options.password = variable;
      }
      options.connect_timeout = timeout;
      return connectRedisStore(options);
    }
  }
  TROUPE_ENFORCE(false, "unhandled store URL scheme");
}

}  // namespace troupe::rendezvous
