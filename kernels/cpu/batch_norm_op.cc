// Batch norm over [n, channels, spatial], one channel per work item; statistics in double.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {
namespace {

class CpuBatchNorm final : public BatchNormOp {
 public:
  CpuBatchNorm(const BatchNormGeometry& g, int threads)
      : g_(g), threads_(threads), mean_(g.channels), invstd_(g.channels) {}

  void forward(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
               const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
               bool train) override {
    const std::int64_t n = g_.n, c = g_.channels, s = g_.spatial;
    TROUPE_ENFORCE_EQ(x.numel(), n * c * s);
    TROUPE_ENFORCE_EQ(y.numel(), n * c * s);
    if (g_.add) TROUPE_ENFORCE_EQ(z.numel(), n * c * s);
    const float* zp = g_.add ? z.f32() : nullptr;
    useThreads(threads_);
    const float* xp = x.f32();
    const float* gp = gamma.f32();
    const float* bp = beta.f32();
    float* rm = running_mean.f32();
    float* rv = running_var.f32();
    float* yp = y.f32();
    const double count = static_cast<double>(n * s);
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (std::int64_t ch = 0; ch < c; ++ch) {
      float mean, invstd;
      if (train) {
        double sum = 0.0, sq = 0.0;
        for (std::int64_t i = 0; i < n; ++i) {
          const float* p = xp + (i * c + ch) * s;
          float ps = 0.0f;
#pragma omp simd reduction(+ : ps)
          for (std::int64_t q = 0; q < s; ++q)
            ps += p[q];
          sum += ps;
        }
        const double m = sum / count;
        for (std::int64_t i = 0; i < n; ++i) {
          const float* p = xp + (i * c + ch) * s;
          const float mf = static_cast<float>(m);
          float ps = 0.0f;
#pragma omp simd reduction(+ : ps)
          for (std::int64_t q = 0; q < s; ++q)
            ps += (p[q] - mf) * (p[q] - mf);
          sq += ps;
        }
        const double var = sq / count;
        mean = static_cast<float>(m);
        invstd = static_cast<float>(1.0 / std::sqrt(var + g_.eps));
        mean_[ch] = mean;
        invstd_[ch] = invstd;
        const double unbiased = count > 1 ? var * count / (count - 1) : var;
        rm[ch] = static_cast<float>((1.0 - g_.momentum) * rm[ch] + g_.momentum * m);
        rv[ch] = static_cast<float>((1.0 - g_.momentum) * rv[ch] + g_.momentum * unbiased);
      } else {
        mean = rm[ch];
        invstd = 1.0f / std::sqrt(rv[ch] + g_.eps);
      }
      const float a = gp[ch] * invstd, b = bp[ch] - mean * a;
      for (std::int64_t i = 0; i < n; ++i) {
        const float* p = xp + (i * c + ch) * s;
        float* out = yp + (i * c + ch) * s;
        if (zp) {  // as the add op, then the ReLU op: each rounds as they do
          const float* zq = zp + (i * c + ch) * s;
#pragma omp simd
          for (std::int64_t q = 0; q < s; ++q)
            out[q] = std::max((p[q] * a + b) + zq[q], 0.0f);
        } else if (g_.relu) {  // as the ReLU op: std::max(v, 0)
#pragma omp simd
          for (std::int64_t q = 0; q < s; ++q)
            out[q] = std::max(p[q] * a + b, 0.0f);
        } else {
#pragma omp simd
          for (std::int64_t q = 0; q < s; ++q)
            out[q] = p[q] * a + b;
        }
      }
    }
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& dy,
                const Tensor& dx, const Tensor& dz, const Tensor& dgamma,
                const Tensor& dbeta) override {
    const std::int64_t n = g_.n, c = g_.channels, s = g_.spatial;
    TROUPE_ENFORCE_EQ(dy.numel(), n * c * s);
    useThreads(threads_);
    if (g_.relu) {
      TROUPE_ENFORCE_EQ(y.numel(), n * c * s);
      backwardOf(x, y.f32(), gamma, dy, dx, g_.add ? optionalF32(dz) : nullptr, dgamma, dbeta);
    } else {
      backwardOf(x, nullptr, gamma, dy, dx, nullptr, dgamma, dbeta);
    }
  }

