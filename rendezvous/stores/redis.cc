// redis://[:PASSWORD@]HOST[:PORT]: a RedisStore (rendezvous/redis_store.h). Without a PASSWORD in
// the URL, $REDISCLI_AUTH's (redis-cli's variable), which keeps it off command lines and out of
// config files.
#include <cstdlib>

#include "rendezvous/redis_store.h"
#include "rendezvous/url.h"

namespace troupe::rendezvous {
namespace {

constexpr int kRedisDefaultPort = 6379;
constexpr const char* kPasswordVariable = "REDISCLI_AUTH";

void parse(std::string_view url, std::string_view rest, StoreUrl& out) {
  auto host_port = rest;
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const auto userinfo = rest.substr(0, at);
    if (!userinfo.starts_with(':')) badStoreUrl(url, "a password is written ':PASSWORD@'");
    out.password = std::string(userinfo.substr(1));
    host_port = rest.substr(at + 1);
  }
  parseHostPort(url, host_port, kRedisDefaultPort, out);
}

std::unique_ptr<Store> open(const StoreUrl& url, std::chrono::milliseconds timeout,
                            const std::string&) {
  RedisOptions options;
  options.host = url.host;
  options.port = url.port;
  options.password = url.password;
  if (const char* variable = std::getenv(kPasswordVariable); variable && url.password.empty())
    options.password = variable;
  options.connect_timeout = timeout;
  return connectRedisStore(options);
}

}  // namespace

StoreBackend redisStoreBackend() {
  return {.scheme = "redis",
          .form = "redis://[:PASSWORD@]HOST[:PORT]",
          .summary =
              "a Redis server (port 6379 by default; the password may come from "
              "$REDISCLI_AUTH)",
          .parse = parse,
          .open = open,
          .password_variable = kPasswordVariable};
}

}  // namespace troupe::rendezvous
