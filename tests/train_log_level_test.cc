// `troupe --log-level LEVEL` and `--quiet`, before or after the subcommand's name, and
// TROUPE_LOG_LEVEL: what a short training run prints at each level, through the real binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cli_util.h"

namespace troupe {
namespace {

using testing::contains;

using testing::CommandResult;
using testing::runCommand;
using testing::TempDir;
using testing::testData;
using testing::troupeBinary;

// `ENV troupe BEFORE train ... AFTER`: a 1-epoch MLP run of 640 inputs in a fresh folder.
CommandResult train(const std::string& env, const std::string& before, const std::string& after) {
  TempDir cwd("log_level");
  const std::string data = testData("lmdb");
  return runCommand("cd " + cwd.str() + " && " + env + " " + troupeBinary() + " " + before +
                    " train --model mlp --train_data " + data + "/train --test_data " + data +
                    "/test --db_type lmdb --num_epochs 1 --epoch_size 640 --threads 1 " + after);
}

TEST(LogLevel, ATrainingRunPrintsInfoLinesByDefault) {
  const auto r = train("", "", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[info] epoch 1 done")) << r.output;
}

TEST(LogLevel, QuietBeforeTheSubcommandLeavesNoInfoLines) {
  const auto r = train("", "--quiet", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "[info]")) << r.output;
}

TEST(LogLevel, QuietAfterTheSubcommandsNameLeavesNoInfoLines) {
  const auto r = train("", "", "--quiet");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "[info]")) << r.output;
}

TEST(LogLevel, LogLevelOffPrintsNothingAtAll) {
  const auto r = train("", "--log-level off", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "");
}

TEST(LogLevel, TheEnvironmentSetsTheLevelWhenNoFlagDoes) {
  const auto r = train("TROUPE_LOG_LEVEL=warn", "", "");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "[info]")) << r.output;
}

TEST(LogLevel, AFlagWinsOverTheEnvironment) {
  const auto r = train("TROUPE_LOG_LEVEL=off", "", "--log-level info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[info] epoch 1 done")) << r.output;
}

TEST(LogLevel, QuietStillShowsTheErrorThatEndsARun) {
  TempDir cwd("log_level_error");
  const auto r = runCommand("cd " + cwd.str() + " && " + troupeBinary() +
                            " --quiet train --model mlp --train_data /nonexistent");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[error]")) << r.output;
  EXPECT_TRUE(contains(r.output, "/nonexistent")) << r.output;
}

TEST(LogLevel, AnUnknownLevelIsOneLineNamingItAndTheValidOnes) {
  const auto r = runCommand(troupeBinary() + " --log-level loud train --model mlp");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "--log-level: unknown log level 'loud' (valid: trace, debug, info, warn, "
                       "error, critical, off)"))
      << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(LogLevel, AnUnknownLevelInTheEnvironmentNamesTheVariable) {
  const auto r = runCommand("TROUPE_LOG_LEVEL=loud " + troupeBinary() + " info");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "TROUPE_LOG_LEVEL: unknown log level 'loud'")) << r.output;
}

TEST(LogLevel, QuietAndALogLevelTogetherAreRefused) {
  const auto r = runCommand(troupeBinary() + " --quiet --log-level info info");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "--log-level excludes --quiet")) << r.output;
}

}  // namespace
}  // namespace troupe
