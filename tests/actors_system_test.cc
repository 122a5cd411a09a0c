#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/core/system.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

struct Ping {
  int n;
};
struct Pong {
  int n;
};
struct Stop {};

class Echo : public Actor {
 public:
  Echo() : Actor("echo") {
    on<Ping>([this](Ping& p) { send(reply_to, Pong{p.n}); });
  }
  Address reply_to;
};

class Collector : public Actor {
 public:
  Collector(int expected, std::vector<int>* seen, int delay_ms = 0)
      : Actor("collector"), expected_(expected), seen_(seen), delay_ms_(delay_ms) {
    on<Pong>([this](Pong& p) {
      if (delay_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
      seen_->push_back(p.n);
      if (static_cast<int>(seen_->size()) == expected_) system().shutdown();
    });
  }

 private:
  int expected_;
  std::vector<int>* seen_;
  int delay_ms_;
};

TEST(Runtime, DeliversMessagesFromOneSenderInOrder) {
  auto system = makeRuntime({});
  std::vector<int> seen;
  auto collector = system->spawn<Collector>({}, 200, &seen);
  auto echo_actor = std::make_unique<Echo>();
  echo_actor->reply_to = collector;
  auto echo = system->spawn(std::move(echo_actor));
  // More messages than a mailbox holds: tell() waits for room while the system runs.
  std::thread sender([&] {
    for (int i = 0; i < 200; ++i)
      system->tell(echo, Ping{i});
  });
  system->run();
  sender.join();
  ASSERT_EQ(seen.size(), 200u);
  for (int i = 0; i < 200; ++i)
    EXPECT_EQ(seen[i], i);
}

// A producer that floods a slow consumer; it records how far ahead of the consumer it got.
class Producer : public Actor {
 public:
  Producer(Address consumer, int count, std::atomic<int>* sent)
      : Actor("producer"), consumer_(consumer), count_(count), sent_(sent) {
    on<Ping>([this](Ping& p) {
      send(consumer_, Pong{p.n});
      sent_->fetch_add(1);
      if (p.n + 1 < count_) send(self(), Ping{p.n + 1});
    });
  }

 private:
  Address consumer_;
  int count_;
  std::atomic<int>* sent_;
};

class SlowConsumer : public Actor {
 public:
  SlowConsumer(int expected, std::atomic<int>* sent, int* max_lead)
      : Actor("slow"), expected_(expected), sent_(sent), max_lead_(max_lead) {
    on<Pong>([this](Pong&) {
      ++received_;
      *max_lead_ = std::max(*max_lead_, sent_->load() - received_);
      std::this_thread::sleep_for(1ms);
      if (received_ == expected_) system().shutdown();
    });
  }

 private:
  int expected_;
  std::atomic<int>* sent_;
  int* max_lead_;
  int received_ = 0;
};

TEST(Runtime, FullMailboxHoldsTheProducerBack) {
  SystemOptions options;
  options.mailbox_capacity = 4;
  auto system = makeRuntime(options);
  std::atomic<int> sent{0};
  int max_lead = 0;
  auto consumer = system->spawn<SlowConsumer>({}, 100, &sent, &max_lead);
  auto producer = system->spawn<Producer>({}, consumer, 100, &sent);
  system->tell(producer, Ping{0});
  system->run();
  // Capacity 4 in the mailbox, one in the producer's outbox, one being handled.
  EXPECT_LE(max_lead, 6);
  EXPECT_EQ(sent.load(), 100);
}

class Thrower : public Actor {
 public:
  Thrower() : Actor("thrower/3") {
    on<Ping>([](Ping&) { throw InputError("record 00000042 is corrupt"); });
  }
};

TEST(Runtime, AHandlerThatThrowsEndsTheRunNamingActorAndMessage) {
  auto system = makeRuntime({});
  auto a = system->spawn<Thrower>({});
  system->tell(a, Ping{1});
  try {
    system->run();
    FAIL() << "run() returned normally after a handler threw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("thrower/3"), std::string::npos) << what;
    EXPECT_NE(what.find("Ping"), std::string::npos) << what;
    EXPECT_NE(what.find("record 00000042 is corrupt"), std::string::npos) << what;
  }
}

TEST(Runtime, AMessageWithoutHandlerIsAnErrorNamingTheType) {
  auto system = makeRuntime({});
  auto a = system->spawn<Thrower>({});
  system->tell(a, Stop{});
  try {
    system->run();
    FAIL() << "an unhandled message went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no handler for message Stop"), std::string::npos)
        << e.what();
  }
}

class TimerUser : public Actor {
 public:
  explicit TimerUser(std::chrono::steady_clock::time_point* fired) : Actor("timer"), fired_(fired) {
    on<Stop>([this](Stop&) {
      *fired_ = std::chrono::steady_clock::now();
      system().shutdown();
    });
  }
  void started() override { system().after(50ms, self(), Stop{}); }

 private:
  std::chrono::steady_clock::time_point* fired_;
};

