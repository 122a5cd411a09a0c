// Training across hosts (hosts_util.h: network namespaces with private /tmp, meeting only over
// TCP): `troupe launch` by ssh and by mpirun, ranks started by hand with a Redis rendezvous, and
// the faults of a real network (latency, loss, a link cut, a host whose processes all die).
// The launcher runs on host 0 in its /tmp/run, which exists on every host (the remote processes
// cd there); the hostfile names host 0 and host 1, so worker 0 runs on host 0 and worker 1 on
// host 1, and the embedded store listens on host 0's address (the route to the first host).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "actors/core/messages.h"
#include "actors/run/checkpoint.h"
#include "actors/run/trainer.h"
#include "cli_util.h"
#include "float_bounds.h"
#include "hosts_util.h"
#include "launch_util.h"

namespace troupe::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// `troupe train` of LeNet on Fashion-MNIST, bsp-allreduce, 10 steps of 2 x 64 an epoch.
std::string trainCommand(const std::string& flags) {
  return troupeBinary() + " train " + sourceDir() + "/configs/lenet.toml --train_data " +
         testData("lmdb") + "/train --test_data " + testData("lmdb") +
         "/test --db_type lmdb --schedule bsp-allreduce --epoch_size 1280 --threads 1 " + flags;
}

// The first line of `text` holding `part`; "" if none.
std::string lineWith(const std::string& text, const std::string& part) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (contains(line, part)) return line;
  }
  return "";
}

// spdlog's "[YYYY-mm-dd HH:MM:SS.mmm]" (local time) on `line`, as seconds since the epoch; -1 if
// the line has none.
double stampSeconds(const std::string& line) {
  static const std::regex stamp(R"(\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{3})\])");
  std::smatch m;
  if (!std::regex_search(line, m, stamp)) return -1;
  std::tm tm{};
  tm.tm_year = std::stoi(m[1]) - 1900;
  tm.tm_mon = std::stoi(m[2]) - 1;
  tm.tm_mday = std::stoi(m[3]);
  tm.tm_hour = std::stoi(m[4]);
  tm.tm_min = std::stoi(m[5]);
  tm.tm_sec = std::stoi(m[6]);
  tm.tm_isdst = -1;
  return static_cast<double>(std::mktime(&tm)) + std::stoi(m[7]) / 1000.0;
}

double wallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Polls `done` every 20 ms for at most `timeout`; true once it holds.
bool waitFor(const std::function<bool()>& done, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

std::vector<fs::path> filesIn(const fs::path& dir, const std::string& ext) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() == ext) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Rows of a training log (a comment line and a header line come first).
std::vector<std::string> logRows(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::string> rows;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line[0] != '#' && line.rfind("time_spent,", 0) != 0) rows.push_back(line);
  }
  return rows;
}

class AcrossHosts : public TwoHostsTest {
 protected:
  void SetUp() override {
    TwoHostsTest::SetUp();
    if (HasFatalFailure()) return;
    for (int i = 0; i < hosts_->size(); ++i)
      fs::create_directories(runDir(i));
    std::ofstream(runDir(0) / "hosts") << hosts_->address(0) << "\n" << hosts_->address(1) << "\n";
  }

  // Host i's /tmp/run, as this process opens it.
  fs::path runDir(int i) const { return hosts_->pathOn(i, "/tmp/run"); }

  // `troupe launch --launcher LAUNCHER -H hosts -n 2 FLAGS` on host 0; each worker says which
  // host it is on ("on host1"), then runs trainCommand(TRAIN_FLAGS).
  CommandResult launch(const std::string& launcher, const std::string& flags,
                       const std::string& train_flags, std::chrono::seconds timeout = 120s,
                       int workers = 2) const {
    return hosts_->run(
        0,
        troupeBinary() + " launch --launcher " + launcher + " -H hosts" + hosts_->launchFlags() +
            " -n " + std::to_string(workers) + " " + flags + " -- bash -c " +
            apps::shellQuote("echo on $(hostname); exec " + trainCommand(train_flags)),
        timeout, "/tmp/run");
  }

