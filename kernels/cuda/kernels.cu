// troupe's own CUDA kernels (kernels/cuda/kernels.h). Element-wise kernels are grid-stride loops;
// reductions run in a fixed order, so that a run repeats to the bit. Kernels over activations are
// templates on the element type T (float, __half, __nv_bfloat16): they load T, compute in float and
// round once on the store.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

__global__ void normaliseKernel(const std::uint8_t* in, float* out, std::int64_t n,
                                std::int64_t channels, std::int64_t plane, ChannelValues v) {
  TROUPE_FOR_EACH(i, n) {
    const auto c = static_cast<int>((i / plane) % channels);
    const float m = v.mean[v.means == 1 ? 0 : c];
    const float k = v.scale[v.scales == 1 ? 0 : c];
    out[i] = (static_cast<float>(in[i]) - m) * k;
  }
}

__global__ void sgdKernel(float* w, const float* g, float* v, std::int64_t n, float lr,
                          float momentum, float weight_decay, bool nesterov, int* bad) {
  bool finite = true;
  TROUPE_FOR_EACH(i, n) {
    const float grad = g[i] + weight_decay * w[i];
    const float vel = momentum * v[i] + grad;
    v[i] = vel;
    const float updated = nesterov ? w[i] - lr * (grad + momentum * vel) : w[i] - lr * vel;
    w[i] = updated;
    finite = finite && isfinite(updated);
  }
  if (__syncthreads_or(!finite) && threadIdx.x == 0) *bad = 1;
}

template <typename T>
__global__ void reluForwardKernel(const T* x, T* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] = ld(x[i]) > 0.0f ? x[i] : st<T>(0.0f);
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

// Sums a block's values in a fixed tree; every thread gets the total.
__device__ float blockSum(float v) {
  __shared__ float warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2)
    v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w)
    total += warp_sums[w];
  __syncthreads();
  return total;
}