TEST(Runtime, TimersDeliverAfterTheirDelay) {
  auto system = makeRuntime({});
  std::chrono::steady_clock::time_point fired;
  const auto start = std::chrono::steady_clock::now();
  system->spawn<TimerUser>({}, &fired);
  system->run();
  EXPECT_GE(fired - start, 45ms);
}

TEST(Runtime, AnActorOnANamedThreadAlwaysRunsOnIt) {
  struct Recorder : Actor {
    Recorder(std::vector<std::thread::id>* ids, int n) : Actor("rec"), ids_(ids), n_(n) {
      on<Ping>([this](Ping&) {
        ids_->push_back(std::this_thread::get_id());
        if (static_cast<int>(ids_->size()) == n_) system().shutdown();
      });
    }
    std::vector<std::thread::id>* ids_;
    int n_;
  };
  auto system = makeRuntime({});
  std::vector<std::thread::id> ids;
  auto a = system->spawn<Recorder>(SpawnOptions{.thread = "compute"}, &ids, 50);
  for (int i = 0; i < 50; ++i)
    system->tell(a, Ping{i});
  system->run();
  ASSERT_EQ(ids.size(), 50u);
  for (auto id : ids)
    EXPECT_EQ(id, ids[0]);
}

// SpawnOptions::inline_handlers: a handler runs on the deliverer's thread, before tell() returns;
// what the actor sends itself meanwhile comes after, in order.
TEST(Runtime, AnInlineActorHandlesOnTheDeliverersThreadInOrder) {
  struct Recorder : Actor {
    explicit Recorder(std::atomic<bool>* started) : Actor("inline"), started_(started) {
      on<Ping>([this](Ping& p) {
        std::lock_guard lock(mu);
        seen.emplace_back(p.n, std::this_thread::get_id());
        if (p.n == 100) send(self(), Ping{101});
      });
    }
    void started() override { started_->store(true); }
    std::atomic<bool>* started_;
    std::mutex mu;
    std::vector<std::pair<int, std::thread::id>> seen;
  };
  auto system = makeRuntime({});
  std::atomic<bool> started{false};
  auto owned = std::make_unique<Recorder>(&started);
  Recorder* recorder = owned.get();
  SpawnOptions options;
  options.inline_handlers = true;
  const auto a = system->spawn(std::move(owned), options);
  std::thread runner([&] { system->run(); });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!started.load() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(started.load());
  for (int i = 0; i < 20; ++i) {
    system->tell(a, Ping{i});
    std::lock_guard lock(recorder->mu);
    ASSERT_EQ(recorder->seen.size(), static_cast<std::size_t>(i + 1)) << "not handled in tell()";
    EXPECT_EQ(recorder->seen.back().first, i);
    EXPECT_EQ(recorder->seen.back().second, std::this_thread::get_id());
  }
  system->tell(a, Ping{100});
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard lock(recorder->mu);
      if (recorder->seen.size() == 22) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  system->shutdown();
  runner.join();
  ASSERT_EQ(recorder->seen.size(), 22u);
  EXPECT_EQ(recorder->seen[20].first, 100);
  EXPECT_EQ(recorder->seen[21].first, 101);
}

TEST(Runtime, SendingToAnotherNodeWithoutTransportIsAnError) {
  auto system = makeRuntime({});
  EXPECT_THROW(system->tell(Address{7, 0}, Ping{1}), Error);
}

TEST(Runtime, AnExternalSendToAFullMailboxTimesOutNamingTheActor) {
  struct Blocker : Actor {
    Blocker() : Actor("stuck") {
      on<Ping>([](Ping&) { std::this_thread::sleep_for(300ms); });
    }
  };
  SystemOptions options;
  options.mailbox_capacity = 1;
  options.external_send_timeout = 50ms;
  auto system = makeRuntime(options);
  auto a = system->spawn<Blocker>({});
  try {
    for (int i = 0; i < 5; ++i)
      system->tell(a, Ping{i});
    FAIL() << "the mailbox never filled";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'stuck'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(system->run(), Error);
}

// A callback that an actor's own work runs on its thread (a leased chunk's release, when the
// transport copies it at once) tells that actor from outside any actor: a note to itself, which
// does not wait for room in its own full mailbox (it waited there for ever, then timed out).
TEST(Runtime, AnExternalSendToTheActorWhoseHandlerMakesItIsNotBounded) {
  struct Notes : Actor {
    explicit Notes(int* seen) : Actor("notes"), seen_(seen) {
      on<Ping>([this](Ping& p) {
        if (p.n == 0) {
          for (int i = 1; i <= 10; ++i)
            system().tell(self(), Ping{i});  // as a callback would, from outside any actor
        } else if (++*seen_ == 10) {
          system().shutdown();
        }
      });
    }
    int* seen_;
  };
  SystemOptions options;
  options.mailbox_capacity = 2;
  options.external_send_timeout = 2000ms;
  auto system = makeRuntime(options);
  int seen = 0;
  auto a = system->spawn<Notes>({}, &seen);
  system->tell(a, Ping{0});
  const auto started = std::chrono::steady_clock::now();
  system->run();
  EXPECT_EQ(seen, 10);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 1000ms);
}

}  // namespace
}  // namespace troupe::actors
