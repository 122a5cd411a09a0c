// The CUDA plugin (kernels/cuda_plugin.h): that it loads and reports its libraries everywhere, and,
// on a machine with a GPU, every CUDA op against the CPU op on the same random inputs. The GPU
// tests skip, saying why, where there is no GPU: the only tests of the suite that may skip.
//
// Tolerance: TF32 is off (CudaOptions::tf32 false), so both backends compute in IEEE fp32 and
// differ only in summation order. A sum of K float terms is within gammaN(K) * sum |terms| of the
// exact value on each side (float_bounds.h); the largest K here is 3 * 3 * 16 = 144 (convolution)
// and 8 * 6 * 6 = 288 (batch norm over a channel), gammaN(288) = 1.7e-5, with sum |terms| within a
// few times the largest output for these inputs (uniform in [-1, 1]). The bound, a
// normwise relative error of at most 1e-4 (max |cpu - gpu| / max |cpu|), holds with that margin;
// a wrong index or a missing term is off by O(1).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/communicator.h"
#include "kernels/cuda_plugin.h"
#include "kernels/net.h"
#include "kernels/optimizer.h"
#include "kernels/random.h"
#include "troupe/config.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

constexpr double kRelative = 1e-4;

TEST(CudaPlugin, LoadsWhereBuiltAndReportsTheLibrariesItRunsWith) {
  const CudaInfo& info = cudaInfo();
  if (!TROUPE_USE_CUDA) {
    EXPECT_FALSE(info.loaded);
    EXPECT_NE(info.problem.find("libtroupe_cuda.so"), std::string::npos) << info.problem;
    return;
  }
  ASSERT_TRUE(info.loaded) << info.problem;
  EXPECT_NE(info.library.find("libtroupe_cuda.so"), std::string::npos) << info.library;
  EXPECT_GE(info.runtime, 12000) << "CUDA runtime";
  EXPECT_GE(info.cudnn, 90000) << "cuDNN 9";
  EXPECT_GT(info.cublas, 0);
  EXPECT_GE(info.nccl, 20000) << "NCCL 2";
  EXPECT_NE(info.architectures.find("sm_"), std::string::npos) << info.architectures;
}

TEST(CudaPlugin, ABackendOnAMissingDeviceIsRefusedNamingIt) {
  const int missing = static_cast<int>(cudaInfo().devices.size());  // one past the last
  try {
    makeCudaBackend(missing);
    FAIL() << "cuda:" << missing << " made a backend";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda:" + std::to_string(missing)), std::string::npos) << what;
    if (cudaInfo().devices.empty()) {
      EXPECT_TRUE(what.find("no CUDA device") != std::string::npos ||
                  what.find("not loadable") != std::string::npos)
          << what;
    } else {
      EXPECT_NE(what.find("CUDA device(s)"), std::string::npos) << what;
    }
  }
}

Tensor randomHost(Shape shape, std::uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::host(std::move(shape));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.f32()[i] = lo + (hi - lo) * uniform01(randomBits(7, stream, static_cast<std::uint64_t>(i)));
  return t;
}

// max |a - b| / max |a| (absolute where a is all zeros).
double relativeError(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(double(a.f32()[i]) - b.f32()[i]));
    scale = std::max(scale, std::abs(double(a.f32()[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cudaInfo().devices.empty()) {
      GTEST_SKIP() << "no CUDA device, so no CUDA op runs here: "
                   << (cudaInfo().problem.empty() ? "none found" : cudaInfo().problem);
    }
    cpu_ = makeCpuBackend(1);
    gpu_ = makeCudaBackend(0, CudaOptions{.tf32 = false});
  }

  // The host tensor on the GPU.
  Tensor up(const Tensor& host) {
    Tensor t = gpu_->empty(host.shape(), host.dtype());
    gpu_->copy(host, t);
    return t;
  }
  // The GPU tensor on the host, once the queued work is done.
  Tensor down(const Tensor& device) {
    Tensor t = Tensor::host(device.shape(), device.dtype());
    gpu_->copy(device, t);
    gpu_->synchronize();
    return t;
  }
  // A host [n, c, s] NCHW tensor as NHWC ([n][s][c] in memory), and back: how channels-last
  // ops (kernels/ops.h) see the CPU's images.
  Tensor nhwcOf(const Tensor& nchw, std::int64_t n, std::int64_t c, std::int64_t s) {
    Tensor t = Tensor::host(nchw.shape());
    cpu_->transpose(nchw, t, n, c, s);
    return t;
  }
  Tensor nchwOf(const Tensor& nhwc, std::int64_t n, std::int64_t c, std::int64_t s) {
    Tensor t = Tensor::host(nhwc.shape());
    cpu_->transpose(nhwc, t, n, s, c);
    return t;
  }
  Tensor copyOf(const Tensor& host) {
    Tensor t = Tensor::host(host.shape(), host.dtype());
    std::memcpy(t.raw(), host.raw(), host.bytes());
    return t;
  }
  void expectClose(const char* what, const Tensor& cpu, const Tensor& gpu, double tol = kRelative) {
    const Tensor g = gpu.device().kind == DeviceKind::kCuda ? down(gpu) : gpu;
    ASSERT_EQ(cpu.numel(), g.numel()) << what;
    EXPECT_LE(relativeError(cpu, g), tol) << what;
  }

  // Batch norm `g` training on the CPU, the reference for a GPU's: its outputs and gradients;
  // the running statistics `mean` and `var` are updated in place.
  struct BatchNormRun {
    Tensor y, dx, dgamma, dbeta;
  };
  BatchNormRun cpuBatchNorm(const BatchNormGeometry& g, const Tensor& x, const Tensor& gamma,
                            const Tensor& beta, const Tensor& dy, const Tensor& mean,
                            const Tensor& var) {
    BatchNormRun r{Tensor::host(x.shape()), Tensor::host(x.shape()), Tensor::host(gamma.shape()),
                   Tensor::host(beta.shape())};
    auto op = cpu_->makeBatchNorm(g);
    op->forward(x, Tensor(), gamma, beta, mean, var, r.y, /*train=*/true);
    op->backward(x, r.y, gamma, dy, r.dx, Tensor(), r.dgamma, r.dbeta);
    return r;
  }

  // Convolution `g` on the CPU (NCHW), the reference for a GPU's: y, and the gradients of dy.
  struct ConvRun {
    Tensor y, dx, dw, db;
  };
  ConvRun cpuConv(const ConvGeometry& g, const Tensor& x, const Tensor& w, const Tensor& b,
                  const Tensor& dy) {
    ConvRun r{Tensor::host(dy.shape()), Tensor::host(x.shape()), Tensor::host(w.shape()),
              Tensor::host({g.out_channels})};
    auto op = cpu_->makeConv(g);
    op->forward(x, w, b, r.y);
    op->backward(x, w, dy, r.dx, r.dw, r.db);
    return r;
  }

  // `x` with each value rounded to `type` (what a GPU tensor of that type holds).
  Tensor roundedTo(const Tensor& x, DType type) {
    if (type == DType::kFloat32) return x;
    Tensor narrow = Tensor::host(x.shape(), type), out = Tensor::host(x.shape());
    cpu_->cast(x, narrow);
    cpu_->cast(narrow, out);
    return out;
  }
  // The host float tensor on the GPU as `type`, and a GPU tensor back as a host float one.
  Tensor upAs(const Tensor& host, DType type) {
    const Tensor wide = up(host);
    if (type == DType::kFloat32) return wide;
    Tensor t = gpu_->empty(host.shape(), type);
    gpu_->cast(wide, t);
    return t;
  }
  Tensor downAsFloat(const Tensor& device) {
    if (device.dtype() == DType::kFloat32) return down(device);
    Tensor wide = gpu_->empty(device.shape());
    gpu_->cast(device, wide);
    return down(wide);
  }

  // [n, c, s] host images (NCHW, float) on the GPU as `type`, NHWC with channels_last, and back.
  Tensor laidUp(const Tensor& nchw, std::int64_t n, std::int64_t c, std::int64_t s,
                bool channels_last, DType type) {
    return upAs(channels_last ? nhwcOf(nchw, n, c, s) : nchw, type);
  }
  Tensor laidDown(const Tensor& gpu, std::int64_t n, std::int64_t c, std::int64_t s,
                  bool channels_last) {
    const Tensor host = downAsFloat(gpu);
    return channels_last ? nchwOf(host, n, c, s) : host;
  }
  // A batch norm's images so, in the op's layout (NHWC when g.channels_last).
  Tensor imagesUp(const Tensor& nchw, const BatchNormGeometry& g, DType type) {
    return laidUp(nchw, g.n, g.channels, g.spatial, g.channels_last, type);
  }
  Tensor imagesDown(const Tensor& gpu, const BatchNormGeometry& g) {
    return laidDown(gpu, g.n, g.channels, g.spatial, g.channels_last);
  }

  // Batch norm with its ReLU (BatchNormGeometry::relu, which the net fuses), and with a residual
  // add before the ReLU (add), each way ($TROUPE_CUDA_BATCH_NORM) and layout, in `type`: y is the
  // CPU's batch norm's (plus z), where above 0, else 0; the gradients are the CPU batch norm's of
  // dy where the GPU's own y > 0 (its mask, so that an output within rounding of 0 on one side
  // cannot flip the reference), and z's is that masked dy.
  // Channels: 5, and 8, a multiple of 4 as cuDNN's fused persistent calls take (in NHWC, 16-bit).
  void expectBatchNormReluAgrees(DType type, double tol) {
    for (const auto& [add, channels] : {std::pair{false, 5}, {true, 5}, {false, 8}, {true, 8}}) {
      SCOPED_TRACE(::testing::Message()
                   << (add ? "with add" : "without add") << ", " << channels << " channels");
      forEachBatchNormWay([&](bool channels_last) {
        BatchNormGeometry g{8, channels, 36, 0.1f, 1e-5f};
        const Shape xs{g.n, g.channels, g.spatial};
        const Tensor x = roundedTo(randomHost(xs, 71, -2.0f, 3.0f), type),
                     gamma = randomHost({g.channels}, 72),
                     beta = randomHost({g.channels}, 73, -0.5f, 0.5f),
                     dy = roundedTo(randomHost(xs, 74), type),
                     z = roundedTo(randomHost(xs, 75), type);
        Tensor rm = Tensor::host({g.channels}), rv = Tensor::host({g.channels});
        cpu_->fill(rv, 1.0f);
        const Tensor grm = up(rm), grv = up(rv);
        auto c = cpu_->makeBatchNorm(g);
        Tensor v = Tensor::host(xs);
        c->forward(x, Tensor(), gamma, beta, rm, rv, v, /*train=*/true);
        g.relu = true;
        g.add = add;
        g.channels_last = channels_last;
        auto d = gpu_->makeBatchNorm(g);
        auto layout = [&](const Tensor& nchw) { return imagesUp(nchw, g, type); };
        auto unlayout = [&](const Tensor& gpu) { return imagesDown(gpu, g); };
        const Tensor gx = layout(x), ggamma = up(gamma), gdy = layout(dy);
        Tensor gy = gpu_->empty(xs, type), gdx = gpu_->empty(xs, type), gdz = gpu_->empty(xs, type),
               gdg = gpu_->empty({g.channels}), gdbeta = gpu_->empty({g.channels});
        d->forward(gx, add ? layout(z) : Tensor(), ggamma, up(beta), grm, grv, gy,
                   /*train=*/true);
        d->backward(gx, gy, ggamma, gdy, gdx, add ? gdz : Tensor(), gdg, gdbeta);
        const Tensor y = unlayout(gy);
        Tensor relu_v = Tensor::host(xs), masked = Tensor::host(xs);
        for (std::int64_t i = 0; i < v.numel(); ++i) {
          relu_v.f32()[i] = std::max(v.f32()[i] + (add ? z.f32()[i] : 0.0f), 0.0f);
          masked.f32()[i] = y.f32()[i] > 0.0f ? dy.f32()[i] : 0.0f;
        }
        Tensor dx = Tensor::host(xs), dg = Tensor::host({g.channels}),
               dbeta = Tensor::host({g.channels});
        c->backward(x, v, gamma, masked, dx, Tensor(), dg, dbeta);
        expectClose("y", relu_v, y, tol);
        expectClose("dx", dx, unlayout(gdx), tol);
        if (add) expectClose("dz", masked, unlayout(gdz), tol);
        expectClose("running mean", rm, grm, tol);
        expectClose("dgamma", dg, gdg, tol);
        expectClose("dbeta", dbeta, gdbeta, tol);
      });
    }
  }
  // `check(channels_last)` for each way a batch norm may start from ($TROUPE_CUDA_BATCH_NORM;
  // unset, the default: cuDNN's persistent calls, or in NCHW troupe's kernels where cuDNN refuses a
  // ReLU) and each layout.
  template <typename Check>
  void forEachBatchNormWay(Check check) {
    for (const char* way : {"persistent", "spatial", "wide", "troupe", ""}) {
      for (const bool channels_last : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "way " << (*way ? way : "(default)") << " channels_last " << channels_last);
        if (*way) {
          setenv("TROUPE_CUDA_BATCH_NORM", way, 1);
        } else {
          unsetenv("TROUPE_CUDA_BATCH_NORM");
        }
        check(channels_last);
      }
    }
    unsetenv("TROUPE_CUDA_BATCH_NORM");
  }

  // An op y = f(x, w, b) with backward (x, w, dy) -> (dx, dw, db), convolution or inner product:
  // the CPU's op and the GPU's on the same host inputs, every output compared.
  template <typename Op>
  void expectWeightedOpsAgree(Op& cpu, Op& gpu, const Tensor& x, const Tensor& w, const Tensor& b,
                              const Tensor& dy, bool bias) {
    Tensor y = Tensor::host(dy.shape()), dx = Tensor::host(x.shape()), dw = Tensor::host(w.shape()),
           db = Tensor::host(b.shape());
    cpu.forward(x, w, b, y);
    cpu.backward(x, w, dy, dx, dw, db);
    const Tensor gx = up(x), gw = up(w), gb = up(b), gdy = up(dy);
    Tensor gy = gpu_->empty(dy.shape()), gdx = gpu_->empty(x.shape()), gdw = gpu_->empty(w.shape()),
           gdb = gpu_->empty(b.shape());
    gpu.forward(gx, gw, gb, gy);
    gpu.backward(gx, gw, gdy, gdx, gdw, gdb);
    expectClose("y", y, gy);
    expectClose("dx", dx, gdx);
    expectClose("dw", dw, gdw);
    if (bias) expectClose("db", db, gdb);
  }

  std::unique_ptr<Backend> cpu_, gpu_;
};

