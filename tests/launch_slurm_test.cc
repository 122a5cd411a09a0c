// Slurm on this host (tests/slurm/start.sh): `troupe launch --launcher slurm`, and `troupe train`
// started by srun without a launcher.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "cli_util.h"
#include "launch_util.h"
#include "slurm_util.h"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kLimitSeconds = 60;

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
  EXPECT_TRUE(containsAll(r.output, {"slurm launcher", "[worker 1] ", "[worker 0] ",
                                     "done: 10 steps", "[launcher] all 2 process(es) exited 0"}));
  EXPECT_FALSE(contains(r.output, "@@troupe")) << r.output;
}

// A torchrun script runs as it is under one srun on the one-node cluster: RANK, LOCAL_RANK,
// LOCAL_WORLD_SIZE and GROUP_RANK from Slurm's variables, MASTER_ADDR the step's first node.
TEST(LaunchSlurm, ATorchrunScriptRunsUnchanged) {
  TempDir cwd("slurm_torchrun");
  EXPECT_TRUE(ranTheTorchrunScript(launchSlurm(cwd, "-n 2 -- " + torchrunScript()),
                                   {"local 0 of 2, group 0", "local 1 of 2, group 0"}));
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
  EXPECT_TRUE(containsAll(r.output,
                          {"[server 0] server 0 2/1 [x y] tcp://", "[worker 0] worker 0 2/1 [x y]",
                           "[worker 1] worker 1 2/1 [x y]", " run-"}));
}

// srun gets the values in its environment (--export=ALL): the secret stands on no command line.
TEST(LaunchSlurm, TheRunsSecretReachesEveryTaskOffEveryCommandLine) {
  TempDir cwd("slurm_secret");
  EXPECT_TRUE(keptTheSecretOffCommandLines(launchSlurm(cwd, "-n 2 -- " + secretCensus()), 2));
}

TEST(LaunchSlurm, AFailingTaskIsNamedAndTheStepEnds) {
  TempDir cwd("slurm_fail");
  const auto r = launchSlurm(
      cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 1 ]; then sleep 0.3; exit 3; fi; sleep 60'");
  EXPECT_TRUE(
      exitedWith(r, 3, {"[launcher] run failed: worker 1 on ", " exited with code 3; srun "}));
  EXPECT_LT(r.elapsed, 20s) << r.output;
}

// The wrapper killed with its command: no exit marker, so the task srun reports is the one named.
TEST(LaunchSlurm, ATaskWhoseWrapperIsKilledIsNamedFromSrunsReport) {
  TempDir cwd("slurm_signal");
  const auto r = launchSlurm(
      cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 0 ]; then kill -9 $PPID $$; fi; sleep 60'");
  EXPECT_TRUE(exitedWith(
      r, 137, {"[launcher] run failed: worker 0 on ", "was killed by signal 9 (Killed)"}));
}

TEST(LaunchSlurm, AnAllocationWithFewerTasksThanTheRunIsRefusedNamingBoth) {
  TempDir cwd("slurm_small");
  const auto r =
      inSlurm(cwd, "salloc -n 1 " + troupeBinary() + " launch --launcher slurm -n 2 -s 1 -- true",
              "salloc");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(containsAll(r.output,
                          {"--launcher slurm: the run has 3 process(es) (2 worker(s), 1 server(s)) "
                           "but this Slurm allocation (job ",
                           ") has 1 task(s) (SLURM_NTASKS=1): ask sbatch or salloc for -n 3"}));
  EXPECT_FALSE(contains(r.output, "[launcher] run ")) << r.output;
}

TEST(LaunchSlurm, StoppingTheLauncherEndsEveryTask) {
  TempDir cwd("slurm_stop");
  EXPECT_TRUE(stoppingTheLauncherEndsEveryProcess(
      cwd, sharedSlurmCluster().env() + troupeBinary() + " launch --launcher slurm", 2));
}

// `srun troupe train`: each task takes its rank and the world from SLURM_PROCID and SLURM_NTASKS,
// and they meet on the first node, where task 0 serves the store.
TEST(SlurmTasksWithoutLauncher, TwoTasksOfOneSrunTrainLeNetForAnEpoch) {
  TempDir cwd("slurm_srun");
  const auto r = inSlurm(cwd, "srun -n 2 " + trainLeNet(), "srun");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      containsAll(r.output, {"rank 0 serves the rendezvous store at tcp://", "node 1 of 2 linked",
                             "done: worker 1 of 2", "done: 10 steps"}));
}

TEST(SlurmTasksWithoutLauncher, TasksDisagreeingWithNumShardsFailNamingBothNumbers) {
  TempDir cwd("slurm_srun_mismatch");
  const auto r = inSlurm(cwd, "srun -n 2 " + trainLeNet() + " --num_shards 3", "srun");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(containsAll(r.output, {"SLURM_NTASKS=2 process(es), but 3 worker(s) (--num_shards 3) "
                                     "and 0 server(s) make 3"}));
  EXPECT_FALSE(contains(r.output, "linked")) << r.output;
}

}  // namespace
}  // namespace troupe::testing
