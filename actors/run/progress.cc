#include "actors/run/progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace troupe::actors {

ProgressLine::ProgressLine() {
  if (const char* forced = std::getenv("TROUPE_PROGRESS"); forced && *forced) {
    on_ = std::string_view(forced) != "0";
    return;
  }
  const char* term = std::getenv("TERM");
  on_ = ::isatty(STDERR_FILENO) && term && std::string_view(term) != "dumb" &&
        spdlog::default_logger()->should_log(spdlog::level::info);
}

void ProgressLine::show(const std::string& text, bool force) {
  if (!on_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && shown_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  shown_ = true;
  // Carriage return, the text, then erase what a longer earlier line left on the right.
  std::fprintf(stderr, "\r%s\033[K", text.c_str());
  std::fflush(stderr);
}

void ProgressLine::clear() {
  if (!on_ || !shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  shown_ = false;
}

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char out[32];
  if (s >= 3600) {
    std::snprintf(out, sizeof out, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(out, sizeof out, "%ld:%02ld", s / 60, s % 60);
  }
  return out;
}

}  // namespace troupe::actors