TEST_F(CudaOps, ConvolutionForwardAndBackward) {
  for (const auto& g :
       {ConvGeometry{2, 16, 9, 9, 8, 3, 1, 1, true}, ConvGeometry{2, 16, 9, 9, 12, 3, 2, 1, true},
        ConvGeometry{3, 4, 8, 8, 6, 1, 1, 0, false}}) {
    SCOPED_TRACE(::testing::Message() << "kernel " << g.kernel << " stride " << g.stride);
    const Shape xs{g.n, g.channels, g.height, g.width};
    const Shape ys{g.n, g.out_channels, g.outHeight(), g.outWidth()};
    const Tensor x = randomHost(xs, 1),
                 w = randomHost({g.out_channels, g.channels, g.kernel, g.kernel}, 2),
                 b = randomHost({g.out_channels}, 3), dy = randomHost(ys, 4);
    auto c = cpu_->makeConv(g);
    auto d = gpu_->makeConv(g);
    expectWeightedOpsAgree(*c, *d, x, w, b, dy, g.bias);
  }
}

// TROUPE_CUDA_CONV=graph: the convolutions by cuDNN's graph-API plans (kernels/cuda/conv_plan.h),
// each direction and the adding backward, in both layouts, against the CPU's; and cuDNN took
// every plan (a refused one would fall back to the legacy calls, and say so).
TEST_F(CudaOps, ConvolutionsByGraphPlansAgreeWithTheCpu) {
  setenv("TROUPE_CUDA_CONV", "graph", 1);
  ::testing::internal::CaptureStderr();
  for (const bool channels_last : {false, true}) {
    for (auto g : {ConvGeometry{2, 16, 9, 9, 8, 3, 1, 1, false},
                   ConvGeometry{2, 16, 9, 9, 12, 3, 2, 1, false},
                   ConvGeometry{3, 8, 8, 8, 16, 1, 1, 0, false}}) {
      SCOPED_TRACE(::testing::Message() << "kernel " << g.kernel << " stride " << g.stride
                                        << (channels_last ? " channels last" : " NCHW"));
      const std::int64_t hw = g.height * g.width, ohw = g.outHeight() * g.outWidth(),
                         rs = g.kernel * g.kernel;
      const Tensor x = randomHost({g.n, g.channels, g.height, g.width}, 91),
                   w = randomHost({g.out_channels, g.channels, g.kernel, g.kernel}, 92),
                   dy = randomHost({g.n, g.out_channels, g.outHeight(), g.outWidth()}, 93),
                   first = randomHost(x.shape(), 94);
      const auto [y, dx, dw, db] = cpuConv(g, x, w, Tensor(), dy);
      Tensor sum = copyOf(first);
      cpu_->axpy(1.0f, dx, sum);
      g.channels_last = channels_last;
      auto d = gpu_->makeConv(g);
      auto layout = [&](const Tensor& t, std::int64_t n, std::int64_t ch, std::int64_t s) {
        return laidUp(t, n, ch, s, channels_last, DType::kFloat32);
      };
      auto unlayout = [&](const Tensor& t, std::int64_t n, std::int64_t ch, std::int64_t s) {
        return laidDown(t, n, ch, s, channels_last);
      };
      const Tensor gx = layout(x, g.n, g.channels, hw),
                   gw = layout(w, g.out_channels, g.channels, rs),
                   gdy = layout(dy, g.n, g.out_channels, ohw);
      Tensor gy = gpu_->empty(dy.shape()), gdx = gpu_->empty(x.shape()),
             gdw = gpu_->empty(w.shape());
      d->forward(gx, gw, Tensor(), gy);
      d->backward(gx, gw, gdy, gdx, gdw, Tensor());
      expectClose("y", y, unlayout(gy, g.n, g.out_channels, ohw));
      expectClose("dx", dx, unlayout(gdx, g.n, g.channels, hw));
      expectClose("dw", dw, unlayout(gdw, g.out_channels, g.channels, rs));
      const Tensor gsum = layout(first, g.n, g.channels, hw);
      d->backwardAddingToDx(gx, gw, gdy, gsum, gdw, Tensor());
      expectClose("dx added", sum, unlayout(gsum, g.n, g.channels, hw));
    }
  }
  const std::string said = ::testing::internal::GetCapturedStderr();
  unsetenv("TROUPE_CUDA_CONV");
  EXPECT_EQ(said.find("refused a convolution"), std::string::npos) << said;
}

