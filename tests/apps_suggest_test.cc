// "Did you mean ...?": the edit distance, the nearest name, and the messages for a misspelt config
// key, flag (loadTrainOptions and CLI11's path through the binary) and log level.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "actors/config/nearest_name.h"
#include "actors/config/train_config.h"
#include "apps/log_level.h"
#include "cli_util.h"
#include "config_util.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

using testing::configErrorOf;

using testing::contains;
using testing::containsAll;
using testing::exitedWith;
using testing::failedWith;

using actors::ConfigOverrides;
using actors::editDistance;
using actors::loadTrainOptions;
using actors::nearestName;
using testing::runCommand;
using testing::sourceDir;
using testing::TempDir;
using testing::troupeBinary;

bool startsWith(const std::string& text, const std::string& start) {
  return text.rfind(start, 0) == 0;
}
TEST(EditDistance, CountsInsertionsDeletionsAndReplacements) {
  EXPECT_EQ(editDistance("bach_size", "batch_size"), 1u);
  EXPECT_EQ(editDistance("batch_sizes", "batch_size"), 1u);
  EXPECT_EQ(editDistance("batch_sise", "batch_size"), 1u);
  EXPECT_EQ(editDistance("kitten", "sitting"), 3u);
  EXPECT_EQ(editDistance("", "abc"), 3u);
  EXPECT_EQ(editDistance("abc", ""), 3u);
  EXPECT_EQ(editDistance("same", "same"), 0u);
}

TEST(EditDistance, CountsASwapOfAdjacentLettersAsOneEdit) {
  EXPECT_EQ(editDistance("modle", "model"), 1u);
  EXPECT_EQ(editDistance("ab", "ba"), 1u);
  // Optimal string alignment: "ca" -> "ac" -> "abc" edits the swapped pair again, so 3, not 2.
  EXPECT_EQ(editDistance("ca", "abc"), 3u);
}

TEST(EditDistance, IgnoresCaseAndDashesAgainstUnderscores) {
  EXPECT_EQ(editDistance("Skip-Bad-Records", "skip_bad_records"), 0u);
  EXPECT_EQ(editDistance("LOG-LEVEL", "log_level"), 0u);
}

TEST(NearestName, OffersTheNearestCandidateWithinAThirdOfTheNamesLength) {
  const std::vector<std::string> names{"epoch_size", "batch_size", "num_epochs"};
  EXPECT_EQ(nearestName("bach_size", names), "batch_size");
  EXPECT_EQ(nearestName("num_epoch", names), "num_epochs");
  // 10 characters: up to 3 edits are offered, 4 are not.
  EXPECT_EQ(nearestName("bxxxh_size", {"batch_size"}), "batch_size");
  EXPECT_EQ(nearestName("xxxxh_size", {"batch_size"}), std::nullopt);
}

TEST(NearestName, OffersOneEditEvenForAShortName) {
  EXPECT_EQ(nearestName("lr", {"lx", "model"}), "lx");
  EXPECT_EQ(nearestName("lr", {"model"}), std::nullopt);
}

TEST(NearestName, OffersNothingWhenNoCandidateIsNear) {
  EXPECT_EQ(nearestName("zzzzzz", {"batch_size", "model", "seed"}), std::nullopt);
  EXPECT_EQ(nearestName("anything", {}), std::nullopt);
}

TEST(NearestName, TakesTheFirstOfEquallyNearCandidates) {
  EXPECT_EQ(nearestName("seex", {"seed", "seen"}), "seed");
  EXPECT_EQ(nearestName("seex", {"seen", "seed"}), "seen");
}

// The nearest key and where the keys are listed, not all 130 of them on one line.
TEST(ConfigSuggestion, AMisspeltKeyInAFileNamesTheFileAndTheNearestKeyAndWhereTheKeysAreListed) {
  TempDir dir("suggest_key");
  const std::string file = dir.str() + "/bad.toml";
  std::ofstream(file) << "bach_size = 3\n";
  const auto what = configErrorOf(file);
  EXPECT_EQ(what, "unknown key 'bach_size' in " + file +
                      ": did you mean 'batch_size'? (docs/config.md and troupe train --help list "
                      "the keys)");
}

TEST(ConfigSuggestion, AMisspeltLayersTableSuggestsLayers) {
  TempDir dir("suggest_layers");
  const std::string file = dir.str() + "/bad.toml";
  std::ofstream(file) << "[[layer]]\ntype = \"relu\"\n";
  EXPECT_TRUE(
      contains(configErrorOf(file), "unknown key 'layer' in " + file + ": did you mean 'layers'?"))
      << configErrorOf(file);
}

TEST(ConfigSuggestion, AKeyFarFromEveryKnownOneGetsNoSuggestion) {
  TempDir dir("suggest_none");
  const std::string file = dir.str() + "/bad.toml";
  std::ofstream(file) << "zzzzzz = 1\n";
  const auto what = configErrorOf(file);
  EXPECT_TRUE(startsWith(what, "unknown key 'zzzzzz' in " + file + " (docs/config.md")) << what;
  EXPECT_FALSE(contains(what, "did you mean")) << what;
}

TEST(ConfigSuggestion, AMisspeltSettingNamesTheNearestKey) {
  const auto what = configErrorOf("", {{"Base-Learning-Rat", "0.1"}});
  EXPECT_EQ(what,
            "unknown setting 'Base-Learning-Rat': did you mean 'base_learning_rate'? "
            "(docs/config.md lists the settings)");
  // A setting copied from a command line keeps its dashes: it is taken as the key.
  EXPECT_EQ(loadTrainOptions("", {{"--batch_size", "32"}}).batch_size, 32);
}

