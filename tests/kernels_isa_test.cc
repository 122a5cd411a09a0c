// The switch that holds troupe's CPU kernels to a lower instruction set (TROUPE_MAX_CPU_ISA).
#include <gtest/gtest.h>

#include "kernels/cpu/isa.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {
namespace {

TEST(CpuIsa, TheBestOfTheCpuIsUsedWhenNothingHoldsItLower) {
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "", ""), Isa::kAvx512);
  EXPECT_EQ(cappedIsa(Isa::kAvx2, "", ""), Isa::kAvx2);
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "all", ""), Isa::kAvx512);
}

TEST(CpuIsa, TroupesVariableCapsTheInstructionSetButNeverRaisesIt) {
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "avx2", ""), Isa::kAvx2);
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "AVX2", ""), Isa::kAvx2);
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "baseline", ""), Isa::kBaseline);
  EXPECT_EQ(cappedIsa(Isa::kAvx2, "avx512", ""), Isa::kAvx2);
}

TEST(CpuIsa, OneDnnsVariableHoldsTroupeTooUnlessTroupesOwnIsSet) {
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "", "AVX2"), Isa::kAvx2);
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "", "AVX512_CORE_AMX"), Isa::kAvx512);
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "", "SSE41"), Isa::kBaseline);
  EXPECT_EQ(cappedIsa(Isa::kAvx512, "avx512", "AVX2"), Isa::kAvx512);
}

TEST(CpuIsa, AnUnknownValueIsAnErrorNamingTheVariable) {
  try {
    cappedIsa(Isa::kAvx512, "avx3", "");
    FAIL() << "avx3 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("TROUPE_MAX_CPU_ISA=avx3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cappedIsa(Isa::kAvx512, "", "neon"), InputError);
}

}  // namespace
}  // namespace troupe::kernels::cpu
