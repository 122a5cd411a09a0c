#include "data/bpe.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <fstream>
#include <iterator>
#include <limits>

#include "troupe/error.h"

namespace troupe::data {
namespace {

struct CodeRange {
  char32_t first, end;  // [first, end)
};
#include "data/unicode_classes.inc"

bool inRanges(std::span<const CodeRange> ranges, char32_t c) {
  const auto it = std::upper_bound(ranges.begin(), ranges.end(), c,
                                   [](char32_t v, const CodeRange& r) { return v < r.end; });
  return it != ranges.end() && it->first <= c;
}

// Unicode's White_Space property (\s in the pattern).
bool isSpace(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

enum class Class : std::uint8_t { kLetter, kNumber, kSpace, kOther };

// The code point at text[at] and its length in bytes; a byte that starts no valid UTF-8
// sequence is one code point of its own, of class kOther.
struct CodePoint {
  Class type;
  std::size_t bytes;
};

CodePoint codePointAt(std::string_view text, std::size_t at) {
  const auto lead = static_cast<unsigned char>(text[at]);
  std::size_t n = lead < 0x80           ? 1
                  : (lead >> 5) == 0x6  ? 2
                  : (lead >> 4) == 0xE  ? 3
                  : (lead >> 3) == 0x1E ? 4
                                        : 0;
  char32_t c = n == 1 ? lead : n == 2 ? lead & 0x1F : n == 3 ? lead & 0x0F : lead & 0x07;
  if (n == 0 || at + n > text.size()) return {Class::kOther, 1};
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(text[at + k]);
    if ((b >> 6) != 0x2) return {Class::kOther, 1};
    c = (c << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  static constexpr char32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kSmallest[n] || (c >= 0xD800 && c < 0xE000) || c > 0x10FFFF) return {Class::kOther, 1};
  const Class type = isSpace(c)                   ? Class::kSpace
                     : inRanges(kLetterRanges, c) ? Class::kLetter
                     : inRanges(kNumberRanges, c) ? Class::kNumber
                                                  : Class::kOther;
  return {type, n};
}

// The end of the longest run of code points of class `type` from `at`.
std::size_t runEnd(std::string_view text, std::size_t at, Class type) {
  while (at < text.size()) {
    const CodePoint p = codePointAt(text, at);
    if (p.type != type) break;
    at += p.bytes;
  }
  return at;
}

// Where the pattern's match starting at `at` ends (at < text.size()): its alternatives in
// order, as the regular expression tries them.
std::size_t matchEnd(std::string_view text, std::size_t at) {
  const std::string_view rest = text.substr(at);
  if (rest[0] == '\'') {  // 's|'t|'re|'ve|'m|'ll|'d
    for (const std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
      if (rest.substr(1).starts_with(suffix)) return at + 1 + suffix.size();
    }
  }
  // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: one optional space, then a run of one class.
  const std::size_t from = rest[0] == ' ' && rest.size() > 1 ? at + 1 : at;
  const Class type = codePointAt(text, from).type;
  if (type != Class::kSpace) return runEnd(text, from, type);
  // `\s+(?!\S)|\s+`: a run of whitespace, less its last code point where something other than
  // whitespace follows (that one then starts the next piece: " word"), unless that leaves none.
  const std::size_t end = runEnd(text, at, Class::kSpace);
  if (end == text.size()) return end;
  std::size_t last = at, next = at;
  while (next < end) {
    last = next;
    next += codePointAt(text, next).bytes;
  }
  return last > at ? last : end;
}

// GPT-2's bytes_to_unicode: each byte as a printable character; the bytes that are printable
// in Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) as themselves, the others as U+0100 on.
std::array<char32_t, 256> byteCharacters() {
  std::array<char32_t, 256> chars{};
  char32_t next = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    chars[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return chars;
}

std::string readWhole(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{} '{}' cannot be read", what, path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A token in GPT-2's byte-to-character mapping (UTF-8) as the bytes it stands for; nullopt if a
// character is outside the mapping.
std::optional<std::string> tokenBytes(std::string_view mapped) {
  static const auto byte_of = [] {
    std::unordered_map<char32_t, char> m;
    const auto chars = byteCharacters();
    for (int b = 0; b < 256; ++b)
      m[chars[static_cast<std::size_t>(b)]] = static_cast<char>(b);
    return m;
  }();
  std::string out;
  for (std::size_t at = 0; at < mapped.size();) {
    const auto lead = static_cast<unsigned char>(mapped[at]);
    // The mapping's characters are below U+0144: one or two bytes of UTF-8.
    char32_t c = lead;
    std::size_t n = 1;
    if ((lead >> 5) == 0x6 && at + 1 < mapped.size() &&
        (static_cast<unsigned char>(mapped[at + 1]) >> 6) == 0x2) {
      c = ((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(mapped[at + 1]) & 0x3Fu);
      n = 2;
    } else if (lead >= 0x80) {
      return std::nullopt;
    }
    const auto it = byte_of.find(c);
    if (it == byte_of.end()) return std::nullopt;
    out += it->second;
    at += n;
  }
  return out;
}

std::string pairKey(std::string_view a, std::string_view b) {
  std::string key;
  key.reserve(a.size() + b.size() + 2);
  key += static_cast<char>(a.size() & 0xFF);
  key += static_cast<char>(a.size() >> 8);
  key += a;
  key += b;
  return key;
}

// A JSON object of string keys and non-negative integer values (a BPE vocabulary), in order.
class VocabParser {
 public:
  VocabParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  std::vector<std::pair<std::string, std::int64_t>> parse() {
    std::vector<std::pair<std::string, std::int64_t>> entries;
    expect('{');
    if (peek() == '}') {
      ++at_;
    } else {
      for (;;) {
        std::string key = string();
        expect(':');
        entries.emplace_back(std::move(key), integer());
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect('}');
        break;
      }
    }
    if (peek() != '\0') fail("text after the object");
    return entries;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(fmt::format(
        "vocabulary '{}' is not a JSON object of tokens and ids: {} at byte {}", path_, what, at_));
  }
  char peek() {
    while (at_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[at_])))
      ++at_;
    return at_ < text_.size() ? text_[at_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++at_;
  }
  unsigned hex4() {
    if (at_ + 4 > text_.size()) fail("a \\u escape cut short");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text_[at_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail("a \\u escape that is not hexadecimal");
      }
    }
    return v;
  }
  static void appendUtf8(std::string& out, char32_t c) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xC0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xE0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (at_ >= text_.size()) fail("a string without its closing quote");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("an escape cut short");
      switch (const char e = text_[at_++]) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          char32_t v = hex4();
          if (v >= 0xD800 && v < 0xDC00) {  // a surrogate pair
            if (text_.substr(at_, 2) != "\\u") fail("a lone surrogate");
            at_ += 2;
            const char32_t low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("a lone surrogate");
            v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
          }
          appendUtf8(out, v);
          break;
        }
        default:
          fail(fmt::format("the unknown escape '\\{}'", e));
      }
    }
  }
  std::int64_t integer() {
    peek();
    const std::size_t start = at_;
    std::int64_t v = 0;
    while (at_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[at_]))) {
      v = v * 10 + (text_[at_++] - '0');
      if (v > std::numeric_limits<std::uint32_t>::max()) fail("an id past 2^32 - 1");
    }
    if (at_ == start) fail("expected a non-negative integer id");
    return v;
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t at_ = 0;
};

}  // namespace

