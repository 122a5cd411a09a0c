// A net's gradient element against one-sided differences of its loss (kernels tests).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>

namespace troupe::testing {

// Whether `grad`, the analytic d loss / d w[i], lies between the one-sided differences of loss()
// at w[i] - eps, w[i], w[i] + eps (w[i] restored after). Where L' is monotone on [w - eps,
// w + eps] (no ReLU kink or batch-norm turn inside), the mean value theorem puts L'(w) between
// them; each is off by at most 2 dL / eps for a loss rounded within dL of its exact value, and
// dL <= 2 ulp(L) (the final rounding and a sum of per-sample losses, each rounded once more).
inline bool withinOneSidedDifferences(float* w, std::int64_t i, double grad, float eps,
                                      const std::function<double()>& loss) {
  const float keep = w[i];
  w[i] = keep + eps;
  const double up = loss();
  w[i] = keep - eps;
  const double down = loss();
  w[i] = keep;
  const double centre = loss();
  const double forward = (up - centre) / eps, backward = (centre - down) / eps;
  const double ulp = std::nextafter(static_cast<float>(std::abs(centre)), INFINITY) -
                     static_cast<float>(std::abs(centre));
  const double rounding = 2 * (2 * ulp) / eps;
  return grad >= std::min(forward, backward) - rounding &&
         grad <= std::max(forward, backward) + rounding;
}

}  // namespace troupe::testing
