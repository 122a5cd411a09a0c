// docs/flags.md's tables, read for the tests that hold them to the code (apps_flags_test.cc,
// launch_mxnet_options_test.cc): each row's flag, example and what troupe does with it.
#pragma once

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace troupe::testing {

// One row: "| `--flag` | `example` | troupe | notes |".
struct FlagRow {
  std::string flag;     // the first cell, backticks removed ("--redis_host", "-n, --num-workers")
  std::string example;  // the code in the second cell
  // The third cell: `k = v`, ... -> expected (pairs); refused: `TEXT`, runs: `TEXT` or listed:
  // `TEXT` -> kind and text.
  std::string kind;  // "values", "refused", "runs" or "listed"
  std::string text;
  std::vector<std::pair<std::string, std::string>> expected;
  int line = 0;  // in the file
};

// The code spans of a cell, in order.
inline std::vector<std::string> codeSpans(const std::string& cell) {
  std::vector<std::string> spans;
  for (std::size_t open = cell.find('`'); open != std::string::npos;) {
    const std::size_t close = cell.find('`', open + 1);
    if (close == std::string::npos) break;
    spans.push_back(cell.substr(open + 1, close - open - 1));
    open = cell.find('`', close + 1);
  }
  return spans;
}

inline std::string trimmed(const std::string& s) {
  const auto first = s.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(' ') - first + 1);
}

// The rows of the table under the heading `heading` ("## ..."), in order; empty when there is
// no such heading. Cells are split at " | " (no cell of these tables holds a '|').
inline std::vector<FlagRow> flagRows(const std::string& path, const std::string& heading) {
  std::ifstream in(path);
  std::vector<FlagRow> rows;
  bool inside = false;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.starts_with("## ")) {
      inside = line == heading;
      continue;
    }
    if (!inside || !line.starts_with("| `")) continue;
    std::vector<std::string> cells;
    std::size_t start = 1;
    for (std::size_t bar; (bar = line.find(" |", start)) != std::string::npos; start = bar + 2)
      cells.push_back(trimmed(line.substr(start, bar - start)));
    if (cells.size() < 3) continue;
    FlagRow row;
    row.line = number;
    for (const auto& span : codeSpans(cells[0]))
      row.flag += (row.flag.empty() ? "" : ", ") + span;
    const auto example = codeSpans(cells[1]);
    row.example = example.empty() ? "" : example.front();
    const std::string& result = cells[2];
    const auto spans = codeSpans(result);
    for (const char* kind : {"refused", "runs", "listed"}) {
      if (result.starts_with(std::string(kind) + ": ") && !spans.empty()) {
        row.kind = kind;
        row.text = spans.front();
      }
    }
    if (row.kind.empty()) {
      row.kind = "values";
      for (const auto& span : spans) {
        const auto eq = span.find(" = ");
        if (eq != std::string::npos)
          row.expected.emplace_back(span.substr(0, eq), span.substr(eq + 3));
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// "--a 1 --b --c x" -> {a: 1, b: "", c: x}: a flag's value is the next word unless that is a
// flag too (as a boolean flag takes none).
inline std::vector<std::pair<std::string, std::string>> flagWords(const std::string& example) {
  std::istringstream words(example);
  std::vector<std::string> all;
  for (std::string w; words >> w;)
    all.push_back(w);
  std::vector<std::pair<std::string, std::string>> flags;
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (!all[i].starts_with("--")) continue;
    const bool valued = i + 1 < all.size() && !all[i + 1].starts_with("--");
    flags.emplace_back(all[i].substr(2), valued ? all[i + 1] : "");
  }
  return flags;
}

}  // namespace troupe::testing
