// `troupe bench allreduce` end to end: real worker processes through the launcher, troupe's ring
// allreduce between them, the table rank 0 reports.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"

namespace troupe {
namespace {

using testing::runCommand;
using testing::troupeBinary;

// The table's data rows: the lines after the "size(MB) ..." header, split on spaces.
std::vector<std::vector<std::string>> tableRows(const std::string& output) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(output);
  bool in_table = false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::vector<std::string> fields;
    for (std::string w; words >> w;)
      fields.push_back(w);
    if (fields.empty()) continue;
    if (fields[0] == "size(MB)") {
      in_table = true;
      continue;
    }
    if (in_table && fields[0].rfind('[', 0) != 0) rows.push_back(fields);
  }
  return rows;
}

void expectCorrectTable(int world, const std::string& extra = "") {
  const auto r = runCommand(troupeBinary() + " bench allreduce -n " + std::to_string(world) +
                            " --sizes 1 --iters 3 --warmup 1" + extra);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = tableRows(r.output);
  ASSERT_EQ(rows.size(), 1u) << r.output;
  const auto& row = rows[0];
  // size(MB) count time(ms) min(ms) algbw busbw check
  ASSERT_EQ(row.size(), 7u) << r.output;
  EXPECT_EQ(row[0], "1.000");
  EXPECT_EQ(row[1], "250000");  // 1e6 bytes of float32
  EXPECT_GT(std::stod(row[2]), 0.0);
  EXPECT_GT(std::stod(row[5]), 0.0);
  EXPECT_EQ(row[6], "OK") << r.output;
}

TEST(BenchAllreduce, TwoProcessesSumOneMegabyteCorrectly) {
  expectCorrectTable(2);
}

TEST(BenchAllreduce, ThreeProcessesSumOneMegabyteCorrectly) {
  expectCorrectTable(3);
}

TEST(BenchAllreduce, SmallSegmentsWithoutCopiesStillSumCorrectly) {
  // Many segments in flight and chunks sent from the buffer itself.
  expectCorrectTable(3, " --segment-mb 0.1 --copy none");
}

TEST(BenchAllreduce, ReportsEverySizeInOrder) {
  const auto r = runCommand(troupeBinary() +
                            " bench allreduce -n 2 --sizes 0.5,2 --iters 2 --warmup 0 --copy pool");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = tableRows(r.output);
  ASSERT_EQ(rows.size(), 2u) << r.output;
  EXPECT_EQ(rows[0][1], "125000");
  EXPECT_EQ(rows[1][1], "500000");
  EXPECT_EQ(rows[0][6], "OK");
  EXPECT_EQ(rows[1][6], "OK");
}

TEST(BenchAllreduce, RejectsOneProcess) {
  const auto r = runCommand(troupeBinary() + " bench allreduce -n 1 --sizes 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("at least 2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace troupe
