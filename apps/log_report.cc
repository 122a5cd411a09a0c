#include "apps/log_report.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>
#include <vector>

#include "data/files.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using actors::LogRow;

// A CSV column of the log and the field it fills: a number, or a whole one.
struct Column {
  const char* name;
  double LogRow::*real = nullptr;
  long long LogRow::*whole = nullptr;
};
constexpr Column kColumns[] = {{"time_spent", &LogRow::time_spent},
                               {"cumulative_time_spent", &LogRow::cumulative_time_spent},
                               {"input_count", nullptr, &LogRow::input_count},
                               {"cumulative_input_count", nullptr, &LogRow::cumulative_input_count},
                               {"cumulative_batch_count", nullptr, &LogRow::cumulative_batch_count},
                               {"inputs_per_sec", &LogRow::inputs_per_sec},
                               {"accuracy", &LogRow::accuracy},
                               {"epoch", nullptr, &LogRow::epoch},
                               {"learning_rate", &LogRow::learning_rate},
                               {"loss", &LogRow::loss},
                               {"test_accuracy", &LogRow::test_accuracy},
                               {"skipped_records", nullptr, &LogRow::skipped_records},
                               {"test_loss", &LogRow::test_loss}};
constexpr std::size_t kCaffe2Columns = 11;  // troupe's own follow, where a run has them

// The columns of a log: Caffe2's, then troupe's skipped_records and test_loss where it has them.
std::vector<const Column*> columnsOf(bool skipped, bool test_loss) {
  std::vector<const Column*> out;
  for (std::size_t i = 0; i < kCaffe2Columns; ++i)
    out.push_back(&kColumns[i]);
  if (skipped) out.push_back(&kColumns[kCaffe2Columns]);
  if (test_loss) out.push_back(&kColumns[kCaffe2Columns + 1]);
  return out;
}

std::string header(const std::vector<const Column*>& columns) {
  std::string out;
  for (const Column* c : columns)
    out += (out.empty() ? "" : ",") + std::string(c->name);
  return out;
}

// A line is at most this long: past it the file is something else (a database, a binary).
constexpr std::size_t kMaxLineBytes = 1 << 16;

// What a line held, for an error message: its start, other bytes than printable ASCII as \xNN
// (a binary file's line would garble the console).
std::string shown(std::string_view line) {
  constexpr std::size_t kShown = 60;
  std::string out;
  for (const char c : line.substr(0, kShown)) {
    const auto byte = static_cast<unsigned char>(c);
    out += byte >= 0x20 && byte < 0x7f ? std::string(1, c) : fmt::format("\\x{:02x}", byte);
  }
  return line.size() > kShown ? out + "..." : out;
}

// Reads a log's lines, counting them for error messages.
class LineReader {
 public:
  LineReader(std::istream& in, const std::string& path) : in_(in), path_(path) {}

  // The next line without its end ("\n" or "\r\n"); nullopt at the end of the file.
  std::optional<std::string> next() {
    ++number_;
    std::string line;
    char c = 0;
    bool any = false;
    while (in_.get(c)) {
      any = true;
      if (c == '\n') break;
      if (line.size() == kMaxLineBytes) {
        throw error(
            fmt::format("a line of over {} bytes: not a troupe training log", kMaxLineBytes));
      }
      line += c;
    }
    if (!any) return std::nullopt;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
  }
  // "FILE:LINE: what", at the line read last (or missing).
  InputError error(const std::string& what) const {
    return InputError(fmt::format("{}:{}: {}", path_, number_, what));
  }

 private:
  std::istream& in_;
  const std::string& path_;
  std::size_t number_ = 0;
};

// "# ID key=value key=value ...": a word without '=' belongs to the value before it (a path with
// a space), or to the id.
void readFirstLine(const std::string& line, TrainLogFile& log) {
  std::string_view rest = std::string_view(line).substr(2);
  bool first = true;
  while (!rest.empty()) {
    const auto space = rest.find(' ');
    const std::string word(rest.substr(0, space));
    rest.remove_prefix(space == std::string_view::npos ? rest.size() : space + 1);
    const auto eq = word.find('=');
    if (first) {
      log.experiment_id = word;
    } else if (eq != std::string::npos && eq > 0) {
      log.parameters.emplace_back(word.substr(0, eq), word.substr(eq + 1));
    } else {
      (log.parameters.empty() ? log.experiment_id : log.parameters.back().second) += " " + word;
    }
    first = false;
  }
}

void readCell(std::string_view text, const Column& column, LogRow& row, const LineReader& lines) {
  const char* end = text.data() + text.size();
  if (column.whole) {
    auto [p, ec] = std::from_chars(text.data(), end, row.*column.whole);
    if (ec == std::errc() && p == end && !text.empty()) return;
    throw lines.error(fmt::format("{} is '{}', not a whole number", column.name, shown(text)));
  }
  auto [p, ec] = std::from_chars(text.data(), end, row.*column.real);
  if (ec == std::errc() && p == end && !text.empty()) return;
  throw lines.error(fmt::format("{} is '{}', not a number", column.name, shown(text)));
}

