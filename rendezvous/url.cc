#include "rendezvous/url.h"

#include <charconv>

#include <fmt/format.h>

#include "rendezvous/value.h"
#include "troupe/error.h"

namespace troupe::rendezvous {

std::string storeUrlForms(std::string_view separator) {
  std::string forms;
  for (const auto& backend : storeBackends())
    forms += fmt::format("{}{}", forms.empty() ? "" : separator, backend.form);
  return forms;
}

void badStoreUrl(std::string_view url, std::string_view why) {
  // The URL comes from outside (a flag, a file, a variable): shown escaped, as a store's values.
  throw InputError(fmt::format("rendezvous: bad store URL {}: {}; accepted forms: {}",
                               quoted(redactedStoreUrl(url)), why, storeUrlForms(", ")));
}

void parseHostPort(std::string_view url, std::string_view text, int default_port, StoreUrl& out) {
  std::string_view host;
  std::string_view rest;
  if (text.starts_with('[')) {
    const auto close = text.find(']');
    if (close == std::string_view::npos) badStoreUrl(url, "an IPv6 address lacks its ']'");
    host = text.substr(1, close - 1);
    rest = text.substr(close + 1);
    if (!rest.empty() && !rest.starts_with(':')) badStoreUrl(url, "expected ':PORT' after ']'");
  } else {
    const auto colon = text.find(':');
    host = text.substr(0, colon);
    rest = colon == std::string_view::npos ? std::string_view() : text.substr(colon);
  }
  if (host.empty()) badStoreUrl(url, "the host is missing");
  if (host.find_first_of("/?#@ ") != std::string_view::npos)
    badStoreUrl(url, "the host is malformed");
  out.host = std::string(host);
  if (rest.empty()) {
    if (default_port < 0) badStoreUrl(url, "the port is missing");
    out.port = static_cast<uint16_t>(default_port);
    return;
  }
  const auto digits = rest.substr(1);
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() || port == 0 ||
      port > 65535) {
    badStoreUrl(url, fmt::format("the port {} is not a number in 1..65535", quoted(digits)));
  }
  out.port = static_cast<uint16_t>(port);
}

StoreUrl parseStoreUrl(std::string_view url) {
  const auto sep = url.find("://");
  if (sep == std::string_view::npos) badStoreUrl(url, "it has no scheme");
  const auto scheme = url.substr(0, sep);
  for (const auto& backend : storeBackends()) {
    if (backend.scheme != scheme) continue;
    StoreUrl out;
    out.backend = &backend;
    backend.parse(url, url.substr(sep + 3), out);
    return out;
  }
  badStoreUrl(url, fmt::format("unknown scheme {}", quoted(scheme)));
}

std::unique_ptr<Store> openStore(std::string_view url, std::chrono::milliseconds timeout,
                                 const std::string& secret) {
  const auto parsed = parseStoreUrl(url);
  return parsed.backend->open(parsed, timeout, secret);
}

}  // namespace troupe::rendezvous
