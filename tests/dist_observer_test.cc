// troupe::Observer (include/troupe/observer.h): this test process joins a real two-process run of
// `troupe train` as an observer and gets the chief's weights every N steps and after the last
// one; an observer that leaves part way does not stop the run.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cli_util.h"
#include "troupe/observer.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using testing::CommandResult;
using testing::runCommand;
using testing::TempDir;
using testing::testData;
using testing::troupeBinary;

// MLP 784-256-128-10.
constexpr std::int64_t kMlpParams = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10;

// Two workers of an MLP run of 2 epochs x 50 steps (global batch 128), started by hand.
struct TwoWorkerRun {
  explicit TwoWorkerRun(const std::string& name)
      : cwd(name), port(testing::freeLoopbackPort()), run_id(name) {
    const std::string common =
        "cd " + cwd.str() + " && " + troupeBinary() + " train --model mlp --train_data " +
        testData("lmdb") +
        "/train --db_type lmdb --num_epochs 2 --epoch_size 6400 "
        "--num_shards 2 --run_id " +
        run_id +
        " --schedule bsp-allreduce --log_every 0 --threads 1 --checkpoint_every 0 --rendezvous " +
        rendezvous();
    for (int rank = 0; rank < 2; ++rank) {
      workers.emplace_back([this, common, rank] {
        results[static_cast<std::size_t>(rank)] =
            runCommand(common + " --shard_id " + std::to_string(rank));
      });
    }
  }
  ~TwoWorkerRun() { join(); }
  void join() {
    for (auto& w : workers) {
      if (w.joinable()) w.join();
    }
  }
  std::string rendezvous() const { return "tcp://127.0.0.1:" + std::to_string(port); }
  ObserverSettings settings() const {
    return {{"rendezvous", rendezvous()}, {"run_id", run_id}, {"rendezvous_timeout", "30"}};
  }

  TempDir cwd;
  std::uint16_t port;
  std::string run_id;
  CommandResult results[2];
  std::vector<std::thread> workers;
};

TEST(Observer, GetsTheChiefsWeightsEveryNStepsAndTheLastOnesThenTheRunEnds) {
  TwoWorkerRun run("observed");
  std::mutex mu;
  std::vector<std::int64_t> steps;
  bool all_finite = true, sizes_right = true;
  auto observer = Observer::join(run.settings(), 10, [&](const ObservedWeights& w) {
    std::lock_guard lock(mu);
    steps.push_back(w.step);
    sizes_right = sizes_right && static_cast<std::int64_t>(w.weights.size()) == kMlpParams &&
                  w.steps_per_epoch == 50 && w.last_step == 100;
    for (const float v : w.weights)
      all_finite = all_finite && std::isfinite(v);
  });
  ASSERT_TRUE(observer) << observer.status().message();
  const Status ended = observer.value()->wait(120s);
  EXPECT_TRUE(ended) << ended.message();
  run.join();
  ASSERT_EQ(run.results[0].exit_code, 0) << run.results[0].output;
  ASSERT_EQ(run.results[1].exit_code, 0) << run.results[1].output;
  std::lock_guard lock(mu);
  // It joined while the run went on: the multiples of 10 from the first it got, up to step 100.
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), 100);
  EXPECT_GE(steps.size(), 2u) << "it joined only for the last step";  // on this machine: all 10
  for (std::size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i] % 10, 0) << "step " << steps[i];
    if (i > 0) {
      EXPECT_EQ(steps[i], steps[i - 1] + 10);
    }
  }
  EXPECT_TRUE(sizes_right);
  EXPECT_TRUE(all_finite);
  EXPECT_EQ(observer.value()->newestStep(), 100);
  EXPECT_NE(run.results[0].output.find("joined the run: the weights every 10 steps"),
            std::string::npos)
      << run.results[0].output;
}

// A run of one process at a rendezvous (troupe launch -n 1; here by hand, serving its store) is
// observed as any other: its observer never connected and failed late ("tcp store ... closed the
// connection"), for a run of one joined no cluster.
TEST(Observer, ARunOfOneProcessAtARendezvousIsObservedToItsLastStep) {
  TempDir cwd("observed_alone");
  const std::string rendezvous = "tcp://127.0.0.1:" + std::to_string(testing::freeLoopbackPort());
  CommandResult result;
  std::thread worker([&] {
    result = runCommand("cd " + cwd.str() + " && " + troupeBinary() +
                        " train --model mlp --train_data " + testData("lmdb") +
                        "/train --num_epochs 2 --epoch_size 6400 --batch_size 128 --run_id alone "
                        "--log_every 0 --threads 1 --checkpoint_every 0 --rendezvous " +
                        rendezvous);
  });
  std::vector<std::int64_t> steps;
  std::mutex mu;
  auto observer = Observer::join(
      {{"rendezvous", rendezvous}, {"run_id", "alone"}, {"rendezvous_timeout", "30"}}, 25,
      [&](const ObservedWeights& w) {
        std::lock_guard lock(mu);
        steps.push_back(w.step);
      });
  ASSERT_TRUE(observer) << observer.status().message();
  const Status ended = observer.value()->wait(120s);
  EXPECT_TRUE(ended) << ended.message();
  worker.join();
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::lock_guard lock(mu);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), 100);
}

TEST(Observer, OneThatLeavesPartWayDoesNotStopTheRun) {
  TwoWorkerRun run("observer-leaves");
  auto observer = Observer::join(run.settings(), 1, nullptr);
  ASSERT_TRUE(observer) << observer.status().message();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (observer.value()->newestStep() < 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  const std::int64_t seen = observer.value()->newestStep();
  observer.value().reset();  // leaves the run
  run.join();
  EXPECT_GE(seen, 1);
  EXPECT_EQ(run.results[0].exit_code, 0) << run.results[0].output;
  EXPECT_EQ(run.results[1].exit_code, 0) << run.results[1].output;
  EXPECT_NE(run.results[0].output.find("left the run"), std::string::npos) << run.results[0].output;
}

TEST(Observer, BadSettingsAreErrorValues) {
  auto never = Observer::join({{"rendezvous", "tcp://127.0.0.1:1"}, {"run_id", "r"}}, 0, nullptr);
  ASSERT_FALSE(never);
  EXPECT_EQ(never.status().message(), "Observer::join: every 0 steps: a number of steps >= 1");
  auto nowhere = Observer::join({}, 5, nullptr);
  ASSERT_FALSE(nowhere);
  EXPECT_NE(nowhere.status().message().find("no rendezvous"), std::string::npos)
      << nowhere.status().message();
  auto unknown = Observer::join({{"rendezvos", "tcp://127.0.0.1:1"}}, 5, nullptr);
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.status().message().find("rendezvous"), std::string::npos)
      << unknown.status().message();
}

}  // namespace
}  // namespace troupe