// A ResNet block's input gradient has two writers; the second one's convolution adds its part to
// what the first wrote (cuDNN's backward-data with beta 1), in either layout.
TEST_F(CudaOps, AConvolutionAddsItsInputGradientToWhatDxHolds) {
  for (const bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "channels last" : "NCHW");
    ConvGeometry g{2, 16, 9, 9, 8, 3, 1, 1, false};
    const std::int64_t hw = g.height * g.width, ohw = g.outHeight() * g.outWidth();
    const Tensor x = randomHost({2, 16, 9, 9}, 81), w = randomHost({8, 16, 3, 3}, 82),
                 dy = randomHost({2, 8, g.outHeight(), g.outWidth()}, 83),
                 first = randomHost({2, 16, 9, 9}, 84);
    Tensor dx = Tensor::host(x.shape()), dw = Tensor::host(w.shape()), db = Tensor::host({8});
    cpu_->makeConv(g)->backward(x, w, dy, dx, dw, db);
    Tensor expected = copyOf(first);
    cpu_->axpy(1.0f, dx, expected);
    g.channels_last = channels_last;
    auto d = gpu_->makeConv(g);
    ASSERT_TRUE(d->addsToDx());
    auto layout = [&](const Tensor& t, std::int64_t n, std::int64_t c, std::int64_t s) {
      return laidUp(t, n, c, s, channels_last, DType::kFloat32);
    };
    const Tensor gx = layout(x, 2, 16, hw), gw = layout(w, 8, 16, 9), gdy = layout(dy, 2, 8, ohw);
    const Tensor gdx = layout(first, 2, 16, hw);
    Tensor gdw = gpu_->empty(w.shape()), gdb = gpu_->empty({8});
    d->backwardAddingToDx(gx, gw, gdy, gdx, gdw, gdb);
    const Tensor got = down(gdx);
    expectClose("dx", expected, channels_last ? nchwOf(got, 2, 16, hw) : got);
  }
}

TEST_F(CudaOps, PoolingWithCaffesCeilModeAndClippedAverages) {
  for (const auto method : {PoolMethod::kMax, PoolMethod::kAverage}) {
    for (const bool ceil_mode : {true, false}) {
      PoolGeometry g{2, 3, 7, 7, 3, 2, 1, method, ceil_mode};
      SCOPED_TRACE(::testing::Message()
                   << "max " << (method == PoolMethod::kMax) << " ceil " << ceil_mode);
      const Shape xs{g.n, g.channels, g.height, g.width},
          ys{g.n, g.channels, g.outHeight(), g.outWidth()};
      const Tensor x = randomHost(xs, 5), dy = randomHost(ys, 6);
      auto c = cpu_->makePool(g);
      auto d = gpu_->makePool(g);
      Tensor y = Tensor::host(ys), dx = Tensor::host(xs);
      c->forward(x, y);
      c->backward(dy, dx);
      const Tensor gx = up(x), gdy = up(dy);
      Tensor gy = gpu_->empty(ys), gdx = gpu_->empty(xs);
      d->forward(gx, gy);
      d->backward(gdy, gdx);
      expectClose("y", y, gy);
      expectClose("dx", dx, gdx);
    }
  }
}

TEST_F(CudaOps, InnerProductForwardAndBackward) {
  const InnerProductGeometry g{5, 37, 11};
  const Tensor x = randomHost({g.n, g.in}, 7), w = randomHost({g.out, g.in}, 8),
               b = randomHost({g.out}, 9), dy = randomHost({g.n, g.out}, 10);
  auto c = cpu_->makeInnerProduct(g);
  auto d = gpu_->makeInnerProduct(g);
  expectWeightedOpsAgree(*c, *d, x, w, b, dy, /*bias=*/true);
}

// Each way of cuDNN's that float32 NCHW takes ($TROUPE_CUDA_BATCH_NORM): its persistent Ex calls
// (PyTorch's for training), and its spatial calls.
TEST_F(CudaOps, BatchNormTrainingInferenceAndBackward) {
  for (const char* way : {"persistent", "spatial", "troupe"}) {
    SCOPED_TRACE(::testing::Message() << "way " << way);
    setenv("TROUPE_CUDA_BATCH_NORM", way, 1);
    const BatchNormGeometry g{8, 5, 36, 0.1f, 1e-5f};
    const Shape xs{g.n, g.channels, g.spatial};
    const Tensor x = randomHost(xs, 11, -2.0f, 3.0f), gamma = randomHost({g.channels}, 12),
                 beta = randomHost({g.channels}, 13), dy = randomHost(xs, 14);
    Tensor rm = randomHost({g.channels}, 15), rv = randomHost({g.channels}, 16, 0.5f, 2.0f);
    Tensor grm = up(rm), grv = up(rv);
    auto c = cpu_->makeBatchNorm(g);
    auto d = gpu_->makeBatchNorm(g);
    Tensor y = Tensor::host(xs), dx = Tensor::host(xs), dg = Tensor::host(gamma.shape()),
           dbeta = Tensor::host(beta.shape());
    c->forward(x, Tensor(), gamma, beta, rm, rv, y, /*train=*/true);
    c->backward(x, y, gamma, dy, dx, Tensor(), dg, dbeta);
    const Tensor gx = up(x), ggamma = up(gamma), gbeta = up(beta), gdy = up(dy);
    Tensor gy = gpu_->empty(xs), gdx = gpu_->empty(xs), gdg = gpu_->empty(gamma.shape()),
           gdbeta = gpu_->empty(beta.shape());
    d->forward(gx, Tensor(), ggamma, gbeta, grm, grv, gy, /*train=*/true);
    d->backward(gx, gy, ggamma, gdy, gdx, Tensor(), gdg, gdbeta);
    expectClose("y", y, gy);
    expectClose("running mean", rm, grm);
    expectClose("running var (unbiased)", rv, grv);
    expectClose("dx", dx, gdx);
    expectClose("dgamma", dg, gdg);
    expectClose("dbeta", dbeta, gdbeta);
    c->forward(x, Tensor(), gamma, beta, rm, rv, y, /*train=*/false);
    d->forward(gx, Tensor(), ggamma, gbeta, grm, grv, gy, /*train=*/false);
    expectClose("inference y", y, gy);
  }
  unsetenv("TROUPE_CUDA_BATCH_NORM");
}

TEST_F(CudaOps, BatchNormWithItsReluAgreesWithTheCpusBatchNormThenRelu) {
  expectBatchNormReluAgrees(DType::kFloat32, kRelative);
}

TEST_F(CudaOps, ElementwiseOpsAndTheDropoutMaskOfTheCpu) {
  const std::int64_t n = 10007;  // not a multiple of a block
  const Tensor a = randomHost({n}, 17), b = randomHost({n}, 18), dy = randomHost({n}, 19);
  const Tensor ga = up(a), gb = up(b), gdy = up(dy);
  Tensor y = Tensor::host({n}), dx = Tensor::host({n});
  Tensor gy = gpu_->empty({n}), gdx = gpu_->empty({n});

  auto relu = cpu_->makeRelu(n);
  auto grelu = gpu_->makeRelu(n);
  relu->forward(a, y);
  relu->backward(y, dy, dx);
  grelu->forward(ga, gy);
  grelu->backward(gy, gdy, gdx);
  expectClose("relu y", y, gy, 0);
  expectClose("relu dx", dx, gdx, 0);

  auto drop = cpu_->makeDropout(n, 0.3f);
  auto gdrop = gpu_->makeDropout(n, 0.3f);
  drop->forward(a, y, 99);
  drop->backward(dy, dx);
  gdrop->forward(ga, gy, 99);
  gdrop->backward(gdy, gdx);
  expectClose("dropout y (the same mask)", y, gy, 0);
  expectClose("dropout dx", dx, gdx, 0);

  auto add = cpu_->makeAdd(n);
  auto gadd = gpu_->makeAdd(n);
  add->forward(a, b, y);
  gadd->forward(ga, gb, gy);
  expectClose("add", y, gy, 0);

  Tensor ax = copyOf(b);
  Tensor gax = up(b);
  cpu_->axpy(0.25f, a, ax);
  gpu_->axpy(0.25f, ga, gax);
  cpu_->scale(ax, -3.0f);
  gpu_->scale(gax, -3.0f);
  expectClose("axpy then scale", ax, gax, 1e-6);
  gpu_->fill(gax, 2.5f);
  const Tensor filled = down(gax);
  EXPECT_EQ(filled.f32()[0], 2.5f);
  EXPECT_EQ(filled.f32()[n - 1], 2.5f);
}

// input_dtype uint8: bytes normalised on the GPU as on the CPU, per channel and for all; the
// same float operations, so the same bits.
TEST_F(CudaOps, NormaliseAsTheCpuToTheBit) {
  const Shape shape{5, 3, 17, 19};
  Tensor bytes = Tensor::host(shape, DType::kUInt8);
  for (std::int64_t i = 0; i < bytes.numel(); ++i)
    static_cast<std::uint8_t*>(bytes.raw())[i] = static_cast<std::uint8_t>(i * 37 % 256);
  const Tensor gbytes = up(bytes);
  for (const auto& [mean, scale] : std::vector<std::pair<std::vector<float>, std::vector<float>>>{
           {{123.68f, 116.78f, 103.94f}, {1 / 58.4f, 1 / 57.1f, 1 / 57.4f}},
           {{0.0f}, {1 / 255.0f}}}) {
    Tensor y = Tensor::host(shape);
    Tensor gy = gpu_->empty(shape);
    cpu_->normalise(bytes, y, mean, scale);
    gpu_->normalise(gbytes, gy, mean, scale);
    expectClose("normalised", y, gy, 0);
  }
}

