#include "rendezvous/value.h"

#include <fmt/format.h>

#include <charconv>

#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

std::string escaped(std::string_view bytes, std::size_t max, bool quote) {
  std::string out;
  const auto shown = bytes.substr(0, max);
  for (unsigned char c : shown) {
    if (c >= 0x20 && c < 0x7f && !(quote && c == '\'')) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (shown.size() < bytes.size()) out += fmt::format("... ({} bytes)", bytes.size());
  return out;
}

}  // namespace

std::string printable(std::string_view bytes, std::size_t max) {
  return escaped(bytes, max, false);
}

std::string quoted(std::string_view bytes, std::size_t max) {
  return "'" + escaped(bytes, max, true) + "'";
}

std::string redactedStoreUrl(std::string_view url) {
  const auto sep = url.find("://");
  if (sep == std::string_view::npos) return std::string(url);
  const auto rest = url.substr(sep + 3);
  // Up to the last '@', even in what looks like a path (redis:///pw@host is a password typed
  // wrong, not a path): a file store's folder with an '@' in it is shown masked, not a password.
  const auto at = rest.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  return fmt::format("{}***{}", url.substr(0, sep + 3), rest.substr(at));
}

void StoreValue::refuse(std::string_view expected) const {
  throw InputError(fmt::format("{}: the store's {} holds {}, not {}", who_, quoted(key_),
                               quoted(text_), expected));
}

std::vector<std::string_view> StoreValue::words(int n) const {
  std::vector<std::string_view> out;
  const std::string_view text(text_);
  for (std::size_t at = 0; at < text.size();) {
    const auto begin = text.find_first_not_of(" \t\n", at);
    if (begin == std::string_view::npos) break;
    const auto end = std::min(text.find_first_of(" \t\n", begin), text.size());
    out.push_back(text.substr(begin, end - begin));
    at = end;
  }
  if (n >= 0 && out.size() != static_cast<std::size_t>(n)) {
    refuse(fmt::format("{} words", n));
  }
  return out;
}

std::int64_t StoreValue::integer(std::string_view word, std::int64_t lo, std::int64_t hi,
                                 std::string_view what) const {
  std::int64_t value = 0;
  const auto* end = word.data() + word.size();
  const auto [ptr, ec] = std::from_chars(word.data(), end, value);
  if (word.empty() || ec != std::errc() || ptr != end || value < lo || value > hi) {
    refuse(fmt::format("{} (an integer in [{}, {}]) in its word {}", what, lo, hi, quoted(word)));
  }
  return value;
}

std::vector<std::pair<std::string, std::string>> StoreValue::pairs() const {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string_view text(text_);
  for (std::size_t at = 0; at < text.size();) {
    const auto end = std::min(text.find('\n', at), text.size());
    const auto line = text.substr(at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    const auto eq = line.find('=');
    if (eq == 0 || eq == std::string_view::npos) refuse("lines of name=value");
    out.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  return out;
}

}  // namespace troupe::rendezvous