  // launch(LAUNCHER, FLAGS) of one epoch ends well: the store listened on host 0, worker i ran on
  // host i, the chief wrote its log, and nothing of the run is left on host 1. Prints how long the
  // run took.
  void expectLaunchTrainsAnEpochWithOneWorkerOnEachHost(const std::string& launcher,
                                                        const std::string& flags) const {
    const auto start = Clock::now();
    const auto r = launch(launcher, flags, "--num_epochs 1");
    const double seconds = secondsSince(start);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::cout << "[ measured ] " << launcher << " launch, 2 hosts, 1 epoch: " << seconds << " s\n";
    EXPECT_TRUE(contains(r.output, "rendezvous tcp://" + hosts_->address(0) + ":")) << r.output;
    EXPECT_TRUE(contains(r.output, "[launcher] all 2 process(es) exited 0")) << r.output;
    expectOneWorkerOnEachHost(r.output);
    expectChiefsLog(1);
    EXPECT_EQ(troupeLeftOn(1, 5s), "") << "worker 1 outlived the run";
  }

  // Worker i ran on host i: it said so, and its transport listened on host i's address.
  void expectOneWorkerOnEachHost(const std::string& output) const {
    for (int i : {0, 1}) {
      const std::string w = "[worker " + std::to_string(i) + "] ";
      EXPECT_TRUE(contains(output, w + "on host" + std::to_string(i) + "\n")) << output;
      EXPECT_TRUE(contains(lineWith(output, "node " + std::to_string(i) + " of 2 linked"),
                           "(tcp://" + hosts_->address(i) + ":"))
          << output;
    }
  }

  // The chief (worker 0, host 0) wrote the one log, with `epochs` rows of 1280 inputs each;
  // host 1 has none.
  void expectChiefsLog(int epochs) const {
    const auto logs = filesIn(runDir(0), ".log");
    ASSERT_EQ(logs.size(), 1u) << "the chief's log on host 0";
    EXPECT_TRUE(filesIn(runDir(1), ".log").empty()) << "only the chief writes a log";
    const auto rows = logRows(logs[0]);
    ASSERT_EQ(rows.size(), static_cast<size_t>(epochs)) << logs[0];
    std::vector<std::string> cells;
    std::stringstream row(rows.back());
    for (std::string c; std::getline(row, c, ',');)
      cells.push_back(c);
    ASSERT_EQ(cells.size(), 11u) << rows.back();
    EXPECT_EQ(cells[2], "1280") << rows.back();  // 10 steps of 2 x 64
  }

  // The troupe processes host i still runs after up to `timeout` ("PID troupe" lines; "" once
  // there are none).
  std::string troupeLeftOn(int i, std::chrono::seconds timeout) const {
    std::string left;
    waitFor(
        [&] {
          left.clear();
          std::istringstream lines(hosts_->processes(i));
          for (std::string line; std::getline(lines, line);) {
            if (line.size() > 7 && line.substr(line.size() - 7) == " troupe") left += line + "\n";
          }
          return left.empty();
        },
        timeout);
    return left;
  }

  // TCP segments host i has resent since it came up.
  long retransmissions(int i) const {
    const auto r = hosts_->run(i,
                               "awk '$1 == \"Tcp:\" { if (!c) { for (i = 1; i <= NF; ++i) if ($i "
                               "== \"RetransSegs\") c = i } else print $c }' /proc/net/snmp",
                               30s);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.exit_code == 0 ? std::stol(r.output) : -1;
  }
};

TEST_F(AcrossHosts, LaunchSshTrainsLeNetWithOneWorkerOnEachHost) {
  expectLaunchTrainsAnEpochWithOneWorkerOnEachHost("ssh", "");
}