// A stream waits for another's event on the device (no host wait), then copies to pinned memory,
// whose copy is done when its own event says so; timed events measure the device's work.
TEST_F(CudaOps, AnotherStreamWaitsForAnEventBeforeItCopiesToPinnedMemory) {
  auto other = makeCudaBackend(0, CudaOptions{});
  const std::int64_t n = 1 << 24;
  const Tensor t = gpu_->empty({n});
  const Event began = gpu_->recordTimed();
  for (int i = 0; i < 20; ++i)
    gpu_->fill(t, static_cast<float>(i));  // enough work to be running still
  const Event written = gpu_->recordTimed();
  other->waitFor(written);
  const Tensor pinned = other->hostBuffer({n});
  other->copy(t, pinned);
  const Event copied = other->record();
  copied.wait();
  EXPECT_TRUE(written.done());
  // 20 fills of 64 MiB write 1.34 GB: at least 0.28 ms even at an H200's 4.8 TB/s peak.
  EXPECT_GT(gpu_->elapsed(began, written), 0.25e-3);
  EXPECT_EQ(pinned.f32()[0], 19.0f);
  EXPECT_EQ(pinned.f32()[n - 1], 19.0f);
}

// reducer nccl's sums: one group of every GPU here, in this process. Each buffer holds small
// integers, whose sums are exact in float32 in any order; they are written by work queued after
// a long one, so that a sum that did not wait for its buffer's event would read the old zeros.
TEST_F(CudaOps, NcclSumsEveryGpuHereAfterEachBuffersEvent) {
  const int gpus = static_cast<int>(cudaInfo().devices.size());
  CommunicatorSpec spec;
  spec.id = newNcclGroupId();
  spec.ranks = gpus;
  for (int d = 0; d < gpus; ++d)
    spec.devices.push_back(d);
  auto comm = makeNcclCommunicator(spec);
  const std::int64_t n = (1 << 22) + 3;  // NCCL's chunks, and a ragged end
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Tensor> buffers;
  std::vector<Event> ready;
  for (int d = 0; d < gpus; ++d) {
    backends.push_back(makeCudaBackend(d));
    Backend& b = *backends.back();
    buffers.push_back(b.empty({n}));
    const Tensor busy = b.empty({1 << 24});
    for (int i = 0; i < 20; ++i)
      b.fill(busy, static_cast<float>(i));
    b.fill(buffers.back(), static_cast<float>(d + 1));
    ready.push_back(b.record());
  }
  const Event summed = comm->allreduce(buffers, ready);
  summed.wait();
  EXPECT_EQ(comm->error(), "");
  const float expected = static_cast<float>(gpus * (gpus + 1) / 2);
  for (int d = 0; d < gpus; ++d) {
    Tensor host = Tensor::host({n});
    backends[static_cast<std::size_t>(d)]->copy(buffers[static_cast<std::size_t>(d)], host);
    backends[static_cast<std::size_t>(d)]->synchronize();
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < n; ++i)
      wrong += host.f32()[i] != expected;
    EXPECT_EQ(wrong, 0) << "cuda:" << d << ": elements that are not " << expected;
  }
  // Aborted, the group sums no more, and says so.
  comm->abort();
  EXPECT_THROW(comm->allreduce(buffers, ready), Error);
}

// A group whose other ranks never come: an error naming the group after the timeout, not a hang.
TEST_F(CudaOps, AnNcclGroupMissingARankTimesOut) {
  CommunicatorSpec spec;
  spec.id = newNcclGroupId();
  spec.ranks = 2;  // rank 1 is nowhere
  spec.devices = {0};
  spec.timeout = std::chrono::milliseconds(3000);
  const auto began = std::chrono::steady_clock::now();
  try {
    makeNcclCommunicator(spec);
    FAIL() << "a group of 2 formed with 1 rank";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("the group of 2 GPU(s)"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(30));
}

TEST_F(CudaOps, GlobalAveragePooling) {
  const std::int64_t n = 3, c = 7, s = 49;
  const Tensor x = randomHost({n, c, s}, 20), dy = randomHost({n, c}, 21);
  auto op = cpu_->makeGlobalAvgPool(n, c, s);
  auto gop = gpu_->makeGlobalAvgPool(n, c, s);
  Tensor y = Tensor::host({n, c}), dx = Tensor::host({n, c, s});
  Tensor gy = gpu_->empty({n, c}), gdx = gpu_->empty({n, c, s});
  op->forward(x, y);
  op->backward(dy, dx);
  gop->forward(up(x), gy);
  gop->backward(up(dy), gdx);
  expectClose("y", y, gy);
  expectClose("dx", dx, gdx);
}

TEST_F(CudaOps, SoftmaxLossAndABadLabelError) {
  const std::int64_t n = 6, classes = 1000;  // more classes than a block has threads
  const Tensor logits = randomHost({n, classes}, 22, -4.0f, 4.0f);
  Tensor labels = Tensor::host({n}, DType::kInt32);
  for (std::int64_t i = 0; i < n; ++i)
    labels.i32()[i] = static_cast<std::int32_t>((i * 389) % classes);
  auto op = cpu_->makeSoftmaxLoss(n, classes, 0.0f);
  auto gop = gpu_->makeSoftmaxLoss(n, classes, 0.0f);
  Tensor metrics = Tensor::host({2}), d = Tensor::host({n, classes});
  Tensor gmetrics = gpu_->empty({2}), gd = gpu_->empty({n, classes});
  op->forward(logits, labels, metrics);
  op->backward(0.5f, d);
  const Tensor glabels = up(labels);
  gop->forward(up(logits), glabels, gmetrics);
  gop->backward(0.5f, gd);
  const Tensor m = down(gmetrics);
  EXPECT_NEAR(m.f32()[0], metrics.f32()[0], kRelative * std::abs(metrics.f32()[0]));
  EXPECT_EQ(m.f32()[1], metrics.f32()[1]);
  expectClose("dlogits", d, gd);

  // Label smoothing, as the CPU's.
  auto sop = cpu_->makeSoftmaxLoss(n, classes, 0.1f);
  auto gsop = gpu_->makeSoftmaxLoss(n, classes, 0.1f);
  sop->forward(logits, labels, metrics);
  sop->backward(0.5f, d);
  gsop->forward(up(logits), glabels, gmetrics);
  gsop->backward(0.5f, gd);
  const Tensor sm = down(gmetrics);
  EXPECT_NEAR(sm.f32()[0], metrics.f32()[0], kRelative * std::abs(metrics.f32()[0]));
  expectClose("smoothed dlogits", d, gd);

  // On the GPU a bad label comes out at the next synchronize(), not from backward (no host wait).
  labels.i32()[3] = static_cast<std::int32_t>(classes);
  gop->forward(up(logits), up(labels), gmetrics);
  gop->backward(0.5f, gd);
  try {
    gpu_->synchronize();
    FAIL() << "a label of " << classes << " went through";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("label 1000 of sample 3"), std::string::npos) << e.what();
  }
}

TEST_F(CudaOps, SgdUpdateAsTheCpusAndItsFinitenessTest) {
  const std::int64_t n = 5003;
  for (const bool nesterov : {false, true}) {
    Tensor w = randomHost({n}, 23), v = randomHost({n}, 24);
    const Tensor g = randomHost({n}, 25);
    Tensor gw = up(w), gv = up(v);
    cpu_->sgdUpdate(w, g, v, 0.1f, 0.9f, 1e-4f, nesterov);
    gpu_->sgdUpdate(gw, up(g), gv, 0.1f, 0.9f, 1e-4f, nesterov);
    EXPECT_TRUE(cpu_->updatesFinite());
    EXPECT_TRUE(gpu_->updatesFinite());
    expectClose("w", w, gw, 1e-6);
    expectClose("v", v, gv, 1e-6);
  }
  // The test gathers over updates until it is read, and resets then.
  Tensor w = randomHost({n}, 26), v = Tensor::host({n}), g = randomHost({n}, 27);
  g.f32()[n - 1] = INFINITY;
  const Tensor gw = up(w), gv = up(v), good = up(randomHost({n}, 28));
  gpu_->sgdUpdate(gw, up(g), gv, 0.1f, 0.9f, 0.0f, false);
  gpu_->sgdUpdate(up(w), good, up(v), 0.1f, 0.9f, 0.0f, false);
  EXPECT_FALSE(gpu_->updatesFinite());
  gpu_->sgdUpdate(up(w), good, up(v), 0.1f, 0.9f, 0.0f, false);
  EXPECT_TRUE(gpu_->updatesFinite());
}