std::vector<std::string_view> gpt2Pieces(std::string_view text) {
  std::vector<std::string_view> pieces;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = matchEnd(text, at);
    pieces.push_back(text.substr(at, end - at));
    at = end;
  }
  return pieces;
}

Gpt2Tokenizer Gpt2Tokenizer::load(const std::string& vocab_path, const std::string& merges_path) {
  Gpt2Tokenizer t;
  const std::string vocab = readWhole(vocab_path, "vocabulary");
  for (auto& [token, id] : VocabParser(vocab, vocab_path).parse()) {
    // Special tokens outside the mapping (added by other tools) cannot come out of a merge.
    if (token == "<|endoftext|>") t.end_of_text_ = static_cast<std::uint32_t>(id);
    t.vocab_size_ = std::max(t.vocab_size_, id + 1);
    if (const auto bytes = tokenBytes(token)) {
      const auto [it, added] = t.bytes_.emplace(static_cast<std::uint32_t>(id), *bytes);
      if (!added && it->second != *bytes) {
        throw InputError(fmt::format("vocabulary '{}' gives id {} to two tokens", vocab_path, id));
      }
      t.ids_[*bytes] = static_cast<std::uint32_t>(id);
    }
  }
  const auto chars = byteCharacters();
  for (int b = 0; b < 256; ++b) {
    if (!t.ids_.count(std::string(1, static_cast<char>(b)))) {
      throw InputError(fmt::format(
          "vocabulary '{}' lacks the token of byte {} (U+{:04X} in GPT-2's byte mapping): not a "
          "byte-level BPE vocabulary",
          vocab_path, b, static_cast<std::uint32_t>(chars[static_cast<std::size_t>(b)])));
    }
  }
  std::ifstream merges(merges_path);
  if (!merges) throw InputError(fmt::format("merges '{}' cannot be read", merges_path));
  std::string line;
  int number = 0;
  while (std::getline(merges, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.starts_with("#version"))) continue;
    const auto space = line.find(' ');
    const auto a = space == std::string::npos ? std::nullopt : tokenBytes(line.substr(0, space));
    const auto b = space == std::string::npos ? std::nullopt : tokenBytes(line.substr(space + 1));
    if (!a || !b || a->empty() || b->empty()) {
      throw InputError(
          fmt::format("merges '{}' line {}: '{}' is not two tokens of GPT-2's byte "
                      "mapping separated by a space",
                      merges_path, number, line));
    }
    if (!t.ids_.count(*a + *b)) {
      throw InputError(fmt::format(
          "merges '{}' line {}: the vocabulary '{}' lacks the merge's result '{}'", merges_path,
          number, vocab_path, line.substr(0, space) + line.substr(space + 1)));
    }
    t.ranks_.emplace(pairKey(*a, *b), static_cast<int>(t.ranks_.size()));
  }
  return t;
}

