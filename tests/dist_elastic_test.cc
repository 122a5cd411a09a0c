// Elastic worlds with real processes (actors/run/elastic.h): `troupe launch --elastic MIN:MAX` and
// `troupe train --num_workers MIN:MAX` started by hand, a worker killed mid-epoch, one joining.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.h"
#include "launch_util.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using namespace testing;

// Writes `body` as a bash script in `dir` and runs it there.
testing::CommandResult runScript(const TempDir& dir, const std::string& body) {
  const fs::path script = dir.path() / "script.sh";
  std::ofstream(script) << "set -u\ncd " << dir.str() << "\nT=" << troupeBinary() << "\n" << body;
  return runCommand("bash " + script.string());
}

std::string trainArgs(const std::string& schedule = "bsp-allreduce",
                      const std::string& train_data = testData("lmdb") + "/train") {
  return "--model lenet --train_data " + train_data + " --test_data " + testData("lmdb") +
         "/test --db_type lmdb --schedule " + schedule + " --threads 1";
}

// The rows of the one CSV log in `dir`, as cells.
std::vector<std::vector<std::string>> logRows(const fs::path& dir) {
  std::vector<fs::path> logs;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".log") logs.push_back(e.path());
  }
  EXPECT_EQ(logs.size(), 1u);
  std::vector<std::vector<std::string>> rows;
  if (logs.empty()) return rows;
  std::istringstream csv(slurp(logs[0]));
  for (std::string line; std::getline(csv, line);) {
    if (line.empty() || line[0] == '#' || line.rfind("time_spent", 0) == 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');)
      cells.push_back(cell);
    EXPECT_GE(cells.size(), 11u) << line;
    if (cells.size() >= 11) rows.push_back(cells);
  }
  return rows;
}

// Short waits, so that a test that hangs or waits in vain shows in seconds.
const char* kShortWaits = " --peer_timeout 3 --stall_warning 1 --rendezvous_timeout 5";

// Waits (up to 60 s) until FILE holds a line matching PATTERN.
const char* kWaitFor =
    R"sh(wait_for() { for i in $(seq 3000); do grep -q "$2" "$1" && return 0; sleep 0.02; done; echo "never saw '$2' in $1"; cat "$1"; exit 1; }
# The pid of the worker of rank $2 in generation line "generation G: worker R of W (host:pid, ...)".
pid_of() { grep -o "generation 0: worker 0 of [0-9]* ([^)]*)" "$1" | head -1 | sed 's/.*(//; s/)//' | tr ',' '\n' | sed -n "$(($2 + 1))p" | cut -d: -f2; }
)sh";

// How many workers said they finished the elastic run in `output`, and the distinct checksums of
// the parameters they held.
std::pair<int, std::set<std::string>> checksumsOf(const std::string& output) {
  const std::regex done(R"(elastic run done at step (\d+): parameters checksum ([0-9a-f]+))");
  int finished = 0;
  std::set<std::string> checksums;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), done);
       it != std::sregex_iterator(); ++it, ++finished) {
    checksums.insert((*it)[2]);
  }
  return {finished, checksums};
}

