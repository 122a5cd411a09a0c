// libFuzzer target: a value read from a rendezvous store, which anyone who may write the store
// could have written (rendezvous/value.h), parsed as the run parses its values (words, whole
// integers in a range, "name=value" lines) and shown as its messages show them; and a store URL
// as a config or a variable gives it (rendezvous/url.h), shown redacted. Bad input may only throw
// troupe::InputError. A finding: a crash, another exception, a sanitizer report, a shown value
// with a byte a terminal would act on, a parse that returns what its bytes do not hold, or a redis
// password left in a redacted URL.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rendezvous/url.h"
#include "rendezvous/value.h"
#include "troupe/error.h"

namespace {

[[noreturn]] void finding(const char* what, std::string_view text) {
  std::fprintf(stderr, "store_value_fuzz: %s: %s\n", what,
               troupe::rendezvous::quoted(text).c_str());
  std::abort();
}

void checkShown(std::string_view shown, std::string_view from) {
  for (const unsigned char c : shown) {
    if (c < 0x20 || c >= 0x7f) finding("a shown value holds a control or non-ASCII byte", from);
  }
}

template <typename Fn>
void expectInputErrorOnly(Fn&& fn, std::string_view text) {
  try {
    fn();
  } catch (const troupe::InputError& e) {
    checkShown(e.what(), text);  // the refusal quotes the value: escaped
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  namespace rv = troupe::rendezvous;
  checkShown(rv::printable(text), text);
  checkShown(rv::quoted(text), text);
  checkShown(rv::printable(text, text.size()), text);
  if (rv::printable(rv::printable(text, text.size()), 1u << 30) != rv::printable(text, text.size()))
    finding("printable is not idempotent", text);

  const rv::StoreValue value("fuzz", "key\x1b", text);
  expectInputErrorOnly([&] { value.refuse("anything"); }, text);
  expectInputErrorOnly(
      [&] {
        for (const auto word : value.words()) {
          if (word.empty() || word.find_first_of(" \t\n") != std::string_view::npos)
            finding("a word with a blank", text);
          const auto n = value.integer(word, -1000, 1000, "a small integer");
          std::int64_t parsed = 0;
          const auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), parsed);
          if (n < -1000 || n > 1000 || ec != std::errc() || end != word.data() + word.size() ||
              parsed != n)
            finding("an integer its word does not hold, or out of its range", text);
        }
        value.words(3);
      },
      text);
  expectInputErrorOnly(
      [&] {
        for (const auto& [name, v] : value.pairs()) {
          if (name.empty() || name.find('=') != std::string::npos ||
              name.find('\n') != std::string::npos || v.find('\n') != std::string::npos)
            finding("a pair that its line does not hold", text);
        }
      },
      text);

  expectInputErrorOnly([&] { rv::parseStoreUrl(text); }, text);
  const std::string redacted = rv::redactedStoreUrl(text);
  try {
    const auto url = rv::parseStoreUrl(text);
    // Everything before the host, the password's place, is "redis://***".
    if (!url.password.empty() &&
        std::string_view(redacted).substr(0, redacted.rfind('@')) != "redis://***")
      finding("a redis password shown in its redacted URL", text);
  } catch (const troupe::InputError&) {
  }
  return 0;
}
