// Max and average pooling as direct loops over (image, channel) planes; max pooling remembers the
// arg max of each window for its backward.
#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace cpu {
namespace {

class CpuPool final : public PoolOp {
 public:
  CpuPool(const PoolGeometry& g, int threads)
      : g_(g), threads_(threads), oh_(g.outHeight()), ow_(g.outWidth()) {
    TROUPE_ENFORCE(oh_ > 0 && ow_ > 0, "pooling output of ", oh_, "x", ow_);
    if (g.method == PoolMethod::kMax) argmax_.resize(g.n * g.channels * oh_ * ow_);
  }

  void forward(const Tensor& x, const Tensor& y) override {
    prepare(x, y);
    const float* xp = x.f32();
    float* yp = y.f32();
    const auto [planes, h, w, k, s, pad] = dims();
    const bool fast =
        g_.method == PoolMethod::kMax && k == 2 && s == 2 && pad == 0 && h % 2 == 0 && w % 2 == 0;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (std::int64_t pl = 0; pl < planes; ++pl) {
      const float* in = xp + pl * h * w;
      float* out = yp + pl * oh_ * ow_;
      std::int32_t* am = argmax_.empty() ? nullptr : argmax_.data() + pl * oh_ * ow_;
      if (fast) {
        vec::maxPool2x2(in, out, am, h, w);
        continue;
      }
      for (std::int64_t oy = 0; oy < oh_; ++oy) {
        const std::int64_t y0 = oy * s - pad, y1 = std::min(y0 + k, h + pad);
        for (std::int64_t ox = 0; ox < ow_; ++ox) {
          const std::int64_t x0 = ox * s - pad, x1 = std::min(x0 + k, w + pad);
          if (g_.method == PoolMethod::kMax) {
            float v = -std::numeric_limits<float>::infinity();
            std::int64_t best = -1;
            for (std::int64_t iy = std::max<std::int64_t>(y0, 0); iy < std::min(y1, h); ++iy)
              for (std::int64_t ix = std::max<std::int64_t>(x0, 0); ix < std::min(x1, w); ++ix)
                if (best < 0 || in[iy * w + ix] > v) v = in[iy * w + ix], best = iy * w + ix;
            out[oy * ow_ + ox] = v;
            am[oy * ow_ + ox] = static_cast<std::int32_t>(best);
          } else {
            const float scale = 1.0f / static_cast<float>((y1 - y0) * (x1 - x0));
            float sum = 0.0f;
            for (std::int64_t iy = std::max<std::int64_t>(y0, 0); iy < std::min(y1, h); ++iy)
              for (std::int64_t ix = std::max<std::int64_t>(x0, 0); ix < std::min(x1, w); ++ix)
                sum += in[iy * w + ix];
            out[oy * ow_ + ox] = sum * scale;
          }
        }
      }
    }
  }

  void backward(const Tensor& dy, const Tensor& dx) override {
    prepare(dx, dy);
    const float* dyp = dy.f32();
    float* dxp = dx.f32();
    const auto [planes, h, w, k, s, pad] = dims();
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (std::int64_t pl = 0; pl < planes; ++pl) {
      float* out = dxp + pl * h * w;
      const float* in = dyp + pl * oh_ * ow_;
      std::fill(out, out + h * w, 0.0f);
      if (g_.method == PoolMethod::kMax) {
        const std::int32_t* am = argmax_.data() + pl * oh_ * ow_;
        for (std::int64_t i = 0; i < oh_ * ow_; ++i)
          out[am[i]] += in[i];
        continue;
      }
      for (std::int64_t oy = 0; oy < oh_; ++oy) {
        const std::int64_t y0 = oy * s - pad, y1 = std::min(y0 + k, h + pad);
        for (std::int64_t ox = 0; ox < ow_; ++ox) {
          const std::int64_t x0 = ox * s - pad, x1 = std::min(x0 + k, w + pad);
          const float v = in[oy * ow_ + ox] / static_cast<float>((y1 - y0) * (x1 - x0));
          for (std::int64_t iy = std::max<std::int64_t>(y0, 0); iy < std::min(y1, h); ++iy)
            for (std::int64_t ix = std::max<std::int64_t>(x0, 0); ix < std::min(x1, w); ++ix)
              out[iy * w + ix] += v;
        }
      }
    }
  }

 private:
  // Checks the sizes of a call's input (or its gradient) x and output y, and sets the threads.
  void prepare(const Tensor& x, const Tensor& y) const {
    TROUPE_ENFORCE_EQ(x.numel(), g_.n * g_.channels * g_.height * g_.width);
    TROUPE_ENFORCE_EQ(y.numel(), g_.n * g_.channels * oh_ * ow_);
    useThreads(threads_);
  }
  // The planes (images x channels), a plane's height and width, the window, stride and padding.
  std::array<std::int64_t, 6> dims() const {
    return {g_.n * g_.channels, g_.height, g_.width, g_.kernel, g_.stride, g_.pad};
  }

  PoolGeometry g_;
  int threads_;
  std::int64_t oh_, ow_;
  std::vector<std::int32_t> argmax_;
};

}  // namespace

std::unique_ptr<PoolOp> makePool(const PoolGeometry& g, int threads) {
  TROUPE_ENFORCE(
      g.n > 0 && g.channels > 0 && g.kernel > 0 && g.stride > 0 && g.pad >= 0 && g.pad < g.kernel,
      "bad pooling geometry");
  return std::make_unique<CpuPool>(g, threads);
}

}  // namespace cpu
}  // namespace troupe::kernels