std::vector<std::uint32_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<std::uint32_t> out;
  for (std::size_t at = 0; at < text.size();) {  // gpt2Pieces', one at a time
    const std::size_t end = matchEnd(text, at);
    encodeWord(text.substr(at, end - at), out);
    at = end;
  }
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const std::uint32_t> ids) const {
  std::string out;
  for (const std::uint32_t id : ids) {
    const auto it = bytes_.find(id);
    if (it == bytes_.end()) throw InputError(fmt::format("token {} is not in the vocabulary", id));
    out += it->second;
  }
  return out;
}

void Gpt2Tokenizer::encodeWord(std::string_view word, std::vector<std::uint32_t>& out) {
  if (const auto it = cache_.find(std::string(word)); it != cache_.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  // The word's symbols, bytes at first, merged pairwise: each time the adjacent pair of the
  // lowest rank, every occurrence of it from the left (encoder.py's bpe()).
  std::vector<std::string_view> symbols;
  for (std::size_t k = 0; k < word.size(); ++k)
    symbols.push_back(word.substr(k, 1));
  while (symbols.size() > 1) {
    int best = std::numeric_limits<int>::max();
    std::size_t at = 0;
    for (std::size_t k = 0; k + 1 < symbols.size(); ++k) {
      const auto it = ranks_.find(pairKey(symbols[k], symbols[k + 1]));
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        at = k;
      }
    }
    if (best == std::numeric_limits<int>::max()) break;
    const std::string_view first = symbols[at], second = symbols[at + 1];
    std::vector<std::string_view> merged;
    merged.reserve(symbols.size());
    for (std::size_t k = 0; k < symbols.size(); ++k) {
      if (k + 1 < symbols.size() && symbols[k] == first && symbols[k + 1] == second) {
        // Adjacent views into the word: their union is one.
        merged.push_back(std::string_view(symbols[k].data(), first.size() + second.size()));
        ++k;
      } else {
        merged.push_back(symbols[k]);
      }
    }
    symbols = std::move(merged);
  }
  std::vector<std::uint32_t> ids;
  for (const auto symbol : symbols)
    ids.push_back(ids_.at(std::string(symbol)));  // single bytes and merge results: checked
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache_.size() >= kCachedWords) cache_.clear();  // a bound on its memory
  cache_.emplace(std::string(word), std::move(ids));
}

}  // namespace troupe::data
