// Fully connected layers as three sgemm calls (oneDNN's, threaded by the backend's budget).
#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {
namespace {

class CpuInnerProduct final : public InnerProductOp {
 public:
  CpuInnerProduct(const InnerProductGeometry& g, int threads) : g_(g), threads_(threads) {}

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    TROUPE_ENFORCE_EQ(x.numel(), g_.n * g_.in);
    TROUPE_ENFORCE_EQ(y.numel(), g_.n * g_.out);
    const float* bp = optionalF32(b);
    float* yp = y.f32();
    for (std::int64_t i = 0; i < g_.n; ++i) {
      if (bp)
        std::copy(bp, bp + g_.out, yp + i * g_.out);
      else
        std::fill(yp + i * g_.out, yp + (i + 1) * g_.out, 0.0f);
    }
    useThreads(threads_);
    sgemm(false, true, g_.n, g_.out, g_.in, 1.0f, x.f32(), g_.in, w.f32(), g_.in, 1.0f, yp, g_.out);
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                const Tensor& dw, const Tensor& db) override {
    TROUPE_ENFORCE_EQ(dy.numel(), g_.n * g_.out);
    const float* dyp = dy.f32();
    useThreads(threads_);
    if (float* dwp = optionalF32(dw))
      sgemm(true, false, g_.out, g_.in, g_.n, 1.0f, dyp, g_.out, x.f32(), g_.in, 0.0f, dwp, g_.in);
    if (float* dbp = optionalF32(db)) vec::sumRows(dyp, dbp, g_.n, g_.out);
    if (float* dxp = optionalF32(dx))
      sgemm(false, false, g_.n, g_.in, g_.out, 1.0f, dyp, g_.out, w.f32(), g_.in, 0.0f, dxp, g_.in);
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