// Flags users bring from MXNet, PyTorch, Keras and Caffe name the key that does their job.
TEST(ConfigSuggestion, AnotherFrameworksNameForAKeyNamesThatKey) {
  for (const auto& [name, key] :
       std::vector<std::pair<std::string, std::string>>{{"lr", "base_learning_rate"},
                                                        {"learning-rate", "base_learning_rate"},
                                                        {"epochs", "num_epochs"},
                                                        {"num_epoch", "num_epochs"},
                                                        {"wd", "weight_decay"},
                                                        {"network", "model"}}) {
    EXPECT_TRUE(contains(configErrorOf("", {{name, "1"}}), ": did you mean '" + key + "'? ('"))
        << name;
  }
}

TEST(CliSuggestion, AMisspeltTrainFlagExitsOneNamingTheNearestFlag) {
  const auto r =
      runCommand(troupeBinary() + " train " + sourceDir() + "/configs/lenet.toml --bach_size 3");
  EXPECT_TRUE(exitedWith(r, 1,
                         {"[error] unknown flag --bach_size of troupe train: did you mean "
                          "--batch_size? (troupe train --help lists its flags)\n"}));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

TEST(CliSuggestion, AMisspeltFlagWithItsValueAfterAnEqualsSignIsNamedWithoutTheValue) {
  EXPECT_TRUE(exitedWith(runCommand(troupeBinary() + " train --num_epoch=3"), 1,
                         {"unknown flag --num_epoch of troupe train: did you mean --num_epochs?"}));
}

TEST(CliSuggestion, EveryCommandSuggestsAmongItsOwnFlags) {
  EXPECT_TRUE(exitedWith(runCommand(troupeBinary() + " launch -n 2 --launchr ssh -- true"), 1,
                         {"unknown flag --launchr of troupe launch: did you mean --launcher?"}));
}

TEST(CliSuggestion, AFlagFarFromEveryKnownOneIsNamedWithoutASuggestion) {
  EXPECT_TRUE(
      exitedWith(runCommand(troupeBinary() + " info --zzzzzzzz"), 1,
                 {"unknown flag --zzzzzzzz of troupe info (troupe info --help lists its flags)"}));
}

// `troupe trian` said only "A subcommand is required"; --lr, --epochs suggested nothing; a command
// given to launch without `--` got CLI11's "The following argument was not expected: -c".
TEST(CliSuggestion, AMisspeltCommandAnotherToolsFlagOrALaunchWithoutItsDashesSaysWhatWasMeant) {
  EXPECT_TRUE(exitedWith(runCommand(troupeBinary() + " trian"), 1,
                         {"unknown command 'trian': did you mean 'troupe train'? "
                          "(troupe's commands: convert, train, launch, "}));
  EXPECT_TRUE(exitedWith(runCommand(troupeBinary() + " train --lr 0.1"), 1,
                         {"unknown flag --lr of troupe train: did you mean "
                          "--base_learning_rate? (--lr is MXNet's and PyTorch's)"}));
  EXPECT_TRUE(containsAll(runCommand(troupeBinary() + " train --epochs 3").output,
                          {"did you mean --num_epochs?"}));
  EXPECT_TRUE(exitedWith(runCommand(troupeBinary() + " launch -n 2 python3 -c 'print(1)'"), 1,
                         {"'-c' is no option of troupe launch: the command every "
                          "process runs goes after --"}));
}

// Every command's help fits 100 columns, groups train's keys by purpose and gives each its type
// and default (it was 130 lines up to 351 characters wide, every value TEXT, no default).
TEST(CliHelp, EveryCommandsHelpFitsAHundredColumnsAndTrainsGroupsItsKeysWithTypesAndDefaults) {
  for (const std::string command : {"", "train", "launch", "convert", "convert images", "info",
                                    "bench", "report", "plot", "docs"}) {
    const auto r = runCommand(troupeBinary() + " " + command + " --help");
    EXPECT_EQ(r.exit_code, 0) << command << r.output;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      EXPECT_LE(line.size(), 100u) << "troupe " << command << " --help: " << line;
  }
  const auto train = runCommand(troupeBinary() + " train --help").output;
  for (const std::string part :
       {"Data:", "Model and optimizer:", "Devices and precision:", "Distributed:",
        "Output and checkpoints:", "Caffe2's trainer flags:", "--batch_size INT",
        "--base_learning_rate NUMBER", "--mirror [BOOL]", "--lr_milestones LIST", "default 64)"})
    EXPECT_TRUE(contains(train, part)) << part << "\n" << train;
  // Every key has a group (apps/config.cc): a new key must be placed.
  EXPECT_FALSE(contains(train, "Other keys:")) << train;
}

TEST(CliSuggestion, AStrayPositionalArgumentKeepsCli11sMessage) {
  EXPECT_TRUE(failedWith(runCommand(troupeBinary() + " info extra"),
                         {"The following argument was not expected: extra"}));
}

TEST(ParseLogLevel, EveryLevelIsKnownByNameInAnyCase) {
  EXPECT_EQ(parseLogLevel("trace", "--log-level"), spdlog::level::trace);
  EXPECT_EQ(parseLogLevel("WARN", "--log-level"), spdlog::level::warn);
  EXPECT_EQ(parseLogLevel("error", "--log-level"), spdlog::level::err);
  EXPECT_EQ(parseLogLevel("off", "--log-level"), spdlog::level::off);
}

TEST(ParseLogLevel, AnUnknownLevelNamesWhereItCameFromAndListsTheLevels) {
  try {
    parseLogLevel("wran", "TROUPE_LOG_LEVEL");
    FAIL() << "'wran' was accepted";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "TROUPE_LOG_LEVEL: unknown log level 'wran': did you mean 'warn'? (valid: "
                 "trace, debug, info, warn, error, critical, off)");
  }
}

}  // namespace
}  // namespace troupe::apps
