// troupe's own CUDA kernels (kernels/cuda/kernels.h). Element-wise kernels are grid-stride loops;
// reductions run in a fixed order, so that a run repeats to the bit. Kernels over activations are
// templates on the element type T (float, __half, __nv_bfloat16): they load T, compute in float and
// round once on the store.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "kernels/cuda/kernels.h"
#include "kernels/random.h"

namespace troupe::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// Blocks for n elements, a grid-stride loop covering the rest (the H100 has 132 SMs).
unsigned blocksFor(std::int64_t n) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 132 * 32 ? 132 * 32 : blocks));
}

__device__ inline float ld(float v) {
  return v;
}
__device__ inline float ld(__half v) {
  return __half2float(v);
}
__device__ inline float ld(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ inline T st(float v);
template <>
__device__ inline float st<float>(float v) {
  return v;
}
template <>
__device__ inline __half st<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ inline __nv_bfloat16 st<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Calls fn(T{}) with the element type of `dtype`.
template <typename Fn>
void dispatch(DType dtype, Fn fn) {
  switch (dtype) {
    case DType::kFloat16:
      fn(__half{});
      return;
    case DType::kBFloat16:
      fn(__nv_bfloat16{});
      return;
    default:
      fn(float{});
  }
}

#define TROUPE_FOR_EACH(i, n)                                                                      \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

// The same with an index of type I: kernels whose index math divides take I = std::int32_t where
// every index fits (see indexed()), as the GPU has no integer divide and a 64-bit one costs about
// three times a 32-bit one in instructions.
#define TROUPE_FOR_EACH_AS(I, i, n)                                                        \
  for (I i = static_cast<I>(blockIdx.x * blockDim.x + threadIdx.x); i < static_cast<I>(n); \
       i += static_cast<I>(gridDim.x * blockDim.x))

// Calls fn(I{}) with std::int32_t when indices below `largest` (elements touched, in or out) fit
// in it with a grid's stride to spare (blocksFor's grid is under 2^21 threads), else std::int64_t.
template <typename Fn>
void indexed(std::int64_t largest, Fn fn) {
  if (largest <= (std::int64_t{1} << 30)) {
    fn(std::int32_t{});
  } else {
    fn(std::int64_t{});
  }
}

template <typename T>
__global__ void fillKernel(T* p, std::int64_t n, float value) {
  const T v = st<T>(value);
  TROUPE_FOR_EACH(i, n) p[i] = v;
}

template <typename T>
__global__ void axpyKernel(float alpha, const T* x, T* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] = st<T>(ld(y[i]) + alpha * ld(x[i]));
}

template <typename T>
__global__ void scaleKernel(T* p, float alpha, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) p[i] = st<T>(ld(p[i]) * alpha);
}

template <typename From, typename To>
__global__ void castKernel(const From* in, To* out, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) out[i] = st<To>(ld(in[i]));
}

// *bad becomes 1 if an element is inf or NaN (tested on the bits), and is left alone otherwise.
__global__ void nonFiniteKernel(const float* p, std::int64_t n, int* bad) {
  bool finite = true;
  TROUPE_FOR_EACH(i, n) finite = finite && (__float_as_uint(p[i]) & 0x7f800000u) != 0x7f800000u;
  if (__syncthreads_or(!finite) && threadIdx.x == 0) *bad = 1;
}

template <typename I>
__global__ void normaliseKernel(const std::uint8_t* in, float* out, I n, I channels, I plane,
                                ChannelValues v) {
  TROUPE_FOR_EACH_AS(I, i, n) {
    const auto c = static_cast<int>((i / plane) % channels);
    const float m = v.mean[v.means == 1 ? 0 : c];
    const float k = v.scale[v.scales == 1 ? 0 : c];
    out[i] = (static_cast<float>(in[i]) - m) * k;
  }
}

// One element's SGD step (kernels/backend.h); whether the updated weight is finite.
__device__ inline bool sgdStep(float* w, const float* g, float* v, std::int64_t i, float lr,
                               float momentum, float weight_decay, bool nesterov) {
  const float grad = g[i] + weight_decay * w[i];
  const float vel = momentum * v[i] + grad;
  v[i] = vel;
  const float updated = nesterov ? w[i] - lr * (grad + momentum * vel) : w[i] - lr * vel;
  w[i] = updated;
  return isfinite(updated);
}

__global__ void sgdKernel(float* w, const float* g, float* v, std::int64_t n, float lr,
                          float momentum, float weight_decay, bool nesterov, int* bad) {
  bool finite = true;
  TROUPE_FOR_EACH(i, n) {
    finite = sgdStep(w, g, v, i, lr, momentum, weight_decay, nesterov) && finite;
  }
  if (__syncthreads_or(!finite) && threadIdx.x == 0) *bad = 1;
}

// sgdKernel with no decay where the element is in one of `none`'s ranges (relative to w, sorted):
// the last range that begins at or before it is found by bisection.
__global__ void sgdExceptKernel(float* w, const float* g, float* v, std::int64_t n, float lr,
                                float momentum, float weight_decay, bool nesterov, DecayRanges none,
                                int* bad) {
  bool finite = true;
  TROUPE_FOR_EACH(i, n) {
    int lo = 0, hi = none.count;  // the first range beginning after i is at hi
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (none.begin[mid] <= i) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const bool decayed = lo == 0 || i >= none.end[lo - 1];
    finite = sgdStep(w, g, v, i, lr, momentum, decayed ? weight_decay : 0.0f, nesterov) && finite;
  }
  if (__syncthreads_or(!finite) && threadIdx.x == 0) *bad = 1;
}

// As the CPU's std::max(x, 0): NaN and -0 pass through.
template <typename T>
__global__ void reluForwardKernel(const T* x, T* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] = ld(x[i]) < 0.0f ? st<T>(0.0f) : x[i];
}

template <typename T>
__global__ void reluBackwardKernel(const T* y, const T* dy, T* dx, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) dx[i] = ld(y[i]) > 0.0f ? dy[i] : st<T>(0.0f);
}