 private:
  // With `yp` (relu), dy counts only where y > 0, as the ReLU op's backward writes it: each row of
  // dy is masked into a row of its own first, which the same loops as without relu then read, so
  // that the sums split and round as they would over the ReLU op's output. With `dzp` (add), that
  // masked gradient is z's too, as the add op's backward copies it.
  void backwardOf(const Tensor& x, const float* yp, const Tensor& gamma, const Tensor& dy,
                  const Tensor& dx, float* dzp, const Tensor& dgamma, const Tensor& dbeta) {
    const std::int64_t n = g_.n, c = g_.channels, s = g_.spatial;
    const auto [xp, gp, dyp] = f32s(x, gamma, dy);
    const auto [dxp, dgp, dbp] = optionalF32s(dx, dgamma, dbeta);
    const float count = static_cast<float>(n * s);
#pragma omp parallel num_threads(threads_)
    {
      // The masked row lands in dx's row, where the dx pass then reads it (each element before
      // it writes it), or in a row of this thread's where no dx is wanted.
      std::vector<float> masked(yp && !dxp ? static_cast<std::size_t>(s) : 0);
      auto maskedRow = [&](std::int64_t i, std::int64_t ch) -> const float* {
        const std::int64_t at = (i * c + ch) * s;
        if (!yp) return dyp + at;
        float* to = dxp ? dxp + at : masked.data();
        vec::reluBackward(yp + at, dyp + at, to, s);
        return to;
      };
#pragma omp for schedule(static)
      for (std::int64_t ch = 0; ch < c; ++ch) {
        const float mean = mean_[ch], invstd = invstd_[ch];
        double sdy = 0.0, sdyx = 0.0;
        for (std::int64_t i = 0; i < n; ++i) {
          const float* p = xp + (i * c + ch) * s;
          const float* d = maskedRow(i, ch);
          if (dzp) std::copy_n(d, s, dzp + (i * c + ch) * s);
          float a = 0.0f, b = 0.0f;
#pragma omp simd reduction(+ : a, b)
          for (std::int64_t q = 0; q < s; ++q) {
            a += d[q];
            b += d[q] * (p[q] - mean);
          }
          sdy += a;
          sdyx += b;
        }
        const float dbeta_c = static_cast<float>(sdy);
        const float dgamma_c = static_cast<float>(sdyx) * invstd;
        if (dgp) dgp[ch] = dgamma_c;
        if (dbp) dbp[ch] = dbeta_c;
        if (!dxp) continue;
        // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)).
        const float k = gp[ch] * invstd;
        const float mdy = dbeta_c / count, mdyx = dgamma_c / count;
        for (std::int64_t i = 0; i < n; ++i) {
          const float* p = xp + (i * c + ch) * s;
          float* out = dxp + (i * c + ch) * s;
          const float* d = yp ? out : dyp + (i * c + ch) * s;
#pragma omp simd
          for (std::int64_t q = 0; q < s; ++q)
            out[q] = k * (d[q] - mdy - (p[q] - mean) * invstd * mdyx);
        }
      }
    }
  }

  BatchNormGeometry g_;
  int threads_;
  std::vector<float> mean_, invstd_;
};

}  // namespace

std::unique_ptr<BatchNormOp> makeBatchNorm(const BatchNormGeometry& g, int threads) {
  TROUPE_ENFORCE(g.n > 0 && g.channels > 0 && g.spatial > 0, "bad batch norm geometry");
  return std::make_unique<CpuBatchNorm>(g, threads);
}

}  // namespace troupe::kernels::cpu
