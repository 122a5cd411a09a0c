#include <gtest/gtest.h>

#include <limits>

#include <algorithm>
#include <utility>

#include <cmath>
#include <numbers>

#include "float_bounds.h"
#include "kernels/backend.h"
#include "kernels/optimizer.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

struct Sgd1 {
  std::unique_ptr<Backend> backend = makeCpuBackend(2);
  Tensor w = Tensor::host({1}), g = Tensor::host({1});
  std::unique_ptr<Optimizer> opt;
  explicit Sgd1(SgdOptions options) : opt(makeSgd(*backend, 1, options)) { w.f32()[0] = 1.0f; }
  float step(float grad, float lr) {
    g.f32()[0] = grad;
    opt->step(w, g, lr);
    return w.f32()[0];
  }
};

TEST(Sgd, MomentumStepsMatchHandComputedValues) {
  Sgd1 s({0.9f, 0.0f, false, {}});
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.9f);   // v = 1, w = 1 - 0.1
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.71f);  // v = 1.9, w = 0.9 - 0.19
  EXPECT_FLOAT_EQ(s.opt->state().f32()[0], 1.9f);
}

TEST(Sgd, NesterovStepsMatchPyTorchsFormulation) {
  Sgd1 s({0.9f, 0.0f, true, {}});
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.81f);   // v = 1, w = 1 - 0.1 * (1 + 0.9)
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.539f);  // v = 1.9, w = 0.81 - 0.1 * (1 + 1.71)
}

TEST(Sgd, WeightDecayIsAddedToTheGradient) {
  Sgd1 s({0.0f, 0.5f, false, {}});
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.85f);  // g' = 1 + 0.5, w = 1 - 0.15
}

TEST(Sgd, UpdatesEveryElementOfALargeFlatTensor) {
  auto backend = makeCpuBackend(2);
  const std::int64_t n = 1 << 20;
  auto opt = makeSgd(*backend, n, {0.9f, 0.0f, false, {}});
  Tensor w = Tensor::host({n}), g = Tensor::host({n});
  for (std::int64_t i = 0; i < n; ++i)
    g.f32()[i] = static_cast<float>(i % 7);
  opt->step(w, g, 0.5f);
  for (std::int64_t i = 0; i < n; i += 9973)
    EXPECT_EQ(w.f32()[i], -0.5f * (i % 7));
}

// no_decay: weight decay leaves those ranges alone, in a whole step and in a bucket's range that
// cuts through them. With a zero gradient and no momentum, a decayed weight of 1 becomes
// 1 - lr * wd (0.5 * 0.2 = 0.1: 0.9) and one that does not decay stays 1.
TEST(Sgd, NoDecayRangesAreLeftOutOfWeightDecayInStepsAndRanges) {
  auto backend = makeCpuBackend(1);
  const std::int64_t n = 20;
  const SgdOptions options{0.0f, 0.2f, false, {{2, 5}, {9, 10}, {15, 20}}};
  auto expected = [&](std::int64_t i) {
    const bool kept = (2 <= i && i < 5) || i == 9 || 15 <= i;
    return kept ? 1.0f : 0.9f;
  };
  auto whole = makeSgd(*backend, n, options);
  Tensor w = Tensor::host({n}), g = Tensor::host({n});
  std::fill_n(w.f32(), n, 1.0f);
  std::fill_n(g.f32(), n, 0.0f);
  EXPECT_TRUE(whole->step(w, g, 0.5f));
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_FLOAT_EQ(w.f32()[i], expected(i)) << "element " << i;

  auto buckets = makeSgd(*backend, n, options);
  std::fill_n(w.f32(), n, 1.0f);
  for (const auto& [lo, hi] : {std::pair<std::int64_t, std::int64_t>{12, 20}, {3, 12}, {0, 3}})
    buckets->stepRange(w.slice(lo, hi), g.slice(lo, hi), lo, hi, 0.5f);
  EXPECT_TRUE(buckets->finite());
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_FLOAT_EQ(w.f32()[i], expected(i)) << "element " << i << ", by buckets";

  EXPECT_THROW(makeSgd(*backend, n, {0.0f, 0.2f, false, {{5, 8}, {6, 9}}}), InputError);
  EXPECT_THROW(makeSgd(*backend, n, {0.0f, 0.2f, false, {{18, 21}}}), InputError);
}

