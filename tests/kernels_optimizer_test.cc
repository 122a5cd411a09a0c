#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

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
  explicit Sgd1(OptimizerSettings options) : opt(makeOptimizer(*backend, 1, options)) {
    w.f32()[0] = 1.0f;
  }
  float step(float grad, float lr) {
    g.f32()[0] = grad;
    opt->step(w, g, lr, 1);
    return w.f32()[0];
  }
};

TEST(Sgd, MomentumStepsMatchHandComputedValues) {
  Sgd1 s(sgdSettings(0.9f, 0.0f, false, {}));
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.9f);   // v = 1, w = 1 - 0.1
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.71f);  // v = 1.9, w = 0.9 - 0.19
  EXPECT_FLOAT_EQ(s.opt->state().f32()[0], 1.9f);
}

TEST(Sgd, NesterovStepsMatchPyTorchsFormulation) {
  Sgd1 s(sgdSettings(0.9f, 0.0f, true, {}));
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.81f);   // v = 1, w = 1 - 0.1 * (1 + 0.9)
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.539f);  // v = 1.9, w = 0.81 - 0.1 * (1 + 1.71)
}

TEST(Sgd, WeightDecayIsAddedToTheGradient) {
  Sgd1 s(sgdSettings(0.0f, 0.5f, false, {}));
  EXPECT_FLOAT_EQ(s.step(1.0f, 0.1f), 0.85f);  // g' = 1 + 0.5, w = 1 - 0.15
}

TEST(Sgd, UpdatesEveryElementOfALargeFlatTensor) {
  auto backend = makeCpuBackend(2);
  const std::int64_t n = 1 << 20;
  auto opt = makeOptimizer(*backend, n, sgdSettings(0.9f, 0.0f, false, {}));
  Tensor w = Tensor::host({n}), g = Tensor::host({n});
  for (std::int64_t i = 0; i < n; ++i)
    g.f32()[i] = static_cast<float>(i % 7);
  opt->step(w, g, 0.5f, 1);
  for (std::int64_t i = 0; i < n; i += 9973)
    EXPECT_EQ(w.f32()[i], -0.5f * (i % 7));
}

// no_decay: weight decay leaves those ranges alone, in a whole step and in a bucket's range that
// cuts through them. With a zero gradient and no momentum, a decayed weight of 1 becomes
// 1 - lr * wd (0.5 * 0.2 = 0.1: 0.9) and one that does not decay stays 1.
TEST(Sgd, NoDecayRangesAreLeftOutOfWeightDecayInStepsAndRanges) {
  auto backend = makeCpuBackend(1);
  const std::int64_t n = 20;
  const OptimizerSettings options = sgdSettings(0.0f, 0.2f, false, {{2, 5}, {9, 10}, {15, 20}});
  auto expected = [&](std::int64_t i) {
    const bool kept = (2 <= i && i < 5) || i == 9 || 15 <= i;
    return kept ? 1.0f : 0.9f;
  };
  auto whole = makeOptimizer(*backend, n, options);
  Tensor w = Tensor::host({n}), g = Tensor::host({n});
  std::fill_n(w.f32(), n, 1.0f);
  std::fill_n(g.f32(), n, 0.0f);
  EXPECT_TRUE(whole->step(w, g, 0.5f, 1));
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_FLOAT_EQ(w.f32()[i], expected(i)) << "element " << i;

  auto buckets = makeOptimizer(*backend, n, options);
  std::fill_n(w.f32(), n, 1.0f);
  for (const auto& [lo, hi] : {std::pair<std::int64_t, std::int64_t>{12, 20}, {3, 12}, {0, 3}})
    buckets->stepRange(w.slice(lo, hi), g.slice(lo, hi), lo, hi, 0.5f, 1);
  EXPECT_TRUE(buckets->finite());
  for (std::int64_t i = 0; i < n; ++i)
    EXPECT_FLOAT_EQ(w.f32()[i], expected(i)) << "element " << i << ", by buckets";

  EXPECT_THROW(makeOptimizer(*backend, n, sgdSettings(0.0f, 0.2f, false, {{5, 8}, {6, 9}})),
               InputError);
  EXPECT_THROW(makeOptimizer(*backend, n, sgdSettings(0.0f, 0.2f, false, {{18, 21}})), InputError);
}

