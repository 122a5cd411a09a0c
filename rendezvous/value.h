// Values read from a Store come from outside this process: another process of the run, a stale
// run, or anyone who may write the store. Shown, they are escaped (a control byte in a terminal
// or a log is an attack); parsed, a malformed one is one InputError naming who read it and the
// key, never a std::exception from deep inside a parse. Any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::rendezvous {

// The bytes as text fit for a terminal: printable ASCII as it is, every other byte as \xNN; cut
// after `max` bytes with "... (N bytes)". Idempotent on what it returns (uncut).
std::string printable(std::string_view bytes, std::size_t max = 200);

// printable() inside quotes, the quote itself escaped: "'a\x1b[31m'".
std::string quoted(std::string_view bytes, std::size_t max = 200);

// A store URL fit for a log, a message or a terminal: its user information, a password
// (SCHEME://[USER]:PASSWORD@HOST: all up to the last '@'), replaced by "***" (url.h has the
// forms).
std::string redactedStoreUrl(std::string_view url);

// A value read from key `key` of a store, for `who` ("elastic rendezvous", "rank 3") to parse.
class StoreValue {
 public:
  StoreValue(std::string who, std::string key, std::string text)
      : who_(std::move(who)), key_(std::move(key)), text_(std::move(text)) {}

  const std::string& text() const { return text_; }

  // Throws InputError "<who>: the store's '<key>' holds <quoted text>, not <expected>".
  [[noreturn]] void refuse(std::string_view expected) const;

  // The value's words (split at blanks); refused unless there are `n` of them (any number: -1).
  std::vector<std::string_view> words(int n = -1) const;

  // `word` as a whole decimal integer in [lo, hi]; refused otherwise, naming `what` it is.
  std::int64_t integer(std::string_view word, std::int64_t lo, std::int64_t hi,
                       std::string_view what) const;

  // "name=value" lines, in order; refused for a line without '=' or an empty name.
  std::vector<std::pair<std::string, std::string>> pairs() const;

 private:
  std::string who_;
  std::string key_;
  std::string text_;
};

}  // namespace troupe::rendezvous