// The issue's elastic run: 3 workers, one killed mid-epoch (the other two re-form from the
// newest state in memory and re-split the epoch's rest), then a fourth started by hand joins
// (every worker pauses between steps; the newcomer gets the state over the new links).
TEST(ElasticTraining, KillOneOfThreeMidEpochThenAFourthJoinsAndNoRecordIsLostOrTrainedTwice) {
  TempDir cwd("elastic_kill_join");
  const std::string run_id = "elastic" + std::to_string(::getpid());
  const std::string args = trainArgs() + " --num_epochs 6 --epoch_size 9600 --log_every 10";
  const auto r = runScript(
      cwd, std::string(kWaitFor) + "echo elastic-test-secret-0123456789 > secret\n" +
               "$T launch -n 3 --elastic 2:4 --run_id " + run_id +
               " --secret-file secret -- troupe train " + args +
               " > launch.out 2>&1 &\nL=$!\n"
               // Mid-epoch: 20 of epoch 2's 50 steps are done.
               "wait_for launch.out 'epoch 2 step 20/50'\n"
               "P=$(pid_of launch.out 1)\nkill -9 $P\necho killed worker 1, pid $P\n"
               "wait_for launch.out 'generation 1: worker 0 of 2'\n"
               "R=$(grep -o 'rendezvous tcp://[0-9.:]*' launch.out | head -1 | cut -d' ' -f2)\n"
               "$T train " +
               args + " --num_workers 2:4 --rendezvous $R --run_id " + run_id +
               " --secret_file secret > fourth.out 2>&1\necho fourth exit $?\n"
               "wait $L\necho launcher exit $?\n");
  const std::string launch = slurp(cwd.path() / "launch.out");
  const std::string fourth = slurp(cwd.path() / "fourth.out");
  ASSERT_TRUE(exitedWith(r, 0, {"killed worker 1", "fourth exit 0", "launcher exit 0"}))
      << launch << "\n--- fourth:\n"
      << fourth;
  EXPECT_TRUE(testing::containsAll(
      launch,
      {"[launcher] worker 1 on localhost",
       "was killed by signal 9 (Killed); elastic run: the "
       "others go on without it",
       "generation 0 lost a worker (lost the link to worker 1", "generation 1: worker 0 of 2",
       "a worker waits to join", "generation 2: worker 0 of 3",
       "[launcher] 2 of 3 process(es) exited 0; left out: worker 1 on localhost was killed by "
       "signal 9"}));
  // The kill landed part way through epoch 2.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      launch, m, std::regex(R"(generation 1: worker 0 of 2 .* \(epoch (\d+), (\d+) of its)")))
      << launch;
  EXPECT_EQ(m[1], "2");
  EXPECT_GT(std::stoi(m[2]), 0) << "the kill came at an epoch's end";
  // The newcomer went on from the others' state, handed over in memory.
  ASSERT_TRUE(
      std::regex_search(fourth, m, std::regex(R"(generation 2: worker 2 of 3 .*state from (\S+))")))
      << fourth;
  EXPECT_NE(m[1], "scratch");
  // Every worker that finished holds bitwise the same parameters.
  const auto [finished, checksums] = checksumsOf(launch + fourth);
  EXPECT_EQ(finished, 3) << launch << fourth;
  EXPECT_EQ(checksums.size(), 1u) << launch << fourth;
  // Each epoch trained its 9600 records once: all but a tail shorter than the global batch of
  // its last generation (192 with 3 workers, 128 with 2), never one twice.
  std::vector<fs::path> logs;
  for (const auto& e : fs::directory_iterator(cwd.path())) {
    if (e.path().extension() == ".log") logs.push_back(e.path());
  }
  ASSERT_EQ(logs.size(), 1u);
  std::istringstream csv(slurp(logs[0]));
  std::string line;
  int epochs = 0;
  while (std::getline(csv, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("time_spent", 0) == 0) continue;
    std::vector<std::string> cells;
    std::stringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');)
      cells.push_back(cell);
    ASSERT_GE(cells.size(), 11u) << line;
    const long inputs = std::stol(cells[2]);
    EXPECT_LE(inputs, 9600) << "epoch " << cells[7] << " trained a record twice: " << line;
    EXPECT_GT(inputs, 9600 - 192) << "epoch " << cells[7] << " lost records: " << line;
    ++epochs;
  }
  EXPECT_EQ(epochs, 6);
  std::cout << "[ measured ] elastic run: test accuracy "
            << launch.substr(launch.rfind("final test_accuracy ") + 20, 6) << "\n";
}