template <typename T>
__global__ void dropoutForwardKernel(const T* x, T* y, float* mask, std::int64_t n, float ratio,
                                     float keep, std::uint64_t seed) {
  TROUPE_FOR_EACH(i, n) {
    const float m =
        uniform01(randomBits(seed, 0, static_cast<std::uint64_t>(i))) < ratio ? 0.0f : keep;
    mask[i] = m;
    y[i] = st<T>(ld(x[i]) * m);
  }
}

template <typename T>
__global__ void multiplyKernel(const T* a, const float* b, T* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] = st<T>(ld(a[i]) * b[i]);
}

template <typename T>
__global__ void addKernel(const T* a, const T* b, T* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] = st<T>(ld(a[i]) + ld(b[i]));
}

// As the CPU's std::max(a + b, 0): the sum in float, rounded once.
template <typename T>
__global__ void addReluKernel(const T* a, const T* b, T* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) {
    const float v = ld(a[i]) + ld(b[i]);
    y[i] = st<T>(v < 0.0f ? 0.0f : v);
  }
}

// Sums a block's values in a fixed tree; every thread gets the total.
template <typename V>
__device__ V blockSum(V v) {
  __shared__ V warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  V total = 0;
  for (int w = 0; w < kThreads / 32; ++w)
    total += warp_sums[w];
  __syncthreads();
  return total;
}

// One warp per plane, kThreads / 32 planes a block: a plane is small (ResNet-50's last is 7 x 7),
// so a block per plane would leave most of its threads idle. Lane-strided sums, then a fixed tree.
template <typename T>
__global__ void globalAvgPoolForwardKernel(const T* x, T* y, std::int64_t planes,
                                           std::int64_t spatial) {
  const std::int64_t plane =
      blockIdx.x * static_cast<std::int64_t>(kThreads / 32) + threadIdx.x / 32;
  if (plane >= planes) return;  // whole warps: the shuffles below see all 32 lanes or none
  const int lane = static_cast<int>(threadIdx.x % 32);
  const T* in = x + plane * spatial;
  float s = 0.0f;
  for (std::int64_t q = lane; q < spatial; q += 32)
    s += ld(in[q]);
  for (int offset = 16; offset > 0; offset /= 2)
    s += __shfl_down_sync(0xffffffffu, s, offset);
  if (lane == 0) y[plane] = st<T>(s / static_cast<float>(spatial));
}

// Channels last: one thread per (n, c), neighbouring threads reading neighbouring channels; each
// sums its spatial positions in order.
template <typename T>
__global__ void globalAvgPoolForwardNhwcKernel(const T* x, T* y, std::int64_t planes,
                                               std::int64_t spatial, std::int64_t channels) {
  TROUPE_FOR_EACH(p, planes) {
    const std::int64_t n = p / channels, c = p % channels;
    const T* in = x + n * spatial * channels + c;
    float s = 0.0f;
    for (std::int64_t q = 0; q < spatial; ++q)
      s += ld(in[q * channels]);
    y[p] = st<T>(s / static_cast<float>(spatial));
  }
}

// dx[i] = dy[plane of i] / spatial; i is the memory index, NCHW or (channels > 0) NHWC.
template <typename I, typename T>
__global__ void globalAvgPoolBackwardKernel(const T* dy, T* dx, I n, I spatial, I channels) {
  const float inv = 1.0f / static_cast<float>(spatial);
  TROUPE_FOR_EACH_AS(I, i, n) {
    const I plane = channels > 0 ? i / (spatial * channels) * channels + i % channels : i / spatial;
    dx[i] = st<T>(ld(dy[plane]) * inv);
  }
}

// Where element (plane, row, col) of an image of h x w lies in memory, NCHW or NHWC.
template <typename I>
__device__ inline I pixelAt(I channels_last, I plane, I row, I col, I h, I w) {
  if (channels_last == 0) return (plane * h + row) * w + col;
  const I n = plane / channels_last, c = plane % channels_last;
  return ((n * h + row) * w + col) * channels_last + c;
}

// The (plane, row, col) of memory index i of an image of h x w: the inverse of pixelAt, so that
// neighbouring threads touch neighbouring memory in either layout.
template <typename I>
__device__ inline void pixelOf(I channels_last, I i, I h, I w, I& plane, I& row, I& col) {
  if (channels_last == 0) {
    col = i % w;
    row = (i / w) % h;
    plane = i / (w * h);
    return;
  }
  const I c = i % channels_last;
  col = (i / channels_last) % w;
  row = (i / (channels_last * w)) % h;
  plane = i / (channels_last * w * h) * channels_last + c;
}

// A PoolShape in index type I.
template <typename I>
struct Pool {
  I planes, h, w, oh, ow, kernel, stride, pad, channels_last;
  bool max;
  explicit Pool(const PoolShape& s)
      : planes(static_cast<I>(s.planes)),
        h(static_cast<I>(s.h)),
        w(static_cast<I>(s.w)),
        oh(static_cast<I>(s.oh)),
        ow(static_cast<I>(s.ow)),
        kernel(static_cast<I>(s.kernel)),
        stride(static_cast<I>(s.stride)),
        pad(static_cast<I>(s.pad)),
        channels_last(static_cast<I>(s.channels_last)),
        max(s.max) {}
};

// argmax[i] holds the within-plane index (row * w + col) of output i's maximum.
template <typename I, typename T>
__global__ void poolForwardKernel(Pool<I> s, const T* x, T* y, std::int32_t* argmax) {
  const I n = s.planes * s.oh * s.ow;
  TROUPE_FOR_EACH_AS(I, i, n) {
    I plane, oy, ox;
    pixelOf(s.channels_last, i, s.oh, s.ow, plane, oy, ox);
    const I y0 = oy * s.stride - s.pad, x0 = ox * s.stride - s.pad;
    const I y1 = min(y0 + s.kernel, s.h + s.pad), x1 = min(x0 + s.kernel, s.w + s.pad);
    const I ya = max(y0, I{0}), yb = min(y1, s.h);
    const I xa = max(x0, I{0}), xb = min(x1, s.w);
    if (s.max) {
      float v = -FLT_MAX;
      I best = -1;
      for (I iy = ya; iy < yb; ++iy) {
        for (I ix = xa; ix < xb; ++ix) {
          const float u = ld(x[pixelAt(s.channels_last, plane, iy, ix, s.h, s.w)]);
          if (best < 0 || u > v) v = u, best = iy * s.w + ix;
        }
      }
      y[i] = st<T>(v);
      argmax[i] = static_cast<std::int32_t>(best);
    } else {
      float sum = 0.0f;
      for (I iy = ya; iy < yb; ++iy)
        for (I ix = xa; ix < xb; ++ix)
          sum += ld(x[pixelAt(s.channels_last, plane, iy, ix, s.h, s.w)]);
      y[i] = st<T>(sum * (1.0f / static_cast<float>((y1 - y0) * (x1 - x0))));
    }
  }
}

