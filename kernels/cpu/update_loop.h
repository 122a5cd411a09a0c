// The CPU's loops of an optimizer rule (kernels/optimizers/rule.h): cpuUpdateKernel<Rule>() gives
// the UpdateKernel whose functions the CPU backend runs per thread over a piece of an update,
// compiled for AVX-512, AVX2 and baseline x86-64 and chosen by cpuIsa() as the other vector loops
// are (kernels/cpu/vec.cc), so TROUPE_MAX_CPU_ISA holds them too.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/update.h"

// GCC's target regions; clang (the fuzzers' build) compiles all three for the baseline.
#if defined(__clang__)
#define TROUPE_TARGET_BEGIN(isa)
#define TROUPE_TARGET_END
#else
#define TROUPE_TARGET_BEGIN(isa) _Pragma("GCC push_options") _Pragma(isa)
#define TROUPE_TARGET_END _Pragma("GCC pop_options")
#endif

TROUPE_TARGET_BEGIN("GCC target(\"arch=x86-64-v4\")")
namespace troupe::kernels::cpu::rule_loops::avx512 {
#include "kernels/cpu/update_loops.inc"
}  // namespace troupe::kernels::cpu::rule_loops::avx512
TROUPE_TARGET_END

TROUPE_TARGET_BEGIN("GCC target(\"arch=x86-64-v3\")")
namespace troupe::kernels::cpu::rule_loops::avx2 {
#include "kernels/cpu/update_loops.inc"
}  // namespace troupe::kernels::cpu::rule_loops::avx2
TROUPE_TARGET_END

namespace troupe::kernels::cpu::rule_loops::baseline {
#include "kernels/cpu/update_loops.inc"
}  // namespace troupe::kernels::cpu::rule_loops::baseline

#undef TROUPE_TARGET_BEGIN
#undef TROUPE_TARGET_END

namespace troupe::kernels {

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
  namespace loops = cpu::rule_loops;
  UpdateKernel k;
  k.name = Rule::kName;
  k.states = Rule::kStates;
  k.layerwise = Rule::kLayerwise;
  switch (cpu::cpuIsa()) {
    case cpu::Isa::kAvx512:
      k.update = &loops::avx512::update<Rule>;
      k.probe = &loops::avx512::probe<Rule>;
      break;
    case cpu::Isa::kAvx2:
      k.update = &loops::avx2::update<Rule>;
      k.probe = &loops::avx2::probe<Rule>;
      break;
    case cpu::Isa::kBaseline:
      k.update = &loops::baseline::update<Rule>;
      k.probe = &loops::baseline::probe<Rule>;
      break;
  }
  k.ratio = &cpuRuleRatio<Rule>;
  return k;
}

}  // namespace troupe::kernels
