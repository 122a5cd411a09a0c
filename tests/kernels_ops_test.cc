// Every CPU op's backward against central finite differences of a random projection of its output:
// with L(x) = sum(r * op(x)) for a fixed random r, backward(dy = r) must give dL/dx, dL/dw, ...
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <vector>

#include "float_bounds.h"
#include "kernels/backend.h"
#include "kernels/random.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

using troupe::testing::gammaN;
using troupe::testing::kFloatRoundoff;
using troupe::testing::ReferenceSum;

Tensor randomHost(Shape shape, std::uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::host(std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = lo + (hi - lo) * uniform01(randomBits(42, stream, i));
  return t;
}

double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    s += double(a.f32()[i]) * b.f32()[i];
  return s;
}

// Compares analytic[i] with (L(v + eps e_i) - L(v - eps e_i)) / (2 eps) for every element of v,
// relative to the largest analytic gradient (at least 1e-3). The error bound: the central
// difference's truncation, eps^2 / 6 * max |d3L/dv3|, is zero for the piecewise-linear ops
// (convolution, inner product, ReLU, max pooling, on data with no kink within eps) and small for
// batch norm and softmax at the eps they use; and the rounding of L. The kernels are
// deterministic, so the outputs that v[i] does not reach round the same way in both evaluations
// and cancel exactly: only the m outputs that v[i] reaches count, each within gamma_n * sum
// |terms| (float_bounds.h). Here m <= 150 and n <= 150 with terms of order 1, so that rounding is
// at most 150 * gammaN(150) * 150 / (2 eps) ~ 1e-1 absolute in the worst case and
// 150 * probableGammaN(150) * 150 / (2 eps) ~ 6e-3 with errors of both signs, against gradients
// of scale ~1. tol = 2e-2 covers that and the truncation; a wrong gradient (a missing term, a
// transposed index) is off by O(1).
void expectGradient(const char* what, const Tensor& v, const Tensor& analytic,
                    const std::function<double()>& loss, float eps = 1e-2f, double tol = 2e-2) {
  ASSERT_EQ(v.numel(), analytic.numel());
  double worst = 0;
  std::int64_t worst_i = -1;
  double scale = 1e-3;
  for (std::int64_t i = 0; i < analytic.numel(); ++i)
    scale = std::max(scale, std::abs(double(analytic.f32()[i])));
  for (std::int64_t i = 0; i < v.numel(); ++i) {
    const float keep = v.f32()[i];
    v.f32()[i] = keep + eps;
    const double up = loss();
    v.f32()[i] = keep - eps;
    const double down = loss();
    v.f32()[i] = keep;
    const double numeric = (up - down) / (2.0 * eps);
    const double err = std::abs(numeric - analytic.f32()[i]) / scale;
    if (err > worst) worst = err, worst_i = i;
  }
  EXPECT_LT(worst, tol) << what << ": worst relative error at element " << worst_i << " of "
                        << v.numel();
}

class OpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = makeCpuBackend(2);
};

void checkConv(Backend& backend, ConvGeometry g) {
  auto op = backend.makeConv(g);
  Tensor x = randomHost({g.n, g.channels, g.height, g.width}, 1);
  Tensor w = randomHost({g.out_channels, g.channels, g.kernel, g.kernel}, 2);
  Tensor b = randomHost({g.out_channels}, 3);
  Tensor r = randomHost({g.n, g.out_channels, g.outHeight(), g.outWidth()}, 4);
  Tensor y = Tensor::host(r.shape());
  Tensor dx = Tensor::host(x.shape()), dw = Tensor::host(w.shape()), db = Tensor::host(b.shape());
  op->backward(x, w, r, dx, dw, db);
  auto loss = [&] {
    op->forward(x, w, b, y);
    return dot(r, y);
  };
  expectGradient("conv dx", x, dx, loss);
  expectGradient("conv dw", w, dw, loss);
  expectGradient("conv db", b, db, loss);
}

TEST_F(OpsTest, ConvolutionGradientsMatchFiniteDifferences) {
  checkConv(*backend_, {3, 2, 7, 6, 3, 3, 1, 0, true});
}

TEST_F(OpsTest, StridedPaddedConvolutionGradientsMatchFiniteDifferences) {
  checkConv(*backend_, {3, 3, 7, 8, 4, 3, 2, 1, true});
}

TEST_F(OpsTest, OneByOneStridedConvolutionGradientsMatchFiniteDifferences) {
  checkConv(*backend_, {2, 3, 6, 6, 5, 1, 2, 0, false});
}

// Four or more input channels run on oneDNN: NHWC when the channel counts are not multiples of 16,
// blocked layouts (nChw16c) when they are.
TEST_F(OpsTest, NhwcConvolutionGradientsMatchFiniteDifferences) {
  checkConv(*backend_, {2, 5, 7, 6, 6, 3, 1, 1, true});
}

TEST_F(OpsTest, StridedNhwcConvolutionGradientsMatchFiniteDifferences) {
  checkConv(*backend_, {3, 4, 8, 7, 3, 3, 2, 0, false});
}

TEST_F(OpsTest, BlockedLayoutConvolutionGradientsMatchFiniteDifferences) {
  checkConv(*backend_, {2, 16, 6, 5, 16, 3, 1, 1, true});
}

TEST_F(OpsTest, StridedBlockedLayoutConvolutionGradientsMatchFiniteDifferences) {
  checkConv(*backend_, {2, 16, 7, 7, 32, 1, 2, 0, false});
}

TEST_F(OpsTest, ConvolutionForwardMatchesADirectLoop) {
  ConvGeometry g{2, 3, 6, 5, 4, 3, 2, 1, true};
  auto op = backend_->makeConv(g);
  Tensor x = randomHost({2, 3, 6, 5}, 1), w = randomHost({4, 3, 3, 3}, 2), b = randomHost({4}, 3);
  Tensor y = Tensor::host({2, 4, g.outHeight(), g.outWidth()});
  op->forward(x, w, b, y);
  for (int n = 0; n < 2; ++n)
    for (int o = 0; o < 4; ++o)
      for (int oy = 0; oy < g.outHeight(); ++oy)
        for (int ox = 0; ox < g.outWidth(); ++ox) {
          ReferenceSum s;
          s.add(b.f32()[o]);
          for (int c = 0; c < 3; ++c)
            for (int ki = 0; ki < 3; ++ki)
              for (int kj = 0; kj < 3; ++kj) {
                const int iy = oy * 2 - 1 + ki, ix = ox * 2 - 1 + kj;
                if (iy < 0 || iy >= 6 || ix < 0 || ix >= 5) continue;
                s.add(double(x.f32()[((n * 3 + c) * 6 + iy) * 5 + ix]) *
                      w.f32()[((o * 3 + c) * 3 + ki) * 3 + kj]);
              }
          // A dot product of at most 28 terms in any order: gamma_28 * sum |terms|.
          EXPECT_NEAR(y.f32()[((n * 4 + o) * g.outHeight() + oy) * g.outWidth() + ox], s.value,
                      s.floatBound());
        }
}

