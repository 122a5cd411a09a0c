// `troupe launch --launcher local`, and the launcher's hostfile and quoting helpers, in-process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "apps/launcher.h"
#include "cli_util.h"
#include "troupe/error.h"

namespace troupe::testing {
namespace {

using apps::readHostfile;
using apps::shellQuote;

std::string launchIn(const TempDir& dir, const std::string& args) {
  return "cd " + dir.str() + " && " + troupeBinary() + " launch " + args;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LaunchLocal, ServersComeFirstThenWorkersEachWithItsRoleAndRank) {
  TempDir cwd("launch_local_roles");
  const auto r = runCommand(launchIn(cwd,
                                     "-n 2 -s 2 -- bash -c 'echo $TROUPE_ROLE $TROUPE_RANK of "
                                     "$TROUPE_NUM_WORKERS/$TROUPE_NUM_SERVERS $TROUPE_RUN_ID'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"[server 0] server 0 of 2/2 run-", "[server 1] server 1 of 2/2 run-",
                           "[worker 0] worker 0 of 2/2 run-", "[worker 1] worker 1 of 2/2 run-"}) {
    EXPECT_TRUE(contains(r.output, line)) << line << "\n" << r.output;
  }
  EXPECT_TRUE(contains(r.output, "[launcher] all 4 process(es) exited 0")) << r.output;
}

TEST(LaunchLocal, EveryEnvFlagReachesEveryProcessWithItsSpaces) {
  TempDir cwd("launch_local_env");
  const auto r = runCommand(
      launchIn(cwd, "-n 1 -s 1 --env A=1 --env 'B=x y=z' -- bash -c 'echo \"[$A] [$B]\"'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[server 0] [1] [x y=z]")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] [1] [x y=z]")) << r.output;
}

TEST(LaunchLocal, AFailingProcessIsNamedAndTheOthersAreStopped) {
  TempDir cwd("launch_local_fail");
  const auto started = std::chrono::steady_clock::now();
  const auto r = runCommand(
      launchIn(cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 1 ]; then exit 3; fi; sleep 60'"));
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] worker 1 on localhost (pid")) << r.output;
  EXPECT_TRUE(contains(r.output, "run failed: worker 1 on localhost exited with code 3"))
      << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
}

// A process that loses a peer may exit before the peer's death is reaped; a death by a signal
// shortly after another failure is named as the cause.
TEST(LaunchLocal, ASignalDeathJustAfterAnotherFailureIsNamedAsTheCause) {
  TempDir cwd("launch_local_cause");
  const auto r = runCommand(launchIn(
      cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 0 ]; then exit 1; fi; sleep 0.05; kill -9 $$'"));
  EXPECT_EQ(r.exit_code, 137) << r.output;
  EXPECT_TRUE(contains(r.output, "run failed: worker 1 on localhost was killed by signal 9"))
      << r.output;
}

// Worker 1 of the first generation dies of SIGKILL; the launcher stops worker 0 and starts both
// again, with generation 1 and a fresh store, under the same run id.
TEST(LaunchLocal, RestartStartsTheWholeWorldAgainAsTheNextGeneration) {
  TempDir cwd("launch_local_restart");
  const auto r = runCommand(launchIn(
      cwd,
      "-n 2 --run_id rr --on-failure restart -- bash -c 'echo gen $TROUPE_GENERATION "
      "$TROUPE_RUN_ID $TROUPE_RENDEZVOUS; if [ $TROUPE_GENERATION$TROUPE_RANK = 01 ]; then "
      "kill -9 $$; fi; if [ $TROUPE_GENERATION = 0 ]; then sleep 60; fi'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] gen 0 rr tcp://")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[launcher] worker 1 on localhost was killed by signal 9 "
                       "(Killed); restarting every process (1 of 3 restarts)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] run rr (restart 1 of 3): 2 worker(s)")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] gen 1 rr tcp://")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] gen 1 rr tcp://")) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] all 2 process(es) exited 0")) << r.output;
  // Each generation has its own embedded store.
  const auto store = [&](const std::string& who) {
    const auto at = r.output.find(who);
    return at == std::string::npos ? "" : r.output.substr(at + who.size(), 21);
  };
  EXPECT_NE(store("[worker 0] gen 0 rr "), store("[worker 0] gen 1 rr ")) << r.output;
}

TEST(LaunchLocal, RestartGivesUpAfterMaxRestartsNamingTheLastFailure) {
  TempDir cwd("launch_local_giveup");
  const auto r = runCommand(launchIn(cwd,
                                     "-n 2 --on-failure restart --max-restarts 2 -- bash -c 'if [ "
                                     "$TROUPE_RANK = 1 ]; then exit $((3 + TROUPE_GENERATION)); "
                                     "fi; sleep 60'"));
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with code 3; restarting every process (1 of 2 restarts)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "exited with code 4; restarting every process (2 of 2 restarts)"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[launcher] run failed: worker 1 on localhost exited with code 5; giving "
                       "up after 2 restart(s) (--max-restarts 2)"))
      << r.output;
}

// A killed process leaves its Unix socket (and the run's socket folder) behind; the launcher
// removes the folder of a generation once all of its processes have exited. The processes here
// leave sockets as a killed troupe would, and the second generation looks for the first's.
TEST(LaunchLocal, SocketFoldersLeftByAGenerationAreRemovedWhenItEnds) {
  TempDir cwd("launch_local_sockets");
  const std::string id = "sockets" + std::to_string(::getpid());
  const std::string first = "/tmp/troupe-" + id, second = first + "-gen1";
  const auto r = runCommand(launchIn(
      cwd, "-n 2 --run_id " + id +
               " --on-failure restart -- bash -c 'd=/tmp/troupe-$TROUPE_RUN_ID; "
               "if [ $TROUPE_GENERATION = 1 ]; then d=$d-gen1; [ -e " +
               first +
               " ] || echo first folder gone; fi; mkdir -p $d && touch $d/node$TROUPE_RANK.sock; "
               "if [ $TROUPE_GENERATION$TROUPE_RANK = 01 ]; then kill -9 $$; fi; "
               "if [ $TROUPE_GENERATION = 0 ]; then sleep 60; fi'"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] first folder gone")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] first folder gone")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(first));
  EXPECT_FALSE(std::filesystem::exists(second));
}

