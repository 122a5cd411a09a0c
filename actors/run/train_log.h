// The CSV training log, laid out like Caffe2's ModelTrainerLog: a file named after the experiment
// (lenet_cpu2_b64_L10_lr0.05_20261122_101500.log), its first line the run's parameters after '#',
// then a header and one row per epoch.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors {

struct LogRow {
  double time_spent = 0;
  double cumulative_time_spent = 0;
  long long input_count = 0;
  long long cumulative_input_count = 0;
  long long cumulative_batch_count = 0;
  double inputs_per_sec = 0;
  double accuracy = 0;
  long long epoch = 0;
  double learning_rate = 0;
  double loss = 0;
  double test_accuracy = -1;
  long long skipped_records = 0;  // written only by a log made with the skipped_records column
  // A language model's test loss a token (-1: no test set), written only by a log made with the
  // test_loss column.
  double test_loss = -1;
};

class TrainLog {
 public:
  // Creates dir/experiment_id.log; never replaces an existing file (a suffix _1, _2 ... is added).
  // Throws IoError naming the folder if it cannot be written. With `skipped_column`, a twelfth
  // column, skipped_records, follows Caffe2's eleven (which stay as they are); with
  // `test_loss_column` (a language model's log), test_loss follows them.
  TrainLog(const std::string& dir, const std::string& experiment_id,
           const std::vector<std::pair<std::string, std::string>>& parameters,
           bool skipped_column = false, bool test_loss_column = false);
  ~TrainLog();
  TrainLog(const TrainLog&) = delete;
  TrainLog& operator=(const TrainLog&) = delete;

  // Appends a row and flushes it to disk.
  void write(const LogRow& row);
  const std::string& path() const { return path_; }
  // The file name without ".log": the experiment id, with the suffix if one was added.
  std::string id() const;

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool skipped_column_ = false;
  bool test_loss_column_ = false;
};

}  // namespace troupe::actors