// First layers (few input channels, stride 1, no padding, outputs up to 32 wide) run direct
// AVX-512 kernels where the CPU has them, and need no input gradient: forward, weight and bias
// gradients against loops in double, for blocks of 8 output channels and a remainder, and rows
// of one register, exactly 16, and two.
TEST_F(OpsTest, FirstLayerConvolutionMatchesDirectLoops) {
  for (const ConvGeometry& g :
       {ConvGeometry{3, 1, 9, 22, 11, 3, 1, 0, true}, ConvGeometry{2, 3, 8, 20, 9, 5, 1, 0, true},
        ConvGeometry{2, 2, 5, 6, 3, 2, 1, 0, false}}) {
    const std::int64_t oh = g.outHeight(), ow = g.outWidth(), k = g.kernel;
    auto op = backend_->makeConv(g);
    Tensor x = randomHost({g.n, g.channels, g.height, g.width}, 1);
    Tensor w = randomHost({g.out_channels, g.channels, k, k}, 2);
    Tensor b = g.bias ? randomHost({g.out_channels}, 3) : Tensor();
    Tensor dy = randomHost({g.n, g.out_channels, oh, ow}, 4), y = Tensor::host(dy.shape());
    Tensor dw = Tensor::host(w.shape()), db = g.bias ? Tensor::host({g.out_channels}) : Tensor();
    op->forward(x, w, b, y);
    op->backward(x, w, dy, Tensor(), dw, db);
    auto xat = [&](std::int64_t n, std::int64_t c, std::int64_t iy, std::int64_t ix) {
      return double(x.f32()[((n * g.channels + c) * g.height + iy) * g.width + ix]);
    };
    auto dyat = [&](std::int64_t n, std::int64_t o, std::int64_t oy, std::int64_t ox) {
      return double(dy.f32()[((n * g.out_channels + o) * oh + oy) * ow + ox]);
    };
    for (std::int64_t o = 0; o < g.out_channels; ++o) {
      // Each output is a dot product of channels * k * k terms (plus the bias), each gradient a
      // sum over images and pixels: within gamma_n * sum |terms| in any order (float_bounds.h).
      ReferenceSum bias_grad;
      for (std::int64_t n = 0; n < g.n; ++n)
        for (std::int64_t oy = 0; oy < oh; ++oy)
          for (std::int64_t ox = 0; ox < ow; ++ox) {
            ReferenceSum s;
            if (g.bias) s.add(b.f32()[o]);
            for (std::int64_t c = 0; c < g.channels; ++c)
              for (std::int64_t ki = 0; ki < k; ++ki)
                for (std::int64_t kj = 0; kj < k; ++kj)
                  s.add(xat(n, c, oy + ki, ox + kj) *
                        w.f32()[((o * g.channels + c) * k + ki) * k + kj]);
            ASSERT_NEAR(y.f32()[((n * g.out_channels + o) * oh + oy) * ow + ox], s.value,
                        s.floatBound())
                << "width " << g.width << " output channel " << o;
            bias_grad.add(dyat(n, o, oy, ox));
          }
      if (g.bias) {
        ASSERT_NEAR(db.f32()[o], bias_grad.value, bias_grad.floatBound()) << "width " << g.width;
      }
      for (std::int64_t c = 0; c < g.channels; ++c)
        for (std::int64_t ki = 0; ki < k; ++ki)
          for (std::int64_t kj = 0; kj < k; ++kj) {
            ReferenceSum s;
            for (std::int64_t n = 0; n < g.n; ++n)
              for (std::int64_t oy = 0; oy < oh; ++oy)
                for (std::int64_t ox = 0; ox < ow; ++ox)
                  s.add(dyat(n, o, oy, ox) * xat(n, c, oy + ki, ox + kj));
            ASSERT_NEAR(dw.f32()[((o * g.channels + c) * k + ki) * k + kj], s.value, s.floatBound())
                << "width " << g.width << " output channel " << o;
          }
    }
  }
}

void checkPool(Backend& backend, PoolGeometry g) {
  auto op = backend.makePool(g);
  // Distinct values far apart, so that no finite-difference step changes a window's arg max.
  Tensor x = Tensor::host({g.n, g.channels, g.height, g.width});
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.f32()[i] = 0.1f * static_cast<float>((i * 7919) % x.numel()) - 1.0f;
  Tensor r = randomHost({g.n, g.channels, g.outHeight(), g.outWidth()}, 4);
  Tensor y = Tensor::host(r.shape()), dx = Tensor::host(x.shape());
  op->forward(x, y);
  op->backward(r, dx);
  expectGradient("pool dx", x, dx, [&] {
    op->forward(x, y);
    return dot(r, y);
  });
}

TEST_F(OpsTest, MaxPoolingGradientMatchesFiniteDifferences) {
  checkPool(*backend_, {2, 3, 6, 8, 2, 2, 0, PoolMethod::kMax});
}

TEST_F(OpsTest, OverlappingPaddedMaxPoolingGradientMatchesFiniteDifferences) {
  checkPool(*backend_, {2, 2, 7, 7, 3, 2, 1, PoolMethod::kMax});
}

TEST_F(OpsTest, AveragePoolingGradientMatchesFiniteDifferences) {
  checkPool(*backend_, {2, 2, 7, 6, 3, 2, 1, PoolMethod::kAverage});
}

TEST_F(OpsTest, PoolingRoundsTheOutputSizeUpLikeCaffe) {
  PoolGeometry g{1, 1, 7, 7, 2, 2, 0, PoolMethod::kMax};
  EXPECT_EQ(g.outHeight(), 4);
  g.kernel = 3, g.pad = 1;
  EXPECT_EQ(g.outHeight(), 4);
}

