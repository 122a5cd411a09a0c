#include "kernels/cpu/vec.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/isa.h"

namespace troupe::kernels::cpu::vec {
namespace {
// The exponent bits of a float: all ones for inf and NaN only.
constexpr std::uint32_t kExponentBits = 0x7f800000u;
inline std::uint32_t exponentBits(float x) {
  return std::bit_cast<std::uint32_t>(x) & kExponentBits;
}
}  // namespace
}  // namespace troupe::kernels::cpu::vec

// The loops, once per instruction set (what GCC's target_clones would make, but chosen by
// cpuIsa() at run time, so TROUPE_MAX_CPU_ISA can hold an AVX-512 machine to AVX2's code).
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
namespace troupe::kernels::cpu::vec::avx512 {
#include "kernels/cpu/vec_loops.inc"
}  // namespace troupe::kernels::cpu::vec::avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
namespace troupe::kernels::cpu::vec::avx2 {
#include "kernels/cpu/vec_loops.inc"
}  // namespace troupe::kernels::cpu::vec::avx2
#pragma GCC pop_options

namespace troupe::kernels::cpu::vec::baseline {
#include "kernels/cpu/vec_loops.inc"
}  // namespace troupe::kernels::cpu::vec::baseline

namespace troupe::kernels::cpu::vec {
namespace {

struct Loops {
  decltype(&baseline::reluForward) reluForward;
  decltype(&baseline::reluBackward) reluBackward;
  decltype(&baseline::sgd) sgd;
  decltype(&baseline::axpy) axpy;
  decltype(&baseline::scale) scale;
  decltype(&baseline::add) add;
  decltype(&baseline::addScalar) addScalar;
  decltype(&baseline::addRowVector) addRowVector;
  decltype(&baseline::sumRows) sumRows;
  decltype(&baseline::maxPool2x2Portable) maxPool2x2;
  decltype(&baseline::toHalf) toHalf;
  decltype(&baseline::fromHalf) fromHalf;
  decltype(&baseline::toBfloat16) toBfloat16;
  decltype(&baseline::fromBfloat16) fromBfloat16;
  decltype(&baseline::quantize2Bit) quantize2Bit;
  decltype(&baseline::dequantize2Bit) dequantize2Bit;
  decltype(&baseline::geluForward) geluForward;
  decltype(&baseline::geluBackward) geluBackward;
  decltype(&baseline::expSum) expSum;
  decltype(&baseline::lstmCellForward) lstmCellForward;
  decltype(&baseline::lstmCellBackward) lstmCellBackward;
};

#define TROUPE_VEC_LOOPS(ns)                                                                       \
  Loops {                                                                                          \
    &ns::reluForward, &ns::reluBackward, &ns::sgd, &ns::axpy, &ns::scale, &ns::add,                \
        &ns::addScalar, &ns::addRowVector, &ns::sumRows, &ns::maxPool2x2Portable, &ns::toHalf,     \
        &ns::fromHalf, &ns::toBfloat16, &ns::fromBfloat16, &ns::quantize2Bit, &ns::dequantize2Bit, \
        &ns::geluForward, &ns::geluBackward, &ns::expSum, &ns::lstmCellForward,                    \
        &ns::lstmCellBackward                                                                      \
  }

const Loops& loops() {
  static const Loops chosen = [] {
    switch (cpuIsa()) {
      case Isa::kAvx512:
        return TROUPE_VEC_LOOPS(avx512);
      case Isa::kAvx2:
        return TROUPE_VEC_LOOPS(avx2);
      case Isa::kBaseline:
        break;
    }
    return TROUPE_VEC_LOOPS(baseline);
  }();
  return chosen;
}

#undef TROUPE_VEC_LOOPS

}  // namespace

namespace {

// The even and odd elements of the 2n floats at `row` (masks lo and hi cover them).
__attribute__((target("avx512f"))) inline void evenOdd(const float* row, __mmask16 lo, __mmask16 hi,
                                                       __m512i even, __m512i odd, __m512& first,
                                                       __m512& second) {
  const __m512 v0 = _mm512_maskz_loadu_ps(lo, row);
  const __m512 v1 = _mm512_maskz_loadu_ps(hi, row + 16);
  first = _mm512_permutex2var_ps(v0, even, v1);
  second = _mm512_permutex2var_ps(v0, odd, v1);
}

// maxPool2x2 with AVX-512 and masks, 16 outputs at a time: the compiler's loop only vectorises
// rows of 16 outputs or more, and LeNet's are 12 and 4 wide. The same arithmetic as the portable
// loop below, so the two give the same bits.
__attribute__((target("avx512f"))) void maxPool2x2Avx512(const float* x, float* y,
                                                         std::int32_t* argmax, std::int64_t h,
                                                         std::int64_t w) {
  const std::int64_t oh = h / 2, ow = w / 2;
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i lane2 =
      _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i one = _mm512_set1_epi32(1), wide = _mm512_set1_epi32(static_cast<std::int32_t>(w));
  for (std::int64_t oy = 0; oy < oh; ++oy) {
    const float* r0 = x + 2 * oy * w;
    const float* r1 = r0 + w;
    for (std::int64_t ox = 0; ox < ow; ox += 16) {
      const std::int64_t n = std::min<std::int64_t>(16, ow - ox);
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      const std::int64_t lo_n = std::min<std::int64_t>(16, 2 * n), hi_n = 2 * n - lo_n;
      const __mmask16 lo = static_cast<__mmask16>((1u << lo_n) - 1);
      const __mmask16 hi = static_cast<__mmask16>((1u << hi_n) - 1);
      __m512 a, b, c, d;
      evenOdd(r0 + 2 * ox, lo, hi, even, odd, a, b);
      evenOdd(r1 + 2 * ox, lo, hi, even, odd, c, d);
      const __mmask16 ab = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ);
      const __mmask16 cd = _mm512_cmp_ps_mask(d, c, _CMP_GT_OQ);
      const __m512 m0 = _mm512_mask_blend_ps(ab, a, b), m1 = _mm512_mask_blend_ps(cd, c, d);
      const __mmask16 second = _mm512_cmp_ps_mask(m1, m0, _CMP_GT_OQ);
      _mm512_mask_storeu_ps(y + oy * ow + ox, m, _mm512_mask_blend_ps(second, m0, m1));
      // base + 2 * ox + ab, or, when the second row wins, base + 2 * ox + w + cd
      const __m512i base = _mm512_add_epi32(
          _mm512_set1_epi32(static_cast<std::int32_t>(2 * oy * w + 2 * ox)), lane2);
      const __m512i first_row = _mm512_mask_add_epi32(base, ab, base, one);
      const __m512i second_row = _mm512_mask_add_epi32(_mm512_add_epi32(base, wide), cd,
                                                       _mm512_add_epi32(base, wide), one);
      _mm512_mask_storeu_epi32(argmax + oy * ow + ox, m,
                               _mm512_mask_blend_epi32(second, first_row, second_row));
    }
  }
}

}  // namespace