// A torchrun script, unchanged, over ssh on the two hosts: torch.distributed's env:// rendezvous
// at worker 0's host (MASTER_ADDR: the hostfile's first line) on torchrun's port 29500, and
// gloo's allreduce between the hosts (GLOO_SOCKET_IFNAME: each host's interface, as a cluster's
// user names it).
TEST_F(AcrossHosts, LaunchSshRunsATorchrunScriptAsItIs) {
  const auto r =
      hosts_->run(0,
                  troupeBinary() + " launch --launcher ssh -H hosts" + hosts_->launchFlags() +
                      " -n 2 --env GLOO_SOCKET_IFNAME=eth0 -- " + torchrunScript(),
                  120s, "/tmp/run");
  EXPECT_TRUE(ranTheTorchrunScript(r, {"local 0 of 1, group 0", "local 0 of 1, group 1"}));
}

// troupe's torch.distributed backend between the hosts (tests/torch_backend_hosts.py): a chunk to
// the other host goes from the caller's tensor itself (no copy), and a collective ends only once
// the transport has sent it; each rank checks every element of its sums, gathers and broadcasts,
// and overwrites its tensors at once, which a chunk still in flight would carry to the other.
TEST_F(AcrossHosts, TheTroupeBackendsCollectivesBetweenHostsSendFromTheCallersTensors) {
  // The backend as the build made it (build/torch_extensions: CMake's troupe_torch_backend).
  const fs::path build = fs::path(troupeBinary()).parent_path().parent_path();
  const auto r =
      hosts_->run(0,
                  troupeBinary() + " launch --launcher ssh -H hosts" + hosts_->launchFlags() +
                      " -n 2 --env PYTHONPATH=" + (build / "python").string() +
                      " --env TORCH_EXTENSIONS_DIR=" + (build / "torch_extensions").string() +
                      " -- /usr/bin/python3 " + sourceDir() + "/tests/torch_backend_hosts.py",
                  120s, "/tmp/run");
  EXPECT_TRUE(exitedWith(r, 0,
                         {"[worker 0] rank 0 of 2: 24 collectives between hosts, every element "
                          "as predicted",
                          "[worker 1] rank 1 of 2: 24 collectives between hosts, every element "
                          "as predicted"}));
}

// torchrun's elastic model across hosts (tests/torchrun_elastic.py, its checkpoint in the hosts'
// shared folder): the ssh launcher on host 0 starts rank 0 there and rank 1 on host 1; every
// process of host 1 is killed, and rank 0 goes on alone; a launcher started on host 1 joins with
// one worker, and both restart as a world of 2, rank 0 (MASTER_ADDR) on host 0. Every step is
// done once.
TEST_F(AcrossHosts, AnElasticTorchrunScriptLosesAHostAndTakesALauncherThatJoinsFromIt) {
  const std::string shared = hosts_->sharedDir();
  std::ofstream(shared + "/secret") << "elastic-test-secret-0123456789abcdef\n";
  const std::string out = shared + "/launch.out";
  const std::string common = " --elastic 1:3 --secret-file " + shared +
                             "/secret --run_id hosts-elastic --env GLOO_SOCKET_IFNAME=eth0 -- "
                             "/usr/bin/python3 " +
                             sourceDir() + "/tests/torchrun_elastic.py --steps 80 " +
                             "--step-seconds 0.05 --ckpt " + shared + "/ck.json";
  CommandResult leader;
  std::thread launcher([&] {
    leader = hosts_->run(0,
                         troupeBinary() + " launch --launcher ssh -H hosts" +
                             hosts_->launchFlags() + " -n 2" + common + " > " + out + " 2>&1",
                         120s, "/tmp/run");
  });
  const auto seen = [&](const std::string& what) {
    return waitFor(
        [&] {
          std::ifstream in(out);
          return std::string(std::istreambuf_iterator<char>(in), {}).find(what) !=
                 std::string::npos;
        },
        60s);
  };
  std::string killed, joined_output;
  int joiner = -1;
  if (seen("[worker 0] step 10\n")) {
    killed = hosts_->killAll(1);
    if (seen("start: restart 1, 1 ranks") && seen("[worker 0] step 30\n")) {
      std::ifstream in(out);
      const std::string text(std::istreambuf_iterator<char>(in), {});
      std::smatch m;
      std::regex_search(text, m, std::regex(R"(rendezvous (tcp://[0-9.:]+))"));
      const auto r = hosts_->run(
          1, troupeBinary() + " launch -n 1 --interface eth0 --rendezvous " + m[1].str() + common,
          120s, "/tmp/run");
      joiner = r.exit_code;
      joined_output = r.output;
    }
  }
  launcher.join();
  std::ifstream in(out);
  const std::string text(std::istreambuf_iterator<char>(in), {});
  ASSERT_EQ(leader.exit_code, 0) << killed << "\n" << text << "\n--- joiner:\n" << joined_output;
  EXPECT_EQ(joiner, 0) << joined_output;
  EXPECT_TRUE(contains(text, "[launcher] generation 1: 1 worker(s) in all")) << text;
  EXPECT_TRUE(contains(text, "[launcher] launcher 1 on host1 joins with 1 worker(s)")) << text;
  EXPECT_TRUE(contains(joined_output, "this launcher's rank 1; MASTER_ADDR " + hosts_->address(0) +
                                          " MASTER_PORT 29500"))
      << joined_output;
  std::smatch m;
  const std::regex done(
      R"(done: (\d+) step\(s\) of 2, (\d+) step\(s\) of 1, (\d+) step\(s\) of 2)");
  ASSERT_TRUE(std::regex_search(text, m, done)) << text;
  EXPECT_EQ(std::stoi(m[1]) + std::stoi(m[2]) + std::stoi(m[3]), 80) << m[0];
  EXPECT_GE(std::stoi(m[2]), 15) << m[0];  // alone from step 10 (or a step or two later) to 30
}

