// The live progress line (actors/run/progress.h): drawn in place when stderr is a terminal (forced
// here with TROUPE_PROGRESS=1, as the tests' output is a pipe), the periodic log lines otherwise.
#include <gtest/gtest.h>

#include <string>

#include "actors/run/progress.h"
#include "cli_util.h"

namespace troupe {
namespace {

using testing::contains;

using testing::runCommand;
using testing::TempDir;
using testing::testData;
using testing::troupeBinary;

testing::CommandResult shortRun(const std::string& env) {
  TempDir dir("progress");
  return runCommand("cd " + dir.str() + " && " + env + " " + troupeBinary() +
                    " train --model mlp --train_data " + testData("lmdb") +
                    "/train --db_type lmdb --num_epochs 1 --epoch_size 6400 --threads 1 "
                    "--log_every 20");
}

TEST(ProgressLine, OnATerminalOneLineIsRedrawnInPlaceInsteadOfThePeriodicLines) {
  const auto r = shortRun("TROUPE_PROGRESS=1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Carriage return, the line, then erase to the end of the line.
  EXPECT_TRUE(contains(r.output, "\repoch 1/1  step ")) << r.output;
  EXPECT_TRUE(contains(r.output, "/100  ")) << r.output;  // 6400 / 64 steps
  // A one-process CPU run: the model FLOPs utilisation beside the rate.
  EXPECT_TRUE(contains(r.output, " inputs/s  MFU ")) << r.output;
  EXPECT_TRUE(contains(r.output, "%  loss ")) << r.output;
  EXPECT_TRUE(contains(r.output, "  ETA ")) << r.output;
  EXPECT_TRUE(contains(r.output, "\033[K")) << r.output;
  EXPECT_FALSE(contains(r.output, "[info] epoch 1 step 20/100")) << "no periodic lines";
  // The epoch's line starts on a clean line: the live line was erased before it.
  EXPECT_TRUE(contains(r.output, "\r\033[K[")) << r.output;
}

TEST(ProgressLine, InAPipeThePeriodicLinesStay) {
  const auto r = shortRun("");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "\r")) << r.output;
  EXPECT_TRUE(contains(r.output, "[info] epoch 1 step 20/100: loss ")) << r.output;
}

TEST(ProgressLine, TimeLeftReadsAsProgressBarsShowIt) {
  EXPECT_EQ(actors::formatDuration(9.4), "0:09");
  EXPECT_EQ(actors::formatDuration(245), "4:05");
  EXPECT_EQ(actors::formatDuration(3723), "1:02:03");
  EXPECT_EQ(actors::formatDuration(-1), "?");
}

}  // namespace
}  // namespace troupe