// Ranges say nothing until finite(), which gathers every range since the last call and resets:
// one host wait per step on a device.
TEST(Sgd, FiniteGathersEveryRangeSinceItsLastCall) {
  auto backend = makeCpuBackend(2);
  const std::int64_t n = 100000;  // ranges over several threads
  auto sgd = makeOptimizer(*backend, n, OptimizerSettings{});
  Tensor w = Tensor::host({n}), g = Tensor::host({n});
  g.f32()[n / 2] = std::numeric_limits<float>::infinity();
  sgd->stepRange(w.slice(0, n / 4), g.slice(0, n / 4), 0, n / 4, 0.1f, 1);
  sgd->stepRange(w.slice(n / 4, n), g.slice(n / 4, n), n / 4, n, 0.1f, 1);  // holds the inf
  sgd->stepRange(w.slice(0, n / 4), g.slice(0, n / 4), 0, n / 4, 0.1f, 1);
  EXPECT_FALSE(sgd->finite());
  sgd->stepRange(w.slice(0, n / 4), g.slice(0, n / 4), 0, n / 4, 0.1f, 1);
  EXPECT_TRUE(sgd->finite());              // reset by the last call; this range is finite
  EXPECT_FALSE(sgd->step(w, g, 0.1f, 1));  // w[n / 2] is inf since the first step
}

TEST(Sgd, RejectsAMomentumOfOneOrMore) {
  auto backend = makeCpuBackend(1);
  EXPECT_THROW(makeOptimizer(*backend, 1, sgdSettings(1.0f, 0.0f, false, {})), InputError);
}

