// Convolution, three ways: oneDNN's convolution primitives in the layouts they choose (blocked
// channels), with reorders from and to NCHW at the op's boundary; or, for few input channels,
// im2col + one sgemm per chunk of images (the chunk's columns side by side, so the GEMM is wide
// even when a feature map is small), threads splitting the batch, each keeping its own
// weight-gradient partial; or, for few input channels and narrow outputs, the direct kernels of
// direct_conv.h, split the same way.
#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_util.h"
#include "kernels/cpu/direct_conv.h"
#include "kernels/cpu/dnnl_util.h"
#include "kernels/cpu/vec.h"
#include "troupe/error.h"

namespace troupe::kernels::cpu {
namespace {

// Convolutions with fewer input channels run as im2col + sgemm (measured on LeNet's conv1).
constexpr std::int64_t kMinDnnlChannels = 4;

// Target size of one thread's column buffer, in floats (about half a core's L2).
constexpr std::int64_t kColumnBudget = 128 * 1024;

class CpuConv final : public ConvOp {
 public:
  CpuConv(const ConvGeometry& g, int threads)
      : g_(g),
        threads_(threads),
        oh_(g.outHeight()),
        ow_(g.outWidth()),
        p_(oh_ * ow_),
        k_(g.channels * g.kernel * g.kernel),
        direct_(directConvFits(g)) {
    TROUPE_ENFORCE(oh_ > 0 && ow_ > 0, "convolution output of ", oh_, "x", ow_);
    const std::int64_t per_thread = (g.n + threads - 1) / threads;
    chunk_ = std::clamp<std::int64_t>(kColumnBudget / (k_ * p_), 1,
                                      std::max<std::int64_t>(1, per_thread));
    col_.resize(threads * k_ * chunk_ * p_);
    buf_.resize(threads * g.out_channels * chunk_ * p_);
    dw_.resize(threads * g.out_channels * k_);
    db_.resize(threads * g.out_channels);
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    check(x, y);
    useThreads(threads_);
    const float* xp = x.f32();
    const float* wp = w.f32();
    const float* bp = g_.bias ? b.f32() : nullptr;
    float* yp = y.f32();
    const std::int64_t oc = g_.out_channels, chw = g_.channels * g_.height * g_.width;
#pragma omp parallel num_threads(threads_)
    {
      const int t = omp_get_thread_num();
      std::int64_t begin, end;
      splitRange(g_.n, t, omp_get_num_threads(), begin, end);
      if (direct_) {
        directConvForward(g_, xp + begin * chw, wp, bp, yp + begin * oc * p_, end - begin);
        begin = end;
      }
      float* col = col_.data() + t * k_ * chunk_ * p_;
      float* buf = buf_.data() + t * oc * chunk_ * p_;
      for (std::int64_t i0 = begin; i0 < end; i0 += chunk_) {
        const std::int64_t nb = std::min(chunk_, end - i0), cols = nb * p_;
        im2col(xp + i0 * chw, nb, col);
        sgemm(false, false, oc, cols, k_, 1.0f, wp, k_, col, cols, 0.0f, buf, cols);
        for (std::int64_t img = 0; img < nb; ++img)
          for (std::int64_t o = 0; o < oc; ++o) {
            const float* src = buf + o * cols + img * p_;
            float* dst = yp + ((i0 + img) * oc + o) * p_;
            vec::addScalar(src, bp ? bp[o] : 0.0f, dst, p_);
          }
      }
    }
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                const Tensor& dw, const Tensor& db) override {
    check(x, dy);
    useThreads(threads_);
    const float* xp = x.f32();
    const float* wp = w.f32();
    const float* dyp = dy.f32();
    float* dxp = optionalF32(dx);
    float* dwp = optionalF32(dw);
    float* dbp = g_.bias ? optionalF32(db) : nullptr;
    const std::int64_t oc = g_.out_channels, chw = g_.channels * g_.height * g_.width;
#pragma omp parallel num_threads(threads_)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::int64_t begin, end;
      splitRange(g_.n, t, nt, begin, end);
      float* col = col_.data() + t * k_ * chunk_ * p_;
      float* buf = buf_.data() + t * oc * chunk_ * p_;
      float* pdw = dw_.data() + t * oc * k_;
      float* pdb = db_.data() + t * oc;
      std::fill(pdw, pdw + oc * k_, 0.0f);
      std::fill(pdb, pdb + oc, 0.0f);
      if (direct_ && !dxp) {
        directConvWeightGrad(g_, xp + begin * chw, dyp + begin * oc * p_, end - begin, pdw,
                             dbp ? pdb : nullptr);
        begin = end;
      }
      for (std::int64_t i0 = begin; i0 < end; i0 += chunk_) {
        const std::int64_t nb = std::min(chunk_, end - i0), cols = nb * p_;
        for (std::int64_t img = 0; img < nb; ++img)
          for (std::int64_t o = 0; o < oc; ++o) {
            const float* src = dyp + ((i0 + img) * oc + o) * p_;
            float* dst = buf + o * cols + img * p_;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (std::int64_t q = 0; q < p_; ++q) {
              dst[q] = src[q];
              sum += src[q];
            }
            pdb[o] += sum;
          }
        if (dwp) {
          im2col(xp + i0 * chw, nb, col);
          sgemm(false, true, oc, k_, cols, 1.0f, buf, cols, col, cols, 1.0f, pdw, k_);
        }
        if (dxp) {
          sgemm(true, false, k_, cols, oc, 1.0f, wp, k_, buf, cols, 0.0f, col, cols);
          col2im(col, nb, dxp + i0 * chw);
        }
      }
#pragma omp barrier
      if (dwp) reduce(dw_.data(), oc * k_, nt, t, dwp);
      if (dbp) reduce(db_.data(), oc, nt, t, dbp);
    }
  }

