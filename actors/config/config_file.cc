#include "actors/config/config_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "data/files.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// A config file is a page of keys: past 1 MiB it is the wrong file (a log, a dataset, /dev/zero),
// refused before it fills the memory.
constexpr std::size_t kMaxConfigBytes = 1 << 20;

}  // namespace

void checkSmallRegularFile(const std::string& path, const char* what, const struct stat& st) {
  if (!S_ISREG(st.st_mode)) {
    throw InputError(
        fmt::format("{} '{}' is {}, not a regular file", what, path, data::fileKind(st.st_mode)));
  }
  if (static_cast<std::uint64_t>(st.st_size) > kMaxConfigBytes) {
    throw InputError(fmt::format("{} '{}' is {} bytes, over the 1 MiB ({} bytes) it may hold", what,
                                 path, st.st_size, kMaxConfigBytes));
  }
}

std::string readConfigFile(const std::string& path) {
  return data::readRegularFile(path, "config file", kMaxConfigBytes,
                               fmt::format("1 MiB ({} bytes)", kMaxConfigBytes));
}

void checkNonAscii(const std::string& file, std::string_view text) {
  enum class At { kKeyStart, kKey, kValueStart, kWord, kAfter };
  enum class In { kCode, kComment, kBasic, kLiteral, kMultiBasic, kMultiLiteral };
  auto fail = [&](std::size_t pos, const char* what) {
    const auto line = 1 + std::count(text.begin(), text.begin() + pos, '\n');
    const auto line_start = text.rfind('\n', pos);
    const auto column = line_start == std::string_view::npos ? pos + 1 : pos - line_start;
    throw InputError(fmt::format("{}:{}:{}: {}", file, line, column, what));
  };
  auto nonAscii = [&](std::size_t pos) {
    return pos < text.size() && static_cast<unsigned char>(text[pos]) >= 0x80;
  };
  // At a closing """ or ''' (which may follow up to two quotes of the string): moves past it.
  auto closes = [&](std::size_t& pos, char quote) {
    if (text.substr(pos, 3) != std::string(3, quote)) return false;
    pos += 2;
    for (int extra = 0; extra < 2 && pos + 1 < text.size() && text[pos + 1] == quote; ++extra)
      ++pos;
    return true;
  };
  In in = In::kCode;
  At at = At::kKeyStart;
  At afterString = At::kAfter;
  std::string open;  // enclosing '[' (array), '{' (inline table), 'h' (table header)
  auto endString = [&] {
    in = In::kCode;
    at = afterString;
  };
  for (std::size_t pos = text.starts_with("\xEF\xBB\xBF") ? 3 : 0; pos < text.size(); ++pos) {
    const char c = text[pos];
    switch (in) {
      case In::kCode:
        if (nonAscii(pos)) fail(pos, "a non-ASCII character outside a string or comment");
        if (c == '#') {
          in = In::kComment;
        } else if (c == '\n') {
          at = !open.empty() && open.back() == '[' ? At::kValueStart : At::kKeyStart;
        } else if (c == ' ' || c == '\t' || c == '\r') {
          if (at == At::kWord) at = At::kAfter;
        } else if ((c == '"' || c == '\'') && (at == At::kKeyStart || at == At::kValueStart)) {
          const bool multi = text.substr(pos, 3) == std::string(3, c);
          in = c == '"' ? (multi ? In::kMultiBasic : In::kBasic)
                        : (multi ? In::kMultiLiteral : In::kLiteral);
          if (multi) pos += 2;
          afterString = at == At::kKeyStart ? At::kKey : At::kAfter;
        } else if (c == '=' && (at == At::kKeyStart || at == At::kKey)) {
          at = At::kValueStart;
        } else if (c == '.' && at == At::kKey) {
          at = At::kKeyStart;
        } else if (c == '[' && at == At::kValueStart) {
          open += '[';
        } else if (c == '[' && at == At::kKeyStart && (open.empty() || open.back() == 'h')) {
          open += 'h';
        } else if (c == '{' && at == At::kValueStart) {
          open += '{';
          at = At::kKeyStart;
        } else if (c == ']' || c == '}') {
          if (!open.empty()) open.pop_back();
          at = At::kAfter;
        } else if (c == ',') {
          at = open.empty() ? At::kAfter : open.back() == '[' ? At::kValueStart : At::kKeyStart;
        } else if (at == At::kKeyStart || at == At::kKey) {
          at = At::kKey;
        } else {
          at = At::kWord;  // a bare value, or what toml++ reads as part of one
        }
        break;
      case In::kComment:
        if (c == '\n') {
          in = In::kCode;
          at = !open.empty() && open.back() == '[' ? At::kValueStart : At::kKeyStart;
        }
        break;
      case In::kBasic:
        if (c == '\\') {
          ++pos;
        } else if (c == '"') {
          endString();
        } else if (c == '\n') {
          --pos;  // unterminated: the newline ends the line as code
          endString();
        }
        break;
      case In::kLiteral:
        if (c == '\'') {
          endString();
        } else if (c == '\n') {
          --pos;
          endString();
        }
        break;
      case In::kMultiBasic:
        if (c == '\\') {
          std::size_t next = pos + 1;
          while (next < text.size() && (text[next] == ' ' || text[next] == '\t' ||
                                        text[next] == '\r' || text[next] == '\n')) {
            ++next;
          }
          if (nonAscii(next)) {
            fail(next, "a non-ASCII character after a backslash in a multi-line string");
          }
          pos = next > pos + 1 ? next - 1 : next;
        } else if (c == '"' && closes(pos, '"')) {
          endString();
        }
        break;
      case In::kMultiLiteral:
        if (c == '\'' && closes(pos, '\'')) endString();
        break;
    }
  }
}

}  // namespace troupe::actors
