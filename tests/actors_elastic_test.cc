// Elastic worlds' parts in-process: where a generation that starts part way through an epoch
// reads, and the rendezvous rounds on a real embedded TCP store (actors/run/elastic.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/core/messages.h"
#include "actors/core/system.h"
#include "actors/roles/roles.h"
#include "actors/run/elastic.h"
#include "actors/run/run_plan.h"
#include "actors/run/train_log.h"
#include "actors/run/trainer.h"
#include "cli_util.h"
#include "rendezvous/tcp_store.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

StepPlan planOf(std::int64_t epoch_size, std::int64_t global_batch) {
  StepPlan p;
  p.epoch_size = epoch_size;
  p.global_batch = global_batch;
  p.steps_per_epoch = epoch_size / global_batch;
  return p;
}

TEST(StepPlan, AWholeRunOrAResumedOneReadsAsStepTimesBatch) {
  for (const std::int64_t first : {0, 7, 10, 23}) {
    auto p = planOf(1000, 96);  // 10 steps an epoch, a tail of 40 records
    p.start(first, 3);
    EXPECT_EQ(p.last_step, 30);
    for (std::int64_t s = first; s < p.last_step; ++s) {
      EXPECT_EQ(p.epochOf(s), s / 10) << s;
      EXPECT_EQ(p.recordOf(s), (s % 10) * 96) << s;
      EXPECT_EQ(p.scheduleStep(s), s) << s;
      EXPECT_EQ(p.epochEndsAt(s + 1), (s + 1) % 10 == 0) << s;
    }
  }
}

// The updaters pause at an epoch's end (sending the coordinator their state) for an evaluation, a
// checkpoint or the run's end only; a resumed run counts epochs from the run's start.
TEST(StepPlan, UpdatersPauseAtAnEpochsEndOnlyForAnEvaluationACheckpointOrTheRunsEnd) {
  for (const std::int64_t first : {0, 10}) {  // from scratch, resumed after epoch 1
    SCOPED_TRACE(first);
    auto p = planOf(1000, 100);  // 10 steps an epoch
    p.start(first, 4);
    ASSERT_EQ(p.last_step, 40);
    EXPECT_FALSE(p.pausesAt(20));
    EXPECT_FALSE(p.pausesAt(30));
    EXPECT_TRUE(p.pausesAt(40));  // the run's end
    p.checkpoint_every = 2;
    EXPECT_TRUE(p.pausesAt(20));  // epoch 2's checkpoint
    EXPECT_FALSE(p.pausesAt(30));
    p.checkpoint_every = 0;
    p.evaluates = true;
    for (const std::int64_t done : {20, 30, 40})
      EXPECT_TRUE(p.pausesAt(done)) << done;
  }
}

// Steps 0..k-1 of epoch 0 ran with 3 workers (global batch 192); the rest of the epoch and the
// next run with 2 (128). Every record position of the epoch is trained once, but a tail shorter
// than the new global batch; the next epoch starts at position 0 with whole steps of 128.
TEST(StepPlan, ARegenerationPartWayCutsTheRestOfTheEpochSoNoRecordIsTrainedTwiceOrLost) {
  const std::int64_t epoch_size = 60000;
  for (const std::int64_t k : {1, 100, 178, 311}) {
    auto before = planOf(epoch_size, 192);
    before.start(0, 2);
    std::vector<int> seen(static_cast<std::size_t>(epoch_size), 0);
    auto mark = [&](const StepPlan& p, std::int64_t s) {
      for (std::int64_t i = 0; i < p.global_batch; ++i)
        ++seen[static_cast<std::size_t>(p.recordOf(s) + i)];
    };
    for (std::int64_t s = 0; s < k; ++s)
      mark(before, s);
    auto after = planOf(epoch_size, 128);
    after.startAt(k, before.epochOf(k), before.recordOf(k), 2);
    std::int64_t s = k;
    for (; after.epochOf(s) == 0; ++s)
      mark(after, s);
    EXPECT_TRUE(after.epochEndsAt(s)) << k;
    std::int64_t trained = 0;
    for (std::size_t i = 0; i < seen.size(); ++i) {
      ASSERT_LE(seen[i], 1) << "record position " << i << " trained twice, change at step " << k;
      trained += seen[i];
      if (seen[i] == 0) {
        ASSERT_GE(static_cast<std::int64_t>(i), trained) << "a gap before the tail at " << i;
      }
    }
    EXPECT_GT(trained, epoch_size - 128) << k;
    EXPECT_EQ(after.recordOf(s), 0);
    EXPECT_EQ(after.epochOf(s), 1);
    EXPECT_EQ(after.last_step, s + epoch_size / 128);
    // The learning-rate schedule sees the epoch's progress in the new batch's steps.
    EXPECT_EQ(after.scheduleStep(s), after.steps_per_epoch);
  }
}