// The first Adam step moves every weight by lr against its gradient's sign, whatever the
// gradient's size: m_hat = g, v_hat = g^2, so the step is lr g / (|g| + eps) (eps 1e-8 is below
// the float rounding of |g| >= 0.25 here).
TEST(Adam, FirstStepMovesEachWeightByTheLearningRate) {
  auto backend = makeCpuBackend(1);
  OptimizerSettings s;
  s.kind = &optimizerInfo("adam");
  auto adam = makeOptimizer(*backend, 3, s);
  Tensor w = Tensor::host({3}), g = Tensor::host({3});
  const float grads[] = {2.0f, -0.25f, 30.0f};
  std::copy(grads, grads + 3, g.f32());
  ASSERT_TRUE(adam->step(w, g, 0.1f, 1));
  EXPECT_FLOAT_EQ(w.f32()[0], -0.1f);
  EXPECT_FLOAT_EQ(w.f32()[1], 0.1f);
  EXPECT_FLOAT_EQ(w.f32()[2], -0.1f);
  EXPECT_EQ(adam->states(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(adam->state().numel(), 6);            // two rows of three
  EXPECT_FLOAT_EQ(adam->state().f32()[0], 0.2f);  // exp_avg = (1 - 0.9) g
  // exp_avg_sq = (1 - beta2) g^2, with 1 - beta2 of the float beta2 (exact: Sterbenz).
  EXPECT_FLOAT_EQ(adam->state().f32()[3 + 2], (1.0f - 0.999f) * 30.0f * 30.0f);
}

// AdamW shrinks the weight by lr * weight_decay before the Adam step; Adam adds the decay to the
// gradient. With a zero gradient and no history, Adam's step is then lr * sign(decay * w).
TEST(Adam, AdamwDecaysTheWeightAndAdamTheGradient) {
  auto backend = makeCpuBackend(1);
  OptimizerSettings s;
  s.weight_decay = 0.5f;
  Tensor w = Tensor::host({1}), g = Tensor::host({1});
  s.kind = &optimizerInfo("adamw");
  w.f32()[0] = 2.0f;
  ASSERT_TRUE(makeOptimizer(*backend, 1, s)->step(w, g, 0.1f, 1));
  EXPECT_FLOAT_EQ(w.f32()[0], 2.0f * (1 - 0.1f * 0.5f));  // m = v = 0: no Adam step
  s.kind = &optimizerInfo("adam");
  w.f32()[0] = 2.0f;
  ASSERT_TRUE(makeOptimizer(*backend, 1, s)->step(w, g, 0.1f, 1));
  EXPECT_FLOAT_EQ(w.f32()[0], 1.9f);
}

TEST(Optimizers, AnUnknownNameListsTheKnownOnes) {
  OptimizerSettings s;
  EXPECT_FALSE(setOptimizerName(s, "adamax"));
  EXPECT_EQ(s.name(), "sgd");
  EXPECT_TRUE(setOptimizerName(s, "nag"));  // MXNet's SGD with Nesterov momentum
  EXPECT_EQ(s.name(), "sgd");
  EXPECT_TRUE(s.nesterov);
  try {
    optimizerNamed("adamax");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown optimizer 'adamax' (known: sgd, adagrad, adam, adamw, lamb, lars, "
                 "rmsprop)");
  }
}

TEST(Optimizers, ASettingOutOfItsRangeIsNamed) {
  auto backend = makeCpuBackend(1);
  const auto message = [&](OptimizerSettings s) {
    try {
      makeOptimizer(*backend, 1, s);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  OptimizerSettings s;
  s.kind = &optimizerInfo("adam");
  s.beta1 = 1.0f;
  EXPECT_EQ(message(s), "adam beta1 = 1 is outside [0, 1)");
  s.beta1 = std::nanf("");
  EXPECT_EQ(message(s), "adam beta1 = nan is outside [0, 1)");
  s = OptimizerSettings{};
  s.kind = &optimizerInfo("rmsprop");
  s.rho = -0.5f;
  EXPECT_EQ(message(s), "rmsprop rho = -0.5 is outside [0, 1)");
  s = OptimizerSettings{};
  s.kind = &optimizerInfo("lars");
  s.weight_decay = -1.0f;
  EXPECT_EQ(message(s), "lars weight_decay = -1 is not >= 0");
}

// Each optimizer's state rows, by PyTorch's names, and its default epsilon in the description.
TEST(Optimizers, EveryOneNamesItsStateRows) {
  auto backend = makeCpuBackend(1);
  for (const auto& row : optimizers()) {
    OptimizerSettings s;
    s.kind = &row;
    auto opt = makeOptimizer(*backend, 10, s);
    EXPECT_EQ(opt->states(), row.states) << row.name;
    EXPECT_EQ(opt->state().numel(), 10 * static_cast<std::int64_t>(opt->states().size()))
        << row.name;
    EXPECT_EQ(opt->size(), 10) << row.name;
    EXPECT_EQ(opt->layerwise(), row.layerwise) << row.name;
  }
  OptimizerSettings adagrad;
  adagrad.kind = &optimizerInfo("adagrad");
  EXPECT_EQ(describe(adagrad), "adagrad (epsilon 1e-10), weight decay 0");
}

// A layerwise optimizer's trust ratio is per layer: the same layer in another place of the flat
// weights, or beside other layers, moves the same.
TEST(Optimizers, LarsTrustRatioIsPerLayer) {
  auto backend = makeCpuBackend(2);
  OptimizerSettings s;
  s.kind = &optimizerInfo("lars");
  s.momentum = 0.0f;
  s.eta = 0.01f;
  s.layers = {{0, 4}, {4, 8}};
  auto lars = makeOptimizer(*backend, 8, s);
  Tensor w = Tensor::host({8}), g = Tensor::host({8});
  const float wv[] = {3, 4, 0, 0, 30, 40, 0, 0};  // norms 5 and 50
  const float gv[] = {0, 0, 1, 0, 0, 0, 0, 2};    // norms 1 and 2
  std::copy(wv, wv + 8, w.f32());
  std::copy(gv, gv + 8, g.f32());
  ASSERT_TRUE(lars->step(w, g, 1.0f, 1));
  // Layer 0: trust 0.01 * 5 / 1 = 0.05, so w[2] = -0.05; layer 1: 0.01 * 50 / 2 = 0.25, w[7] =
  // -0.5.
  EXPECT_FLOAT_EQ(w.f32()[2], -0.05f);
  EXPECT_FLOAT_EQ(w.f32()[7], -0.5f);
  EXPECT_FLOAT_EQ(w.f32()[0], 3.0f);
}

TEST(LearningRate, FixedPolicyIsTheBaseRate) {
  LrPolicy p;
  p.base = 0.1f;
  EXPECT_FLOAT_EQ(learningRate(p, 0), 0.1f);
  EXPECT_FLOAT_EQ(learningRate(p, 100000), 0.1f);
}

TEST(LearningRate, StepPolicyMultipliesByGammaEveryStepsize) {
  LrPolicy p{LrSchedule::kStep, 0.1f, 0.5f, 10, {}, 0, 0, 2.0f, 0.0f};
  EXPECT_FLOAT_EQ(learningRate(p, 9), 0.1f);
  EXPECT_FLOAT_EQ(learningRate(p, 10), 0.05f);
  EXPECT_FLOAT_EQ(learningRate(p, 25), 0.025f);
}

TEST(LearningRate, MultistepPolicyMultipliesByGammaAtEachStepValue) {
  LrPolicy p{LrSchedule::kMultistep, 1.0f, 0.1f, 0, {5, 8}, 0, 0};
  EXPECT_FLOAT_EQ(learningRate(p, 4), 1.0f);
  EXPECT_FLOAT_EQ(learningRate(p, 5), 0.1f);
  EXPECT_FLOAT_EQ(learningRate(p, 8), 0.01f);
}

TEST(LearningRate, CosinePolicyFallsToZeroAtMaxSteps) {
  LrPolicy p{LrSchedule::kCosine, 1.0f, 0.1f, 0, {}, 100, 0};
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

// MLPerf's LARS schedule: end + (base - end) (1 - step / max_steps)^power, flat after max_steps.
TEST(LearningRate, PolyPolicyFallsToTheEndRateAsAPowerOfTheStepsLeft) {
  LrPolicy p{LrSchedule::kPoly, 2.0f, 0.1f, 0, {}, 100, 0, 2.0f, 0.5f};
  // Computed in double and rounded once: within u |lr| of the exact value.
  auto bound = [](double lr) { return testing::kFloatRoundoff * std::abs(lr); };
  EXPECT_FLOAT_EQ(learningRate(p, 0), 2.0f);
  EXPECT_NEAR(learningRate(p, 50), 0.5 + 1.5 * 0.25, bound(0.875));
  EXPECT_NEAR(learningRate(p, 90), 0.5 + 1.5 * 0.01, bound(0.515));
  EXPECT_FLOAT_EQ(learningRate(p, 100), 0.5f);
  EXPECT_FLOAT_EQ(learningRate(p, 150), 0.5f);
  EXPECT_THROW(validate(LrPolicy{LrSchedule::kPoly, 0.1f, 0.1f, 0, {}, 0, 0, 2.0f, 0.0f}),
               InputError);
  EXPECT_THROW(validate(LrPolicy{LrSchedule::kPoly, 0.1f, 0.1f, 0, {}, 10, 0, 2.0f, 0.5f}),
               InputError);
}

TEST(LearningRate, WarmupRampsLinearlyToTheScheduledRate) {
  LrPolicy p{LrSchedule::kFixed, 0.4f, 0.1f, 0, {}, 0, 4};
  EXPECT_FLOAT_EQ(learningRate(p, 0), 0.1f);
  EXPECT_FLOAT_EQ(learningRate(p, 1), 0.2f);
  EXPECT_FLOAT_EQ(learningRate(p, 3), 0.4f);
  EXPECT_FLOAT_EQ(learningRate(p, 4), 0.4f);
}

TEST(LearningRate, ValidateRejectsAPolicyMissingItsParameters) {
  EXPECT_THROW(validate(LrPolicy{LrSchedule::kStep, 0.1f, 0.1f, 0, {}, 0, 0}), InputError);
  EXPECT_THROW(validate(LrPolicy{LrSchedule::kMultistep, 0.1f, 0.1f, 0, {}, 0, 0}), InputError);
  EXPECT_THROW(validate(LrPolicy{LrSchedule::kCosine, 0.1f, 0.1f, 0, {}, 0, 0}), InputError);
  EXPECT_NO_THROW(validate(LrPolicy{LrSchedule::kCosine, 0.1f, 0.1f, 0, {}, 10, 2}));
}

}  // namespace
}  // namespace troupe::kernels