 private:
  void check(const Tensor& x, const Tensor& y) const {
    TROUPE_ENFORCE_EQ(x.numel(), g_.n * g_.channels * g_.height * g_.width);
    TROUPE_ENFORCE_EQ(y.numel(), g_.n * g_.out_channels * p_);
  }

  // Sums the per-thread partials; this thread writes its share of the elements.
  static void reduce(const float* partials, std::int64_t size, int nt, int t, float* out) {
    std::int64_t begin, end;
    splitRange(size, t, nt, begin, end);
    for (std::int64_t i = begin; i < end; ++i) {
      float s = partials[i];
      for (int r = 1; r < nt; ++r)
        s += partials[r * size + i];
      out[i] = s;
    }
  }

  // col[(c, ki, kj)][img * p + oy * ow + ox] = x[img][c][oy * s - pad + ki][ox * s - pad + kj].
  void im2col(const float* x, std::int64_t nb, float* col) const {
    const std::int64_t kk = g_.kernel, s = g_.stride, pad = g_.pad, h = g_.height, wd = g_.width;
    const std::int64_t cols = nb * p_;
    for (std::int64_t c = 0; c < g_.channels; ++c)
      for (std::int64_t ki = 0; ki < kk; ++ki)
        for (std::int64_t kj = 0; kj < kk; ++kj) {
          float* row = col + ((c * kk + ki) * kk + kj) * cols;
          // Output columns [ox_lo, ox_hi) read inside the image.
          const std::int64_t ox_lo = std::clamp<std::int64_t>((pad - kj + s - 1) / s, 0, ow_);
          const std::int64_t ox_hi =
              std::clamp<std::int64_t>((wd + pad - kj + s - 1) / s, ox_lo, ow_);
          for (std::int64_t img = 0; img < nb; ++img) {
            const float* plane = x + (img * g_.channels + c) * h * wd;
            for (std::int64_t oy = 0; oy < oh_; ++oy) {
              float* out = row + img * p_ + oy * ow_;
              const std::int64_t iy = oy * s - pad + ki;
              if (iy < 0 || iy >= h) {
                std::fill(out, out + ow_, 0.0f);
                continue;
              }
              const float* in = plane + iy * wd - pad + kj;
              for (std::int64_t ox = 0; ox < ox_lo; ++ox)
                out[ox] = 0.0f;
              if (s == 1) {
#pragma omp simd
                for (std::int64_t ox = ox_lo; ox < ox_hi; ++ox)
                  out[ox] = in[ox];
              } else {
                for (std::int64_t ox = ox_lo; ox < ox_hi; ++ox)
                  out[ox] = in[ox * s];
              }
              for (std::int64_t ox = ox_hi; ox < ow_; ++ox)
                out[ox] = 0.0f;
            }
          }
        }
  }