TEST(ElasticBounds, ParseNumberOrMinMaxAndNameWhatIsWrong) {
  EXPECT_EQ(parseNumWorkers("3").fixed, 3);
  EXPECT_FALSE(parseNumWorkers("3").elastic());
  const auto b = parseNumWorkers("2:4");
  EXPECT_TRUE(b.elastic());
  EXPECT_EQ(b.min, 2);
  EXPECT_EQ(b.max, 4);
  auto error = [](const char* text) {
    try {
      parseNumWorkers(text);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("4:2"), "num_workers 4:2: MIN 4 is more than MAX 2");
  EXPECT_EQ(error("0:2"), "num_workers 0:2: MIN must be at least 1");
  EXPECT_NE(error("two").find("num_workers 'two': expected a number of workers N, or MIN:MAX"),
            std::string::npos);
  EXPECT_NE(error("2:x").find("num_workers '2:x'"), std::string::npos);
}

class ElasticRendezvousTest : public ::testing::Test {
 protected:
  std::shared_ptr<rendezvous::Store> client() {
    return rendezvous::connectTcpStore("127.0.0.1", server_->port(), 5s);
  }
  Member member(const std::string& name, int old_rank, std::int64_t step) {
    Member m;
    m.name = name;
    m.old_rank = old_rank;
    m.step = step;
    return m;
  }
  std::future<Generation> joinLater(WorkerBounds bounds, Member m,
                                    std::chrono::milliseconds timeout = 10s) {
    return std::async(std::launch::async, [this, bounds, m, timeout] {
      return ElasticRendezvous(client(), bounds, timeout).join(m);
    });
  }
  // a and b form round 0 as a generation of 2.
  void formTwo(WorkerBounds bounds) {
    auto a = joinLater(bounds, member("a", -1, -1));
    auto b = joinLater(bounds, member("b", -1, -1));
    ASSERT_EQ(a.get().world(), 2);
    ASSERT_EQ(b.get().world(), 2);
  }
  // A store client that registers in `round` as a newcomer would (count, then record), and
  // beats `beats` times, 200 ms apart, as a waiting worker does; its index.
  int registerByHand(int round, const std::string& name) {
    auto store = client();
    const auto index = store->add("elastic/" + std::to_string(round) + "/count", 1) - 1;
    store->set("elastic/" + std::to_string(round) + "/member/" + std::to_string(index),
               "-1 -1 -1 0 0 " + name);
    return static_cast<int>(index);
  }
  void beatByHand(int round, int index, int beats) {
    auto store = client();
    for (int i = 0; i < beats; ++i) {
      store->add("elastic/" + std::to_string(round) + "/beat/" + std::to_string(index), 1);
      std::this_thread::sleep_for(200ms);
    }
  }
  // Whether joinerWaiting(round, world) turns true within `within`, asked every 500 ms as the
  // coordinator does.
  static bool seesJoiner(ElasticRendezvous& watcher, int round, int world,
                         std::chrono::milliseconds within) {
    const auto deadline = std::chrono::steady_clock::now() + within;
    for (;;) {
      if (watcher.joinerWaiting(round, world)) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(500ms);
    }
  }
  std::unique_ptr<rendezvous::TcpStoreServer> server_ =
      rendezvous::startTcpStoreServer("127.0.0.1", 0);
};

// Two survivors (old ranks 1 and 0, one a step behind) and a newcomer: ranks keep the old order,
// the newcomer comes last, and the state comes from the one with the most steps.
TEST_F(ElasticRendezvousTest, SurvivorsKeepTheirOrderNewcomersComeLastTheNewestStateIsTheSource) {
  const WorkerBounds bounds{0, 2, 4};
  std::vector<Member> members = {member("a", 1, 41), member("b", 0, 42), member("c", -1, -1)};
  std::vector<std::future<Generation>> joins;
  for (const auto& m : members)
    joins.push_back(joinLater(bounds, m));
  std::set<int> ranks;
  for (auto& j : joins) {
    const auto g = j.get();
    ASSERT_EQ(g.world(), 3);
    EXPECT_EQ(g.round, 0);
    EXPECT_EQ(g.members[0].name, "b");
    EXPECT_EQ(g.members[1].name, "a");
    EXPECT_EQ(g.members[2].name, "c");
    EXPECT_EQ(g.source, 0);
    ranks.insert(g.rank);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
}

// MAX 2: a generation of 2 forms; a newcomer waits in the next round, which a running generation
// with room sees (one at MAX does not), and is admitted when a member of the run comes.
TEST_F(ElasticRendezvousTest, ANewcomerWaitsInTheNextRoundWhichTheRunningOneSeesAndAdmitsIt) {
  const WorkerBounds bounds{0, 1, 2};
  formTwo(bounds);
  ElasticRendezvous watcher(client(), bounds, 10s);
  EXPECT_FALSE(watcher.joinerWaiting(0, 1));
  auto newcomer = joinLater(bounds, member("c", -1, -1));
  EXPECT_TRUE(seesJoiner(watcher, 0, 1, 5s));
  EXPECT_FALSE(watcher.joinerWaiting(0, 2)) << "a generation at MAX has no room";
  // b left; a comes from the generation of round 0.
  const auto a = ElasticRendezvous(client(), bounds, 10s).join(member("a", 0, 7));
  const auto c = newcomer.get();
  for (const auto& g : {a, c}) {
    EXPECT_EQ(g.round, 1);
    ASSERT_EQ(g.world(), 2);
    EXPECT_EQ(g.members[0].name, "a");
    EXPECT_EQ(g.members[1].name, "c");
    EXPECT_EQ(g.source, 0);
  }
  EXPECT_EQ(a.rank, 0);
  EXPECT_EQ(c.rank, 1);
}

// Once the run formed, newcomers never form a generation of their own: with no worker of the run
// to admit them they wait out their timeout, told why.
TEST_F(ElasticRendezvousTest, NewcomersAloneInAFormedRunNeverFormAGenerationAndAreToldWhy) {
  const WorkerBounds bounds{0, 1, 2};
  formTwo(bounds);
  auto c = joinLater(bounds, member("c", -1, -1), 800ms);
  auto d = joinLater(bounds, member("d", -1, -1), 800ms);
  for (auto* f : {&c, &d}) {
    try {
      f->get();
      ADD_FAILURE() << "a newcomer formed a generation without the run's workers";
    } catch (const TimeoutError& e) {
      EXPECT_EQ(std::string(e.what()),
                "elastic rendezvous round 1: no worker of the run came to admit this one within "
                "0.8 s (num_workers 1:2); the run's generation 0 has MAX 2 workers: none can join "
                "until one leaves");
    }
  }
  EXPECT_FALSE(client()->check({"elastic/1/closed"}));
}

// A store client with the run's secret writes a member record for the next round (and a beat
// that never moves) and does nothing else: no one pauses for it, and the run's workers re-form
// without it at once.
TEST_F(ElasticRendezvousTest, AForgedMemberWhoseBeatNeverMovesNeitherPausesNorHoldsUpTheRun) {
  const WorkerBounds bounds{0, 1, 3};
  formTwo(bounds);
  const int forged = registerByHand(1, "forged:1");
  client()->set("elastic/1/beat/0", "5");
  ElasticRendezvous watcher(client(), bounds, 10s);
  EXPECT_FALSE(seesJoiner(watcher, 0, 2, 2s));
  const auto start = std::chrono::steady_clock::now();
  auto b = joinLater(bounds, member("b", 1, 9));
  const auto a = ElasticRendezvous(client(), bounds, 10s).join(member("a", 0, 9));
  EXPECT_EQ(b.get().world(), 2);
  EXPECT_EQ(a.round, 1);
  ASSERT_EQ(a.world(), 2);
  EXPECT_EQ(a.members[0].name, "a");
  EXPECT_EQ(a.members[1].name, "b");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(client()->get("elastic/1/closed", 1s).find(std::to_string(forged)), std::string::npos);
}

// A joiner that beats (the running generation sees it), then stops (SIGSTOP): the generation no
// longer sees it. Resumed (SIGCONT) as the run's workers come to the round, then stopped again:
// they close the round without it, well within their timeout.
TEST_F(ElasticRendezvousTest, AJoinerThatStopsBeatingIsNeitherWaitedForNorAdmitted) {
  const WorkerBounds bounds{0, 1, 4};
  formTwo(bounds);
  const int joiner = registerByHand(1, "stopped:1");
  auto beating = [&](std::atomic<bool>& stop) {
    return std::async(std::launch::async, [&, store = client()] {
      while (!stop.load()) {
        store->add("elastic/1/beat/" + std::to_string(joiner), 1);
        std::this_thread::sleep_for(200ms);
      }
    });
  };
  ElasticRendezvous watcher(client(), bounds, 10s);
  {
    std::atomic<bool> stop{false};
    auto beats = beating(stop);
    EXPECT_TRUE(seesJoiner(watcher, 0, 2, 2s));
    stop = true;
  }
  watcher.joinerWaiting(0, 2);
  std::this_thread::sleep_for(500ms);
  EXPECT_FALSE(watcher.joinerWaiting(0, 2));

  const auto start = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  auto beats = beating(stop);
  auto b = joinLater(bounds, member("b", 1, 9));
  auto a = joinLater(bounds, member("a", 0, 9));
  std::this_thread::sleep_for(200ms);
  stop = true;
  beats.get();
  const auto ga = a.get();
  EXPECT_EQ(b.get().world(), 2);
  EXPECT_EQ(ga.round, 1);
  ASSERT_EQ(ga.world(), 2);
  EXPECT_EQ(ga.members[0].name, "a");
  EXPECT_EQ(ga.members[1].name, "b");
  EXPECT_EQ(client()->get("elastic/1/closed", 1s), "1 2");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
}

// A worker whose run print differs is refused before it counts in any round, naming what
// differs; one that comes after the run ended is told so.
TEST_F(ElasticRendezvousTest, AWorkerThatDisagreesWithTheRunIsRefusedBeforeItCounts) {
  const WorkerBounds bounds{0, 1, 3};
  const RunPrint run = {{"batch_size", "64"}, {"num_epochs", "4"}};
  EXPECT_TRUE(ElasticRendezvous(client(), bounds, 5s).agreeOnRun("r1", run));
  EXPECT_TRUE(ElasticRendezvous(client(), bounds, 5s).agreeOnRun("r1", run));
  try {
    ElasticRendezvous(client(), bounds, 5s)
        .agreeOnRun("r1", {{"batch_size", "64"}, {"num_epochs", "5"}});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "this worker disagrees with elastic run r1 (num_epochs: the run has 4, this one 5); "
              "it was not counted");
  }
  EXPECT_EQ(client()->add("elastic/0/count", 0), 0);
  ElasticRendezvous(client(), bounds, 5s).finishRun();
  EXPECT_FALSE(ElasticRendezvous(client(), bounds, 5s).agreeOnRun("r1", run));
}

TEST_F(ElasticRendezvousTest, FewerThanMinEndTheWaitNamingTheRoundAndWhoCame) {
  ElasticRendezvous r(client(), WorkerBounds{0, 2, 3}, 300ms);
  const auto start = std::chrono::steady_clock::now();
  try {
    r.join(member("host:123", -1, -1));
    FAIL() << "no error";
  } catch (const TimeoutError& e) {
    EXPECT_NE(
        std::string(e.what()).find("elastic rendezvous round 0: 1 of at least 2 workers "
                                   "(num_workers 2:3) came within 0.3 s (host:123); start more "
                                   "workers, or lower MIN"),
        std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

// A store value that is not troupe's (a shared Redis, say) is one error naming the key.
TEST_F(ElasticRendezvousTest, AMalformedRoundInTheStoreIsAnErrorNamingTheKey) {
  client()->set("elastic/0/closed", "lots");
  client()->add("elastic/0/count", 1);  // someone else came first
  try {
    ElasticRendezvous(client(), WorkerBounds{0, 1, 2}, 5s).join(member("x", -1, -1));
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "elastic rendezvous: the store's 'elastic/0/closed' holds 'lots', not the indices "
              "of a round's members");
  }
}

TEST_F(ElasticRendezvousTest, AWorkerThatComesAfterTheRunEndedIsToldSo) {
  ElasticRendezvous(client(), WorkerBounds{0, 1, 2}, 10s).finishRun();
  const auto g = ElasticRendezvous(client(), WorkerBounds{0, 1, 2}, 10s).join(member("z", -1, -1));
  EXPECT_TRUE(g.run_over);
}

// A worker waiting for a round that never fills (the run has no room, then ends) is told the
// run is over instead of waiting out its timeout.
TEST_F(ElasticRendezvousTest, AWorkerWaitingWhenTheRunEndsIsToldSo) {
  const auto start = std::chrono::steady_clock::now();
  auto waiting = std::async(std::launch::async, [&] {
    return ElasticRendezvous(client(), WorkerBounds{0, 2, 3}, 30s).join(member("late", -1, -1));
  });
  std::this_thread::sleep_for(200ms);
  ElasticRendezvous(client(), WorkerBounds{0, 2, 3}, 30s).finishRun();
  EXPECT_TRUE(waiting.get().run_over);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// A rank of a generation that disagrees with rank 0's plan (a backstop behind the run print)
// leaves with its own error; rank 0's word is a PlanRefusedError, which the elastic loop takes
// as a worker lost: it re-forms without that rank instead of ending.
TEST(ElasticPlan, RankZerosWordThatARankRefusedThePlanIsAPlanRefusedError) {
  auto server = rendezvous::startTcpStoreServer("127.0.0.1", 0);
  auto agree = [&](int rank, std::int64_t num_params) {
    return std::async(std::launch::async, [&, rank, num_params] {
      auto store = rendezvous::connectTcpStore("127.0.0.1", server->port(), 5s);
      agreeOnPlan(*store, rank, 2, {{"num_params", std::to_string(num_params)}}, 5s);
    });
  };
  auto chief = agree(0, 10);
  auto other = agree(1, 11);
  try {
    other.get();
    ADD_FAILURE() << "rank 1 agreed";
  } catch (const PlanRefusedError& e) {
    ADD_FAILURE() << "the refusing rank's own error is no PlanRefusedError: " << e.what();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("num_params: rank 0 has 10, this one 11"),
              std::string::npos)
        << e.what();
  }
  try {
    chief.get();
    ADD_FAILURE() << "rank 0 went on";
  } catch (const PlanRefusedError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("rank 1 refused this run: rank 1 of 2 disagrees", 0), 0u)
        << e.what();
  }
}

// A generation that fails to form (a peer gone while it linked) destroys the chief's coordinator
// unstarted: the epoch so far, its time and its inputs stay as the generation before left them.
TEST(ElasticCarry, ACoordinatorWhoseGenerationNeverRanLeavesTheCarryAsItWas) {
  testing::TempDir dir("elastic_carry");
  TrainOptions options;
  TrainLog log(dir.str(), "carry", {});
  TrainResult result;
  auto carry = std::make_shared<EpochCarry>();
  carry->epoch.count = 1920;
  carry->epoch.correct = 1500;
  carry->complete_through = 30;
  carry->global_batch = 64;
  carry->epoch_index = 1;
  carry->epoch_seconds = 2.5;
  carry->cumulative_time = 40;
  carry->cumulative_inputs = 9600;
  const auto left = carry->left = std::chrono::steady_clock::now();
  CoordinatorConfig config;
  config.options = &options;
  config.log = &log;
  config.result = &result;
  config.carry = carry;
  config.plan = planOf(9600, 128);
  config.plan.startAt(30, 1, 1920, 4);
  {
    auto system = makeRuntime(SystemOptions{});
    system->spawn(makeCoordinator("coordinator", config));
  }
  EXPECT_EQ(carry->epoch.count, 1920);
  EXPECT_EQ(carry->epoch.correct, 1500);
  EXPECT_EQ(carry->complete_through, 30);
  EXPECT_EQ(carry->global_batch, 64);
  EXPECT_EQ(carry->epoch_index, 1);
  EXPECT_EQ(carry->epoch_seconds, 2.5);
  EXPECT_EQ(carry->cumulative_time, 40);
  EXPECT_EQ(carry->cumulative_inputs, 9600);
  EXPECT_EQ(carry->left, left);
}

// A generation that starts where the one before (2 workers, 128 a step) left fewer of epoch 2's
// records than one of its own steps (3 workers, 192: 128 left) ends epoch 2 before any step, with
// the carried count, and counts epoch 3 apart (CI once logged both epochs as one row of 19072).
TEST(ElasticCarry, AGenerationWithNoWholeStepOfItsFirstEpochLeftEndsThatEpochFirst) {
  testing::TempDir dir("elastic_epoch_end");
  TrainOptions options;
  options.num_epochs = 3;
  TrainLog log(dir.str(), "carry", {});
  TrainResult result;
  auto carry = std::make_shared<EpochCarry>();
  carry->epoch.count = 9472;  // 74 steps of 128 of epoch 2
  carry->epoch.loss_sum = 9472;
  carry->complete_through = 149;
  carry->global_batch = 128;
  carry->epoch_index = 1;
  carry->cumulative_inputs = 9600;
  CoordinatorConfig config;
  config.options = &options;
  config.log = &log;
  config.result = &result;
  config.carry = carry;
  config.checkpoint_dir = dir.str();
  config.num_params = 4;
  config.plan = planOf(9600, 192);
  config.plan.startAt(149, 1, 9472, 3);
  ASSERT_EQ(config.plan.first_epoch_steps, 0);
  ASSERT_EQ(config.plan.last_step, 199);
  auto system = makeRuntime(SystemOptions{});
  const Address coordinator = system->spawn(makeCoordinator("coordinator", config));
  system->tell(coordinator, EpochEnd{149, {}, {}, 0, 0, /*paused=*/false});
  for (std::int64_t step = 149; step < 199; ++step)
    system->tell(coordinator, StepDone{step, 0, 2.0 * 192, 96, 192});
  system->tell(coordinator, EpochEnd{199, Tensor::host({4}), Tensor::host({0}), 0, 0, true});
  system->run();
  ASSERT_EQ(result.epochs.size(), 2u);
  EXPECT_EQ(result.epochs[0].epoch, 2);
  EXPECT_EQ(result.epochs[0].loss, 1.0);
  EXPECT_EQ(result.epochs[1].epoch, 3);
  EXPECT_EQ(result.epochs[1].loss, 2.0);
  EXPECT_EQ(result.epochs[1].accuracy, 0.5);
  EXPECT_EQ(result.steps, 199);
}

// What an updater tells its coordinator and replicas, in order; the first weights end the run.
struct Heard final : Actor {
  explicit Heard(std::shared_ptr<std::vector<std::string>> heard)
      : Actor("heard"), heard_(std::move(heard)) {
    on<EpochEnd>([this](EpochEnd& e) {
      heard_->push_back("EpochEnd " + std::to_string(e.step) + (e.paused ? " paused" : ""));
    });
    on<Weights>([this](Weights& w) {
      heard_->push_back("Weights " + std::to_string(w.step));
      system().shutdown();
    });
  }
  std::shared_ptr<std::vector<std::string>> heard_;
};

// The same generation's updater: epoch 2's end (paused for its evaluation) before any weights go
// out, which Resume then sends.
TEST(ElasticCarry, AnUpdaterWithNoWholeStepOfItsFirstEpochLeftEndsThatEpochFirst) {
  auto heard = std::make_shared<std::vector<std::string>>();
  auto system = makeRuntime(SystemOptions{});
  const Address sink = system->spawn(std::make_unique<Heard>(heard));
  UpdaterConfig config;
  config.initial_weights = Tensor::host({4});
  config.plan = planOf(9600, 192);
  config.plan.evaluates = true;
  config.plan.startAt(149, 1, 9472, 3);
  config.replicas = {sink};
  config.coordinator = sink;
  const Address updater = system->spawn(makeUpdater("updater", config));
  system->tell(updater, Resume{});
  system->run();
  EXPECT_EQ(*heard, (std::vector<std::string>{"EpochEnd 149 paused", "Weights 149"}));
}

}  // namespace
}  // namespace troupe::actors
