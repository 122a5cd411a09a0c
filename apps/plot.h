// `troupe plot`'s work: training logs drawn with cairo as one SVG or PNG. Three rows of panels
// (training loss dashed and, for a language model, test loss solid; train accuracy dashed and test
// accuracy solid; inputs/s), against epoch on the left and
// against wall time (the log's cumulative time) on the right; one colour a run, named in a legend.
#pragma once

#include <string>
#include <vector>

#include "apps/log_report.h"

namespace troupe::apps {

struct PlotOptions {
  std::string output;  // FILE.svg or FILE.png
  int width = 1200;    // pixels (SVG: points)
  int height = 960;
  std::string title;  // empty: "troupe training" and the number of runs
};

// Draws `logs`, labelled `labels` (one each). InputError for an output that is neither .svg nor
// .png, or a log without rows; IoError naming the file when it cannot be written.
void plotLogs(const std::vector<TrainLogFile>& logs, const std::vector<std::string>& labels,
              const PlotOptions& options);

// Round tick values covering [lo, hi], about `target` of them (1, 2 or 5 times a power of ten
// apart); for tests too.
std::vector<double> niceTicks(double lo, double hi, int target);

}  // namespace troupe::apps
