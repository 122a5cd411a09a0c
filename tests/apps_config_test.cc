#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "actors/config/train_config.h"
#include "config_util.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using testing::configErrorOf;

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

// The InputError `load` throws, run in a child process that may use 512 MiB more address space
// than this one and 10 s: a loader that reads /dev/zero or waits on a FIFO ends as a failure, not
// as a test that fills the memory or hangs. "" if it loaded; "child: ..." if it ended otherwise.
std::string boundedErrorOf(const std::function<void()>& load) {
  int out[2];
  if (::pipe(out) != 0) return "child: no pipe";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t limit = static_cast<rlim_t>(pages) * ::sysconf(_SC_PAGESIZE) + (512 << 20);
    const rlimit as{limit, limit};
    ::setrlimit(RLIMIT_AS, &as);
    ::alarm(10);
    std::string what;
    int code = 0;
    try {
      load();
    } catch (const InputError& e) {
      what = e.what();
    } catch (const std::exception& e) {
      what = std::string("child: not an InputError: ") + e.what();
      code = 2;
    }
    (void)!::write(out[1], what.data(), what.size());
    ::_exit(code);
  }
  ::close(out[1]);
  std::string what;
  char buffer[4096];
  for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) > 0;)
    what.append(buffer, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return "child: killed by signal " + std::to_string(WTERMSIG(status));
  return what;
}

// Sets an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
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
  const auto what = configErrorOf(file);
  EXPECT_NE(what.find(file), std::string::npos) << what;
  EXPECT_NE(what.find("unknown key 'batch_sise'"), std::string::npos) << what;
  EXPECT_NE(what.find("batch_size"), std::string::npos) << "known keys are listed: " << what;
}

TEST_F(ConfigTest, AValueOfTheWrongTypeNamesTheKeyAndTheTypes) {
  const auto file = write("batch_size = \"64\"\n");
  const auto what = configErrorOf(file);
  EXPECT_NE(what.find("key 'batch_size' must be a integer"), std::string::npos) << what;
  EXPECT_NE(what.find("string"), std::string::npos) << what;
}

TEST_F(ConfigTest, AFloatKeyAcceptsAnInteger) {
  const auto o = loadTrainOptions(write("base_learning_rate = 1\n"), {});
  EXPECT_FLOAT_EQ(o.base_learning_rate, 1.0f);
}

TEST_F(ConfigTest, ABadFlagValueNamesTheFlag) {
  EXPECT_NE(configErrorOf("", {{"num_epochs", "ten"}})
                .find("--num_epochs: expected a integer, got 'ten'"),
            std::string::npos);
}

// The run id names the run's socket folder and checkpoints: nothing that leaves a folder.
TEST_F(ConfigTest, ARunIdWithASlashIsRefused) {
  EXPECT_NE(configErrorOf("", {{"run_id", "../etc"}})
                .find("run_id '../etc' may hold letters, digits, '.', '_' and '-' only"),
            std::string::npos);
  EXPECT_EQ(loadTrainOptions("", {{"run_id", "run-1.b_2"}}).run_id, "run-1.b_2");
}

TEST_F(ConfigTest, AnUnknownDbTypeIsRefused) {
  EXPECT_NE(configErrorOf("", {{"db_type", "rocksdb"}}).find("rocksdb"), std::string::npos);
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
  const auto what = configErrorOf(write("[[layers]]\nnum_output = 10\n"));
  EXPECT_NE(what.find("layers[0] has no 'type'"), std::string::npos) << what;
}

TEST_F(ConfigTest, AMissingFileIsNamed) {
  const auto what = configErrorOf("/nonexistent/troupe.toml");
  EXPECT_NE(what.find("/nonexistent/troupe.toml"), std::string::npos) << what;
}

TEST_F(ConfigTest, ASyntaxErrorGivesFileLineAndColumn) {
  const auto file = write("batch_size = 64\nnum_epochs = = 3\n");
  const auto what = configErrorOf(file);
  EXPECT_NE(what.find(file + ":2:"), std::string::npos) << what;
}