// mpirun on host 0 starts rank 0 there and rank 1 through Open MPI's ssh agent on host 1.
TEST_F(AcrossHosts, LaunchMpiTrainsLeNetWithOneRankOnEachHost) {
  expectLaunchTrainsAnEpochWithOneWorkerOnEachHost("mpi", "--ssh-opt=-oStrictHostKeyChecking=no");
}

// Four workers, two on each host (the ssh launcher deals them out round-robin: 0 and 2 on host
// 0): the reduction goes in the host through shared memory and across hosts slice by slice, and
// ends with the flat ring's parameters up to the rounding of sums in another order
// (float_bounds.h: the global batch's sums have at most 4 x 64 x 24 x 24 terms; momentum 0.9).
TEST_F(AcrossHosts, FourWorkersOnTwoHostsReduceHierarchicallyToTheFlatRingsParameters) {
  const std::string train = "--num_epochs 1 --base_learning_rate 0.01 ";  // 5 steps of 4 x 64
  const auto hierarchical =
      launch("ssh", "", train + "--allreduce hierarchical --checkpoint_dir /tmp/run/hier", 120s, 4);
  ASSERT_EQ(hierarchical.exit_code, 0) << hierarchical.output;
  EXPECT_TRUE(contains(hierarchical.output, "allreduce: hierarchical: 2 hosts x 2 workers"))
      << hierarchical.output;
  const auto flat =
      launch("ssh", "", train + "--allreduce ring --checkpoint_dir /tmp/run/flat", 120s, 4);
  ASSERT_EQ(flat.exit_code, 0) << flat.output;
  EXPECT_TRUE(contains(flat.output, "allreduce: flat ring of 4 workers")) << flat.output;
  const auto a = actors::loadCheckpoint(filesIn(runDir(0) / "hier", ".ckpt").at(0));
  const auto b = actors::loadCheckpoint(filesIn(runDir(0) / "flat", ".ckpt").at(0));
  ASSERT_EQ(a.metaInt("step"), 5);
  ASSERT_EQ(b.metaInt("step"), 5);
  double sq_diff = 0, sq = 0;
  for (std::int64_t i = 0; i < a.state.numel(); ++i) {
    const double x = a.state.f32()[i], y = b.state.f32()[i];
    sq_diff += (x - y) * (x - y);
    sq += y * y;
  }
  const double bound = sgdTrajectoryBound(4 * 64 * 24 * 24, 0.9);
  std::cout << "[ measured ] hierarchical vs flat ring, 2 hosts x 2 workers: relative difference "
               "of momentum "
            << std::sqrt(sq_diff / sq) << " (bound " << bound << ")\n";
  EXPECT_LE(std::sqrt(sq_diff / sq), bound);
}