// reducer nccl (on the emulated GPU's stand-in NCCL, a GPU each): a worker killed mid-step cuts
// that step's NCCL sums short on the others, whose updates were queued behind them; the survivors
// must go on from the last step whose sums were whole, so that they hold the same parameters, in
// a new NCCL group of the new generation. Then a newcomer joins: the group of two ends between
// steps and one of three forms. In fp16, from a loss scale of 2^24 that overflows at once: each
// generation goes on from the dynamic loss scale the one before reached, not from 2^24 again.
TEST(ElasticTraining, WithNcclAKilledWorkerLeavesNoStepAppliedFromPartialSums) {
  TempDir cwd("elastic_nccl");
  const std::string run_id = "elasticnccl" + std::to_string(::getpid());
  const std::string args =
      trainArgs() +
      " --gpus 0 --reducer nccl --precision fp16 --initial_scale_power 24 --num_epochs 2 "
      "--epoch_size 9600 --log_every 10";
  const auto r = runScript(
      cwd, std::string(kWaitFor) + "export TROUPE_CUDA_LIBRARY=" + TROUPE_EMULATED_GPU +
               " TROUPE_EMULATED_GPUS=1\necho elastic-test-secret-0123456789 > secret\n" +
               "$T launch -n 3 --elastic 2:3 --secret-file secret --run_id " + run_id +
               " -- troupe train " + args + " > launch.out 2>&1 &\nL=$!\n" +
               "wait_for launch.out 'epoch 1 step 20/50'\n"
               "P=$(pid_of launch.out 1)\nkill -9 $P\necho killed worker 1, pid $P\n"
               "wait_for launch.out 'generation 1: worker 0 of 2'\n"
               "R=$(grep -o 'rendezvous tcp://[0-9.:]*' launch.out | head -1 | cut -d' ' -f2)\n"
               "$T train " +
               args + " --num_workers 2:3 --rendezvous $R --run_id " + run_id +
               " --secret_file secret > third.out 2>&1\necho third exit $?\nwait $L\necho launcher "
               "exit $?\n");
  const std::string launch = slurp(cwd.path() / "launch.out");
  const std::string third = slurp(cwd.path() / "third.out");
  ASSERT_TRUE(exitedWith(r, 0, {"killed worker 1", "third exit 0", "launcher exit 0"}))
      << launch << "\n--- third:\n"
      << third;
  EXPECT_TRUE(testing::containsAll(
      launch, {"generation 0 lost a worker", "generation 1: worker 0 of 2",
               "NCCL: a group of 2 GPU(s) in 2 process(es) sums the gradients",
               "generation 2: worker 0 of 3",
               "NCCL: a group of 3 GPU(s) in 3 process(es) sums the gradients"}))
      << launch;
  const auto [finished, checksums] = checksumsOf(launch + third);
  EXPECT_EQ(finished, 3) << launch << third;
  EXPECT_EQ(checksums.size(), 1u) << launch << third;
  // Both survivors in generation 1 (from their own state), the newcomer in generation 2 (handed
  // over), each from a scale below 2^24.
  const std::regex carried(R"(worker (\d): the dynamic loss scale goes on from ([0-9.e+]+))");
  std::set<std::string> workers;
  const std::string both = launch + third;
  for (auto it = std::sregex_iterator(both.begin(), both.end(), carried);
       it != std::sregex_iterator(); ++it) {
    workers.insert((*it)[1]);
    EXPECT_LT(std::stod((*it)[2]), 16777216.0) << (*it)[0];
  }
  EXPECT_EQ(workers, (std::set<std::string>{"0", "1", "2"})) << launch << third;
  // The count of skipped steps goes on with it: no step doubles the scale (the window is 2000),
  // so after T skipped steps in all, over the generations, the scale is 2^(24 - T).
  const std::regex epoch(
      R"(epoch (\d) loss scale ([0-9.e+]+): \d+ step\(s\) skipped .* \((\d+) in all\))");
  int epochs = 0;
  for (auto it = std::sregex_iterator(launch.begin(), launch.end(), epoch);
       it != std::sregex_iterator(); ++it, ++epochs) {
    EXPECT_EQ(std::stod((*it)[2]), std::ldexp(1.0, 24 - std::stoi((*it)[3]))) << (*it)[0];
  }
  EXPECT_EQ(epochs, 2) << launch;
}

