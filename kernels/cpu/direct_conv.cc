#include "kernels/cpu/direct_conv.h"

#include <immintrin.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/cpu/isa.h"

namespace troupe::kernels::cpu {
namespace {

#define TROUPE_AVX512 __attribute__((target("avx512f")))

// The loops over a block's channels are unrolled (#pragma GCC unroll), so that its accumulators
// live in registers.
// Output channels per block: two accumulators each (a row of up to 32 pixels), 16 of the 32
// vector registers, the rest for the input row and the weights.
constexpr int kBlock = 8;

struct Masks {
  __mmask16 lo, hi;  // pixels [0, 16) and [16, 32) of a row of `width`
  explicit Masks(std::int64_t width)
      : lo(static_cast<__mmask16>(width >= 16 ? 0xFFFF : (1u << width) - 1)),
        hi(static_cast<__mmask16>(width > 16 ? (1u << (width - 16)) - 1 : 0)) {}
};

// One block of NB output channels, rows [0, OH) of one image.
template <int NB>
TROUPE_AVX512 void forwardBlock(const ConvGeometry& g, const float* x, const float* w,
                                const float* b, float* y, std::int64_t oc0) {
  const std::int64_t k = g.kernel, h = g.height, wd = g.width;
  const std::int64_t oh = g.outHeight(), ow = g.outWidth(), taps = g.channels * k * k;
  const Masks m(ow);
  for (std::int64_t oy = 0; oy < oh; ++oy) {
    __m512 acc0[NB], acc1[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j)
      acc0[j] = acc1[j] = _mm512_set1_ps(b ? b[oc0 + j] : 0.0f);
    for (std::int64_t c = 0; c < g.channels; ++c) {
      for (std::int64_t ki = 0; ki < k; ++ki) {
        const float* row = x + (c * h + oy + ki) * wd;
        for (std::int64_t kj = 0; kj < k; ++kj) {
          const __m512 x0 = _mm512_maskz_loadu_ps(m.lo, row + kj);
          const __m512 x1 = _mm512_maskz_loadu_ps(m.hi, row + kj + 16);
          const float* wt = w + oc0 * taps + (c * k + ki) * k + kj;
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) {
            const __m512 wv = _mm512_set1_ps(wt[j * taps]);
            acc0[j] = _mm512_fmadd_ps(wv, x0, acc0[j]);
            acc1[j] = _mm512_fmadd_ps(wv, x1, acc1[j]);
          }
        }
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      float* out = y + ((oc0 + j) * oh + oy) * ow;
      _mm512_mask_storeu_ps(out, m.lo, acc0[j]);
      _mm512_mask_storeu_ps(out + 16, m.hi, acc1[j]);
    }
  }
}

// lanes[(oc0 + j) * taps + tap][16 lanes] += sum over rows of dy[oc0 + j] * (x shifted by the
// tap), lane by lane: the lanes are summed once, after the last image.
template <int NB>
TROUPE_AVX512 void weightGradBlock(const ConvGeometry& g, const float* x, const float* dy,
                                   float* lanes, std::int64_t oc0) {
  const std::int64_t k = g.kernel, h = g.height, wd = g.width;
  const std::int64_t oh = g.outHeight(), ow = g.outWidth(), p = oh * ow, taps = g.channels * k * k;
  const Masks m(ow);
  for (std::int64_t c = 0; c < g.channels; ++c) {
    for (std::int64_t ki = 0; ki < k; ++ki) {
      for (std::int64_t kj = 0; kj < k; ++kj) {
        __m512 acc0[NB], acc1[NB];
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j)
          acc0[j] = acc1[j] = _mm512_setzero_ps();
        for (std::int64_t oy = 0; oy < oh; ++oy) {
          const float* row = x + (c * h + oy + ki) * wd + kj;
          const __m512 x0 = _mm512_maskz_loadu_ps(m.lo, row);
          const __m512 x1 = _mm512_maskz_loadu_ps(m.hi, row + 16);
          const float* d = dy + oc0 * p + oy * ow;
#pragma GCC unroll 8
          for (int j = 0; j < NB; ++j) {
            acc0[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m.lo, d + j * p), x0, acc0[j]);
            acc1[j] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m.hi, d + j * p + 16), x1, acc1[j]);
          }
        }
        float* out = lanes + (oc0 * taps + (c * k + ki) * k + kj) * 16;
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          float* lane = out + j * taps * 16;
          _mm512_storeu_ps(lane,
                           _mm512_add_ps(_mm512_loadu_ps(lane), _mm512_add_ps(acc0[j], acc1[j])));
        }
      }
    }
  }
}