// Ranges say nothing until finite(), which gathers every range since the last call and resets:
// one host wait per step on a device.
TEST(Sgd, FiniteGathersEveryRangeSinceItsLastCall) {
  auto backend = makeCpuBackend(2);
  const std::int64_t n = 100000;  // ranges over several threads
  auto sgd = makeSgd(*backend, n, SgdOptions{});
  Tensor w = Tensor::host({n}), g = Tensor::host({n});
  g.f32()[n / 2] = std::numeric_limits<float>::infinity();
  sgd->stepRange(w.slice(0, n / 4), g.slice(0, n / 4), 0, n / 4, 0.1f);
  sgd->stepRange(w.slice(n / 4, n), g.slice(n / 4, n), n / 4, n, 0.1f);  // holds the inf
  sgd->stepRange(w.slice(0, n / 4), g.slice(0, n / 4), 0, n / 4, 0.1f);
  EXPECT_FALSE(sgd->finite());
  sgd->stepRange(w.slice(0, n / 4), g.slice(0, n / 4), 0, n / 4, 0.1f);
  EXPECT_TRUE(sgd->finite());           // reset by the last call; this range is finite
  EXPECT_FALSE(sgd->step(w, g, 0.1f));  // w[n / 2] is inf since the first step
}

TEST(Sgd, RejectsAMomentumOfOneOrMore) {
  auto backend = makeCpuBackend(1);
  EXPECT_THROW(makeSgd(*backend, 1, {1.0f, 0.0f, false, {}}), InputError);
}

TEST(LearningRate, FixedPolicyIsTheBaseRate) {
  LrPolicy p;
  p.base = 0.1f;
  EXPECT_FLOAT_EQ(learningRate(p, 0), 0.1f);
  EXPECT_FLOAT_EQ(learningRate(p, 100000), 0.1f);
}

TEST(LearningRate, StepPolicyMultipliesByGammaEveryStepsize) {
  LrPolicy p{"step", 0.1f, 0.5f, 10, {}, 0, 0};
  EXPECT_FLOAT_EQ(learningRate(p, 9), 0.1f);
  EXPECT_FLOAT_EQ(learningRate(p, 10), 0.05f);
  EXPECT_FLOAT_EQ(learningRate(p, 25), 0.025f);
}

TEST(LearningRate, MultistepPolicyMultipliesByGammaAtEachStepValue) {
  LrPolicy p{"multistep", 1.0f, 0.1f, 0, {5, 8}, 0, 0};
  EXPECT_FLOAT_EQ(learningRate(p, 4), 1.0f);
  EXPECT_FLOAT_EQ(learningRate(p, 5), 0.1f);
  EXPECT_FLOAT_EQ(learningRate(p, 8), 0.01f);
}

TEST(LearningRate, CosinePolicyFallsToZeroAtMaxSteps) {
  LrPolicy p{"cosine", 1.0f, 0.1f, 0, {}, 100, 0};
  // Computed in double and rounded once to float: within u |lr| of the exact value, plus a few
  // double roundings of 1 + cos (terms of size 1).
  auto bound = [](double lr) {
    return testing::kFloatRoundoff * std::abs(lr) + 4 * testing::kDoubleRoundoff;
  };
  EXPECT_FLOAT_EQ(learningRate(p, 0), 1.0f);
  EXPECT_NEAR(learningRate(p, 50), 0.5, bound(0.5));
  const double at25 = 0.5 * (1 + std::cos(std::numbers::pi / 4));
  EXPECT_NEAR(learningRate(p, 25), at25, bound(at25));
  EXPECT_NEAR(learningRate(p, 100), 0.0, bound(0));
  EXPECT_NEAR(learningRate(p, 150), 0.0, bound(0));
}

TEST(LearningRate, WarmupRampsLinearlyToTheScheduledRate) {
  LrPolicy p{"fixed", 0.4f, 0.1f, 0, {}, 0, 4};
  EXPECT_FLOAT_EQ(learningRate(p, 0), 0.1f);
  EXPECT_FLOAT_EQ(learningRate(p, 1), 0.2f);
  EXPECT_FLOAT_EQ(learningRate(p, 3), 0.4f);
  EXPECT_FLOAT_EQ(learningRate(p, 4), 0.4f);
}

TEST(LearningRate, ValidateRejectsAnUnknownPolicyListingTheKnownOnes) {
  LrPolicy p;
  p.policy = "poly";
  try {
    validate(p);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("multistep"), std::string::npos) << e.what();
  }
}

TEST(LearningRate, ValidateRejectsAPolicyMissingItsParameters) {
  EXPECT_THROW(validate(LrPolicy{"step", 0.1f, 0.1f, 0, {}, 0, 0}), InputError);
  EXPECT_THROW(validate(LrPolicy{"multistep", 0.1f, 0.1f, 0, {}, 0, 0}), InputError);
  EXPECT_THROW(validate(LrPolicy{"cosine", 0.1f, 0.1f, 0, {}, 0, 0}), InputError);
  EXPECT_NO_THROW(validate(LrPolicy{"cosine", 0.1f, 0.1f, 0, {}, 10, 2}));
}

}  // namespace
}  // namespace troupe::kernels