// LeNet's planes (24 and 8 wide) and others below 16 outputs a row take a masked AVX-512 path
// where the CPU has it: each output is its window's maximum, and backward hands each gradient to
// a position of the window that holds that maximum.
TEST_F(OpsTest, TwoByTwoMaxPoolingOfNarrowPlanesRoutesGradientsToTheMaxima) {
  for (const std::int64_t w : {2, 8, 18, 24, 30}) {
    const std::int64_t n = 3, c = 2, h = 6, oh = h / 2, ow = w / 2;
    PoolGeometry g{n, c, h, w, 2, 2, 0, PoolMethod::kMax};
    auto op = backend_->makePool(g);
    Tensor x = randomHost({n, c, h, w}, 7), y = Tensor::host({n, c, oh, ow});
    for (std::int64_t i = 0; i < x.numel(); i += 5)
      x.f32()[i] = 0.5f;  // ties
    Tensor dy = Tensor::host(y.shape()), dx = Tensor::host(x.shape());
    for (std::int64_t i = 0; i < dy.numel(); ++i)
      dy.f32()[i] = static_cast<float>(i + 1);
    op->forward(x, y);
    op->backward(dy, dx);
    for (std::int64_t plane = 0; plane < n * c; ++plane) {
      const float* xp = x.f32() + plane * h * w;
      const float* dxp = dx.f32() + plane * h * w;
      for (std::int64_t oy = 0; oy < oh; ++oy) {
        for (std::int64_t ox = 0; ox < ow; ++ox) {
          const std::int64_t o = plane * oh * ow + oy * ow + ox;
          float best = xp[2 * oy * w + 2 * ox];
          int routed = 0;
          for (std::int64_t dy_ = 0; dy_ < 2; ++dy_)
            for (std::int64_t dx_ = 0; dx_ < 2; ++dx_)
              best = std::max(best, xp[(2 * oy + dy_) * w + 2 * ox + dx_]);
          ASSERT_EQ(y.f32()[o], best) << "w " << w << " output " << o;
          for (std::int64_t dy_ = 0; dy_ < 2; ++dy_) {
            for (std::int64_t dx_ = 0; dx_ < 2; ++dx_) {
              const std::int64_t at = (2 * oy + dy_) * w + 2 * ox + dx_;
              if (dxp[at] == 0.0f) continue;
              ASSERT_EQ(dxp[at], dy.f32()[o]) << "w " << w << " output " << o;
              ASSERT_EQ(xp[at], best) << "w " << w << " output " << o;
              ++routed;
            }
          }
          ASSERT_EQ(routed, 1) << "w " << w << " output " << o;
        }
      }
    }
  }
}

TEST_F(OpsTest, MaxPoolingPicksTheWindowMaximum) {
  PoolGeometry g{1, 1, 2, 4, 2, 2, 0, PoolMethod::kMax};
  auto op = backend_->makePool(g);
  Tensor x = Tensor::host({1, 1, 2, 4}), y = Tensor::host({1, 1, 1, 2});
  const float v[] = {1, 5, -1, -2, 3, 2, -3, -4};
  std::copy(v, v + 8, x.f32());
  op->forward(x, y);
  EXPECT_EQ(y.f32()[0], 5.0f);
  EXPECT_EQ(y.f32()[1], -1.0f);
}

TEST_F(OpsTest, InnerProductGradientsMatchFiniteDifferences) {
  InnerProductGeometry g{3, 7, 5};
  auto op = backend_->makeInnerProduct(g);
  Tensor x = randomHost({3, 7}, 1), w = randomHost({5, 7}, 2), b = randomHost({5}, 3);
  Tensor r = randomHost({3, 5}, 4), y = Tensor::host({3, 5});
  Tensor dx = Tensor::host(x.shape()), dw = Tensor::host(w.shape()), db = Tensor::host(b.shape());
  op->backward(x, w, r, dx, dw, db);
  auto loss = [&] {
    op->forward(x, w, b, y);
    return dot(r, y);
  };
  expectGradient("fc dx", x, dx, loss);
  expectGradient("fc dw", w, dw, loss);
  expectGradient("fc db", b, db, loss);
}

// Large enough that each of two threads computes its own share of the outputs (uneven shares:
// 100 outputs split at a cache line are 64 and 36), checked against direct loops in double.
TEST_F(OpsTest, InnerProductSplitAmongThreadsMatchesDirectLoops) {
  const std::int64_t n = 48, in = 300, out = 100;
  auto op = backend_->makeInnerProduct(InnerProductGeometry{n, in, out});
  Tensor x = randomHost({n, in}, 1), w = randomHost({out, in}, 2), b = randomHost({out}, 3);
  Tensor dy = randomHost({n, out}, 4), y = Tensor::host({n, out});
  Tensor dx = Tensor::host(x.shape()), dw = Tensor::host(w.shape()), db = Tensor::host(b.shape());
  op->forward(x, w, b, y);
  op->backward(x, w, dy, dx, dw, db);
  auto at = [](const Tensor& t, std::int64_t cols, std::int64_t r, std::int64_t c) {
    return double(t.f32()[r * cols + c]);
  };
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t o = 0; o < out; ++o) {
      ReferenceSum v;
      v.add(at(b, out, 0, o));
      for (std::int64_t k = 0; k < in; ++k)
        v.add(at(x, in, i, k) * at(w, in, o, k));
      ASSERT_NEAR(at(y, out, i, o), v.value, v.floatBound()) << "y " << i << "," << o;
    }
  }
  for (std::int64_t o = 0; o < out; ++o) {
    ReferenceSum sum;
    for (std::int64_t i = 0; i < n; ++i)
      sum.add(at(dy, out, i, o));
    ASSERT_NEAR(at(db, out, 0, o), sum.value, sum.floatBound()) << "db " << o;
    for (std::int64_t k = 0; k < in; ++k) {
      ReferenceSum v;
      for (std::int64_t i = 0; i < n; ++i)
        v.add(at(dy, out, i, o) * at(x, in, i, k));
      ASSERT_NEAR(at(dw, in, o, k), v.value, v.floatBound()) << "dw " << o << "," << k;
    }
  }
  for (std::int64_t i = 0; i < n; ++i) {
    for (std::int64_t k = 0; k < in; ++k) {
      ReferenceSum v;
      for (std::int64_t o = 0; o < out; ++o)
        v.add(at(dy, out, i, o) * at(w, in, o, k));
      ASSERT_NEAR(at(dx, in, i, k), v.value, v.floatBound()) << "dx " << i << "," << k;
    }
  }
}