// Every optimizer of the table as the CPU's, 5 steps over 50001 weights in 20 layers (more chunks
// than a layer, a layer of 1, one exempt from decay), whole and, for the element-wise ones, by
// buckets: the same rule compiled for both (kernels/optimizers/rules.h), so they differ only in
// the CPU's and the GPU's contraction of products into FMAs and, for the layerwise ones, the
// order of the double sums behind a trust ratio (below a float's rounding): under 10 float
// operations an element a step, 5 steps, each off by at most u = 2^-24 relative: 50 u = 3e-6,
// within 1e-5.
TEST_F(CudaOps, EveryOptimizerUpdatesAsTheCpus) {
  const std::int64_t n = 50001;
  std::vector<ParamRange> layers;
  for (std::int64_t k = 0, at = 0; k < 20; ++k) {
    const std::int64_t end = k == 19 ? n : at + (k == 7 ? 1 : 2500);
    layers.emplace_back(at, end);
    at = end;
  }
  for (const auto& row : optimizers()) {
    OptimizerSettings s;
    s.kind = &row;
    s.weight_decay = 1e-3f;
    s.layers = layers;
    s.no_decay = {layers[3]};
    auto on_cpu = makeOptimizer(*cpu_, n, s);
    auto on_gpu = makeOptimizer(*gpu_, n, s);
    Tensor w = randomHost({n}, 40);
    Tensor gw = up(w);
    for (std::int64_t t = 1; t <= 5; ++t) {
      const Tensor g = randomHost({n}, static_cast<std::uint64_t>(40 + t));
      on_cpu->step(w, g, 0.01f, t);
      if (on_gpu->layerwise()) {
        EXPECT_TRUE(on_gpu->step(gw, up(g), 0.01f, t)) << row.name;
      } else {
        const Tensor gg = up(g);
        for (const auto& [lo, hi] : {std::pair<std::int64_t, std::int64_t>{30000, n}, {0, 30000}}) {
          on_gpu->stepRange(gw.slice(lo, hi), gg.slice(lo, hi), lo, hi, 0.01f, t);
        }
        EXPECT_TRUE(on_gpu->finite()) << row.name;
      }
    }
    SCOPED_TRACE(row.name);
    expectClose("weights", w, gw, 1e-5);
    expectClose("state", on_cpu->state(), on_gpu->state(), 1e-5);
  }
}

// Ranges without weight decay (a batch norm's and a bias's, Goyal et al.) in one pass: 100 ranges,
// more than one launch takes (DecayRanges::kMaxRanges), against the CPU's sgdUpdate a range. The
// decay is large, so that an element decayed where it should not be is far off.
TEST_F(CudaOps, SgdUpdateExceptRangesAsTheCpusRangeByRange) {
  const std::int64_t n = 20011;
  std::vector<std::pair<std::int64_t, std::int64_t>> none;
  for (std::int64_t k = 0; k < 100; ++k)
    none.emplace_back(3 + 197 * k, 3 + 197 * k + (k % 7 == 0 ? 1 : 64 + k));
  Tensor w = randomHost({n}, 29), v = randomHost({n}, 30);
  const Tensor g = randomHost({n}, 31);
  Tensor gw = up(w), gv = up(v);
  cpu_->sgdUpdateExcept(w, g, v, 0.1f, 0.9f, 0.5f, false, none);
  gpu_->sgdUpdateExcept(gw, up(g), gv, 0.1f, 0.9f, 0.5f, false, none);
  EXPECT_TRUE(gpu_->updatesFinite());
  expectClose("w", w, gw, 1e-6);
  expectClose("v", v, gv, 1e-6);
}

// LeNet's forward and backward on the GPU against the CPU's: the layers compose on the device.
TEST_F(CudaOps, LenetStepGivesTheCpusLossAndGradients) {
  NetOptions o;
  o.model.name = "lenet";
  o.max_batch = 16;
  auto cnet = makeNet(*cpu_, o);
  auto gnet = makeNet(*gpu_, o);
  const Tensor images = randomHost({16, 1, 28, 28}, 28, 0.0f, 1.0f);
  Tensor labels = Tensor::host({16}, DType::kInt32);
  for (int i = 0; i < 16; ++i)
    labels.i32()[i] = i % 10;
  cnet->forward(images, labels, true);
  cnet->backward(1.0f / 16, [](std::int64_t, std::int64_t, const Event*) {});
  gnet->forward(up(images), up(labels), true);
  gnet->backward(1.0f / 16, [](std::int64_t, std::int64_t, const Event*) {});
  const Tensor cm = copyOf(cnet->metrics()), gm = down(gnet->metrics());
  EXPECT_NEAR(gm.f32()[0], cm.f32()[0], kRelative * std::abs(cm.f32()[0]));
  expectClose("gradients", cnet->grads(), gnet->grads());
}

// A training step by a CUDA graph (NetOptions::graphs) is the step op by op, replayed: the same
// kernels on the same memory, so with cuDNN's deterministic algorithms the same bits, step after
// step, through SGD updates between them. The steps vary what a graph fixes (the images' address,
// the batch size, the gradient scale), so that a graph replayed for inputs it was not recorded
// with, or with a stale scale, would show; and each graph is recorded at its inputs' second
// sighting and replayed from then on.
TEST_F(CudaOps, TrainStepsByCudaGraphsGiveTheBitsOfTheStepsOpByOp) {
  gpu_ = makeCudaBackend(0, CudaOptions{.tf32 = false, .deterministic = true});
  for (const DType precision : {DType::kFloat32, DType::kFloat16}) {
    SCOPED_TRACE(toString(precision));
    NetOptions o;
    o.model.name = "resnet20";
    o.max_batch = 8;
    o.channels = 3;
    o.height = o.width = 32;
    o.precision = precision;
    o.channels_last = precision != DType::kFloat32;
    auto eager = makeNet(*gpu_, o);
    o.graphs = true;
    auto graphed = makeNet(*gpu_, o);
    auto eager_sgd = makeOptimizer(*gpu_, eager->numParams(), OptimizerSettings{});
    auto graphed_sgd = makeOptimizer(*gpu_, graphed->numParams(), OptimizerSettings{});
    auto batch = [&](std::int64_t n, std::uint64_t seed) {
      Tensor labels = Tensor::host({n}, DType::kInt32);
      for (std::int64_t i = 0; i < n; ++i)
        labels.i32()[i] = static_cast<int>((i * 7 + static_cast<std::int64_t>(seed)) % 10);
      return std::make_pair(up(randomHost({n, 3, 32, 32}, seed)), up(labels));
    };
    const auto a = batch(8, 60), b = batch(8, 61), c = batch(4, 62);
    std::int64_t replays = 0;
    struct Step {
      const std::pair<Tensor, Tensor>* batch;
      float scale;
    };
    // Graphs: recorded at steps 2, 6, 9 and 10 (the second sighting of their inputs).
    const std::vector<Step> steps{{&a, 1},    {&a, 1}, {&b, 1}, {&a, 1}, {&a, 0.5f}, {&a, 0.5f},
                                  {&a, 0.5f}, {&c, 1}, {&c, 1}, {&b, 1}, {&b, 1},    {&a, 1}};
    for (std::size_t k = 0; k < steps.size(); ++k) {
      SCOPED_TRACE("step " + std::to_string(k + 1));
      const auto& [images, labels] = *steps[k].batch;
      const float scale = steps[k].scale / static_cast<float>(images.dim(0));
      std::vector<std::pair<std::int64_t, std::int64_t>> eager_ready, graphed_ready;
      std::vector<Event> finals;  // the graph's, of each range, on a replay
      eager->trainStep(images, labels, scale,
                       [&](std::int64_t lo, std::int64_t hi, const Event* final) {
                         EXPECT_EQ(final, nullptr);
                         eager_ready.emplace_back(lo, hi);
                       });
      graphed->trainStep(images, labels, scale,
                         [&](std::int64_t lo, std::int64_t hi, const Event* final) {
                           graphed_ready.emplace_back(lo, hi);
                           if (final) finals.push_back(*final);
                         });
      EXPECT_EQ(graphed_ready, eager_ready);
      const bool replayed = graphed->graphStats().replayed > replays;
      replays = graphed->graphStats().replayed;
      if (replayed) {
        ASSERT_EQ(finals.size(), graphed_ready.size());
        // The first range's event, waited for by another stream (as a reducer's): its gradients
        // are then those the whole step leaves.
        const auto [lo, hi] = graphed_ready.front();
        auto other = makeCudaBackend(0);
        other->waitFor(finals.front());
        Tensor early = Tensor::host({hi - lo});
        other->copy(graphed->grads().slice(lo, hi), early);
        other->synchronize();
        const Tensor whole = down(graphed->grads());
        EXPECT_EQ(std::memcmp(early.raw(), whole.f32() + lo, early.bytes()), 0);
      } else {
        EXPECT_TRUE(finals.empty());
      }
      const Tensor em = down(eager->metrics()), gm = down(graphed->metrics());
      EXPECT_EQ(std::memcmp(em.raw(), gm.raw(), em.bytes()), 0)
          << "loss " << em.f32()[0] << " vs " << gm.f32()[0];
      const Tensor eg = down(eager->grads()), gg = down(graphed->grads());
      EXPECT_EQ(std::memcmp(eg.raw(), gg.raw(), eg.bytes()), 0);
      eager_sgd->stepRange(eager->weights(), eager->grads(), 0, eager->numParams(), 0.05f, 1);
      graphed_sgd->stepRange(graphed->weights(), graphed->grads(), 0, graphed->numParams(), 0.05f,
                             1);
    }
    const Tensor ew = down(eager->weights()), gw = down(graphed->weights());
    EXPECT_EQ(std::memcmp(ew.raw(), gw.raw(), ew.bytes()), 0);
    const StepGraphStats stats = graphed->graphStats();
    EXPECT_EQ(stats.off, "");
    EXPECT_EQ(stats.captured, 4);
    EXPECT_EQ(stats.replayed, 8);
    EXPECT_EQ(eager->graphStats().replayed, 0);
  }
}