LogRow readRow(std::string_view line, const std::vector<const Column*>& header,
               const LineReader& lines) {
  LogRow row;
  const std::size_t columns = header.size();
  std::size_t i = 0;
  for (std::string_view rest = line;; ++i) {
    const auto comma = rest.find(',');
    if (i < columns) readCell(rest.substr(0, comma), *header[i], row, lines);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (i + 1 != columns) {
    throw lines.error(
        fmt::format("a row of {} values, where the header has {} columns", i + 1, columns));
  }
  return row;
}

// A test accuracy of -1: the run had no test set.
std::string accuracyText(double accuracy) {
  return accuracy < 0 ? "n/a" : fmt::format("{:.4f}", accuracy);
}

std::optional<std::string> parameter(const TrainLogFile& log, std::string_view key) {
  for (const auto& [k, v] : log.parameters) {
    if (k == key) return v;
  }
  return std::nullopt;
}

// "model lenet, batch_size 64, schedule local, num_shards 1, base_learning_rate 0.05": those the
// log has; an elastic run's num_workers (MIN:MAX) for num_shards, servers when there are any.
std::string mainParameters(const TrainLogFile& log) {
  const auto workers = parameter(log, "num_workers");
  const bool elastic = workers && workers->find(':') != std::string::npos;
  std::string out;
  for (const char* key : {"model", "batch_size", "schedule", elastic ? "num_workers" : "num_shards",
                          "num_servers", "base_learning_rate"}) {
    const auto value = parameter(log, key);
    if (!value || (key == std::string_view("num_servers") && *value == "0")) continue;
    out += fmt::format("{}{} {}", out.empty() ? "" : ", ", key, *value);
  }
  return out;
}

std::string epochTable(const TrainLogFile& log) {
  if (log.rows.empty()) return "No epoch was logged: the run ended in its first epoch.\n";
  const bool skipped = log.skipped_column, test_loss = log.test_loss_column;
  std::string out = fmt::format(
      "| epoch | train loss | train accuracy | test accuracy | time (s) | inputs/s | learning rate "
      "|{}{}\n|---:|---:|---:|---:|---:|---:|---:|{}{}\n",
      skipped ? " skipped records |" : "", test_loss ? " test loss |" : "", skipped ? "---:|" : "",
      test_loss ? "---:|" : "");
  for (const auto& r : log.rows) {
    out += fmt::format("| {} | {:.4f} | {:.4f} | {} | {:.2f} | {:.0f} | {:.6g} |", r.epoch, r.loss,
                       r.accuracy, accuracyText(r.test_accuracy), r.time_spent, r.inputs_per_sec,
                       r.learning_rate);
    if (skipped) out += fmt::format(" {} |", r.skipped_records);
    if (test_loss) out += r.test_loss < 0 ? " n/a |" : fmt::format(" {:.4f} |", r.test_loss);
    out += "\n";
  }
  return out;
}

std::string summaryRow(const TrainLogFile& log) {
  if (log.rows.empty()) {
    return fmt::format("| {} | 0 | n/a | n/a | n/a | n/a |\n", log.experiment_id);
  }
  const LogRow* best = nullptr;
  double inputs = 0;
  double seconds = 0;
  for (const auto& r : log.rows) {
    if (r.test_accuracy >= 0 && (!best || r.test_accuracy > best->test_accuracy)) best = &r;
    inputs += static_cast<double>(r.input_count);
    seconds += r.time_spent;
  }
  const std::string best_text =
      best ? fmt::format("{} (epoch {})", accuracyText(best->test_accuracy), best->epoch) : "n/a";
  return fmt::format("| {} | {} | {} | {} | {:.2f} | {:.0f} |\n", log.experiment_id,
                     log.rows.size(), accuracyText(log.rows.back().test_accuracy), best_text,
                     log.rows.back().cumulative_time_spent, inputs / std::max(seconds, 1e-9));
}

}  // namespace

std::string reportMarkdown(const std::vector<TrainLogFile>& logs) {
  std::string out = "# Training report\n";
  for (const auto& log : logs) {
    out += fmt::format("\n## {}\n\n`{}`: {}\n\n{}", log.experiment_id, log.path,
                       mainParameters(log), epochTable(log));
  }
  if (logs.size() < 2) return out;
  out +=
      "\n## Summary\n\n| run | epochs | final test accuracy | best test accuracy | total time (s) "
      "| mean inputs/s |\n|---|---:|---:|---:|---:|---:|\n";
  for (const auto& log : logs)
    out += summaryRow(log);
  return out;
}

TrainLogFile readTrainLog(const std::string& path) {
  data::checkRegularFile(path, "training log");  // a FIFO would block the open
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(fmt::format("cannot open training log '{}': {}", path, std::strerror(errno)));
  }
  TrainLogFile log;
  log.path = path;
  LineReader lines(in, path);
  const auto first = lines.next();
  if (!first) throw lines.error("not a troupe training log: the file is empty");
  if (!first->starts_with("# ") || first->size() == 2) {
    throw lines.error(fmt::format(
        "not a troupe training log: the first line is '{}', not '# EXPERIMENT_ID key=value ...'",
        shown(*first)));
  }
  readFirstLine(*first, log);
  const auto columns = lines.next();
  std::vector<const Column*> known;
  for (const bool skipped : {false, true}) {
    for (const bool test_loss : {false, true}) {
      if (columns == header(columnsOf(skipped, test_loss))) {
        log.skipped_column = skipped;
        log.test_loss_column = test_loss;
        known = columnsOf(skipped, test_loss);
      }
    }
  }
  if (known.empty()) {
    throw lines.error(fmt::format(
        "not a troupe training log: the header is '{}', not '{}' (and maybe ',skipped_records', "
        "',test_loss')",
        shown(columns.value_or("")), header(columnsOf(false, false))));
  }
  while (const auto line = lines.next())
    log.rows.push_back(readRow(*line, known, lines));
  if (in.bad()) {
    throw InputError(fmt::format("cannot read training log '{}': {}", path, std::strerror(errno)));
  }
  return log;
}

}  // namespace troupe::apps