// A joiner killed -9 just as the running workers pause for it (or a store client that writes a
// member record and never acts): the running generation never waits on a newcomer, so the
// workers re-form without it and finish.
TEST(ElasticTraining, AJoinerKilledAsTheRunPausesForItHoldsUpNoOne) {
  TempDir cwd("elastic_joiner_killed");
  const std::string run_id = "elastickilled" + std::to_string(::getpid());
  const std::string args =
      trainArgs() + " --num_epochs 6 --epoch_size 9600 --log_every 10" + kShortWaits;
  const auto r = runScript(
      cwd, std::string(kWaitFor) + "echo elastic-test-secret-0123456789 > secret\n" +
               "$T launch -n 2 --elastic 2:3 --run_id " + run_id +
               " --secret-file secret -- troupe train " + args + " > launch.out 2>&1 &\nL=$!\n" +
               "wait_for launch.out 'epoch 1 step 20/75'\n"
               "R=$(grep -o 'rendezvous tcp://[0-9.:]*' launch.out | head -1 | cut -d' ' -f2)\n"
               "$T train " +
               args + " --num_workers 2:3 --rendezvous $R --run_id " + run_id +
               " --secret_file secret > joiner.out 2>&1 &\nJ=$!\n"
               "wait_for launch.out 'a worker waits to join'\n"
               "kill -9 $J\necho killed the joiner\nwait $L\necho launcher exit $?\n");
  const std::string launch = slurp(cwd.path() / "launch.out");
  ASSERT_TRUE(exitedWith(r, 0, {"killed the joiner", "launcher exit 0"}))
      << launch << "\n--- joiner:\n"
      << slurp(cwd.path() / "joiner.out");
  EXPECT_TRUE(testing::containsAll(launch, {"a worker waits to join", "generation 1: worker 0 of 2",
                                            "[launcher] all 2 process(es) exited 0"}));
  EXPECT_FALSE(contains(launch, "did not close it")) << launch;
  EXPECT_FALSE(contains(launch, "of 3 (")) << "the dead joiner was admitted: " << launch;
  const auto [finished, checksums] = checksumsOf(launch);
  EXPECT_EQ(finished, 2) << launch;
  EXPECT_EQ(checksums.size(), 1u) << launch;
}

