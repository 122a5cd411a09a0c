// Caffe2's resnet50_trainer flags, lr_scaling and MXNet's DMLC_* variables in `troupe train`:
// docs/flags.md's tables hold, row by row, and the rules behind them (aliases in files, one
// source giving a key twice, precedence over TROUPE_* and the file, Caffe2's rate per 256).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "actors/config/caffe2_flags.h"
#include "actors/config/train_config.h"
#include "cli_util.h"
#include "config_util.h"
#include "flags_doc.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using testing::configErrorOf;

namespace fs = std::filesystem;
using testing::FlagRow;
using testing::flagRows;
using testing::runCommand;
using testing::sourceDir;
using testing::troupeBinary;

// The variables loadTrainOptions reads, unset for every test and set by it where it says.
constexpr const char* kPlaceVariables[] = {"TROUPE_NUM_WORKERS",
                                           "TROUPE_RANK",
                                           "TROUPE_ROLE",
                                           "TROUPE_NUM_SERVERS",
                                           "TROUPE_RUN_ID",
                                           "TROUPE_GENERATION",
                                           "TROUPE_RENDEZVOUS",
                                           "TROUPE_INTERFACE",
                                           "DMLC_ROLE",
                                           "DMLC_NUM_WORKER",
                                           "DMLC_NUM_SERVER",
                                           "DMLC_WORKER_ID",
                                           "DMLC_SERVER_ID",
                                           "DMLC_PS_ROOT_URI",
                                           "DMLC_PS_ROOT_PORT",
                                           "DMLC_INTERFACE",
                                           "SLURM_STEP_ID",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "SLURM_JOB_ID",
                                           "OMPI_COMM_WORLD_RANK",
                                           "JOB_COMPLETION_INDEX",
                                           "MXNET_ENABLE_CUDA_GRAPHS"};

// Sets variables for the scope ("A=1 B=2"), every other one of kPlaceVariables unset.
class Environment {
 public:
  explicit Environment(const std::string& assignments = "") {
    for (const char* name : kPlaceVariables)
      ::unsetenv(name);
    std::istringstream words(assignments);
    for (std::string word; words >> word;) {
      const auto eq = word.find('=');
      ::setenv(word.substr(0, eq).c_str(), word.substr(eq + 1).c_str(), 1);
    }
  }
  ~Environment() {
    for (const char* name : kPlaceVariables)
      ::unsetenv(name);
  }
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
};

std::string parameter(const TrainOptions& o, const std::string& key) {
  for (const auto& [k, v] : o.parameters) {
    if (k == key) return v;
  }
  return "(no key " + key + ")";
}

