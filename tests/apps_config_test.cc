#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "apps/config.h"
#include "troupe/error.h"

namespace troupe::apps {
namespace {

namespace fs = std::filesystem;

class ConfigTest : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const auto path = fs::temp_directory_path() /
                      ("troupe_config_" + std::to_string(::getpid()) + "_" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".toml");
    std::ofstream(path) << text;
    files_.push_back(path);
    return path.string();
  }
  void TearDown() override {
    for (const auto& f : files_)
      fs::remove(f);
  }
  std::vector<fs::path> files_;
};

std::string errorOf(const std::string& file, const Overrides& overrides = {}) {
  try {
    loadTrainOptions(file, overrides);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST_F(ConfigTest, FileValuesOverrideDefaultsAndFlagsOverrideTheFile) {
  const auto file = write("model = \"mlp\"\nbatch_size = 128\nbase_learning_rate = 0.1\n");
  const auto o = loadTrainOptions(file, {{"batch_size", "32"}, {"db_type", "leveldb"}});
  EXPECT_EQ(o.model.name, "mlp");
  EXPECT_EQ(o.batch_size, 32);
  EXPECT_FLOAT_EQ(o.base_learning_rate, 0.1f);
  EXPECT_EQ(o.db_type, data::DbType::kLevelDb);
}

TEST_F(ConfigTest, AnUnknownKeyNamesTheFileAndTheKey) {
  const auto file = write("batch_sise = 64\n");
  const auto what = errorOf(file);
  EXPECT_NE(what.find(file), std::string::npos) << what;
  EXPECT_NE(what.find("unknown key 'batch_sise'"), std::string::npos) << what;
  EXPECT_NE(what.find("batch_size"), std::string::npos) << "known keys are listed: " << what;
}

TEST_F(ConfigTest, AValueOfTheWrongTypeNamesTheKeyAndTheTypes) {
  const auto file = write("batch_size = \"64\"\n");
  const auto what = errorOf(file);
  EXPECT_NE(what.find("key 'batch_size' must be a integer"), std::string::npos) << what;
  EXPECT_NE(what.find("string"), std::string::npos) << what;
}

TEST_F(ConfigTest, AFloatKeyAcceptsAnInteger) {
  const auto o = loadTrainOptions(write("base_learning_rate = 1\n"), {});
  EXPECT_FLOAT_EQ(o.base_learning_rate, 1.0f);
}

TEST_F(ConfigTest, ABadFlagValueNamesTheFlag) {
  EXPECT_NE(
      errorOf("", {{"num_epochs", "ten"}}).find("--num_epochs: expected a integer, got 'ten'"),
      std::string::npos);
}

// The run id names the run's socket folder and checkpoints: nothing that leaves a folder.
TEST_F(ConfigTest, ARunIdWithASlashIsRefused) {
  EXPECT_NE(errorOf("", {{"run_id", "../etc"}})
                .find("run_id '../etc' may hold letters, digits, '.', '_' and '-' only"),
            std::string::npos);
  EXPECT_EQ(loadTrainOptions("", {{"run_id", "run-1.b_2"}}).run_id, "run-1.b_2");
}

TEST_F(ConfigTest, AnUnknownDbTypeIsRefused) {
  EXPECT_NE(errorOf("", {{"db_type", "rocksdb"}}).find("rocksdb"), std::string::npos);
}

TEST_F(ConfigTest, LayersDefineACustomModel) {
  const auto file =
      write("[[layers]]\ntype = \"fc\"\nnum_output = 10\n[[layers]]\ntype = \"relu\"\n");
  const auto o = loadTrainOptions(file, {});
  EXPECT_TRUE(o.model.name.empty());
  ASSERT_EQ(o.model.layers.size(), 2u);
  EXPECT_EQ(o.model.layers[0].type, "fc");
  EXPECT_EQ(o.model.layers[0].args.at("num_output"), "10");
}

TEST_F(ConfigTest, ALayerWithoutTypeIsRefused) {
  const auto what = errorOf(write("[[layers]]\nnum_output = 10\n"));
  EXPECT_NE(what.find("layers[0] has no 'type'"), std::string::npos) << what;
}

TEST_F(ConfigTest, AMissingFileIsNamed) {
  const auto what = errorOf("/nonexistent/troupe.toml");
  EXPECT_NE(what.find("/nonexistent/troupe.toml"), std::string::npos) << what;
}

TEST_F(ConfigTest, ASyntaxErrorGivesFileLineAndColumn) {
  const auto file = write("batch_size = 64\nnum_epochs = = 3\n");
  const auto what = errorOf(file);
  EXPECT_NE(what.find(file + ":2:"), std::string::npos) << what;
}

// toml++ 3.3.0 reaches __builtin_unreachable() on these (marzer/tomlplusplus#190); the loader
// refuses them first.
TEST_F(ConfigTest, ANonAsciiCharacterOutsideAStringOrCommentGivesFileLineAndColumn) {
  const auto file = write("num_epochs = 2\nbatch_size = 64\xc3\xa9\n");
  const auto what = errorOf(file);
  EXPECT_NE(what.find(file + ":2:16: a non-ASCII character outside a string or comment"),
            std::string::npos)
      << what;
  EXPECT_NE(errorOf(write("caf\xc3\xa9 = 1\n")).find("non-ASCII"), std::string::npos);
  EXPECT_NE(errorOf(write("lr_milestones = [1, 2\xc2\xa7]\n")).find("non-ASCII"),
            std::string::npos);
  // A quote inside a bare word opens no string (toml++ reads it as part of the word).
  EXPECT_NE(errorOf(write("model = mlp'x\xcf\x8f\n")).find("non-ASCII"), std::string::npos);
  EXPECT_NE(errorOf(write("a = 0['''\xef\xb9\xbf\n")).find("non-ASCII"), std::string::npos);
}

TEST_F(ConfigTest, ANonAsciiCharacterAfterALineEndingBackslashIsRefused) {
  const auto what = errorOf(write("run_name = \"\"\"\\\n  \xc2\xa7\"\"\"\n"));
  EXPECT_NE(what.find(":2:3: a non-ASCII character after a backslash in a multi-line string"),
            std::string::npos)
      << what;
}

TEST_F(ConfigTest, NonAsciiCharactersInStringsAndCommentsAreKept) {
  const auto o =
      loadTrainOptions(write("\xef\xbb\xbf# caf\xc3\xa9\nrun_name = \"caf\xc3\xa9\"  # \xc2\xa7\n"
                             "log_dir = '\xc3\xa9'\ntrace = \"\"\"a\\\n  b\xc3\xa9\"\"\"\n"
                             "checkpoint_dir=\"\"\"\xc3\xa9\"\"\"\"\n"
                             "[[layers]]\ntype = 'caf\xc3\xa9'\n\"\xc3\xa9\" = \"\xc3\xa9\"\n"),
                       {});
  EXPECT_EQ(o.run_name, "caf\xc3\xa9");
  EXPECT_EQ(o.log_dir, "\xc3\xa9");
  EXPECT_EQ(o.trace, "ab\xc3\xa9");
  EXPECT_EQ(o.checkpoint_dir, "\xc3\xa9\"");
  ASSERT_EQ(o.model.layers.size(), 1u);
  EXPECT_EQ(o.model.layers[0].type, "caf\xc3\xa9");
  EXPECT_EQ(o.model.layers[0].args.at("\xc3\xa9"), "\xc3\xa9");
  // In arrays and inline tables too: this is refused for its types only.
  const auto what = errorOf(
      write("lr_milestones = [\"\xc3\xa9\", # \xc3\xa9\n {a.\"\xc3\xa9\" = '\xc3\xa9'}]\n"));
  EXPECT_NE(what.find("must be a list of numbers"), std::string::npos) << what;
}

TEST_F(ConfigTest, ListsParseFromFileAndFlag) {
  const auto o = loadTrainOptions(write("lr_milestones = [3, 6.5]\n"), {{"work_load_list", "1,3"}});
  EXPECT_EQ(o.lr_milestones, (std::vector<double>{3, 6.5}));
  EXPECT_EQ(o.work_load_list, (std::vector<double>{1, 3}));
}

TEST_F(ConfigTest, ParametersRecordEveryKeyWithItsFinalValue) {
  const auto o = loadTrainOptions("", {{"batch_size", "48"}});
  bool found = false;
  for (const auto& [k, v] : o.parameters) {
    if (k == "batch_size") {
      EXPECT_EQ(v, "48");
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(o.parameters.size(), configKeys().size());
}

TEST_F(ConfigTest, TheExampleConfigsLoad) {
  for (const char* name : {"lenet", "mlp", "resnet20", "lenet_layers"}) {
    const std::string path = std::string(TROUPE_SOURCE_DIR) + "/configs/" + name + ".toml";
    EXPECT_NO_THROW(loadTrainOptions(path, {})) << path;
  }
}

}  // namespace
}  // namespace troupe::apps
