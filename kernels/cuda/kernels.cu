// troupe's own CUDA kernels (kernels/cuda/kernels.h). Element-wise kernels are grid-stride loops;
// reductions run in a fixed order, so that a run repeats to the bit.
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

#define TROUPE_FOR_EACH(i, n)                                                                      \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

__global__ void fillKernel(float* p, std::int64_t n, float value) {
  TROUPE_FOR_EACH(i, n) p[i] = value;
}

__global__ void axpyKernel(float alpha, const float* x, float* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] += alpha * x[i];
}

__global__ void scaleKernel(float* p, float alpha, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) p[i] *= alpha;
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

__global__ void reluForwardKernel(const float* x, float* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void reluBackwardKernel(const float* y, const float* dy, float* dx, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void dropoutForwardKernel(const float* x, float* y, float* mask, std::int64_t n,
                                     float ratio, float keep, std::uint64_t seed) {
  TROUPE_FOR_EACH(i, n) {
    const float m =
        uniform01(randomBits(seed, 0, static_cast<std::uint64_t>(i))) < ratio ? 0.0f : keep;
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void multiplyKernel(const float* a, const float* b, float* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] = a[i] * b[i];
}

__global__ void addKernel(const float* a, const float* b, float* y, std::int64_t n) {
  TROUPE_FOR_EACH(i, n) y[i] = a[i] + b[i];
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
__global__ void globalAvgPoolForwardKernel(const float* x, float* y, std::int64_t spatial) {
  const float* in = x + blockIdx.x * spatial;
  float s = 0.0f;
  for (std::int64_t q = threadIdx.x; q < spatial; q += kThreads)
    s += in[q];
  s = blockSum(s);
  if (threadIdx.x == 0) y[blockIdx.x] = s / static_cast<float>(spatial);
}

__global__ void globalAvgPoolBackwardKernel(const float* dy, float* dx, std::int64_t n,
                                            std::int64_t spatial) {
  const float inv = 1.0f / static_cast<float>(spatial);
  TROUPE_FOR_EACH(i, n) dx[i] = dy[i / spatial] * inv;
}

__global__ void poolForwardKernel(PoolShape s, const float* x, float* y, std::int32_t* argmax) {
  const std::int64_t n = s.planes * s.oh * s.ow;
  TROUPE_FOR_EACH(i, n) {
    const std::int64_t ox = i % s.ow, oy = (i / s.ow) % s.oh, plane = i / (s.ow * s.oh);
    const float* in = x + plane * s.h * s.w;
    const std::int64_t y0 = oy * s.stride - s.pad, x0 = ox * s.stride - s.pad;
    const std::int64_t y1 = min(y0 + s.kernel, s.h + s.pad), x1 = min(x0 + s.kernel, s.w + s.pad);
    const std::int64_t ya = max(y0, std::int64_t{0}), yb = min(y1, s.h);
    const std::int64_t xa = max(x0, std::int64_t{0}), xb = min(x1, s.w);
    if (s.max) {
      float v = -FLT_MAX;
      std::int64_t best = -1;
      for (std::int64_t iy = ya; iy < yb; ++iy)
        for (std::int64_t ix = xa; ix < xb; ++ix)
          if (best < 0 || in[iy * s.w + ix] > v) v = in[iy * s.w + ix], best = iy * s.w + ix;
      y[i] = v;
      argmax[i] = static_cast<std::int32_t>(best);
    } else {
      float sum = 0.0f;
      for (std::int64_t iy = ya; iy < yb; ++iy)
        for (std::int64_t ix = xa; ix < xb; ++ix)
          sum += in[iy * s.w + ix];
      y[i] = sum * (1.0f / static_cast<float>((y1 - y0) * (x1 - x0)));
    }
  }
}

// One thread per input element gathers from the windows that hold it (no atomics).
__global__ void poolBackwardKernel(PoolShape s, const float* dy, const std::int32_t* argmax,
                                   float* dx) {
  const std::int64_t n = s.planes * s.h * s.w;
  TROUPE_FOR_EACH(i, n) {
    const std::int64_t ix = i % s.w, iy = (i / s.w) % s.h, plane = i / (s.w * s.h);
    // Windows oy with oy * stride - pad <= iy < oy * stride - pad + kernel.
    const std::int64_t oy_lo = max(std::int64_t{0}, (iy + s.pad - s.kernel + s.stride) / s.stride);
    const std::int64_t oy_hi = min(s.oh - 1, (iy + s.pad) / s.stride);
    const std::int64_t ox_lo = max(std::int64_t{0}, (ix + s.pad - s.kernel + s.stride) / s.stride);
    const std::int64_t ox_hi = min(s.ow - 1, (ix + s.pad) / s.stride);
    const std::int64_t base = plane * s.oh * s.ow;
    float sum = 0.0f;
    for (std::int64_t oy = oy_lo; oy <= oy_hi; ++oy) {
      for (std::int64_t ox = ox_lo; ox <= ox_hi; ++ox) {
        const std::int64_t o = base + oy * s.ow + ox;
        if (s.max) {
          if (argmax[o] == iy * s.w + ix) sum += dy[o];
        } else {
          const std::int64_t y0 = oy * s.stride - s.pad, x0 = ox * s.stride - s.pad;
          const std::int64_t y1 = min(y0 + s.kernel, s.h + s.pad);
          const std::int64_t x1 = min(x0 + s.kernel, s.w + s.pad);
          sum += dy[o] / static_cast<float>((y1 - y0) * (x1 - x0));
        }
      }
    }
    dx[i] = sum;
  }
}

struct RowResult {
  float loss, correct;
  int bad_label;  // the label, when outside [0, classes); else 0 with ok set
  int ok;
};

// One block per row: max (the first arg max, as the CPU's strict >), sum of exponentials, loss.
__global__ void softmaxRowKernel(const float* logits, const std::int32_t* labels, float* prob,
                                 RowResult* rows, std::int64_t classes) {
  const std::int64_t row = blockIdx.x;
  const float* z = logits + row * classes;
  float* p = prob + row * classes;
  __shared__ float best_v[kThreads];
  __shared__ std::int64_t best_i[kThreads];
  float bv = -FLT_MAX;
  std::int64_t bi = -1;
  for (std::int64_t k = threadIdx.x; k < classes; k += kThreads) {
    if (bi < 0 || z[k] > bv) bv = z[k], bi = k;
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
    const float e = expf(z[k] - mx);
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
      r.loss = logf(sum) - (z[label] - mx);
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

__global__ void softmaxBackwardKernel(const float* prob, const std::int32_t* labels, float* d,
                                      std::int64_t n, std::int64_t classes, float scale) {
  TROUPE_FOR_EACH(i, n * classes) {
    const std::int64_t row = i / classes, k = i % classes;
    const std::int32_t label = labels[row];
    if (label < 0 || label >= classes) {
      d[i] = 0.0f;
    } else {
      d[i] = scale * prob[i] - (k == label ? scale : 0.0f);
    }
  }
}

__global__ void addRowVectorKernel(float* y, const float* b, std::int64_t rows, std::int64_t cols) {
  TROUPE_FOR_EACH(i, rows * cols) y[i] += b[i % cols];
}

__global__ void sumRowsKernel(const float* dy, float* db, std::int64_t rows, std::int64_t cols) {
  TROUPE_FOR_EACH(j, cols) {
    float s = 0.0f;
    for (std::int64_t i = 0; i < rows; ++i)
      s += dy[i * cols + j];
    db[j] = s;
  }
}

}  // namespace

void fill(float* p, std::int64_t n, float value, cudaStream_t stream) {
  if (n > 0) fillKernel<<<blocksFor(n), kThreads, 0, stream>>>(p, n, value);
}
void axpy(float alpha, const float* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) axpyKernel<<<blocksFor(n), kThreads, 0, stream>>>(alpha, x, y, n);
}
void scale(float* p, float alpha, std::int64_t n, cudaStream_t stream) {
  if (n > 0) scaleKernel<<<blocksFor(n), kThreads, 0, stream>>>(p, alpha, n);
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
void reluForward(const float* x, float* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) reluForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(x, y, n);
}
void reluBackward(const float* y, const float* dy, float* dx, std::int64_t n, cudaStream_t stream) {
  if (n > 0) reluBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(y, dy, dx, n);
}
void dropoutForward(const float* x, float* y, float* mask, std::int64_t n, float ratio,
                    std::uint64_t seed, cudaStream_t stream) {
  if (n > 0) {
    dropoutForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(x, y, mask, n, ratio,
                                                                1.0f / (1.0f - ratio), seed);
  }
}
void multiply(const float* a, const float* b, float* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) multiplyKernel<<<blocksFor(n), kThreads, 0, stream>>>(a, b, y, n);
}
void add(const float* a, const float* b, float* y, std::int64_t n, cudaStream_t stream) {
  if (n > 0) addKernel<<<blocksFor(n), kThreads, 0, stream>>>(a, b, y, n);
}
void globalAvgPoolForward(const float* x, float* y, std::int64_t planes, std::int64_t spatial,
                          cudaStream_t stream) {
  if (planes > 0) {
    globalAvgPoolForwardKernel<<<static_cast<unsigned>(planes), kThreads, 0, stream>>>(x, y,
                                                                                       spatial);
  }
}
void globalAvgPoolBackward(const float* dy, float* dx, std::int64_t planes, std::int64_t spatial,
                           cudaStream_t stream) {
  const std::int64_t n = planes * spatial;
  if (n > 0) globalAvgPoolBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(dy, dx, n, spatial);
}
void poolForward(const PoolShape& s, const float* x, float* y, std::int32_t* argmax,
                 cudaStream_t stream) {
  const std::int64_t n = s.planes * s.oh * s.ow;
  if (n > 0) poolForwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(s, x, y, argmax);
}
void poolBackward(const PoolShape& s, const float* dy, const std::int32_t* argmax, float* dx,
                  cudaStream_t stream) {
  const std::int64_t n = s.planes * s.h * s.w;
  if (n > 0) poolBackwardKernel<<<blocksFor(n), kThreads, 0, stream>>>(s, dy, argmax, dx);
}
void softmaxLossForward(const float* logits, const std::int32_t* labels, float* prob,
                        float* metrics, int* bad, void* rows, std::int64_t n, std::int64_t classes,
                        cudaStream_t stream) {
  auto* results = static_cast<RowResult*>(rows);
  static_assert(sizeof(RowResult) <= 4 * sizeof(float));
  if (n > 0) {
    softmaxRowKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(logits, labels, prob,
                                                                        results, classes);
  }
  softmaxTotalKernel<<<1, kThreads, 0, stream>>>(results, n, metrics, bad);
}
void softmaxLossBackward(const float* prob, const std::int32_t* labels, float* dlogits,
                         std::int64_t n, std::int64_t classes, float scale, cudaStream_t stream) {
  if (n * classes > 0) {
    softmaxBackwardKernel<<<blocksFor(n * classes), kThreads, 0, stream>>>(prob, labels, dlogits, n,
                                                                           classes, scale);
  }
}
void addRowVector(float* y, const float* b, std::int64_t rows, std::int64_t cols,
                  cudaStream_t stream) {
  if (rows * cols > 0) {
    addRowVectorKernel<<<blocksFor(rows * cols), kThreads, 0, stream>>>(y, b, rows, cols);
  }
}
void sumRows(const float* dy, float* db, std::int64_t rows, std::int64_t cols,
             cudaStream_t stream) {
  if (cols > 0) sumRowsKernel<<<blocksFor(cols), kThreads, 0, stream>>>(dy, db, rows, cols);
}

}  // namespace troupe::kernels::cuda
