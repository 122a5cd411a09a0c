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
    if (g_.positions) TROUPE_ENFORCE_GE(wpe.numel(), g_.t * c);
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
    const float* pe = g_.positions ? wpe.f32() : nullptr;
    float* out = y.f32();
    forRanges(rows, threads_, kGrain / c + 1, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) {
        const float* a = te + tok[r] * c;
        float* o = out + r * c;
        if (!pe) {
          std::copy(a, a + c, o);
          continue;
        }
        const float* p = pe + (r % g_.t) * c;
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
    float* pe = g_.positions ? optionalF32(dwpe) : nullptr;
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

// One LSTM layer. The input's share of every step's gates is computed up front; then each step
// adds h_prev W_hh^T and runs the cells. The threads share the hidden units (in whole cache
// lines): each computes its units' four gates with single-threaded sgemm calls and their cells,
// all in one parallel region, meeting at a barrier after each step (the next reads every unit's
// h). The backward runs the steps in reverse the same way; the weights' gradients are then
// products over every step at once, the threads sharing their rows.
class CpuLstm final : public LstmOp {
 public:
  CpuLstm(const LstmGeometry& g, int threads)
      : g_(g),
        threads_(g.n * g.t * 4 * g.hidden * (g.input + g.hidden) >= kParallelMacs ? threads : 1),
        gates_(size(g.n * g.t * 4 * g.hidden)),
        c_(size(g.n * g.t * g.hidden)),
        tc_(size(g.n * g.t * g.hidden)) {}

  void forward(const Tensor& x, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
               const Tensor& b_hh, const Tensor& y) override {
    const std::int64_t n = g_.n, t = g_.t, in = g_.input, hid = g_.hidden, g4 = 4 * hid;
    TROUPE_ENFORCE_EQ(x.numel(), n * t * in);
    TROUPE_ENFORCE_EQ(y.numel(), n * t * hid);
    TROUPE_ENFORCE_EQ(w_ih.numel(), g4 * in);
    TROUPE_ENFORCE_EQ(w_hh.numel(), g4 * hid);
    const float* xp = x.f32();
    const float* wi = w_ih.f32();
    const float* wh = w_hh.f32();
    const float* bi = b_ih.f32();
    const float* bh = b_hh.f32();
    float* yp = y.f32();
    float* gates = gates_.data();
    onTeam(threads_, [&](int rank, int count) {
      std::int64_t k0, k1;
      splitAligned(hid, rank, count, k0, k1);
      const std::int64_t w = k1 - k0;
      for (std::int64_t j = 0; j < 4 && w > 0; ++j) {
        const std::int64_t col = j * hid + k0;
        for (std::int64_t r = 0; r < n * t; ++r) {
          float* row = gates + r * g4 + col;
          for (std::int64_t k = 0; k < w; ++k)
            row[k] = bi[col + k] + bh[col + k];
        }
        sgemm(false, true, n * t, w, in, 1.0f, xp, in, wi + col * in, in, 1.0f, gates + col, g4);
      }
      for (std::int64_t s = 0; s < t; ++s) {
        for (std::int64_t j = 0; j < 4 && w > 0 && s > 0; ++j) {
          const std::int64_t col = j * hid + k0;
          sgemm(false, true, n, w, hid, 1.0f, yp + (s - 1) * hid, t * hid, wh + col * hid, hid,
                1.0f, gates + s * g4 + col, t * g4);
        }
        for (std::int64_t i = 0; i < n && w > 0; ++i) {
          const std::int64_t r = i * t + s;
          vec::lstmCellForward(gates + r * g4 + k0, hid, s > 0 ? cell(r - 1) + k0 : nullptr,
                               cell(r) + k0, tanhCell(r) + k0, yp + r * hid + k0, w);
        }
        if (count > 1) {
#pragma omp barrier
        }
      }
    });
  }

  void backward(const Tensor& x, const Tensor& y, const Tensor& w_ih, const Tensor& w_hh,
                const Tensor& dy, const Tensor& dx, const Tensor& dw_ih, const Tensor& dw_hh,
                const Tensor& db_ih, const Tensor& db_hh) override {
    const std::int64_t n = g_.n, t = g_.t, in = g_.input, hid = g_.hidden, g4 = 4 * hid;
    TROUPE_ENFORCE_EQ(dy.numel(), n * t * hid);
    const auto [xp, yp, wi, wh, d] = f32s(x, y, w_ih, w_hh, dy);
    const auto [dxp, dwi, dwh, dbi, dbh] = optionalF32s(dx, dw_ih, dw_hh, db_ih, db_hh);
    dgates_.resize(gates_.size());
    hprev_.resize(size(n * t * hid));
    dh_.resize(size(n * hid));
    dc_.resize(size(n * hid));
    float* dg = dgates_.data();
    float* hp = hprev_.data();
    onTeam(threads_, [&](int rank, int count) {
      // h_prev of every step (0 before the first), for dW_hh.
      std::int64_t r0, r1;
      splitRange(n * t, rank, count, r0, r1);
      for (std::int64_t r = r0; r < r1; ++r) {
        if (r % t == 0)
          std::fill(hp + r * hid, hp + (r + 1) * hid, 0.0f);
        else
          std::copy(yp + (r - 1) * hid, yp + r * hid, hp + r * hid);
      }
      std::int64_t k0, k1;
      splitAligned(hid, rank, count, k0, k1);
      const std::int64_t w = k1 - k0;
      for (std::int64_t s = t - 1; s >= 0; --s) {
        for (std::int64_t i = 0; i < n && w > 0; ++i) {
          const float* from = d + (i * t + s) * hid + k0;
          std::copy(from, from + w, dh_.data() + i * hid + k0);
          if (s == t - 1) std::fill(dc_.data() + i * hid + k0, dc_.data() + i * hid + k1, 0.0f);
        }
        // dh += the next step's dgates W_hh, for these units.
        if (w > 0 && s < t - 1) {
          sgemm(false, false, n, w, g4, 1.0f, dg + (s + 1) * g4, t * g4, wh + k0, hid, 1.0f,
                dh_.data() + k0, hid);
        }
        for (std::int64_t i = 0; i < n && w > 0; ++i) {
          const std::int64_t r = i * t + s;
          vec::lstmCellBackward(gates_.data() + r * g4 + k0, hid,
                                s > 0 ? cell(r - 1) + k0 : nullptr, tanhCell(r) + k0,
                                dh_.data() + i * hid + k0, dc_.data() + i * hid + k0,
                                dg + r * g4 + k0, w);
        }
        if (count > 1) {
#pragma omp barrier
        }
      }
      std::int64_t q0, q1, i0, i1;
      splitAligned(g4, rank, count, q0, q1);
      splitAligned(in, rank, count, i0, i1);
      if (q1 > q0) {
        if (dwi)
          sgemm(true, false, q1 - q0, in, n * t, 1.0f, dg + q0, g4, xp, in, 0.0f, dwi + q0 * in,
                in);
        if (dwh)
          sgemm(true, false, q1 - q0, hid, n * t, 1.0f, dg + q0, g4, hp, hid, 0.0f, dwh + q0 * hid,
                hid);
        // The two biases' gradients are the same sums.
        float* db = dbi ? dbi : dbh;
        if (db) vec::sumRows(dg + q0, g4, db + q0, n * t, q1 - q0);
        if (dbi && dbh) std::copy(dbi + q0, dbi + q1, dbh + q0);
      }
      if (dxp && i1 > i0)
        sgemm(false, false, n * t, i1 - i0, g4, 1.0f, dg, g4, wi + i0, in, 0.0f, dxp + i0, in);
    });
  }

 private:
  static std::size_t size(std::int64_t count) {
    return static_cast<std::size_t>(count);
  }
  float* cell(std::int64_t row) {
    return c_.data() + row * g_.hidden;
  }
  float* tanhCell(std::int64_t row) {
    return tc_.data() + row * g_.hidden;
  }

  LstmGeometry g_;
  int threads_;
  // Per step and sequence: the gates' activations, c and tanh(c); the backward's gradients of
  // the gates' pre-activations, h_prev, and the running dh and dc of one step.
  std::vector<float> gates_, c_, tc_, dgates_, hprev_, dh_, dc_;
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
  return std::make_unique<Elementwise<GeluOp, vec::geluForward, vec::geluBackward>>(numel, threads,
                                                                                    kGrain);
}
std::unique_ptr<AttentionOp> makeAttention(const AttentionGeometry& g, int threads) {
  TROUPE_ENFORCE(g.n > 0 && g.t > 0 && g.heads > 0 && g.channels % g.heads == 0,
                 "bad attention geometry");
  return std::make_unique<CpuAttention>(g, threads);
}
std::unique_ptr<LstmOp> makeLstm(const LstmGeometry& g, int threads) {
  TROUPE_ENFORCE(g.n > 0 && g.t > 0 && g.input > 0 && g.hidden > 0, "bad LSTM geometry");
  return std::make_unique<CpuLstm>(g, threads);
}

}  // namespace troupe::kernels::cpu
