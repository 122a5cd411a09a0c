// `troupe launch --launcher local`, and the launcher's hostfile and quoting helpers, in-process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "apps/launcher.h"
#include "cli_util.h"
#include "launch_util.h"
#include "troupe/error.h"

namespace troupe::testing {
namespace {

using namespace std::chrono_literals;
using apps::readHostfile;
using apps::shellQuote;

std::string launchIn(const TempDir& dir, const std::string& args) {
  return "cd " + dir.str() + " && " + troupeBinary() + " launch " + args;
}

TEST(LaunchLocal, ServersComeFirstThenWorkersEachWithItsRoleAndRank) {
  TempDir cwd("launch_local_roles");
  const auto r = runCommand(launchIn(cwd,
                                     "-n 2 -s 2 -- bash -c 'echo $TROUPE_ROLE $TROUPE_RANK of "
                                     "$TROUPE_NUM_WORKERS/$TROUPE_NUM_SERVERS $TROUPE_RUN_ID'"));
  EXPECT_TRUE(exitedWith(r, 0,
                         {"[server 0] server 0 of 2/2 run-", "[server 1] server 1 of 2/2 run-",
                          "[worker 0] worker 0 of 2/2 run-", "[worker 1] worker 1 of 2/2 run-",
                          "[launcher] all 4 process(es) exited 0"}));
}

TEST(LaunchLocal, EveryEnvFlagReachesEveryProcessWithItsSpaces) {
  TempDir cwd("launch_local_env");
  const auto r = runCommand(
      launchIn(cwd, "-n 1 -s 1 --env A=1 --env 'B=x y=z' -- bash -c 'echo \"[$A] [$B]\"'"));
  EXPECT_TRUE(exitedWith(r, 0, {"[server 0] [1] [x y=z]", "[worker 0] [1] [x y=z]"}));
}

// --dry-run, as the README promised for "a command": what would start, nothing started.
TEST(LaunchLocal, ADryRunSaysWhatWouldStartAndStartsNothing) {
  TempDir cwd("launch_dry_run");
  const auto r = runCommand(launchIn(cwd, "-n 2 -s 1 --dry-run -- touch started"));
  EXPECT_TRUE(exitedWith(
      r, 0,
      {"# troupe launch --dry-run: nothing starts", "launcher     local",
       "rendezvous   an embedded store this launcher serves on 127.0.0.1",
       "command      touch started",
       "process      server 0 on localhost: TROUPE_LOCAL_SIZE=3 TROUPE_ROLE=server TROUPE_RANK=0",
       "process      worker 1 on localhost: TROUPE_LOCAL_SIZE=3 TROUPE_ROLE=worker "
       "TROUPE_RANK=1"}));
  EXPECT_FALSE(std::filesystem::exists(cwd.path() / "started")) << "a process started";
}

// torchrun's variables: every worker's RANK, WORLD_SIZE, LOCAL_RANK, ... (the servers are no ranks
// of torch.distributed), what --env gives kept.
TEST(LaunchLocal, EveryWorkerGetsTorchrunsVariables) {
  TempDir cwd("launch_torchrun_vars");
  auto r = runCommand(launchIn(cwd, "-n 3 -s 1 --master_port 29555 --dry-run -- true"));
  ASSERT_TRUE(
      exitedWith(r, 0,
                 {"TROUPE_ROLE=worker TROUPE_RANK=2 TROUPE_NUM_WORKERS=3 TROUPE_NUM_SERVERS=1 "
                  "TROUPE_GENERATION=0 RANK=2 WORLD_SIZE=3 LOCAL_RANK=2 LOCAL_WORLD_SIZE=3 "
                  "GROUP_RANK=0 GROUP_WORLD_SIZE=1 ROLE_NAME=default ROLE_RANK=2 "
                  "ROLE_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 "
                  "TORCHELASTIC_RUN_ID=(made up at start) TORCHELASTIC_RESTART_COUNT=0 "
                  "TORCHELASTIC_MAX_RESTARTS=0"}));
  const std::regex server(R"(process +server 0 on localhost:[^\n]*\bRANK=)");
  EXPECT_FALSE(std::regex_search(r.output, server)) << r.output;
  // Over ssh: LOCAL_* count the workers of each host, GROUP_RANK numbers the hosts, MASTER_ADDR
  // is worker 0's and MASTER_PORT torchrun's default.
  std::ofstream(cwd.path() / "hosts.txt") << "localhost\n127.0.0.1:2222\n";
  r = runCommand(launchIn(cwd, "-n 3 -H hosts.txt --env MASTER_PORT=1234 --dry-run -- true"));
  EXPECT_TRUE(exitedWith(
      r, 0,
      {"worker 1 on 127.0.0.1:2222: TROUPE_LOCAL_SIZE=1 TROUPE_ROLE=worker TROUPE_RANK=1 "
       "TROUPE_NUM_WORKERS=3 TROUPE_NUM_SERVERS=0 TROUPE_GENERATION=0 RANK=1 WORLD_SIZE=3 "
       "LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GROUP_RANK=1 GROUP_WORLD_SIZE=2 ROLE_NAME=default "
       "ROLE_RANK=1 ROLE_WORLD_SIZE=3 MASTER_ADDR=localhost TORCHELASTIC",
       "worker 2 on localhost: TROUPE_LOCAL_SIZE=2 TROUPE_ROLE=worker TROUPE_RANK=2 "
       "TROUPE_NUM_WORKERS=3 TROUPE_NUM_SERVERS=0 TROUPE_GENERATION=0 RANK=2 WORLD_SIZE=3 "
       "LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 GROUP_RANK=0",
       "MASTER_PORT=1234 (every process)"}));
}

// A script written for torchrun runs under troupe launch as it is: torch.distributed's env://
// rendezvous on gloo (Debian's python3-torch, scripts/setup.sh), an allreduce over 3 ranks.
TEST(LaunchLocal, ATorchrunScriptRunsUnchanged) {
  TempDir cwd("launch_torchrun_script");
  EXPECT_TRUE(ranTheTorchrunScript(
      runCommand(launchIn(cwd, "-n 3 -- " + torchrunScript())),
      {"local 0 of 3, group 0", "local 1 of 3, group 0", "local 2 of 3, group 0"}));
}

// -H meant ssh in MXNet's launch.py: with a hostfile and no --launcher, troupe launches over ssh
// (it ran every process locally and exited 0); --launcher local with -H is refused.
TEST(LaunchLocal, AHostfileWithoutALauncherMeansSshAndWithTheLocalLauncherIsRefused) {
  TempDir cwd("launch_hostfile_ssh");
  std::ofstream(cwd.path() / "hosts.txt") << "localhost\n127.0.0.1:2222\n";
  const auto ssh = runCommand(launchIn(cwd, "-n 2 -H hosts.txt --dry-run -- true"));
  EXPECT_TRUE(exitedWith(ssh, 0,
                         {"launcher     ssh over 2 host line(s) of hosts.txt",
                          "process      worker 1 on 127.0.0.1:2222: "}));
  const auto local = runCommand(launchIn(cwd, "-n 2 -H hosts.txt --launcher local -- true"));
  EXPECT_TRUE(exitedWith(
      local, 1, {"-H names other hosts, but --launcher local starts every process on this one"}));
}

// --interface was ignored by the local launcher: every launcher gives it to its processes.
TEST(LaunchLocal, TheInterfaceReachesEveryProcess) {
  TempDir cwd("launch_interface");
  const auto r =
      runCommand(launchIn(cwd, "-n 1 -s 1 --interface lo -- sh -c 'echo if=$TROUPE_INTERFACE'"));
  EXPECT_TRUE(exitedWith(r, 0, {"[server 0] if=lo", "[worker 0] if=lo"}));
}

TEST(LaunchLocal, AFailingProcessIsNamedAndTheOthersAreStopped) {
  TempDir cwd("launch_local_fail");
  const auto started = std::chrono::steady_clock::now();
  const auto r = runCommand(
      launchIn(cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 1 ]; then exit 3; fi; sleep 60'"));
  EXPECT_TRUE(exitedWith(r, 3,
                         {"[launcher] worker 1 on localhost (pid",
                          "run failed: worker 1 on localhost exited with code 3"}));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(20));
}

// A process that loses a peer may exit before the peer's death is reaped; a death by a signal
// shortly after another failure is named as the cause.
TEST(LaunchLocal, ASignalDeathJustAfterAnotherFailureIsNamedAsTheCause) {
  TempDir cwd("launch_local_cause");
  const auto r = runCommand(launchIn(
      cwd, "-n 2 -- bash -c 'if [ $TROUPE_RANK = 0 ]; then exit 1; fi; sleep 0.05; kill -9 $$'"));
  EXPECT_TRUE(exitedWith(r, 137, {"run failed: worker 1 on localhost was killed by signal 9"}));
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
  ASSERT_TRUE(
      exitedWith(r, 0,
                 {"[worker 1] gen 0 rr tcp://",
                  "[launcher] worker 1 on localhost was killed by signal 9 "
                  "(Killed); restarting every process (1 of 3 restarts)",
                  "[launcher] run rr (restart 1 of 3): 2 worker(s)", "[worker 0] gen 1 rr tcp://",
                  "[worker 1] gen 1 rr tcp://", "[launcher] all 2 process(es) exited 0"}));
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
  EXPECT_TRUE(exitedWith(r, 5,
                         {"exited with code 3; restarting every process (1 of 2 restarts)",
                          "exited with code 4; restarting every process (2 of 2 restarts)",
                          "[launcher] run failed: worker 1 on localhost exited with code 5; "
                          "giving up after 2 restart(s) (--max-restarts 2)"}));
}

// torchrun's elastic model for a script written for it (tests/torchrun_elastic.py, which resumes
// from its checkpoint): 3 workers; one killed -9, the other 2 restart as a world of 2 from the
// checkpoint; a second launcher joins with one worker, and all 3 restart as a world of 3. The
// script checks each step that the world's allreduce makes its size, and counts the steps of
// each world: every step is done once.
TEST(LaunchLocal, AnElasticTorchrunScriptLosesAKilledRankAndTakesOneThatJoins) {
  TempDir cwd("launch_local_elastic_torchrun");
  const std::string id = "et" + std::to_string(::getpid());
  const std::string script =
      "/usr/bin/python3 " + sourceDir() +
      "/tests/torchrun_elastic.py --steps 80 --step-seconds 0.05 --ckpt ck.json";
  const auto r = runCommand(
      "cd " + cwd.str() + " && T=" + troupeBinary() + " && " +
      R"sh(wait_for() { for i in $(seq 3000); do grep -q "$2" "$1" && return 0; sleep 0.02; done; echo "never saw '$2' in $1"; cat "$1"; exit 1; }
echo elastic-test-secret-0123456789abcdef > secret
$T launch -n 3 --elastic 2:3 --secret-file secret --run_id )sh" +
      id + " -- " + script + R"sh( > launch.out 2>&1 &
L=$!
wait_for launch.out '\] step 10$'
kill -9 $(grep -o 'rank 2 of 3 pid [0-9]*' launch.out | cut -d' ' -f6) && echo killed rank 2
wait_for launch.out 'start: restart 1, 2 ranks'
wait_for launch.out '\] step 30$'
R=$(grep -o 'rendezvous tcp://[0-9.:]*' launch.out | head -1 | cut -d' ' -f2)
$T launch -n 1 --elastic 2:3 --secret-file secret --rendezvous $R --run_id )sh" +
      id + " -- " + script + R"sh( > joiner.out 2>&1
echo joiner exit $?
wait $L
echo launcher exit $?
cat launch.out; echo ---; cat joiner.out)sh");
  EXPECT_TRUE(exitedWith(
      r, 0,
      {"killed rank 2", "joiner exit 0", "launcher exit 0",
       "[launcher] worker 2 on localhost was killed by signal 9 (Killed); restarting every "
       "worker without it (restart 1 of 3)",
       "[launcher] generation 1: 2 worker(s) in all, this launcher's ranks 0 to 1",
       "[launcher] launcher 1 on ", "[launcher] generation 2: 3 worker(s) in all",
       "[worker 0] start: restart 1, 3 ranks", "[worker 2] rank 2 of 3 pid",
       "this launcher's rank 2; MASTER_ADDR 127.0.0.1",
       "[launcher] the elastic run is over: every worker of generation 2 exited 0"}));
  std::smatch m;
  const std::regex done(
      R"(done: (\d+) step\(s\) of 3, (\d+) step\(s\) of 2, (\d+) step\(s\) of 3)");
  ASSERT_TRUE(std::regex_search(r.output, m, done)) << r.output;
  EXPECT_EQ(std::stoi(m[1]) + std::stoi(m[2]) + std::stoi(m[3]), 80) << m[0];
  // The pair came back at step 10 or a step or two later (the kill follows rank 0's "step 10" at
  // once) and reached step 30 before the joiner was started.
  EXPECT_GE(std::stoi(m[2]), 15) << m[0];
}