// reducer nccl with allreduce hierarchical, four workers on two hosts with a GPU each (emulated):
// NCCL sums each process's GPU (a group of one), troupe's hierarchical allreduce the processes,
// in the hosts and across them: the same bits as reducer troupe on the same GPUs.
TEST_F(AcrossHosts, NcclInEachProcessThenTheHierarchicalAllreduceAcrossHosts) {
  const std::string gpus = "--env TROUPE_CUDA_LIBRARY=" + std::string(TROUPE_EMULATED_GPU) +
                           " --env TROUPE_EMULATED_GPUS=1";
  const std::string train =
      "--num_epochs 1 --base_learning_rate 0.01 --gpus 0 "
      "--allreduce hierarchical ";
  const auto nccl =
      launch("ssh", gpus, train + "--reducer nccl --checkpoint_dir /tmp/run/nccl", 120s, 4);
  ASSERT_EQ(nccl.exit_code, 0) << nccl.output;
  EXPECT_TRUE(contains(nccl.output,
                       "gradients summed by NCCL over this process's 1 GPU(s), then "
                       "by troupe's hierarchical allreduce across processes"))
      << nccl.output;
  EXPECT_TRUE(contains(nccl.output, "allreduce: hierarchical: 2 hosts x 2 workers")) << nccl.output;
  const auto own =
      launch("ssh", gpus, train + "--reducer troupe --checkpoint_dir /tmp/run/own", 120s, 4);
  ASSERT_EQ(own.exit_code, 0) << own.output;
  const auto a = actors::loadCheckpoint(filesIn(runDir(0) / "nccl", ".ckpt").at(0));
  const auto b = actors::loadCheckpoint(filesIn(runDir(0) / "own", ".ckpt").at(0));
  ASSERT_EQ(a.metaInt("step"), 5);
  ASSERT_EQ(a.weights.numel(), b.weights.numel());
  EXPECT_EQ(std::memcmp(a.weights.raw(), b.weights.raw(), a.weights.bytes()), 0)
      << "reducer nccl and reducer troupe hold different weights";
}

