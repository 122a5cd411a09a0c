// `troupe report`: training logs read back (readTrainLog), the Markdown made of them
// (reportMarkdown), and bad input named by file and line. Logs written here by hand;
// tests/train_report_test.cc reports on the logs of real runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "apps/log_report.h"
#include "cli_util.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using testing::contains;

using testing::runCommand;
using testing::slurp;
using testing::TempDir;
using testing::troupeBinary;

constexpr const char* kHeader =
    "time_spent,cumulative_time_spent,input_count,cumulative_input_count,cumulative_batch_count,"
    "inputs_per_sec,accuracy,epoch,learning_rate,loss,test_accuracy";
constexpr const char* kParameters =
    "# lenet_cpu1_b64_L10_lr0.05_20261123_101500 model=lenet batch_size=64 schedule=local "
    "num_shards=1 num_workers=1 num_servers=0 base_learning_rate=0.05";

class ReportTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_.str() + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  // A log of two epochs with a test set.
  std::string twoEpochs(const std::string& name = "two.log") {
    return write(name, std::string(kParameters) + "\n" + kHeader +
                           "\n2.0000,2.0000,1000,1000,16,500.00,0.500000,1,0.04,1.250000,0.600000"
                           "\n3.0000,5.0000,2000,3000,47,666.67,0.750000,2,0.01,0.500000,0.550000"
                           "\n");
  }
  std::string errorOf(const std::string& path) {
    try {
      readTrainLog(path);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  }
  TempDir dir_{"report"};
};

TEST_F(ReportTest, ReadsTheExperimentIdParametersAndRows) {
  const auto log = readTrainLog(twoEpochs());
  EXPECT_EQ(log.experiment_id, "lenet_cpu1_b64_L10_lr0.05_20261123_101500");
  ASSERT_EQ(log.parameters.size(), 7u);
  EXPECT_EQ(log.parameters[1], (std::pair<std::string, std::string>("batch_size", "64")));
  ASSERT_EQ(log.rows.size(), 2u);
  EXPECT_EQ(log.rows[1].epoch, 2);
  EXPECT_EQ(log.rows[1].input_count, 2000);
  EXPECT_DOUBLE_EQ(log.rows[1].loss, 0.5);
  EXPECT_DOUBLE_EQ(log.rows[1].test_accuracy, 0.55);
  EXPECT_FALSE(log.skipped_column);
}

TEST_F(ReportTest, AParameterValueWithASpaceIsKeptWhole) {
  const auto log = readTrainLog(write(
      "space.log",
      std::string("# my run_cpu1 train_data=/my data/train db_type=lmdb\n") + kHeader + "\n"));
  EXPECT_EQ(log.experiment_id, "my run_cpu1");
  ASSERT_EQ(log.parameters.size(), 2u);
  EXPECT_EQ(log.parameters[0].second, "/my data/train");
  EXPECT_TRUE(log.rows.empty());
}

TEST_F(ReportTest, OneLogGivesItsHeadingAndEpochTableAndNoSummary) {
  const std::string path = twoEpochs();
  const auto report = reportMarkdown({readTrainLog(path)});
  EXPECT_TRUE(contains(report, "## lenet_cpu1_b64_L10_lr0.05_20261123_101500\n\n`" + path +
                                   "`: model lenet, batch_size 64, schedule local, num_shards "
                                   "1, base_learning_rate 0.05\n"))
      << report;
  EXPECT_TRUE(contains(report,
                       "| epoch | train loss | train accuracy | test accuracy | time (s) | "
                       "inputs/s | learning rate |\n"))
      << report;
  EXPECT_TRUE(contains(report, "| 1 | 1.2500 | 0.5000 | 0.6000 | 2.00 | 500 | 0.04 |\n")) << report;
  EXPECT_TRUE(contains(report, "| 2 | 0.5000 | 0.7500 | 0.5500 | 3.00 | 667 | 0.01 |\n")) << report;
  EXPECT_FALSE(contains(report, "Summary")) << report;
}