// One thread per input element gathers from the windows that hold it (no atomics).
template <typename I, typename T>
__global__ void poolBackwardKernel(Pool<I> s, const T* dy, const std::int32_t* argmax, T* dx) {
  const I n = s.planes * s.h * s.w;
  TROUPE_FOR_EACH_AS(I, i, n) {
    I plane, iy, ix;
    pixelOf(s.channels_last, i, s.h, s.w, plane, iy, ix);
    // Windows oy with oy * stride - pad <= iy < oy * stride - pad + kernel.
    const I oy_lo = max(I{0}, (iy + s.pad - s.kernel + s.stride) / s.stride);
    const I oy_hi = min(s.oh - 1, (iy + s.pad) / s.stride);
    const I ox_lo = max(I{0}, (ix + s.pad - s.kernel + s.stride) / s.stride);
    const I ox_hi = min(s.ow - 1, (ix + s.pad) / s.stride);
    float sum = 0.0f;
    for (I oy = oy_lo; oy <= oy_hi; ++oy) {
      for (I ox = ox_lo; ox <= ox_hi; ++ox) {
        const I o = pixelAt(s.channels_last, plane, oy, ox, s.oh, s.ow);
        if (s.max) {
          if (argmax[o] == iy * s.w + ix) sum += ld(dy[o]);
        } else {
          const I y0 = oy * s.stride - s.pad, x0 = ox * s.stride - s.pad;
          const I y1 = min(y0 + s.kernel, s.h + s.pad);
          const I x1 = min(x0 + s.kernel, s.w + s.pad);
          sum += ld(dy[o]) / static_cast<float>((y1 - y0) * (x1 - x0));
        }
      }
    }
    dx[i] = st<T>(sum);
  }
}

// out[b][j][i] = in[b][i][j]: one thread per output element, writes in order.
template <typename I, typename From, typename To>
__global__ void transposeKernel(const From* in, To* out, I n, I rows, I cols) {
  TROUPE_FOR_EACH_AS(I, o, n) {
    const I i = o % rows, j = (o / rows) % cols, b = o / (rows * cols);
    out[o] = st<To>(ld(in[(b * rows + i) * cols + j]));
  }
}

struct RowResult {
  float loss, correct;
  int bad_label;  // the label, when outside [0, classes); else 0 with ok set
  int ok;
};

// One block per row: max (the first arg max, as the CPU's strict >), sum of exponentials, loss.
template <typename T>
__global__ void softmaxRowKernel(const T* logits, const std::int32_t* labels, float* prob,
                                 RowResult* rows, std::int64_t classes, float smoothing) {
  const std::int64_t row = blockIdx.x;
  const T* z = logits + row * classes;
  float* p = prob + row * classes;
  __shared__ float best_v[kThreads];
  __shared__ std::int64_t best_i[kThreads];
  float bv = -FLT_MAX;
  std::int64_t bi = -1;
  for (std::int64_t k = threadIdx.x; k < classes; k += kThreads) {
    if (bi < 0 || ld(z[k]) > bv) bv = ld(z[k]), bi = k;
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const float ov = best_v[threadIdx.x + half];
      const std::int64_t oi = best_i[threadIdx.x + half];
      const std::int64_t mi = best_i[threadIdx.x];
      if (oi >= 0 &&
          (mi < 0 || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mi))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  const float mx = best_v[0];
  const std::int64_t best = best_i[0];
  float sum = 0.0f, shifted = 0.0f;  // shifted: the sum of z[k] - mx (label smoothing's)
  for (std::int64_t k = threadIdx.x; k < classes; k += kThreads) {
    const float e = expf(ld(z[k]) - mx);
    p[k] = e;
    sum += e;
    shifted += ld(z[k]) - mx;
  }
  sum = blockSum(sum);
  if (smoothing != 0.0f) shifted = blockSum(shifted);
  const float inv = 1.0f / sum;
  for (std::int64_t k = threadIdx.x; k < classes; k += kThreads)
    p[k] *= inv;
  if (threadIdx.x == 0) {
    const std::int32_t label = labels[row];
    RowResult r{0.0f, 0.0f, label, 0};
    if (label >= 0 && label < classes) {
      r.loss = smoothing == 0.0f ? logf(sum) - (ld(z[label]) - mx)
                                 : logf(sum) - ((1.0f - smoothing) * (ld(z[label]) - mx) +
                                                smoothing / static_cast<float>(classes) * shifted);
      r.correct = best == label ? 1.0f : 0.0f;
      r.bad_label = 0;
      r.ok = 1;
    }
    rows[row] = r;
  }
}

// One block sums the rows' results in a fixed order and finds the first bad row.
__global__ void softmaxTotalKernel(const RowResult* rows, std::int64_t n, float* metrics,
                                   int* bad) {
  float loss = 0.0f, correct = 0.0f;
  for (std::int64_t i = threadIdx.x; i < n; i += kThreads) {
    loss += rows[i].loss;
    correct += rows[i].correct;
  }
  loss = blockSum(loss);
  correct = blockSum(correct);
  if (threadIdx.x == 0) {
    metrics[0] = loss;
    metrics[1] = correct;
    bad[0] = 0;
    bad[1] = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (!rows[i].ok) {
        bad[0] = static_cast<int>(i + 1);
        bad[1] = rows[i].bad_label;
        break;
      }
    }
  }
}