// Which elastic model a command gets: troupe train's own, also through a wrapper that says
// `troupe train`, re-forms in its processes; anything else (a torchrun script) torchrun's.
TEST(LaunchLocal, AnElasticRunOfTroupeTrainReformsAndOfAnythingElseRestarts) {
  TempDir cwd("launch_local_elastic_model");
  const std::string in_process = "workers: a failed one is left out, a joiner is let in";
  const std::string torchrun = "workers, torchrun's model";
  for (const auto& [command, model] : std::vector<std::pair<std::string, std::string>>{
           {"troupe train --model mlp", in_process},
           {troupeBinary() + " train --model mlp", in_process},
           {"bash -c 'echo on $(hostname); exec troupe train --model mlp'", in_process},
           {"python3 train.py", torchrun},
           {"bash -c 'exec python3 train.py --troupe'", torchrun}}) {
    const auto r = runCommand(launchIn(cwd, "--dry-run -n 2 --elastic 2:3 -- " + command));
    EXPECT_TRUE(exitedWith(r, 0, {"elastic      2:3 " + model})) << command;
  }
}

// A launcher that asks to join a run that has its --elastic MAX already is told so and exits 1; the
// run goes on.
TEST(LaunchLocal, ALauncherJoiningAFullElasticRunIsRefusedNamingTheLimit) {
  TempDir cwd("launch_local_elastic_full");
  const std::string id = "ef" + std::to_string(::getpid());
  const auto r = runCommand("cd " + cwd.str() + " && T=" + troupeBinary() + " && " +
                            R"sh(echo elastic-test-secret-0123456789abcdef > secret
$T launch -n 2 --elastic 1:2 --secret-file secret --run_id )sh" +
                            id + R"sh( -- sleep 30 > launch.out 2>&1 &
L=$!
for i in $(seq 500); do grep -q 'generation 0' launch.out && break; sleep 0.02; done
R=$(grep -o 'rendezvous tcp://[0-9.:]*' launch.out | head -1 | cut -d' ' -f2)
$T launch -n 1 --elastic 1:2 --secret-file secret --rendezvous $R --run_id )sh" +
                            id + R"sh( -- sleep 30 2>&1
