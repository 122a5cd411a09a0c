// troupe::Topology and its throwing face inside troupe, actors::RunLayout: every actor of a run by
// role and index, the same in every process.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "actors/run/run_layout.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

TEST(RunLayout, NamesAndAddressesGoBothWays) {
  const RunLayout layout(3, 2, 2);  // 3 workers of 2 replicas, 2 servers
  EXPECT_EQ(layout.actorsPerWorker(), 8u);
  const std::vector<std::string> names = {"coordinator/0", "updater/2",   "reducer/1",
                                          "replica/1/0",   "replica/2/1", "reader/0/1",
                                          "stage/2",       "server/0",    "server/1"};
  for (const auto& name : names) {
    const Address a = layout.find(name);
    EXPECT_EQ(layout.nameOf(a), name);
  }
  EXPECT_EQ(layout.find("updater/2"), (Address{2, 1}));
  EXPECT_EQ(layout.find("stage/2"), (Address{2, 5}));     // after 3 roles and 2 replicas
  EXPECT_EQ(layout.find("reader/0/1"), (Address{0, 7}));  // and the stage: the readers last
  EXPECT_EQ(layout.find("server/1"), (Address{4, 0}));    // servers follow the workers
  EXPECT_EQ(layout.nameOf(Address{1, 9}), "node 1 actor 9");
}

TEST(RunLayout, ANameTheRunLacksIsAnInputErrorNamingIt) {
  const RunLayout layout(2, 0, 1);
  for (const std::string name : {"updater/2", "server/0", "replica/0/1", "replica/0", "mixer/0",
                                 "updater/x", "updater/0/0"}) {
    try {
      layout.find(name);
      ADD_FAILURE() << name << " was found";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("no actor '" + name + "' in a run of 2 worker(s)"),
                std::string::npos)
          << e.what();
    }
  }
}

// The public API answers with error values.
TEST(Topology, CountsNoRunHasAreAnErrorValueNamingThem) {
  for (const auto& [workers, servers, replicas] :
       {std::tuple{0, 0, 1}, std::tuple{1, -1, 1}, std::tuple{2, 1, 0}}) {
    const auto t = Topology::create(workers, servers, replicas);
    ASSERT_FALSE(t);
    EXPECT_EQ(t.status().kind(), ErrorKind::kInput);
    EXPECT_NE(
        t.status().message().find(fmt::format(
            "no run has {} worker(s), {} server(s) and {} replica(s)", workers, servers, replicas)),
        std::string::npos)
        << t.status().message();
  }
  EXPECT_THROW(RunLayout(0, 0, 1), InputError);
}

TEST(Topology, NamesListsEveryActorOnceWorkerByWorkerThenTheServers) {
  const auto t = Topology::create(2, 1, 2);
  ASSERT_TRUE(t) << t.status().message();
  const auto names = t.value().names();
  EXPECT_EQ(names,
            (std::vector<std::string>{
                "coordinator/0", "updater/0", "reducer/0", "replica/0/0", "replica/0/1", "stage/0",
                "reader/0/0", "reader/0/1", "coordinator/1", "updater/1", "reducer/1",
                "replica/1/0", "replica/1/1", "stage/1", "reader/1/0", "reader/1/1", "server/0"}));
  for (const auto& name : names) {
    const auto a = t.value().find(name);
    ASSERT_TRUE(a) << a.status().message();
    EXPECT_EQ(t.value().nameOf(a.value()), name);
  }
  const auto missing = t.value().find("reader/2/0");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("no actor 'reader/2/0'"), std::string::npos);
}

}  // namespace
}  // namespace troupe::actors