template <typename I, typename T>
__global__ void softmaxBackwardKernel(const float* prob, const std::int32_t* labels, T* d, I n,
                                      I classes, float scale, float smoothing) {
  const float spread = scale * smoothing / static_cast<float>(classes);
  const float on_label = scale * (1.0f - smoothing);
  TROUPE_FOR_EACH_AS(I, i, n * classes) {
    const I row = i / classes, k = i % classes;
    const std::int32_t label = labels[row];
    if (label < 0 || label >= classes) {
      d[i] = st<T>(0.0f);
    } else {
      d[i] = st<T>(scale * prob[i] - spread - (k == label ? on_label : 0.0f));
    }
  }
}

template <typename I, typename T>
__global__ void addRowVectorKernel(T* y, const T* b, I rows, I cols) {
  TROUPE_FOR_EACH_AS(I, i, rows * cols) y[i] = st<T>(ld(y[i]) + ld(b[i % cols]));
}

template <typename T>
__global__ void sumRowsKernel(const T* dy, T* db, std::int64_t rows, std::int64_t cols) {
  TROUPE_FOR_EACH(j, cols) {
    float s = 0.0f;
    for (std::int64_t i = 0; i < rows; ++i)
      s += ld(dy[i * cols + j]);
    db[j] = st<T>(s);
  }
}

// y[i] += b[channel of i]: NCHW (channels_last false) or NHWC.
template <typename I, typename T>
__global__ void channelBiasKernel(T* y, const T* b, I total, I channels, I spatial,
                                  bool channels_last) {
  TROUPE_FOR_EACH_AS(I, i, total) {
    const I c = channels_last ? i % channels : i / spatial % channels;
    y[i] = st<T>(ld(y[i]) + ld(b[c]));
  }
}

// One block per channel: the sum over images and the plane, lane-strided, then a fixed tree.
template <typename I, typename T>
__global__ void channelBiasGradientKernel(const T* dy, T* db, I n, I channels, I spatial,
                                          bool channels_last) {
  const I c = static_cast<I>(blockIdx.x);
  const I count = n * spatial;
  float s = 0.0f;
  for (I q = static_cast<I>(threadIdx.x); q < count; q += kThreads) {
    const I i =
        channels_last ? q * channels + c : (q / spatial * channels + c) * spatial + q % spatial;
    s += ld(dy[i]);
  }
  s = blockSum(s);
  if (threadIdx.x == 0) db[c] = st<T>(s);
}

// ---- batch norm in troupe's own kernels (batchNormForward, batchNormBackward) ----
//
// A channel's elements are numbered q in [0, n * spatial): image q / spatial, position q % spatial.
// Statistics kernels take a grid of channels x parts, each block summing in double a chunk of its
// channel's elements; the finalize kernels add a channel's parts in order (the same bits every
// run).

// n / d for one d, by a multiply and a shift where n is 32-bit (the GPU has no integer divide: a
// 32-bit one takes about 20 instructions, as much as an element-wise kernel's budget for a whole
// element); a 64-bit n divides. Granlund and Montgomery's magic number, for 0 <= n < 2^31 and
// 1 <= d < 2^31: shift = ceil(log2 d), magic = 2^32 (2^shift - d) / d + 1, and n / d =
// (umulhi(n, magic) + n) >> shift.
template <typename I>
struct Divisor {
  I d = 1;
  Divisor() = default;
  explicit Divisor(I divisor) : d(divisor) {}
  __device__ I div(I n) const { return n / d; }
};
template <>
struct Divisor<std::int32_t> {
  std::int32_t d = 1;
  std::uint32_t magic = 1, shift = 0;
  Divisor() = default;
  explicit Divisor(std::int32_t divisor) : d(divisor) {
    while ((std::uint64_t{1} << shift) < static_cast<std::uint64_t>(divisor))
      ++shift;
    magic = static_cast<std::uint32_t>(
        (std::uint64_t{1} << 32) * ((std::uint64_t{1} << shift) - static_cast<std::uint64_t>(d)) /
            static_cast<std::uint64_t>(d) +
        1);
  }
  __device__ std::int32_t div(std::int32_t n) const {
    const std::uint32_t u = static_cast<std::uint32_t>(n);
    return static_cast<std::int32_t>((__umulhi(u, magic) + u) >> shift);
  }
};

// A batch norm's tensor's layout: which element is a channel's q-th, and whose channel an element
// is, without a divide (Divisor).
template <typename I>
struct ChannelLayout {
  I channels, spatial;
  bool channels_last;
  Divisor<I> by_channels, by_spatial;
  ChannelLayout(I c, I s, bool last)
      : channels(c), spatial(s), channels_last(last), by_channels(c), by_spatial(s) {}
  __device__ I element(I q, I c) const {
    if (channels_last) return q * channels + c;
    const I image = by_spatial.div(q);
    return (image * channels + c) * spatial + (q - image * spatial);
  }
  __device__ I channelOf(I i) const {
    if (channels_last) return i - by_channels.div(i) * channels;
    const I plane = by_spatial.div(i);
    return plane - by_channels.div(plane) * channels;
  }
};

// Block (channel c, part)'s sums of fn(i, c)'s two values over its chunk of the channel's
// elements i, into partial[c][part].
template <typename I, typename Fn>
__device__ void bnPartSums(double* partial, I count, const ChannelLayout<I>& layout, I chunk,
                           Fn fn) {
  const I c = static_cast<I>(blockIdx.x), part = static_cast<I>(blockIdx.y);
  const I begin = part * chunk, end = begin + chunk < count ? begin + chunk : count;
  double first = 0.0, second = 0.0;
  I q = begin + static_cast<I>(threadIdx.x);
  // Four elements a round, their loads issued before their sums (one load at a time in flight
  // would leave HBM idle), then the rest one by one.
  for (; q + 3 * kThreads < end; q += 4 * kThreads) {
    double2 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      v[k] = fn(layout.element(q + k * kThreads, c), c);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      first += v[k].x;
      second += v[k].y;
    }
  }
  for (; q < end; q += kThreads) {
    const double2 v = fn(layout.element(q, c), c);
    first += v.x;
    second += v.y;
  }
  first = blockSum(first);
  second = blockSum(second);
  if (threadIdx.x == 0) {
    double* out = partial + 2 * (static_cast<std::int64_t>(c) * gridDim.y + part);
    out[0] = first;
    out[1] = second;
  }
}
// A channel's two sums, its parts added in order.
__device__ inline double2 bnChannelSums(const double* partial, int parts, std::int64_t c) {
  double2 total{0.0, 0.0};
  for (int p = 0; p < parts; ++p) {
    total.x += partial[2 * (c * parts + p)];
    total.y += partial[2 * (c * parts + p) + 1];
  }
  return total;
}

