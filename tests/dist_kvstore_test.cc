// troupe::KVStore's distributed types (include/troupe/kvstore.h) with two workers and one server,
// each on a thread of its own with its own actor system, transport and links (they meet over TCP
// on loopback through worker 0's embedded store, as processes do): MXNet's dist_sync, dist_async
// and ssp semantics, and bad calls answered with error values that leave the store working.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "actors/kvstore/kvstore_options.h"
#include "cli_util.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"
#include "troupe/kvstore.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;

// The settings of one process of a run of `workers` workers and `servers` servers.
KVStoreSettings place(const std::string& run, std::uint16_t port, const std::string& role, int rank,
                      int servers = 1, int workers = 2) {
  return {{"role", role},
          {"shard_id", std::to_string(rank)},
          {"num_shards", std::to_string(workers)},
          {"num_servers", std::to_string(servers)},
          {"rendezvous", "tcp://127.0.0.1:" + std::to_string(port)},
          {"run_id", run},
          {"peer_timeout", "20"},
          {"rendezvous_timeout", "20"}};
}

// Runs `worker` on `workers` worker threads and each of `servers` servers on a thread of its own;
// the first server's Status comes back (the others' are checked).
Status runWorld(const std::string& type, const std::string& run,
                const std::function<void(KVStore&)>& worker, const std::string& staleness = "",
                int servers = 1, const KVStoreSettings& extra = {}, int workers = 2) {
  const auto port = testing::freeLoopbackPort();
  std::vector<Status> served(static_cast<std::size_t>(std::max(servers, 1)));
  std::vector<std::thread> server_threads;
  for (int s = 0; s < servers; ++s) {
    server_threads.emplace_back([&, s] {
      auto settings = place(run, port, "server", s, servers, workers);
      if (!staleness.empty()) settings["staleness"] = staleness;
      for (const auto& [key, value] : extra)
        settings[key] = value;
      EXPECT_TRUE(KVStore::isServer(settings));
      served[static_cast<std::size_t>(s)] = KVStore::runServer(type, settings);
    });
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < workers; ++rank) {
    threads.emplace_back([&, rank] {
      auto settings = place(run, port, "worker", rank, servers, workers);
      if (!staleness.empty()) settings["staleness"] = staleness;
      for (const auto& [key, value] : extra)
        settings[key] = value;
      EXPECT_FALSE(KVStore::isServer(settings));
      auto kv = KVStore::create(type, settings);
      ASSERT_TRUE(kv) << kv.status().message();
      EXPECT_EQ(kv.value()->type(), type);
      EXPECT_EQ(kv.value()->rank(), rank);
      EXPECT_EQ(kv.value()->numWorkers(), workers);
      worker(*kv.value());
    });
  }
  for (auto& t : threads)
    t.join();
  for (auto& t : server_threads)
    t.join();
  for (std::size_t s = 1; s < served.size(); ++s)
    EXPECT_TRUE(served[s]) << "server " << s << ": " << served[s].message();
  return served[0];
}

std::vector<float> pulled(KVStore& kv, int key, std::size_t n) {
  std::vector<float> out(n);
  const Status s = kv.pull(key, out);
  EXPECT_TRUE(s) << s.message();
  return out;
}

TEST(KVStoreDistSync, Worker0sInitWinsAndAPullAfterThePushesReadsTheirSumThenTheUpdate) {
  const Status served = runWorld("dist_sync", "kv-sync", [](KVStore& kv) {
    const float r = static_cast<float>(kv.rank());
    // Every worker inits the key; worker 0's value is the one the servers keep.
    ASSERT_TRUE(kv.init(7, std::vector<float>{r + 1, r + 1, r + 1}));
    EXPECT_EQ(pulled(kv, 7, 3), (std::vector<float>{1, 1, 1}));
    // No optimizer: the n-th pushes of every worker are summed and become the value (MXNet's).
    ASSERT_TRUE(kv.push(7, std::vector<float>{r + 1, 2 * (r + 1), 10}));
    EXPECT_EQ(pulled(kv, 7, 3), (std::vector<float>{3, 6, 20}));  // small integers: exact
    // SGD on the servers: w -= lr * (g0 + g1), with lr and gradients powers of two: exact.
    ASSERT_TRUE(kv.setOptimizer({.learning_rate = 0.5f}));
    ASSERT_TRUE(kv.push(7, std::vector<float>{1, 2, 4}));
    EXPECT_EQ(pulled(kv, 7, 3), (std::vector<float>{2, 4, 16}));
    std::vector<float> all(4);
    const Status no_collectives = kv.allgather(std::vector<float>{1, 2}, all);
    EXPECT_EQ(no_collectives.kind(), ErrorKind::kInput);
    EXPECT_NE(no_collectives.message().find("a dist_sync store has no collectives"),
              std::string::npos)
        << no_collectives.message();
    EXPECT_EQ(kv.broadcast(all, 0).message(),
              "broadcast: a dist_sync store has no collectives: the ring store's (type 'ring') "
              "run them without servers");
    // Several arrays pushed together are summed first, as from several devices.
    const std::vector<float> a{1, 1, 1}, b{1, 1, 1};
    ASSERT_TRUE(kv.push(7, {a, b}));
    EXPECT_EQ(pulled(kv, 7, 3), (std::vector<float>{0, 2, 14}));
    ASSERT_TRUE(kv.barrier());
  });
  EXPECT_TRUE(served) << served.message();
}

