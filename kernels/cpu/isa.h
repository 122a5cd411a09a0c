// Which x86-64 instruction set troupe's own CPU kernels use: the best this CPU has, capped by
// TROUPE_MAX_CPU_ISA (or, when that is unset, by oneDNN's ONEDNN_MAX_CPU_ISA, so that one setting
// holds both). Values, case-insensitive: avx512 (oneDNN's AVX512_CORE and above), avx2, baseline
// (oneDNN's SSE41 and below), all/default. Holding an AVX-512 machine to avx2 runs the same code
// an AVX2-only machine runs (the same vector widths, so the same summation orders in troupe's
// loops); oneDNN's own blocking also depends on cache sizes, which no switch imitates.
#pragma once

#include <string>

namespace troupe::kernels::cpu {

enum class Isa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// Read once, on first use, from the CPU and the environment; any thread may call it. An unknown
// value of either variable throws troupe::InputError naming the variable and the known values.
Isa cpuIsa();

// "avx512", "avx2" or "baseline".
std::string isaName(Isa isa);

// What cpuIsa() would answer for this CPU's best and these variable values (empty: unset); for
// tests.
Isa cappedIsa(Isa best, const std::string& troupe_max, const std::string& onednn_max);

}  // namespace troupe::kernels::cpu
