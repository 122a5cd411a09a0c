#include "apps/help_format.h"

#include <sstream>

namespace troupe::apps {

std::string wrapText(const std::string& text, std::size_t width) {
  std::string out, line;
  std::size_t at = 0;
  while (at < text.size()) {
    const auto end = std::min(text.find(' ', at), text.size());
    const std::string word = text.substr(at, end - at);
    at = end + 1;
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

std::string HelpFormatter::make_option_desc(const CLI::Option* option) const {
  return wrapText(option->get_description(), kHelpWidth - get_column_width());
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  std::stringstream out;
  CLI::detail::format_help(out, sub->get_display_name(),
                           wrapText(sub->get_description(), kHelpWidth - get_column_width()),
                           get_column_width());
  return out.str();
}

}  // namespace troupe::apps