// A push of NaN stopped the server without naming the worker that pushed it. The server's
// failure names it and where in the key, under dist_sync (worker 1, whose push stays as it came,
// and worker 0, whose push the sum went into) and dist_async.
class NonFinitePushTest : public ::testing::TestWithParam<std::pair<const char*, int>> {};

TEST_P(NonFinitePushTest, StopsTheServerNamingTheWorkerAndTheValue) {
  const auto [type, culprit] = GetParam();
  const Status served = runWorld(type, "kv-nan", [culprit = culprit](KVStore& kv) {
    ASSERT_TRUE(kv.init(3, std::vector<float>{1, 1, 1, 1}));
    ASSERT_TRUE(kv.setOptimizer({.learning_rate = 0.5f}));
    const float bad = kv.rank() == culprit ? std::nanf("") : 1.0f;
    kv.push(3, std::vector<float>{1, 1, bad, 1});  // the failure may reach it, or a later call
    std::vector<float> out(4);
    kv.pull(3, out);
  });
  ASSERT_FALSE(served);
  EXPECT_NE(served.message().find("worker " + std::to_string(culprit) +
                                  "'s push holds NaN at value 2 of key 3"),
            std::string::npos)
      << served.message();
}

INSTANTIATE_TEST_SUITE_P(Schedules, NonFinitePushTest,
                         ::testing::Values(std::pair{"dist_sync", 1}, std::pair{"dist_sync", 0},
                                           std::pair{"dist_async", 1}),
                         [](const auto& info) {
                           return std::string(info.param.first) + "_worker" +
                                  std::to_string(info.param.second);
                         });

// dist_sync sums the n-th push of every worker. Worker 1, which pushed a key 5 times where
// worker 0 pushed it once and was done, heard "no answer from server 0 ... hung or gone" while the
// server waited, healthy, for worker 0: the server now tells it whom it waits for, at once.
TEST(KVStoreDistSync, APullThatWaitsForAWorkerDoneWithTheStoreNamesThatWorkerAtOnce) {
  const auto started = std::chrono::steady_clock::now();
  Status refused;
  const Status served = runWorld("dist_sync", "kv-count", [&](KVStore& kv) {
    ASSERT_TRUE(kv.init(0, std::vector<float>{1, 1}));
    const int pushes = kv.rank() == 0 ? 1 : 5;
    for (int i = 0; i < pushes; ++i)
      ASSERT_TRUE(kv.push(0, std::vector<float>{1, 1}));
    std::vector<float> out(2);
    const Status pulled = kv.pull(0, out);
    if (kv.rank() == 1) refused = pulled;  // worker 0's pull of its one push is answered
  });
  EXPECT_TRUE(served) << served.message();
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.message().find("worker 1: server 0: worker 1's pull of push 5 of key 0 waits "
                                   "for worker 0 at "),
            std::string::npos)
      << refused.message();
  EXPECT_NE(refused.message().find(", which is done with the store: its push 4 of key 0 (it pushed "
                                   "key 0 1 times) never comes"),
            std::string::npos)
      << refused.message();
  EXPECT_EQ(refused.message().find("hung or gone"), std::string::npos) << refused.message();
  EXPECT_LT(std::chrono::steady_clock::now() - started, 15s) << "not at once: peer_timeout is 20 s";
}