// Ring chunks spread over three TCP connections a pair of hosts arrive in another order, but each
// chunk is reduced in ring order all the same: the parameters are bitwise those of one connection.
TEST_F(AcrossHosts, ThreeConnectionsAPairTrainToTheSameBitsAsOne) {
  const std::string train = "--num_epochs 1 --allreduce ring ";
  const auto three =
      launch("ssh", "", train + "--connections_per_peer 3 --checkpoint_dir /tmp/run/three");
  ASSERT_EQ(three.exit_code, 0) << three.output;
  EXPECT_TRUE(contains(three.output, "3 connections to a peer on another host")) << three.output;
  const auto one =
      launch("ssh", "", train + "--connections_per_peer 1 --checkpoint_dir /tmp/run/one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const auto a = actors::loadCheckpoint(filesIn(runDir(0) / "three", ".ckpt").at(0));
  const auto b = actors::loadCheckpoint(filesIn(runDir(0) / "one", ".ckpt").at(0));
  ASSERT_EQ(a.weights.numel(), b.weights.numel());
  EXPECT_EQ(std::memcmp(a.weights.raw(), b.weights.raw(), a.weights.bytes()), 0);
  EXPECT_EQ(std::memcmp(a.state.raw(), b.state.raw(), a.state.bytes()), 0);
}

// redis-server on host 0 (with a password: protected mode refuses other hosts without one); one
// `troupe train` by hand on each host.
TEST_F(AcrossHosts, RanksStartedByHandOnEachHostMeetThroughRedisOnHostZero) {
  const std::string redis = hosts_->address(0) + ":6379";
  const auto server = hosts_->run(0,
                                  "redis-server --daemonize yes --bind " + hosts_->address(0) +
                                      " --port 6379 --requirepass pw --save '' --appendonly no "
                                      "--dir /tmp --logfile /tmp/redis.log",
                                  30s);
  ASSERT_EQ(server.exit_code, 0) << server.output;
  const auto ping = hosts_->run(1,
                                "for i in $(seq 100); do redis-cli -a pw --no-auth-warning -h " +
                                    hosts_->address(0) +
                                    " ping 2>&1 | grep -q PONG && exit 0; sleep 0.1; done; exit 1",
                                30s);
  ASSERT_EQ(ping.exit_code, 0) << "redis-server on host 0 never answered host 1\n" << ping.output;
  const std::string flags =
      "--num_epochs 1 --num_shards 2 --run_id byhand --rendezvous "
      "redis://:pw@" +
      redis + " --shard_id ";
  CommandResult one;
  std::thread second([&] { one = hosts_->run(1, trainCommand(flags + "1"), 120s, "/tmp/run"); });
  const auto zero = hosts_->run(0, trainCommand(flags + "0"), 120s, "/tmp/run");
  second.join();
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_TRUE(
      contains(lineWith(zero.output, "node 0 of 2 linked"), "(tcp://" + hosts_->address(0) + ":"))
      << zero.output;
  EXPECT_TRUE(
      contains(lineWith(one.output, "node 1 of 2 linked"), "(tcp://" + hosts_->address(1) + ":"))
      << one.output;
  EXPECT_TRUE(contains(zero.output, "done: 10 steps")) << zero.output;
  EXPECT_TRUE(contains(one.output, "done: worker 1 of 2")) << one.output;
  expectChiefsLog(1);
}

// 100 ms more on every packet host 1 sends (so 100 ms more round trip between the hosts).
TEST_F(AcrossHosts, ARunWith100msOfLatencyFinishes) {
  const std::string how = hosts_->shape(1, "delay 100ms");
  const auto start = Clock::now();
  const auto r = launch("ssh", "", "--num_epochs 1 --log_every 0");
  const double seconds = secondsSince(start);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::cout << "[ measured ] " << how << ": the run took " << seconds << " s\n";
  EXPECT_TRUE(contains(r.output, "done: 10 steps")) << r.output;
  expectOneWorkerOnEachHost(r.output);
  expectChiefsLog(1);
}

TEST_F(AcrossHosts, ARunWithOnePercentLossFinishes) {
  const long before = retransmissions(0) + retransmissions(1);
  const std::string how0 = hosts_->shape(0, "loss 1%");
  const std::string how1 = hosts_->shape(1, "loss 1%");
  const auto start = Clock::now();
  const auto r = launch("ssh", "", "--num_epochs 1 --log_every 0");
  const double seconds = secondsSince(start);
  const long resent = retransmissions(0) + retransmissions(1) - before;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::cout << "[ measured ] " << how0 << "; " << how1 << ": the run took " << seconds << " s, "
            << resent << " TCP segments resent\n";
  EXPECT_GT(resent, 0) << "no packet was lost";
  EXPECT_TRUE(contains(r.output, "done: 10 steps")) << r.output;
  expectChiefsLog(1);
}

// Host 1's cable is pulled mid-run: worker 0 waits for ring chunks of worker 1 for the peer
// timeout (3 s), fails naming it with its address, and the launcher names worker 1 and its host.
// Where the cut comes while the run evaluates at an epoch's end (10,000 test images after 1,280
// trained: most of an epoch's time, on a loaded machine), no ring waits: the link's heartbeat
// watch names worker 1 then, two graces and a heartbeat after the peer timeout (clusterOptions).
// The launcher then tries to stop worker 1 by ssh, which cannot connect (3 s connect timeout, for
// SIGTERM and again for SIGKILL after the 5 s grace); worker 1, cut off, ends by its own peer
// timeout. So the launcher exits about 0.5 + 3 + 5 + 3 s after the detection.
TEST_F(AcrossHosts, ALinkTakenDownMidEpochStopsTheRunNamingTheUnreachableHost) {
  CommandResult r;
  std::thread launcher([&] {
    r = launch("ssh", "--ssh-opt=-oConnectTimeout=3",
               "--num_epochs 200 --log_every 0 --peer_timeout 3");
  });
  const bool training = waitFor(
      [&] {
        const auto logs = filesIn(runDir(0), ".log");
        return !logs.empty() && logRows(logs[0]).size() >= 2;
      },
      60s);
  const double down_at = wallSeconds();
  const auto down = Clock::now();
  if (training) hosts_->link(1, false);
  launcher.join();
  const double exited = secondsSince(down);
  hosts_->link(1, true);
  ASSERT_TRUE(training) << "the chief logged no 2 epochs within 60 s\n" << r.output;
  const std::string named = lineWith(r.output, "worker 1 at " + hosts_->address(1) + ":");
  ASSERT_FALSE(named.empty()) << r.output;
  const double detected = stampSeconds(named) - down_at;
  std::cout << "[ measured ] link of host 1 down mid-epoch: detected after " << detected
            << " s (peer_timeout 3 s), the launcher exited after " << exited << " s\n";
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[launcher] run failed: worker 1 on " + hosts_->address(1)))
      << r.output;
  EXPECT_TRUE(contains(r.output, "troupe-culprit: worker 1: ")) << r.output;
  const double grace =
      std::chrono::duration<double>(
          actors::peerTimeoutGrace(std::chrono::milliseconds(static_cast<int>(
                                       actors::TrainOptions{}.stall_warning_s * 1000)),
                                   3s))
          .count();
  const bool by_heartbeat = contains(named, "not even a heartbeat");
  // The peer timeout, the stall check's period, slack; or the link's own timeout, its check, slack.
  EXPECT_LT(detected, by_heartbeat ? 3 + 2 * grace + 1 + 1 + 1 : 3 + 3) << named;
  EXPECT_LT(exited, 30) << r.output;
  EXPECT_EQ(troupeLeftOn(1, 10s), "") << "worker 1, cut off, did not end by its peer timeout";
}

// Every process of host 1 (worker 1 and its ssh session) gets SIGKILL after the first checkpoint:
// the launcher sees worker 1's ssh end, stops worker 0 and starts both again, and both resume
// from the newest checkpoint. The checkpoints are on the folder every host sees (shared storage):
// a process resumes from its own checkpoint_dir, and only the chief writes one.
TEST_F(AcrossHosts, KillingEveryProcessOfAHostRestartsTheRunFromTheNewestCheckpoint) {
  const std::string dir = hosts_->sharedDir() + "/restart_ck";
  CommandResult r;
  const auto start = Clock::now();
  std::thread launcher([&] {
    r = launch("ssh", "--on-failure restart --max-restarts 2",
               "--num_epochs 8 --log_every 0 --checkpoint_every 1 --checkpoint_dir " + dir);
  });
  const bool checkpointed = waitFor([&] { return !filesIn(dir, ".ckpt").empty(); }, 60s);
  const size_t written = filesIn(dir, ".ckpt").size();
  const double killed_at = wallSeconds();
  std::string killed;
  if (checkpointed) killed = hosts_->killAll(1);
  launcher.join();
  const double seconds = secondsSince(start);
  ASSERT_TRUE(checkpointed) << "no checkpoint within 60 s\n" << r.output;
  ASSERT_EQ(r.exit_code, 0) << killed << "\n" << r.output;
  ASSERT_TRUE(contains(r.output, "[launcher] worker 1 on " + hosts_->address(1)))
      << "the kill came after the run's end\n"
      << r.output;
  EXPECT_TRUE(contains(r.output, "restarting every process (1 of 2 restarts)")) << r.output;
  const std::regex resumed(R"(\[worker ([01])\] .* resuming from \S+_epoch(\d+)\.ckpt at step)");
  int resumed_epoch[2] = {-1, -1};
  double resumed_at = -1;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), resumed), end; it != end; ++it) {
    resumed_epoch[std::stoi((*it)[1])] = std::stoi((*it)[2]);
    if ((*it)[1] == "1") resumed_at = stampSeconds(it->str());
  }
  ASSERT_GE(resumed_epoch[1], 1) << r.output;
  std::cout << "[ measured ] every process of host 1 killed after " << written
            << " checkpoint(s): worker 1 resumed from epoch " << resumed_epoch[1] << " "
            << resumed_at - killed_at << " s after the kill; the run took " << seconds << " s\n";
  EXPECT_EQ(resumed_epoch[0], resumed_epoch[1]) << r.output;
  EXPECT_GE(static_cast<size_t>(resumed_epoch[1]), written) << "not the newest checkpoint";
  EXPECT_TRUE(contains(r.output, "done: 80 steps")) << r.output;
  EXPECT_LT(resumed_at - killed_at, 30) << r.output;
  EXPECT_EQ(troupeLeftOn(0, 5s) + troupeLeftOn(1, 5s), "") << "a process outlived the run";
}

