// Rounding-error bounds for comparing float32 results in tests (STYLE.md #16): a tolerance is one
// of these, with the quantities it depends on written beside the assertion, never a number that
// happened to pass on one machine. Other SIMD widths, cache blocking and thread counts change the
// order of sums; these bounds hold for every order.
#pragma once

#include <cmath>
#include <cstdint>

namespace troupe::testing {

// Unit roundoff of IEEE binary32 and binary64, round to nearest: |fl(x) - x| <= u|x|.
inline constexpr double kFloatRoundoff = 0x1p-24;
inline constexpr double kDoubleRoundoff = 0x1p-53;

// Worst case (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., Lemma 3.1 and
// section 3.1): a sum of n terms, or a dot product of length n, computed in float in any order
// (any blocking, any vector width, with or without fused multiply-add) is within
// gammaN(n) * sum |x_i| (sum |x_i y_i|) of the exact value, gammaN(n) = n u / (1 - n u).
inline double gammaN(double n, double u = kFloatRoundoff) {
  return n * u / (1 - n * u);
}

// Probabilistic (Higham and Mary, "A new approach to probabilistic rounding error analysis",
// SIAM J. Sci. Comput. 41(5), 2019, Theorem 2.4): when the rounding errors are independent with
// mean zero, the same error is at most lambda * sqrt(n) * u * sum |x_i| (to first order) with
// probability at least 1 - 2n exp(-lambda^2 (1 - u)^2 / 2). lambda = 7 leaves a failure
// probability below 5e-11 n.
inline double probableGammaN(double n, double lambda = 7, double u = kFloatRoundoff) {
  return std::expm1(lambda * std::sqrt(n) * u + n * u * u / (1 - u));
}

// A reference value accumulated in double beside the sum of the magnitudes of its terms, and the
// bound for a float computation of it: |float result - exact| <= gammaN(n) * magnitude, plus the
// double reference's own error, gammaN(n, double u) * magnitude.
struct ReferenceSum {
  double value = 0, magnitude = 0;
  std::int64_t terms = 0;
  void add(double term) {
    value += term;
    magnitude += std::abs(term);
    ++terms;
  }
  double floatBound() const {
    return (gammaN(double(terms)) + gammaN(double(terms), kDoubleRoundoff)) * magnitude;
  }
};

// Two float runs of the same steps of SGD with momentum `momentum` that differ only in the order
// of their sums (another vector width or blocking, another thread count, or a batch's gradient
// summed over workers instead of in one process): the relative difference of their momentum
// buffers and of their weights (||a - b|| / ||a|| or max |a - b| / max |a|). Each step's gradient
// element is a sum of at most `longest_sum` terms (LeNet at batch 64: conv1's weight gradient,
// 64 images * 24 * 24 pixels = 36,864), within probableGammaN(longest_sum) relative of the exact
// one when its terms do not cancel; the momentum buffer carries the error of step t - k with
// weight momentum^k, at most 1 / (1 - momentum) errors of that size in all, and the weights move
// by lr * v each step, so their errors relative to their path are of the same size (these tests
// run 20 early steps at lr 0.01, whose path is short against the weights' own norm). Not bounded:
// cancellation within a gradient's sum and the growth of earlier differences through later
// gradients (chaotic at larger learning rates): lambda = 7 in probableGammaN against the typical
// lambda ~ 1 leaves them a factor ~7. Measured: 1e-8 (weights) and 4e-7 (momentum) on AVX-512,
// the same held to AVX2, and 1.0e-4 (momentum) once on an AVX2-only machine, against this
// bound's 8e-4 for LeNet; a defect in the schedule (a lost worker, a stale or doubled gradient)
// moves the momentum by 10% or more.
inline double sgdTrajectoryBound(double longest_sum, double momentum) {
  return probableGammaN(longest_sum) / (1 - momentum);
}

}  // namespace troupe::testing
