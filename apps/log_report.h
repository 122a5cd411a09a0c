// `troupe report`'s work: troupe's CSV training logs (actors/run/train_log.h) read back, and the
// tables MXNet's tools/parse_log.py printed made from them, in Markdown.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "actors/run/train_log.h"

namespace troupe::apps {

struct TrainLogFile {
  std::string path;
  std::string experiment_id;
  std::vector<std::pair<std::string, std::string>> parameters;  // of the first line, in order
  bool skipped_column = false;       // skipped_records, after Caffe2's eleven
  bool test_loss_column = false;     // test_loss (a language model's), after those
  std::vector<actors::LogRow> rows;  // one per epoch, as written
};

// Reads a log as actors::TrainLog writes it: "# EXPERIMENT_ID key=value ...", the header of
// Caffe2's eleven columns (then skipped_records and test_loss, if the run had them), then one row
// per epoch. An
// InputError naming the file (and the line, "FILE:LINE: ...") for a file that cannot be read, a
// first line or header that is not troupe's, or a row that is not one number per column, whole
// where the column counts.
TrainLogFile readTrainLog(const std::string& path);

// Per log: a heading (the experiment id, the path and the main parameters) and its epochs' table.
// With several logs, a summary follows, one row per run: epochs logged, final and best test
// accuracy, total time (the last row's cumulative_time_spent, which a resumed run carries over)
// and mean inputs/s (the log's inputs over its time).
std::string reportMarkdown(const std::vector<TrainLogFile>& logs);

}  // namespace troupe::apps
