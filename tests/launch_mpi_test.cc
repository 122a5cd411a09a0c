// `troupe launch --launcher mpi` with Debian's Open MPI mpirun on this host.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "cli_util.h"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

CommandResult launchMpi(const TempDir& cwd, const std::string& args) {
  return runCommand("cd " + cwd.str() + " && " + troupeBinary() + " launch --launcher mpi " + args);
}

TEST(LaunchMpi, TwoWorkersPrintTheirRoleAndRankWithPrefixes) {
  TempDir cwd("launch_mpi_two");
  const auto r = launchMpi(cwd, "-n 2 -- bash -c 'echo $TROUPE_ROLE $TROUPE_RANK'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] worker 0\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] worker 1\n")) << r.output;
  EXPECT_FALSE(contains(r.output, "@@troupe")) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] all 2 process(es) exited 0")) << r.output;
}

// mpirun gets the values in its environment and `-x NAME` only: the secret (and the rest)
// stands on no command line.
TEST(LaunchMpi, TheRunsSecretReachesEveryRankOffEveryCommandLine) {
  TempDir cwd("launch_mpi_secret");
  const auto r = launchMpi(cwd, "-n 2 -- " + secretCensus());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] secret of 64 chars on 0 command lines")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] secret of 64 chars on 0 command lines")) << r.output;
}

TEST(LaunchMpi, LowRanksAreServersAndEveryProcessGetsTheEnvironment) {
  TempDir cwd("launch_mpi_roles");
  std::ofstream(cwd.str() + "/hosts") << "localhost\nlocalhost # twice\n";
  const auto r = launchMpi(cwd,
                           "-H hosts -n 2 -s 1 --env 'B=x y' -- bash -c 'echo $TROUPE_ROLE "
                           "$TROUPE_RANK $TROUPE_NUM_WORKERS/$TROUPE_NUM_SERVERS [$B] "
                           "${TROUPE_RENDEZVOUS%:*} $TROUPE_RUN_ID'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"[server 0] server 0 2/1 [x y] tcp://127.0.0.1 run-",
                           "[worker 0] worker 0 2/1 [x y] tcp://127.0.0.1 run-",
                           "[worker 1] worker 1 2/1 [x y] tcp://127.0.0.1 run-"}) {
    EXPECT_TRUE(contains(r.output, line)) << line << "\n" << r.output;
  }
}

TEST(LaunchMpi, AFailingRankIsNamedAndTheJobEnds) {
  TempDir cwd("launch_mpi_fail");
  const auto started = std::chrono::steady_clock::now();
  const auto r =
      launchMpi(cwd,
                "-n 2 -s 1 -- bash -c 'if [ $TROUPE_ROLE$TROUPE_RANK = worker1 ]; then exit 3; fi; "
                "sleep 60'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] run failed: worker 1 on ")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with code 3; mpirun")) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - started, 20s) << r.output;
}

TEST(LaunchMpi, ARankKilledByASignalIsNamed) {
  TempDir cwd("launch_mpi_signal");
  const auto r =
      launchMpi(cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 0 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 137) << r.output;
  EXPECT_TRUE(contains(r.output, "run failed: worker 0 on ")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with code 137 (128 + signal 9, Killed)")) << r.output;
}

// A rank that fails for want of a peer names it on a `troupe-culprit:` line (on its stderr): the
// launcher names the peer first, then the rank that reported it.
TEST(LaunchMpi, APeerBlamedOnACulpritLineIsNamedBeforeTheRankThatFailed) {
  TempDir cwd("launch_mpi_culprit");
  const auto r = launchMpi(
      cwd,
      "-n 1 -s 1 -- bash -c 'if [ $TROUPE_ROLE = server ]; then sleep 60; fi; sleep 0.5; echo "
      "\"troupe-culprit: server 0: no pull answer for step 3 within 1 s (peer_timeout)\" >&2; "
      "exit 1'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] troupe-culprit: server 0: no pull answer"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] run failed: server 0 on ")) << r.output;
  EXPECT_TRUE(contains(r.output,
                       ") is hung or gone: no pull answer for step 3 within 1 s (peer_timeout); "
                       "reported by worker 0, which exited with code 1; mpirun "))
      << r.output;
}

TEST(LaunchMpi, RestartRunsTheJobAgainAsTheNextGeneration) {
  TempDir cwd("launch_mpi_restart");
  const auto r = launchMpi(cwd,
                           "-n 2 -s 1 --on-failure restart --max-restarts 1 -- bash -c 'echo gen "
                           "$TROUPE_GENERATION; if [ $TROUPE_GENERATION$TROUPE_ROLE$TROUPE_RANK = "
                           "0worker1 ]; then exit 3; fi; [ $TROUPE_GENERATION = 1 ] || sleep 60'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] worker 1 on ")) << r.output;
  EXPECT_TRUE(contains(r.output, "restarting every process (1 of 1 restarts)")) << r.output;
  for (const char* line : {"[server 0] gen 1", "[worker 0] gen 1", "[worker 1] gen 1"}) {
    EXPECT_TRUE(contains(r.output, line)) << line << "\n" << r.output;
  }
  EXPECT_TRUE(contains(r.output, "[launcher] all 3 process(es) exited 0")) << r.output;
}

TEST(LaunchMpi, StoppingTheLauncherEndsEveryRank) {
  TempDir cwd("launch_mpi_stop");
  const std::string pids = cwd.str() + "/pids";
  const auto r = runCommand(
      "cd " + cwd.str() + " && { " + troupeBinary() +
      " launch --launcher mpi -n 2 -- bash -c 'sleep 60 & echo $! >> " + pids +
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

}  // namespace
}  // namespace troupe::testing
