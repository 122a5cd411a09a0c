#include <dnnl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace cpu {

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
           const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
           std::int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                          a, lda, b, ldb, beta, c, ldc);
  TROUPE_ENFORCE(status == dnnl_success, "dnnl_sgemm failed with status ", static_cast<int>(status),
                 " for ", m, "x", n, "x", k);
}

namespace {

// Below this many elements an element-wise loop runs on one thread.
constexpr std::int64_t kParallelGrain = 1 << 15;

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : threads_(threads) {}

  Device device() const override { return Device{}; }
  int threads() const override { return threads_; }

  Tensor empty(Shape shape, DType dtype) override { return Tensor::host(std::move(shape), dtype); }
  Tensor hostBuffer(Shape shape, DType dtype) override {
    return Tensor::host(std::move(shape), dtype);
  }

  void copy(const Tensor& src, const Tensor& dst) override {
    TROUPE_ENFORCE(src.dtype() == dst.dtype(), "copy between dtypes");
    TROUPE_ENFORCE_EQ(src.numel(), dst.numel());
    TROUPE_ENFORCE(src.device().kind == DeviceKind::kCpu && dst.device().kind == DeviceKind::kCpu,
                   "the CPU backend copies host tensors only");
    if (src.bytes() && src.raw() != dst.raw()) std::memmove(dst.raw(), src.raw(), src.bytes());
  }