// Runs Kernel<rest>, the last block of `rest` output channels, for rest among kFewer + 1 (none for
// 0).
template <template <int> class Kernel, int... kFewer, typename... Args>
void lastBlock(int rest, std::integer_sequence<int, kFewer...>, const Args&... args) {
  ((rest == kFewer + 1 ? Kernel<kFewer + 1>::run(args...) : void()), ...);
}

// Runs Kernel<NB> over the output channels in blocks of kBlock and one last smaller block.
template <template <int> class Kernel, typename... Args>
void overBlocks(std::int64_t channels, Args&&... args) {
  std::int64_t oc0 = 0;
  for (; oc0 + kBlock <= channels; oc0 += kBlock)
    Kernel<kBlock>::run(args..., oc0);
  lastBlock<Kernel>(static_cast<int>(channels - oc0), std::make_integer_sequence<int, kBlock - 1>{},
                    args..., oc0);
}

template <int NB>
struct Forward {
  static void run(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y,
                  std::int64_t oc0) {
    forwardBlock<NB>(g, x, w, b, y, oc0);
  }
};

template <int NB>
struct WeightGrad {
  static void run(const ConvGeometry& g, const float* x, const float* dy, float* lanes,
                  std::int64_t oc0) {
    weightGradBlock<NB>(g, x, dy, lanes, oc0);
  }
};

// sum[o] += the sum of plane o of dy (p floats), lane by lane.
TROUPE_AVX512 void planeSums(const float* dy, std::int64_t planes, std::int64_t p, float* lanes) {
  const __mmask16 tail = static_cast<__mmask16>((1u << (p % 16)) - 1);
  for (std::int64_t o = 0; o < planes; ++o) {
    const float* v = dy + o * p;
    __m512 acc = _mm512_loadu_ps(lanes + o * 16);
    std::int64_t i = 0;
    for (; i + 16 <= p; i += 16)
      acc = _mm512_add_ps(acc, _mm512_loadu_ps(v + i));
    acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(tail, v + i));
    _mm512_storeu_ps(lanes + o * 16, acc);
  }
}

// out[i] += the sum of the 16 lanes of lanes[i], for i < n.
void addLanes(const float* lanes, std::int64_t n, float* out) {
  for (std::int64_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (int l = 0; l < 16; ++l)
      s += lanes[i * 16 + l];
    out[i] += s;
  }
}

}  // namespace

bool directConvFits(const ConvGeometry& g) {
  return cpuIsa() == Isa::kAvx512 && g.stride == 1 && g.pad == 0 && g.outWidth() >= 1 &&
         g.outWidth() <= 32;
}

void directConvForward(const ConvGeometry& g, const float* x, const float* w, const float* b,
                       float* y, std::int64_t images) {
  const std::int64_t in = g.channels * g.height * g.width;
  const std::int64_t out = g.out_channels * g.outHeight() * g.outWidth();
  for (std::int64_t i = 0; i < images; ++i)
    overBlocks<Forward>(g.out_channels, g, x + i * in, w, b, y + i * out);
}

void directConvWeightGrad(const ConvGeometry& g, const float* x, const float* dy,
                          std::int64_t images, float* dw, float* db) {
  const std::int64_t in = g.channels * g.height * g.width;
  const std::int64_t p = g.outHeight() * g.outWidth(), out = g.out_channels * p;
  const std::int64_t weights = g.out_channels * g.channels * g.kernel * g.kernel;
  thread_local std::vector<float> lanes;
  lanes.assign(static_cast<std::size_t>((weights + g.out_channels) * 16), 0.0f);
  float* bias_lanes = lanes.data() + weights * 16;
  for (std::int64_t i = 0; i < images; ++i) {
    overBlocks<WeightGrad>(g.out_channels, g, x + i * in, dy + i * out, lanes.data());
    if (db) planeSums(dy + i * out, g.out_channels, p, bias_lanes);
  }
  addLanes(lanes.data(), weights, dw);
  if (db) addLanes(bias_lanes, g.out_channels, db);
}

}  // namespace troupe::kernels::cpu