// A channel's first element: what its sums are taken from (x - pivot), so that E[x^2] - E[x]^2
// loses nothing to a mean far from 0 against the spread.
template <typename I, typename T>
__device__ inline double bnPivot(const T* x, I c, const ChannelLayout<I>& layout) {
  return ld(x[layout.element(I{0}, c)]);
}

// Each channel's sum of x - pivot and of its square.
template <typename I, typename T>
__global__ void bnStatsKernel(const T* x, double* partial, I count, ChannelLayout<I> layout,
                              I chunk) {
  const double pivot = bnPivot(x, static_cast<I>(blockIdx.x), layout);
  bnPartSums(partial, count, layout, chunk, [&](I i, I) {
    const double v = ld(x[i]) - pivot;
    return double2{v, v * v};
  });
}

// mean, invstd and the running statistics as the CPU op (kernels/cpu/batch_norm_op.cc: unbiased
// running variance), and coef = {gamma * invstd, beta - mean * gamma * invstd} a channel, the
// forward's y = x coef[0] + coef[1] (which the backward's mask recomputes).
template <typename I, typename T>
__global__ void bnForwardFinalizeKernel(const T* x, const double* partial, int parts,
                                        ChannelLayout<I> layout, double count, float momentum,
                                        float eps, const float* gamma, const float* beta,
                                        float* running_mean, float* running_var, float* mean,
                                        float* invstd, float* coef) {
  TROUPE_FOR_EACH_AS(I, c, layout.channels) {
    const double2 sums = bnChannelSums(partial, parts, c);
    const double shift = sums.x / count;  // of the mean from the pivot
    const double m = bnPivot(x, c, layout) + shift;
    const double var = sums.y / count - shift * shift > 0.0 ? sums.y / count - shift * shift : 0.0;
    const float mf = static_cast<float>(m);
    const float is = static_cast<float>(1.0 / sqrt(var + eps));
    mean[c] = mf;
    invstd[c] = is;
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    running_mean[c] = static_cast<float>((1.0 - momentum) * running_mean[c] + momentum * m);
    running_var[c] = static_cast<float>((1.0 - momentum) * running_var[c] + momentum * unbiased);
    const float a = __fmul_rn(gamma[c], is);
    coef[2 * c] = a;
    coef[2 * c + 1] = __fsub_rn(beta[c], __fmul_rn(mf, a));
  }
}

// The forward's value before its ReLU, rounded to T as y is: the same bits in the forward and in
// the backward's mask (explicit roundings, no contraction the compiler could choose otherwise).
__device__ inline float bnValue(float x, const float* coef, std::int64_t c) {
  return __fmaf_rn(x, coef[2 * c], coef[2 * c + 1]);
}

template <typename I, typename T>
__global__ void bnApplyKernel(const T* x, const T* z, const float* coef, T* y, I total,
                              ChannelLayout<I> layout, bool relu) {
  TROUPE_FOR_EACH_AS(I, i, total) {
    const I c = layout.channelOf(i);
    float v = bnValue(ld(x[i]), coef, c);
    if (z) v = __fadd_rn(v, ld(z[i]));
    if (relu) v = v < 0.0f ? 0.0f : v;  // NaN passes, as the ReLU op's
    y[i] = st<T>(v);
  }
}

// dy where the forward's output was above 0: recomputed from x (a ReLU without add), read from y
// (with add, whose z the backward does not have), or dy itself (no ReLU).
enum class BnMask { kNone, kFromX, kFromY };
template <typename T>
__device__ inline float bnMasked(BnMask mask, const T* x, const T* y, const T* dy,
                                 const float* coef, std::int64_t i, std::int64_t c) {
  const float d = ld(dy[i]);
  if (mask == BnMask::kFromX) return ld(st<T>(bnValue(ld(x[i]), coef, c))) > 0.0f ? d : 0.0f;
  if (mask == BnMask::kFromY) return ld(y[i]) > 0.0f ? d : 0.0f;
  return d;
}

// Each channel's sum of the masked dy, and of it times x - mean.
template <typename I, typename T>
__global__ void bnBackwardStatsKernel(const T* x, const T* y, const T* dy, const float* coef,
                                      const float* mean, double* partial, I count,
                                      ChannelLayout<I> layout, I chunk, BnMask mask) {
  bnPartSums(partial, count, layout, chunk, [&](I i, I c) {
    const float d = bnMasked(mask, x, y, dy, coef, i, c);
    return double2{d, static_cast<double>(d) * (ld(x[i]) - mean[c])};
  });
}

// dbeta = sum of masked dy, dgamma = sum of masked dy (x - mean) * invstd, as the CPU op; back =
// {gamma invstd, dbeta / count, dgamma / count} a channel for dx.
__global__ void bnBackwardFinalizeKernel(const double* partial, int parts, std::int64_t channels,
                                         float count, const float* gamma, const float* invstd,
                                         float* dgamma, float* dbeta, float* back) {
  TROUPE_FOR_EACH(c, channels) {
    const double2 sums = bnChannelSums(partial, parts, c);
    const double sum = sums.x, products = sums.y;
    const float db = static_cast<float>(sum);
    const float dg = static_cast<float>(products) * invstd[c];
    if (dgamma) dgamma[c] = dg;
    if (dbeta) dbeta[c] = db;
    back[3 * c] = gamma[c] * invstd[c];
    back[3 * c + 1] = db / count;
    back[3 * c + 2] = dg / count;
  }
}

// dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)) of the masked dy; dz = the masked dy.
template <typename I, typename T>
__global__ void bnBackwardApplyKernel(const T* x, const T* y, const T* dy, const float* coef,
                                      const float* mean, const float* invstd, const float* back,
                                      T* dx, T* dz, I total, ChannelLayout<I> layout, BnMask mask) {
  TROUPE_FOR_EACH_AS(I, i, total) {
    const I c = layout.channelOf(i);
    const float d = bnMasked(mask, x, y, dy, coef, i, c);
    if (dz) dz[i] = st<T>(d);
    if (dx) {
      const float xhat = (ld(x[i]) - mean[c]) * invstd[c];
      dx[i] = st<T>(back[3 * c] * (d - back[3 * c + 1] - xhat * back[3 * c + 2]));
    }
  }
}

}  // namespace

// The element type of an activation tensor, as a template argument.
#define TROUPE_TYPED(dtype, ...)   \
  dispatch(dtype, [&](auto zero) { \
    using T = decltype(zero);      \
    __VA_ARGS__;                   \
  })
// The index type for `largest` elements (indexed()), as a template argument.
#define TROUPE_INDEXED(largest, ...)      \
  indexed(largest, [&](auto index_zero) { \
    using I = decltype(index_zero);       \
    __VA_ARGS__;                          \
  })

// Queues kernel<<<blocks, kThreads, 0, stream>>>(args...), then checks the launch (`name` in the
// error).
template <typename... Params, typename... Args>
void launch(const char* name, unsigned blocks, cudaStream_t stream, void (*kernel)(Params...),
            Args... args) {
  kernel<<<blocks, kThreads, 0, stream>>>(static_cast<Params>(args)...);
  checkLaunch(name, __FILE__, __LINE__);
}