TEST_F(OpsTest, ReluGradientMatchesFiniteDifferences) {
  auto op = backend_->makeRelu(40);
  Tensor x = randomHost({40}, 1);
  for (std::int64_t i = 0; i < 40; ++i)  // keep away from the kink
    if (std::abs(x.f32()[i]) < 0.05f) x.f32()[i] = 0.5f;
  Tensor r = randomHost({40}, 2), y = Tensor::host({40}), dx = Tensor::host({40});
  op->forward(x, y);
  op->backward(y, r, dx);
  expectGradient("relu dx", x, dx, [&] {
    op->forward(x, y);
    return dot(r, y);
  });
}

TEST_F(OpsTest, BatchNormTrainingGradientsMatchFiniteDifferences) {
  BatchNormGeometry g;
  g.n = 4, g.channels = 3, g.spatial = 5;
  auto op = backend_->makeBatchNorm(g);
  Tensor x = randomHost({4, 3, 5}, 1), gamma = randomHost({3}, 2, 0.5f, 1.5f);
  Tensor beta = randomHost({3}, 3), r = randomHost({4, 3, 5}, 4), y = Tensor::host({4, 3, 5});
  Tensor mean = Tensor::host({3}), var = Tensor::host({3});
  Tensor dx = Tensor::host(x.shape()), dg = Tensor::host({3}), db = Tensor::host({3});
  op->forward(x, Tensor(), gamma, beta, mean, var, y, true);
  op->backward(x, y, gamma, r, dx, Tensor(), dg, db);
  auto loss = [&] {
    op->forward(x, Tensor(), gamma, beta, mean, var, y, true);
    return dot(r, y);
  };
  expectGradient("bn dx", x, dx, loss, 1e-3f);
  expectGradient("bn dgamma", gamma, dg, loss, 1e-3f);
  expectGradient("bn dbeta", beta, db, loss, 1e-3f);
}

TEST_F(OpsTest, BatchNormUpdatesRunningStatisticsWithMomentum) {
  BatchNormGeometry g;
  g.n = 2, g.channels = 1, g.spatial = 2;
  auto op = backend_->makeBatchNorm(g);
  Tensor x = Tensor::host({2, 1, 2}), y = Tensor::host({2, 1, 2});
  const float v[] = {1, 2, 3, 6};  // mean 3, biased var 3.5, unbiased var 14/3
  std::copy(v, v + 4, x.f32());
  Tensor gamma = Tensor::host({1}), beta = Tensor::host({1});
  gamma.f32()[0] = 1;
  Tensor mean = Tensor::host({1}), var = Tensor::host({1});
  var.f32()[0] = 1;
  op->forward(x, Tensor(), gamma, beta, mean, var, y, true);
  // The statistics are sums of 4 terms (squares of at most 9: sum |terms| <= 14 for the
  // variance), within gamma_4 * sum |terms|, then a few (< 8) rounded scalings and adds; y adds a
  // square root, a division and a multiply: its relative error is at most half the variance's
  // plus 8 u.
  const double u = kFloatRoundoff;
  EXPECT_NEAR(mean.f32()[0], 0.1 * 3, 0.1 * gammaN(4) * 12 + 8 * u * 0.3);
  const double var_error = gammaN(4) * 14 + 8 * u * 14.0 / 3.0;
  EXPECT_NEAR(var.f32()[0], 0.9 + 0.1 * 14.0 / 3.0, 0.1 * var_error + 8 * u);
  const double y0 = (1 - 3) / std::sqrt(3.5 + 1e-5);
  EXPECT_NEAR(y.f32()[0], y0, std::abs(y0) * (var_error / 3.5 / 2 + 8 * u));
  op->forward(x, Tensor(), gamma, beta, mean, var, y, false);  // inference: running statistics
  const double running_var = 0.9 + 1.4 / 3.0 * 1.0;
  const double y1 = (1 - 0.3) / std::sqrt(running_var + 1e-5);
  EXPECT_NEAR(y.f32()[0], y1, std::abs(y1) * ((0.1 * var_error + 8 * u) / running_var / 2 + 8 * u));
}

TEST_F(OpsTest, DropoutIsDeterministicGivenTheSeedAndScalesKeptElements) {
  auto op = backend_->makeDropout(1000, 0.25f);
  Tensor x = randomHost({1000}, 1), y1 = Tensor::host({1000}), y2 = Tensor::host({1000});
  op->forward(x, y1, 7);
  op->forward(x, y2, 7);
  int kept = 0;
  for (int i = 0; i < 1000; ++i) {
    EXPECT_EQ(y1.f32()[i], y2.f32()[i]);
    if (y1.f32()[i] != 0) {
      ++kept;
      EXPECT_FLOAT_EQ(y1.f32()[i], x.f32()[i] / 0.75f);
    }
  }
  // The seed fixes the draw; any seed keeps Binomial(1000, 0.75) elements: sd 13.7, 60 = 4.4 sd.
  EXPECT_NEAR(kept, 750, 60);
  op->forward(x, y2, 8);
  EXPECT_NE(std::vector<float>(y1.f32(), y1.f32() + 1000),
            std::vector<float>(y2.f32(), y2.f32() + 1000));
}

TEST_F(OpsTest, DropoutGradientMatchesFiniteDifferences) {
  auto op = backend_->makeDropout(50, 0.5f);
  Tensor x = randomHost({50}, 1), r = randomHost({50}, 2);
  Tensor y = Tensor::host({50}), dx = Tensor::host({50});
  op->forward(x, y, 3);
  op->backward(r, dx);
  expectGradient("dropout dx", x, dx, [&] {
    op->forward(x, y, 3);
    return dot(r, y);
  });
}

TEST_F(OpsTest, GlobalAveragePoolingGradientMatchesFiniteDifferences) {
  auto op = backend_->makeGlobalAvgPool(2, 3, 4);
  Tensor x = randomHost({2, 3, 4}, 1), r = randomHost({2, 3}, 2);
  Tensor y = Tensor::host({2, 3}), dx = Tensor::host(x.shape());
  op->backward(r, dx);
  expectGradient("gap dx", x, dx, [&] {
    op->forward(x, y);
    return dot(r, y);
  });
}

TEST_F(OpsTest, AddSumsItsInputs) {
  auto op = backend_->makeAdd(3);
  Tensor a = randomHost({3}, 1), b = randomHost({3}, 2), y = Tensor::host({3});
  op->forward(a, b, y);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(y.f32()[i], a.f32()[i] + b.f32()[i]);
}