// A worker done with the store whose end barrier gave up on a stalled worker leaves (its links
// close) while that one still works: the server and the other worker go on. The server failed
// with "lost the link to worker 0", blaming the worker that left healthy (examples/ps_service,
// when the other one was stopped), and so did the other worker.
TEST(KVStoreDistSync, AWorkerThatLeftDoneWithTheStoreFailsNeitherTheServerNorTheOthers) {
  Status late_pull;
  const Status served =
      runWorld("dist_sync", "kv-left",
               [&](KVStore& kv) {
                 ASSERT_TRUE(kv.init(0, std::vector<float>{1, 1}));
                 ASSERT_TRUE(kv.push(0, std::vector<float>{1, 2}));
                 EXPECT_EQ(pulled(kv, 0, 2), (std::vector<float>{2, 4}));
                 if (kv.rank() == 0)
                   return;  // done: its end barrier waits 2 s for worker 1, then leaves
                 std::this_thread::sleep_for(3500ms);
                 std::vector<float> out(2);
                 late_pull = kv.pull(0, out);
               },
               "", 1, {{"rendezvous_timeout", "2"}});
  EXPECT_TRUE(late_pull) << late_pull.message();
  // Worker 0 served the rendezvous store and took it along: the server's own end barrier may
  // fail for want of it, but not for worker 0's departure.
  EXPECT_EQ(served.message().find("lost the link to worker 0"), std::string::npos)
      << served.message();
}

TEST(KVStoreDistSync, BadCallsAreErrorValuesAndTheStoreGoesOn) {
  const Status served = runWorld("dist_sync", "kv-bad", [](KVStore& kv) {
    ASSERT_TRUE(kv.init(1, std::vector<float>{5, 5}));
    const Status again = kv.init(1, std::vector<float>{5, 5});
    ASSERT_FALSE(again);
    EXPECT_EQ(again.kind(), ErrorKind::kInput);
    EXPECT_EQ(again.message(), "init of key 1: it has a value already");
    const Status shape = kv.push(1, std::vector<float>{1, 2, 3});
    ASSERT_FALSE(shape);
    EXPECT_EQ(shape.message(), "push of key 1: array 0 has 3 values, the key's has 2");
    std::vector<float> out(2);
    const Status never = kv.pull(9, out);
    ASSERT_FALSE(never);
    EXPECT_EQ(never.message(), "pull of key 9: the key was never initialised (init it first)");
    std::vector<float> small(1);
    const Status room = kv.pull(1, small);
    ASSERT_FALSE(room);
    EXPECT_EQ(room.message(), "pull of key 1: room for 1 values, the key's has 2");
    const Status negative = kv.init(-1, std::vector<float>{1});
    ASSERT_FALSE(negative);
    EXPECT_EQ(negative.message(), "init of key -1: keys are >= 0");
    const Status optimizer = kv.setOptimizer({.learning_rate = -1.0f});
    ASSERT_FALSE(optimizer);
    EXPECT_EQ(optimizer.message(), "optimizer: learning_rate -1 is not a finite number >= 0");
    // None of that reached the servers: the store works as before.
    ASSERT_TRUE(kv.push(1, std::vector<float>{1, 2}));
    EXPECT_EQ(pulled(kv, 1, 2), (std::vector<float>{2, 4}));
  });
  EXPECT_TRUE(served) << served.message();
}

// Two servers; a key of at least MXNET_KVSTORE_BIGARRAY_BOUND values is cut across both, smaller
// ones live on server key % 2; pushed and pulled together, with fp16 compression on the way.
TEST(KVStoreDistSync, KeysOnTwoServersPushedAndPulledTogether) {
  ASSERT_EQ(setenv("MXNET_KVSTORE_BIGARRAY_BOUND", "5", 1), 0);
  const Status served = runWorld(
      "dist_sync", "kv-two",
      [](KVStore& kv) {
        ASSERT_TRUE(kv.setGradientCompression("fp16"));
        ASSERT_TRUE(kv.init(0, std::vector<float>{0, 0}));              // server 0
        ASSERT_TRUE(kv.init(1, std::vector<float>{0, 0, 0}));           // server 1
        ASSERT_TRUE(kv.init(2, std::vector<float>{1, 1, 1, 1, 1, 1}));  // both
        ASSERT_TRUE(kv.init(4, std::vector<float>{0}));                 // server 0, after key 0
        const float r = static_cast<float>(kv.rank());
        const std::vector<float> a{1 + r, 2}, b{3, 4, 5 + r}, c{1, 2, 3, 4, 5, 6 + r}, d{7};
        ASSERT_TRUE(kv.push({0, 1, 2, 4}, {a, b, c, d}));
        std::vector<float> pa(2), pb(3), pc(6), pd(1);
        ASSERT_TRUE(kv.pull({0, 1, 2, 4}, {pa, pb, pc, pd}));
        // Without an optimizer the value is the sum of both workers' pushes; halves and small
        // integers: exact in fp16 and float.
        EXPECT_EQ(pa, (std::vector<float>{3, 4}));
        EXPECT_EQ(pb, (std::vector<float>{6, 8, 11}));
        EXPECT_EQ(pc, (std::vector<float>{2, 4, 6, 8, 10, 13}));
        EXPECT_EQ(pd, (std::vector<float>{14}));
        const Status twice = kv.pull({0, 0}, {pa, pa});
        ASSERT_FALSE(twice);
        EXPECT_EQ(twice.message(), "pull of key 0: twice in one pull");
        const Status count = kv.push({0, 1}, {a});
        ASSERT_FALSE(count);
        EXPECT_EQ(count.message(), "push of 2 keys with 1 arrays");
      },
      "", 2);
  unsetenv("MXNET_KVSTORE_BIGARRAY_BOUND");
  EXPECT_TRUE(served) << served.message();
}