// A config file holding `text`, removed with the object.
class ConfigFile {
 public:
  explicit ConfigFile(const std::string& text)
      : path_((fs::temp_directory_path() /
               fmt::format("troupe_flags_{}_{}.toml", ::getpid(), counter_++))
                  .string()) {
    std::ofstream(path_) << text;
  }
  ~ConfigFile() { fs::remove(path_); }
  ConfigFile(const ConfigFile&) = delete;
  ConfigFile& operator=(const ConfigFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

const std::string& flagsDoc() {
  static const std::string path = sourceDir() + "/docs/flags.md";
  return path;
}

// A row's example, loaded as flags (Caffe2's table) or as variables (the DMLC_* table); the row
// says what must come of it.
::testing::AssertionResult rowHolds(const FlagRow& row, bool variables) {
  ConfigOverrides overrides;
  if (!variables) {
    for (const auto& [name, value] : testing::flagWords(row.example))
      overrides[name] = value;
  }
  Environment env(variables ? row.example : "");
  auto where = [&] {
    return fmt::format("docs/flags.md:{} ({}, {}): ", row.line, row.flag, row.example);
  };
  try {
    const TrainOptions o = loadTrainOptions("", overrides);
    if (row.kind != "values") {
      return ::testing::AssertionFailure()
             << where() << "loaded, but the table says " << row.kind << ": " << row.text;
    }
    if (row.expected.empty()) return ::testing::AssertionFailure() << where() << "no `k = v`";
    for (const auto& [key, value] : row.expected) {
      if (parameter(o, key) != value) {
        return ::testing::AssertionFailure()
               << where() << key << " is " << parameter(o, key) << ", the table says " << value;
      }
    }
  } catch (const InputError& e) {
    if (row.kind != "refused" || e.what() != row.text) {
      return ::testing::AssertionFailure()
             << where() << "refused with\n  " << e.what() << "\nthe table says " << row.kind
             << ":\n  " << row.text;
    }
  }
  return ::testing::AssertionSuccess();
}

// ---- docs/flags.md ----

TEST(FlagsDoc, EveryRowOfTheCaffe2TableIsWhatTroupeDoes) {
  Environment env;
  const auto rows = flagRows(flagsDoc(), "## Caffe2's resnet50_trainer.py");
  ASSERT_GT(rows.size(), 40u);
  for (const auto& row : rows)
    EXPECT_TRUE(rowHolds(row, false));
}

TEST(FlagsDoc, EveryRowOfTheDmlcTableIsWhatTroupeDoes) {
  const auto rows = flagRows(flagsDoc(), "## MXNet's DMLC_* variables");
  ASSERT_GT(rows.size(), 8u);
  for (const auto& row : rows)
    EXPECT_TRUE(rowHolds(row, true));
}

// resnet50_trainer.py's argparse flags, every version of the script (2017: --model_parallel,
// --gpu_engine_workspace_limit_mb; 2018: the ResNeXt and timeout flags).
constexpr const char* kResnet50TrainerFlags[] = {"train_data",
                                                 "test_data",
                                                 "db_type",
                                                 "gpus",
                                                 "num_gpus",
                                                 "model_parallel",
                                                 "num_channels",
                                                 "image_size",
                                                 "num_labels",
                                                 "batch_size",
                                                 "epoch_size",
                                                 "num_epochs",
                                                 "base_learning_rate",
                                                 "weight_decay",
                                                 "cudnn_workspace_limit_mb",
                                                 "gpu_engine_workspace_limit_mb",
                                                 "num_shards",
                                                 "shard_id",
                                                 "run_id",
                                                 "redis_host",
                                                 "redis_port",
                                                 "file_store_path",
                                                 "save_model_name",
                                                 "load_model_path",
                                                 "use_cpu",
                                                 "use_nccl",
                                                 "use_ideep",
                                                 "dtype",
                                                 "float16_compute",
                                                 "enable_tensor_core",
                                                 "distributed_transport",
                                                 "distributed_interfaces",
                                                 "num_layers",
                                                 "resnext_num_groups",
                                                 "resnext_width_per_group",
                                                 "image_mean_per_channel",
                                                 "image_std_per_channel",
                                                 "test_epoch_size",
                                                 "first_iter_timeout",
                                                 "timeout",
                                                 "model"};

TEST(FlagsDoc, EveryFlagOfTheScriptIsAKeyWithARowAndEveryCaffe2KeyIsInTheScript) {
  std::set<std::string> documented;
  for (const auto& row : flagRows(flagsDoc(), "## Caffe2's resnet50_trainer.py"))
    documented.insert(row.flag.substr(2));
  std::set<std::string> keys;
  for (const auto& key : configKeys())
    keys.insert(key.name);
  const std::set<std::string> script(std::begin(kResnet50TrainerFlags),
                                     std::end(kResnet50TrainerFlags));
  for (const auto& flag : script) {
    EXPECT_TRUE(keys.count(flag)) << "--" << flag << " is no key of troupe train";
    EXPECT_TRUE(documented.count(flag)) << "--" << flag << " has no row in docs/flags.md";
  }
  for (const auto& key : config::caffe2Keys())
    EXPECT_TRUE(script.count(key.name)) << key.name << " is not a flag of resnet50_trainer.py";
  for (const auto& flag : documented)
    EXPECT_TRUE(script.count(flag)) << "docs/flags.md has a row for --" << flag;
}

// ---- Caffe2's flags as keys ----

TEST(Caffe2Flags, AConfigFileMayHoldThem) {
  Environment env;
  const ConfigFile file(
      "redis_host = \"redis1\"\nredis_port = 7000\nsave_model_name = \"r50\"\nuse_cpu = true\n"
      "num_gpus = 2\ndistributed_interfaces = \"ib0,eth0\"\ntimeout = 90\n"
      "num_channels = 3\nimage_std_per_channel = [2, 2, 2]\n");
  const auto o = loadTrainOptions(file.path(), {});
  EXPECT_EQ(o.rendezvous, "redis://redis1:7000");
  EXPECT_EQ(o.run_name, "r50");
  EXPECT_EQ(o.replicas, 2);
  EXPECT_EQ(o.interface, "ib0");
  EXPECT_EQ(o.step_timeout_s, 90);
  EXPECT_EQ(o.std_per_channel, (std::vector<double>{2, 2, 2}));
}

TEST(Caffe2Flags, OneAlwaysRefusedInAFileIsRefusedForWhatItIsWhateverItsType) {
  Environment env;
  const ConfigFile file("test_epoch_size = 50000\n");
  EXPECT_EQ(configErrorOf(file.path()),
            file.path() +
                ": test_epoch_size = 50000: troupe tests on the whole test_data after every "
                "epoch, and no key limits it (a smaller test database does)");
  const ConfigFile compute("float16_compute = true\n");
  EXPECT_EQ(configErrorOf(compute.path()),
            compute.path() +
                ": float16_compute = true: troupe's fp16 (--dtype float16, precision fp16) "
                "multiplies in fp16 and accumulates in float32; it has no fp16 accumulation");
}

TEST(Caffe2Flags, AKeyAndAFlagOfCaffe2sForItFromOneSourceAreRefusedNamingBoth) {
  Environment env;
  const ConfigFile file("interface = \"eth0\"\ndistributed_interfaces = \"eth1\"\n");
  EXPECT_EQ(configErrorOf(file.path()),
            fmt::format("{0}: distributed_interfaces = eth1 and {0}: interface = eth0 both set "
                        "interface: give one",
                        file.path()));
  EXPECT_EQ(configErrorOf("", {{"rendezvous", "tcp://h:1"}, {"redis_host", "r"}}),
            "--redis_host r and --rendezvous tcp://h:1 both set rendezvous: give one");
  EXPECT_EQ(configErrorOf("", {{"replicas", "2"}, {"use_cpu", ""}, {"num_gpus", "2"}}),
            "--num_gpus 2 and --replicas 2 both set replicas: give one");
}

TEST(Caffe2Flags, AFlagWinsOverTheFileWhicheverNameEachUses) {
  Environment env;
  const ConfigFile file("redis_host = \"redis1\"\nresume = \"a.ckpt\"\n");
  auto o =
      loadTrainOptions(file.path(), {{"rendezvous", "tcp://h:1"}, {"load_model_path", "b.ckpt"}});
  EXPECT_EQ(o.rendezvous, "tcp://h:1");
  EXPECT_EQ(o.resume, "b.ckpt");
  const ConfigFile plain("rendezvous = \"tcp://h:1\"\n");
  o = loadTrainOptions(plain.path(), {{"file_store_path", "/nfs/r"}});
  EXPECT_EQ(o.rendezvous, "file:///nfs/r");
  // The port of a host from the file, from a flag.
  o = loadTrainOptions(file.path(), {{"redis_port", "7000"}});
  EXPECT_EQ(o.rendezvous, "redis://redis1:7000");
}

TEST(Caffe2Flags, TroupeLaunchsRendezvousWinsOverTheFileButNotOverAFlag) {
  Environment env("TROUPE_RENDEZVOUS=tcp://launcher:5000");
  const ConfigFile file("redis_host = \"redis1\"\n");
  EXPECT_EQ(loadTrainOptions(file.path(), {}).rendezvous, "tcp://launcher:5000");
  EXPECT_EQ(loadTrainOptions("", {{"redis_host", "redis1"}}).rendezvous, "redis://redis1:6379");
  // --redis_port alone gives the rendezvous no host: refused, not left to TROUPE_RENDEZVOUS.
  EXPECT_TRUE(configErrorOf("", {{"redis_port", "7000"}})
                  .starts_with("--redis_port 7000 needs redis_host"));
}

TEST(Caffe2Flags, UseCpuFromTheFileMakesNumGpusFromAFlagCpuReplicas) {
  Environment env;
  const ConfigFile file("use_cpu = true\n");
  auto o = loadTrainOptions(file.path(), {{"num_gpus", "3"}});
  EXPECT_EQ(o.replicas, 3);
  EXPECT_TRUE(o.gpus.empty());
  o = loadTrainOptions(file.path(), {{"gpus", "0,2"}});
  EXPECT_EQ(o.replicas, 2);
  EXPECT_TRUE(o.gpus.empty());
  EXPECT_TRUE(configErrorOf("", {{"gpus", "0,x"}}).starts_with("--gpus 0,x: expected device ids"));
}

TEST(Caffe2Flags, GpusWithoutUseCpuPutAReplicaOnEachGpuNamed) {
  Environment env;
  auto o = loadTrainOptions("", {{"gpus", "1,3"}});
  EXPECT_EQ(o.replicas, 2);
  EXPECT_EQ(o.gpus, (std::vector<int>{1, 3}));
  o = loadTrainOptions("", {{"num_gpus", "3"}});
  EXPECT_EQ(o.gpus, (std::vector<int>{0, 1, 2}));
  const ConfigFile gpu("use_cpu = false\n");  // Caffe2's default: one GPU, GPU 0
  o = loadTrainOptions(gpu.path(), {});
  EXPECT_EQ(o.replicas, 1);
  EXPECT_EQ(o.gpus, (std::vector<int>{0}));
  EXPECT_EQ(loadTrainOptions(gpu.path(), {{"num_gpus", "2"}}).gpus, (std::vector<int>{0, 1}));
  EXPECT_TRUE(loadTrainOptions("", {}).gpus.empty());
  EXPECT_EQ(configErrorOf("", {{"gpus", "0,1,0"}}), "--gpus 0,1,0: GPU 0 is named twice");
}

TEST(Caffe2Flags, ARelativeFileStorePathBecomesAnAbsoluteFileUrl) {
  Environment env;
  const auto o = loadTrainOptions("", {{"file_store_path", "rdv/../store"}});
  EXPECT_EQ(o.rendezvous, "file://" + (fs::current_path() / "store").string());
}

TEST(Caffe2Flags, TheLogRecordsEachAsGiven) {
  Environment env;
  const auto o = loadTrainOptions(
      "", {{"use_cpu", "True"}, {"num_gpus", "2"}, {"redis_host", "r"}, {"dtype", "float"}});
  EXPECT_EQ(parameter(o, "use_cpu"), "true");
  EXPECT_EQ(parameter(o, "num_gpus"), "2");
  EXPECT_EQ(parameter(o, "redis_port"), "6379");
  EXPECT_EQ(parameter(o, "dtype"), "float");
  EXPECT_EQ(parameter(o, "rendezvous"), "redis://r:6379");
}

// Through the binary: the error, on one line, and exit code 1.
TEST(Caffe2Flags, RefusedFlagsExitOneWithTheirErrorFromTroupeTrain) {
  const std::map<std::string, std::string> cases = {
      {"--dtype float64", "[error] --dtype float64: expected float or float16"},
      {"--distributed_transport ibverbs",
       "[error] --distributed_transport ibverbs: troupe has no ibverbs transport"},
      {"--redis_port 7000", "[error] --redis_port 7000 needs redis_host"},
      {"--lr_scaling per512", "[error] --lr_scaling per512: expected none or per256"},
  };
  Environment env;
  for (const auto& [flags, error] : cases) {
    const auto r = runCommand(troupeBinary() + " train " + flags);
    EXPECT_EQ(r.exit_code, 1) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(error), std::string::npos) << flags << "\n" << r.output;
  }
}

// ---- lr_scaling ----

TEST(LrScaling, Per256IsTheGlobalBatchOver256AndNoneIsOne) {
  EXPECT_EQ(config::lrScale("per256", 256), 1.0);
  EXPECT_EQ(config::lrScale("per256", 8 * 64), 2.0);
  EXPECT_EQ(config::lrScale("per256", 96), 0.375);
  EXPECT_EQ(config::lrScale("none", 8 * 64), 1.0);
}

// Caffe2's ImageNet runs: 0.1 per 256 inputs, batch 64 on each of 8 processes -> 0.2.
TEST(LrScaling, Per256ScalesTheRateByTheRunsGlobalBatch) {
  Environment env("TROUPE_NUM_WORKERS=8 TROUPE_RANK=3 TROUPE_RUN_ID=r TROUPE_RENDEZVOUS=tcp://h:1");
  const auto o = loadTrainOptions(
      "", {{"lr_scaling", "per256"}, {"batch_size", "64"}, {"base_learning_rate", "0.1"}});
  // 0.1f x 2: doubling is exact.
  EXPECT_EQ(o.base_learning_rate, 0.2f);
  EXPECT_EQ(parameter(o, "base_learning_rate"), "0.1") << "the log keeps the rate as given";
  EXPECT_EQ(parameter(o, "lr_scaling"), "per256");
  // 32 x 3 = 96 inputs: 0.0375. The loader rounds 0.1f x 96 / 256 once, from a double; this
  // float expression rounds twice, so the two differ by at most 2 ulp, inside FLOAT_EQ's 4.
  const auto three = loadTrainOptions("", {{"lr_scaling", "per256"},
                                           {"batch_size", "32"},
                                           {"base_learning_rate", "0.1"},
                                           {"num_shards", "3"}});
  EXPECT_FLOAT_EQ(three.base_learning_rate, 0.1f * 96.0f / 256.0f);
}

TEST(LrScaling, NoneLeavesTheRateAsGiven) {
  Environment env;
  EXPECT_EQ(loadTrainOptions("", {{"batch_size", "1024"}, {"base_learning_rate", "0.1"}})
                .base_learning_rate,
            0.1f);
}

TEST(LrScaling, ARateScaledOutOfRangeOrAnElasticRunIsRefused) {
  Environment env;
  EXPECT_EQ(configErrorOf("", {{"lr_scaling", "per256"},
                               {"batch_size", "1048576"},
                               {"base_learning_rate", "1e38"}}),
            "lr_scaling per256: base_learning_rate 1e+38 x global batch 1048576 / 256 is "
            "4.096e+41, above 1e+38");
  EXPECT_TRUE(configErrorOf("", {{"lr_scaling", "per256"},
                                 {"num_workers", "2:4"},
                                 {"run_id", "e"},
                                 {"rendezvous", "tcp://h:1"}})
                  .starts_with("lr_scaling per256 needs a fixed number of workers"));
}

// ---- MXNet's DMLC_* variables ----

TEST(DmlcVariables, AProcessWithDmlcRoleReadsNoSlurmPlace) {
  Environment env(
      "DMLC_ROLE=worker DMLC_NUM_WORKER=1 SLURM_JOB_ID=42 SLURM_STEP_ID=0 SLURM_PROCID=1 "
      "SLURM_NTASKS=2");
  const auto o = loadTrainOptions("", {});
  EXPECT_EQ(o.num_shards, 1);
  EXPECT_EQ(o.shard_id, 0);
}

TEST(DmlcVariables, AnIpv6RootIsBracketedInTheRendezvous) {
  Environment env("DMLC_PS_ROOT_URI=fe80::1 DMLC_PS_ROOT_PORT=9091");
  EXPECT_EQ(loadTrainOptions("", {}).rendezvous, "tcp://[fe80::1]:9091");
}

TEST(DmlcVariables, AFlagWinsOverThemAndABadValueNamesTheVariable) {
  Environment env("DMLC_NUM_WORKER=4 DMLC_WORKER_ID=1 DMLC_PS_ROOT_URI=h DMLC_PS_ROOT_PORT=1");
  EXPECT_EQ(loadTrainOptions("", {{"shard_id", "2"}}).shard_id, 2);
  Environment bad("DMLC_NUM_WORKER=0");
  EXPECT_EQ(configErrorOf(""),
            "DMLC_NUM_WORKER=0: key 'num_shards' must be an integer in [1, 65536], got 0");
  Environment port("DMLC_PS_ROOT_URI=h DMLC_PS_ROOT_PORT=70000");
  EXPECT_EQ(configErrorOf(""), "DMLC_PS_ROOT_PORT=70000: expected a port in [1, 65535]");
}

}  // namespace
}  // namespace troupe::actors