// Five joiners that want another num_epochs, and one whose own training data does not open, come
// while the run trains: each is refused before it counts in any round, within seconds, naming
// why; the run never pauses for them, and its log stays true (each epoch's inputs once, its time
// within the run's).
TEST(ElasticTraining, JoinersThatDisagreeOrFailTheirOwnCheckAreRefusedBeforeTheyCount) {
  TempDir cwd("elastic_refused");
  const std::string run_id = "elasticrefused" + std::to_string(::getpid());
  const std::string tail = " --epoch_size 9600 --log_every 10" + std::string(kShortWaits);
  const std::string joiner =
      " --num_workers 2:3 --rendezvous $R --run_id " + run_id + " --secret_file secret";
  const auto r = runScript(
      cwd, std::string(kWaitFor) + "echo elastic-test-secret-0123456789 > secret\nSECONDS=0\n" +
               "$T launch -n 2 --elastic 2:3 --run_id " + run_id +
               " --secret-file secret -- troupe train " + trainArgs() + " --num_epochs 4" + tail +
               " > launch.out 2>&1 &\nL=$!\n" +
               "wait_for launch.out 'epoch 1 step 20/75'\n"
               "R=$(grep -o 'rendezvous tcp://[0-9.:]*' launch.out | head -1 | cut -d' ' -f2)\n"
               "S=$SECONDS\nP=''\nfor i in 1 2 3 4 5; do\n  $T train " +
               trainArgs() + " --num_epochs 5" + tail + joiner +
               " > joiner$i.out 2>&1 &\n  P=\"$P $!\"\ndone\n"
               "$T train " +
               trainArgs("bsp-allreduce", "/nonexistent") + " --num_epochs 4" + tail + joiner +
               " > baddata.out 2>&1\necho bad data exit $?\n"
               "for p in $P; do wait $p; echo joiner exit $?; done\n"
               "echo refused within $((SECONDS - S)) s\n"
               "wait $L\necho launcher exit $? after $SECONDS s\n"
               "for p in $P; do kill -0 $p 2>/dev/null && echo joiner $p alive; done; true\n");
  const std::string launch = slurp(cwd.path() / "launch.out");
  const std::string& out = r.output;
  ASSERT_TRUE(exitedWith(r, 0, {"bad data exit 1", "launcher exit 0"})) << launch;
  EXPECT_FALSE(contains(out, "alive")) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(refused within (\d+) s)"))) << out;
  EXPECT_LE(std::stoi(m[1]), 20) << out;
  int exits = 0;
  for (std::size_t at = out.find("joiner exit 1"); at != std::string::npos;
       at = out.find("joiner exit 1", at + 1)) {
    ++exits;
  }
  EXPECT_EQ(exits, 5) << out;
  int refused = 0;
  for (int i = 1; i <= 5; ++i) {
    const std::string text = slurp(cwd.path() / ("joiner" + std::to_string(i) + ".out"));
    refused += contains(text, "this worker disagrees with elastic run " + run_id +
                                  " (num_epochs: the run has 4, this one 5); it was not counted");
  }
  EXPECT_EQ(refused, 5) << slurp(cwd.path() / "joiner1.out");
  const std::string bad = slurp(cwd.path() / "baddata.out");
  EXPECT_TRUE(contains(bad, "/nonexistent")) << bad;
  EXPECT_FALSE(contains(launch, "a worker waits to join")) << launch;
  EXPECT_FALSE(contains(launch, "refused this run")) << launch;
  EXPECT_TRUE(contains(launch, "[launcher] all 2 process(es) exited 0")) << launch;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(launcher exit 0 after (\d+) s)"))) << out;
  const double wall = std::stod(m[1]) + 1;
  const auto rows = logRows(cwd.path());
  EXPECT_EQ(rows.size(), 4u);
  for (const auto& row : rows) {
    EXPECT_LE(std::stod(row[0]), wall) << "epoch " << row[7] << "'s time_spent";
    EXPECT_LE(std::stol(row[2]), 9600) << "epoch " << row[7] << "'s input_count";
    EXPECT_GT(std::stol(row[2]), 9600 - 128) << "epoch " << row[7] << "'s input_count";
  }
}

// One of three workers stopped (SIGSTOP) mid-run: the others re-form without it and finish, and
// the launcher ends the stopped one, naming it, instead of waiting for it for ever.
TEST(ElasticTraining, AStoppedWorkerIsLeftOutAndEndedOnceTheOthersFinish) {
  TempDir cwd("elastic_stopped");
  const auto r = runScript(
      cwd, std::string(kWaitFor) + "$T launch -n 3 --elastic 2:3 -- troupe train " + trainArgs() +
               " --num_epochs 3 --epoch_size 9600 --log_every 10" + kShortWaits +
               " > launch.out 2>&1 &\nL=$!\n"
               "wait_for launch.out 'epoch 1 step 20/50'\n"
               "P=$(pid_of launch.out 1)\nkill -STOP $P\necho stopped worker 1, pid $P\n"
               "SECONDS=0\n"
               // At most 120 s for the launcher, which waited on the stopped worker for ever.
               "for i in $(seq 1200); do kill -0 $L 2>/dev/null || break; sleep 0.1; done\n"
               "kill $L 2>/dev/null && echo launcher still running after 120 s\n"
               "wait $L\necho launcher exit $? after $SECONDS s\n"
               "if kill -0 $P 2>/dev/null; then echo worker 1 alive; kill -CONT $P; kill -9 $P; "
               "fi\n");
  const std::string launch = slurp(cwd.path() / "launch.out");
  ASSERT_TRUE(exitedWith(r, 0, {"stopped worker 1", "launcher exit 0"})) << launch;
  EXPECT_FALSE(contains(r.output, "worker 1 alive")) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(launcher exit 0 after (\d+) s)")));
  EXPECT_LE(std::stoi(m[1]), 60) << "the stopped worker held the launcher";
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(stopped worker 1, pid (\d+))")));
  EXPECT_TRUE(testing::containsAll(
      launch, {"generation 1: worker 0 of 2",
               "[launcher] worker 1 on localhost (pid " + m[1].str() +
                   ") was stopped (SIGSTOP) when the run finished; ended by the launcher",
               "[launcher] 2 of 3 process(es) exited 0; left out: worker 1 on localhost was "
               "stopped (SIGSTOP) when the run finished"}));
}