void fill(DType t, void* p, std::int64_t n, float value, cudaStream_t stream) {
  if (n > 0)
    TROUPE_TYPED(
        t, launch("fillKernel", blocksFor(n), stream, fillKernel<T>, static_cast<T*>(p), n, value));
}
void axpy(DType t, float alpha, const void* x, void* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, launch("axpyKernel", blocksFor(n), stream, axpyKernel<T>, alpha,
                           static_cast<const T*>(x), static_cast<T*>(y), n));
  }
}
void scale(DType t, void* p, float alpha, std::int64_t n, cudaStream_t stream) {
  if (n > 0)
    TROUPE_TYPED(t, launch("scaleKernel", blocksFor(n), stream, scaleKernel<T>, static_cast<T*>(p),
                           alpha, n));
}
void cast(DType from, const void* in, DType to, void* out, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(from, [&](auto a) {
    using From = decltype(a);
    dispatch(to, [&](auto b) {
      using To = decltype(b);
      launch("castKernel", blocksFor(n), stream, castKernel<From, To>, static_cast<const From*>(in),
             static_cast<To*>(out), n);
    });
  });
}
void nonFinite(const float* p, std::int64_t n, int* bad, cudaStream_t stream) {
  if (n > 0) launch("nonFiniteKernel", blocksFor(n), stream, nonFiniteKernel, p, n, bad);
}
void normalise(const std::uint8_t* in, float* out, std::int64_t planes, std::int64_t channels,
               std::int64_t plane, const ChannelValues& values, cudaStream_t stream) {
  const std::int64_t n = planes * plane;
  if (n > 0) {
    TROUPE_INDEXED(
        n, launch("normaliseKernel", blocksFor(n), stream, normaliseKernel<I>, in, out,
                  static_cast<I>(n), static_cast<I>(channels), static_cast<I>(plane), values));
  }
}
void sgd(float* w, const float* g, float* v, std::int64_t n, float lr, float momentum,
         float weight_decay, bool nesterov, int* bad, cudaStream_t stream) {
  if (n > 0) {
    launch("sgdKernel", blocksFor(n), stream, sgdKernel, w, g, v, n, lr, momentum, weight_decay,
           nesterov, bad);
  }
}
void sgdExcept(float* w, const float* g, float* v, std::int64_t n, float lr, float momentum,
               float weight_decay, bool nesterov,
               const std::vector<std::pair<std::int64_t, std::int64_t>>& no_decay, int* bad,
               cudaStream_t stream) {
  // Each launch takes up to kMaxRanges ranges and the elements from the end of the last launch's
  // ranges to the beginning of the next launch's (or n).
  std::size_t k = 0;
  std::int64_t from = 0;
  do {
    DecayRanges r;
    for (; k < no_decay.size() && r.count < DecayRanges::kMaxRanges; ++k, ++r.count) {
      r.begin[r.count] = no_decay[k].first - from;
      r.end[r.count] = no_decay[k].second - from;
    }
    const std::int64_t to = k < no_decay.size() ? no_decay[k].first : n;
    if (to > from) {
      launch("sgdExceptKernel", blocksFor(to - from), stream, sgdExceptKernel, w + from, g + from,
             v + from, to - from, lr, momentum, weight_decay, nesterov, r, bad);
    }
    from = to;
  } while (k < no_decay.size());
}
void reluForward(DType t, const void* x, void* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, launch("reluForwardKernel", blocksFor(n), stream, reluForwardKernel<T>,
                           static_cast<const T*>(x), static_cast<T*>(y), n));
  }
}
void reluBackward(DType t, const void* y, const void* dy, void* dx, std::int64_t n,
                  cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(
        t, launch("reluBackwardKernel", blocksFor(n), stream, reluBackwardKernel<T>,
                  static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), n));
  }
}
void dropoutForward(DType t, const void* x, void* y, float* mask, std::int64_t n, float ratio,
                    std::uint64_t seed, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, launch("dropoutForwardKernel", blocksFor(n), stream, dropoutForwardKernel<T>,
                           static_cast<const T*>(x), static_cast<T*>(y), mask, n, ratio,
                           1.0f / (1.0f - ratio), seed));
  }
}
void multiply(DType t, const void* a, const float* b, void* y, std::int64_t n,
              cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, launch("multiplyKernel", blocksFor(n), stream, multiplyKernel<T>,
                           static_cast<const T*>(a), b, static_cast<T*>(y), n));
  }
}
void add(DType t, const void* a, const void* b, void* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t,
                 launch("addKernel", blocksFor(n), stream, addKernel<T>, static_cast<const T*>(a),
                        static_cast<const T*>(b), static_cast<T*>(y), n));
  }
}
void addRelu(DType t, const void* a, const void* b, void* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(
        t, launch("addReluKernel", blocksFor(n), stream, addReluKernel<T>, static_cast<const T*>(a),
                  static_cast<const T*>(b), static_cast<T*>(y), n));
  }
}
void globalAvgPoolForward(DType t, const void* x, void* y, std::int64_t planes,
                          std::int64_t spatial, std::int64_t channels_last, cudaStream_t stream) {
  if (planes <= 0) return;
  if (channels_last > 0) {
    TROUPE_TYPED(t, launch("globalAvgPoolForwardNhwcKernel", blocksFor(planes), stream,
                           globalAvgPoolForwardNhwcKernel<T>, static_cast<const T*>(x),
                           static_cast<T*>(y), planes, spatial, channels_last));
    return;
  }
  constexpr std::int64_t kPlanesPerBlock = kThreads / 32;
  const auto blocks = static_cast<unsigned>((planes + kPlanesPerBlock - 1) / kPlanesPerBlock);
  TROUPE_TYPED(t,
               launch("globalAvgPoolForwardKernel", blocks, stream, globalAvgPoolForwardKernel<T>,
                      static_cast<const T*>(x), static_cast<T*>(y), planes, spatial));
}
void globalAvgPoolBackward(DType t, const void* dy, void* dx, std::int64_t planes,
                           std::int64_t spatial, std::int64_t channels_last, cudaStream_t stream) {
  const std::int64_t n = planes * spatial;
  if (n > 0) {
    TROUPE_TYPED(
        t, TROUPE_INDEXED(n, launch("globalAvgPoolBackwardKernel", blocksFor(n), stream,
                                    globalAvgPoolBackwardKernel<I, T>, static_cast<const T*>(dy),
                                    static_cast<T*>(dx), static_cast<I>(n), static_cast<I>(spatial),
                                    static_cast<I>(channels_last))));
  }
}
void transpose(DType from, const void* in, DType to, void* out, std::int64_t batches,
               std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  const std::int64_t n = batches * rows * cols;
  if (n <= 0) return;
  dispatch(from, [&](auto a) {
    using From = decltype(a);
    dispatch(to, [&](auto b) {
      using To = decltype(b);
      TROUPE_INDEXED(n,
                     launch("transposeKernel", blocksFor(n), stream, transposeKernel<I, From, To>,
                            static_cast<const From*>(in), static_cast<To*>(out), static_cast<I>(n),
                            static_cast<I>(rows), static_cast<I>(cols)));
    });
  });
}
// The larger of a pooling's input and output, in elements.
static std::int64_t poolElements(const PoolShape& s) {
  return s.planes * (s.h * s.w > s.oh * s.ow ? s.h * s.w : s.oh * s.ow);
}
void poolForward(DType t, const PoolShape& s, const void* x, void* y, std::int32_t* argmax,
                 cudaStream_t stream) {
  const std::int64_t n = s.planes * s.oh * s.ow;
  if (n > 0) {
    TROUPE_TYPED(t, TROUPE_INDEXED(
                        poolElements(s),
                        launch("poolForwardKernel", blocksFor(n), stream, poolForwardKernel<I, T>,
                               Pool<I>(s), static_cast<const T*>(x), static_cast<T*>(y), argmax)));
  }
}
void poolBackward(DType t, const PoolShape& s, const void* dy, const std::int32_t* argmax, void* dx,
                  cudaStream_t stream) {
  const std::int64_t n = s.planes * s.h * s.w;
  if (n > 0) {
    TROUPE_TYPED(t, TROUPE_INDEXED(poolElements(s),
                                   launch("poolBackwardKernel", blocksFor(n), stream,
                                          poolBackwardKernel<I, T>, Pool<I>(s),
                                          static_cast<const T*>(dy), argmax, static_cast<T*>(dx))));
  }
}
void softmaxLossForward(DType t, const void* logits, const std::int32_t* labels, float* prob,
                        float* metrics, int* bad, void* rows, std::int64_t n, std::int64_t classes,
                        float smoothing, cudaStream_t stream) {
  auto* results = static_cast<RowResult*>(rows);
  static_assert(sizeof(RowResult) <= 4 * sizeof(float));
  if (n > 0) {
    TROUPE_TYPED(t,
                 launch("softmaxRowKernel", static_cast<unsigned>(n), stream, softmaxRowKernel<T>,
                        static_cast<const T*>(logits), labels, prob, results, classes, smoothing));
  }
  launch("softmaxTotalKernel", 1, stream, softmaxTotalKernel, results, n, metrics, bad);
}
void softmaxLossBackward(DType t, const float* prob, const std::int32_t* labels, void* dlogits,
                         std::int64_t n, std::int64_t classes, float scale, float smoothing,
                         cudaStream_t stream) {
  const std::int64_t total = n * classes;
  if (total > 0) {
    TROUPE_TYPED(t, TROUPE_INDEXED(total, launch("softmaxBackwardKernel", blocksFor(total), stream,
                                                 softmaxBackwardKernel<I, T>, prob, labels,
                                                 static_cast<T*>(dlogits), static_cast<I>(n),
                                                 static_cast<I>(classes), scale, smoothing)));
  }
}
void addRowVector(DType t, void* y, const void* b, std::int64_t rows, std::int64_t cols,
                  cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  if (n > 0) {
    TROUPE_TYPED(t, TROUPE_INDEXED(n, launch("addRowVectorKernel", blocksFor(n), stream,
                                             addRowVectorKernel<I, T>, static_cast<T*>(y),
                                             static_cast<const T*>(b), static_cast<I>(rows),
                                             static_cast<I>(cols))));
  }
}
void sumRows(DType t, const void* dy, void* db, std::int64_t rows, std::int64_t cols,
             cudaStream_t stream) {
  if (cols > 0) {
    TROUPE_TYPED(t, launch("sumRowsKernel", blocksFor(cols), stream, sumRowsKernel<T>,
                           static_cast<const T*>(dy), static_cast<T*>(db), rows, cols));
  }
}

