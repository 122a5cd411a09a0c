#include "kernels/cpu/isa.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "kernels/named.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {
namespace {

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

// nullopt: no cap. oneDNN's names (dnnl::cpu_isa) map to the widest vectors they allow.
Isa parseCap(const char* variable, const std::string& text, Isa best) {
  const std::string v = upper(text);
  if (v.empty() || v == "ALL" || v == "DEFAULT") return best;
  if (v == "AVX512" || v.rfind("AVX512_", 0) == 0 || v.rfind("AVX10", 0) == 0 ||
      v.rfind("AMX", 0) == 0) {
    return Isa::kAvx512;
  }
  if (v == "AVX2" || v.rfind("AVX2_", 0) == 0) return Isa::kAvx2;
  if (v == "BASELINE" || v == "SSE41" || v == "AVX") return Isa::kBaseline;
  throw InputError(fmt::format(
      "{}={}: unknown instruction set (known: avx512, avx2, baseline, all; or oneDNN's names "
      "such as AVX512_CORE, AVX2, SSE41)",
      variable, text));
}

Isa bestOfThisCpu() {
  if (__builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kBaseline;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

Isa cappedIsa(Isa best, const std::string& troupe_max, const std::string& onednn_max) {
  const Isa cap = !troupe_max.empty() ? parseCap("TROUPE_MAX_CPU_ISA", troupe_max, best)
                                      : parseCap("ONEDNN_MAX_CPU_ISA", onednn_max, best);
  return std::min(best, cap);
}

Isa cpuIsa() {
  static const Isa isa =
      cappedIsa(bestOfThisCpu(), env("TROUPE_MAX_CPU_ISA"), env("ONEDNN_MAX_CPU_ISA"));
  return isa;
}

std::string isaName(Isa isa) {
  static constexpr Named<Isa> kNames[] = {
      {"baseline", Isa::kBaseline}, {"avx2", Isa::kAvx2}, {"avx512", Isa::kAvx512}};
  return nameIn(kNames, isa);
}

}  // namespace troupe::kernels::cpu