// A survivor alone, below MIN, waits for the rendezvous timeout and ends naming the round, the
// bounds and who came; the launcher exits non-zero.
TEST(ElasticTraining, FewerSurvivorsThanMinEndTheRunNamingTheRoundWithinTheTimeout) {
  TempDir cwd("elastic_below_min");
  const auto r = runScript(
      cwd, std::string(kWaitFor) + "$T launch -n 2 --elastic 2:3 -- troupe train " + trainArgs() +
               " --num_epochs 50 --epoch_size 9600 --log_every 10 --rendezvous_timeout 3"
               " > launch.out 2>&1 &\nL=$!\n"
               "wait_for launch.out 'epoch 1 step 20/75'\n"
               "kill -9 $(pid_of launch.out 1)\nSECONDS=0\nwait $L\n"
               "echo launcher exit $? after $SECONDS s\n");
  const std::string launch = slurp(cwd.path() / "launch.out");
  EXPECT_TRUE(exitedWith(r, 0, {"launcher exit 1 after"})) << launch;
  EXPECT_TRUE(testing::containsAll(
      launch, {"elastic rendezvous round 1: 1 of at least 2 workers (num_workers 2:3) came within "
               "3 s",
               "no process finished the elastic run"}));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m, std::regex(R"(after (\d+) s)")));
  EXPECT_LE(std::stoi(m[1]), 10);
}

TEST(ElasticTraining, BadBoundsAreOneErrorNamingThem) {
  TempDir cwd("elastic_bad");
  const auto train = [&](const std::string& extra, const std::string& schedule = "bsp-allreduce") {
    return runCommand("cd " + cwd.str() + " && " + troupeBinary() + " train " +
                      trainArgs(schedule) + " --rendezvous tcp://127.0.0.1:1 --run_id bad " +
                      extra);
  };
  EXPECT_TRUE(
      exitedWith(train("--num_workers 4:2"), 1, {"num_workers 4:2: MIN 4 is more than MAX 2"}));
  EXPECT_TRUE(exitedWith(train("--num_workers 2:4", "dist_sync"), 1,
                         {"num_workers 2:4: an elastic run needs schedule bsp-allreduce (this one "
                          "has 'dist_sync')"}));
  EXPECT_TRUE(exitedWith(train("--num_workers 2:4 --resume auto"), 1,
                         {"num_workers 2:4: an elastic run starts from scratch"}));
  const auto launch = [&](const std::string& args) {
    return runCommand("cd " + cwd.str() + " && " + troupeBinary() + " launch " + args + " -- true");
  };
  EXPECT_TRUE(
      exitedWith(launch("-n 3 --elastic 4:2"), 1, {"num_workers 4:2: MIN 4 is more than MAX 2"}));
  EXPECT_TRUE(exitedWith(launch("-n 5 --elastic 2:4"), 1,
                         {"-n 5: an elastic run of --elastic 2:4 starts 2 to 4 workers"}));
  EXPECT_TRUE(exitedWith(launch("-n 2 --elastic 2:4 --launcher mpi"), 1,
                         {"--elastic works with --launcher local or ssh"}));
}

}  // namespace
}  // namespace troupe
