// Hierarchical allreduce (in the host, across hosts, in the host) and the topology that picks it,
// N ranks in one thread.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>

#include "actors/core/hosts.h"
#include "actors/roles/hierarchical_allreduce.h"
#include "float_bounds.h"
#include "shuffled_links.h"
#include "troupe/error.h"

namespace troupe::actors {
namespace {

// H hosts of L ranks; rank = host * L + local. Deliveries shuffled across links, in order per
// link (as a transport is), and every chunk copied as a wire would.
struct Hosts {
  Hosts(int hosts, int local, std::int64_t segment, unsigned seed,
        kernels::CompressionSpec compression = {})
      : h(hosts), l(local), links(static_cast<std::size_t>(3 * hosts * local), seed) {
    for (int r = 0; r < h * l; ++r) {
      const int host = r / l, index = r % l;
      ranks.emplace_back(
          index, l, host, h, segment,
          [this, host, index](RingChunk c) {
            auto copy = kernels::Tensor::host({c.data.numel()}, c.data.dtype());
            std::memcpy(copy.raw(), c.data.raw(), c.data.bytes());
            c.data = copy;
            const int to = c.ring == 1 ? ((host + 1) % h) * l + index : host * l + (index + 1) % l;
            links.push(static_cast<std::size_t>(3 * to + c.ring), std::move(c));
          },
          [this, r](std::int64_t step, std::int64_t begin, std::int64_t) {
            done.push_back({r, step, begin});
          },
          compression);
    }
  }
  void deliverAll() {
    links.deliverAll([this](std::size_t i, RingChunk c) { ranks[i / 3].receive(std::move(c)); });
  }
  int h, l;
  testing::ShuffledLinks<RingChunk> links;  // per receiving rank and ring: 3 * rank + ring
  std::deque<HierarchicalAllreduce> ranks;  // not moved once made: their rings call back
  std::vector<std::tuple<int, std::int64_t, std::int64_t>> done;
};

float value(int rank, std::int64_t i, int bucket) {
  return static_cast<float>((i * 7 + rank * 13 + bucket * 3) % 17) - 8.0f;
}

class HierarchicalTest : public ::testing::TestWithParam<std::tuple<int, int, std::int64_t>> {};

// Small integers: every order of addition gives the exact sum, so the result must be exact.
TEST_P(HierarchicalTest, EveryRankEndsWithTheSumOfAllRanksBitwiseAlike) {
  const auto [hosts, local, length] = GetParam();
  const int world = hosts * local;
  Hosts run(hosts, local, 64, 11);
  std::vector<std::vector<kernels::Tensor>> buckets(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    for (int b = 0; b < 2; ++b) {
      buckets[r].push_back(kernels::Tensor::host({length}));
      for (std::int64_t i = 0; i < length; ++i)
        buckets[r][b].f32()[i] = value(r, i, b);
    }
  }
  // Two buckets of one step, started in different orders on different ranks.
  for (int r = world - 1; r >= 0; --r) {
    const int first = r % 2;
    run.ranks[r].start(5, first * length, buckets[r][first]);
    run.deliverAll();
    run.ranks[r].start(5, (1 - first) * length, buckets[r][1 - first]);
  }
  run.deliverAll();
  ASSERT_EQ(run.done.size(), static_cast<std::size_t>(2 * world));
  for (int b = 0; b < 2; ++b) {
    for (std::int64_t i = 0; i < length; ++i) {
      float expected = 0;
      for (int r = 0; r < world; ++r)
        expected += value(r, i, b);
      for (int r = 0; r < world; ++r)
        ASSERT_EQ(buckets[r][b].f32()[i], expected) << "rank " << r << " element " << i;
    }
  }
  for (const auto& r : run.ranks)
    EXPECT_EQ(r.pending(), 0u);
}

INSTANTIATE_TEST_SUITE_P(HostsLocalLengths, HierarchicalTest,
                         ::testing::Values(std::make_tuple(2, 2, 1000), std::make_tuple(3, 2, 257),
                                           std::make_tuple(2, 3, 4097),
                                           std::make_tuple(2, 4, 5)));  // slices of 1 or 2

// With compression between hosts (fp16), each rank still holds the same bits, within half's
// rounding of the exact sum: the ring across hosts rounds H partial sums of at most sum |x|
// (2^-11 each), the host's rings add in float (gamma_N).
TEST(HierarchicalAllreduce, CompressionBetweenHostsKeepsEveryRankAlike) {
  const int hosts = 2, local = 2, world = 4;
  const std::int64_t n = 999;
  Hosts run(hosts, local, 100, 3, {kernels::GradientCompression::kFp16, 0.5f});
  std::vector<kernels::Tensor> buckets;
  for (int r = 0; r < world; ++r) {
    buckets.push_back(kernels::Tensor::host({n}));
    for (std::int64_t i = 0; i < n; ++i)
      buckets[r].f32()[i] = 0.013f * value(r, i, 0) + 0.001f * static_cast<float>(r);
  }
  for (int r = 0; r < world; ++r)
    run.ranks[r].start(0, 0, buckets[r]);
  run.deliverAll();
  for (std::int64_t i = 0; i < n; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < world; ++r) {
      const double x = 0.013f * value(r, i, 0) + 0.001f * static_cast<float>(r);
      exact += x;
      magnitude += std::abs(x);
    }
    const double bound = hosts * 0x1p-11 * magnitude + testing::gammaN(world) * magnitude;
    ASSERT_NEAR(buckets[0].f32()[i], exact, bound) << "element " << i;
    for (int r = 1; r < world; ++r)
      ASSERT_EQ(buckets[r].f32()[i], buckets[0].f32()[i]) << "rank " << r << " element " << i;
  }
}

TEST(Topology, WorkersAreGroupedByHostInOrderOfTheirLowestRank) {
  const auto hosts = groupHosts({"b", "a", "b", "a", "c"});
  EXPECT_EQ(hosts, (std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4}}));
}

TEST(Topology, AutoIsHierarchicalOnlyWhereSeveralEvenHostsHoldSeveralWorkers) {
  const std::vector<std::vector<int>> even{{0, 2}, {1, 3}};
  const auto plan = planReduction(Allreduce::kAuto, even, 3);
  EXPECT_EQ(plan.host_ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(plan.across_ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(plan.description, "hierarchical: 2 hosts x 2 workers");
  EXPECT_TRUE(planReduction(Allreduce::kRing, even, 3).host_ranks.empty());
  EXPECT_TRUE(planReduction(Allreduce::kAuto, {{0, 1, 2, 3}}, 0).host_ranks.empty());  // one host
  EXPECT_TRUE(planReduction(Allreduce::kAuto, {{0}, {1}}, 0).host_ranks.empty());      // one a host
  EXPECT_TRUE(planReduction(Allreduce::kAuto, {{0, 1}, {2}}, 0).host_ranks.empty());   // uneven
}

TEST(Topology, HierarchicalWhereItCannotApplyIsAnErrorNamingTheHosts) {
  try {
    planReduction(Allreduce::kHierarchical, {{0, 1}, {2}}, 0);
    FAIL() << "uneven hosts accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("hold 2, 1 worker(s)"), std::string::npos) << e.what();
  }
}

TEST(Topology, AHostKeyNamesTheBootAndTheNamespaces) {
  const std::string key = hostKey();
  EXPECT_NE(key.find("net:["), std::string::npos) << key;
  EXPECT_NE(key.find("pid:["), std::string::npos) << key;
  EXPECT_EQ(key, hostKey());
}

}  // namespace
}  // namespace troupe::actors