void channelBias(DType t, void* y, const void* b, std::int64_t n, std::int64_t channels,
                 std::int64_t spatial, bool channels_last, cudaStream_t stream) {
  const std::int64_t total = n * channels * spatial;
  if (total > 0) {
    TROUPE_TYPED(
        t, TROUPE_INDEXED(
               total, launch("channelBiasKernel", blocksFor(total), stream, channelBiasKernel<I, T>,
                             static_cast<T*>(y), static_cast<const T*>(b), static_cast<I>(total),
                             static_cast<I>(channels), static_cast<I>(spatial), channels_last)));
  }
}
void channelBiasGradient(DType t, const void* dy, void* db, std::int64_t n, std::int64_t channels,
                         std::int64_t spatial, bool channels_last, cudaStream_t stream) {
  if (channels <= 0) return;
  if (n * spatial <= 0) {
    fill(t, db, channels, 0.0f, stream);
    return;
  }
  TROUPE_TYPED(
      t, TROUPE_INDEXED(n * channels * spatial,
                        launch("channelBiasGradientKernel", static_cast<unsigned>(channels), stream,
                               channelBiasGradientKernel<I, T>, static_cast<const T*>(dy),
                               static_cast<T*>(db), static_cast<I>(n), static_cast<I>(channels),
                               static_cast<I>(spatial), channels_last)));
}

}  // namespace troupe::kernels::cuda

namespace troupe::kernels::cuda {
namespace {

// Parts a channel's statistics are split into: about 16 blocks an SM in all (132 SMs), enough
// loads in flight for HBM, and no part under 1024 elements.
int bnParts(const BatchNormShape& s) {
  const std::int64_t count = s.n * s.spatial;
  std::int64_t parts = (16 * 132 + s.channels - 1) / s.channels;
  parts = std::min(parts, std::max<std::int64_t>(1, count / 1024));
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(parts, 1024)));
}

template <typename Kernel, typename... Args>
void launchGrid(const char* name, dim3 grid, cudaStream_t stream, Kernel kernel, Args... args) {
  kernel<<<grid, kThreads, 0, stream>>>(args...);
  checkLaunch(name, __FILE__, __LINE__);
}

}  // namespace

std::int64_t batchNormScratch(const BatchNormShape& s) {
  return 2 * s.channels * bnParts(s);
}

void batchNormForward(DType t, const BatchNormShape& s, const void* x, const void* z,
                      const float* gamma, const float* beta, float* running_mean,
                      float* running_var, float* mean, float* invstd, float* coef, void* y,
                      double* partial, cudaStream_t stream) {
  const std::int64_t count = s.n * s.spatial, total = count * s.channels;
  if (total <= 0) return;
  const int parts = bnParts(s);
  const std::int64_t chunk = (count + parts - 1) / parts;
  const dim3 grid(static_cast<unsigned>(s.channels), static_cast<unsigned>(parts));
  TROUPE_TYPED(t, TROUPE_INDEXED(total, {
                 const ChannelLayout<I> layout(static_cast<I>(s.channels),
                                               static_cast<I>(s.spatial), s.channels_last);
                 const auto* in = static_cast<const T*>(x);
                 launchGrid("bnStatsKernel", grid, stream, bnStatsKernel<I, T>, in, partial,
                            static_cast<I>(count), layout, static_cast<I>(chunk));
                 launch("bnForwardFinalizeKernel", blocksFor(s.channels), stream,
                        bnForwardFinalizeKernel<I, T>, in, partial, parts, layout,
                        static_cast<double>(count), s.momentum, s.eps, gamma, beta, running_mean,
                        running_var, mean, invstd, coef);
                 launch("bnApplyKernel", blocksFor(total), stream, bnApplyKernel<I, T>, in,
                        static_cast<const T*>(s.add ? z : nullptr), coef, static_cast<T*>(y),
                        static_cast<I>(total), layout, s.relu);
               }));
}

void batchNormBackward(DType t, const BatchNormShape& s, const void* x, const void* y,
                       const void* dy, const float* gamma, const float* coef, const float* mean,
                       const float* invstd, void* dx, void* dz, float* dgamma, float* dbeta,
                       double* partial, float* back, cudaStream_t stream) {
  const std::int64_t count = s.n * s.spatial, total = count * s.channels;
  if (total <= 0) return;
  const int parts = bnParts(s);
  const std::int64_t chunk = (count + parts - 1) / parts;
  const BnMask mask = !s.relu ? BnMask::kNone : s.add ? BnMask::kFromY : BnMask::kFromX;
  const dim3 grid(static_cast<unsigned>(s.channels), static_cast<unsigned>(parts));
  TROUPE_TYPED(t, TROUPE_INDEXED(total, {
                 const ChannelLayout<I> layout(static_cast<I>(s.channels),
                                               static_cast<I>(s.spatial), s.channels_last);
                 const auto *in = static_cast<const T*>(x), *out = static_cast<const T*>(y),
                            *grad = static_cast<const T*>(dy);
                 launchGrid("bnBackwardStatsKernel", grid, stream, bnBackwardStatsKernel<I, T>, in,
                            out, grad, coef, mean, partial, static_cast<I>(count), layout,
                            static_cast<I>(chunk), mask);
                 launch("bnBackwardFinalizeKernel", blocksFor(s.channels), stream,
                        bnBackwardFinalizeKernel, partial, parts, s.channels,
                        static_cast<float>(count), gamma, invstd, dgamma, dbeta, back);
                 if (dx || dz) {
                   launch("bnBackwardApplyKernel", blocksFor(total), stream,
                          bnBackwardApplyKernel<I, T>, in, out, grad, coef, mean, invstd, back,
                          static_cast<T*>(dx), static_cast<T*>(s.add ? dz : nullptr),
                          static_cast<I>(total), layout, mask);
                 }
               }));
}

}  // namespace troupe::kernels::cuda