  // The CPU computes in float32 only; it converts, for host copies of reduced-precision tensors
  // and for tests.
  void cast(const Tensor& src, const Tensor& dst) override {
    TROUPE_ENFORCE_EQ(src.numel(), dst.numel());
    TROUPE_ENFORCE(src.device().kind == DeviceKind::kCpu && dst.device().kind == DeviceKind::kCpu,
                   "the CPU backend casts host tensors only");
    const DType from = src.dtype(), to = dst.dtype();
    const auto floating = [](DType d) {
      return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16;
    };
    TROUPE_ENFORCE(floating(from) && floating(to), "cast from ", toString(from), " to ",
                   toString(to));
    const auto load = [from](const void* p, std::int64_t i) {
      switch (from) {
        case DType::kFloat16:
          return fromFloat16(static_cast<const std::uint16_t*>(p)[i]);
        case DType::kBFloat16:
          return fromBFloat16(static_cast<const std::uint16_t*>(p)[i]);
        default:
          return static_cast<const float*>(p)[i];
      }
    };
    const void* in = src.raw();
    void* out = dst.raw();
    cpu::forRanges(src.numel(), threads_, kParallelGrain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t i = b; i < e; ++i) {
        const float v = load(in, i);
        if (to == DType::kFloat16) {
          static_cast<std::uint16_t*>(out)[i] = toFloat16(v);
        } else if (to == DType::kBFloat16) {
          static_cast<std::uint16_t*>(out)[i] = toBFloat16(v);
        } else {
          static_cast<float*>(out)[i] = v;
        }
      }
    });
  }

  void transpose(const Tensor& src, const Tensor& dst, std::int64_t batches, std::int64_t rows,
                 std::int64_t cols) override {
    TROUPE_ENFORCE(src.numel() == batches * rows * cols && dst.numel() == src.numel(),
                   "a transpose of ", batches, "x", rows, "x", cols, " from ", src.numel(),
                   " into ", dst.numel(), " elements");
    // When the type changes (or dst is src), the source is cast whole into the destination's type
    // first, then its elements move.
    Tensor from = src;
    if (src.dtype() != dst.dtype() || src.raw() == dst.raw()) {
      from = Tensor::hostUninitialized(src.shape(), dst.dtype());
      cast(src, from);
    }
    const std::size_t size = sizeOf(dst.dtype());
    const auto* in = static_cast<const char*>(from.raw());
    auto* out = static_cast<char*>(dst.raw());
    for (std::int64_t b = 0; b < batches; ++b)
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j)
          std::memcpy(out + ((b * cols + j) * rows + i) * size,
                      in + ((b * rows + i) * cols + j) * size, size);
  }

  bool allFinite(const std::vector<Tensor>& tensors) override {
    bool finite = true;
    for (const Tensor& t : tensors) {
      t.f32();  // a float32 host tensor
      const auto* p = static_cast<const std::uint32_t*>(t.raw());
      cpu::forRanges(t.numel(), threads_, kParallelGrain, [&](std::int64_t b, std::int64_t e) {
        // On the bits: exponent all ones is inf or NaN (no flag of the compiler's folds it away).
        std::uint32_t worst = 0;
#pragma omp simd reduction(max : worst)
        for (std::int64_t i = b; i < e; ++i)
          worst = std::max(worst, p[i] & 0x7f800000u);
        if (worst == 0x7f800000u) {
#pragma omp atomic write
          finite = false;
        }
      });
    }
    return finite;
  }

  void fill(const Tensor& t, float value) override {
    float* p = t.f32();
    cpu::forRanges(t.numel(), threads_, kParallelGrain,
                   [&](std::int64_t b, std::int64_t e) { std::fill(p + b, p + e, value); });
  }

  void axpy(float alpha, const Tensor& x, const Tensor& y) override {
    TROUPE_ENFORCE_EQ(x.numel(), y.numel());
    const float* xp = x.f32();
    float* yp = y.f32();
    cpu::forRanges(x.numel(), threads_, kParallelGrain, [&](std::int64_t b, std::int64_t e) {
      vec::axpy(alpha, xp + b, yp + b, e - b);
    });
  }

  void scale(const Tensor& t, float alpha) override {
    float* p = t.f32();
    cpu::forRanges(t.numel(), threads_, kParallelGrain,
                   [&](std::int64_t b, std::int64_t e) { vec::scale(p + b, alpha, e - b); });
  }

  void normalise(const Tensor& bytes, const Tensor& out, const std::vector<float>& mean,
                 const std::vector<float>& scale) override {
    const NormaliseShape s = normaliseShape(bytes, out, mean, scale);
    const auto* in = static_cast<const std::uint8_t*>(bytes.raw());
    float* o = out.f32();
    const std::int64_t grain =
        std::max<std::int64_t>(1, kParallelGrain / std::max<std::int64_t>(1, s.plane));
    cpu::forRanges(s.n * s.channels, threads_, grain, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t p = b; p < e; ++p) {
        const auto c = static_cast<std::size_t>(p % s.channels);
        const float m = mean[mean.size() == 1 ? 0 : c];
        const float k = scale[scale.size() == 1 ? 0 : c];
        const std::int64_t at = p * s.plane;
#pragma omp simd
        for (std::int64_t j = 0; j < s.plane; ++j)
          o[at + j] = (static_cast<float>(in[at + j]) - m) * k;
      }
    });
  }

  void sgdUpdate(const Tensor& w, const Tensor& g, const Tensor& v, float lr, float momentum,
                 float weight_decay, bool nesterov) override {
    TROUPE_ENFORCE_EQ(w.numel(), g.numel());
    TROUPE_ENFORCE_EQ(w.numel(), v.numel());
    cpu::useThreads(threads_);
    float* wp = w.f32();
    const float* gp = g.f32();
    float* vp = v.f32();
    bool finite = true;
    cpu::forRanges(w.numel(), threads_, kParallelGrain, [&](std::int64_t b, std::int64_t e) {
      if (!vec::sgd(wp + b, gp + b, vp + b, e - b, lr, momentum, weight_decay, nesterov)) {
#pragma omp atomic write
        finite = false;
      }
    });
    updates_finite_ = updates_finite_ && finite;
  }
  void update(const UpdateKernel& kernel, const UpdateArgs& a) override {
    const std::int64_t n = a.w.numel();
    TROUPE_ENFORCE(kernel.update, "update rule ", kernel.name, " has no CPU loop");
    TROUPE_ENFORCE(a.state_offset >= 0 && a.stride >= a.state_offset + n &&
                       a.state.numel() >= kernel.states * a.stride,
                   "state of ", a.state.numel(), " values for ", kernel.states, " rows of ",
                   a.stride, " from ", a.state_offset, " (", n, " weights)");
    cpu::useThreads(threads_);
    const UpdatePlan plan = planUpdate(a, kernel.layerwise);
    std::vector<float> ratios(plan.segments.size(), 1.0f);
    for (std::size_t k = 0; k < plan.segments.size(); ++k) {
      const auto [lo, hi] = plan.segments[k];
      std::vector<double> partial(2 * static_cast<std::size_t>(threads_), 0.0);
      cpu::forRangesIndexed(hi - lo, threads_, kParallelGrain,
                            [&](int part, std::int64_t b, std::int64_t e) {
                              kernel.probe(a, lo + b, lo + e, a.scalars.weight_decay,
                                           &partial[2 * static_cast<std::size_t>(part)]);
                            });
      double ww = 0, pp = 0;
      for (std::size_t t = 0; t < partial.size(); t += 2) {
        ww += partial[t];
        pp += partial[t + 1];
      }
      ratios[k] = kernel.ratio(static_cast<float>(std::sqrt(ww)), static_cast<float>(std::sqrt(pp)),
                               a.scalars, a.scalars.weight_decay);
    }
    bool finite = true;
    for (const UpdatePiece& piece : plan.pieces) {
      const float decay = piece.decay ? a.scalars.weight_decay : 0.0f;
      const float ratio =
          piece.segment < 0 ? 1.0f : ratios[static_cast<std::size_t>(piece.segment)];
      cpu::forRanges(piece.end - piece.begin, threads_, kParallelGrain,
                     [&](std::int64_t b, std::int64_t e) {
                       if (!kernel.update(a, piece.begin + b, piece.begin + e, decay, ratio)) {
#pragma omp atomic write
                         finite = false;
                       }
                     });
    }
    updates_finite_ = updates_finite_ && finite;
  }
  double sumOfSquares(const std::vector<Tensor>& tensors) override {
    double total = 0;
    for (const Tensor& t : tensors) {
      const float* p = t.f32();
      std::vector<double> partial(static_cast<std::size_t>(threads_), 0.0);
      cpu::forRangesIndexed(t.numel(), threads_, kParallelGrain,
                            [&](int part, std::int64_t b, std::int64_t e) {
                              double sum = 0;
                              for (std::int64_t i = b; i < e; ++i)
                                sum += static_cast<double>(p[i]) * p[i];
                              partial[static_cast<std::size_t>(part)] = sum;
                            });
      for (double x : partial)
        total += x;
    }
    return total;
  }
  bool updatesFinite() override {
    const bool finite = updates_finite_;
    updates_finite_ = true;
    return finite;
  }

  void synchronize() override {}
  Event record() override {
    return Event();
  }
  Event recordTimed() override {
    return Event();
  }
  double elapsed(const Event&, const Event&) override {
    return 0;
  }
  void waitFor(const Event& e) override {
    e.wait();
  }

  std::unique_ptr<ConvOp> makeConv(const ConvGeometry& g) override {
    nchwOnly(g.channels_last, "convolution");
    return cpu::makeConv(g, threads_, dnnl_);
  }
  std::unique_ptr<PoolOp> makePool(const PoolGeometry& g) override {
    nchwOnly(g.channels_last, "pooling");
    return cpu::makePool(g, threads_);
  }
  std::unique_ptr<InnerProductOp> makeInnerProduct(const InnerProductGeometry& g) override {
    return cpu::makeInnerProduct(g, threads_);
  }
  std::unique_ptr<BatchNormOp> makeBatchNorm(const BatchNormGeometry& g) override {
    nchwOnly(g.channels_last, "batch norm");
    return cpu::makeBatchNorm(g, threads_);
  }
  std::unique_ptr<ReluOp> makeRelu(std::int64_t numel) override {
    return cpu::makeRelu(numel, threads_);
  }
  std::unique_ptr<DropoutOp> makeDropout(std::int64_t numel, float ratio) override {
    return cpu::makeDropout(numel, ratio, threads_);
  }
  std::unique_ptr<AddOp> makeAdd(std::int64_t numel) override {
    return cpu::makeAdd(numel, threads_);
  }
  std::unique_ptr<GlobalAvgPoolOp> makeGlobalAvgPool(std::int64_t n, std::int64_t channels,
                                                     std::int64_t spatial,
                                                     bool channels_last) override {
    nchwOnly(channels_last, "global average pooling");
    return cpu::makeGlobalAvgPool(n, channels, spatial, threads_);
  }
  std::unique_ptr<SoftmaxLossOp> makeSoftmaxLoss(std::int64_t n, std::int64_t classes,
                                                 float label_smoothing) override {
    return cpu::makeSoftmaxLoss(n, classes, label_smoothing, threads_);
  }
  std::unique_ptr<EmbeddingOp> makeEmbedding(const EmbeddingGeometry& g) override {
    return cpu::makeEmbedding(g, threads_);
  }
  std::unique_ptr<LayerNormOp> makeLayerNorm(const LayerNormGeometry& g) override {
    return cpu::makeLayerNorm(g, threads_);
  }
  std::unique_ptr<GeluOp> makeGelu(std::int64_t numel) override {
    return cpu::makeGelu(numel, threads_);
  }
  std::unique_ptr<AttentionOp> makeAttention(const AttentionGeometry& g) override {
    return cpu::makeAttention(g, threads_);
  }
  std::unique_ptr<LstmOp> makeLstm(const LstmGeometry& g) override {
    return cpu::makeLstm(g, threads_);
  }

 private:
  // The CPU's ops compute in NCHW (kernels/ops.h); channels-last is for devices.
  static void nchwOnly(bool channels_last, const char* op) {
    TROUPE_ENFORCE(!channels_last, "a channels-last ", op, " on the CPU, whose ops are NCHW");
  }

  int threads_;
  bool updates_finite_ = true;  // since the last updatesFinite()
  DnnlContext dnnl_;
};

}  // namespace
}  // namespace cpu

double cpuSgemmPeak(int threads) {
  constexpr std::int64_t n = 1024;
  std::vector<float> a(static_cast<std::size_t>(n * n), 1.0f), b = a, c = a;
  cpu::useThreads(threads);
  double best = 0;
  for (int i = 0; i < 8; ++i) {
    const auto begin = std::chrono::steady_clock::now();
    cpu::sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    if (i > 1) best = std::max(best, 2.0 * n * n * n / std::max(seconds, 1e-9));
  }
  return best;
}

std::unique_ptr<Backend> makeCpuBackend(int threads) {
  if (threads < 1)
    throw InputError("a CPU backend needs at least 1 thread, got " + std::to_string(threads));
  return std::make_unique<cpu::CpuBackend>(threads);
}

}  // namespace troupe::kernels
