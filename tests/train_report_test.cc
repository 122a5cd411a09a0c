// `troupe report` on the logs of real training runs: every number of its tables checked against
// the CSV the run wrote.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"

namespace troupe {
namespace {

using namespace testing;

namespace fs = std::filesystem;

// Trains configs/mlp.toml for 2 short epochs with `flags`; the path of the log it wrote.
std::string trainMlp(const TempDir& dir, const std::string& name, const std::string& flags) {
  const std::string data = testData("lmdb");
  const auto r = runCommand(troupeBinary() + " --quiet train " + sourceDir() +
                            "/configs/mlp.toml --train_data " + data + "/train --db_type lmdb " +
                            "--num_epochs 2 --epoch_size 2000 --threads 1 --checkpoint_every 0 " +
                            "--run_name " + name + " --log_dir " + dir.str() + " " + flags);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    if (e.path().extension() == ".log" && e.path().filename().string().starts_with(name + "_")) {
      return e.path().string();
    }
  }
  ADD_FAILURE() << "no log of " << name << " in " << dir.str() << ":\n" << r.output;
  return "";
}

// A log's rows as the CSV has them, each a list of numbers by column.
std::vector<std::vector<double>> csvRows(const std::string& path) {
  std::istringstream lines(slurp(path));
  std::string line;
  std::getline(lines, line);  // # parameters
  std::getline(lines, line);  // header
  std::vector<std::vector<double>> rows;
  while (std::getline(lines, line)) {
    std::vector<double> row;
    std::stringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');)
      row.push_back(std::stod(cell));
    rows.push_back(row);
  }
  return rows;
}

enum Col { kTime, kCumulativeTime, kInputs, kAccuracy = 6, kEpoch, kLearningRate, kLoss, kTest };

// The row the report should have for a CSV row.
std::string epochRow(const std::vector<double>& r) {
  const std::string test = r[kTest] < 0 ? "n/a" : fmt::format("{:.4f}", r[kTest]);
  return fmt::format("| {} | {:.4f} | {:.4f} | {} | {:.2f} | {:.0f} | {:.6g} |\n", r[kEpoch],
                     r[kLoss], r[kAccuracy], test, r[kTime], r[5], r[kLearningRate]);
}

TEST(Report, EveryEpochOfARealRunIsReportedAsItsLogHasIt) {
  TempDir dir("report_run");
  const std::string data = testData("lmdb");
  const auto log = trainMlp(dir, "tested", "--test_data " + data + "/test");
  const auto r = runCommand(troupeBinary() + " report " + log);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = csvRows(log);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows)
    EXPECT_TRUE(contains(r.output, epochRow(row))) << epochRow(row) << "in:\n" << r.output;
  EXPECT_TRUE(contains(r.output,
                       "`: model mlp, batch_size 64, schedule local, num_shards 1, "
                       "base_learning_rate 0.05\n"))
      << r.output;
  EXPECT_GT(rows[1][kTest], 0.5) << "two short epochs learn something";
}

TEST(Report, TwoRunsAreSummarisedFromTheirLogs) {
  TempDir dir("report_runs");
  const std::string data = testData("lmdb");
  const auto tested = trainMlp(dir, "tested", "--test_data " + data + "/test");
  const auto untested = trainMlp(dir, "untested", "--batch_size 32");
  const std::string out = dir.str() + "/report.md";
  const auto r = runCommand(troupeBinary() + " report " + tested + " " + untested + " -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string report = slurp(out);
  for (const auto& row : csvRows(untested))
    EXPECT_TRUE(contains(report, epochRow(row))) << epochRow(row) << "in:\n" << report;

  const auto rows = csvRows(tested);
  const auto best = std::max_element(
      rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a[kTest] < b[kTest]; });
  const double inputs = rows[0][kInputs] + rows[1][kInputs];
  const double seconds = rows[0][kTime] + rows[1][kTime];
  const auto id = fs::path(tested).stem().string();
  const auto summary =
      fmt::format("| {} | 2 | {:.4f} | {:.4f} (epoch {}) | {:.2f} | {:.0f} |\n", id, rows[1][kTest],
                  (*best)[kTest], (*best)[kEpoch], rows[1][kCumulativeTime], inputs / seconds);
  EXPECT_TRUE(contains(report, summary)) << summary << "in:\n" << report;
  const auto untested_id = fs::path(untested).stem().string();
  EXPECT_TRUE(contains(report, "| " + untested_id + " | 2 | n/a | n/a | ")) << report;
  EXPECT_LT(report.find("## Summary"), report.find("| " + untested_id + " | 2 |")) << report;
}

}  // namespace
}  // namespace troupe