// What a capture may not hold is refused by name, nothing of it stays recorded, and the backend
// goes on as before.
TEST_F(CudaOps, ACaptureRefusesAHostWaitAndLeavesTheBackendWorking) {
  const Tensor x = up(randomHost({1000}, 63));
  try {
    gpu_->capture([&] {
      gpu_->scale(x, 5.0f);
      gpu_->synchronize();
    });
    ADD_FAILURE() << "a host wait inside a capture was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("while a CUDA graph is captured"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(gpu_->capture([&] { gpu_->recordTimed(); }), Error);
  EXPECT_THROW(gpu_->capture([&] { gpu_->waitFor(gpu_->record()); }), Error);
  const Tensor before = down(x);
  Event scaled;
  auto graph = gpu_->capture([&] {
    gpu_->scale(x, 2.0f);
    scaled = gpu_->record();
  });
  ASSERT_NE(graph, nullptr);
  expectClose("nothing ran at the capture", before, x, 0);
  graph->replay();
  graph->replay();
  scaled.wait();
  Tensor four = copyOf(before);  // powers of two: exact
  cpu_->scale(four, 4.0f);
  expectClose("two replays", four, x, 0);
}

// The troupe way's sums split a channel into parts (blocks of their own, added in order after):
// 65536 elements a channel here, in 64 parts, in both layouts, with and without the ReLU and add.
// The reference is computed here in double. The GPU's sums are in double too, so what is left is
// its float element-wise arithmetic: a few roundings (2^-24 each) of operands within about ten
// times the result's scale, far below kRelative.
TEST_F(CudaOps, BatchNormInTroupesKernelsSumsAChannelInParts) {
  setenv("TROUPE_CUDA_BATCH_NORM", "troupe", 1);
  for (const auto& [relu, add] : {std::pair{false, false}, {true, false}, {true, true}}) {
    for (const bool channels_last : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "relu " << relu << " add " << add << " channels_last " << channels_last);
      const BatchNormGeometry g{16, 3, 4096, 0.1f, 1e-5f, channels_last, relu, add};
      const std::int64_t count = g.n * g.spatial;
      const Shape xs{g.n, g.channels, g.spatial};
      const Tensor x = randomHost(xs, 81, -2.0f, 3.0f), z = randomHost(xs, 82),
                   dy = randomHost(xs, 83), gamma = randomHost({g.channels}, 84, 0.5f, 1.5f),
                   beta = randomHost({g.channels}, 85, -0.5f, 0.5f);
      auto d = gpu_->makeBatchNorm(g);
      auto layout = [&](const Tensor& nchw) { return imagesUp(nchw, g, DType::kFloat32); };
      auto unlayout = [&](const Tensor& gpu) { return imagesDown(gpu, g); };
      Tensor grm = gpu_->empty({g.channels}), grv = gpu_->empty({g.channels});
      gpu_->fill(grv, 1.0f);
      Tensor gy = gpu_->empty(xs), gdx = gpu_->empty(xs), gdz = gpu_->empty(xs),
             gdg = gpu_->empty({g.channels}), gdb = gpu_->empty({g.channels});
      const Tensor gx = layout(x);
      d->forward(gx, add ? layout(z) : Tensor(), up(gamma), up(beta), grm, grv, gy, true);
      d->backward(gx, gy, up(gamma), layout(dy), gdx, add ? gdz : Tensor(), gdg, gdb);
      const Tensor y = unlayout(gy);
      Tensor ry = Tensor::host(xs), rdx = Tensor::host(xs), rdz = Tensor::host(xs),
             rm = Tensor::host({g.channels}), rv = Tensor::host({g.channels}),
             rdg = Tensor::host({g.channels}), rdb = Tensor::host({g.channels});
      for (std::int64_t c = 0; c < g.channels; ++c) {
        auto at = [&](std::int64_t q) {
          return (q / g.spatial * g.channels + c) * g.spatial + q % g.spatial;
        };
        double sum = 0, squares = 0;
        for (std::int64_t q = 0; q < count; ++q)
          sum += x.f32()[at(q)];
        const double mean = sum / static_cast<double>(count);
        for (std::int64_t q = 0; q < count; ++q)
          squares += (x.f32()[at(q)] - mean) * (x.f32()[at(q)] - mean);
        const double var = squares / static_cast<double>(count);
        const double invstd = 1.0 / std::sqrt(var + g.eps);
        rm.f32()[c] = static_cast<float>(0.1 * mean);
        rv.f32()[c] = static_cast<float>(0.9 + 0.1 * var * count / (count - 1));
        double sdy = 0, sdyx = 0;
        for (std::int64_t q = 0; q < count; ++q) {
          const std::int64_t i = at(q);
          const double xhat = (x.f32()[i] - mean) * invstd;
          double v = gamma.f32()[c] * xhat + beta.f32()[c] + (add ? z.f32()[i] : 0.0);
          if (relu) v = std::max(v, 0.0);
          ry.f32()[i] = static_cast<float>(v);
          // Masked by the GPU's own y, so that an output within rounding of 0 cannot flip it.
          const double masked = !relu || y.f32()[i] > 0.0f ? dy.f32()[i] : 0.0;
          rdz.f32()[i] = static_cast<float>(masked);
          sdy += masked;
          sdyx += masked * xhat;
        }
        rdb.f32()[c] = static_cast<float>(sdy);
        rdg.f32()[c] = static_cast<float>(sdyx);
        for (std::int64_t q = 0; q < count; ++q) {
          const std::int64_t i = at(q);
          const double xhat = (x.f32()[i] - mean) * invstd;
          rdx.f32()[i] = static_cast<float>(gamma.f32()[c] * invstd *
                                            (rdz.f32()[i] - sdy / count - xhat * sdyx / count));
        }
      }
      expectClose("y", ry, y);
      expectClose("dx", rdx, unlayout(gdx));
      if (add) expectClose("dz", rdz, unlayout(gdz));
      expectClose("dgamma", rdg, gdg);
      expectClose("dbeta", rdb, gdb);
      expectClose("running mean", rm, grm);
      expectClose("running var (unbiased)", rv, grv);
    }
  }
  unsetenv("TROUPE_CUDA_BATCH_NORM");
}

// Memory a capture's work frees serves its own later requests (its work runs in stream order, as
// a step's does), and no one else's while the graph lives: a replay writes it again.
TEST_F(CudaOps, ACapturesTemporariesServeItAloneAndReturnWhenItsGraphGoes) {
  if (cudaInfo().architectures == "emulated") {
    GTEST_SKIP() << "the emulated GPU's memory is host memory, with no cache to reuse";
  }
  constexpr std::int64_t kFloats = 1 << 19;  // 2 MiB: one block, as the allocator rounds
  constexpr std::int64_t kBlock = kFloats * 4;
  const Tensor x = up(randomHost({kFloats}, 64));
  const std::int64_t before = gpu_->memory().in_use;
  std::vector<const void*> temps;
  auto graph = gpu_->capture([&] {
    for (int i = 0; i < 8; ++i) {
      const Tensor t = gpu_->empty({kFloats});
      gpu_->axpy(1.0f, x, t);
      temps.push_back(t.raw());
    }
  });
  ASSERT_NE(graph, nullptr);
  for (const void* t : temps)
    EXPECT_EQ(t, temps[0]);
  const Tensor other = gpu_->empty({kFloats});
  EXPECT_NE(other.raw(), temps[0]);
  EXPECT_EQ(gpu_->memory().in_use - before, 2 * kBlock);
  graph->replay();
  gpu_->synchronize();
  graph.reset();
  EXPECT_EQ(gpu_->memory().in_use - before, kBlock);
  const Tensor again = gpu_->empty({kFloats});
  EXPECT_EQ(again.raw(), temps[0]);
}

// ---- float16 and bfloat16 (NetOptions::precision) ----
//
// Tolerance: the inputs are rounded to the reduced type on the host first, and the CPU computes in
// float32 from those same values. A product of two float16s (11-bit significands) or bfloat16s
// (8-bit) is exact in float32 (24 bits), and cuDNN's and cuBLAS's configurations used here
// accumulate in float32, whose part of the error is kRelative's, as above. Each output is then
// rounded once to the reduced type: at most u = 2^-11 (float16) or 2^-8 (bfloat16) relative. A
// transform-based convolution (Winograd) may round its transformed inputs to the type too, which
// is a second u at most: 2u + kRelative in all. A wrong element type read as another (float16 bits
// as bfloat16) is off by orders of magnitude.
class CudaReducedOps : public CudaOps, public ::testing::WithParamInterface<DType> {
 protected:
  DType type() const { return GetParam(); }
  double tolerance() const {
    return 2 * (type() == DType::kFloat16 ? 0x1p-11 : 0x1p-8) + kRelative;
  }
  // The host float tensor with each value rounded to the reduced type (what the GPU will hold).
  Tensor rounded(const Tensor& x) { return roundedTo(x, type()); }
  // On the GPU in the reduced type (cast there from float32), and back to a host float tensor.
  Tensor upReduced(const Tensor& host) { return upAs(host, type()); }
  Tensor empty(const Shape& shape) { return gpu_->empty(shape, type()); }
  Tensor downWide(const Tensor& device) { return downAsFloat(device); }
  void expectNear(const char* what, const Tensor& cpu, const Tensor& gpu_reduced) {
    expectClose(what, cpu, downWide(gpu_reduced), tolerance());
  }
};

TEST_P(CudaReducedOps, CastRoundsAsTheHostDoes) {
  const std::int64_t n = 10007;
  Tensor x = randomHost({n}, 40, -70000.0f, 70000.0f);  // float16 overflows beyond 65504
  x.f32()[0] = 1e-7f;                                   // a float16 subnormal
  const Tensor g = upReduced(x);
  Tensor narrow = Tensor::host({n}, type());
  cpu_->cast(x, narrow);
  const Tensor bits = down(g);
  EXPECT_EQ(std::memcmp(bits.raw(), narrow.raw(), narrow.bytes()), 0);
  expectClose("widened", rounded(x), downWide(g), 0);
}

