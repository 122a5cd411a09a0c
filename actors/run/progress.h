// The live progress line of a run on a terminal: one line on stderr, redrawn in place between
// steps — epoch, step/steps, inputs/s, loss, learning rate, time left. Used when stderr is a
// terminal (and TERM is not "dumb") and the log level lets info lines through; otherwise the
// periodic log lines (log_every) say the same, one line each, as pipes and files want them.
#pragma once

#include <chrono>
#include <string>

namespace troupe::actors {

class ProgressLine {
 public:
  ProgressLine();  // on or off, as above; `TROUPE_PROGRESS=0|1` overrides the check
  bool on() const { return on_; }
  // Redraws the line with `text` (at most every 100 ms; `force` draws anyway).
  void show(const std::string& text, bool force = false);
  // Erases the line, before other output takes its place; show() draws it again.
  void clear();

 private:
  bool on_ = false;
  bool shown_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// "1:02:03", "4:05", "0:09": time left, as progress bars show it.
std::string formatDuration(double seconds);

}  // namespace troupe::actors
