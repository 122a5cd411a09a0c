// The CPU's loops of an optimizer rule (kernels/optimizers/rule.h): cpuUpdateKernel<Rule>()
// gives the UpdateKernel whose functions the CPU backend runs per thread over a piece of an update.
#pragma once

#include <bit>
#include <cstdint>

#include "kernels/update.h"

namespace troupe::kernels {

template <typename Rule>
bool cpuRuleUpdate(const UpdateArgs& a, std::int64_t b, std::int64_t e, float decay, float ratio) {
  float* __restrict w = a.w.f32();
  const float* __restrict g = a.g.f32();
  float* s = a.state.f32() + a.state_offset;
  const std::int64_t stride = a.stride;
  const UpdateScalars c = a.scalars;
  // The finiteness test rides on the update, as in the SGD loop (vec_loops.inc).
  std::uint32_t worst = 0;
#pragma omp simd reduction(max : worst)
  for (std::int64_t i = b; i < e; ++i) {
    const float updated = Rule::update(w[i], g[i], StateRef{s + i, stride}, c, decay, ratio);
    w[i] = updated;
    worst = std::max(worst, std::bit_cast<std::uint32_t>(updated) & 0x7f800000u);
  }
  return worst != 0x7f800000u;
}

template <typename Rule>
void cpuRuleProbe(const UpdateArgs& a, std::int64_t b, std::int64_t e, float decay, double* sums) {
  if constexpr (Rule::kLayerwise) {
    const float* w = a.w.f32();
    const float* g = a.g.f32();
    float* s = a.state.f32() + a.state_offset;
    double ww = 0, pp = 0;
    for (std::int64_t i = b; i < e; ++i) {
      const double p = Rule::probe(w[i], g[i], StateRef{s + i, a.stride}, a.scalars, decay);
      ww += static_cast<double>(w[i]) * w[i];
      pp += p * p;
    }
    sums[0] += ww;
    sums[1] += pp;
  }
}

template <typename Rule>
float cpuRuleRatio(float w_norm, float probe_norm, const UpdateScalars& c, float decay) {
  if constexpr (Rule::kLayerwise) {
    return Rule::ratio(w_norm, probe_norm, c, decay);
  } else {
    return 1.0f;
  }
}

template <typename Rule>
UpdateKernel cpuUpdateKernel() {
  UpdateKernel k;
  k.name = Rule::kName;
  k.states = Rule::kStates;
  k.layerwise = Rule::kLayerwise;
  k.update = &cpuRuleUpdate<Rule>;
  k.probe = &cpuRuleProbe<Rule>;
  k.ratio = &cpuRuleRatio<Rule>;
  return k;
}

}  // namespace troupe::kernels
