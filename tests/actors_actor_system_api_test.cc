// troupe::ActorSystem (include/troupe/actor_system.h): a service's own actors, found by name, on
// the caller's executor (an Asio io_context the test runs on threads of its own) or on the
// system's threads; errors as values.
#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "troupe/actor_system.h"
#include "troupe/error.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;

struct Ball {
  int hits = 0;
};
struct Serve {
  actors::Address to;
};

// Sends the ball back to the other player (told by Serve or by its Address) until it was hit
// `rally` times; records the threads it ran on.
class Player final : public actors::Actor {
 public:
  Player(std::string name, int rally, std::atomic<int>& done, std::set<std::thread::id>& threads,
         std::mutex& mu)
      : Actor(std::move(name)) {
    on<Serve>([this](Serve& s) {
      other_ = s.to;
      send(other_, Ball{1});
    });
    on<Ball>([this, rally, &done, &threads, &mu](Ball& b) {
      {
        std::lock_guard lock(mu);
        threads.insert(std::this_thread::get_id());
      }
      ++received_;
      if (b.hits >= rally) {
        done.fetch_add(1);
        return;
      }
      send(other_, Ball{b.hits + 1});
    });
    on<actors::Address>([this](actors::Address& a) { other_ = a; });
  }
  int received() const { return received_; }

 private:
  actors::Address other_;
  int received_ = 0;
};

TEST(ActorSystemApi, ActorsFoundByNameRunOnTheCallersExecutor) {
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::vector<std::thread> pool;
  std::set<std::thread::id> executor_threads;
  for (int i = 0; i < 2; ++i) {
    pool.emplace_back([&io] { io.run(); });
    executor_threads.insert(pool.back().get_id());
  }
  std::atomic<int> done{0};
  std::set<std::thread::id> ran_on;
  std::mutex mu;
  {
    auto system = ActorSystem::create(
        {.executor = [&io](std::function<void()> task) { asio::post(io, std::move(task)); },
         .threads = 1,
         .mailbox_capacity = 64,
         .send_timeout = 30s});
    ASSERT_TRUE(system->spawn("ping", std::make_unique<Player>("ping", 1000, done, ran_on, mu)));
    ASSERT_TRUE(system->spawn("pong", std::make_unique<Player>("pong", 1000, done, ran_on, mu)));
    ASSERT_TRUE(system->start());
    const auto ping = system->find("ping"), pong = system->find("pong");
    ASSERT_TRUE(ping && pong);
    EXPECT_NE(ping.value(), pong.value());
    ASSERT_TRUE(system->tell("pong", ping.value()));         // pong returns balls to ping
    ASSERT_TRUE(system->tell("ping", Serve{pong.value()}));  // ping serves to pong
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (done.load() == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    EXPECT_EQ(done.load(), 1) << "the rally did not reach 1000 hits";
    EXPECT_EQ(system->actors().size(), 2u);
    EXPECT_TRUE(system->stop());
  }
  work.reset();
  io.stop();
  for (auto& t : pool)
    t.join();
  std::lock_guard lock(mu);
  ASSERT_FALSE(ran_on.empty());
  for (const auto& id : ran_on)
    EXPECT_TRUE(executor_threads.count(id)) << "a handler ran off the caller's executor";
}

class Thrower final : public actors::Actor {
 public:
  Thrower() : Actor("thrower") {
    on<Ball>([](Ball&) { throw InputError("this ball is out"); });
  }
};

TEST(ActorSystemApi, BadCallsAndAFailingActorAreErrorValues) {
  auto system = ActorSystem::create();
  ASSERT_TRUE(system->spawn("thrower", std::make_unique<Thrower>()));
  const auto twice = system->spawn("thrower", std::make_unique<Thrower>());
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.status().message(), "spawn of 'thrower': an actor has that name already");
  const auto nobody = system->tell("nobody", Ball{});
  ASSERT_FALSE(nobody);
  EXPECT_EQ(nobody.message(), "no actor named 'nobody' (1 actor(s) spawned)");
  EXPECT_EQ(system->wait(1ms).kind(), ErrorKind::kInput);  // never started
  ASSERT_TRUE(system->start());
  EXPECT_EQ(system->wait(1ms).kind(), ErrorKind::kTimeout);
  ASSERT_TRUE(system->tell("thrower", Ball{}));
  const Status failed = system->wait(30s);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.kind(), ErrorKind::kInput) << failed.message();
  EXPECT_NE(failed.message().find("actor 'thrower' failed handling Ball: this ball is out"),
            std::string::npos)
      << failed.message();
  EXPECT_EQ(system->stop().message(), failed.message());
}

}  // namespace
}  // namespace troupe
