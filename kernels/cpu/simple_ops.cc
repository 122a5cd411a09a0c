// Element-wise and small reduction ops: ReLU, dropout, add, global average pooling, softmax loss.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/vec.h"
#include "kernels/random.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {
namespace {

// Below this many elements a loop runs on one thread (waking a team costs more).
constexpr std::int64_t kParallelGrain = 1 << 15;

class CpuDropout final : public DropoutOp {
 public:
  CpuDropout(std::int64_t numel, float ratio, int threads)
      : numel_(numel), ratio_(ratio), threads_(threads), mask_(numel) {}
  void forward(const Tensor& x, const Tensor& y, std::uint64_t seed) override {
    TROUPE_ENFORCE_EQ(x.numel(), numel_);
    const float* in = x.f32();
    float* out = y.f32();
    float* mask = mask_.data();
    const float keep = 1.0f / (1.0f - ratio_), ratio = ratio_;
#pragma omp parallel for num_threads(threads_) if (numel_ > kParallelGrain)
    for (std::int64_t i = 0; i < numel_; ++i) {
      mask[i] = uniform01(randomBits(seed, 0, static_cast<std::uint64_t>(i))) < ratio ? 0.0f : keep;
      out[i] = in[i] * mask[i];
    }
  }
  void backward(const Tensor& dy, const Tensor& dx) override {
    TROUPE_ENFORCE_EQ(dy.numel(), numel_);
    const float* d = dy.f32();
    const float* mask = mask_.data();
    float* out = dx.f32();
#pragma omp parallel for simd num_threads(threads_) if (numel_ > kParallelGrain)
    for (std::int64_t i = 0; i < numel_; ++i)
      out[i] = d[i] * mask[i];
  }

 private:
  std::int64_t numel_;
  float ratio_;
  int threads_;
  std::vector<float> mask_;
};

class CpuAdd final : public AddOp {
 public:
  CpuAdd(std::int64_t numel, int threads) : numel_(numel), threads_(threads) {}
  void forward(const Tensor& a, const Tensor& b, const Tensor& y) override {
    TROUPE_ENFORCE_EQ(a.numel(), numel_);
    TROUPE_ENFORCE_EQ(b.numel(), numel_);
    const float* ap = a.f32();
    const float* bp = b.f32();
    float* out = y.f32();
    forRanges(numel_, threads_, kParallelGrain,
              [&](std::int64_t b, std::int64_t e) { vec::add(ap + b, bp + b, out + b, e - b); });
  }

 private:
  std::int64_t numel_;
  int threads_;
};

class CpuGlobalAvgPool final : public GlobalAvgPoolOp {
 public:
  CpuGlobalAvgPool(std::int64_t planes, std::int64_t spatial, int threads)
      : planes_(planes),
        spatial_(spatial),
        inv_(1.0f / static_cast<float>(spatial)),
        threads_(threads) {}
  void forward(const Tensor& x, const Tensor& y) override {
    TROUPE_ENFORCE_EQ(x.numel(), planes_ * spatial_);
    const float* in = x.f32();
    float* out = y.f32();
    for (std::int64_t p = 0; p < planes_; ++p) {
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (std::int64_t q = 0; q < spatial_; ++q)
        s += in[p * spatial_ + q];
      out[p] = s * inv_;
    }
  }
  void backward(const Tensor& dy, const Tensor& dx) override {
    TROUPE_ENFORCE_EQ(dx.numel(), planes_ * spatial_);
    const float* d = dy.f32();
    float* out = dx.f32();
    for (std::int64_t p = 0; p < planes_; ++p) {
      const float v = d[p] * inv_;
      std::fill(out + p * spatial_, out + (p + 1) * spatial_, v);
    }
  }

