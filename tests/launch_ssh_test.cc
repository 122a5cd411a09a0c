// `troupe launch --launcher ssh` against a real sshd on loopback (sshd_util.h).
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "cli_util.h"
#include "sshd_util.h"
#include "transport/interfaces.h"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;

// True once `pid` is gone (or a zombie nobody reaps), polling up to `timeout`.
bool processGone(const std::string& pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::ifstream stat("/proc/" + pid + "/stat");
    std::string text;
    if (!std::getline(stat, text)) return true;
    const auto paren = text.rfind(')');
    if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z') {
      return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
}

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

class LaunchSsh : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { sshd_ = new Sshd(); }
  static void TearDownTestSuite() {
    delete sshd_;
    sshd_ = nullptr;
  }

  // `troupe launch --launcher ssh -H CWD/hosts` run in CWD, `hosts` written first; the key is
  // passed with --ssh-opt flags, or in TROUPE_SSH_OPTS if `env_opts`.
  CommandResult launch(const std::string& hosts, const std::string& args, bool env_opts = false) {
    std::ofstream(cwd_.str() + "/hosts") << hosts;
    const std::string ssh = env_opts ? "" : sshd_->launchFlags() + " ";
    return runCommand("cd " + cwd_.str() + " && " +
                      (env_opts ? "TROUPE_SSH_OPTS='" + sshd_->sshOpts() + "' " : "") +
                      troupeBinary() + " launch --launcher ssh -H " + cwd_.str() + "/hosts " + ssh +
                      args);
  }
  std::string sshdLog() const { return "\nsshd log:\n" + sshd_->log(); }

  static Sshd* sshd_;
  TempDir cwd_{"launch_ssh"};
};

Sshd* LaunchSsh::sshd_ = nullptr;

TEST_F(LaunchSsh, TwoWorkersPrintTheirRoleRankAndRendezvousWithPrefixes) {
  const std::string host = sshd_->host();
  const auto r = launch(host + "\n" + host + "\n",
                        "-n 2 -- bash -c 'echo $TROUPE_ROLE $TROUPE_RANK $TROUPE_RENDEZVOUS'");
  ASSERT_EQ(r.exit_code, 0) << r.output << sshdLog();
  EXPECT_TRUE(contains(r.output, "[worker 0] worker 0 tcp://127.0.0.1:")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] worker 1 tcp://127.0.0.1:")) << r.output;
  EXPECT_FALSE(contains(r.output, "@@troupe")) << "markers must not be relayed\n" << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] all 2 process(es) exited 0")) << r.output;
}

TEST_F(LaunchSsh, ServersEnvTheFolderAndTheStoreAllReachTheRemoteProcess) {
  const auto r = launch(
      "# loopback\n" + sshd_->host() + "\n",
      "-n 1 -s 1 --env 'GREETING=hello  world' --env \"Q=it's\" -- bash -c "
      "'a=${TROUPE_RENDEZVOUS#tcp://}; exec 3<>/dev/tcp/${a%:*}/${a##*:} && "
      "echo \"$TROUPE_ROLE $TROUPE_RANK/$TROUPE_NUM_SERVERS/$TROUPE_NUM_WORKERS [$GREETING] $Q "
      "in $PWD store-reached\"'");
  ASSERT_EQ(r.exit_code, 0) << r.output << sshdLog();
  const std::string tail = " [hello  world] it's in " + cwd_.str() + " store-reached";
  EXPECT_TRUE(contains(r.output, "[server 0] server 0/1/1" + tail)) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] worker 0/1/1" + tail)) << r.output;
}

// The secret reaches the remote process through ssh's stdin: it stands on no command line of
// this host (the launcher's ssh, sshd's session, the remote shell; all on loopback here).
TEST_F(LaunchSsh, TheRunsSecretReachesTheRemoteProcessOffEveryCommandLine) {
  const auto r = launch(sshd_->host() + "\n", "-n 1 -- " + secretCensus());
  ASSERT_EQ(r.exit_code, 0) << r.output << sshdLog();
  EXPECT_TRUE(contains(r.output, "[worker 0] secret of 64 chars on 0 command lines")) << r.output;
}

