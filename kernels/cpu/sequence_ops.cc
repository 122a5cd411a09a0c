// The sequence models' ops: token and position embedding, layer norm, GELU, causal self-attention
// (GPT-2's, as llm.c's CPU trainer computes them, with oneDNN's sgemm for the attention's
// products). Every reduction runs in a fixed order for a given thread count.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {
namespace {

// Below this many elements a loop runs on one thread (waking a team costs more).
constexpr std::int64_t kGrain = 1 << 14;

class CpuEmbedding final : public EmbeddingOp {
 public:
  CpuEmbedding(const EmbeddingGeometry& g, int threads) : g_(g), threads_(threads) {}

  void forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
               const Tensor& y) override {
    const std::int64_t rows = g_.n * g_.t, c = g_.channels;
    TROUPE_ENFORCE_EQ(tokens.numel(), rows);
    TROUPE_ENFORCE_EQ(wte.numel(), g_.vocab * c);
    TROUPE_ENFORCE_GE(wpe.numel(), g_.t * c);
    TROUPE_ENFORCE_EQ(y.numel(), rows * c);
    const std::int32_t* tok = tokens.i32();
    for (std::int64_t r = 0; r < rows; ++r) {
      if (tok[r] < 0 || tok[r] >= g_.vocab) {
        throw InputError("token " + std::to_string(tok[r]) + " at position " +
                         std::to_string(r % g_.t) + " of sequence " + std::to_string(r / g_.t) +
                         " is outside the vocabulary [0, " + std::to_string(g_.vocab) + ")");
      }
    }
    const float* te = wte.f32();
    const float* pe = wpe.f32();
    float* out = y.f32();
    forRanges(rows, threads_, kGrain / c + 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) {
        const float* a = te + tok[r] * c;
        const float* p = pe + (r % g_.t) * c;
        float* o = out + r * c;
        for (std::int64_t k = 0; k < c; ++k)
          o[k] = a[k] + p[k];
      }
    });
  }

  // Each thread owns a share of the channels across every row: no two write one element, and
  // each element's sum runs in row order.
  void backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte, const Tensor& dwpe,
                bool add_to_dwte) override {
    const std::int64_t c = g_.channels;
    TROUPE_ENFORCE_EQ(dy.numel(), g_.n * g_.t * c);
    const std::int32_t* tok = tokens.i32();
    const float* d = dy.f32();
    float* te = optionalF32(dwte);
    float* pe = optionalF32(dwpe);
    forRanges(c, threads_, 16, [&](std::int64_t b, std::int64_t e) {
      if (te && !add_to_dwte) {
        for (std::int64_t v = 0; v < g_.vocab; ++v)
          std::fill(te + v * c + b, te + v * c + e, 0.0f);
      }
      for (std::int64_t s = 0; s < g_.t && pe; ++s)
        std::fill(pe + s * c + b, pe + s * c + e, 0.0f);
      for (std::int64_t r = 0; r < g_.n * g_.t; ++r) {
        const float* row = d + r * c;
        if (te) {
          float* to = te + tok[r] * c;
          for (std::int64_t k = b; k < e; ++k)
            to[k] += row[k];
        }
        if (pe) {
          float* po = pe + (r % g_.t) * c;
          for (std::int64_t k = b; k < e; ++k)
            po[k] += row[k];
        }
      }
    });
  }

 private:
  EmbeddingGeometry g_;
  int threads_;
};

class CpuLayerNorm final : public LayerNormOp {
 public:
  CpuLayerNorm(const LayerNormGeometry& g, int threads)
      : g_(g), threads_(threads), mean_(g.rows), rstd_(g.rows) {}