 private:
  std::int64_t planes_, spatial_;
  float inv_;  // 1 / spatial_
  int threads_;
};

// Rows are shared among the threads (a language model's thousands of tokens, each a row of the
// vocabulary); each range sums its rows' losses, and the ranges' sums are added in range order.
class CpuSoftmaxLoss final : public SoftmaxLossOp {
 public:
  CpuSoftmaxLoss(std::int64_t n, std::int64_t classes, float smoothing, int threads)
      : n_(n),
        classes_(classes),
        smoothing_(smoothing),
        threads_(n * classes >= kParallelGrain ? threads : 1),
        prob_(n * classes),
        labels_(n) {}
  void forward(const Tensor& logits, const Tensor& labels, const Tensor& metrics) override {
    TROUPE_ENFORCE_EQ(logits.numel(), n_ * classes_);
    TROUPE_ENFORCE_EQ(labels.numel(), n_);
    TROUPE_ENFORCE_EQ(metrics.numel(), 2);
    const std::int32_t* lab = labels.i32();
    for (std::int64_t i = 0; i < n_; ++i) {
      const std::int32_t label = lab[i];
      if (label < 0 || label >= classes_)
        throw InputError("label " + std::to_string(label) + " of sample " + std::to_string(i) +
                         " is outside [0, " + std::to_string(classes_) + ")");
      labels_[i] = label;
    }
    const float* z = logits.f32();
    std::vector<double> loss(static_cast<std::size_t>(threads_), 0.0);
    std::vector<std::int64_t> correct(static_cast<std::size_t>(threads_), 0);
    forRangesIndexed(n_, threads_, 0, [&](int index, std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const std::int32_t label = labels_[i];
        const float* row = z + i * classes_;
        float* p = prob_.data() + i * classes_;
        std::int64_t best = 0;
        for (std::int64_t k = 1; k < classes_; ++k)
          if (row[k] > row[best]) best = k;
        const float mx = row[best];
        const float sum = vec::expSum(row, mx, p, classes_);
        float shifted = 0.0f;  // the sum of row[k] - mx (smoothing's)
        if (smoothing_ != 0.0f) {
          for (std::int64_t k = 0; k < classes_; ++k)
            shifted += row[k] - mx;
        }
        const float inv = 1.0f / sum;
        for (std::int64_t k = 0; k < classes_; ++k)
          p[k] *= inv;
        loss[static_cast<std::size_t>(index)] +=
            smoothing_ == 0.0f
                ? std::log(sum) - (row[label] - mx)
                : std::log(sum) - ((1.0f - smoothing_) * (row[label] - mx) +
                                   smoothing_ / static_cast<float>(classes_) * shifted);
        correct[static_cast<std::size_t>(index)] += best == label;
      }
    });
    double total = 0.0;
    std::int64_t right = 0;
    for (int r = 0; r < threads_; ++r) {
      total += loss[static_cast<std::size_t>(r)];
      right += correct[static_cast<std::size_t>(r)];
    }
    metrics.f32()[0] = static_cast<float>(total);
    metrics.f32()[1] = static_cast<float>(right);
  }
  void backward(float scale, const Tensor& dlogits) override {
    TROUPE_ENFORCE_EQ(dlogits.numel(), n_ * classes_);
    float* d = dlogits.f32();
    const float spread = scale * smoothing_ / static_cast<float>(classes_);
    forRanges(n_, threads_, 0, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin * classes_; i < end * classes_; ++i)
        d[i] = scale * prob_[i] - spread;
      for (std::int64_t i = begin; i < end; ++i)
        d[i * classes_ + labels_[i]] -= scale * (1.0f - smoothing_);
    });
  }

 private:
  std::int64_t n_, classes_;
  float smoothing_;
  int threads_;
  std::vector<float> prob_;
  std::vector<std::int32_t> labels_;
};

}  // namespace

std::unique_ptr<ReluOp> makeRelu(std::int64_t numel, int threads) {
  return std::make_unique<Elementwise<ReluOp, vec::reluForward, vec::reluBackward>>(numel, threads,
                                                                                    kParallelGrain);
}
std::unique_ptr<DropoutOp> makeDropout(std::int64_t numel, float ratio, int threads) {
  TROUPE_ENFORCE(ratio >= 0.0f && ratio < 1.0f, "dropout ratio ", ratio);
  return std::make_unique<CpuDropout>(numel, ratio, threads);
}
std::unique_ptr<AddOp> makeAdd(std::int64_t numel, int threads) {
  return std::make_unique<CpuAdd>(numel, threads);
}
std::unique_ptr<GlobalAvgPoolOp> makeGlobalAvgPool(std::int64_t n, std::int64_t channels,
                                                   std::int64_t spatial, int threads) {
  return std::make_unique<CpuGlobalAvgPool>(n * channels, spatial, threads);
}
std::unique_ptr<SoftmaxLossOp> makeSoftmaxLoss(std::int64_t n, std::int64_t classes,
                                               float label_smoothing, int threads) {
  TROUPE_ENFORCE(label_smoothing >= 0.0f && label_smoothing < 1.0f, "label smoothing ",
                 label_smoothing);
  return std::make_unique<CpuSoftmaxLoss>(n, classes, label_smoothing, threads);
}

}  // namespace troupe::kernels::cpu