TEST_F(ReportTest, SeveralLogsEndWithASummaryOfFinalAndBestAccuracyTimeAndThroughput) {
  const auto no_test = write(
      "no_test.log", "# mlp_cpu1 model=mlp num_workers=2:4 num_servers=0\n" + std::string(kHeader) +
                         "\n4.0000,4.0000,800,800,25,200.00,0.400000,1,0.1,2.000000,"
                         "-1.000000\n");
  const auto report = reportMarkdown({readTrainLog(twoEpochs()), readTrainLog(no_test)});
  EXPECT_TRUE(contains(report, "`: model mlp, num_workers 2:4\n")) << report;
  EXPECT_TRUE(contains(report, "| 1 | 2.0000 | 0.4000 | n/a | 4.00 | 200 | 0.1 |\n")) << report;
  EXPECT_TRUE(contains(report,
                       "## Summary\n\n| run | epochs | final test accuracy | best test accuracy | "
                       "total time (s) | mean inputs/s |\n"))
      << report;
  // 3000 inputs in 2 + 3 s; the best test accuracy is the first epoch's.
  EXPECT_TRUE(contains(report,
                       "| lenet_cpu1_b64_L10_lr0.05_20261123_101500 | 2 | 0.5500 | 0.6000 (epoch "
                       "1) | 5.00 | 600 |\n"))
      << report;
  EXPECT_TRUE(contains(report, "| mlp_cpu1 | 1 | n/a | n/a | 4.00 | 200 |\n")) << report;
}

TEST_F(ReportTest, TheSkippedRecordsColumnIsShownWhenTheLogHasIt) {
  const auto log = readTrainLog(
      write("skipped.log", std::string(kParameters) + "\n" + kHeader +
                               ",skipped_records\n1,1,10,10,1,10,0.5,1,0.1,1.5,0.25,7\n"));
  EXPECT_TRUE(log.skipped_column);
  EXPECT_EQ(log.rows.at(0).skipped_records, 7);
  const auto report = reportMarkdown({log});
  EXPECT_TRUE(contains(report, "| learning rate | skipped records |\n")) << report;
  EXPECT_TRUE(contains(report, "| 1 | 1.5000 | 0.5000 | 0.2500 | 1.00 | 10 | 0.1 | 7 |\n"))
      << report;
}

// A language model's log (TrainLog's test_loss column), with skipped_records before it or not.
TEST_F(ReportTest, TheTestLossColumnOfALanguageModelIsReadAndShown) {
  const auto log = readTrainLog(
      write("gpt.log", std::string(kParameters) + "\n" + kHeader +
                           ",test_loss\n1,1,10,10,1,10,0.5,1,0.1,1.5,0.25,2.667800\n"));
  EXPECT_TRUE(log.test_loss_column);
  EXPECT_FALSE(log.skipped_column);
  EXPECT_EQ(log.rows.at(0).test_loss, 2.6678);
  const auto report = reportMarkdown({log});
  EXPECT_TRUE(contains(report, "| learning rate | test loss |\n")) << report;
  EXPECT_TRUE(contains(report, "| 1 | 1.5000 | 0.5000 | 0.2500 | 1.00 | 10 | 0.1 | 2.6678 |\n"))
      << report;
  const auto both = readTrainLog(write(
      "both.log", std::string(kParameters) + "\n" + kHeader +
                      ",skipped_records,test_loss\n1,1,10,10,1,10,0.5,1,0.1,1.5,0.25,7,3.5\n"));
  EXPECT_EQ(both.rows.at(0).skipped_records, 7);
  EXPECT_EQ(both.rows.at(0).test_loss, 3.5);
  EXPECT_THROW(readTrainLog(write("swapped.log", std::string(kParameters) + "\n" + kHeader +
                                                     ",test_loss,skipped_records\n")),
               InputError);
}

TEST_F(ReportTest, ALogWithoutRowsSaysSo) {
  const auto log = readTrainLog(write("none.log", std::string(kParameters) + "\n" + kHeader));
  EXPECT_TRUE(contains(reportMarkdown({log}), "No epoch was logged"));
  EXPECT_TRUE(contains(reportMarkdown({log, log}), " | 0 | n/a | n/a | n/a | n/a |\n"));
}