void reluForward(const float* x, float* y, std::int64_t n) {
  loops().reluForward(x, y, n);
}

void reluBackward(const float* y, const float* dy, float* dx, std::int64_t n) {
  loops().reluBackward(y, dy, dx, n);
}

bool sgd(float* w, const float* g, float* v, std::int64_t n, float lr, float momentum,
         float weight_decay, bool nesterov) {
  return loops().sgd(w, g, v, n, lr, momentum, weight_decay, nesterov);
}

void axpy(float alpha, const float* x, float* y, std::int64_t n) {
  loops().axpy(alpha, x, y, n);
}

void scale(float* x, float alpha, std::int64_t n) {
  loops().scale(x, alpha, n);
}

void add(const float* a, const float* b, float* y, std::int64_t n) {
  loops().add(a, b, y, n);
}

void addScalar(const float* x, float bias, float* y, std::int64_t n) {
  loops().addScalar(x, bias, y, n);
}

void addRowVector(float* y, const float* b, std::int64_t rows, std::int64_t cols) {
  loops().addRowVector(y, b, rows, cols);
}

void sumRows(const float* x, std::int64_t ld, float* s, std::int64_t rows, std::int64_t cols) {
  loops().sumRows(x, ld, s, rows, cols);
}

void maxPool2x2(const float* x, float* y, std::int32_t* argmax, std::int64_t h, std::int64_t w) {
  if (cpuIsa() == Isa::kAvx512 && w / 2 < 16) {
    maxPool2x2Avx512(x, y, argmax, h, w);
    return;
  }
  loops().maxPool2x2(x, y, argmax, h, w);
}

void toHalf(const float* x, std::uint16_t* y, std::int64_t n) {
  loops().toHalf(x, y, n);
}

void fromHalf(const std::uint16_t* x, float* y, std::int64_t n, bool accumulate) {
  loops().fromHalf(x, y, n, accumulate);
}

void toBfloat16(const float* x, std::uint16_t* y, std::int64_t n) {
  loops().toBfloat16(x, y, n);
}

void fromBfloat16(const std::uint16_t* x, float* y, std::int64_t n, bool accumulate) {
  loops().fromBfloat16(x, y, n, accumulate);
}

void quantize2Bit(const float* x, float* residual, float threshold, std::uint8_t* out,
                  std::int64_t n) {
  loops().quantize2Bit(x, residual, threshold, out, n);
}

void dequantize2Bit(const std::uint8_t* in, float threshold, float* y, std::int64_t n,
                    bool accumulate) {
  loops().dequantize2Bit(in, threshold, y, n, accumulate);
}

void geluForward(const float* x, float* y, std::int64_t n) {
  loops().geluForward(x, y, n);
}

void geluBackward(const float* x, const float* dy, float* dx, std::int64_t n) {
  loops().geluBackward(x, dy, dx, n);
}

float expSum(const float* x, float shift, float* y, std::int64_t n) {
  return loops().expSum(x, shift, y, n);
}

void lstmCellForward(float* gates, std::int64_t stride, const float* c_prev, float* c, float* tc,
                     float* h, std::int64_t n) {
  loops().lstmCellForward(gates, stride, c_prev, c, tc, h, n);
}

void lstmCellBackward(const float* gates, std::int64_t stride, const float* c_prev, const float* tc,
                      const float* dh, float* dc, float* dgates, std::int64_t n) {
  loops().lstmCellBackward(gates, stride, c_prev, tc, dh, dc, dgates, n);
}

}  // namespace troupe::kernels::cpu::vec