// Every worker inits the same keys in the same order: one that does not is told so once worker 0
// has inited the key.
TEST(KVStoreDistSync, KeysInitInAnotherOrderThanWorker0sAreRefused) {
  const Status served = runWorld("dist_sync", "kv-order", [](KVStore& kv) {
    if (kv.rank() == 0) {
      EXPECT_TRUE(kv.init(1, std::vector<float>{1, 2, 3}));
      EXPECT_TRUE(kv.init(2, std::vector<float>{1, 2, 3}));
      return;
    }
    const Status first = kv.init(2, std::vector<float>{1, 2, 3});
    ASSERT_FALSE(first);
    EXPECT_EQ(first.message(),
              "init of key 2: worker 0 inited it with 3 values, this worker with 3, or in another "
              "order of keys (worker 0: 'ok 3 at 3', here: 'ok 3 at 0')");
  });
  EXPECT_TRUE(served) << served.message();
}

TEST(KVStoreDistAsync, APushAppliesAtOnceAndAPullSeesTheWorkersOwnPushes) {
  const Status served = runWorld("dist_async", "kv-async", [](KVStore& kv) {
    ASSERT_TRUE(kv.init(0, std::vector<float>{8, 8}));
    const Status none = kv.push(0, std::vector<float>{1, 1});
    ASSERT_FALSE(none);  // MXNet: "Updater needs to be set for async mode"
    EXPECT_NE(none.message().find("none is set (setOptimizer first)"), std::string::npos)
        << none.message();
    ASSERT_TRUE(kv.setOptimizer({.learning_rate = 1.0f}));
    // Worker r pushes (r+1, 2(r+1)); its own pull sees its own push applied, and maybe the other.
    const float g = static_cast<float>(kv.rank() + 1);
    ASSERT_TRUE(kv.push(0, std::vector<float>{g, 2 * g}));
    const auto mine = pulled(kv, 0, 2);
    const float other = 3 - g;
    EXPECT_TRUE((mine == std::vector<float>{8 - g, 8 - 2 * g}) ||
                (mine == std::vector<float>{8 - g - other, 8 - 2 * g - 2 * other}))
        << mine[0] << " " << mine[1];
    // After the barrier, both pushes are in.
    ASSERT_TRUE(kv.barrier());
    EXPECT_EQ(pulled(kv, 0, 2), (std::vector<float>{5, 2}));
  });
  EXPECT_TRUE(served) << served.message();
}

TEST(KVStoreSsp, APullWaitsOnlyForWorkersMoreThanStalenessPushesBehind) {
  std::atomic<bool> worker1_pushed{false};
  const Status served = runWorld(
      "ssp", "kv-ssp",
      [&](KVStore& kv) {
        ASSERT_TRUE(kv.init(0, std::vector<float>{0}));
        ASSERT_TRUE(kv.setOptimizer({.learning_rate = 1.0f}));
        if (kv.rank() == 1) {
          std::this_thread::sleep_for(300ms);
          worker1_pushed = true;
          ASSERT_TRUE(kv.push(0, std::vector<float>{1}));
          return;
        }
        // Staleness 1: after its 1st push, worker 0 may run ahead of worker 1's 0 pushes ...
        ASSERT_TRUE(kv.push(0, std::vector<float>{1}));
        pulled(kv, 0, 1);
        EXPECT_FALSE(worker1_pushed) << "the first pull waited for worker 1";
        // ... but after its 2nd, it waits until worker 1 has pushed once.
        ASSERT_TRUE(kv.push(0, std::vector<float>{1}));
        pulled(kv, 0, 1);
        EXPECT_TRUE(worker1_pushed) << "the second pull did not wait for worker 1";
      },
      "1");
  EXPECT_TRUE(served) << served.message();
}