TEST_F(ReportTest, AMissingFileIsNamed) {
  const std::string path = dir_.str() + "/missing.log";
  EXPECT_EQ(errorOf(path), "training log '" + path + "' does not exist");
}

TEST_F(ReportTest, AFolderIsRefused) {
  EXPECT_EQ(errorOf(dir_.str()),
            "training log '" + dir_.str() + "' is a directory, not a regular file");
}

TEST_F(ReportTest, AnEmptyFileIsNamedAtLineOne) {
  const auto path = write("empty.log", "");
  EXPECT_EQ(errorOf(path), path + ":1: not a troupe training log: the file is empty");
}

TEST_F(ReportTest, AFileOfAnotherKindIsNamedAtLineOneWithItsBytesEscaped) {
  const auto path = write("binary.log", std::string("TROUPECK\0\x01\xff", 11) + "\n");
  EXPECT_EQ(errorOf(path), path +
                               ":1: not a troupe training log: the first line is "
                               "'TROUPECK\\x00\\x01\\xff', not '# EXPERIMENT_ID key=value ...'");
}

TEST_F(ReportTest, AnotherHeaderIsNamedAtLineTwo) {
  const auto path = write("header.log", std::string(kParameters) + "\nepoch,loss\n");
  EXPECT_TRUE(contains(errorOf(path), path + ":2: not a troupe training log: the header is "
                                             "'epoch,loss', not 'time_spent,"))
      << errorOf(path);
}

// A log whose rows (after kParameters and kHeader) are bad: the error names its line.
struct BadRows {
  const char* name;
  const char* rows;
  const char* error;  // after the log's path
};

class ReportBadRowsTest : public ReportTest, public ::testing::WithParamInterface<BadRows> {};

TEST_P(ReportBadRowsTest, AreNamedByTheirLine) {
  const auto& c = GetParam();
  const auto path = write(std::string(c.name) + ".log",
                          std::string(kParameters) + "\n" + kHeader + "\n" + c.rows);
  EXPECT_EQ(errorOf(path), path + c.error);
}

INSTANTIATE_TEST_SUITE_P(
    ReportTest, ReportBadRowsTest,
    ::testing::Values(
        BadRows{"ARowWithTooFewValuesIsNamedByItsLine",
                "1,1,10,10,1,10,0.5,1,0.1,1.5,0.25\n1,2,3\n",
                ":4: a row of 3 values, where the header has 11 columns"},
        BadRows{"ARowWithTooManyValuesIsNamedByItsLine", "1,1,10,10,1,10,0.5,1,0.1,1.5,0.25,9\n",
                ":3: a row of 12 values, where the header has 11 columns"},
        BadRows{"AValueThatIsNotANumberNamesItsColumnAndLine",
                "1,1,10,10,1,10,0.5,1,0.1,lots,0.25\n", ":3: loss is 'lots', not a number"},
        BadRows{"AFractionalEpochNamesItsColumnAndLine", "1,1,10,10,1,10,0.5,1.5,0.1,1.5,0.25\n",
                ":3: epoch is '1.5', not a whole number"}),
    [](const ::testing::TestParamInfo<BadRows>& info) { return info.param.name; });

TEST_F(ReportTest, AnOverlongLineIsRefusedWithoutReadingTheWholeFile) {
  const auto path = write("huge.log", "# x " + std::string(1 << 17, 'a') + "\n");
  EXPECT_EQ(errorOf(path), path + ":1: a line of over 65536 bytes: not a troupe training log");
}

TEST_F(ReportTest, TheCommandNamesABadLogInOneLineAndExitsOne) {
  const auto good = twoEpochs();
  const auto bad = write("bad.log", std::string(kParameters) + "\n" + kHeader + "\n1,2\n");
  const auto r = runCommand(troupeBinary() + " report " + good + " " + bad);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[error] " + bad + ":3: a row of 2 values")) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST_F(ReportTest, TheCommandWritesToAFileWithDashO) {
  const auto log = twoEpochs();
  const std::string out = dir_.str() + "/report.md";
  const auto r = runCommand(troupeBinary() + " report " + log + " -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
  EXPECT_EQ(slurp(out), reportMarkdown({readTrainLog(log)}));
}

}  // namespace
}  // namespace troupe::apps
