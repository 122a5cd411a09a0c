#include "kernels/cpu/vec.h"

#include <algorithm>

namespace troupe::kernels::cpu::vec {

#define TROUPE_VEC_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

TROUPE_VEC_CLONES void reluForward(const float* __restrict x, float* __restrict y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = std::max(x[i], 0.0f);
}

TROUPE_VEC_CLONES void reluBackward(const float* __restrict y, const float* __restrict dy,
                                    float* __restrict dx, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

TROUPE_VEC_CLONES void sgd(float* __restrict w, const float* __restrict g, float* __restrict v,
                           std::int64_t n, float lr, float momentum, float weight_decay,
                           bool nesterov) {
  if (nesterov) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      const float grad = g[i] + weight_decay * w[i];
      const float vel = momentum * v[i] + grad;
      v[i] = vel;
      w[i] -= lr * (grad + momentum * vel);
    }
  } else {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) {
      const float grad = g[i] + weight_decay * w[i];
      const float vel = momentum * v[i] + grad;
      v[i] = vel;
      w[i] -= lr * vel;
    }
  }
}

TROUPE_VEC_CLONES void axpy(float alpha, const float* __restrict x, float* __restrict y,
                            std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    y[i] += alpha * x[i];
}

TROUPE_VEC_CLONES void scale(float* x, float alpha, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    x[i] *= alpha;
}

TROUPE_VEC_CLONES void add(const float* a, const float* b, float* y, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = a[i] + b[i];
}

TROUPE_VEC_CLONES void addScalar(const float* __restrict x, float bias, float* __restrict y,
                                 std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = x[i] + bias;
}

TROUPE_VEC_CLONES void addRowVector(float* __restrict y, const float* __restrict b,
                                    std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c)
      row[c] += b[c];
  }
}

TROUPE_VEC_CLONES void sumRows(const float* __restrict x, std::int64_t ld, float* __restrict s,
                               std::int64_t rows, std::int64_t cols) {
  std::fill(s, s + cols, 0.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * ld;
#pragma omp simd
    for (std::int64_t c = 0; c < cols; ++c)
      s[c] += row[c];
  }
}

TROUPE_VEC_CLONES void maxPool2x2(const float* __restrict x, float* __restrict y,
                                  std::int32_t* __restrict argmax, std::int64_t h, std::int64_t w) {
  const std::int64_t oh = h / 2, ow = w / 2;
  const std::int32_t wi = static_cast<std::int32_t>(w);
  for (std::int64_t oy = 0; oy < oh; ++oy) {
    const float* r0 = x + 2 * oy * w;
    const float* r1 = r0 + w;
    float* o = y + oy * ow;
    std::int32_t* idx = argmax + oy * ow;
    const std::int32_t base = static_cast<std::int32_t>(2 * oy * w);
#pragma omp simd
    for (std::int64_t ox = 0; ox < ow; ++ox) {
      const float a = r0[2 * ox], b = r0[2 * ox + 1], c = r1[2 * ox], d = r1[2 * ox + 1];
      // Arithmetic instead of branches: the arg max of random data is unpredictable.
      const std::int32_t ab = b > a, cd = d > c;
      const float m0 = std::max(a, b), m1 = std::max(c, d);
      const std::int32_t second = m1 > m0;
      o[ox] = std::max(m0, m1);
      idx[ox] = base + 2 * static_cast<std::int32_t>(ox) + ab + second * (wi + cd - ab);
    }
  }
}

}  // namespace troupe::kernels::cpu::vec
