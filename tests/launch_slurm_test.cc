// Slurm on this host (tests/slurm/start.sh): `troupe launch --launcher slurm`, and `troupe train`
// started by srun without a launcher.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "cli_util.h"
#include "slurm_util.h"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kLimitSeconds = 60;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Runs `command` in `cwd` against the shared cluster, for at most kLimitSeconds (then SIGTERM,
// SIGKILL 5 s later); a command stopped so says so at the end of the output.
CommandResult inSlurm(const TempDir& cwd, const std::string& command, const std::string& what) {
  auto r = runCommand("cd " + cwd.str() + " && " + sharedSlurmCluster().env() + "timeout -k 5 " +
                      std::to_string(kLimitSeconds) + " " + command);
  if (r.exit_code == 124 || r.exit_code == 137) {
    r.output += "\n(" + what + " did not end within " + std::to_string(kLimitSeconds) + " s)";
  }
  return r;
}

CommandResult launchSlurm(const TempDir& cwd, const std::string& args) {
  return inSlurm(cwd, troupeBinary() + " launch --launcher slurm " + args, "troupe launch");
}

// LeNet for one small epoch on Fashion-MNIST, one thread per process.
std::string trainLeNet() {
  return troupeBinary() + " train " + sourceDir() + "/configs/lenet.toml --train_data " +
         testData("lmdb") + "/train --test_data " + testData("lmdb") +
         "/test --db_type lmdb --epoch_size 1280 --num_epochs 1 --threads 1 "
         "--schedule bsp-allreduce";
}

TEST(LaunchSlurm, TwoWorkersTrainLeNetForAnEpochUnderOneSrun) {
  TempDir cwd("slurm_train");
  const auto r = launchSlurm(cwd, "-n 2 -- " + trainLeNet());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "slurm launcher")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] ")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] ")) << r.output;
  EXPECT_TRUE(contains(r.output, "done: 10 steps")) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] all 2 process(es) exited 0")) << r.output;
  EXPECT_FALSE(contains(r.output, "@@troupe")) << r.output;
}

// Three tasks on a node that may have two CPUs: SLURM_OVERCOMMIT lets srun place them.
TEST(LaunchSlurm, LowTasksAreServersAndEveryTaskGetsTheEnvironment) {
  TempDir cwd("slurm_roles");
  const auto r = inSlurm(cwd,
                         "env SLURM_OVERCOMMIT=1 " + troupeBinary() +
                             " launch --launcher slurm -n 2 -s 1 --env 'B=x y' -- bash -c 'echo "
                             "$TROUPE_ROLE $TROUPE_RANK $TROUPE_NUM_WORKERS/$TROUPE_NUM_SERVERS "
                             "[$B] ${TROUPE_RENDEZVOUS%:*} $TROUPE_RUN_ID'",
                         "troupe launch");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"[server 0] server 0 2/1 [x y] tcp://", "[worker 0] worker 0 2/1 [x y]",
                           "[worker 1] worker 1 2/1 [x y]", " run-"}) {
    EXPECT_TRUE(contains(r.output, line)) << line << "\n" << r.output;
  }
}

// srun gets the values in its environment (--export=ALL): the secret stands on no command line.
TEST(LaunchSlurm, TheRunsSecretReachesEveryTaskOffEveryCommandLine) {
  TempDir cwd("slurm_secret");
  const auto r = launchSlurm(cwd, "-n 2 -- " + secretCensus());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] secret of 64 chars on 0 command lines")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] secret of 64 chars on 0 command lines")) << r.output;
}

TEST(LaunchSlurm, AFailingTaskIsNamedAndTheStepEnds) {
  TempDir cwd("slurm_fail");
  const auto started = std::chrono::steady_clock::now();
  const auto r = launchSlurm(
      cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] run failed: worker 1 on ")) << r.output;
  EXPECT_TRUE(contains(r.output, " exited with code 3; srun ")) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - started, 20s) << r.output;
}

// The wrapper killed with its command: no exit marker, so the task srun reports is the one named.
TEST(LaunchSlurm, ATaskWhoseWrapperIsKilledIsNamedFromSrunsReport) {
  TempDir cwd("slurm_signal");
  const auto r = launchSlurm(
      cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 0 ]; then kill -9 $PPID $$; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 137) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] run failed: worker 0 on ")) << r.output;
  EXPECT_TRUE(contains(r.output, "was killed by signal 9 (Killed)")) << r.output;
}

TEST(LaunchSlurm, AnAllocationWithFewerTasksThanTheRunIsRefusedNamingBoth) {
  TempDir cwd("slurm_small");
  const auto r =
      inSlurm(cwd, "salloc -n 1 " + troupeBinary() + " launch --launcher slurm -n 2 -s 1 -- true",
              "salloc");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "--launcher slurm: the run has 3 process(es) (2 worker(s), 1 server(s)) but "
                       "this Slurm allocation (job "))
      << r.output;
  EXPECT_TRUE(contains(r.output, ") has 1 task(s) (SLURM_NTASKS=1): ask sbatch or salloc for -n 3"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "[launcher] run ")) << r.output;
}

TEST(LaunchSlurm, StoppingTheLauncherEndsEveryTask) {
  TempDir cwd("slurm_stop");
  const std::string pids = cwd.str() + "/pids";
  const auto r = runCommand(
      "cd " + cwd.str() + " && export " + sharedSlurmCluster().env() + "&& { " + troupeBinary() +
      " launch --launcher slurm -n 2 -- bash -c 'sleep 60 & echo $! >> " + pids +
      "; wait' & L=$!; for i in $(seq 100); do [ $(cat " + pids +
      " 2>/dev/null | wc -l) = 2 ] && break; sleep 0.1; done; kill -TERM $L; wait $L; "
      "echo launcher exit $?; sleep 0.5; for p in $(cat " +
      pids +
      "); do [ -d /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status && echo alive $p; done; "
      "true; }");
  EXPECT_TRUE(contains(r.output, "launcher exit 143")) << r.output;
  EXPECT_TRUE(contains(r.output, "got signal 15")) << r.output;
  EXPECT_FALSE(contains(r.output, "alive")) << r.output;
}

// `srun troupe train`: each task takes its rank and the world from SLURM_PROCID and SLURM_NTASKS,
// and they meet on the first node, where task 0 serves the store.
TEST(SlurmTasksWithoutLauncher, TwoTasksOfOneSrunTrainLeNetForAnEpoch) {
  TempDir cwd("slurm_srun");
  const auto r = inSlurm(cwd, "srun -n 2 " + trainLeNet(), "srun");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 0 serves the rendezvous store at tcp://")) << r.output;
  EXPECT_TRUE(contains(r.output, "node 1 of 2 linked")) << r.output;
  EXPECT_TRUE(contains(r.output, "done: worker 1 of 2")) << r.output;
  EXPECT_TRUE(contains(r.output, "done: 10 steps")) << r.output;
}

TEST(SlurmTasksWithoutLauncher, TasksDisagreeingWithNumShardsFailNamingBothNumbers) {
  TempDir cwd("slurm_srun_mismatch");
  const auto r = inSlurm(cwd, "srun -n 2 " + trainLeNet() + " --num_shards 3", "srun");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "SLURM_NTASKS=2 process(es), but 3 worker(s) (--num_shards 3) and 0 "
                       "server(s) make 3"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "linked")) << r.output;
}

}  // namespace
}  // namespace troupe::testing
