// `troupe launch --launcher mpi` with Debian's Open MPI mpirun on this host.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "cli_util.h"
#include "launch_util.h"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

CommandResult launchMpi(const TempDir& cwd, const std::string& args) {
  return runCommand("cd " + cwd.str() + " && " + troupeBinary() + " launch --launcher mpi " + args);
}

TEST(LaunchMpi, TwoWorkersPrintTheirRoleAndRankWithPrefixes) {
  TempDir cwd("launch_mpi_two");
  const auto r = launchMpi(cwd, "-n 2 -- bash -c 'echo $TROUPE_ROLE $TROUPE_RANK'");
  EXPECT_TRUE(exitedWith(
      r, 0,
      {"[worker 0] worker 0\n", "[worker 1] worker 1\n", "[launcher] all 2 process(es) exited 0"}));
  EXPECT_FALSE(contains(r.output, "@@troupe")) << r.output;
}

// mpirun gets the values in its environment and `-x NAME` only: the secret (and the rest)
// stands on no command line.
TEST(LaunchMpi, TheRunsSecretReachesEveryRankOffEveryCommandLine) {
  TempDir cwd("launch_mpi_secret");
  EXPECT_TRUE(keptTheSecretOffCommandLines(launchMpi(cwd, "-n 2 -- " + secretCensus()), 2));
}

TEST(LaunchMpi, LowRanksAreServersAndEveryProcessGetsTheEnvironment) {
  TempDir cwd("launch_mpi_roles");
  std::ofstream(cwd.str() + "/hosts") << "localhost\nlocalhost # twice\n";
  const auto r = launchMpi(cwd,
                           "-H hosts -n 2 -s 1 --env 'B=x y' -- bash -c 'echo $TROUPE_ROLE "
                           "$TROUPE_RANK $TROUPE_NUM_WORKERS/$TROUPE_NUM_SERVERS [$B] "
                           "${TROUPE_RENDEZVOUS%:*} $TROUPE_RUN_ID'");
  EXPECT_TRUE(exitedWith(r, 0,
                         {"[server 0] server 0 2/1 [x y] tcp://127.0.0.1 run-",
                          "[worker 0] worker 0 2/1 [x y] tcp://127.0.0.1 run-",
                          "[worker 1] worker 1 2/1 [x y] tcp://127.0.0.1 run-"}));
}

// A torchrun script runs as it is under mpirun: RANK, LOCAL_RANK, LOCAL_WORLD_SIZE from Open MPI's
// variables, MASTER_ADDR and a free MASTER_PORT of this host (no hostfile: every rank here).
TEST(LaunchMpi, ATorchrunScriptRunsUnchanged) {
  TempDir cwd("launch_mpi_torchrun");
  EXPECT_TRUE(ranTheTorchrunScript(launchMpi(cwd, "-n 2 -- " + torchrunScript()),
                                   {"local 0 of 2, group -", "local 1 of 2, group -"}));
}

// mpirun tags each write of a rank: a line written in two parts with another rank's line between
// them came out as "[1,0]<stdout>:start[1,1]<stdout>:other" and then "[1,0]<stdout>: end". The
// launcher puts each rank's line back together.
TEST(LaunchMpi, ALineWrittenInPartsAroundAnotherRanksLineIsOneLine) {
  TempDir cwd("launch_mpi_parts");
  const auto r = launchMpi(cwd,
                           "-n 2 -- sh -c 'if [ $TROUPE_RANK = 0 ]; then printf start; sleep 1; "
                           "echo \" end\"; else sleep 0.5; echo other; fi'");
  EXPECT_TRUE(exitedWith(r, 0, {"[worker 0] start end\n", "[worker 1] other\n"}));
}

TEST(LaunchMpi, AFailingRankIsNamedAndTheJobEnds) {
  TempDir cwd("launch_mpi_fail");
  const auto r =
      launchMpi(cwd,
                "-n 2 -s 1 -- bash -c 'if [ $TROUPE_ROLE$TROUPE_RANK = worker1 ]; then exit 3; fi; "
                "sleep 60'");
  EXPECT_TRUE(
      exitedWith(r, 3, {"[launcher] run failed: worker 1 on ", "exited with code 3; mpirun"}));
  EXPECT_LT(r.elapsed, 20s) << r.output;
}

TEST(LaunchMpi, ARankKilledByASignalIsNamed) {
  TempDir cwd("launch_mpi_signal");
  const auto r =
      launchMpi(cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 0 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_TRUE(exitedWith(
      r, 137, {"run failed: worker 0 on ", "exited with code 137 (128 + signal 9, Killed)"}));
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
  EXPECT_TRUE(exitedWith(
      r, 1,
      {"[worker 0] troupe-culprit: server 0: no pull answer", "[launcher] run failed: server 0 on ",
       ") is hung or gone: no pull answer for step 3 within 1 s "
       "(peer_timeout); reported by worker 0, which exited with code 1; "
       "mpirun "}));
}

TEST(LaunchMpi, RestartRunsTheJobAgainAsTheNextGeneration) {
  TempDir cwd("launch_mpi_restart");
  const auto r = launchMpi(cwd,
                           "-n 2 -s 1 --on-failure restart --max-restarts 1 -- bash -c 'echo gen "
                           "$TROUPE_GENERATION; if [ $TROUPE_GENERATION$TROUPE_ROLE$TROUPE_RANK = "
                           "0worker1 ]; then exit 3; fi; [ $TROUPE_GENERATION = 1 ] || sleep 60'");
  EXPECT_TRUE(exitedWith(
      r, 0,
      {"[launcher] worker 1 on ", "restarting every process (1 of 1 restarts)", "[server 0] gen 1",
       "[worker 0] gen 1", "[worker 1] gen 1", "[launcher] all 3 process(es) exited 0"}));
}

TEST(LaunchMpi, StoppingTheLauncherEndsEveryRank) {
  TempDir cwd("launch_mpi_stop");
  EXPECT_TRUE(
      stoppingTheLauncherEndsEveryProcess(cwd, troupeBinary() + " launch --launcher mpi", 2));
}

// Open MPI gives the ranks on mpirun's own host a terminal; the lines the launcher relays still
// carry no colour codes (troupe's logger colours only outside a launched run).
TEST(LaunchMpi, RelayedLogLinesCarryNoColourCodesThoughTheRankWritesToATerminal) {
  TempDir cwd("launch_mpi_colour");
  const auto r =
      runCommand("cd " + cwd.str() + " && TERM=xterm " + troupeBinary() +
                 " launch --launcher mpi -n 1 -- " + troupeBinary() + " train missing.toml");
  EXPECT_TRUE(exitedWith(r, 1, {"] [error] config file 'missing.toml' does not exist"}));
  EXPECT_FALSE(contains(r.output, "\x1b[")) << r.output;
}

}  // namespace
}  // namespace troupe::testing