// troupe's "ring": no servers; pushes summed over the workers by ring allreduce, each worker
// applying them to its own copy.
TEST(KVStoreRing, PushesAreSummedOverTheWorkersAndEveryCopyUpdatedAlike) {
  const Status served = runWorld(
      "ring", "kv-ring",
      [](KVStore& kv) {
        const float r = static_cast<float>(kv.rank());
        ASSERT_TRUE(kv.init(3, std::vector<float>{r + 1, r + 1}));  // worker 0's value wins
        ASSERT_TRUE(kv.init(4, std::vector<float>(3000, r + 7)));
        EXPECT_EQ(pulled(kv, 3, 2), (std::vector<float>{1, 1}));
        EXPECT_EQ(pulled(kv, 4, 3000), std::vector<float>(3000, 7));
        // No optimizer: the sum of the workers' pushes becomes the value (small integers: exact).
        ASSERT_TRUE(kv.push(3, std::vector<float>{r + 1, 10}));
        EXPECT_EQ(pulled(kv, 3, 2), (std::vector<float>{3, 20}));
        // SGD, lr 0.5: two pushes in flight before the pull, applied in order.
        ASSERT_TRUE(kv.setOptimizer({.learning_rate = 0.5f}));
        ASSERT_TRUE(kv.push(3, std::vector<float>{1, 2}));
        ASSERT_TRUE(kv.push(3, std::vector<float>{1, 2}));
        EXPECT_EQ(pulled(kv, 3, 2), (std::vector<float>{1, 16}));
        const Status late = kv.setGradientCompression("fp16");
        ASSERT_FALSE(late);
        EXPECT_NE(late.message().find("before its first push"), std::string::npos)
            << late.message();
        ASSERT_TRUE(kv.barrier());
      },
      "", 0);
  EXPECT_TRUE(served) << served.message();
}

// The ring store's collectives (the torch.distributed backend's), on 3 workers: allgather and
// reduce_scatter move each part once around the ring, allreduce sums in place, in segments as the
// sums' (the large case spans several); a worker's buffers of the wrong size are refused by name.
// Integer values below 2^24: exact.
TEST(KVStoreRing, CollectivesAllgatherReduceScatterAndAllreduceOverThreeWorkers) {
  const Status served = runWorld(
      "ring", "kv-ring-collectives",
      [](KVStore& kv) {
        const int me = kv.rank();
        for (const std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{400003}}) {
          std::vector<float> mine(n), all(3 * n, -1.0f);
          for (std::size_t i = 0; i < n; ++i)
            mine[i] = static_cast<float>(me * 1000000 + static_cast<int>(i));
          ASSERT_TRUE(kv.allgather(mine, all));
          // Into one array a worker, each of its own (torch's all_gather into a list).
          std::vector<std::vector<float>> parts(3, std::vector<float>(n, -1.0f));
          ASSERT_TRUE(kv.allgather(mine, {parts[0], parts[1], parts[2]}));
          for (std::size_t w = 0; w < 3; ++w) {
            for (std::size_t i = 0; i < n; ++i) {
              ASSERT_EQ(all[w * n + i], static_cast<float>(w * 1000000 + i))
                  << "allgather of " << n << ": worker " << w << "'s value " << i;
              ASSERT_EQ(parts[w][i], all[w * n + i])
                  << "allgather of " << n << " into parts: worker " << w << "'s value " << i;
            }
          }
          // Worker w's part r holds (w + 1) (r 1000 + i mod 1000): part r sums to 6 (r 1000 + ...).
          for (std::size_t r = 0; r < 3; ++r) {
            for (std::size_t i = 0; i < n; ++i)
              all[r * n + i] = static_cast<float>((me + 1) * (r * 1000 + i % 1000));
          }
          std::vector<float> summed(n, -1.0f);
          ASSERT_TRUE(kv.reduceScatter(all, summed));
          for (std::size_t i = 0; i < n; ++i) {
            ASSERT_EQ(summed[i],
                      static_cast<float>(6 * (static_cast<std::size_t>(me) * 1000 + i % 1000)))
                << "reduce_scatter of " << n << ": value " << i;
          }
          for (std::size_t i = 0; i < n; ++i)
            mine[i] = static_cast<float>((me + 1) * static_cast<int>(i % 5000));
          ASSERT_TRUE(kv.allreduce(mine));
          for (std::size_t i = 0; i < n; ++i)
            ASSERT_EQ(mine[i], static_cast<float>(6 * (i % 5000))) << "allreduce of " << n;
        }
        std::vector<float> mine(4), too_few(11);
        const Status refused = kv.allgather(mine, too_few);
        EXPECT_EQ(refused.kind(), ErrorKind::kInput);
        EXPECT_EQ(refused.message(), "allgather: 11 values for 3 workers of 4 each");
        std::vector<float> a(4), b(4), c(3);
        EXPECT_EQ(kv.allgather(mine, {a, b}).message(), "allgather: 2 arrays for 3 workers");
        EXPECT_EQ(kv.allgather(mine, {a, b, c}).message(),
                  "allgather: array 2 holds 3 values, each worker's 4");
        ASSERT_TRUE(kv.barrier());
      },
      "", 0, {}, 3);
  EXPECT_TRUE(served) << served.message();
}

