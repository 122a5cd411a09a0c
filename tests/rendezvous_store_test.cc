// The Store contract, held by every backend: N ranks as threads, each with its own client, over
// one real backend (an embedded TCP server, a folder, a redis-server child process).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <latch>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "redis_util.h"
#include "rendezvous/exchange.h"
#include "rendezvous/file_store.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/redis_store.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous_util.h"
#include "troupe/error.h"

namespace troupe::rendezvous {
namespace {

using namespace testing;
using std::chrono::milliseconds;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

enum class Backend { kTcp, kFile, kRedis };

std::string backendName(Backend b) {
  switch (b) {
    case Backend::kTcp:
      return "Tcp";
    case Backend::kFile:
      return "File";
    case Backend::kRedis:
      return "Redis";
  }
  return "?";
}

// Runs fn(rank) on `world` threads; rethrows the first failure of any rank here.
template <typename Fn>
void runRanks(int world, Fn fn) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  if (first) std::rethrow_exception(first);
}

// Throws from a rank thread, so the test thread reports it.
void require(bool cond, const std::string& what) {
  if (!cond) throw std::runtime_error(what);
}

// One live backend for a test; connect() gives a fresh client for each rank.
class LiveBackend {
 public:
  explicit LiveBackend(Backend backend) : backend_(backend) {
    switch (backend_) {
      case Backend::kTcp:
        server_ = startTcpStoreServer("127.0.0.1", 0);
        break;
      case Backend::kFile: {
        auto pattern = (std::filesystem::temp_directory_path() / "troupe-rdv-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
        dir_ = pattern;
        break;
      }
      case Backend::kRedis:
        testing::sharedRedisServer().flush();
        break;
    }
  }
  ~LiveBackend() {
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  std::unique_ptr<Store> connect() const {
    switch (backend_) {
      case Backend::kTcp:
        return connectTcpStore("127.0.0.1", server_->port(), kLong);
      case Backend::kFile:
        return openFileStore(dir_);
      case Backend::kRedis: {
        RedisOptions options;
        options.port = testing::sharedRedisServer().port();
        options.connect_timeout = kLong;
        return connectRedisStore(options);
      }
    }
    return nullptr;
  }

 private:
  Backend backend_;
  std::unique_ptr<TcpStoreServer> server_;
  std::string dir_;
};

// ---- per backend ----------------------------------------------------------------------------

class StoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    try {
      live_ = std::make_unique<LiveBackend>(GetParam());
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
  }
  std::unique_ptr<LiveBackend> live_;
};

TEST_P(StoreTest, AddIsAtomicUnderContention) {
  constexpr int kThreads = 4;
  constexpr int kIncrements = 200;
  runRanks(kThreads, [&](int) {
    auto store = live_->connect();
    for (int i = 0; i < kIncrements; ++i)
      store->add("counter", 1);
  });
  auto store = live_->connect();
  EXPECT_EQ(store->add("counter", 0), kThreads * kIncrements);
  EXPECT_EQ(store->get("counter", kLong), "800");
  EXPECT_EQ(store->add("counter", -801), -1);
  EXPECT_EQ(store->add("fresh", 5), 5);
}

TEST_P(StoreTest, AddOnANonCounterFailsNamingTheKey) {
  auto store = live_->connect();
  store->set("text", "not a number");
  try {
    store->add("text", 1);
    FAIL() << "add on text did not throw";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'text'"));
  }
}

TEST_P(StoreTest, WaitTimesOutNamingExactlyTheMissingKeys) {
  auto store = live_->connect();
  store->set("here-a", "1");
  store->set("here-c", "3");
  const auto start = Clock::now();
  try {
    store->wait({"here-a", "gone-b", "here-c", "gone-d"}, kShort);
    FAIL() << "wait did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("waiting for keys 'gone-b', 'gone-d'"));
    EXPECT_THAT(e.what(), Not(HasSubstr("here")));
    EXPECT_THAT(e.what(), HasSubstr(store->describe()));
    EXPECT_THAT(e.what(), HasSubstr("250 ms"));
  }
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, kShort);
  EXPECT_LT(waited, kShort + milliseconds(1000));
  EXPECT_NO_THROW(store->wait({"here-a", "here-c"}, kShort));
  EXPECT_NO_THROW(store->wait({}, kShort));
}

TEST_P(StoreTest, GetTimesOutNamingTheKeyAndTheStore) {
  auto store = live_->connect();
  try {
    store->get("never-set", kShort);
    FAIL() << "get did not time out";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'never-set'"));
    EXPECT_THAT(e.what(), HasSubstr(store->describe()));
  }
}

TEST_P(StoreTest, CheckAndRemoveSeeWhatExists) {
  auto store = live_->connect();
  EXPECT_FALSE(store->check({"k"}));
  store->set("k", "");
  EXPECT_TRUE(store->check({"k"}));
  EXPECT_EQ(store->get("k", kShort), "");
  EXPECT_FALSE(store->check({"k", "other"}));
  EXPECT_TRUE(store->remove("k"));
  EXPECT_FALSE(store->remove("k"));
  EXPECT_FALSE(store->check({"k"}));
}

TEST_P(StoreTest, SetReplacesAndKeysMayHoldAnyBytes) {
  auto store = live_->connect();
  const std::string odd_key("a/b c%\xff\n", 8);
  store->set(odd_key, "one");
  store->set(odd_key, "two");
  EXPECT_EQ(store->get(odd_key, kShort), "two");
  EXPECT_FALSE(store->check({"a/b c"}));
}

TEST_P(StoreTest, PrefixStoreIsolatesTwoRunIds) {
  std::shared_ptr<Store> shared = live_->connect();
  auto run_a = prefixStore(shared, "run-a");
  auto run_b = prefixStore(live_->connect(), "run-b");
  run_a->set("addr/0", "host-a");
  run_b->set("addr/0", "host-b");
  run_a->set("only-a", "x");
  EXPECT_EQ(run_a->get("addr/0", kShort), "host-a");
  EXPECT_EQ(run_b->get("addr/0", kShort), "host-b");
  EXPECT_FALSE(run_b->check({"only-a"}));
  EXPECT_EQ(run_a->add("n", 2), 2);
  EXPECT_EQ(run_b->add("n", 5), 5);
  EXPECT_EQ(shared->get("run-a/addr/0", kShort), "host-a");
  EXPECT_FALSE(shared->check({"addr/0"}));
  EXPECT_THAT(run_b->describe(), HasSubstr("run-b"));
  try {
    run_b->get("only-a", milliseconds(50));
    FAIL() << "run-b saw run-a's key";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'run-b/only-a'"));
  }
  EXPECT_THROW(prefixStore(shared, ""), InputError);
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreTest,
                         ::testing::Values(Backend::kTcp, Backend::kFile, Backend::kRedis),
                         [](const auto& info) { return backendName(info.param); });

// ---- per backend and world size -------------------------------------------------------------

class StoreWorldTest : public ::testing::TestWithParam<std::tuple<Backend, int>> {
 protected:
  void SetUp() override {
    try {
      live_ = std::make_unique<LiveBackend>(std::get<0>(GetParam()));
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
  }
  int world() const { return std::get<1>(GetParam()); }
  // A rank's client, counted down on `connected` whether or not it connects: whoever waits for
  // every rank to be connected is never hung by one that failed.
  auto connectCounted(std::latch& connected) {
    decltype(live_->connect()) store;
    try {
      store = live_->connect();
    } catch (...) {
      connected.count_down();
      throw;
    }
    connected.count_down();
    return store;
  }
  std::unique_ptr<LiveBackend> live_;
};

std::string binaryValue(int rank) {
  std::string v("\0rank\0", 6);
  v += static_cast<char>(rank);
  v += std::string(3, '\0');
  v += "\xff\xfe";
  return v;
}

TEST_P(StoreWorldTest, SetGetRoundTripsBinaryValues) {
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<char>((i * 131) ^ (i >> 8));
  runRanks(world(), [&](int rank) {
    auto store = live_->connect();
    store->set(fmt::format("value/{}", rank), binaryValue(rank));
    if (rank == 0) store->set("big", big);
    for (int r = 0; r < world(); ++r) {
      const auto got = store->get(fmt::format("value/{}", r), kLong);
      require(got == binaryValue(r), fmt::format("rank {} read a wrong value of rank {}", rank, r));
    }
    require(store->get("big", kLong) == big, fmt::format("rank {} read a wrong 1 MiB value", rank));
  });
}

TEST_P(StoreWorldTest, GetBlocksUntilAnotherRankSetsAndReturnsPromptly) {
  constexpr milliseconds kDelay{150};
  // The set begins once every rank is connected (a rank still connecting when the value came
  // returned "late" by its connect), and each return is measured against the set's own span.
  std::latch connected(world());
  std::atomic<Clock::rep> set_begin{0}, set_end{0};
  std::thread setter([&] {
    auto store = live_->connect();
    connected.wait();
    std::this_thread::sleep_for(kDelay);
    set_begin = Clock::now().time_since_epoch().count();
    store->set("late", "here");
    set_end = Clock::now().time_since_epoch().count();
  });
  std::vector<Clock::time_point> returned(static_cast<std::size_t>(world()));
  std::vector<std::string> values(static_cast<std::size_t>(world()));
  try {
    runRanks(world(), [&](int rank) {
      auto store = connectCounted(connected);  // the setter waits for every rank
      values[static_cast<std::size_t>(rank)] = store->get("late", kLong);
      returned[static_cast<std::size_t>(rank)] = Clock::now();
    });
  } catch (...) {
    setter.join();
    throw;
  }
  setter.join();
  const Clock::time_point begin{Clock::duration(set_begin.load())};
  const Clock::time_point end{Clock::duration(set_end.load())};
  // A parked get returns on the set; the file and Redis stores poll at most every 32 ms
  // (store_util.h's Backoff): 400 ms is over ten polls and a round trip past the set's end.
  for (int rank = 0; rank < world(); ++rank) {
    const auto at = returned[static_cast<std::size_t>(rank)];
    EXPECT_EQ(values[static_cast<std::size_t>(rank)], "here") << "rank " << rank;
    EXPECT_GE(at, begin) << "rank " << rank << " returned before the set";
    EXPECT_LT(at - end, milliseconds(400))
        << "rank " << rank << " returned "
        << std::chrono::duration_cast<milliseconds>(at - end).count() << " ms after the set";
  }
}

TEST_P(StoreWorldTest, ExchangeGathersAllValuesInRankOrder) {
  std::vector<std::vector<std::string>> got(static_cast<size_t>(world()));
  runRanks(world(), [&](int rank) {
    auto store = live_->connect();
    got[static_cast<size_t>(rank)] = exchange(
        *store, rank, world(), fmt::format("10.0.0.{}:{}", rank, 29500 + rank), kLong, "addresses");
  });
  std::vector<std::string> expected;
  for (int r = 0; r < world(); ++r)
    expected.push_back(fmt::format("10.0.0.{}:{}", r, 29500 + r));
  for (const auto& values : got)
    EXPECT_EQ(values, expected);
}

TEST_P(StoreWorldTest, ExchangeWithARankThatNeverArrivesNamesIt) {
  // Ranks 0 .. world-1 arrive; rank `world` of world+1 never does.
  const int declared = world() + 1;
  std::vector<std::string> messages(static_cast<size_t>(world()));
  std::latch connected(world());  // all arrive together: a late one is named too, otherwise
  runRanks(world(), [&](int rank) {
    auto store = connectCounted(connected);
    connected.wait();
    try {
      exchange(*store, rank, declared, "v", kShort, "addresses");
      throw std::runtime_error(fmt::format("rank {}: exchange did not time out", rank));
    } catch (const TimeoutError& e) {
      messages[static_cast<size_t>(rank)] = e.what();
    }
  });
  // The absent rank among those named (a rank slower than the timeout to arrive is named too).
  for (const auto& m : messages) {
    EXPECT_THAT(m, HasSubstr("rendezvous 'addresses' timed out after 250 ms waiting for rank"));
    EXPECT_THAT(
        m, ContainsRegex(fmt::format("waiting for ranks? ([0-9]+, )*{} of {}", world(), declared)));
  }
}

TEST_P(StoreWorldTest, BarrierReleasesEveryRankOnceAllArrive) {
  std::atomic<int> arrived{0};
  runRanks(world(), [&](int rank) {
    auto store = live_->connect();
    std::this_thread::sleep_for(milliseconds(10 * rank));
    arrived.fetch_add(1);
    barrier(*store, "start", rank, world(), kLong);
    require(arrived.load() == world(), fmt::format("rank {} left the barrier early", rank));
  });
  // A barrier that the last rank skips names it.
  if (world() > 1) {
    std::vector<std::string> messages(static_cast<size_t>(world() - 1));
    runRanks(world() - 1, [&](int rank) {
      auto store = live_->connect();
      try {
        barrier(*store, "end", rank, world(), kShort);
        throw std::runtime_error("barrier did not time out");
      } catch (const TimeoutError& e) {
        messages[static_cast<size_t>(rank)] = e.what();
      }
    });
    for (const auto& m : messages) {
      EXPECT_THAT(m, ContainsRegex(fmt::format("waiting for ranks? ([0-9]+, )*{} of {}",
                                               world() - 1, world())));
    }
  }
}

// A barrier told that the rank it waits for is gone (its link dropped: it failed) ends at once,
// naming it and why, not after the timeout.
TEST_P(StoreWorldTest, ABarrierEndsAtOnceNamingARankKnownToBeGone) {
  const auto never = [](int) -> std::string { return "gone"; };
  if (world() == 1) {  // the one rank is there: asked about nobody
    auto store = live_->connect();
    EXPECT_NO_THROW(barrier(*store, "alone", 0, 1, kShort, never));
    return;
  }
  const int gone = world() - 1;
  std::vector<std::string> messages(static_cast<size_t>(gone));
  const auto started = std::chrono::steady_clock::now();
  runRanks(gone, [&](int rank) {
    auto store = live_->connect();
    try {
      barrier(*store, "end", rank, world(), kLong, [gone](int r) -> std::string {
        return r == gone ? "lost the link: peer closed the connection" : "";
      });
      throw std::runtime_error("barrier did not end");
    } catch (const Error& e) {
      messages[static_cast<size_t>(rank)] = e.what();
    }
  });
  EXPECT_LT(std::chrono::steady_clock::now() - started, kLong / 2);
  for (const auto& m : messages) {
    EXPECT_THAT(m, HasSubstr(fmt::format("barrier 'end': rank {} of {} never comes: lost the link: "
                                         "peer closed the connection",
                                         gone, world())));
  }
}

TEST_P(StoreWorldTest, ExchangeRejectsARankOutsideTheWorld) {
  auto store = live_->connect();
  EXPECT_THROW(exchange(*store, world(), world(), "v", kShort), InputError);
  EXPECT_THROW(exchange(*store, -1, world(), "v", kShort), InputError);
  EXPECT_THROW(barrier(*store, "b", world(), world(), kShort), InputError);
}

INSTANTIATE_TEST_SUITE_P(BackendsByWorld, StoreWorldTest,
                         ::testing::Combine(::testing::Values(Backend::kTcp, Backend::kFile,
                                                              Backend::kRedis),
                                            ::testing::Values(1, 2, 4)),
                         [](const auto& info) {
                           return fmt::format("{}World{}", backendName(std::get<0>(info.param)),
                                              std::get<1>(info.param));
                         });

}  // namespace
}  // namespace troupe::rendezvous
