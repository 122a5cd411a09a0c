#include "actors/run/train_log.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "troupe/error.h"

namespace troupe::actors {

TrainLog::TrainLog(const std::string& dir, const std::string& experiment_id,
                   const std::vector<std::pair<std::string, std::string>>& parameters,
                   bool skipped_column, bool test_loss_column)
    : skipped_column_(skipped_column), test_loss_column_(test_loss_column) {
  int fd = -1;
  for (int attempt = 0; fd < 0; ++attempt) {
    path_ = fmt::format("{}/{}{}.log", dir, experiment_id,
                        attempt ? fmt::format("_{}", attempt) : std::string());
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) {
      throw IoError(
          fmt::format("cannot write the training log in '{}': {}", dir, std::strerror(errno)));
    }
  }
  file_ = ::fdopen(fd, "w");
  if (!file_) {
    ::close(fd);
    throw IoError(fmt::format("cannot open '{}': {}", path_, std::strerror(errno)));
  }
  std::string header = "# " + experiment_id;
  for (const auto& [k, v] : parameters)
    header += fmt::format(" {}={}", k, v);
  fmt::print(file_, "{}\n", header);
  fmt::print(file_,
             "time_spent,cumulative_time_spent,input_count,cumulative_input_count,"
             "cumulative_batch_count,inputs_per_sec,accuracy,epoch,learning_rate,loss,"
             "test_accuracy{}{}\n",
             skipped_column_ ? ",skipped_records" : "", test_loss_column_ ? ",test_loss" : "");
  std::fflush(file_);
}

std::string TrainLog::id() const {
  const auto slash = path_.rfind('/');
  const auto name = path_.substr(slash == std::string::npos ? 0 : slash + 1);
  return name.substr(0, name.size() - 4);
}

TrainLog::~TrainLog() {
  if (file_) std::fclose(file_);
}

void TrainLog::write(const LogRow& r) {
  fmt::print(file_, "{:.4f},{:.4f},{},{},{},{:.2f},{:.6f},{},{:.6g},{:.6f},{:.6f}", r.time_spent,
             r.cumulative_time_spent, r.input_count, r.cumulative_input_count,
             r.cumulative_batch_count, r.inputs_per_sec, r.accuracy, r.epoch, r.learning_rate,
             r.loss, r.test_accuracy);
  if (skipped_column_) fmt::print(file_, ",{}", r.skipped_records);
  if (test_loss_column_) fmt::print(file_, ",{:.6f}", r.test_loss);
  fmt::print(file_, "\n");
  std::fflush(file_);
  ::fsync(::fileno(file_));
}

}  // namespace troupe::actors