// The ring store's broadcast from each root of 3 workers, bit for bit: its values carry -0.0, NaNs
// with payloads and subnormals (which a sum with zeros would change), in sizes from none to
// several segments of the ring (1048575 values for 3 workers); the others' buffers are
// overwritten where they lie. A root that is no worker is refused by name.
TEST(KVStoreRing, BroadcastFromEachRootIsItsValuesBitForBit) {
  const Status served = runWorld(
      "ring", "kv-ring-broadcast",
      [](KVStore& kv) {
        const int me = kv.rank();
        // Root r's value i: bits that no float sum keeps, unlike every other worker's.
        const auto bits = [](int r, std::size_t i) {
          const std::uint32_t patterns[] = {0x80000000u, 0x7fc01234u, 0xffa00001u, 0x00000003u};
          return i % 5 == 4 ? static_cast<std::uint32_t>(r * 7919 + i) : patterns[i % 5];
        };
        for (const std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{2500003}}) {
          for (int root = 0; root < 3; ++root) {
            std::vector<float> values(n);
            for (std::size_t i = 0; i < n; ++i)
              values[i] = std::bit_cast<float>(me == root ? bits(root, i) : bits(me + 10, i + 1));
            ASSERT_TRUE(kv.broadcast(values, root));
            for (std::size_t i = 0; i < n; ++i) {
              ASSERT_EQ(std::bit_cast<std::uint32_t>(values[i]), bits(root, i))
                  << "broadcast of " << n << " from " << root << ": value " << i;
            }
          }
        }
        std::vector<float> values(4);
        const Status refused = kv.broadcast(values, 3);
        EXPECT_EQ(refused.kind(), ErrorKind::kInput);
        EXPECT_EQ(refused.message(), "broadcast: root 3 is no worker (there are 3: 0 to 2)");
        ASSERT_TRUE(kv.barrier());
      },
      "", 0, {}, 3);
  EXPECT_TRUE(served) << served.message();
}

// Two workers whose broadcasts name different roots fail at once (else each would wait for the
// chunks of a root that sends none): a worker that gets the other's chunk names both roots; the
// other may instead see that worker's link close first, and says so.
TEST(KVStoreRing, BroadcastsThatNameDifferentRootsFailNamingBoth) {
  std::vector<Status> failed(2);
  std::vector<std::chrono::steady_clock::duration> took(2);
  const Status served = runWorld(
      "ring", "kv-ring-broadcast-roots",
      [&](KVStore& kv) {
        const auto started = std::chrono::steady_clock::now();
        std::vector<float> values(10, 1.0f);
        const auto me = static_cast<std::size_t>(kv.rank());
        failed[me] = kv.broadcast(values, kv.rank());
        took[me] = std::chrono::steady_clock::now() - started;
      },
      "", 0);
  EXPECT_TRUE(served) << served.message();
  const std::string named =
      "kvstore: broadcast 0: worker 0 broadcasts from root 0, worker 1 from root 1: every worker "
      "must name the same root";
  int naming = 0;
  for (std::size_t w = 0; w < 2; ++w) {
    ASSERT_FALSE(failed[w]) << "worker " << w;
    EXPECT_LT(took[w], 10s) << "worker " << w;  // peer_timeout is 20 s
    if (failed[w].message().find(named) != std::string::npos) {
      EXPECT_EQ(failed[w].kind(), ErrorKind::kInput);
      ++naming;
    } else {
      EXPECT_NE(failed[w].message().find("lost the link to worker " + std::to_string(1 - w)),
                std::string::npos)
          << failed[w].message();
    }
  }
  EXPECT_GE(naming, 1);
}