  // The adjoint of im2col: dx = sum of the columns over the pixels they read (overwrites dx).
  void col2im(const float* col, std::int64_t nb, float* dx) const {
    const std::int64_t kk = g_.kernel, s = g_.stride, pad = g_.pad, h = g_.height, wd = g_.width;
    const std::int64_t cols = nb * p_;
    std::fill(dx, dx + nb * g_.channels * h * wd, 0.0f);
    for (std::int64_t img = 0; img < nb; ++img)
      for (std::int64_t c = 0; c < g_.channels; ++c) {
        float* plane = dx + (img * g_.channels + c) * h * wd;
        for (std::int64_t ki = 0; ki < kk; ++ki)
          for (std::int64_t kj = 0; kj < kk; ++kj) {
            const float* row = col + ((c * kk + ki) * kk + kj) * cols + img * p_;
            const std::int64_t ox_lo = std::clamp<std::int64_t>((pad - kj + s - 1) / s, 0, ow_);
            const std::int64_t ox_hi =
                std::clamp<std::int64_t>((wd + pad - kj + s - 1) / s, ox_lo, ow_);
            for (std::int64_t oy = 0; oy < oh_; ++oy) {
              const std::int64_t iy = oy * s - pad + ki;
              if (iy < 0 || iy >= h) continue;
              float* out = plane + iy * wd - pad + kj;
              const float* in = row + oy * ow_;
              if (s == 1) {
#pragma omp simd
                for (std::int64_t ox = ox_lo; ox < ox_hi; ++ox)
                  out[ox] += in[ox];
              } else {
                for (std::int64_t ox = ox_lo; ox < ox_hi; ++ox)
                  out[ox * s] += in[ox];
              }
            }
          }
      }
  }

