#include <gtest/gtest.h>

#include <deque>
#include <random>

#include "actors/ring_allreduce.h"

namespace troupe::actors {
namespace {

// N ranks in one thread; messages are delivered in a shuffled order across links (in order per
// link, as a transport guarantees), to shake out ordering assumptions.
struct Ring {
  Ring(int world, std::int64_t segment, unsigned seed) : rng(seed), queues(world) {
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back(
          r, world, segment,
          [this, r, world](RingChunk c) {
            // Copy, as a wire would: the receiver must not depend on the sender's memory.
            auto copy = kernels::Tensor::host({c.data.numel()});
            std::copy_n(c.data.f32(), c.data.numel(), copy.f32());
            c.data = copy;
            queues[static_cast<std::size_t>((r + 1) % world)].push_back(std::move(c));
          },
          [this, r](std::int64_t step, std::int64_t begin, std::int64_t end) {
            done.push_back({r, step, begin, end});
          });
    }
  }
  void deliverAll() {
    for (;;) {
      std::vector<std::size_t> busy;
      for (std::size_t i = 0; i < queues.size(); ++i) {
        if (!queues[i].empty()) busy.push_back(i);
      }
      if (busy.empty()) return;
      const auto i = busy[rng() % busy.size()];
      auto c = std::move(queues[i].front());
      queues[i].pop_front();
      ranks[i].receive(std::move(c));
    }
  }
  std::mt19937 rng;
  std::vector<std::deque<RingChunk>> queues;
  std::vector<RingAllreduce> ranks;
  std::vector<std::tuple<int, std::int64_t, std::int64_t, std::int64_t>> done;
};

kernels::Tensor values(std::int64_t n, int rank, int bucket) {
  auto t = kernels::Tensor::host({n});
  for (std::int64_t i = 0; i < n; ++i) {
    t.f32()[i] = static_cast<float>((i * 7 + rank * 13 + bucket * 3) % 17) - 8.0f;
  }
  return t;
}

class RingAllreduceTest
    : public ::testing::TestWithParam<std::tuple<int, std::int64_t, std::int64_t>> {};

TEST_P(RingAllreduceTest, EveryRankEndsWithTheSameSumOfAllRanks) {
  const auto [world, length, segment] = GetParam();
  Ring ring(world, segment, 7);
  std::vector<std::vector<kernels::Tensor>> buckets(static_cast<std::size_t>(world));
  // Two buckets of two steps, started in different orders on different ranks.
  for (int r = 0; r < world; ++r) {
    for (int b = 0; b < 2; ++b)
      buckets[r].push_back(values(length, r, b));
  }
  for (int r = world - 1; r >= 0; --r) {
    const int first = r % 2;
    ring.ranks[r].start(3, first * length, buckets[r][first]);
    ring.deliverAll();  // some ranks receive chunks before they start their bucket
    ring.ranks[r].start(3, (1 - first) * length, buckets[r][1 - first]);
  }
  ring.deliverAll();
  ASSERT_EQ(ring.done.size(), static_cast<std::size_t>(2 * world));
  for (int b = 0; b < 2; ++b) {
    for (std::int64_t i = 0; i < length; ++i) {
      float expected = 0;
      for (int r = 0; r < world; ++r)
        expected += values(length, r, b).f32()[i];
      for (int r = 0; r < world; ++r) {
        ASSERT_FLOAT_EQ(buckets[r][b].f32()[i], expected) << "rank " << r << " element " << i;
        ASSERT_EQ(buckets[r][b].f32()[i], buckets[0][b].f32()[i]) << "ranks differ bitwise";
      }
    }
  }
  for (const auto& r : ring.ranks)
    EXPECT_EQ(r.pending(), 0u);
}

INSTANTIATE_TEST_SUITE_P(WorldsLengthsSegments, RingAllreduceTest,
                         ::testing::Values(std::make_tuple(1, 10, 4), std::make_tuple(2, 10, 4),
                                           std::make_tuple(3, 1000, 64),
                                           std::make_tuple(4, 3, 100),  // fewer elements than ranks
                                           std::make_tuple(4, 1001, 1001),
                                           std::make_tuple(5, 4097, 256)));

}  // namespace
}  // namespace troupe::actors
