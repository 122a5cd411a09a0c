// A process's place from the engine that started it (actors/config/cluster_env.h): srun's SLURM_*,
// an Indexed Job's JOB_COMPLETION_INDEX, mpirun's OMPI_COMM_WORLD_*, under flags and TROUPE_*.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/config/cluster_env.h"
#include "actors/config/train_config.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookupIn(const Vars& vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

// Keys given by a flag, as loadTrainOptions reports them.
GivenBy givenIn(const Vars& flags) {
  return [flags](std::string_view key) -> std::optional<std::string> {
    const auto it = flags.find(std::string(key));
    if (it == flags.end()) return std::nullopt;
    return "--" + it->first + " " + it->second;
  };
}

// A task of srun step 42.0 over node07 and node08.
Vars srunTask(int procid, int ntasks) {
  return {{"SLURM_JOB_ID", "42"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_NTASKS", std::to_string(ntasks)},
          {"SLURM_STEP_NODELIST", "node[07-08]"},
          {"SLURM_NODELIST", "node[07-09]"}};
}

std::string errorOf(actors::TrainOptions o, const Vars& env, const Vars& flags = {}) {
  try {
    applyClusterEnvironment(o, givenIn(flags), lookupIn(env));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Sets an environment variable for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

TEST(SlurmHostlist, ACompressedListExpandsInOrderKeepingZeroPadding) {
  EXPECT_EQ(expandSlurmHostlist("node[01-03,07],gpu3,login", "L"),
            (std::vector<std::string>{"node01", "node02", "node03", "node07", "gpu3", "login"}));
  EXPECT_EQ(expandSlurmHostlist("n[8-10]", "L"), (std::vector<std::string>{"n8", "n9", "n10"}));
  EXPECT_EQ(expandSlurmHostlist("vm", "L"), (std::vector<std::string>{"vm"}));
}

TEST(SlurmHostlist, TwoBracketsInOneNameExpandTheFirstOutermost) {
  EXPECT_EQ(expandSlurmHostlist("rack[1-2]-n[1-2]", "L"),
            (std::vector<std::string>{"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}));
}

TEST(SlurmHostlist, AMalformedListIsAnErrorNamingWhereItCameFrom) {
  for (const char* bad : {"", "node[01-", "node]1", "node[4-2]", "node[a-b]", "a,,b", "node[]",
                          "node[1-[2]]", "a b"}) {
    try {
      expandSlurmHostlist(bad, "SLURM_NODELIST=x");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind("SLURM_NODELIST=x: ", 0), 0u) << e.what();
    }
  }
}

TEST(SlurmEnvironment, AnSrunTaskTakesRankWorldRunIdAndTheFirstNodeOfItsStep) {
  actors::TrainOptions o;
  EXPECT_EQ(applyClusterEnvironment(o, givenIn({}), lookupIn(srunTask(1, 2))), "slurm");
  EXPECT_EQ(o.role, ProcessRole::kWorker);
  EXPECT_EQ(o.shard_id, 1);
  EXPECT_EQ(o.num_shards, 2);
  EXPECT_EQ(o.run_id, "slurm-42.0");
  EXPECT_EQ(slurmRendezvousPort(42, 0), 29500 + (16 * 42) % 2000);
  EXPECT_EQ(o.rendezvous, "tcp://node07:" + std::to_string(slurmRendezvousPort(42, 0)));
}

TEST(SlurmEnvironment, LowTasksAreServersAndTheRestWorkers) {
  actors::TrainOptions o;
  o.num_servers = 1;
  applyClusterEnvironment(o, givenIn({{"num_servers", "1"}}), lookupIn(srunTask(0, 3)));
  EXPECT_EQ(o.role, ProcessRole::kServer);
  EXPECT_EQ(o.shard_id, 0);
  EXPECT_EQ(o.num_shards, 2);
  actors::TrainOptions last;
  last.num_servers = 1;
  applyClusterEnvironment(last, givenIn({{"num_servers", "1"}}), lookupIn(srunTask(2, 3)));
  EXPECT_EQ(last.role, ProcessRole::kWorker);
  EXPECT_EQ(last.shard_id, 1);
}

TEST(SlurmEnvironment, WithoutAStepNodelistTheJobsNodelistNamesTheFirstNode) {
  auto env = srunTask(0, 2);
  env.erase("SLURM_STEP_NODELIST");
  env["SLURM_NODELIST"] = "gpu[003-004]";
  actors::TrainOptions o;
  applyClusterEnvironment(o, givenIn({}), lookupIn(env));
  EXPECT_EQ(o.rendezvous.rfind("tcp://gpu003:", 0), 0u) << o.rendezvous;
}

TEST(SlurmEnvironment, AGivenRendezvousRunIdOrPlaceIsKept) {
  actors::TrainOptions o;
  o.rendezvous = "redis://store:6379";
  o.run_id = "mine";
  o.shard_id = 0;
  applyClusterEnvironment(o, givenIn({{"shard_id", "0"}}), lookupIn(srunTask(1, 2)));
  EXPECT_EQ(o.rendezvous, "redis://store:6379");
  EXPECT_EQ(o.run_id, "mine");
  EXPECT_EQ(o.shard_id, 0);
  EXPECT_EQ(o.num_shards, 2);
}

TEST(SlurmEnvironment, ASingleTaskNeedsNoRendezvous) {
  actors::TrainOptions o;
  applyClusterEnvironment(o, givenIn({}), lookupIn(srunTask(0, 1)));
  EXPECT_EQ(o.num_shards, 1);
  EXPECT_EQ(o.rendezvous, "");
}

TEST(SlurmEnvironment, ABatchScriptsOwnShellIsNoTaskOfAStep) {
  auto env = srunTask(0, 4);
  env.erase("SLURM_STEP_ID");
  actors::TrainOptions o;
  EXPECT_EQ(applyClusterEnvironment(o, givenIn({}), lookupIn(env)), "");
  EXPECT_EQ(o.num_shards, 1);
  EXPECT_EQ(o.run_id, "");
}

TEST(SlurmEnvironment, AProcessThatTroupePlacedIgnoresSlurm) {
  auto env = srunTask(1, 2);
  env["TROUPE_RANK"] = "0";
  actors::TrainOptions o;
  EXPECT_EQ(applyClusterEnvironment(o, givenIn({}), lookupIn(env)), "");
  EXPECT_EQ(o.shard_id, 0);
  EXPECT_EQ(o.num_shards, 1);
}

TEST(SlurmEnvironment, BadValuesAreErrorsNamingTheVariable) {
  auto env = srunTask(0, 2);
  env["SLURM_PROCID"] = "x1";
  EXPECT_EQ(errorOf({}, env),
            "SLURM_PROCID='x1': expected this task's rank, a whole number in [0, 65535]");
  env = srunTask(2, 2);
  EXPECT_EQ(errorOf({}, env), "SLURM_PROCID=2 is not below SLURM_NTASKS=2");
  env = srunTask(0, 2);
  env["SLURM_NTASKS"] = "0";
  EXPECT_EQ(errorOf({}, env),
            "SLURM_NTASKS='0': expected the number of tasks, a whole number in [1, 65536]");
  env = srunTask(0, 2);
  env["SLURM_STEP_NODELIST"] = "node[1-";
  EXPECT_EQ(errorOf({}, env),
            "SLURM_STEP_NODELIST=node[1-: not a Slurm hostlist (a '[' without ']')");
}

TEST(SlurmEnvironment, NumShardsDisagreeingWithTheTasksIsAnErrorNamingBothNumbers) {
  actors::TrainOptions o;
  o.num_shards = 4;
  EXPECT_EQ(errorOf(o, srunTask(0, 2), {{"num_shards", "4"}}),
            "SLURM_NTASKS=2 process(es), but 4 worker(s) (--num_shards 4) and 0 server(s) make 4: "
            "start as many processes as the run has, or leave the number of workers to "
            "SLURM_NTASKS");
  o.num_shards = 2;
  EXPECT_EQ(errorOf(o, srunTask(0, 2), {{"num_shards", "2"}}), "");
  actors::TrainOptions servers;
  servers.num_servers = 2;
  EXPECT_EQ(errorOf(servers, srunTask(0, 2), {{"num_servers", "2"}}),
            "SLURM_NTASKS=2 leaves no worker beside 2 server(s) (--num_servers 2)");
}

TEST(KubernetesEnvironment, TheCompletionIndexIsTheRankServersFirst) {
  actors::TrainOptions o;
  o.num_shards = 2;
  o.num_servers = 1;
  EXPECT_EQ(applyClusterEnvironment(o, givenIn({}), lookupIn({{"JOB_COMPLETION_INDEX", "2"}})),
            "kubernetes");
  EXPECT_EQ(o.role, ProcessRole::kWorker);
  EXPECT_EQ(o.shard_id, 1);
  EXPECT_EQ(o.num_shards, 2);
  EXPECT_EQ(o.rendezvous, "");  // the manifest gives it
  actors::TrainOptions first = o;
  applyClusterEnvironment(first, givenIn({}), lookupIn({{"JOB_COMPLETION_INDEX", "0"}}));
  EXPECT_EQ(first.role, ProcessRole::kServer);
  EXPECT_EQ(first.shard_id, 0);
}

TEST(KubernetesEnvironment, AnIndexBeyondTheWorldOrNotANumberIsAnErrorNamingTheVariable) {
  actors::TrainOptions o;
  o.num_shards = 2;
  EXPECT_EQ(errorOf(o, {{"JOB_COMPLETION_INDEX", "2"}}, {{"num_shards", "2"}}),
            "JOB_COMPLETION_INDEX=2 is not below the run's 2 process(es) (--num_shards 2 and "
            "num_servers 0): set TROUPE_NUM_WORKERS and TROUPE_NUM_SERVERS to add up to the "
            "Job's completions");
  EXPECT_EQ(errorOf(o, {{"JOB_COMPLETION_INDEX", "-1"}}),
            "JOB_COMPLETION_INDEX='-1': expected this pod's index, a whole number in [0, 65535]");
}

// mpirun under Slurm starts its daemons with srun: SLURM_PROCID is a node's, not the rank's.
TEST(MpiEnvironment, OpenMpisRankWinsOverTheSlurmStepItRunsIn) {
  auto env = srunTask(0, 1);
  env["OMPI_COMM_WORLD_RANK"] = "3";
  env["OMPI_COMM_WORLD_SIZE"] = "4";
  actors::TrainOptions o;
  EXPECT_EQ(applyClusterEnvironment(o, givenIn({}), lookupIn(env)), "mpi");
  EXPECT_EQ(o.role, ProcessRole::kWorker);
  EXPECT_EQ(o.shard_id, 3);
  EXPECT_EQ(o.num_shards, 4);
  EXPECT_EQ(o.rendezvous, "");  // mpirun names no node to meet on
}

// Under troupe launch, the launcher serves the rendezvous it names; a rendezvous given beside it
// (a torch.distributed subgroup's ring: troupe.torch's settings) is served by its rank 0.
TEST(ClusterEnvironmentPrecedence, ARendezvousOfItsOwnUnderTheLauncherIsServedByRankZero) {
  ScopedEnv launchers("TROUPE_RENDEZVOUS", "tcp://127.0.0.1:4000");
  ScopedEnv rank("TROUPE_RANK", "2");
  ScopedEnv workers("TROUPE_NUM_WORKERS", "3");
  ScopedEnv run_id("TROUPE_RUN_ID", "run-1");
  const auto launched = loadTrainOptions("", {});
  EXPECT_EQ(launched.rendezvous, "tcp://127.0.0.1:4000");
  EXPECT_FALSE(launched.serve_store);  // the launcher's
  const auto same = loadTrainOptions("", {{"rendezvous", "tcp://127.0.0.1:4000"}});
  EXPECT_FALSE(same.serve_store);  // the launcher's, named again
  const auto own = loadTrainOptions("", {{"rendezvous", "tcp://127.0.0.1:4100"},
                                         {"shard_id", "0"},
                                         {"num_shards", "2"},
                                         {"run_id", "torch-sub"}});
  EXPECT_EQ(own.rendezvous, "tcp://127.0.0.1:4100");
  EXPECT_EQ(own.shard_id, 0);
  EXPECT_EQ(own.num_shards, 2);
  EXPECT_TRUE(own.serve_store);
}

// Through loadTrainOptions and the real environment: flag > TROUPE_* > SLURM_*.
TEST(ClusterEnvironmentPrecedence, FlagsBeatTroupeVariablesWhichBeatSlurms) {
  std::vector<std::unique_ptr<ScopedEnv>> vars;
  static const Vars task = srunTask(1, 2);
  for (const auto& [k, v] : task)
    vars.push_back(std::make_unique<ScopedEnv>(k.c_str(), v.c_str()));
  ScopedEnv run_id("TROUPE_RUN_ID", "from-troupe");
  const auto o = loadTrainOptions("", {{"rendezvous", "tcp://127.0.0.1:1234"}});
  EXPECT_EQ(o.role, ProcessRole::kWorker);
  EXPECT_EQ(o.shard_id, 1);
  EXPECT_EQ(o.num_shards, 2);
  EXPECT_EQ(o.run_id, "from-troupe");
  EXPECT_EQ(o.rendezvous, "tcp://127.0.0.1:1234");
  EXPECT_TRUE(o.serve_store);  // no launcher serves it: task 0 does
  const auto flagged = loadTrainOptions("", {{"shard_id", "0"}});
  EXPECT_EQ(flagged.shard_id, 0);
  EXPECT_EQ(flagged.run_id, "from-troupe");
  EXPECT_EQ(flagged.rendezvous.rfind("tcp://node07:", 0), 0u) << flagged.rendezvous;

  ScopedEnv workers("TROUPE_NUM_WORKERS", "3");
  try {
    loadTrainOptions("", {});
    ADD_FAILURE() << "TROUPE_NUM_WORKERS=3 under SLURM_NTASKS=2 was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "SLURM_NTASKS=2 process(es), but 3 worker(s) (TROUPE_NUM_WORKERS=3) and 0 server(s) "
              "make 3: start as many processes as the run has, or leave the number of workers to "
              "SLURM_NTASKS");
  }
}

}  // namespace
}  // namespace troupe::actors