TEST_F(LaunchSsh, TroupeAsTheFirstWordIsThisTroupeBinary) {
  const auto r = launch(sshd_->host() + "\n", "-n 1 -- troupe --help");
  ASSERT_EQ(r.exit_code, 0) << r.output << sshdLog();
  EXPECT_TRUE(contains(r.output, "[worker 0] ")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] Subcommands:")) << r.output;
}

TEST_F(LaunchSsh, AFailingRemoteProcessIsNamedAndTheOtherOneIsKilledRemotely) {
  const std::string pidfile = cwd_.str() + "/sleep.pid";
  const std::string host = sshd_->host();
  const auto started = std::chrono::steady_clock::now();
  const auto r = launch(host + "\n" + host + "\n",
                        "-n 2 -- bash -c 'if [ $TROUPE_RANK = 1 ]; then sleep 1; exit 3; fi; "
                        "sleep 60 & echo $! > " +
                            pidfile + "; wait'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] worker 1 on " + host + " (remote pid")) << r.output;
  EXPECT_TRUE(contains(r.output, "run failed: worker 1 on " + host + " exited with code 3"))
      << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - started, 20s) << r.output;
  const std::string pid = readFile(pidfile);
  ASSERT_FALSE(pid.empty()) << "worker 0 never started its sleep\n" << r.output;
  EXPECT_TRUE(processGone(pid, 3s)) << "remote sleep " << pid << " outlived the launcher";
}

// A process that fails for want of a peer names it on a `troupe-culprit:` line: the launcher
// names the peer first. The peer here is stopped: the remote SIGTERM comes with a SIGCONT, so it
// goes at once rather than at the SIGKILL after the 5 s grace period.
TEST_F(LaunchSsh, APeerBlamedOnACulpritLineIsNamedFirstAndAStoppedOneIsStoppedForGood) {
  const std::string pidfile = cwd_.str() + "/server.pid";
  const std::string host = sshd_->host();
  const auto started = std::chrono::steady_clock::now();
  const auto r = launch(
      host + "\n", "-n 1 -s 1 -- bash -c 'if [ $TROUPE_ROLE = server ]; then echo $$ > " + pidfile +
                       "; kill -STOP $$; exit 0; fi; until [ -s " + pidfile +
                       " ]; do sleep 0.05; done; sleep 0.3; echo \"troupe-culprit: server "
                       "0: no pull answer for step 3 within 1 s (peer_timeout)\" >&2; exit 1'");
  const auto elapsed = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(r.exit_code, 1) << r.output << sshdLog();
  EXPECT_TRUE(contains(r.output, "[launcher] run failed: server 0 on " + host + " (remote pid "))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       ") is hung or gone: no pull answer for step 3 within 1 s (peer_timeout); "
                       "reported by worker 0, which exited with code 1\n"))
      << r.output;
  const std::string pid = readFile(pidfile);
  ASSERT_FALSE(pid.empty()) << r.output;
  EXPECT_TRUE(processGone(pid, 0s)) << "the stopped server " << pid << " outlived the launcher";
  EXPECT_LT(elapsed, 4500ms) << "the stopped server went only at SIGKILL\n" << r.output;
}

TEST_F(LaunchSsh, RestartStopsTheRemoteProcessesAndStartsThemAllAgain) {
  const std::string pidfile = cwd_.str() + "/sleep.pid";
  const std::string host = sshd_->host();
  const auto r =
      launch(host + "\n" + host + "\n",
             "-n 2 --on-failure restart -- bash -c 'echo gen $TROUPE_GENERATION; "
             "if [ $TROUPE_GENERATION != 0 ]; then exit 0; fi; "
             "if [ $TROUPE_RANK = 1 ]; then sleep 1; kill -9 $$; fi; sleep 60 & echo $! > " +
                 pidfile + "; wait'");
  ASSERT_EQ(r.exit_code, 0) << r.output << sshdLog();
  EXPECT_TRUE(contains(r.output, "worker 1 on " + host)) << r.output;
  EXPECT_TRUE(contains(r.output, "restarting every process (1 of 3 restarts)")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] gen 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 1] gen 1")) << r.output;
  const std::string pid = readFile(pidfile);
  ASSERT_FALSE(pid.empty()) << "worker 0 never started its sleep\n" << r.output;
  EXPECT_TRUE(processGone(pid, 3s)) << "generation 0's remote sleep " << pid << " outlived it";
}