TEST_F(OpsTest, SoftmaxLossGradientMatchesFiniteDifferences) {
  auto op = backend_->makeSoftmaxLoss(4, 5, 0.0f);
  Tensor z = randomHost({4, 5}, 1, -2, 2), labels = Tensor::host({4}, DType::kInt32);
  const int lab[] = {0, 3, 4, 1};
  std::copy(lab, lab + 4, labels.i32());
  Tensor metrics = Tensor::host({2}), dz = Tensor::host({4, 5});
  op->forward(z, labels, metrics);
  op->backward(2.0f, dz);
  expectGradient("softmax dlogits", z, dz, [&] {
    op->forward(z, labels, metrics);
    return 2.0 * metrics.f32()[0];
  });
}

// With label smoothing s the gradient is still the derivative of the (smoothed) loss, and the loss
// is PyTorch's: (1 - s) (-log p(label)) + s / classes * sum over k of -log p(k).
TEST_F(OpsTest, SoftmaxLossWithLabelSmoothingIsTheSmoothedCrossEntropy) {
  constexpr float kSmoothing = 0.1f;
  auto op = backend_->makeSoftmaxLoss(4, 5, kSmoothing);
  Tensor z = randomHost({4, 5}, 1, -2, 2), labels = Tensor::host({4}, DType::kInt32);
  const int lab[] = {0, 3, 4, 1};
  std::copy(lab, lab + 4, labels.i32());
  Tensor metrics = Tensor::host({2}), dz = Tensor::host({4, 5});
  op->forward(z, labels, metrics);
  double expected = 0, scale = 0;
  for (int i = 0; i < 4; ++i) {
    const float* row = z.f32() + i * 5;
    double sum = 0;
    for (int k = 0; k < 5; ++k)
      sum += std::exp(static_cast<double>(row[k]));
    for (int k = 0; k < 5; ++k) {
      const double nll = std::log(sum) - row[k];
      const double target = (k == lab[i] ? 1 - kSmoothing : 0.0) + kSmoothing / 5;
      expected += target * nll;
      scale += std::abs(nll) + std::abs(row[k]);
    }
  }
  // Per row: under 30 rounded operations (exp, log within 4 ulp each) on values of at most
  // |z| + log 5; then 4 rows summed.
  EXPECT_NEAR(metrics.f32()[0], expected, 30 * 4 * kFloatRoundoff * scale + gammaN(4) * expected);
  op->backward(2.0f, dz);
  expectGradient("smoothed softmax dlogits", z, dz, [&] {
    op->forward(z, labels, metrics);
    return 2.0 * metrics.f32()[0];
  });
}

TEST_F(OpsTest, SoftmaxLossCountsCorrectTopOnePredictions) {
  auto op = backend_->makeSoftmaxLoss(3, 3, 0.0f);
  Tensor z = Tensor::host({3, 3}), labels = Tensor::host({3}, DType::kInt32);
  const float v[] = {5, 0, 0, 0, 5, 0, 0, 5, 0};
  std::copy(v, v + 9, z.f32());
  const int lab[] = {0, 1, 2};
  std::copy(lab, lab + 3, labels.i32());
  Tensor metrics = Tensor::host({2});
  op->forward(z, labels, metrics);
  EXPECT_EQ(metrics.f32()[1], 2.0f);
  const double small = std::log(1 + 2 * std::exp(-5.0)), big = 5 + small;
  // Each sample's loss, log(sum exp(z - max)) - (z_label - max), takes under 10 rounded
  // operations of at most 4 ulp each (troupe's expf, kernels/cpu/vec.h, is within 2 ulp, glibc's
  // logf within 4) on values of at most |z| + log 3; the three losses are then summed.
  const double bound =
      3 * 10 * 4 * kFloatRoundoff * (5 + std::log(3.0)) + gammaN(3) * (2 * small + big);
  EXPECT_NEAR(metrics.f32()[0], 2 * small + big, bound);
}

TEST_F(OpsTest, SoftmaxLossRejectsALabelOutsideTheClasses) {
  auto op = backend_->makeSoftmaxLoss(1, 3, 0.0f);
  Tensor z = Tensor::host({1, 3}), labels = Tensor::host({1}, DType::kInt32);
  labels.i32()[0] = 3;
  Tensor metrics = Tensor::host({2});
  EXPECT_THROW(op->forward(z, labels, metrics), InputError);
}

TEST_F(OpsTest, SgdUpdateFollowsPyTorchsFormula) {
  Tensor w = Tensor::host({1}), g = Tensor::host({1}), v = Tensor::host({1});
  w.f32()[0] = 1.0f, g.f32()[0] = 0.5f, v.f32()[0] = 0.2f;
  backend_->sgdUpdate(w, g, v, 0.1f, 0.9f, 0.01f, false);
  // g' = 0.5 + 0.01 * 1 = 0.51; v = 0.9 * 0.2 + 0.51 = 0.69; w = 1 - 0.1 * 0.69
  EXPECT_FLOAT_EQ(v.f32()[0], 0.69f);
  EXPECT_FLOAT_EQ(w.f32()[0], 0.931f);
}

}  // namespace
}  // namespace troupe::kernels