// An elastic run of 3 workers (workers 0 and 2 on host 0, worker 1 on host 1) loses every
// process of host 1 after its first epoch: the two on host 0 re-form from the newest state in
// their memory and finish; every epoch trains its records once (but the tail).
TEST_F(AcrossHosts, AnElasticRunGoesOnWithoutAHostWhoseEveryProcessWasKilled) {
  CommandResult r;
  const auto start = Clock::now();
  std::thread launcher(
      [&] { r = launch("ssh", "--elastic 2:3", "--num_epochs 30 --log_every 0", 120s, 3); });
  const bool epoch_done = waitFor(
      [&] {
        const auto logs = filesIn(runDir(0), ".log");
        return !logs.empty() && !logRows(logs[0]).empty();
      },
      60s);
  const double killed_at = wallSeconds();
  std::string killed;
  if (epoch_done) killed = hosts_->killAll(1);
  launcher.join();
  const double seconds = secondsSince(start);
  ASSERT_TRUE(epoch_done) << "no epoch within 60 s\n" << r.output;
  ASSERT_EQ(r.exit_code, 0) << killed << "\n" << r.output;
  ASSERT_TRUE(contains(r.output, "[launcher] worker 1 on " + hosts_->address(1)))
      << "the kill came after the run's end\n"
      << r.output;
  EXPECT_TRUE(contains(r.output, "elastic run: the others go on without it")) << r.output;
  const std::string reformed = lineWith(r.output, "generation 1: worker 0 of 2");
  ASSERT_NE(reformed, "") << r.output;
  std::cout << "[ measured ] every process of host 1 killed, elastic 2:3: the other 2 workers "
            << "re-formed " << stampSeconds(reformed) - killed_at << " s after the kill; the run "
            << "took " << seconds << " s\n";
  EXPECT_LT(stampSeconds(reformed) - killed_at, 10) << r.output;
  const auto logs = filesIn(runDir(0), ".log");
  ASSERT_EQ(logs.size(), 1u);
  const auto rows = logRows(logs[0]);
  EXPECT_EQ(rows.size(), 30u) << logs[0];
  for (const auto& row : rows) {
    std::vector<std::string> cells;
    std::stringstream in(row);
    for (std::string c; std::getline(in, c, ',');)
      cells.push_back(c);
    ASSERT_EQ(cells.size(), 11u) << row;
    // 1280 records an epoch: whole steps of 3 x 64 (1152) or 2 x 64 (1280), at most one
    // global batch (192) short, never one record twice.
    EXPECT_LE(std::stol(cells[2]), 1280) << row;
    EXPECT_GT(std::stol(cells[2]), 1280 - 192) << row;
  }
  EXPECT_EQ(troupeLeftOn(0, 5s) + troupeLeftOn(1, 5s), "") << "a process outlived the run";
}

}  // namespace
}  // namespace troupe::testing