// Each way of the convolutions ($TROUPE_CUDA_CONV: legacy, graph-API plans, and unset, the
// default, which takes plans for these types) in both layouts.
TEST_P(CudaReducedOps, ConvolutionAndInnerProduct) {
  for (const char* way : {"legacy", "graph", ""}) {
    for (const bool channels_last : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "way " << (*way ? way : "(default)")
                                        << (channels_last ? " channels last" : " NCHW"));
      if (*way) {
        setenv("TROUPE_CUDA_CONV", way, 1);
      } else {
        unsetenv("TROUPE_CUDA_CONV");
      }
      ConvGeometry g{2, 16, 9, 9, 8, 3, 1, 1, true};
      const Shape xs{g.n, g.channels, g.height, g.width}, ys{g.n, g.out_channels, 9, 9};
      const Tensor x = rounded(randomHost(xs, 41)), w = rounded(randomHost({8, 16, 3, 3}, 42)),
                   b = rounded(randomHost({8}, 43)), dy = rounded(randomHost(ys, 44));
      const auto [y, dx, dw, db] = cpuConv(g, x, w, b, dy);
      g.channels_last = channels_last;
      auto d = gpu_->makeConv(g);
      // x [2, 16, 81], w [8, 16, 9], y [2, 8, 81] as [n, c, s].
      const Tensor gx = laidUp(x, 2, 16, 81, channels_last, type()),
                   gw = laidUp(w, 8, 16, 9, channels_last, type()), gb = upReduced(b),
                   gdy = laidUp(dy, 2, 8, 81, channels_last, type());
      Tensor gy = empty(ys), gdx = empty(xs), gdw = empty(w.shape()), gdb = empty({8});
      d->forward(gx, gw, gb, gy);
      d->backward(gx, gw, gdy, gdx, gdw, gdb);
      const double tol = tolerance();
      expectClose("conv y", y, laidDown(gy, 2, 8, 81, channels_last), tol);
      expectClose("conv dx", dx, laidDown(gdx, 2, 16, 81, channels_last), tol);
      expectClose("conv dw", dw, laidDown(gdw, 8, 16, 9, channels_last), tol);
      expectNear("conv db", db, gdb);
      // Added to what dx holds (a ResNet block's input gradient): rounded once, after the sum.
      const Tensor first = rounded(randomHost(xs, 49));
      Tensor sum = copyOf(first);
      cpu_->axpy(1.0f, dx, sum);
      const Tensor gsum = laidUp(first, 2, 16, 81, channels_last, type());
      d->backwardAddingToDx(gx, gw, gdy, gsum, gdw, gdb);
      expectClose("conv dx added", sum, laidDown(gsum, 2, 16, 81, channels_last), tol);
    }
  }
  unsetenv("TROUPE_CUDA_CONV");

  const InnerProductGeometry f{5, 37, 11};
  const Tensor fx = rounded(randomHost({5, 37}, 45)), fw = rounded(randomHost({11, 37}, 46)),
               fb = rounded(randomHost({11}, 47)), fdy = rounded(randomHost({5, 11}, 48));
  Tensor fy = Tensor::host({5, 11}), fdx = Tensor::host({5, 37}), fdw = Tensor::host({11, 37}),
         fdb = Tensor::host({11});
  auto ip = cpu_->makeInnerProduct(f);
  ip->forward(fx, fw, fb, fy);
  ip->backward(fx, fw, fdy, fdx, fdw, fdb);
  auto gip = gpu_->makeInnerProduct(f);
  const Tensor gfx = upReduced(fx), gfw = upReduced(fw), gfdy = upReduced(fdy);
  Tensor gfy = empty({5, 11}), gfdx = empty({5, 37}), gfdw = empty({11, 37}), gfdb = empty({11});
  gip->forward(gfx, gfw, upReduced(fb), gfy);
  gip->backward(gfx, gfw, gfdy, gfdx, gfdw, gfdb);
  expectNear("fc y", fy, gfy);
  expectNear("fc dx", fdx, gfdx);
  expectNear("fc dw", fdw, gfdw);
  expectNear("fc db", fdb, gfdb);
}

// Batch norm reads and writes the reduced type, NCHW or channels last; its scale, shift and
// statistics stay float32. Each way the op may start from ($TROUPE_CUDA_BATCH_NORM): cuDNN's
// persistent Ex calls (PyTorch's), its spatial calls, and the wide way (float32 NCHW copies) that
// the op takes where cuDNN refuses a type or a layout.
TEST_P(CudaReducedOps, BatchNormKeepsItsParametersInFloat32) {
  forEachBatchNormWay([&](bool channels_last) {
    BatchNormGeometry g{8, 5, 36, 0.1f, 1e-5f};
    const Shape xs{g.n, g.channels, g.spatial};
    const Tensor x = rounded(randomHost(xs, 49, -2.0f, 3.0f)), gamma = randomHost({5}, 50),
                 beta = randomHost({5}, 51), dy = rounded(randomHost(xs, 52));
    Tensor rm = Tensor::host({5}), rv = Tensor::host({5});
    cpu_->fill(rv, 1.0f);
    Tensor grm = up(rm), grv = up(rv);
    const auto [y, dx, dg, dbeta] = cpuBatchNorm(g, x, gamma, beta, dy, rm, rv);
    g.channels_last = channels_last;
    auto d = gpu_->makeBatchNorm(g);
    // The GPU's images in its layout, and back.
    auto layout = [&](const Tensor& nchw) { return imagesUp(nchw, g, type()); };
    auto unlayout = [&](const Tensor& gpu) { return imagesDown(gpu, g); };
    const Tensor gx = layout(x), ggamma = up(gamma), gdy = layout(dy);
    Tensor gy = empty(xs), gdx = empty(xs), gdg = gpu_->empty({5}), gdbeta = gpu_->empty({5});
    d->forward(gx, Tensor(), ggamma, up(beta), grm, grv, gy, /*train=*/true);
    d->backward(gx, gy, ggamma, gdy, gdx, Tensor(), gdg, gdbeta);
    expectClose("y", y, unlayout(gy), tolerance());
    expectClose("dx", dx, unlayout(gdx), tolerance());
    expectClose("running mean", rm, grm, tolerance());
    expectClose("dgamma", dg, gdg, tolerance());
    expectClose("dbeta", dbeta, gdbeta, tolerance());
  });
}

TEST_P(CudaReducedOps, BatchNormWithItsReluAgreesWithTheCpusBatchNormThenRelu) {
  expectBatchNormReluAgrees(type(), tolerance());
}

TEST_P(CudaReducedOps, PoolingElementwiseAndTheLoss) {
  const PoolGeometry pg{2, 3, 7, 7, 3, 2, 1, PoolMethod::kMax, true};
  const Shape ps{2, 3, 7, 7}, pys{2, 3, pg.outHeight(), pg.outWidth()};
  const Tensor px = rounded(randomHost(ps, 53)), pdy = rounded(randomHost(pys, 54));
  Tensor py = Tensor::host(pys), pdx = Tensor::host(ps);
  auto pool = cpu_->makePool(pg);
  pool->forward(px, py);
  pool->backward(pdy, pdx);
  auto gpool = gpu_->makePool(pg);
  Tensor gpy = empty(pys), gpdx = empty(ps);
  gpool->forward(upReduced(px), gpy);
  gpool->backward(upReduced(pdy), gpdx);
  expectNear("max pool y", py, gpy);
  expectNear("max pool dx", pdx, gpdx);

  const std::int64_t n = 10007;
  const Tensor a = rounded(randomHost({n}, 55)), b = rounded(randomHost({n}, 56)),
               dy = rounded(randomHost({n}, 57));
  Tensor y = Tensor::host({n}), dx = Tensor::host({n});
  Tensor ga = upReduced(a), gy = empty({n}), gdx = empty({n});
  auto relu = cpu_->makeRelu(n);
  auto grelu = gpu_->makeRelu(n);
  relu->forward(a, y);
  relu->backward(y, dy, dx);
  grelu->forward(ga, gy);
  grelu->backward(gy, upReduced(dy), gdx);
  expectNear("relu y", y, gy);
  expectNear("relu dx", dx, gdx);
  auto add = cpu_->makeAdd(n);
  auto gadd = gpu_->makeAdd(n);
  add->forward(a, b, y);
  gadd->forward(ga, upReduced(b), gy);
  expectNear("add", y, gy);
  Tensor ax = copyOf(b);
  Tensor gax = upReduced(b);
  cpu_->axpy(0.25f, a, ax);
  gpu_->axpy(0.25f, ga, gax);
  expectNear("axpy", ax, gax);

  const std::int64_t rows = 6, classes = 1000;
  const Tensor logits = rounded(randomHost({rows, classes}, 58, -4.0f, 4.0f));
  Tensor labels = Tensor::host({rows}, DType::kInt32);
  for (std::int64_t i = 0; i < rows; ++i)
    labels.i32()[i] = static_cast<std::int32_t>((i * 389) % classes);
  auto loss = cpu_->makeSoftmaxLoss(rows, classes, 0.0f);
  auto gloss = gpu_->makeSoftmaxLoss(rows, classes, 0.0f);
  Tensor metrics = Tensor::host({2}), d = Tensor::host({rows, classes});
  Tensor gmetrics = gpu_->empty({2}), gd = empty({rows, classes});
  loss->forward(logits, labels, metrics);
  loss->backward(0.5f, d);
  gloss->forward(upReduced(logits), up(labels), gmetrics);
  gloss->backward(0.5f, gd);
  expectClose("loss and correct (float32 from the same logits)", metrics, gmetrics);
  expectNear("dlogits", d, gd);
}