TEST(KVStoreRing, OneProcessAloneIsARingOfOne) {
  auto kv = KVStore::create("ring", {{"num_shards", "1"}});
  ASSERT_TRUE(kv) << kv.status().message();
  EXPECT_EQ(kv.value()->numWorkers(), 1);
  ASSERT_TRUE(kv.value()->init(0, std::vector<float>{2, 4}));
  ASSERT_TRUE(kv.value()->setOptimizer({.learning_rate = 0.25f}));
  ASSERT_TRUE(kv.value()->push(0, std::vector<float>{4, 8}));
  EXPECT_EQ(pulled(*kv.value(), 0, 2), (std::vector<float>{1, 2}));
  std::vector<float> all(2);
  ASSERT_TRUE(kv.value()->allgather(std::vector<float>{3, 5}, all));
  EXPECT_EQ(all, (std::vector<float>{3, 5}));
  std::vector<float> part(2);
  ASSERT_TRUE(kv.value()->allgather(std::vector<float>{7, 9}, std::vector<std::span<float>>{part}));
  EXPECT_EQ(part, (std::vector<float>{7, 9}));
  std::vector<float> values{4, 6};
  ASSERT_TRUE(kv.value()->broadcast(values, 0));
  EXPECT_EQ(values, (std::vector<float>{4, 6}));
  EXPECT_EQ(kv.value()->broadcast(values, 1).message(),
            "broadcast: root 1 is no worker (there are 1: 0 to 0)");
  auto with_servers = KVStore::create(
      "ring", {{"num_servers", "1"}, {"rendezvous", "tcp://127.0.0.1:1"}, {"run_id", "r"}});
  ASSERT_FALSE(with_servers);
  EXPECT_NE(with_servers.status().message().find("kvstore 'ring' has no servers"),
            std::string::npos)
      << with_servers.status().message();
}

TEST(KVStoreDist, AStoreWithoutServersOrOfAServerIsRefusedByName) {
  auto alone = KVStore::create("dist_sync", {{"num_servers", "0"}});
  ASSERT_FALSE(alone);
  EXPECT_EQ(alone.status().kind(), ErrorKind::kInput);
  EXPECT_NE(alone.status().message().find("kvstore 'dist_sync' needs parameter servers"),
            std::string::npos)
      << alone.status().message();
  const std::string store = "tcp://127.0.0.1:1";  // never reached: the place is refused first
  auto server = KVStore::create(
      "dist_sync",
      {{"num_servers", "1"}, {"role", "server"}, {"rendezvous", store}, {"run_id", "r"}});
  ASSERT_FALSE(server);
  EXPECT_NE(server.status().message().find("troupe::KVStore::runServer(), not create()"),
            std::string::npos)
      << server.status().message();
  const Status worker = KVStore::runServer(
      "dist_sync", {{"num_servers", "1"}, {"rendezvous", store}, {"run_id", "r"}});
  ASSERT_FALSE(worker);
  EXPECT_NE(worker.message().find("not a server"), std::string::npos) << worker.message();
  const Status local = KVStore::runServer("local");
  ASSERT_FALSE(local);
  EXPECT_NE(local.message().find("kvstore 'local' has no servers"), std::string::npos)
      << local.message();
}

