// `troupe --log-level LEVEL` and `--quiet`, before or after the subcommand's name, and
// TROUPE_LOG_LEVEL: what a short training run prints at each level, through the real binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "cli_util.h"

namespace troupe {
namespace {

using namespace testing;

// `ENV troupe BEFORE train ... AFTER`: a 1-epoch MLP run of 640 inputs in a fresh folder.
CommandResult train(const std::string& env, const std::string& before, const std::string& after) {
  TempDir cwd("log_level");
  return runCommand("cd " + cwd.str() + " && " + env + " " + troupeBinary() + " " + before +
                    " train --model mlp" + dataFlags() + " --num_epochs 1 --epoch_size 640 " +
                    "--threads 1 " + after);
}

// What a run that ends well prints.
enum class Printed { kInfoLines, kNoInfoLines, kNothing };

struct LevelCase {
  const char* name;
  const char* env;
  const char* before;  // flags before the subcommand's name
  const char* after;   // flags after train's own
  Printed printed;
};

class LogLevelRun : public ::testing::TestWithParam<LevelCase> {};

TEST_P(LogLevelRun, PrintsWhatTheLevelLets) {
  const auto& c = GetParam();
  const auto r = train(c.env, c.before, c.after);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  switch (c.printed) {
    case Printed::kInfoLines:
      EXPECT_TRUE(contains(r.output, "[info] epoch 1 done")) << r.output;
      break;
    case Printed::kNoInfoLines:
      EXPECT_FALSE(contains(r.output, "[info]")) << r.output;
      break;
    case Printed::kNothing:
      EXPECT_EQ(r.output, "");
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(
    LogLevel, LogLevelRun,
    ::testing::Values(
        LevelCase{"ATrainingRunPrintsInfoLinesByDefault", "", "", "", Printed::kInfoLines},
        LevelCase{"QuietBeforeTheSubcommandLeavesNoInfoLines", "", "--quiet", "",
                  Printed::kNoInfoLines},
        LevelCase{"QuietAfterTheSubcommandsNameLeavesNoInfoLines", "", "", "--quiet",
                  Printed::kNoInfoLines},
        LevelCase{"LogLevelOffPrintsNothingAtAll", "", "--log-level off", "", Printed::kNothing},
        LevelCase{"TheEnvironmentSetsTheLevelWhenNoFlagDoes", "TROUPE_LOG_LEVEL=warn", "", "",
                  Printed::kNoInfoLines},
        LevelCase{"AFlagWinsOverTheEnvironment", "TROUPE_LOG_LEVEL=off", "", "--log-level info",
                  Printed::kInfoLines}),
    [](const ::testing::TestParamInfo<LevelCase>& info) { return info.param.name; });

TEST(LogLevel, QuietStillShowsTheErrorThatEndsARun) {
  TempDir cwd("log_level_error");
  const auto r = runCommand("cd " + cwd.str() + " && " + troupeBinary() +
                            " --quiet train --model mlp --train_data /nonexistent");
  EXPECT_TRUE(exitedWith(r, 1, {"[error]", "/nonexistent"}));
}

TEST(LogLevel, AnUnknownLevelIsOneLineNamingItAndTheValidOnes) {
  const auto r = runCommand(troupeBinary() + " --log-level loud train --model mlp");
  EXPECT_TRUE(exitedWith(r, 1,
                         {"--log-level: unknown log level 'loud' (valid: trace, debug, info, "
                          "warn, error, critical, off)"}));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(LogLevel, AnUnknownLevelInTheEnvironmentNamesTheVariable) {
  EXPECT_TRUE(exitedWith(runCommand("TROUPE_LOG_LEVEL=loud " + troupeBinary() + " info"), 1,
                         {"TROUPE_LOG_LEVEL: unknown log level 'loud'"}));
}

TEST(LogLevel, QuietAndALogLevelTogetherAreRefused) {
  EXPECT_TRUE(failedWith(runCommand(troupeBinary() + " --quiet --log-level info info"),
                         {"--log-level excludes --quiet"}));
}

}  // namespace
}  // namespace troupe