namespace troupe::kernels {
namespace {

// Large enough that each thread runs several column chunks.
TEST_F(OpsTest, ChunkedConvolutionMatchesOneImageAtATime) {
  ConvGeometry g{9, 20, 12, 12, 50, 5, 1, 0, true};
  auto op = backend_->makeConv(g);
  ConvGeometry one = g;
  one.n = 1;
  auto backend1 = makeCpuBackend(1);
  auto single = backend1->makeConv(one);
  Tensor x = randomHost({9, 20, 12, 12}, 1), w = randomHost({50, 20, 5, 5}, 2);
  Tensor b = randomHost({50}, 3), dy = randomHost({9, 50, 8, 8}, 4);
  Tensor y = Tensor::host(dy.shape()), dx = Tensor::host(x.shape());
  Tensor dw = Tensor::host(w.shape()), db = Tensor::host(b.shape());
  op->forward(x, w, b, y);
  op->backward(x, w, dy, dx, dw, db);
  // Both sides are float sums of the same terms in other orders, each within gamma_n * sum |terms|
  // of the exact value (float_bounds.h), so they differ by at most twice that. The longest sum is
  // a dx element's, over 50 output channels * 5 * 5 = 1250 terms; sum |terms| comes from the same
  // op run on |x|, |w|, |b|, |dy| (a float sum of non-negative terms, within (1 + gamma_n) of it).
  const double gamma = gammaN(1250), slack = 2 * gamma * (1 + gamma);
  auto magnitude = [](const Tensor& t) {
    Tensor a = Tensor::host(t.shape());
    for (std::int64_t i = 0; i < t.numel(); ++i)
      a.f32()[i] = std::abs(t.f32()[i]);
    return a;
  };
  Tensor xa = magnitude(x), wa = magnitude(w), ba = magnitude(b), dya = magnitude(dy);
  Tensor ya = Tensor::host(dy.shape()), dxa = Tensor::host(x.shape());
  Tensor dwa = Tensor::host(w.shape()), dba = Tensor::host(b.shape());
  op->forward(xa, wa, ba, ya);
  op->backward(xa, wa, dya, dxa, dwa, dba);
  std::vector<double> sum_dw(w.numel()), sum_db(50);
  for (int i = 0; i < 9; ++i) {
    Tensor xi = x.slice(i * 2880, (i + 1) * 2880), dyi = dy.slice(i * 3200, (i + 1) * 3200);
    Tensor yi = Tensor::host({3200}), dxi = Tensor::host({2880});
    Tensor dwi = Tensor::host(w.shape()), dbi = Tensor::host({50});
    single->forward(xi, w, b, yi);
    single->backward(xi, w, dyi, dxi, dwi, dbi);
    for (int k = 0; k < 3200; ++k)
      ASSERT_NEAR(y.f32()[i * 3200 + k], yi.f32()[k], slack * ya.f32()[i * 3200 + k]);
    for (int k = 0; k < 2880; ++k)
      ASSERT_NEAR(dx.f32()[i * 2880 + k], dxi.f32()[k], slack * dxa.f32()[i * 2880 + k]);
    for (int k = 0; k < w.numel(); ++k)
      sum_dw[k] += dwi.f32()[k];
    for (int k = 0; k < 50; ++k)
      sum_db[k] += dbi.f32()[k];
  }
  for (int k = 0; k < w.numel(); ++k)
    ASSERT_NEAR(dw.f32()[k], sum_dw[k], slack * dwa.f32()[k]);
  for (int k = 0; k < 50; ++k)
    ASSERT_NEAR(db.f32()[k], sum_db[k], slack * dba.f32()[k]);
}

}  // namespace
}  // namespace troupe::kernels

// ---- the sequence models' ops ----
namespace troupe::kernels {
namespace {

Tensor tokensHost(std::initializer_list<int> values) {
  Tensor t = Tensor::host({static_cast<std::int64_t>(values.size())}, DType::kInt32);
  std::copy(values.begin(), values.end(), t.i32());
  return t;
}

// wte's gradient sums the rows of dy of each token (token 1 appears twice), wpe's the rows of
// each position over the sequences; tied, wte's adds to what an output layer wrote.
TEST_F(OpsTest, EmbeddingGradientsMatchFiniteDifferencesAndAddWhenTied) {
  const EmbeddingGeometry g{2, 3, 5, 4};
  auto op = backend_->makeEmbedding(g);
  Tensor tokens = tokensHost({1, 4, 1, 0, 2, 1});
  Tensor wte = randomHost({5, 4}, 1), wpe = randomHost({3, 4}, 2), r = randomHost({2, 3, 4}, 3);
  Tensor y = Tensor::host({2, 3, 4}), dwte = Tensor::host({5, 4}), dwpe = Tensor::host({3, 4});
  op->forward(tokens, wte, wpe, y);
  EXPECT_EQ(y.f32()[4 + 2], wte.f32()[4 * 4 + 2] + wpe.f32()[1 * 4 + 2]);  // token 4, position 1
  op->backward(tokens, r, dwte, dwpe, false);
  auto loss = [&] {
    op->forward(tokens, wte, wpe, y);
    return dot(r, y);
  };
  expectGradient("embedding dwte", wte, dwte, loss);
  expectGradient("embedding dwpe", wpe, dwpe, loss);
  Tensor tied = randomHost({5, 4}, 4), written = Tensor::host({5, 4});
  std::copy(tied.f32(), tied.f32() + 20, written.f32());
  op->backward(tokens, r, written, dwpe, true);
  for (int i = 0; i < 20; ++i)  // the same sums of at most three terms, then one add
    EXPECT_NEAR(written.f32()[i], tied.f32()[i] + dwte.f32()[i],
                gammaN(4) * (std::abs(tied.f32()[i]) + 3.0));
}

TEST_F(OpsTest, EmbeddingRefusesATokenOutsideTheVocabularyNamingWhereItIs) {
  auto op = backend_->makeEmbedding(EmbeddingGeometry{2, 3, 5, 4});
  Tensor tokens = tokensHost({1, 4, 1, 0, 5, 1});
  Tensor wte = randomHost({5, 4}, 1), wpe = randomHost({3, 4}, 2), y = Tensor::host({2, 3, 4});
  try {
    op->forward(tokens, wte, wpe, y);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "token 5 at position 1 of sequence 1 is outside the vocabulary [0, 5)");
  }
}

TEST_F(OpsTest, LayerNormGradientsMatchFiniteDifferences) {
  auto op = backend_->makeLayerNorm(LayerNormGeometry{6, 5});
  Tensor x = randomHost({6, 5}, 1, -2, 2), gamma = randomHost({5}, 2, 0.5f, 1.5f);
  Tensor beta = randomHost({5}, 3), r = randomHost({6, 5}, 4), y = Tensor::host({6, 5});
  Tensor dx = Tensor::host({6, 5}), dg = Tensor::host({5}), db = Tensor::host({5});
  op->forward(x, gamma, beta, y);
  op->backward(x, gamma, r, dx, dg, db);
  auto loss = [&] {
    op->forward(x, gamma, beta, y);
    return dot(r, y);
  };
  expectGradient("layer norm dx", x, dx, loss, 1e-3f);
  expectGradient("layer norm dgamma", gamma, dg, loss, 1e-3f);
  expectGradient("layer norm dbeta", beta, db, loss, 1e-3f);
}

// Each output against the formula in double: a mean and a variance of 5 terms (gammaN(5) of
// their magnitudes each), then under 6 rounded operations (sqrt exact to half an ulp).
TEST_F(OpsTest, LayerNormNormalisesEachRowAsPyTorch) {
  auto op = backend_->makeLayerNorm(LayerNormGeometry{3, 5, 1e-5f});
  Tensor x = randomHost({3, 5}, 1, -2, 2), gamma = randomHost({5}, 2, 0.5f, 1.5f);
  Tensor beta = randomHost({5}, 3), y = Tensor::host({3, 5});
  op->forward(x, gamma, beta, y);
  for (int r = 0; r < 3; ++r) {
    const float* xr = x.f32() + r * 5;
    double mean = 0, var = 0;
    for (int k = 0; k < 5; ++k)
      mean += xr[k] / 5.0;
    for (int k = 0; k < 5; ++k)
      var += (xr[k] - mean) * (xr[k] - mean) / 5.0;
    const double rstd = 1 / std::sqrt(var + 1e-5);
    for (int k = 0; k < 5; ++k) {
      const double xhat = (xr[k] - mean) * rstd, want = xhat * gamma.f32()[k] + beta.f32()[k];
      // The centred value's error (the mean's, 2 gammaN(5) of |x| at most 2) and rstd's
      // relative error (the variance's gammaN(5) halved, plus 3 roundings) scale xhat.
      const double bound =
          (2 * gammaN(5) * 2 * rstd + (gammaN(5) + 6 * kFloatRoundoff) * std::abs(xhat)) * 1.5 +
          3 * kFloatRoundoff * std::abs(want);
      EXPECT_NEAR(y.f32()[r * 5 + k], want, bound) << "row " << r << ", channel " << k;
    }
  }
}

// The tanh form against the formula in double, x in [-4, 4]. tanh(v) is 1 - 2 / (1 + e^(2v))
// (kernels/cpu/vec.h): v = sqrt(2/pi) (x + 0.044715 x^3) takes 4 roundings of values up to 5.5,
// so e^(2v) is within 2 x 5.5 x 4 + 2 (the exponential) + 1 = 47 u relative; tanh moves by at
// most half that (its slope in e^(2v), relative, is 2e/(1 + e)^2 <= 1/2), and 2 more roundings:
// 26 u. y = x/2 (1 + tanh) is then within 13 u |x| + 3 u |y| <= 16 u |x|; 48 u |x| is asserted.
TEST_F(OpsTest, GeluIsTheTanhFormAndItsGradientMatchesFiniteDifferences) {
  auto op = backend_->makeGelu(40);
  Tensor x = randomHost({40}, 1, -4, 4), r = randomHost({40}, 2), y = Tensor::host({40});
  Tensor dx = Tensor::host({40});
  op->forward(x, y);
  for (int i = 0; i < 40; ++i) {
    const double v = x.f32()[i];
    const double want = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y.f32()[i], want, 12 * kFloatRoundoff * 4 * std::abs(v) + 1e-30) << "x = " << v;
  }
  op->backward(x, r, dx);
  expectGradient("gelu dx", x, dx, [&] {
    op->forward(x, y);
    return dot(r, y);
  });
}