TEST(LaunchLocal, ARunIdThatLeavesItsFolderIsRefused) {
  TempDir cwd("launch_local_run_id");
  const auto r = runCommand(launchIn(cwd, "-n 1 --run_id a/../b -- true"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "run_id 'a/../b' may hold letters, digits")) << r.output;
}

TEST(LaunchLocal, TheRunsSecretReachesEveryProcessOffEveryCommandLine) {
  TempDir cwd("launch_local_secret");
  const auto r = runCommand(launchIn(cwd, "-n 2 -- " + secretCensus()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] secret of 64 chars on 0 command lines")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] secret of 64 chars on 0 command lines")) << r.output;
}

TEST(LaunchLocal, AbortIsTheDefaultAndNeverRestarts) {
  TempDir cwd("launch_local_abort");
  const auto r = runCommand(launchIn(cwd, "-n 1 -- bash -c 'echo gen $TROUPE_GENERATION; exit 7'"));
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] gen 0")) << r.output;
  EXPECT_FALSE(contains(r.output, "restart")) << r.output;
}

TEST(LaunchLocal, BadFailurePoliciesAreRefused) {
  TempDir cwd("launch_local_policy");
  const auto bad = runCommand(launchIn(cwd, "-n 1 --on-failure retry -- true"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(contains(bad.output, "--on-failure 'retry': expected abort or restart"))
      << bad.output;
  const auto negative = runCommand(launchIn(cwd, "-n 1 --max-restarts -1 -- true"));
  EXPECT_NE(negative.exit_code, 0);
  EXPECT_TRUE(contains(negative.output, "--max-restarts -1: cannot be negative"))
      << negative.output;
}

TEST(LaunchLocal, AnUnknownLauncherListsTheKnownOnes) {
  TempDir cwd("launch_local_unknown");
  const auto r = runCommand(launchIn(cwd, "-n 1 --launcher slurm -- true"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "unknown launcher 'slurm' (known: local, ssh, mpi)")) << r.output;
}

TEST(LaunchLocal, SshWithoutAHostfileIsRefused) {
  TempDir cwd("launch_local_nohosts");
  const auto r = runCommand(launchIn(cwd, "-n 1 --launcher ssh -- true"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "--launcher ssh needs -H HOSTFILE")) << r.output;
}

TEST(LaunchHostfile, ReadsHostsAndPortsSkippingCommentsAndBlankLines) {
  TempDir dir("launch_hostfile");
  const std::string path = dir.str() + "/hosts";
  std::ofstream(path) << "# the cluster\nnode1\n\n  node2:2222  # second\n10.0.0.3:22\n";
  const auto hosts = readHostfile(path);
  ASSERT_EQ(hosts.size(), 3u);
  EXPECT_EQ(hosts[0].name, "node1");
  EXPECT_EQ(hosts[0].port, 0);
  EXPECT_EQ(hosts[0].display(), "node1");
  EXPECT_EQ(hosts[1].name, "node2");
  EXPECT_EQ(hosts[1].port, 2222);
  EXPECT_EQ(hosts[1].line, 4);
  EXPECT_EQ(hosts[2].display(), "10.0.0.3:22");
}

TEST(LaunchHostfile, ABadPortNamesTheFileAndLine) {
  TempDir dir("launch_hostfile_bad");
  const std::string path = dir.str() + "/hosts";
  std::ofstream(path) << "node1\nnode2:99999\n";
  try {
    readHostfile(path);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_TRUE(contains(e.what(), path + ":2: bad host:port 'node2:99999'")) << e.what();
  }
}

TEST(LaunchHostfile, AnEmptyOrMissingFileIsAnInputError) {
  TempDir dir("launch_hostfile_empty");
  const std::string path = dir.str() + "/hosts";
  std::ofstream(path) << "# nobody\n\n";
  EXPECT_THROW(readHostfile(path), InputError);
  EXPECT_THROW(readHostfile(dir.str() + "/missing"), InputError);
}

TEST(LaunchShellQuote, QuotesOnlyWhatNeedsItAndSurvivesTheShell) {
  EXPECT_EQ(shellQuote("plain/path-1.0"), "plain/path-1.0");
  EXPECT_EQ(shellQuote(""), "''");
  EXPECT_EQ(shellQuote("a b"), "'a b'");
  for (const std::string s : {"it's", "$HOME `id` \"q\" \\ ;&|*", "new\nline", "'"}) {
    const auto r = runCommand("printf %s " + shellQuote(s));
    EXPECT_EQ(r.output, s);
  }
}

}  // namespace
}  // namespace troupe::testing
