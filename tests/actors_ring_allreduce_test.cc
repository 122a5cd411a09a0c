#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "actors/roles/ring_allreduce.h"
#include "float_bounds.h"
#include "shuffled_links.h"

namespace troupe::actors {
namespace {

// N ranks in one thread; messages are delivered in a shuffled order across links (in order per
// link, as a transport guarantees), to shake out ordering assumptions.
struct Ring {
  Ring(int world, std::int64_t segment, unsigned seed, kernels::CompressionSpec compression = {},
       RingAllreduce::Mode mode = RingAllreduce::Mode::kAllreduce,
       const RingAllreduce::Shards& shards = {})
      : links(static_cast<std::size_t>(world), seed) {
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back(
          r, world, segment,
          [this, r, world](RingChunk c) {
            // Copy, as a wire would: the receiver must not depend on the sender's memory.
            auto copy = kernels::Tensor::host({c.data.numel()}, c.data.dtype());
            std::memcpy(copy.raw(), c.data.raw(), c.data.bytes());
            c.data = copy;
            links.push(static_cast<std::size_t>((r + 1) % world), std::move(c));
          },
          [this, r](std::int64_t step, std::int64_t begin, std::int64_t end) {
            done.push_back({r, step, begin, end});
          },
          compression, mode, 0, shards);
    }
  }
  void deliverAll() {
    links.deliverAll([this](std::size_t i, RingChunk c) { ranks[i].receive(std::move(c)); });
  }
  testing::ShuffledLinks<RingChunk> links;
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

// Rank r's gradient element i: small values of both signs, below 2bit's threshold.
float gradient(int rank, std::int64_t i) {
  return 0.01f * static_cast<float>((i * 7 + rank * 13) % 19 - 9);
}

class CompressedRingTest : public ::testing::TestWithParam<kernels::GradientCompression> {};

// fp16 and bf16: each hop rounds its partial sum once (world - 1 times in the reduce-scatter,
// once more when the owner encodes the finished sum), each within the format's unit roundoff of
// what it rounds, whose magnitude is at most sum |x_r|: the result is within world * u * sum |x_r|
// of the exact sum (u = 2^-11 for fp16, 2^-8 for bf16). And every rank holds the same bits.
TEST_P(CompressedRingTest, HalfPrecisionSumsAreWithinTheirRoundingAndEqualOnEveryRank) {
  const auto type = GetParam();
  const double u = type == kernels::GradientCompression::kFp16 ? 0x1p-11 : 0x1p-8;
  const int world = 4;
  const std::int64_t n = 1003;
  Ring ring(world, 256, 3, {type, 0.5f});
  std::vector<kernels::Tensor> buckets;
  for (int r = 0; r < world; ++r) {
    buckets.push_back(kernels::Tensor::host({n}));
    for (std::int64_t i = 0; i < n; ++i)
      buckets[r].f32()[i] = gradient(r, i) * static_cast<float>(1 + i % 5);
  }
  for (int r = 0; r < world; ++r)
    ring.ranks[r].start(0, 0, buckets[r]);
  ring.deliverAll();
  ASSERT_EQ(ring.done.size(), static_cast<std::size_t>(world));
  for (std::int64_t i = 0; i < n; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < world; ++r) {
      const double x = gradient(r, i) * static_cast<float>(1 + i % 5);
      exact += x;
      magnitude += std::abs(x);
    }
    const double bound = world * u * magnitude + testing::gammaN(world) * magnitude;
    ASSERT_NEAR(buckets[0].f32()[i], exact, bound) << "element " << i;
    for (int r = 1; r < world; ++r)
      ASSERT_EQ(buckets[r].f32()[i], buckets[0].f32()[i]) << "rank " << r << " element " << i;
  }
}

// ZeRO's reduce-scatter compressed (shards uneven, and a bucket within one shard, whose other
// chunks are empty): each owner ends with its shard's sum within the same rounding as an
// allreduce's owner (world - 1 hops and its own encoding, each within u of sum |x_r|), kept as
// that owner passes it on: a value the format holds exactly.
TEST_P(CompressedRingTest, ShardedReduceScatterKeepsTheSumsAsAnAllreducesOwnerPassesThem) {
  const auto type = GetParam();
  const double u = type == kernels::GradientCompression::kFp16 ? 0x1p-11 : 0x1p-8;
  const int world = 3;
  const RingAllreduce::Shards shards = {{0, 100}, {100, 460}, {460, 601}};
  const std::vector<std::pair<std::int64_t, std::int64_t>> bucket_ranges = {
      {0, 301}, {301, 601}, {120, 130}};
  Ring scatter(world, 128, 9, {type, 0.5f}, RingAllreduce::Mode::kReduceScatter, shards);
  std::vector<std::vector<kernels::Tensor>> buckets(world);
  auto input = [](int r, std::int64_t i) { return gradient(r, i) * static_cast<float>(1 + i % 5); };
  for (int r = 0; r < world; ++r) {
    for (std::size_t b = 0; b < bucket_ranges.size(); ++b) {
      const auto [begin, end] = bucket_ranges[b];
      buckets[r].push_back(kernels::Tensor::host({end - begin}));
      for (std::int64_t i = begin; i < end; ++i)
        buckets[r][b].f32()[i - begin] = input(r, i);
      scatter.ranks[r].start(b == 2 ? 1 : 0, begin, buckets[r][b]);
    }
  }
  scatter.deliverAll();
  ASSERT_EQ(scatter.done.size(), bucket_ranges.size() * world);
  for (int r = 0; r < world; ++r) {
    const auto [lo, hi] = shards[r];
    for (std::size_t b = 0; b < bucket_ranges.size(); ++b) {
      const auto [begin, end] = bucket_ranges[b];
      for (std::int64_t i = std::max(lo, begin); i < std::min(hi, end); ++i) {
        double exact = 0, magnitude = 0;
        for (int q = 0; q < world; ++q) {
          exact += input(q, i);
          magnitude += std::abs(input(q, i));
        }
        const double bound = world * u * magnitude + testing::gammaN(world) * magnitude;
        const float kept = buckets[r][b].f32()[i - begin];
        ASSERT_NEAR(kept, exact, bound) << "rank " << r << " bucket " << b << " element " << i;
        // What it kept is a value the format holds exactly: encoded and decoded, as passed on.
        const auto once = kernels::encode({type, 0.5f}, &kept, nullptr, 1);
        float again = 0;
        kernels::decode({type, 0.5f}, once, &again, 1, /*accumulate=*/false);
        ASSERT_EQ(again, kept) << "rank " << r << " element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CompressedRingTest,
                         ::testing::Values(kernels::GradientCompression::kFp16,
                                           kernels::GradientCompression::kBf16));

// One step of 2bit tests: every rank starts the bucket [0, n) of gradient(r, i) as `step`;
// each rank's bucket once the ring is done.
std::vector<kernels::Tensor> startedAndDone(Ring& ring, int world, std::int64_t n, int step) {
  std::vector<kernels::Tensor> buckets;
  for (int r = 0; r < world; ++r) {
    buckets.push_back(kernels::Tensor::host({n}));
    for (std::int64_t i = 0; i < n; ++i)
      buckets[r].f32()[i] = gradient(r, i);
    ring.ranks[r].start(step, 0, buckets[r]);
  }
  ring.deliverAll();
  return buckets;
}

double exactSum(int world, std::int64_t i) {
  double exact = 0;
  for (int r = 0; r < world; ++r)
    exact += gradient(r, i);
  return exact;
}

// 2bit keeps what it did not send in residuals: summed over many steps, the allreduced values
// track the true sums. Every hop's residual stays below threshold + |its partial sum| (values of
// that size are sent), so after T steps of the same gradients the mean result is within
// (world - 1 + 1) hops * (threshold + max |partial sum|) / T of the true sum, on every rank alike.
TEST(CompressedRing, TwoBitResidualsMakeTheMeanOverStepsTheTrueSum) {
  const int world = 3, steps = 400;
  const std::int64_t n = 257;
  const float threshold = 0.5f;
  Ring ring(world, 64, 5, {kernels::GradientCompression::k2Bit, threshold});
  std::vector<std::vector<double>> mean(world, std::vector<double>(n, 0.0));
  for (int t = 0; t < steps; ++t) {
    const auto buckets = startedAndDone(ring, world, n, t);
    for (int r = 0; r < world; ++r) {
      for (std::int64_t i = 0; i < n; ++i) {
        const float v = buckets[r].f32()[i];
        ASSERT_TRUE(v == 0 || std::abs(v) == threshold)
            << "an all-gathered 2bit value is 0 or +-threshold, got " << v;
        ASSERT_EQ(v, buckets[0].f32()[i]) << "rank " << r << " element " << i;
        mean[r][i] += v / steps;
      }
    }
  }
  const double max_partial = world * 0.09;
  const double bound = world * (threshold + max_partial) / steps;
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(mean[0][i], exactSum(world, i), bound) << "element " << i;
  }
}

// ZeRO's two halves of an allreduce: with chunks cut at the ranks' shards, the reduce-scatter
// leaves each rank the whole sum of its own shard's part of every bucket, and the all-gather then
// gives every rank each shard as its owner had it. The shards are uneven, and a bucket may lie
// within one shard (its other chunks empty) or cross several; segments cut the buckets further.
// The values are small integers, so every sum is exact whatever the order of its additions.
TEST(ShardedRing, ReduceScatterFinishesEachShardAndAllGatherSpreadsIt) {
  const int world = 3;
  const RingAllreduce::Shards shards = {{0, 7}, {7, 30}, {30, 41}};
  const std::vector<std::pair<std::int64_t, std::int64_t>> bucket_ranges = {
      {0, 5}, {5, 25}, {25, 41}, {9, 12}};  // [9,12): a second step's bucket within shard 1
  for (const std::int64_t segment : {4, 100}) {
    SCOPED_TRACE(::testing::Message() << "segment " << segment);
    Ring scatter(world, segment, 11, {}, RingAllreduce::Mode::kReduceScatter, shards);
    std::vector<std::vector<kernels::Tensor>> buckets(world);
    for (int r = world - 1; r >= 0; --r) {
      for (std::size_t b = 0; b < bucket_ranges.size(); ++b) {
        const auto [begin, end] = bucket_ranges[b];
        buckets[r].push_back(values(end - begin, r, static_cast<int>(b)));
        scatter.ranks[r].start(b == 3 ? 5 : 4, begin, buckets[r][b]);
        if (b == 1) scatter.deliverAll();
      }
    }
    scatter.deliverAll();
    ASSERT_EQ(scatter.done.size(), bucket_ranges.size() * world);
    for (int r = 0; r < world; ++r) {
      const auto [lo, hi] = shards[r];
      for (std::size_t b = 0; b < bucket_ranges.size(); ++b) {
        const auto [begin, end] = bucket_ranges[b];
        for (std::int64_t i = std::max(lo, begin); i < std::min(hi, end); ++i) {
          float expected = 0;
          for (int q = 0; q < world; ++q)
            expected += values(end - begin, q, static_cast<int>(b)).f32()[i - begin];
          ASSERT_EQ(buckets[r][b].f32()[i - begin], expected)
              << "rank " << r << " bucket " << b << " element " << i;
        }
      }
    }

    // The all-gather: each rank's own shard holds its rank's mark, the rest stale values.
    Ring gather(world, segment, 13, {}, RingAllreduce::Mode::kAllGather, shards);
    auto owner = [&](std::int64_t i) {
      int q = 0;
      while (i >= shards[q].second)
        ++q;
      return q;
    };
    for (int r = 0; r < world; ++r) {
      for (std::size_t b = 0; b < bucket_ranges.size(); ++b) {
        const auto [begin, end] = bucket_ranges[b];
        for (std::int64_t i = begin; i < end; ++i)
          buckets[r][b].f32()[i - begin] = owner(i) == r ? static_cast<float>(100 * r + i) : -1.0f;
        gather.ranks[r].start(b == 3 ? 5 : 4, begin, buckets[r][b]);
      }
      if (r == 0) gather.deliverAll();
    }
    gather.deliverAll();
    ASSERT_EQ(gather.done.size(), bucket_ranges.size() * world);
    for (int r = 0; r < world; ++r) {
      for (std::size_t b = 0; b < bucket_ranges.size(); ++b) {
        const auto [begin, end] = bucket_ranges[b];
        for (std::int64_t i = begin; i < end; ++i)
          ASSERT_EQ(buckets[r][b].f32()[i - begin], static_cast<float>(100 * owner(i) + i))
              << "rank " << r << " element " << i;
      }
      EXPECT_EQ(gather.ranks[r].pending(), 0u);
    }
  }
}

// 2bit in ZeRO's reduce-scatter: each owner keeps its shard as 0 or +-threshold, and with the
// residuals the mean over steps tracks the true sums within the allreduce's bound (above).
TEST(CompressedRing, ShardedTwoBitReduceScatterTracksTheTrueSumsOverSteps) {
  const int world = 3, steps = 400;
  const std::int64_t n = 257;
  const float threshold = 0.5f;
  const RingAllreduce::Shards shards = {{0, 40}, {40, 200}, {200, 257}};
  Ring ring(world, 64, 5, {kernels::GradientCompression::k2Bit, threshold},
            RingAllreduce::Mode::kReduceScatter, shards);
  std::vector<double> mean(n, 0.0);
  for (int t = 0; t < steps; ++t) {
    const auto buckets = startedAndDone(ring, world, n, t);
    for (int r = 0; r < world; ++r) {
      for (std::int64_t i = shards[r].first; i < shards[r].second; ++i) {
        const float v = buckets[r].f32()[i];
        ASSERT_TRUE(v == 0 || std::abs(v) == threshold) << "rank " << r << " kept " << v;
        mean[i] += v / steps;
      }
    }
  }
  const double bound = world * (threshold + world * 0.09) / steps;
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(mean[i], exactSum(world, i), bound) << "element " << i;
  }
}

}  // namespace
}  // namespace troupe::actors