// A net in reduced precision on the GPU: its loss and gradients near the CPU's float32 ones. The
// net is smooth (convolution, batch norm, average pooling, inner product, softmax loss: no max and
// no ReLU, whose gradients jump where rounding reorders a window or flips a sign), so first-order
// error analysis holds: each of its 5 layers rounds its output once more than the CPU does,
// forward and back, each within tolerance(), about 10 tolerance() in all. The loss is scaled by
// 2^10 as a run's loss scale would (unscaled, float16's gradients of order 1e-6 would be
// subnormal, with fewer bits than the bound assumes).
TEST_P(CudaReducedOps, ASmoothNetStepInReducedPrecision) {
  NetOptions o;
  o.max_batch = 16;
  o.model.layers = {{"conv", {{"num_output", "8"}, {"kernel", "5"}}},
                    {"bn", {}},
                    {"pool", {{"method", "ave"}, {"kernel", "2"}, {"stride", "2"}}},
                    {"conv", {{"num_output", "12"}, {"kernel", "3"}}},
                    {"fc", {{"num_output", "10"}}}};
  auto cnet = makeNet(*cpu_, o);
  o.precision = type();
  auto gnet = makeNet(*gpu_, o);
  const Tensor images = rounded(randomHost({16, 1, 28, 28}, 59, 0.0f, 1.0f));
  Tensor labels = Tensor::host({16}, DType::kInt32);
  for (int i = 0; i < 16; ++i)
    labels.i32()[i] = i % 10;
  const float loss_scale = 1024.0f;
  cnet->forward(images, labels, true);
  cnet->backward(loss_scale / 16, [](std::int64_t, std::int64_t, const Event*) {});
  gnet->forward(up(images), up(labels), true);
  std::int64_t covered = 0;
  gnet->backward(loss_scale / 16,
                 [&](std::int64_t b, std::int64_t e, const Event*) { covered += e - b; });
  EXPECT_EQ(covered, gnet->numParams());
  EXPECT_EQ(gnet->grads().dtype(), DType::kFloat32);
  const Tensor cm = copyOf(cnet->metrics()), gm = down(gnet->metrics());
  EXPECT_NEAR(gm.f32()[0], cm.f32()[0], 10 * tolerance() * std::abs(cm.f32()[0]));
  expectClose("gradients", cnet->grads(), gnet->grads(), 10 * tolerance());
}

INSTANTIATE_TEST_SUITE_P(Types, CudaReducedOps,
                         ::testing::Values(DType::kFloat16, DType::kBFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return info.param == DType::kFloat16 ? "float16" : "bfloat16";
                         });

// ---- channels-last (NHWC) ops, float32: the CPU's NCHW op on the same values, transposed ----
// (CudaOps's tolerance: both sum the same terms in float32, in other orders.)
class CudaChannelsLastOps : public CudaOps {
 protected:
  // [n, c, s] NCHW on the host as NHWC on the GPU, and back.
  Tensor upNhwc(const Tensor& nchw, std::int64_t n, std::int64_t c, std::int64_t s) {
    return up(nhwcOf(nchw, n, c, s));
  }
  Tensor downNchw(const Tensor& nhwc, std::int64_t n, std::int64_t c, std::int64_t s) {
    return nchwOf(down(nhwc), n, c, s);
  }
};

TEST_F(CudaChannelsLastOps, TransposeMovesEveryElementAndConverts) {
  const Tensor x = randomHost({3, 5, 7}, 60);
  Tensor expected = Tensor::host({3, 5, 7});
  cpu_->transpose(x, expected, 3, 5, 7);
  const Tensor gx = up(x);
  Tensor gy = gpu_->empty({3, 5, 7});
  gpu_->transpose(gx, gy, 3, 5, 7);
  expectClose("transposed", expected, gy, 0);
  Tensor gh = gpu_->empty({3, 5, 7}, DType::kBFloat16), back = gpu_->empty({3, 5, 7});
  gpu_->transpose(gx, gh, 3, 5, 7);
  gpu_->cast(gh, back);
  Tensor narrow = Tensor::host({3, 5, 7}, DType::kBFloat16), wide = Tensor::host({3, 5, 7});
  cpu_->cast(expected, narrow);
  cpu_->cast(narrow, wide);
  expectClose("transposed to bfloat16", wide, back, 0);
}

TEST_F(CudaChannelsLastOps, ConvolutionWithAKrscFilter) {
  ConvGeometry g{2, 16, 9, 9, 8, 3, 2, 1, true};
  const std::int64_t hw = 81, ohw = g.outHeight() * g.outWidth(), rs = 9;
  const Tensor x = randomHost({2, 16, 9, 9}, 61), w = randomHost({8, 16, 3, 3}, 62),
               b = randomHost({8}, 63), dy = randomHost({2, 8, g.outHeight(), g.outWidth()}, 64);
  const auto [y, dx, dw, db] = cpuConv(g, x, w, b, dy);
  g.channels_last = true;
  auto d = gpu_->makeConv(g);
  const Tensor gx = upNhwc(x, 2, 16, hw), gw = upNhwc(w, 8, 16, rs), gdy = upNhwc(dy, 2, 8, ohw);
  const Tensor gb = up(b);
  Tensor gy = gpu_->empty(dy.shape()), gdx = gpu_->empty(x.shape()), gdw = gpu_->empty(w.shape()),
         gdb = gpu_->empty({8});
  d->forward(gx, gw, gb, gy);
  d->backward(gx, gw, gdy, gdx, gdw, gdb);
  expectClose("y", y, downNchw(gy, 2, 8, ohw));
  expectClose("dx", dx, downNchw(gdx, 2, 16, hw));
  expectClose("dw", dw, downNchw(gdw, 8, 16, rs));
  expectClose("db", db, gdb);
}

TEST_F(CudaChannelsLastOps, PoolingBatchNormAndGlobalPooling) {
  for (const auto method : {PoolMethod::kMax, PoolMethod::kAverage}) {
    PoolGeometry g{2, 3, 7, 7, 3, 2, 1, method, true};
    const std::int64_t ohw = g.outHeight() * g.outWidth();
    const Tensor x = randomHost({2, 3, 7, 7}, 65),
                 dy = randomHost({2, 3, g.outHeight(), g.outWidth()}, 66);
    Tensor y = Tensor::host(dy.shape()), dx = Tensor::host(x.shape());
    auto c = cpu_->makePool(g);
    c->forward(x, y);
    c->backward(dy, dx);
    g.channels_last = true;
    auto d = gpu_->makePool(g);
    Tensor gy = gpu_->empty(dy.shape()), gdx = gpu_->empty(x.shape());
    d->forward(upNhwc(x, 2, 3, 49), gy);
    d->backward(upNhwc(dy, 2, 3, ohw), gdx);
    expectClose("pool y", y, downNchw(gy, 2, 3, ohw));
    expectClose("pool dx", dx, downNchw(gdx, 2, 3, 49));
  }

  BatchNormGeometry bg{8, 5, 36, 0.1f, 1e-5f};
  const Shape xs{8, 5, 36};
  const Tensor x = randomHost(xs, 67, -2.0f, 3.0f), gamma = randomHost({5}, 68),
               beta = randomHost({5}, 69), dy = randomHost(xs, 70);
  Tensor rm = Tensor::host({5}), rv = Tensor::host({5});
  cpu_->fill(rv, 1.0f);
  Tensor grm = up(rm), grv = up(rv);
  const auto [y, dx, dg, dbeta] = cpuBatchNorm(bg, x, gamma, beta, dy, rm, rv);
  bg.channels_last = true;
  auto d = gpu_->makeBatchNorm(bg);
  const Tensor gx = upNhwc(x, 8, 5, 36), ggamma = up(gamma);
  Tensor gy = gpu_->empty(xs), gdx = gpu_->empty(xs), gdg = gpu_->empty({5}),
         gdbeta = gpu_->empty({5});
  d->forward(gx, Tensor(), ggamma, up(beta), grm, grv, gy, true);
  d->backward(gx, gy, ggamma, upNhwc(dy, 8, 5, 36), gdx, Tensor(), gdg, gdbeta);
  expectClose("bn y", y, downNchw(gy, 8, 5, 36));
  expectClose("bn dx", dx, downNchw(gdx, 8, 5, 36));
  expectClose("bn running mean", rm, grm);
  expectClose("bn dgamma", dg, gdg);
  expectClose("bn dbeta", dbeta, gdbeta);

  const Tensor px = randomHost({3, 7, 49}, 71), pdy = randomHost({3, 7}, 72);
  Tensor py = Tensor::host({3, 7}), pdx = Tensor::host({3, 7, 49});
  auto gap = cpu_->makeGlobalAvgPool(3, 7, 49);
  gap->forward(px, py);
  gap->backward(pdy, pdx);
  auto ggap = gpu_->makeGlobalAvgPool(3, 7, 49, /*channels_last=*/true);
  Tensor gpy = gpu_->empty({3, 7}), gpdx = gpu_->empty({3, 7, 49});
  ggap->forward(upNhwc(px, 3, 7, 49), gpy);
  ggap->backward(up(pdy), gpdx);
  expectClose("global pool y", py, gpy);
  expectClose("global pool dx", pdx, downNchw(gpdx, 3, 7, 49));
}

}  // namespace
}  // namespace troupe::kernels
