// Corrupt records in real LMDB and LevelDB databases: without skip_bad_records the run ends naming
// the database and the key; with it the run completes, skipping and counting them.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "cli_util.h"
#include "data/db.h"
#include "data_test_util.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using testing::runCommand;
using testing::TempDir;
using testing::troupeBinary;

// 64 records of 1x28x28 under keys %08d, three of them bad: 00000005 a truncated protobuf,
// 00000020 an image of the wrong size (1x20x20), 00000041 a label beyond num_labels.
const std::vector<std::string> kBadKeys = {"00000005", "00000020", "00000041"};

void writeDatabase(const std::string& path, data::DbType type) {
  auto writer = data::createDb(path, type);
  for (int i = 0; i < 64; ++i) {
    data::testing::RawDatum d;
    d.data = data::testing::pattern(28 * 28, i);
    d.label = i % 10;
    std::string value = data::testing::datumBytes(d);
    if (i == 5) value = value.substr(0, value.size() / 2);
    if (i == 20) {
      d.height = d.width = 20;
      d.data = data::testing::pattern(20 * 20, i);
      value = data::testing::datumBytes(d);
    }
    if (i == 41) {
      d.label = 12;
      value = data::testing::datumBytes(d);
    }
    writer->put(fmt::format("{:08d}", i), value);
  }
  writer->publish();
}

// The rows of the CSV log in `dir` (its only .log), split into cells, and its column names.
struct Log {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};

std::vector<std::string> cellsOf(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream s(line);
  for (std::string c; std::getline(s, c, ',');)
    cells.push_back(c);
  return cells;
}

Log readLog(const fs::path& dir) {
  Log log;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".log") continue;
    std::ifstream in(e.path());
    std::string line;
    std::getline(in, line);  // # parameters
    std::getline(in, line);
    log.columns = cellsOf(line);
    while (std::getline(in, line))
      log.rows.push_back(cellsOf(line));
  }
  return log;
}

testing::CommandResult trainOn(const TempDir& cwd, const std::string& db, data::DbType type,
                               const std::string& prefix, const std::string& extra) {
  return runCommand("cd " + cwd.str() + " && " + troupeBinary() + " " + prefix +
                    " train --model mlp --train_data " + db + " --test_data " + db +
                    "_test --db_type " + std::string(data::toString(type)) +
                    " --batch_size 8 --num_epochs 2 --log_every 0 --threads 1" + extra);
}

class BadRecordsTest : public ::testing::TestWithParam<data::DbType> {
 protected:
  void SetUp() override {
    db_ = cwd_.str() + "/bad_" + std::string(data::toString(GetParam()));
    writeDatabase(db_, GetParam());
    // A copy to test on: a LevelDB database opens in one place at a time.
    writeDatabase(db_ + "_test", GetParam());
  }
  // A short MLP run over the whole database (8 steps of 8 an epoch), tested on its copy.
  testing::CommandResult train(const std::string& prefix, const std::string& extra) {
    return trainOn(cwd_, db_, GetParam(), prefix, extra);
  }

  TempDir cwd_{"bad_records"};
  std::string db_;
};

TEST_P(BadRecordsTest, WithoutTheFlagTheRunFailsNamingTheDatabaseAndTheKey) {
  const auto r = train("", "");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::regex named("database '" + db_ + "': record '(00000005|00000020|00000041)'");
  EXPECT_TRUE(std::regex_search(r.output, named)) << r.output;
}

TEST_P(BadRecordsTest, WithTheFlagTheRunCompletesAndTheLogCountsTheSkippedRecords) {
  const auto r = train("", " --skip-bad-records");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Each bad record is logged once by the reader that met it and once by the test pass.
  auto occurrences = [&](const std::string& text) {
    std::size_t count = 0;
    for (auto at = r.output.find(text); at != std::string::npos; at = r.output.find(text, at + 1))
      ++count;
    return count;
  };
  for (const auto& key : kBadKeys) {
    EXPECT_EQ(occurrences("[warning] database '" + db_ + "': record '" + key + "'"), 1u)
        << key << "\n"
        << r.output;
    EXPECT_EQ(occurrences("[warning] database '" + db_ + "_test': record '" + key + "'"), 1u)
        << key << "\n"
        << r.output;
  }
  const auto log = readLog(cwd_.path());
  ASSERT_EQ(log.columns.size(), 12u);
  EXPECT_EQ(log.columns[10], "test_accuracy") << "Caffe2's columns stay as they are";
  EXPECT_EQ(log.columns[11], "skipped_records");
  ASSERT_EQ(log.rows.size(), 2u);
  for (const auto& row : log.rows) {
    ASSERT_EQ(row.size(), 12u);
    EXPECT_EQ(row[2], "64") << "a skipped record's slot goes to another record";
    EXPECT_EQ(row[11], "3") << "every bad record is met once an epoch";
  }
  EXPECT_NE(r.output.find("3 bad records skipped"), std::string::npos) << r.output;
}

TEST_P(BadRecordsTest, TheConfigKeyWorksAndTheLogWithoutItKeepsCaffe2sColumns) {
  std::ofstream(cwd_.path() / "skip.toml") << "skip_bad_records = true\n";
  const auto r = train("", " --log_dir with " + (cwd_.path() / "skip.toml").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(readLog(cwd_.path() / "with").columns.size(), 12u);
  const auto plain = runCommand("cd " + cwd_.str() + " && " + troupeBinary() +
                                " train --model mlp --train_data " + testing::testData("lmdb") +
                                "/train --epoch_size 640 --log_every 0 --log_dir without");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(readLog(cwd_.path() / "without").columns.size(), 11u);
}

INSTANTIATE_TEST_SUITE_P(Databases, BadRecordsTest,
                         ::testing::Values(data::DbType::kLmdb, data::DbType::kLevelDb),
                         [](const auto& info) { return std::string(data::toString(info.param)); });

// The count crosses processes: two workers each skip the bad records of their half of a batch.
// (LMDB only: a LevelDB database opens in one process at a time.)
TEST(BadRecords, TwoWorkersCountTheRecordsBothSkipped) {
  TempDir cwd("bad_records_two");
  const std::string db = cwd.str() + "/bad";
  writeDatabase(db, data::DbType::kLmdb);
  writeDatabase(db + "_test", data::DbType::kLmdb);
  const auto r = trainOn(cwd, db, data::DbType::kLmdb, "launch -n 2 -- troupe",
                         " --schedule bsp-allreduce --skip_bad_records");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto log = readLog(cwd.path());
  ASSERT_EQ(log.rows.size(), 2u) << r.output;
  for (const auto& row : log.rows) {
    ASSERT_EQ(row.size(), 12u);
    EXPECT_EQ(row[2], "64");
    EXPECT_EQ(row[11], "3");
  }
}

}  // namespace
}  // namespace troupe