// toml++ 3.3.0 reaches __builtin_unreachable() on these (marzer/tomlplusplus#190); the loader
// refuses them first.
TEST_F(ConfigTest, ANonAsciiCharacterOutsideAStringOrCommentGivesFileLineAndColumn) {
  const auto file = write("num_epochs = 2\nbatch_size = 64\xc3\xa9\n");
  const auto what = configErrorOf(file);
  EXPECT_NE(what.find(file + ":2:16: a non-ASCII character outside a string or comment"),
            std::string::npos)
      << what;
  EXPECT_NE(configErrorOf(write("caf\xc3\xa9 = 1\n")).find("non-ASCII"), std::string::npos);
  EXPECT_NE(configErrorOf(write("lr_milestones = [1, 2\xc2\xa7]\n")).find("non-ASCII"),
            std::string::npos);
  // A quote inside a bare word opens no string (toml++ reads it as part of the word).
  EXPECT_NE(configErrorOf(write("model = mlp'x\xcf\x8f\n")).find("non-ASCII"), std::string::npos);
  EXPECT_NE(configErrorOf(write("a = 0['''\xef\xb9\xbf\n")).find("non-ASCII"), std::string::npos);
}

TEST_F(ConfigTest, ANonAsciiCharacterAfterALineEndingBackslashIsRefused) {
  const auto what = configErrorOf(write("run_name = \"\"\"\\\n  \xc2\xa7\"\"\"\n"));
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
  const auto what = configErrorOf(
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
  for (const char* name :
       {"lenet", "mlp", "resnet20", "lenet_layers", "resnet20_layers", "resnet50_imagenet"}) {
    const std::string path = std::string(TROUPE_SOURCE_DIR) + "/configs/" + name + ".toml";
    EXPECT_NO_THROW(loadTrainOptions(path, {})) << path;
  }
}

// ---- values that must be refused (issue 10) ----

TEST_F(ConfigTest, ADirectoryAsTheConfigFileIsRefusedNamingWhatItIs) {
  const auto dir = fs::temp_directory_path() / ("troupe_config_dir_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  files_.push_back(dir);
  const auto what = configErrorOf(dir.string());
  EXPECT_TRUE(
      contains(what, "config file '" + dir.string() + "' is a directory, not a regular file"))
      << what;
}

TEST_F(ConfigTest, DevZeroAsTheConfigFileIsRefusedAtOnceWithoutReadingIt) {
  const auto what = boundedErrorOf([] { loadTrainOptions("/dev/zero", {}); });
  EXPECT_TRUE(contains(what, "config file '/dev/zero' is a character device, not a regular file"))
      << what;
}

TEST_F(ConfigTest, AFifoAsTheConfigFileIsRefusedWithoutWaitingForAWriter) {
  const auto fifo =
      fs::temp_directory_path() / ("troupe_config_fifo_" + std::to_string(::getpid()));
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  files_.push_back(fifo);
  const auto what = boundedErrorOf([&] { loadTrainOptions(fifo.string(), {}); });
  EXPECT_TRUE(contains(what, "' is a FIFO, not a regular file")) << what;
}

TEST_F(ConfigTest, AConfigFileOverOneMebibyteIsRefusedNamingTheCap) {
  const std::string line = "# " + std::string(98, 'x') + "\n";
  std::string text;
  while (text.size() < (1 << 20))
    text += line;
  text.resize(1 << 20);
  text.back() = '\n';
  EXPECT_NO_THROW(loadTrainOptions(write(text), {})) << "exactly 1 MiB loads";
  const auto big = write(text + "\n");
  const auto what = configErrorOf(big);
  EXPECT_TRUE(contains(what, "config file '" + big + "' is 1048577 bytes, over the 1 MiB")) << what;
}

TEST_F(ConfigTest, ANegativeEpochSizeIsRefusedNamingTheRange) {
  EXPECT_EQ(configErrorOf("", {{"epoch_size", "-5"}}),
            "--epoch_size must be an integer in [0, 1099511627776], got -5");
  const auto file = write("epoch_size = -5\n");
  EXPECT_EQ(configErrorOf(file),
            file + ": key 'epoch_size' must be an integer in [0, 1099511627776], got -5");
  EXPECT_EQ(loadTrainOptions("", {{"epoch_size", "0"}}).epoch_size, 0) << "0: the whole set";
}

TEST_F(ConfigTest, ABatchSizeOfABillionIsRefusedNamingTheRange) {
  EXPECT_EQ(configErrorOf("", {{"batch_size", "1000000000"}}),
            "--batch_size must be an integer in [1, 1048576], got 1000000000");
  EXPECT_TRUE(contains(configErrorOf("", {{"batch_size", "0"}}), "got 0"));
  EXPECT_EQ(loadTrainOptions("", {{"batch_size", "1048576"}}).batch_size, 1 << 20);
}

TEST_F(ConfigTest, AHundredThousandThreadsAreRefusedNamingTheRange) {
  EXPECT_EQ(configErrorOf("", {{"threads", "100000"}}),
            "--threads must be an integer in [0, 1024], got 100000");
  EXPECT_EQ(loadTrainOptions("", {{"threads", "1024"}}).threads, 1024);
  EXPECT_EQ(loadTrainOptions("", {{"threads", "0"}}).threads, 0) << "0: the host's";
}

TEST_F(ConfigTest, AnInfiniteWeightDecayIsRefusedFromAFlagAndAFile) {
  EXPECT_EQ(configErrorOf("", {{"weight_decay", "inf"}}),
            "--weight_decay must be a finite number in [0, 1], got inf");
  const auto file = write("weight_decay = -inf\n");
  EXPECT_EQ(configErrorOf(file),
            file + ": key 'weight_decay' must be a finite number in [0, 1], got -inf");
}

TEST_F(ConfigTest, ANanScaleIsRefusedFromAFlagAndAFile) {
  EXPECT_EQ(configErrorOf("", {{"scale", "nan"}}),
            "--scale must be a finite number in (0, 1000000], got nan");
  EXPECT_TRUE(
      contains(configErrorOf(write("scale = nan\n")), "key 'scale' must be a finite number"));
  EXPECT_TRUE(contains(configErrorOf("", {{"mean", "nan"}}), "--mean must be a finite number"));
}

TEST_F(ConfigTest, EveryNonFiniteNumberIsRefusedForEveryNumericKey) {
  for (const auto& key : configKeys()) {
    if (key.range.empty()) continue;
    for (const char* text : {"inf", "-inf", "nan"}) {
      const auto what = configErrorOf("", {{key.name, text}});
      EXPECT_FALSE(what.empty()) << key.name << " = " << text << " was accepted";
    }
  }
}

TEST_F(ConfigTest, TimeoutsThatWouldOverflowADurationAreRefused) {
  for (const char* key : {"step_timeout", "rendezvous_timeout", "peer_timeout", "stall_warning"}) {
    EXPECT_EQ(configErrorOf("", {{key, "1e300"}}),
              fmt::format("--{} must be a finite number in (0, 2592000], got 1e+300", key));
    EXPECT_TRUE(contains(configErrorOf("", {{key, "0"}}), "got 0")) << key;
    EXPECT_TRUE(contains(configErrorOf("", {{key, "2592001"}}), "(0, 2592000]")) << key;
    EXPECT_EQ(configErrorOf("", {{key, "2592000"}}), "") << "30 days is the longest " << key;
  }
}

TEST_F(ConfigTest, AMomentumOfOneOrThatRoundsToOneAsAFloatIsRefused) {
  EXPECT_EQ(configErrorOf("", {{"momentum", "1"}}),
            "--momentum must be a finite number in [0, 1), got 1");
  EXPECT_EQ(configErrorOf("", {{"momentum", "0.99999999"}}),
            "--momentum must be a finite number in [0, 1), got 0.99999999 (1 as a 32-bit float)");
  EXPECT_FLOAT_EQ(loadTrainOptions("", {{"momentum", "0.999"}}).optimizer.momentum, 0.999f);
}

// MXNet's optimizer_params, as gluon's Trainer takes them (a dict) or as pairs: each sets its key,
// with that key's range; a key given on its own as well from the same source is refused.
TEST_F(ConfigTest, OptimizerParamsSetTheKeysTheyNameAsMxnetNamesThem) {
  const auto o = loadTrainOptions(
      "", {{"optimizer", "adam"},
           {"optimizer_params", "{'learning_rate': 0.002, 'wd': 1e-4, 'beta1': 0.8}"}});
  EXPECT_FLOAT_EQ(o.base_learning_rate, 0.002f);
  EXPECT_FLOAT_EQ(o.optimizer.weight_decay, 1e-4f);
  EXPECT_FLOAT_EQ(o.optimizer.beta1, 0.8f);
  EXPECT_FLOAT_EQ(loadTrainOptions("", {{"optimizer_params", "gamma1=0.95,mom=0.5"}}).optimizer.rho,
                  0.95f);
  EXPECT_EQ(configErrorOf("", {{"optimizer_params", "{'beta2': 1.5}"}}),
            "--optimizer_params (beta2) must be a finite number in [0, 1), got 1.5");
  EXPECT_EQ(configErrorOf("", {{"optimizer_params", "wd=0.1"}, {"weight_decay", "0.2"}}),
            "--optimizer_params wd=0.1 (wd=0.1) and --weight_decay 0.2 both set weight_decay: "
            "give one");
  EXPECT_TRUE(contains(configErrorOf("", {{"optimizer_params", "{'clip_gradient': 5}"}}),
                       "troupe's clip_grad_norm clips the gradients' global norm"));
  EXPECT_TRUE(contains(configErrorOf("", {{"optimizer_params", "{'amsgrad': True}"}}),
                       "no optimizer parameter 'amsgrad' (known: learning_rate, lr, wd"));
}

TEST_F(ConfigTest, AnEnvironmentValueOutOfRangeNamesTheVariableAndTheKey) {
  {
    ScopedEnv rank("TROUPE_RANK", "70000");
    EXPECT_EQ(configErrorOf(""),
              "TROUPE_RANK=70000: key 'shard_id' must be an integer in [0, 65535], got 70000");
  }
  {
    ScopedEnv workers("TROUPE_NUM_WORKERS", "0");
    EXPECT_TRUE(contains(configErrorOf(""),
                         "TROUPE_NUM_WORKERS=0: key 'num_shards' must be an integer "
                         "in [1, 65536], got 0"));
  }
  ScopedEnv generation("TROUPE_GENERATION", "-1");
  EXPECT_TRUE(contains(configErrorOf(""), "TROUPE_GENERATION=-1: key 'generation'"));
}

// TOML tells integers from floats: an integer key refuses 1.5 and 1e3 as the wrong type.
TEST_F(ConfigTest, AnIntegerKeyGivenAFloatInAFileIsRefused) {
  for (const char* value : {"1.5", "1e3", "64.0", "inf"}) {
    const auto what = configErrorOf(write(std::string("batch_size = ") + value + "\n"));
    EXPECT_TRUE(contains(what, "key 'batch_size' must be a integer, got floating-point"))
        << value << ": " << what;
  }
  EXPECT_TRUE(
      contains(configErrorOf("", {{"batch_size", "1e3"}}), "expected a integer, got '1e3'"));
}

TEST_F(ConfigTest, EveryListElementMustBeFiniteAndInRange) {
  const auto file = write("lr_milestones = [1, inf]\n");
  EXPECT_EQ(configErrorOf(file),
            file +
                ": key 'lr_milestones' must be a list of finite numbers, each in "
                "[0, 1000000], got 1,inf (element 1 is inf)");
  EXPECT_TRUE(contains(configErrorOf("", {{"work_load_list", "1,0"}}), "(element 1 is 0)"));
  EXPECT_TRUE(contains(configErrorOf("", {{"work_load_list", "1,nan"}}), "(element 1 is nan)"));
  EXPECT_TRUE(contains(configErrorOf("", {{"lr_milestones", "-1"}}), "(element 0 is -1)"));
  std::string long_list = "1";
  for (int i = 0; i < 20; ++i)
    long_list += ",1";
  EXPECT_EQ(configErrorOf("", {{"work_load_list", long_list + ",-2"}}),
            "--work_load_list must be a list of finite numbers, each in (0, 1000000], got "
            "1,1,1,1,1,1,1,1,... (element 21 is -2)");
}

TEST_F(ConfigTest, TheSeedTakesAnyUnsignedSixtyFourBitValue) {
  EXPECT_EQ(loadTrainOptions("", {{"seed", "18446744073709551615"}}).seed,
            std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(loadTrainOptions(write("seed = 9223372036854775807\n"), {}).seed,
            9223372036854775807ull);
  EXPECT_EQ(configErrorOf("", {{"seed", "-1"}}),
            "--seed must be an integer in [0, 18446744073709551615], got '-1'");
  EXPECT_TRUE(contains(configErrorOf(write("seed = -1\n")),
                       "key 'seed' must be an integer in [0, 18446744073709551615], got -1"));
}

TEST_F(ConfigTest, EveryNumericKeyStatesItsRangeInItsHelp) {
  int numeric = 0;
  for (const auto& key : configKeys()) {
    if (key.kind != "integer" && key.kind != "number" && key.kind != "list of numbers") continue;
    ++numeric;
    EXPECT_FALSE(key.range.empty()) << key.name;
    EXPECT_TRUE(contains(key.help, key.range)) << key.name << ": " << key.help;
    EXPECT_TRUE(std::isfinite(key.min) && std::isfinite(key.max)) << key.name;
  }
  EXPECT_GT(numeric, 25);
}

TEST_F(ConfigTest, TheSecretFileMustBeASmallRegularFile) {
  const auto what = boundedErrorOf([] { loadTrainOptions("", {{"secret_file", "/dev/zero"}}); });
  EXPECT_TRUE(contains(what, "secret file '/dev/zero' is a character device")) << what;
}

}  // namespace
}  // namespace troupe::actors
