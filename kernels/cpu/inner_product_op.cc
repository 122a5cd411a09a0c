// Fully connected layers as sgemm calls (oneDNN's). With several threads, each thread runs one
// single-threaded sgemm on its own share of the outputs, all in one parallel region per pass:
// at these sizes (a batch of 64, a few hundred features) that keeps each core as busy as one
// thread alone is, where oneDNN's own split of one call lost about a third of it.
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {
namespace {

class CpuInnerProduct final : public InnerProductOp {
 public:
  CpuInnerProduct(const InnerProductGeometry& g, int threads)
      : g_(g), threads_(g.n * g.in * g.out >= kParallelMacs ? threads : 1) {}

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    TROUPE_ENFORCE_EQ(x.numel(), g_.n * g_.in);
    TROUPE_ENFORCE_EQ(y.numel(), g_.n * g_.out);
    const float* xp = x.f32();
    const float* wp = w.f32();
    const float* bp = optionalF32(b);
    float* yp = y.f32();
    // y[:, o0:o1] = x * w[o0:o1, :]^T + b[o0:o1]
    onTeam(threads_, [&](int rank, int count) {
      std::int64_t o0, o1;
      splitAligned(g_.out, rank, count, o0, o1);
      if (o1 <= o0) return;
      for (std::int64_t i = 0; i < g_.n; ++i) {
        float* row = yp + i * g_.out;
        if (bp)
          std::copy(bp + o0, bp + o1, row + o0);
        else
          std::fill(row + o0, row + o1, 0.0f);
      }
      sgemm(false, true, g_.n, o1 - o0, g_.in, 1.0f, xp, g_.in, wp + o0 * g_.in, g_.in, 1.0f,
            yp + o0, g_.out);
    });
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                const Tensor& dw, const Tensor& db) override {
    TROUPE_ENFORCE_EQ(dy.numel(), g_.n * g_.out);
    const auto [xp, wp, dyp] = f32s(x, w, dy);
    const auto [dwp, dbp, dxp] = optionalF32s(dw, db, dx);
    // dw[o0:o1, :] = dy[:, o0:o1]^T * x, db[o0:o1] = column sums of dy[:, o0:o1], and
    // dx[:, i0:i1] = dy * w[:, i0:i1]: the three read dy and write disjoint shares.
    onTeam(threads_, [&](int rank, int count) {
      std::int64_t o0, o1, i0, i1;
      splitAligned(g_.out, rank, count, o0, o1);
      splitAligned(g_.in, rank, count, i0, i1);
      if (dwp && o1 > o0) {
        sgemm(true, false, o1 - o0, g_.in, g_.n, 1.0f, dyp + o0, g_.out, xp, g_.in, 0.0f,
              dwp + o0 * g_.in, g_.in);
      }
      if (dbp && o1 > o0) vec::sumRows(dyp + o0, g_.out, dbp + o0, g_.n, o1 - o0);
      if (dxp && i1 > i0) {
        sgemm(false, false, g_.n, i1 - i0, g_.out, 1.0f, dyp, g_.out, wp + i0, g_.in, 0.0f,
              dxp + i0, g_.in);
      }
    });
  }

 private:
  InnerProductGeometry g_;
  int threads_;
};

}  // namespace

std::unique_ptr<InnerProductOp> makeInnerProduct(const InnerProductGeometry& g, int threads) {
  TROUPE_ENFORCE(g.n > 0 && g.in > 0 && g.out > 0, "bad inner product geometry");
  return std::make_unique<CpuInnerProduct>(g, threads);
}

}  // namespace troupe::kernels::cpu
