// The plan every process of a run must share (actors/run/run_plan.h: agreeOnPlan), on a real file
// store: what is compared, how a difference is named, and a plan in the store that is not one;
// and the other values a process reads from its run's store, which anyone who may write the store
// could have poisoned.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <set>
#include <string>

#include "actors/config/config_keys.h"
#include "actors/config/train_config.h"
#include "actors/core/cluster.h"
#include "actors/kvstore/kvstore_dist.h"
#include "actors/roles/roles.h"
#include "actors/run/run_plan.h"
#include "actors/schedules/schedule.h"
#include "cli_util.h"
#include "rendezvous/file_store.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TrainOptions optionsOf(const ConfigOverrides& flags) {
  return loadTrainOptions("", flags);
}

// The error loading `flags` gives; "" when they load.
std::string refusalOf(const ConfigOverrides& flags) {
  try {
    optionsOf(flags);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Every key that changes a step's arithmetic is compared: a rate, the momentum, the decay, the
// seed, the mean (each once differed between hand-started ranks that trained on together).
// The schedules' table: MXNet's names find their rows, an unknown name lists the known ones, and
// each row refuses the processes it cannot run with, naming what to change.
TEST(Schedules, TheTableFindsMxnetNamesAndEachRowRefusesAWorldItCannotRun) {
  // The default first, then by file name (cmake/registry.cmake).
  EXPECT_EQ(scheduleNames(), "local, bsp-allreduce, device, dist_async, dist_sync, ssp");
  EXPECT_EQ(scheduleInfo("dist_device_sync").name, "dist_sync");
  EXPECT_EQ(findSchedule("kvstore"), nullptr);
  try {
    scheduleInfo("dist_syn");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown schedule 'dist_syn' (known: local, bsp-allreduce, device, "
                 "dist_async, dist_sync, ssp)");
  }
  const auto refusal = [](const std::string& schedule, int workers, int servers) {
    TrainOptions o;
    o.schedule = scheduleNamed(schedule);
    o.num_shards = workers;
    o.num_servers = servers;
    try {
      scheduleInfo(schedule).validate(o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (const auto& row : schedules()) {
    if (row.oneProcess()) {
      EXPECT_THAT(refusal(row.name, 2, 0), ::testing::HasSubstr("runs in one process")) << row.name;
    } else if (row.parameterServers()) {
      EXPECT_THAT(refusal(row.name, 2, 0), ::testing::HasSubstr("needs parameter servers"))
          << row.name;
      EXPECT_EQ(refusal(row.name, 2, 1), "") << row.name;
    } else {
      EXPECT_THAT(refusal(row.name, 2, 1), ::testing::HasSubstr("has no parameter servers"))
          << row.name;
      EXPECT_EQ(refusal(row.name, 2, 0), "") << row.name;
    }
  }
  EXPECT_EQ(refusal("local", 1, 0), "");
  EXPECT_THAT(refusal("device", 1, 0), ::testing::HasSubstr("sums gradients on a GPU"));
}

// A run's schedule is typed once its config is loaded: the row with its family's settings, from
// the keys that only that family reads; what a family cannot take is refused at the edge.
TEST(Schedules, LoadingGivesTheScheduleItsFamilyWithItsOwnSettings) {
  const auto ssp = optionsOf({{"schedule", "ssp"}, {"staleness", "5"}}).schedule;
  ASSERT_NE(ssp.servers(), nullptr);
  EXPECT_EQ(ssp.servers()->mode, ParameterServers::Mode::kStale);
  EXPECT_EQ(ssp.servers()->staleness, 5);
  EXPECT_EQ(ssp.allreduce(), nullptr);
  EXPECT_FALSE(ssp.nccl());

  // MXNet's names: kvstore nccl is device with NCCL's sums; dist_device_sync is dist_sync.
  const auto nccl = optionsOf({{"schedule", "nccl"}}).schedule;
  EXPECT_EQ(nccl.name(), "device");
  EXPECT_TRUE(std::holds_alternative<OneProcess>(nccl.family()));
  EXPECT_TRUE(nccl.nccl());
  EXPECT_EQ(optionsOf({{"schedule", "dist_device_sync"}}).schedule.servers()->mode,
            ParameterServers::Mode::kSync);

  const auto ring =
      optionsOf({{"schedule", "bsp-allreduce"}, {"allreduce", "hierarchical"}}).schedule;
  ASSERT_NE(ring.allreduce(), nullptr);
  EXPECT_EQ(ring.allreduce()->algorithm, Allreduce::kHierarchical);
  EXPECT_EQ(ring.keys().allreduce, "hierarchical");
  EXPECT_EQ(makeSchedule(ring.keys()).allreduce()->algorithm, Allreduce::kHierarchical);

  // Several processes and no schedule: Caffe2's sync SGD, or MXNet's dist_sync with servers.
  EXPECT_EQ(optionsOf({{"num_shards", "2"},
                       {"shard_id", "0"},
                       {"rendezvous", "file:///tmp/x"},
                       {"run_id", "r"}})
                .schedule.name(),
            "bsp-allreduce");

  EXPECT_EQ(refusalOf({{"schedule", "dist_async"}, {"reducer", "nccl"}}),
            "reducer nccl: under schedule 'dist_async' the parameter servers sum the gradients; "
            "use schedule bsp-allreduce, or reducer troupe");
  EXPECT_THAT(refusalOf({{"allreduce", "tree"}}),
              ::testing::HasSubstr("expected auto, ring or hierarchical"));
  EXPECT_THAT(refusalOf({{"schedule", "dist_syn"}}),
              ::testing::HasSubstr("unknown schedule 'dist_syn' (known: local, bsp-allreduce"));

  // ZeRO: the state sharded over bsp-allreduce's workers, and nowhere else.
  const auto zero = optionsOf({{"schedule", "bsp-allreduce"}, {"zero_stage", "1"}}).schedule;
  EXPECT_EQ(zero.allreduce()->zero_stage, 1);
  EXPECT_EQ(makeSchedule(zero.keys()).allreduce()->zero_stage, 1);
  EXPECT_EQ(refusalOf({{"schedule", "ssp"}, {"zero_stage", "1"}}),
            "zero_stage 1 shards the optimizer's state over the workers of schedule "
            "bsp-allreduce; under 'ssp' the parameter servers shard it already (zero_stage 0)");
  EXPECT_EQ(refusalOf({{"zero_stage", "1"}}),
            "zero_stage 1 shards the optimizer's state over the workers of schedule "
            "bsp-allreduce; 'local' runs one process, with nothing to shard it over "
            "(zero_stage 0)");
  EXPECT_EQ(optionsOf({{"schedule", "bsp-allreduce"}, {"zero_stage", "2"}})
                .schedule.allreduce()
                ->zero_stage,
            2);
  EXPECT_THAT(refusalOf({{"schedule", "bsp-allreduce"}, {"zero_stage", "3"}}),
              ::testing::HasSubstr("zero_stage 3: troupe shards the optimizer's state (stage 1) "
                                   "and the gradients (2), not yet the weights (3)"));
  EXPECT_THAT(refusalOf({{"schedule", "bsp-allreduce"}, {"zero_stage", "4"}}),
              ::testing::HasSubstr("zero_stage"));
  // Stage 2's gradient slots are replicas' nets on the CPU, whole: the rest is refused.
  const auto stage2RefusalOf = [](ConfigOverrides flags) {
    flags.insert({{"schedule", "bsp-allreduce"}, {"zero_stage", "2"}});
    try {
      validateSchedule(optionsOf(flags));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(stage2RefusalOf({}), "");
  EXPECT_EQ(stage2RefusalOf({{"replicas", "2"}}), "");
  EXPECT_THAT(stage2RefusalOf({{"gpus", "0"}}),
              ::testing::HasSubstr("zero_stage 2 with GPUs (--gpus): not supported yet"));
  EXPECT_THAT(stage2RefusalOf({{"pipeline_stages", "2"}}),
              ::testing::HasSubstr("zero_stage 2 with pipeline stages"));
}

// The options hold typed values; their names stay at the config's edge, where a name a key does
// not know is refused listing those it does.
TEST(TypedOptions, KeysGiveValuesAndRefuseUnknownNamesListingTheKnownOnes) {
  const auto o = optionsOf({{"role", "server"},
                            {"num_servers", "1"},
                            {"rendezvous", "file:///tmp/typed"},
                            {"run_id", "typed"},
                            {"precision", "bf16"},
                            {"input_dtype", "uint8"},
                            {"memory_format", "nhwc"},
                            {"gradient_compression", "2bit"},
                            {"lr_policy", "poly"}});
  EXPECT_EQ(o.role, ProcessRole::kServer);
  EXPECT_EQ(o.precision, kernels::DType::kBFloat16);
  EXPECT_EQ(o.input_dtype, kernels::DType::kUInt8);
  EXPECT_EQ(o.memory_format, MemoryFormat::kNhwc);
  EXPECT_EQ(o.gradient_compression, kernels::GradientCompression::k2Bit);
  EXPECT_EQ(o.lr_policy, kernels::LrSchedule::kPoly);
  // The log's parameters name them as given.
  const auto shown = [&](const std::string& key) {
    for (const auto& [k, v] : o.parameters)
      if (k == key) return v;
    return std::string("(none)");
  };
  EXPECT_EQ(shown("role"), "server");
  EXPECT_EQ(shown("precision"), "bf16");
  EXPECT_EQ(shown("lr_policy"), "poly");
  EXPECT_EQ(shown("gradient_compression"), "2bit");
  EXPECT_THAT(refusalOf({{"lr_policy", "linear"}}),
              HasSubstr("expected fixed, step, multistep, cosine or poly"));
  EXPECT_THAT(refusalOf({{"role", "scheduler"}}), HasSubstr("expected worker or server"));
  EXPECT_THAT(refusalOf({{"precision", "fp8"}}), HasSubstr("expected fp32, fp16 or bf16"));
  EXPECT_THAT(refusalOf({{"gradient_compression", "1bit"}}),
              HasSubstr("expected none, fp16, bf16 or 2bit"));
}

// A layerwise optimizer's shards end at layer boundaries, each shard keeps a key at least, and a
// layer larger than the rest is cut only where no boundary would leave every server a key.
TEST(ShardKeys, LayerBoundariesNeverLeaveAServerWithoutKeys) {
  using Shards = std::vector<std::pair<std::int64_t, std::int64_t>>;
  EXPECT_EQ(shardKeys(100, 2), (Shards{{0, 50}, {50, 100}}));
  EXPECT_EQ(shardKeys(100, 2, {{0, 30}, {30, 60}, {60, 100}}), (Shards{{0, 60}, {60, 100}}));
  // An MLP's first layer holds nearly everything: the cuts go after it, not to 0.
  EXPECT_EQ(shardKeys(1000, 3, {{0, 980}, {980, 990}, {990, 1000}}),
            (Shards{{0, 980}, {980, 990}, {990, 1000}}));
  // One tensor: no boundary inside it, so the even cut.
  EXPECT_EQ(shardKeys(100, 2, {{0, 100}}), (Shards{{0, 50}, {50, 100}}));
  for (const auto& shards : {shardKeys(7, 4, {{0, 7}}), shardKeys(10, 3, {{0, 1}, {1, 10}})}) {
    for (const auto& [lo, hi] : shards)
      EXPECT_LT(lo, hi);
  }
}

TEST(PlanAgreement, EveryKeyThatChangesTheArithmeticIsComparedAndNamedWithBothValues) {
  const auto base = optionsOf({{"model", "mlp"}});
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, std::string>>{{"base_learning_rate", "0.5"},
                                                        {"momentum", "0.5"},
                                                        {"weight_decay", "0.25"},
                                                        {"seed", "7"},
                                                        {"mean", "100"},
                                                        {"batch_size", "32"}}) {
    const auto other = optionsOf({{"model", "mlp"}, {flag, value}});
    const std::string differ = planDifferences(agreedValues(base), agreedValues(other));
    EXPECT_THAT(differ, AllOf(HasSubstr(flag + ": rank 0 has "), HasSubstr(", this one " + value)))
        << flag;
  }
  EXPECT_EQ(planDifferences(agreedValues(base), agreedValues(base)), "");
  // A process's own settings are not compared.
  const auto local = optionsOf({{"model", "mlp"},
                                {"threads", "3"},
                                {"log_every", "7"},
                                {"trace", "t.json"},
                                {"peer_timeout", "9"}});
  EXPECT_EQ(planDifferences(agreedValues(base), agreedValues(local)), "");
}

// Each key is either compared or a process's own on purpose: a new key must be placed.
TEST(PlanAgreement, EveryKeyIsComparedOrListedAsAProcesssOwn) {
  const std::set<std::string> own = {
      "train_data", "test_data", "db_type", "decode_threads", "shared_reader", "gpus", "tf32",
      "cudnn_deterministic", "memory_format", "num_shards", "shard_id", "role",
      "connections_per_peer", "run_id", "generation", "rendezvous", "interface", "secret_file",
      "rendezvous_timeout", "peer_timeout", "stall_warning", "work_load_list", "prefetch",
      "log_dir", "checkpoint_dir", "checkpoint_every", "resume", "log_every", "step_timeout",
      "run_name", "trace", "threads", "skip_bad_records", "cuda_graphs", "serve_store",
      "max_memory",  // each host its own limit
      // Caffe2's flags of the same kinds
      "model_parallel", "cudnn_workspace_limit_mb", "gpu_engine_workspace_limit_mb", "redis_port",
      "use_cpu", "use_ideep", "distributed_transport", "test_epoch_size", "first_iter_timeout"};
  for (const auto& key : config::keys()) {
    if (key.sets) continue;  // an alias: its key carries the value
    EXPECT_TRUE(key.agree || own.count(key.name))
        << key.name << ": neither compared across processes nor listed as a process's own";
    EXPECT_FALSE(key.agree && own.count(key.name)) << key.name;
  }
}

class PlanStoreTest : public ::testing::Test {
 protected:
  testing::TempDir dir_{"plan_store"};
  std::unique_ptr<rendezvous::Store> store_ = rendezvous::openFileStore(dir_.str());
};

TEST_F(PlanStoreTest, RankZeroNamesTheRankThatDisagreesAndThatRankNamesTheKey) {
  const PlanValues chief = {{"steps_per_epoch", "10"}, {"base_learning_rate", "0.01"}};
  const PlanValues mine = {{"steps_per_epoch", "10"}, {"base_learning_rate", "0.5"}};
  auto zero = std::async(std::launch::async, [&] { agreeOnPlan(*store_, 0, 2, chief, 10s); });
  EXPECT_THROW(
      {
        try {
          agreeOnPlan(*store_, 1, 2, mine, 10s);
        } catch (const InputError& e) {
          EXPECT_THAT(e.what(), HasSubstr("base_learning_rate: rank 0 has 0.01, this one 0.5"));
          throw;
        }
      },
      InputError);
  try {
    zero.get();
    ADD_FAILURE() << "rank 0 accepted a rank that disagreed";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 refused this run: rank 1 of 2 disagrees"));
  }
}

// A store value "steps_per_epoch=1 evil" crashed a rank with "unexpected error:
// basic_string::substr"; its bytes reached the terminal raw (an ESC among them).
TEST_F(PlanStoreTest, APoisonedPlanIsAnErrorNamingTheKeyWithItsBytesEscaped) {
  store_->set("plan", "steps_per_epoch=1 evil\x1b[31m");
  try {
    agreeOnPlan(*store_, 1, 2, {{"steps_per_epoch", "10"}}, 10s);
    ADD_FAILURE() << "a poisoned plan was accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("steps_per_epoch: rank 0 has 1 evil\\x1b[31m"),
                                Not(HasSubstr("\x1b"))));
  }
  store_->set("plan", "no equals sign\x07");
  try {
    agreeOnPlan(*store_, 1, 2, {{"steps_per_epoch", "10"}}, 10s);
    ADD_FAILURE() << "a plan without a name=value line was accepted";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("rank 1: the store's 'plan' holds 'no equals sign\\x07'"),
                                HasSubstr("not lines of name=value")));
  }
}

TEST(StoreValues, AnIncarnationOrAKVStoreInitThatIsNotOneIsRefusedNamingTheKeyEscaped) {
  EXPECT_EQ(checkedIncarnation("0123456789abcdef", "rank 1"), "0123456789abcdef");
  try {
    checkedIncarnation("\x1b]0;owned\x07", "rank 1");
    ADD_FAILURE() << "a poisoned incarnation was taken";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(),
                AllOf(HasSubstr("rank 1: the store's 'incarnation' holds '\\x1b]0;owned\\x07'"),
                      Not(HasSubstr("\x1b"))));
  }
  // "ok" alone: a std::out_of_range from a substr before.
  EXPECT_THAT(initMismatch(2, "ok 3 at 3", 3, "ok 3 at 0"),
              HasSubstr("worker 0 inited it with 3 values, this worker with 3"));
  for (const std::string poisoned : {"ok", "ok x at 3", "ok 3 at"}) {
    try {
      initMismatch(2, poisoned, 3, "ok 3 at 0");
      ADD_FAILURE() << poisoned;
    } catch (const InputError& e) {
      EXPECT_THAT(e.what(), HasSubstr("the store's 'kvstore-init-2' holds '" + poisoned + "'"));
    }
  }
}

// The processes of a run on one machine share its cores out, the first ones taking what does
// not divide; processes on other machines (another boot, or other CPUs) are not counted.
TEST(CoreShares, TheRunsProcessesOnAMachineShareItsCoresOut) {
  const std::vector<std::string> keys = {"boot-a/11 0", "boot-a/11 0", "boot-b/11 0", "boot-a/11 0",
                                         "boot-a/1100 4"};
  const CoreShare first = shareCores(keys, 0, 4);
  EXPECT_EQ(first.sharers, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(first.threads, 2);  // 4 cores, 3 processes: 2, 1, 1
  EXPECT_EQ(shareCores(keys, 1, 4).threads, 1);
  EXPECT_EQ(shareCores(keys, 3, 4).threads, 1);
  EXPECT_FALSE(first.all_asked);
  const CoreShare alone = shareCores(keys, 2, 4);
  EXPECT_EQ(alone.sharers, std::vector<int>{2});
  EXPECT_EQ(alone.threads, 4);
  const CoreShare other_cpus = shareCores(keys, 4, 2);
  EXPECT_EQ(other_cpus.sharers, std::vector<int>{4});
  EXPECT_TRUE(other_cpus.all_asked);
  EXPECT_EQ(other_cpus.asked_here, 4);
  EXPECT_EQ(shareCores({"m 0", "m 0", "m 0"}, 2, 2).threads, 1);  // never below 1
}

}  // namespace
}  // namespace troupe::actors