// One block per plane.
template <typename T>
__global__ void globalAvgPoolForwardKernel(const T* x, T* y, std::int64_t spatial) {
  const T* in = x + blockIdx.x * spatial;
  float s = 0.0f;
  for (std::int64_t q = threadIdx.x; q < spatial; q += kThreads)
    s += ld(in[q]);
  s = blockSum(s);
  if (threadIdx.x == 0) y[blockIdx.x] = st<T>(s / static_cast<float>(spatial));
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
template <typename T>
__global__ void globalAvgPoolBackwardKernel(const T* dy, T* dx, std::int64_t n,
                                            std::int64_t spatial, std::int64_t channels) {
  const float inv = 1.0f / static_cast<float>(spatial);
  TROUPE_FOR_EACH(i, n) {
    const std::int64_t plane =
        channels > 0 ? i / (spatial * channels) * channels + i % channels : i / spatial;
    dx[i] = st<T>(ld(dy[plane]) * inv);
  }
}

// Where element (plane, row, col) of an image of h x w lies in memory, NCHW or NHWC.
__device__ inline std::int64_t pixelAt(std::int64_t channels_last, std::int64_t plane,
                                       std::int64_t row, std::int64_t col, std::int64_t h,
                                       std::int64_t w) {
  if (channels_last == 0) return (plane * h + row) * w + col;
  const std::int64_t n = plane / channels_last, c = plane % channels_last;
  return ((n * h + row) * w + col) * channels_last + c;
}

// The (plane, row, col) of memory index i of an image of h x w: the inverse of pixelAt, so that
// neighbouring threads touch neighbouring memory in either layout.
__device__ inline void pixelOf(std::int64_t channels_last, std::int64_t i, std::int64_t h,
                               std::int64_t w, std::int64_t& plane, std::int64_t& row,
                               std::int64_t& col) {
  if (channels_last == 0) {
    col = i % w;
    row = (i / w) % h;
    plane = i / (w * h);
    return;
  }
  const std::int64_t c = i % channels_last;
  col = (i / channels_last) % w;
  row = (i / (channels_last * w)) % h;
  plane = i / (channels_last * w * h) * channels_last + c;
}

// argmax[i] holds the within-plane index (row * w + col) of output i's maximum.
template <typename T>
__global__ void poolForwardKernel(PoolShape s, const T* x, T* y, std::int32_t* argmax) {
  const std::int64_t n = s.planes * s.oh * s.ow;
  TROUPE_FOR_EACH(i, n) {
    std::int64_t plane, oy, ox;
    pixelOf(s.channels_last, i, s.oh, s.ow, plane, oy, ox);
    const std::int64_t y0 = oy * s.stride - s.pad, x0 = ox * s.stride - s.pad;
    const std::int64_t y1 = min(y0 + s.kernel, s.h + s.pad), x1 = min(x0 + s.kernel, s.w + s.pad);
    const std::int64_t ya = max(y0, std::int64_t{0}), yb = min(y1, s.h);
    const std::int64_t xa = max(x0, std::int64_t{0}), xb = min(x1, s.w);
    if (s.max) {
      float v = -FLT_MAX;
      std::int64_t best = -1;
      for (std::int64_t iy = ya; iy < yb; ++iy) {
        for (std::int64_t ix = xa; ix < xb; ++ix) {
          const float u = ld(x[pixelAt(s.channels_last, plane, iy, ix, s.h, s.w)]);
          if (best < 0 || u > v) v = u, best = iy * s.w + ix;
        }
      }
      y[i] = st<T>(v);
      argmax[i] = static_cast<std::int32_t>(best);
    } else {
      float sum = 0.0f;
      for (std::int64_t iy = ya; iy < yb; ++iy)
        for (std::int64_t ix = xa; ix < xb; ++ix)
          sum += ld(x[pixelAt(s.channels_last, plane, iy, ix, s.h, s.w)]);
      y[i] = st<T>(sum * (1.0f / static_cast<float>((y1 - y0) * (x1 - x0))));
    }
  }
}

// One thread per input element gathers from the windows that hold it (no atomics).
template <typename T>
__global__ void poolBackwardKernel(PoolShape s, const T* dy, const std::int32_t* argmax, T* dx) {
  const std::int64_t n = s.planes * s.h * s.w;
  TROUPE_FOR_EACH(i, n) {
    std::int64_t plane, iy, ix;
    pixelOf(s.channels_last, i, s.h, s.w, plane, iy, ix);
    // Windows oy with oy * stride - pad <= iy < oy * stride - pad + kernel.
    const std::int64_t oy_lo = max(std::int64_t{0}, (iy + s.pad - s.kernel + s.stride) / s.stride);
    const std::int64_t oy_hi = min(s.oh - 1, (iy + s.pad) / s.stride);
    const std::int64_t ox_lo = max(std::int64_t{0}, (ix + s.pad - s.kernel + s.stride) / s.stride);
    const std::int64_t ox_hi = min(s.ow - 1, (ix + s.pad) / s.stride);
    float sum = 0.0f;
    for (std::int64_t oy = oy_lo; oy <= oy_hi; ++oy) {
      for (std::int64_t ox = ox_lo; ox <= ox_hi; ++ox) {
        const std::int64_t o = pixelAt(s.channels_last, plane, oy, ox, s.oh, s.ow);
        if (s.max) {
          if (argmax[o] == iy * s.w + ix) sum += ld(dy[o]);
        } else {
          const std::int64_t y0 = oy * s.stride - s.pad, x0 = ox * s.stride - s.pad;
          const std::int64_t y1 = min(y0 + s.kernel, s.h + s.pad);
          const std::int64_t x1 = min(x0 + s.kernel, s.w + s.pad);
          sum += ld(dy[o]) / static_cast<float>((y1 - y0) * (x1 - x0));
        }
      }
    }
    dx[i] = st<T>(sum);
  }
}

// out[b][j][i] = in[b][i][j]: one thread per output element, writes in order.
template <typename From, typename To>
__global__ void transposeKernel(const From* in, To* out, std::int64_t n, std::int64_t rows,
                                std::int64_t cols) {
  TROUPE_FOR_EACH(o, n) {
    const std::int64_t i = o % rows, j = (o / rows) % cols, b = o / (rows * cols);
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
                                 RowResult* rows, std::int64_t classes) {
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
  float sum = 0.0f;
  for (std::int64_t k = threadIdx.x; k < classes; k += kThreads) {
    const float e = expf(ld(z[k]) - mx);
    p[k] = e;
    sum += e;
  }
  sum = blockSum(sum);
  const float inv = 1.0f / sum;
  for (std::int64_t k = threadIdx.x; k < classes; k += kThreads)
    p[k] *= inv;
  if (threadIdx.x == 0) {
    const std::int32_t label = labels[row];
    RowResult r{0.0f, 0.0f, label, 0};
    if (label >= 0 && label < classes) {
      r.loss = logf(sum) - (ld(z[label]) - mx);
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

template <typename T>
__global__ void softmaxBackwardKernel(const float* prob, const std::int32_t* labels, T* d,
                                      std::int64_t n, std::int64_t classes, float scale) {
  TROUPE_FOR_EACH(i, n * classes) {
    const std::int64_t row = i / classes, k = i % classes;
    const std::int32_t label = labels[row];
    if (label < 0 || label >= classes) {
      d[i] = st<T>(0.0f);
    } else {
      d[i] = st<T>(scale * prob[i] - (k == label ? scale : 0.0f));
    }
  }
}

template <typename T>
__global__ void addRowVectorKernel(T* y, const T* b, std::int64_t rows, std::int64_t cols) {
  TROUPE_FOR_EACH(i, rows * cols) y[i] = st<T>(ld(y[i]) + ld(b[i % cols]));
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

}  // namespace

// The element type of an activation tensor, as a template argument.
#define TROUPE_TYPED(dtype, ...)   \
  dispatch(dtype, [&](auto zero) { \
    using T = decltype(zero);      \
    __VA_ARGS__;                   \
  })

void fill(DType t, void* p, std::int64_t n, float value, cudaStream_t stream) {
  if (n > 0)
    TROUPE_TYPED(t,
                 fillKernel<<<blocksFor(n), kThreads, 0, stream>>>(static_cast<T*>(p), n, value));
}
void axpy(DType t, float alpha, const void* x, void* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, axpyKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                        alpha, static_cast<const T*>(x), static_cast<T*>(y), n));
  }
}
void scale(DType t, void* p, float alpha, std::int64_t n, cudaStream_t stream) {
  if (n > 0)
    TROUPE_TYPED(t,
                 scaleKernel<<<blocksFor(n), kThreads, 0, stream>>>(static_cast<T*>(p), alpha, n));
}
void cast(DType from, const void* in, DType to, void* out, std::int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch(from, [&](auto a) {
    using From = decltype(a);
    dispatch(to, [&](auto b) {
      using To = decltype(b);
      castKernel<<<blocksFor(n), kThreads, 0, stream>>>(static_cast<const From*>(in),
                                                        static_cast<To*>(out), n);
    });
  });
}
void nonFinite(const float* p, std::int64_t n, int* bad, cudaStream_t stream) {
  if (n > 0) nonFiniteKernel<<<blocksFor(n), kThreads, 0, stream>>>(p, n, bad);
}
void normalise(const std::uint8_t* in, float* out, std::int64_t planes, std::int64_t channels,
               std::int64_t plane, const ChannelValues& values, cudaStream_t stream) {
  const std::int64_t n = planes * plane;
  if (n > 0) {
    normaliseKernel<<<blocksFor(n), kThreads, 0, stream>>>(in, out, n, channels, plane, values);
  }
}
void sgd(float* w, const float* g, float* v, std::int64_t n, float lr, float momentum,
         float weight_decay, bool nesterov, int* bad, cudaStream_t stream) {
  if (n > 0) {
    sgdKernel<<<blocksFor(n), kThreads, 0, stream>>>(w, g, v, n, lr, momentum, weight_decay,
                                                     nesterov, bad);
  }
}
void reluForward(DType t, const void* x, void* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, reluForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                        static_cast<const T*>(x), static_cast<T*>(y), n));
  }
}
void reluBackward(DType t, const void* y, const void* dy, void* dx, std::int64_t n,
                  cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t,
                 reluBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                     static_cast<const T*>(y), static_cast<const T*>(dy), static_cast<T*>(dx), n));
  }
}
void dropoutForward(DType t, const void* x, void* y, float* mask, std::int64_t n, float ratio,
                    std::uint64_t seed, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, dropoutForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                        static_cast<const T*>(x), static_cast<T*>(y), mask, n, ratio,
                        1.0f / (1.0f - ratio), seed));
  }
}
void multiply(DType t, const void* a, const float* b, void* y, std::int64_t n,
              cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, multiplyKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                        static_cast<const T*>(a), b, static_cast<T*>(y), n));
  }
}
void add(DType t, const void* a, const void* b, void* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) {
    TROUPE_TYPED(t, addKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                        static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(y), n));
  }
}
void globalAvgPoolForward(DType t, const void* x, void* y, std::int64_t planes,
                          std::int64_t spatial, std::int64_t channels_last, cudaStream_t stream) {
  if (planes <= 0) return;
  if (channels_last > 0) {
    TROUPE_TYPED(t,
                 globalAvgPoolForwardNhwcKernel<<<blocksFor(planes), kThreads, 0, stream>>>(
                     static_cast<const T*>(x), static_cast<T*>(y), planes, spatial, channels_last));
    return;
  }
  TROUPE_TYPED(t,
               globalAvgPoolForwardKernel<<<static_cast<unsigned>(planes), kThreads, 0, stream>>>(
                   static_cast<const T*>(x), static_cast<T*>(y), spatial));
}
void globalAvgPoolBackward(DType t, const void* dy, void* dx, std::int64_t planes,
                           std::int64_t spatial, std::int64_t channels_last, cudaStream_t stream) {
  const std::int64_t n = planes * spatial;
  if (n > 0) {
    TROUPE_TYPED(t, globalAvgPoolBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                        static_cast<const T*>(dy), static_cast<T*>(dx), n, spatial, channels_last));
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
      transposeKernel<<<blocksFor(n), kThreads, 0, stream>>>(static_cast<const From*>(in),
                                                             static_cast<To*>(out), n, rows, cols);
    });
  });
}
void poolForward(DType t, const PoolShape& s, const void* x, void* y, std::int32_t* argmax,
                 cudaStream_t stream) {
  const std::int64_t n = s.planes * s.oh * s.ow;
  if (n > 0) {
    TROUPE_TYPED(t, poolForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                        s, static_cast<const T*>(x), static_cast<T*>(y), argmax));
  }
}
void poolBackward(DType t, const PoolShape& s, const void* dy, const std::int32_t* argmax, void* dx,
                  cudaStream_t stream) {
  const std::int64_t n = s.planes * s.h * s.w;
  if (n > 0) {
    TROUPE_TYPED(t, poolBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(
                        s, static_cast<const T*>(dy), argmax, static_cast<T*>(dx)));
  }
}
void softmaxLossForward(DType t, const void* logits, const std::int32_t* labels, float* prob,
                        float* metrics, int* bad, void* rows, std::int64_t n, std::int64_t classes,
                        cudaStream_t stream) {
  auto* results = static_cast<RowResult*>(rows);
  static_assert(sizeof(RowResult) <= 4 * sizeof(float));
  if (n > 0) {
    TROUPE_TYPED(t, softmaxRowKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
                        static_cast<const T*>(logits), labels, prob, results, classes));
  }
  softmaxTotalKernel<<<1, kThreads, 0, stream>>>(results, n, metrics, bad);
}
void softmaxLossBackward(DType t, const float* prob, const std::int32_t* labels, void* dlogits,
                         std::int64_t n, std::int64_t classes, float scale, cudaStream_t stream) {
  if (n * classes > 0) {
    TROUPE_TYPED(t, softmaxBackwardKernel<<<blocksFor(n * classes), kThreads, 0, stream>>>(
                        prob, labels, static_cast<T*>(dlogits), n, classes, scale));
  }
}
void addRowVector(DType t, void* y, const void* b, std::int64_t rows, std::int64_t cols,
                  cudaStream_t stream) {
  if (rows * cols > 0) {
    TROUPE_TYPED(t, addRowVectorKernel<<<blocksFor(rows * cols), kThreads, 0, stream>>>(
                        static_cast<T*>(y), static_cast<const T*>(b), rows, cols));
  }
}
void sumRows(DType t, const void* dy, void* db, std::int64_t rows, std::int64_t cols,
             cudaStream_t stream) {
  if (cols > 0) {
    TROUPE_TYPED(t, sumRowsKernel<<<blocksFor(cols), kThreads, 0, stream>>>(
                        static_cast<const T*>(dy), static_cast<T*>(db), rows, cols));
  }
}

}  // namespace troupe::kernels::cuda