TEST_F(LaunchSsh, AnUnreachableHostIsNamedWithRoleRankAndSshExitCode) {
  const std::string closed = "127.0.0.1:" + std::to_string(freeLoopbackPort());
  const auto started = std::chrono::steady_clock::now();
  const auto r = launch(sshd_->host() + "\n" + closed + "\n", "-n 2 -- sleep 60");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "worker 1 on " + closed +
                                     " could not be reached or started: ssh exited with code 255"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "run failed: worker 1 on " + closed)) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - started, 20s) << r.output;
}

TEST_F(LaunchSsh, SyncDstDirCopiesTheFolderAndRunsThereWithOptionsFromTheEnvironment) {
  std::ofstream(cwd_.str() + "/data.txt") << "synced content\n";
  TempDir dst("launch_ssh_dst");
  const std::string dir = dst.str() + "/deeper/run";
  const auto r =
      launch(sshd_->host() + "\n", "-n 1 --sync-dst-dir " + dir + " -- bash -c 'cat data.txt; pwd'",
             /*env_opts=*/true);
  ASSERT_EQ(r.exit_code, 0) << r.output << sshdLog();
  EXPECT_TRUE(contains(r.output, "[worker 0] synced content")) << r.output;
  EXPECT_TRUE(contains(r.output, "[worker 0] " + dir + "\n")) << r.output;
}

TEST_F(LaunchSsh, StoppingTheLauncherStopsTheRemoteProcesses) {
  const std::string pidfile = cwd_.str() + "/sleep.pid";
  std::ofstream(cwd_.str() + "/hosts") << sshd_->host() << "\n";
  const auto r = runCommand("cd " + cwd_.str() + " && { " + troupeBinary() +
                            " launch --launcher ssh -H hosts " + sshd_->launchFlags() +
                            " -n 1 -- bash -c 'sleep 60 & echo $! > " + pidfile +
                            "; wait' & L=$!; for i in $(seq 100); do [ -s " + pidfile +
                            " ] && break; sleep 0.1; done; kill -TERM $L; wait $L; "
                            "echo launcher exit $?; }");
  EXPECT_TRUE(contains(r.output, "launcher exit 143")) << r.output;
  EXPECT_TRUE(contains(r.output, "got signal 15")) << r.output;
  const std::string pid = readFile(pidfile);
  ASSERT_FALSE(pid.empty()) << r.output;
  EXPECT_TRUE(processGone(pid, 3s)) << "remote sleep " << pid << " outlived the launcher";
}

// This host's first non-loopback IPv4 address: sshd listens on loopback only, so ssh to it is
// refused at once.
std::string ownAddress() {
  for (const auto& i : transport::listInterfaces()) {
    if (!i.ipv4.empty() && i.ipv4.rfind("127.", 0) != 0) return i.ipv4;
  }
  return "";
}

TEST_F(LaunchSsh, TheStoreListensOnTheAddressTheRouteToTheFirstRemoteHostLeavesFrom) {
  const std::string own = ownAddress();
  ASSERT_FALSE(own.empty()) << "this test needs a non-loopback IPv4 interface";
  const auto r =
      launch("localhost\n" + own + ":" + std::to_string(sshd_->port()) + "\n", "-n 1 -- true");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "rendezvous tcp://" + own + ":")) << r.output;
}

TEST_F(LaunchSsh, TheInterfaceFlagPicksTheStoreAddressAndAnUnknownOneIsNamed) {
  const std::string own = ownAddress();
  ASSERT_FALSE(own.empty()) << "this test needs a non-loopback IPv4 interface";
  const std::string hosts = own + ":" + std::to_string(sshd_->port()) + "\n";
  const auto lo = launch(hosts, "--interface lo -n 1 -- true");
  EXPECT_TRUE(contains(lo.output, "rendezvous tcp://127.0.0.1:")) << lo.output;
  const auto bad = launch(hosts, "--interface no-such-nic0 -n 1 -- true");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(contains(bad.output, "unknown network interface 'no-such-nic0'")) << bad.output;
}

}  // namespace
}  // namespace troupe::testing