  ConvGeometry g_;
  int threads_;
  std::int64_t oh_, ow_, p_, k_, chunk_;
  // Forward, and backward without dx (a first layer), by the direct kernels (direct_conv.h).
  bool direct_;
  std::vector<float> col_, buf_, dw_, db_;
};

// oneDNN's forward, backward-data and backward-weights primitives, made once for the geometry.
// Bitwise repeatable for a fixed thread count (oneDNN splits its reductions by thread).
class DnnlConv final : public ConvOp {
 public:
  DnnlConv(const ConvGeometry& g, int threads, DnnlContext& ctx)
      : g_(g), threads_(threads), ctx_(ctx) {
    using namespace dnnl;
    useThreads(threads);  // oneDNN fixes a primitive's thread split when creating it
    const memory::dims src{g.n, g.channels, g.height, g.width};
    const memory::dims wei{g.out_channels, g.channels, g.kernel, g.kernel};
    const memory::dims bias{g.out_channels};
    const memory::dims dst{g.n, g.out_channels, g.outHeight(), g.outWidth()};
    const memory::dims strides{g.stride, g.stride}, pad{g.pad, g.pad};
    const auto& eng = ctx.engine;
    const primitive_attr attr = userScratchpad();
    const memory::desc bias_md = g.bias ? plainDesc(bias) : memory::desc();
    // Channel counts that are multiples of 16 fill oneDNN's blocked layouts (nChw16c); others
    // would be padded up to them, so those run in NHWC (brgemm kernels, no padding).
    const bool blocked = g.channels % 16 == 0 && g.out_channels % 16 == 0;
    auto act = [&](const memory::dims& d) {
      return blocked ? anyDesc(d)
                     : memory::desc(d, memory::data_type::f32, memory::format_tag::nhwc);
    };
    const convolution_forward::desc fd(prop_kind::forward_training, algorithm::convolution_direct,
                                       act(src), anyDesc(wei), bias_md, act(dst), strides, pad,
                                       pad);
    const convolution_forward::primitive_desc fpd(fd, attr, eng);
    const convolution_backward_data::primitive_desc dpd(
        convolution_backward_data::desc(algorithm::convolution_direct, act(src), anyDesc(wei),
                                        act(dst), strides, pad, pad),
        attr, eng, fpd);
    const convolution_backward_weights::primitive_desc wpd(
        convolution_backward_weights::desc(algorithm::convolution_direct, act(src), anyDesc(wei),
                                           bias_md, act(dst), strides, pad, pad),
        attr, eng, fpd);
    fwd_ = convolution_forward(fpd);
    bwd_data_ = convolution_backward_data(dpd);
    bwd_weights_ = convolution_backward_weights(wpd);
    f_src_ = Relayout(plainDesc(src), fpd.src_desc(), eng);
    f_wei_ = Relayout(plainDesc(wei), fpd.weights_desc(), eng);
    f_dst_ = Relayout(plainDesc(dst), fpd.dst_desc(), eng);
    d_ddst_ = Relayout(plainDesc(dst), dpd.diff_dst_desc(), eng);
    d_wei_ = Relayout(plainDesc(wei), dpd.weights_desc(), eng);
    d_dsrc_ = Relayout(plainDesc(src), dpd.diff_src_desc(), eng);
    w_src_ = Relayout(plainDesc(src), wpd.src_desc(), eng);
    w_ddst_ = Relayout(plainDesc(dst), wpd.diff_dst_desc(), eng);
    w_dwei_ = Relayout(plainDesc(wei), wpd.diff_weights_desc(), eng);
    bias_ = memory(plainDesc(bias), eng, DNNL_MEMORY_NONE);
    const std::size_t pad_bytes =
        std::max({fpd.scratchpad_desc().get_size(), dpd.scratchpad_desc().get_size(),
                  wpd.scratchpad_desc().get_size()});
    scratch_ = memory(memory::desc({static_cast<memory::dim>(pad_bytes)}, memory::data_type::u8,
                                   memory::format_tag::a),
                      eng);
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    check(x, y);
    useThreads(threads_);
    auto& s = ctx_.stream;
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, f_src_.in(x.f32(), s)},
                                               {DNNL_ARG_WEIGHTS, f_wei_.in(w.f32(), s)},
                                               {DNNL_ARG_DST, f_dst_.out(y.f32())},
                                               {DNNL_ARG_SCRATCHPAD, scratch_}};
    if (g_.bias) {
      bias_.set_data_handle(b.f32());
      args.emplace(DNNL_ARG_BIAS, bias_);
    }
    fwd_.execute(s, args);
    f_dst_.finish(y.f32(), s);
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                const Tensor& dw, const Tensor& db) override {
    check(x, dy);
    useThreads(threads_);
    auto& s = ctx_.stream;
    float* dxp = optionalF32(dx);
    float* dwp = optionalF32(dw);
    float* dbp = g_.bias ? optionalF32(db) : nullptr;
    if (dwp || dbp) {
      if (!dwp) {  // oneDNN computes both together
        unused_.resize(g_.out_channels * g_.channels * g_.kernel * g_.kernel + g_.out_channels);
        dwp = unused_.data();
      }
      std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, w_src_.in(x.f32(), s)},
                                                 {DNNL_ARG_DIFF_DST, w_ddst_.in(dy.f32(), s)},
                                                 {DNNL_ARG_DIFF_WEIGHTS, w_dwei_.out(dwp)},
                                                 {DNNL_ARG_SCRATCHPAD, scratch_}};
      if (g_.bias) {
        if (!dbp) {
          unused_.resize(g_.out_channels * g_.channels * g_.kernel * g_.kernel + g_.out_channels);
          dbp = unused_.data() + g_.out_channels * g_.channels * g_.kernel * g_.kernel;
        }
        bias_.set_data_handle(dbp);
        args.emplace(DNNL_ARG_DIFF_BIAS, bias_);
      }
      bwd_weights_.execute(s, args);
      w_dwei_.finish(dwp, s);
    }
    if (dxp) {
      // dy in the layout backward-weights had it reordered to, if that is the one wanted here.
      const bool reordered = (dwp || dbp) && w_ddst_.sameInner(d_ddst_);
      bwd_data_.execute(s,
                        {{DNNL_ARG_DIFF_DST, reordered ? w_ddst_.last() : d_ddst_.in(dy.f32(), s)},
                         {DNNL_ARG_WEIGHTS, d_wei_.in(w.f32(), s)},
                         {DNNL_ARG_DIFF_SRC, d_dsrc_.out(dxp)},
                         {DNNL_ARG_SCRATCHPAD, scratch_}});
      d_dsrc_.finish(dxp, s);
    }
  }

 private:
  void check(const Tensor& x, const Tensor& y) const {
    TROUPE_ENFORCE_EQ(x.numel(), g_.n * g_.channels * g_.height * g_.width);
    TROUPE_ENFORCE_EQ(y.numel(), g_.n * g_.out_channels * g_.outHeight() * g_.outWidth());
  }

  ConvGeometry g_;
  int threads_;
  DnnlContext& ctx_;
  dnnl::convolution_forward fwd_;
  dnnl::convolution_backward_data bwd_data_;
  dnnl::convolution_backward_weights bwd_weights_;
  Relayout f_src_, f_wei_, f_dst_, d_ddst_, d_wei_, d_dsrc_, w_src_, w_ddst_, w_dwei_;
  dnnl::memory bias_, scratch_;
  std::vector<float> unused_;  // gradients oneDNN computes but the caller does not want
};

}  // namespace

std::unique_ptr<ConvOp> makeConv(const ConvGeometry& g, int threads, DnnlContext& dnnl) {
  TROUPE_ENFORCE(
      g.n > 0 && g.channels > 0 && g.out_channels > 0 && g.kernel > 0 && g.stride > 0 && g.pad >= 0,
      "bad convolution geometry");
  // With a few input channels (a first layer) the GEMM is as fast as oneDNN's kernels, and the
  // oneDNN path would add reorders of the large output at the op's boundary.
  if (g.channels < kMinDnnlChannels) return std::make_unique<CpuConv>(g, threads);
  return std::make_unique<DnnlConv>(g, threads, dnnl);
}

}  // namespace troupe::kernels::cpu