echo joiner exit $?
kill -0 $L && echo the run goes on
kill $L)sh");
  EXPECT_TRUE(exitedWith(r, 0,
                         {"[launcher] launcher 1 is refused: the run has 2 worker(s) and takes at "
                          "most 2 (--elastic 1:2)",
                          "joiner exit 1", "the run goes on"}));
}

// Links use abstract Unix sockets (transport/link.h): no run makes a folder in /tmp, and the
// launcher removes none, least of all one that another user planted under the run's name.
TEST(LaunchLocal, AFolderPlantedUnderTheRunsNameIsNeitherUsedNorRemoved) {
  TempDir cwd("launch_local_sockets");
  const std::string id = "sockets" + std::to_string(::getpid());
  const std::string planted = "/tmp/troupe-" + id;
  std::filesystem::create_directories(planted + "/node0.sock");
  const auto r = runCommand(launchIn(cwd, "-n 2 --run_id " + id + " -- true"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::is_directory(planted + "/node0.sock"));
  std::filesystem::remove_all(planted);
}

// The pids in `path`, one a line, once it holds `count` of them (empty after `timeout`).
std::vector<pid_t> waitForPids(const std::string& path, std::size_t count,
                               std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<pid_t> pids;
    std::ifstream in(path);
    for (long pid; in >> pid;)
      pids.push_back(static_cast<pid_t>(pid));
    if (pids.size() >= count) return pids;
    if (std::chrono::steady_clock::now() >= deadline) return {};
    std::this_thread::sleep_for(20ms);
  }
}