// Every optimizer through the distributed stores: the value after each step is, to the bit, what
// troupe's optimizer (kernels/optimizer.h, itself held to PyTorch's and the papers' formulas by
// tests/kernels_optimizer_reference_test.cc) makes of the sum of the two workers' pushes (two
// floats sum alike in any order), with the key's own update count.
class KVStoreOptimizers : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(KVStoreOptimizers, EachStepIsTheOptimizersUpdateOfTheSummedPushes) {
  const auto [type, name] = GetParam();
  OptimizerSpec spec;
  spec.name = name;
  spec.learning_rate = 0.05f;
  spec.momentum = 0.9f;
  spec.weight_decay = 0.01f;
  const std::vector<float> w0{0.5f, -1.25f, 2.0f, 0.0f, 3.0f};
  const auto grad = [](int rank, int step, std::size_t i) {
    return static_cast<float>(std::sin(1.0 + rank + 3.0 * step + 0.7 * static_cast<double>(i)));
  };
  // The expected values, step by step.
  constexpr int kSteps = 3;
  auto settings = actors::optimizerOf(spec);
  ASSERT_TRUE(settings) << settings.status().message();
  auto backend = kernels::makeCpuBackend(1);
  auto opt = kernels::makeOptimizer(*backend, static_cast<std::int64_t>(w0.size()), *settings);
  auto w = kernels::Tensor::host({static_cast<std::int64_t>(w0.size())});
  auto g = kernels::Tensor::host({static_cast<std::int64_t>(w0.size())});
  std::copy(w0.begin(), w0.end(), w.f32());
  std::vector<std::vector<float>> expected;
  for (int step = 0; step < kSteps; ++step) {
    for (std::size_t i = 0; i < w0.size(); ++i)
      g.f32()[i] = grad(0, step, i) + grad(1, step, i);
    ASSERT_TRUE(opt->step(w, g, spec.learning_rate, step + 1));
    expected.emplace_back(w.f32(), w.f32() + w0.size());
  }
  const Status served = runWorld(
      type, std::string("kv-opt-") + type + "-" + name,
      [&](KVStore& kv) {
        ASSERT_TRUE(kv.init(2, w0));
        ASSERT_TRUE(kv.setOptimizer(spec));
        for (int step = 0; step < kSteps; ++step) {
          std::vector<float> push(w0.size());
          for (std::size_t i = 0; i < w0.size(); ++i)
            push[i] = grad(kv.rank(), step, i);
          ASSERT_TRUE(kv.push(2, push));
          EXPECT_EQ(pulled(kv, 2, w0.size()), expected[static_cast<std::size_t>(step)])
              << type << " " << name << ", step " << step;
        }
        ASSERT_TRUE(kv.barrier());
      },
      "", std::string(type) == "ring" ? 0 : 1);
  EXPECT_TRUE(served) << served.message();
}

INSTANTIATE_TEST_SUITE_P(Stores, KVStoreOptimizers,
                         ::testing::Combine(::testing::Values("dist_sync", "ring"),
                                            ::testing::Values("nag", "adam", "adamw", "lamb",
                                                              "lars", "rmsprop", "adagrad")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// setOptimizer again starts the state and the update count anew, as MXNet's servers make a new
// updater: Adam's first step after it moves each value by the learning rate against its summed
// gradient's sign, whatever came before (m_hat = g, v_hat = g^2 at t = 1).
TEST(KVStoreDistSync, SetOptimizerAgainStartsAdamsStateAndCountAnew) {
  const Status served = runWorld("dist_sync", "kv-opt-again", [](KVStore& kv) {
    ASSERT_TRUE(kv.init(4, std::vector<float>{1, 1}));
    OptimizerSpec adam;
    adam.name = "adam";
    adam.learning_rate = 0.25f;
    ASSERT_TRUE(kv.setOptimizer(adam));
    for (int step = 0; step < 3; ++step)
      ASSERT_TRUE(kv.push(4, std::vector<float>{1.0f, -0.5f}));
    const auto before = pulled(kv, 4, 2);
    ASSERT_TRUE(kv.setOptimizer(adam));
    ASSERT_TRUE(kv.push(4, std::vector<float>{-3.0f, 0.5f}));
    const auto after = pulled(kv, 4, 2);
    // lr g / (|g| + 1e-8) with |g| = 6 and 1: within 1e-8 / |g| of lr, and a float's rounding.
    EXPECT_NEAR(after[0] - before[0], 0.25, 2e-7);
    EXPECT_NEAR(after[1] - before[1], -0.25, 2e-7);
    ASSERT_TRUE(kv.barrier());
  });
  EXPECT_TRUE(served) << served.message();
}

// A server refuses an optimizer it cannot make, with the worker's call answering why.
TEST(KVStoreDistSync, AnUnknownOptimizerIsRefusedBeforeItReachesTheServers) {
  const Status served = runWorld("dist_sync", "kv-bad-opt", [](KVStore& kv) {
    ASSERT_TRUE(kv.init(0, std::vector<float>{1}));
    OptimizerSpec spec;
    spec.name = "adamax";
    const Status s = kv.setOptimizer(spec);
    ASSERT_FALSE(s);
    EXPECT_NE(s.message().find("unknown optimizer 'adamax' (known: sgd, adagrad, adam"),
              std::string::npos)
        << s.message();
    ASSERT_TRUE(kv.barrier());
  });
  EXPECT_TRUE(served) << served.message();
}

}  // namespace
}  // namespace troupe