  void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y) override {
    const std::int64_t c = g_.channels;
    TROUPE_ENFORCE_EQ(x.numel(), g_.rows * c);
    TROUPE_ENFORCE_EQ(y.numel(), g_.rows * c);
    const float* in = x.f32();
    const float* gm = gamma.f32();
    const float* bt = beta.f32();
    float* out = y.f32();
    const float inv_c = 1.0f / static_cast<float>(c);
    forRanges(g_.rows, threads_, kGrain / c + 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) {
        const float* xr = in + r * c;
        float sum = 0.0f;
        for (std::int64_t k = 0; k < c; ++k)
          sum += xr[k];
        const float mean = sum * inv_c;
        float sq = 0.0f;
        for (std::int64_t k = 0; k < c; ++k)
          sq += (xr[k] - mean) * (xr[k] - mean);
        const float rstd = 1.0f / std::sqrt(sq * inv_c + g_.eps);
        float* yr = out + r * c;
        for (std::int64_t k = 0; k < c; ++k)
          yr[k] = (xr[k] - mean) * rstd * gm[k] + bt[k];
        mean_[static_cast<std::size_t>(r)] = mean;
        rstd_[static_cast<std::size_t>(r)] = rstd;
      }
    });
  }

  // dx = rstd (dy gamma - mean(dy gamma) - xhat mean(dy gamma xhat)); dgamma and dbeta from each
  // range's partial sums, added in range order.
  void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& dx,
                const Tensor& dgamma, const Tensor& dbeta) override {
    const std::int64_t c = g_.channels;
    TROUPE_ENFORCE_EQ(dy.numel(), g_.rows * c);
    const float* in = x.f32();
    const float* gm = gamma.f32();
    const float* d = dy.f32();
    float* out = optionalF32(dx);
    const float inv_c = 1.0f / static_cast<float>(c);
    const int ranges = g_.rows * c > kGrain ? threads_ : 1;
    partial_.assign(static_cast<std::size_t>(ranges) * 2 * static_cast<std::size_t>(c), 0.0f);
    forRangesIndexed(g_.rows, ranges, 0, [&](int index, std::int64_t b, std::int64_t e) {
      float* pg = partial_.data() + static_cast<std::size_t>(index) * 2 * c;
      float* pb = pg + c;
      for (std::int64_t r = b; r < e; ++r) {
        const float* xr = in + r * c;
        const float* dr = d + r * c;
        const float mean = mean_[static_cast<std::size_t>(r)];
        const float rstd = rstd_[static_cast<std::size_t>(r)];
        float dsum = 0.0f, dxhat = 0.0f;
        for (std::int64_t k = 0; k < c; ++k) {
          const float xhat = (xr[k] - mean) * rstd;
          const float dg = dr[k] * gm[k];
          dsum += dg;
          dxhat += dg * xhat;
          pg[k] += dr[k] * xhat;
          pb[k] += dr[k];
        }
        if (!out) continue;
        dsum *= inv_c;
        dxhat *= inv_c;
        float* o = out + r * c;
        for (std::int64_t k = 0; k < c; ++k)
          o[k] = rstd * (dr[k] * gm[k] - dsum - (xr[k] - mean) * rstd * dxhat);
      }
    });
    float* dg = optionalF32(dgamma);
    float* db = optionalF32(dbeta);
    for (std::int64_t k = 0; k < c; ++k) {
      float sg = 0.0f, sb = 0.0f;
      for (int i = 0; i < ranges; ++i) {
        sg += partial_[static_cast<std::size_t>(i * 2 * c + k)];
        sb += partial_[static_cast<std::size_t>(i * 2 * c + c + k)];
      }
      if (dg) dg[k] = sg;
      if (db) db[k] = sb;
    }
  }

 private:
  LayerNormGeometry g_;
  int threads_;
  std::vector<float> mean_, rstd_, partial_;
};

class CpuGelu final : public GeluOp {
 public:
  CpuGelu(std::int64_t numel, int threads) : numel_(numel), threads_(threads) {}
  void forward(const Tensor& x, const Tensor& y) override {
    TROUPE_ENFORCE_EQ(x.numel(), numel_);
    const float* in = x.f32();
    float* out = y.f32();
    forRanges(numel_, threads_, kGrain,
              [&](std::int64_t b, std::int64_t e) { vec::geluForward(in + b, out + b, e - b); });
  }
  void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) override {
    TROUPE_ENFORCE_EQ(dy.numel(), numel_);
    const float* in = x.f32();
    const float* d = dy.f32();
    float* out = dx.f32();
    forRanges(numel_, threads_, kGrain, [&](std::int64_t b, std::int64_t e) {
      vec::geluBackward(in + b, d + b, out + b, e - b);
    });
  }

 private:
  std::int64_t numel_;
  int threads_;
};

// One (sequence, head) pair at a time, the pairs shared among the threads; within a pair the
// products are single-threaded sgemm calls on the strided rows of qkv.
class CpuAttention final : public AttentionOp {
 public:
  CpuAttention(const AttentionGeometry& g, int threads)
      : g_(g),
        threads_(threads),
        hs_(g.channels / g.heads),
        scale_(1.0f / std::sqrt(static_cast<float>(g.channels / g.heads))),
        att_(static_cast<std::size_t>(g.n * g.heads * g.t * g.t)) {}