TEST_F(OpsTest, CausalAttentionGradientMatchesFiniteDifferences) {
  const AttentionGeometry g{2, 4, 6, 2};
  auto op = backend_->makeAttention(g);
  Tensor qkv = randomHost({2, 4, 18}, 1), r = randomHost({2, 4, 6}, 2), y = Tensor::host({2, 4, 6});
  Tensor dqkv = Tensor::host({2, 4, 18});
  op->forward(qkv, y);
  op->backward(qkv, r, dqkv);
  expectGradient(
      "attention dqkv", qkv, dqkv,
      [&] {
        op->forward(qkv, y);
        return dot(r, y);
      },
      1e-3f);
}

// Against softmax(q k^T / sqrt(3)) v over the keys up to each query's position, in double; and a
// later token's q, k and v change no earlier output, to the bit.
TEST_F(OpsTest, CausalAttentionAttendsToEarlierTokensOnly) {
  const AttentionGeometry g{1, 5, 6, 2};
  auto op = backend_->makeAttention(g);
  Tensor qkv = randomHost({1, 5, 18}, 1, -2, 2), y = Tensor::host({1, 5, 6});
  op->forward(qkv, y);
  const float* a = qkv.f32();
  for (int h = 0; h < 2; ++h) {
    for (int s = 0; s < 5; ++s) {
      std::vector<double> p(5, 0.0);
      double sum = 0, mx = -1e30;
      for (int j = 0; j <= s; ++j) {
        for (int d = 0; d < 3; ++d)
          p[j] += double(a[s * 18 + h * 3 + d]) * a[j * 18 + 6 + h * 3 + d] / std::sqrt(3.0);
        mx = std::max(mx, p[j]);
      }
      for (int j = 0; j <= s; ++j)
        sum += (p[j] = std::exp(p[j] - mx));
      for (int d = 0; d < 3; ++d) {
        double want = 0, magnitude = 0;
        for (int j = 0; j <= s; ++j) {
          want += p[j] / sum * a[j * 18 + 12 + h * 3 + d];
          magnitude += std::abs(a[j * 18 + 12 + h * 3 + d]);
        }
        // Scores: dot products of 3 terms of at most 4 (|q|, |k| <= 2), within gammaN(4) * 12
        // each, and the softmax's weights are within about 2 (score errors) + 8 ulp relative of
        // theirs (exp within 4 ulp, a sum of 5, a division); the output sums 5 weighted values.
        const double weights = 2 * gammaN(4) * 12 + 8 * kFloatRoundoff + gammaN(5);
        EXPECT_NEAR(y.f32()[s * 6 + h * 3 + d], want, (weights + gammaN(5)) * magnitude)
            << "head " << h << ", position " << s << ", channel " << d;
      }
    }
  }
  Tensor before = Tensor::host({1, 5, 6});
  std::copy(y.f32(), y.f32() + 30, before.f32());
  for (int k = 3 * 18; k < 5 * 18; ++k)
    qkv.f32()[k] += 1.0f;
  op->forward(qkv, y);
  for (int k = 0; k < 3 * 6; ++k)
    EXPECT_EQ(y.f32()[k], before.f32()[k]) << "output " << k << " of the first three tokens";
}

struct LstmTensors {
  Tensor x, w_ih, w_hh, b_ih, b_hh, y;
};
// Weights drawn as nn.LSTM draws them, U(-1/sqrt(hidden), 1/sqrt(hidden)); inputs U(-1, 1).
LstmTensors lstmTensors(const LstmGeometry& g) {
  const float k = 1.0f / std::sqrt(static_cast<float>(g.hidden));
  const std::int64_t gates = 4 * g.hidden;
  return {randomHost({g.n, g.t, g.input}, 1),      randomHost({gates, g.input}, 2, -k, k),
          randomHost({gates, g.hidden}, 3, -k, k), randomHost({gates}, 4, -k, k),
          randomHost({gates}, 5, -k, k),           Tensor::host({g.n, g.t, g.hidden})};
}