// True once every pid in `pids` is reaped (kill(pid, 0) fails with ESRCH: not even a zombie),
// polling up to `timeout`.
bool allReaped(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool all = true;
    for (const pid_t pid : pids)
      all = all && ::kill(pid, 0) != 0 && errno == ESRCH;
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
}

// `troupe launch ARGS` run in `cwd` with its stdout into a pipe that nobody reads until
// readToEnd(); its stderr goes into the same pipe, or, given `close_stdout`, into a pipe of its
// own while the stdout pipe's read end is closed at once (its reader is gone).
class UnreadLauncher {
 public:
  UnreadLauncher(const TempDir& cwd, const std::string& args, bool close_stdout = false) {
    const std::string command =
        "cd " + cwd.str() + " && exec " + troupeBinary() + " launch " + args;
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(close_stdout ? err[1] : out[1], STDERR_FILENO);
      ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    if (close_stdout) {
      ::close(out[0]);
      read_ = err[0];
    } else {
      ::close(err[0]);
      read_ = out[0];
    }
  }
  ~UnreadLauncher() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (read_ >= 0) ::close(read_);
  }
  UnreadLauncher(const UnreadLauncher&) = delete;
  UnreadLauncher& operator=(const UnreadLauncher&) = delete;

  // Reads the pipe to its end, then waits for the launcher; gives up (killing it) after
  // `timeout`, with exit code -1.
  CommandResult readToEnd(std::chrono::milliseconds timeout) {
    CommandResult r;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (read_ >= 0 && std::chrono::steady_clock::now() < deadline) {
      pollfd fd{read_, POLLIN, 0};
      if (::poll(&fd, 1, 100) <= 0) continue;
      char buf[65536];
      const ssize_t n = ::read(read_, buf, sizeof buf);
      if (n > 0) {
        r.output.append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(read_);
        read_ = -1;
      }
    }
    while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else {
        std::this_thread::sleep_for(20ms);
      }
    }
    return r;
  }

 private:
  pid_t pid_ = -1;
  int read_ = -1;
};

