// How `troupe ... --help` lays out its options: names and types in a column, each description
// wrapped beside it, no line past kHelpWidth characters (CLI11's own formatter writes a
// description on one line, however long).
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <string>

namespace troupe::apps {

inline constexpr std::size_t kHelpWidth = 100;

class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(40); }
  std::string make_option_desc(const CLI::Option* option) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
};

// `text` broken at blanks into lines of at most `width` (a word longer than that stands alone).
std::string wrapText(const std::string& text, std::size_t width);

}  // namespace troupe::apps