// The layer in double beside a first-order bound on what float32 may differ by, carried through
// the steps: each step's pre-activations are within gammaN(input + hidden + 3) of the magnitudes
// of their terms (two biases, two products, in any order), plus what the previous h's error
// moves them by; sigmoid is within 4 u relative and tanh within 9 u absolute of their rounded
// inputs (kernels/cpu/vec.h), plus the inputs' errors times their slopes; c = f c_prev + i g is
// within gammaN(2) of its terms' magnitudes plus its factors' errors, h = o tanh(c) one rounding
// plus its factors'. (The flush of denormals moves a sigmoid below 2^-126 by less than 1e-30.)
struct LstmInDouble {
  std::vector<double> y, bound;
};
LstmInDouble lstmInDouble(const LstmGeometry& g, const LstmTensors& v) {
  const std::int64_t in = g.input, hid = g.hidden;
  const double u = kFloatRoundoff;
  auto sigmoid = [](double z) { return 1 / (1 + std::exp(-z)); };
  LstmInDouble out{std::vector<double>(static_cast<std::size_t>(g.n * g.t * hid)), {}};
  out.bound = out.y;
  for (std::int64_t i = 0; i < g.n; ++i) {
    std::vector<double> h(hid, 0.0), eh(hid, 0.0), c(hid, 0.0), ec(hid, 0.0);
    for (std::int64_t s = 0; s < g.t; ++s) {
      std::vector<double> act(4 * hid), err(4 * hid);
      for (std::int64_t q = 0; q < 4 * hid; ++q) {
        double pre = double(v.b_ih.f32()[q]) + v.b_hh.f32()[q];
        double mag = std::abs(double(v.b_ih.f32()[q])) + std::abs(double(v.b_hh.f32()[q]));
        double moved = 0;
        for (std::int64_t k = 0; k < in; ++k) {
          const double term = double(v.x.f32()[(i * g.t + s) * in + k]) * v.w_ih.f32()[q * in + k];
          pre += term;
          mag += std::abs(term);
        }
        for (std::int64_t k = 0; k < hid; ++k) {
          const double w = v.w_hh.f32()[q * hid + k];
          pre += h[k] * w;
          mag += std::abs(h[k] * w);
          moved += std::abs(w) * eh[k];
        }
        const double e = gammaN(in + hid + 3) * mag + moved;
        if (q / hid == 2) {
          act[q] = std::tanh(pre);
          err[q] = (1 - act[q] * act[q]) * e + 9 * u;
        } else {
          act[q] = sigmoid(pre);
          err[q] = act[q] * (1 - act[q]) * e + 4 * u * act[q] + 1e-30;
        }
      }
      for (std::int64_t k = 0; k < hid; ++k) {
        const double ig = act[k], fg = act[hid + k], gg = act[2 * hid + k], og = act[3 * hid + k];
        const double ei = err[k], ef = err[hid + k], eg = err[2 * hid + k], eo = err[3 * hid + k];
        const double cell = fg * c[k] + ig * gg;
        ec[k] = std::abs(fg) * ec[k] + std::abs(c[k]) * ef + std::abs(ig) * eg + std::abs(gg) * ei +
                gammaN(2) * (std::abs(fg * c[k]) + std::abs(ig * gg));
        c[k] = cell;
        const double tc = std::tanh(cell), etc = (1 - tc * tc) * ec[k] + 9 * u;
        h[k] = og * tc;
        eh[k] = std::abs(og) * etc + std::abs(tc) * eo + u * std::abs(h[k]);
        out.y[static_cast<std::size_t>((i * g.t + s) * hid + k)] = h[k];
        out.bound[static_cast<std::size_t>((i * g.t + s) * hid + k)] = eh[k];
      }
    }
  }
  return out;
}

// Small (one thread) and large enough that the two threads share the hidden units (the barrier
// after each step, the split products of the backward). The bound is first order: the terms it
// leaves out are products of two errors, below 1e-6 of it here; twice it is asserted.
TEST_F(OpsTest, LstmIsNnLstmsEquationsWithinTheRoundingBound) {
  for (const LstmGeometry g : {LstmGeometry{2, 4, 3, 5}, LstmGeometry{4, 8, 64, 64}}) {
    auto op = backend_->makeLstm(g);
    LstmTensors v = lstmTensors(g);
    op->forward(v.x, v.w_ih, v.w_hh, v.b_ih, v.b_hh, v.y);
    const LstmInDouble want = lstmInDouble(g, v);
    double worst = 0;
    for (std::size_t k = 0; k < want.y.size(); ++k) {
      ASSERT_NEAR(v.y.f32()[k], want.y[k], 2 * want.bound[k])
          << "output " << k << " of " << g.n << "x" << g.t << "x" << g.hidden;
      worst = std::max(worst, std::abs(v.y.f32()[k] - want.y[k]) / want.bound[k]);
    }
    std::cout << g.n << "x" << g.t << "x" << g.hidden << ": largest difference / bound " << worst
              << "\n";
  }
}

// Every gradient against central differences (expectGradient). The state carries each input to
// every later output of its sequence, at most 4 x 5 = 20 outputs of sums of at most 3 + 5 + 2
// terms of order 1, within the rounding argument above.
TEST_F(OpsTest, LstmGradientsMatchFiniteDifferences) {
  const LstmGeometry g{2, 4, 3, 5};
  auto op = backend_->makeLstm(g);
  LstmTensors v = lstmTensors(g);
  const Tensor r = randomHost(v.y.shape(), 6);
  Tensor dx = Tensor::host(v.x.shape()), dw_ih = Tensor::host(v.w_ih.shape());
  Tensor dw_hh = Tensor::host(v.w_hh.shape()), db_ih = Tensor::host(v.b_ih.shape());
  Tensor db_hh = Tensor::host(v.b_hh.shape());
  op->forward(v.x, v.w_ih, v.w_hh, v.b_ih, v.b_hh, v.y);
  op->backward(v.x, v.y, v.w_ih, v.w_hh, r, dx, dw_ih, dw_hh, db_ih, db_hh);
  auto loss = [&] {
    op->forward(v.x, v.w_ih, v.w_hh, v.b_ih, v.b_hh, v.y);
    return dot(r, v.y);
  };
  expectGradient("lstm dx", v.x, dx, loss);
  expectGradient("lstm dw_ih", v.w_ih, dw_ih, loss);
  expectGradient("lstm dw_hh", v.w_hh, dw_hh, loss);
  expectGradient("lstm db_ih", v.b_ih, db_ih, loss);
  expectGradient("lstm db_hh", v.b_hh, db_hh, loss);
}

}  // namespace
}  // namespace troupe::kernels