// Two processes print about 5 MB each into a launcher whose own output nobody reads: it keeps
// relaying into a bounded queue, drops what does not fit, reaps both, and once read says how
// many lines it dropped.
TEST(LaunchLocal, ALauncherWhoseOutputIsNotReadStillReapsItsProcessesAndCountsWhatItDropped) {
  TempDir cwd("launch_local_unread");
  const std::string pids = cwd.str() + "/pids";
  UnreadLauncher launcher(cwd, "-n 2 -- sh -c 'echo $$ >> " + pids + "; seq 300000; exit 0'");
  const auto children = waitForPids(pids, 2, 20s);
  ASSERT_EQ(children.size(), 2u) << "the processes did not start";
  EXPECT_TRUE(allReaped(children, 20s)) << "the processes were not reaped while nobody read";
  const auto r = launcher.readToEnd(30s);
  EXPECT_EQ(r.exit_code, 0) << r.output.substr(r.output.size() -
                                               std::min<std::size_t>(r.output.size(), 2000));
  EXPECT_TRUE(contains(r.output, " lines dropped: the launcher's output was not read for "));
  EXPECT_TRUE(contains(r.output, "[launcher] all 2 process(es) exited 0"));
  EXPECT_TRUE(contains(r.output, "[worker 0] 1\n"));
}

