#include "rendezvous/url.h"

#include <charconv>

#include <fmt/format.h>

#include "rendezvous/value.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

constexpr std::string_view kForms =
    "tcp://HOST:PORT, file:///shared/dir, redis://[:PASSWORD@]HOST[:PORT]";
constexpr uint16_t kRedisDefaultPort = 6379;

[[noreturn]] void bad(std::string_view url, std::string_view why) {
  // The URL comes from outside (a flag, a file, a variable): shown escaped, as a store's values.
  throw InputError(fmt::format("rendezvous: bad store URL {}: {}; accepted forms: {}",
                               quoted(redactedStoreUrl(url)), why, kForms));
}

// "HOST:PORT" or "HOST" (then `default_port`, when there is one).
void parseHostPort(std::string_view url, std::string_view text, int default_port, StoreUrl& out) {
  std::string_view host;
  std::string_view rest;
  if (text.starts_with('[')) {
    const auto close = text.find(']');
    if (close == std::string_view::npos) bad(url, "an IPv6 address lacks its ']'");
    host = text.substr(1, close - 1);
    rest = text.substr(close + 1);
    if (!rest.empty() && !rest.starts_with(':')) bad(url, "expected ':PORT' after ']'");
  } else {
    const auto colon = text.find(':');
    host = text.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon);
  }
  if (host.empty()) bad(url, "the host is missing");
  if (host.find_first_of("/?#@ ") != std::string_view::npos) bad(url, "the host is malformed");
  out.host = std::string(host);
  if (rest.empty()) {
    if (default_port < 0) bad(url, "the port is missing");
    out.port = static_cast<uint16_t>(default_port);
    return;
  }
  const auto digits = rest.substr(1);
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() || port == 0 ||
      port > 65535) {
    bad(url, fmt::format("the port {} is not a number in 1..65535", quoted(digits)));
  }
  out.port = static_cast<uint16_t>(port);
}

}  // namespace

StoreUrl parseStoreUrl(std::string_view url) {
  StoreUrl out;
  const auto sep = url.find("://");
  if (sep == std::string_view::npos) bad(url, "it has no scheme");
  const auto scheme = url.substr(0, sep);
  const auto rest = url.substr(sep + 3);
  if (scheme == "tcp") {
    out.scheme = StoreUrl::Scheme::kTcp;
    parseHostPort(url, rest, -1, out);
  } else if (scheme == "file") {
    out.scheme = StoreUrl::Scheme::kFile;
    if (!rest.starts_with('/')) bad(url, "a file store needs an absolute path (file:///dir)");
    if (rest.size() == 1) bad(url, "a file store needs a folder, not '/'");
    out.path = std::string(rest);
  } else if (scheme == "redis") {
    out.scheme = StoreUrl::Scheme::kRedis;
    auto host_port = rest;
    if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
      const auto userinfo = rest.substr(0, at);
      if (!userinfo.starts_with(':')) bad(url, "a password is written ':PASSWORD@'");
      out.password = std::string(userinfo.substr(1));
      host_port = rest.substr(at + 1);
    }
    parseHostPort(url, host_port, kRedisDefaultPort, out);
  } else {
    bad(url, fmt::format("unknown scheme {}", quoted(scheme)));
  }
  return out;
}

}  // namespace troupe::rendezvous