  void forward(const Tensor& qkv, const Tensor& y) override {
    const std::int64_t t = g_.t, c = g_.channels;
    TROUPE_ENFORCE_EQ(qkv.numel(), g_.n * t * 3 * c);
    TROUPE_ENFORCE_EQ(y.numel(), g_.n * t * c);
    const float* in = qkv.f32();
    float* out = y.f32();
    pairs([&](std::int64_t i, std::int64_t h, float*) {
      const float* q = in + i * t * 3 * c + h * hs_;
      float* p = att(i, h);
      sgemm(false, true, t, t, hs_, scale_, q, 3 * c, q + c, 3 * c, 0.0f, p, t);
      for (std::int64_t s = 0; s < t; ++s) {
        float* row = p + s * t;
        float mx = row[0];
        for (std::int64_t j = 1; j <= s; ++j)
          mx = std::max(mx, row[j]);
        const float inv = 1.0f / vec::expSum(row, mx, row, s + 1);
        for (std::int64_t j = 0; j <= s; ++j)
          row[j] *= inv;
        std::fill(row + s + 1, row + t, 0.0f);
      }
      sgemm(false, false, t, hs_, t, 1.0f, p, t, q + 2 * c, 3 * c, 0.0f, out + i * t * c + h * hs_,
            c);
    });
  }

  // dP = dy v^T; dv = P^T dy; dS = P (dP - rowsum(P dP)) scale over the causal part; dq = dS k;
  // dk = dS^T q.
  void backward(const Tensor& qkv, const Tensor& dy, const Tensor& dqkv) override {
    const std::int64_t t = g_.t, c = g_.channels;
    TROUPE_ENFORCE_EQ(dy.numel(), g_.n * t * c);
    TROUPE_ENFORCE_EQ(dqkv.numel(), g_.n * t * 3 * c);
    const float* in = qkv.f32();
    const float* d = dy.f32();
    float* out = dqkv.f32();
    pairs([&](std::int64_t i, std::int64_t h, float* ds) {
      const float* q = in + i * t * 3 * c + h * hs_;
      const float* dyh = d + i * t * c + h * hs_;
      float* dq = out + i * t * 3 * c + h * hs_;
      const float* p = att(i, h);
      sgemm(false, true, t, t, hs_, 1.0f, dyh, c, q + 2 * c, 3 * c, 0.0f, ds, t);
      sgemm(true, false, t, hs_, t, 1.0f, p, t, dyh, c, 0.0f, dq + 2 * c, 3 * c);
      for (std::int64_t s = 0; s < t; ++s) {
        const float* pr = p + s * t;
        float* row = ds + s * t;
        float dot = 0.0f;
        for (std::int64_t j = 0; j <= s; ++j)
          dot += pr[j] * row[j];
        for (std::int64_t j = 0; j <= s; ++j)
          row[j] = pr[j] * (row[j] - dot) * scale_;
        std::fill(row + s + 1, row + t, 0.0f);
      }
      sgemm(false, false, t, hs_, t, 1.0f, ds, t, q + c, 3 * c, 0.0f, dq, 3 * c);
      sgemm(true, false, t, hs_, t, 1.0f, ds, t, q, 3 * c, 0.0f, dq + c, 3 * c);
    });
  }

 private:
  float* att(std::int64_t i, std::int64_t h) {
    return att_.data() + (i * g_.heads + h) * g_.t * g_.t;
  }
  // fn(sequence, head, scratch of t x t floats) for every pair, split among the threads.
  template <typename Fn>
  void pairs(const Fn& fn) {
    const std::int64_t count = g_.n * g_.heads;
    const int threads = static_cast<int>(std::min<std::int64_t>(threads_, count));
    if (threads <= 1) useThreads(1);
    forRanges(count, threads, 0, [&](std::int64_t b, std::int64_t e) {
      std::vector<float> scratch(static_cast<std::size_t>(g_.t * g_.t));
      for (std::int64_t k = b; k < e; ++k)
        fn(k / g_.heads, k % g_.heads, scratch.data());
    });
  }

  AttentionGeometry g_;
  int threads_;
  std::int64_t hs_;
  float scale_;
  std::vector<float> att_;
};

}  // namespace

std::unique_ptr<EmbeddingOp> makeEmbedding(const EmbeddingGeometry& g, int threads) {
  TROUPE_ENFORCE(g.n > 0 && g.t > 0 && g.vocab > 0 && g.channels > 0, "bad embedding geometry");
  return std::make_unique<CpuEmbedding>(g, threads);
}
std::unique_ptr<LayerNormOp> makeLayerNorm(const LayerNormGeometry& g, int threads) {
  TROUPE_ENFORCE(g.rows > 0 && g.channels > 0 && g.eps > 0.0f, "bad layer norm geometry");
  return std::make_unique<CpuLayerNorm>(g, threads);
}
std::unique_ptr<GeluOp> makeGelu(std::int64_t numel, int threads) {
  return std::make_unique<CpuGelu>(numel, threads);
}
std::unique_ptr<AttentionOp> makeAttention(const AttentionGeometry& g, int threads) {
  TROUPE_ENFORCE(g.n > 0 && g.t > 0 && g.heads > 0 && g.channels % g.heads == 0,
                 "bad attention geometry");
  return std::make_unique<CpuAttention>(g, threads);
}

}  // namespace troupe::kernels::cpu