// The same with a process that fails: the other one is stopped and both are reaped while nobody
// reads, and the exit code is the failing one's.
TEST(LaunchLocal, AFailureWhileTheLaunchersOutputIsNotReadStillStopsTheOthersAndExitsWithItsCode) {
  TempDir cwd("launch_local_unread_fail");
  const std::string pids = cwd.str() + "/pids";
  UnreadLauncher launcher(cwd, "-n 2 -- sh -c 'echo $$ >> " + pids +
                                   "; seq 300000; if [ $TROUPE_RANK = 1 ]; then exit 3; fi; "
                                   "exec sleep 60'");
  const auto children = waitForPids(pids, 2, 20s);
  ASSERT_EQ(children.size(), 2u) << "the processes did not start";
  EXPECT_TRUE(allReaped(children, 20s)) << "the processes were not reaped while nobody read";
  const auto r = launcher.readToEnd(30s);
  const std::string tail =
      r.output.substr(r.output.size() - std::min<std::size_t>(r.output.size(), 2000));
  EXPECT_EQ(r.exit_code, 3) << tail;
  EXPECT_TRUE(contains(r.output, " lines dropped: the launcher's output was not read for "))
      << tail;
  EXPECT_TRUE(contains(r.output, "[launcher] run failed: worker 1 on localhost exited with code 3"))
      << tail;
}

// The reader of the launcher's stdout goes away (`troupe launch ... | head -1`): no SIGPIPE
// ends the launcher; it goes on supervising, says on stderr what it could not write, and exits
// with the run's code.
TEST(LaunchLocal, ALauncherWhoseStdoutReaderIsGoneGoesOnAndExitsWithTheRunsCode) {
  TempDir cwd("launch_local_stdout_gone");
  UnreadLauncher launcher(cwd, "-n 1 -- sh -c 'seq 1000; exit 4'", /*close_stdout=*/true);
  const auto r = launcher.readToEnd(30s);
  EXPECT_TRUE(exitedWith(r, 4,
                         {"[launcher] run failed: worker 0 on localhost exited with code 4",
                          " lines dropped: the launcher's stdout could not be written"}));
}

// A process that fails for want of a peer names it on a `troupe-culprit:` line; the launcher
// names that peer first, finds it stopped, and stops it too: SIGTERM alone waits for a SIGCONT,
// so without one it would go only at SIGKILL, after the 5 s grace period.
TEST(LaunchLocal, AStoppedPeerNamedByTheProcessThatFailedIsBlamedAsStoppedAndStoppedForGood) {
  TempDir cwd("launch_local_culprit");
  const std::string pidfile = cwd.str() + "/server.pid";
  const auto started = std::chrono::steady_clock::now();
  const auto r = runCommand(launchIn(
      cwd, "-n 1 -s 1 -- sh -c 'if [ $TROUPE_ROLE = server ]; then echo $$ > " + pidfile +
               "; kill -STOP $$; exec sleep 60; fi; until grep -q \"^State:.*T\" "
               "/proc/$(cat " +
               pidfile +
               " 2>/dev/null)/status 2>/dev/null; do sleep 0.05; done; echo \"troupe-culprit: "
               "server 0: no pull answer for step 12 within 60 s (peer_timeout)\" >&2; exit 1'"));
  const auto elapsed = std::chrono::steady_clock::now() - started;
  const auto server = waitForPids(pidfile, 1, 0ms);
  ASSERT_EQ(server.size(), 1u) << r.output;
  EXPECT_TRUE(
      exitedWith(r, 1,
                 {"[worker 0] troupe-culprit: server 0: no pull answer",
                  "[launcher] run failed: server 0 on localhost (pid " + std::to_string(server[0]) +
                      ") is stopped (SIGSTOP or a stopped terminal): no pull answer for "
                      "step 12 within 60 s (peer_timeout); reported by worker 0, which "
                      "exited with code 1\n"}));
  EXPECT_TRUE(allReaped(server, 0ms)) << "the stopped server outlived the launcher";
  EXPECT_LT(elapsed, 4500ms) << "the stopped server went only at SIGKILL\n" << r.output;
}

// A process that fails on its own logs why; the peers that lose it then fail naming it on their
// culprit lines. The launcher names the first cause, with its error, whichever was reaped first.
TEST(LaunchLocal, APeerThatFailedOnItsOwnIsNamedWithItsOwnErrorNotWithTheLostLink) {
  TempDir cwd("launch_local_own_error");
  const std::string marker = cwd.str() + "/server-failed";
  const auto r = runCommand(launchIn(
      cwd,
      "-n 2 -s 1 -- sh -c 'if [ $TROUPE_ROLE = server ]; then sleep 0.2; echo "
      "\"troupe-culprit: worker 1: lost the link (peer closed the connection)\" >&2; touch " +
          marker +
          "; exit 1; fi; if [ $TROUPE_RANK = 1 ]; then echo \"[2026-11-25 06:56:04.921] "
          "[error] training diverged: the loss of step 62 (epoch 1) is -nan\" >&2; until [ "
          "-e " +
          marker + " ]; do sleep 0.01; done; exit 2; fi; exec sleep 30'"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[launcher\] run failed: worker 1 on localhost \(pid [0-9]+\) )"
                           R"(exited with code 2: training diverged: the loss of step 62 )")))
      << r.output;
  EXPECT_FALSE(contains(r.output, "is gone: it exited with code 2: lost the link")) << r.output;
}

TEST(LaunchLocal, TheRunsSecretReachesEveryProcessOffEveryCommandLine) {
  TempDir cwd("launch_local_secret");
  EXPECT_TRUE(
      keptTheSecretOffCommandLines(runCommand(launchIn(cwd, "-n 2 -- " + secretCensus())), 2));
}

TEST(LaunchLocal, AbortIsTheDefaultAndNeverRestarts) {
  TempDir cwd("launch_local_abort");
  const auto r = runCommand(launchIn(cwd, "-n 1 -- bash -c 'echo gen $TROUPE_GENERATION; exit 7'"));
  EXPECT_TRUE(exitedWith(r, 7, {"[worker 0] gen 0"}));
  EXPECT_FALSE(contains(r.output, "restart")) << r.output;
}

// What troupe launch refuses before it starts a process, each with the message that says why.
struct Refusal {
  std::string name;  // the test's, read as "... is refused"
  std::string args;  // of troupe launch, before `-- true`
  std::string message;
};

void PrintTo(const Refusal& r, std::ostream* out) {
  *out << r.name;
}

class LaunchRefusal : public ::testing::TestWithParam<Refusal> {};

TEST_P(LaunchRefusal, ExitsNonZeroSayingWhy) {
  TempDir cwd("launch_local_refused");
  EXPECT_TRUE(
      failedWith(runCommand(launchIn(cwd, GetParam().args + " -- true")), {GetParam().message}));
}

INSTANTIATE_TEST_SUITE_P(
    LaunchLocal, LaunchRefusal,
    ::testing::Values(Refusal{"ARunIdThatLeavesItsFolder", "-n 1 --run_id a/../b",
                              "run_id 'a/../b' may hold letters, digits"},
                      Refusal{"AFailurePolicyOtherThanAbortOrRestart", "-n 1 --on-failure retry",
                              "--on-failure 'retry': expected abort or restart"},
                      Refusal{"ANegativeMaxRestarts", "-n 1 --max-restarts -1",
                              "--max-restarts -1: cannot be negative"},
                      Refusal{"AnUnknownLauncherListingTheKnownOnes", "-n 1 --launcher pbs",
                              "unknown launcher 'pbs' (known: local, ssh, mpi, slurm)"},
                      Refusal{"SshWithoutAHostfile", "-n 1 --launcher ssh",
                              "--launcher ssh needs -H HOSTFILE"}),
    [](const ::testing::TestParamInfo<Refusal>& info) { return info.param.name; });

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
