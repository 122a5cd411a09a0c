// The CUDA backend (kernels/backend.h) of libtroupe_cuda.so: one GPU, one stream. Convolution and
// batch norm on cuDNN, inner products on cuBLAS, the rest on troupe's own kernels
// (kernels/cuda/kernels.cu). Memory comes from a caching allocator (allocator.h); convolution
// algorithms are measured once per geometry (cudnnFind*) and cached in the backend.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "kernels/cuda/allocator.h"
#include "kernels/cuda/conv_plan.h"
#include "kernels/cuda/cuda_event.h"
#include "kernels/cuda/cuda_util.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/nccl_communicator.h"
#include "kernels/cuda_plugin.h"

namespace troupe::kernels::cuda {

[[noreturn]] void throwCuda(const std::string& library, const std::string& call,
                            const std::string& message, bool out_of_memory, const char* file,
                            int line) {
  const std::string what = library + " failed: " + call + ": " + message + " (" + file + ":" +
                           std::to_string(line) + ")";
  if (out_of_memory) throw ResourceError("out of GPU memory: " + what);
  throw Error(what);
}

void checkLaunch(const char* kernel, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throwCuda("CUDA", std::string("launching ") + kernel, cudaGetErrorString(e),
              e == cudaErrorMemoryAllocation, file, line);
  }
}

namespace {

// The most workspace a convolution algorithm may want: half the device memory free when cudnnFind
// measures it, and at most 4 GiB (the workspace is one buffer that every convolution shares, so a
// large one is paid once; PyTorch lets an algorithm take what is free).
std::size_t maxWorkspace(int device) {
  TROUPE_CUDA_CHECK(cudaSetDevice(device));
  std::size_t free = 0, total = 0;
  TROUPE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return std::min(free / 2, std::size_t{4} << 30);
}

const float kOne = 1.0f, kZero = 0.0f;

float* f32(const Tensor& t) {
  TROUPE_ENFORCE(t.dtype() == DType::kFloat32 || t.raw() == nullptr, "a ", toString(t.dtype()),
                 " tensor of shape ", toString(t.shape()), " where float32 is needed");
  return static_cast<float*>(t.raw());
}
// An activation: float32, float16 or bfloat16 (NetOptions::precision).
void* act(const Tensor& t) {
  TROUPE_ENFORCE(
      t.dtype() == DType::kFloat32 || t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16,
      "a ", toString(t.dtype()), " tensor where a floating-point one is needed");
  return t.raw();
}

// A floating-point dtype as cuDNN and cuBLAS name it; `library` is who refuses any other.
struct LibraryTypes {
  cudnnDataType_t cudnn;
  cudaDataType_t cublas;
};
LibraryTypes libraryTypes(DType dtype, const char* library) {
  switch (dtype) {
    case DType::kFloat16:
      return {CUDNN_DATA_HALF, CUDA_R_16F};
    case DType::kBFloat16:
      return {CUDNN_DATA_BFLOAT16, CUDA_R_16BF};
    case DType::kFloat32:
      return {CUDNN_DATA_FLOAT, CUDA_R_32F};
    default:
      throw InvariantError(std::string(library) + " computes on floating-point tensors, not " +
                           toString(dtype));
  }
}

cudnnDataType_t cudnnType(DType dtype) {
  return libraryTypes(dtype, "cuDNN").cudnn;
}

cudaDataType_t cublasType(DType dtype) {
  return libraryTypes(dtype, "cuBLAS").cublas;
}
bool wanted(const Tensor& t) {
  return t.raw() != nullptr;
}

// What an op checks on the host once the stream has done its work (a softmax loss's bad labels):
// the backend's next synchronize() calls check(), so that no op waits on its own.
class Checked {
 public:
  virtual ~Checked() = default;
  virtual void check() = 0;
  // Around a CUDA graph's replay of its work (Backend::capture): what its call does on the host
  // before and after it queues that work.
  virtual void beforeReplay() {}
  virtual void afterReplay() {}
};

// What the ops share: the stream, the library handles, memory and a growing workspace.
struct Context {
  int device = 0;
  CudaOptions options;
  cudaStream_t stream = nullptr;
  cudnnHandle_t cudnn = nullptr;
  cublasHandle_t cublas = nullptr;
  std::shared_ptr<DeviceAllocator> allocator;
  std::shared_ptr<void> workspace;
  std::size_t workspace_bytes = 0;
  // cuBLAS's workspace is ours, as a call captured into a CUDA graph may not allocate one, and
  // the same for every call, so that a product gives the same bits in and out of a graph (32
  // MiB: what cuBLAS asks for on Hopper). Made at the first product: a backend that multiplies
  // nothing (an updater's, a copier's) holds none.
  std::shared_ptr<void> cublas_workspace;
  void readyCublas() {
    if (cublas_workspace) return;
    TROUPE_ENFORCE(!capturing,
                   "cuBLAS's first product while a CUDA graph is captured (run the "
                   "work once before capturing it)");
    constexpr std::size_t kCublasWorkspace = std::size_t{32} << 20;
    cublas_workspace = allocator->allocate(kCublasWorkspace);
    TROUPE_CUDA_CHECK(cublasSetWorkspace(cublas, cublas_workspace.get(), kCublasWorkspace));
  }
  // Lent by a net for one layer's call (Backend::lendWorkspace): taken before the shared workspace.
  void* lent = nullptr;
  std::size_t lent_bytes = 0;
  std::vector<Checked*> unchecked;  // in the order their work was queued
  // While a CUDA graph is captured (Backend::capture), and the ops that queued work to check.
  bool capturing = false;
  std::vector<Checked*> captured_checks;

  void* scratch(std::size_t bytes) {
    if (lent && bytes <= lent_bytes) return lent;
    if (bytes > workspace_bytes) {
      TROUPE_ENFORCE(!capturing, "the workspace would grow from ", workspace_bytes, " to ", bytes,
                     " bytes while a CUDA graph is captured: an op's first call was captured "
                     "(run the work once before capturing it)");
      if (workspace) {
        // The outgrown workspace goes back to the device once the work queued on it (on this
        // stream only) is done: the cache would hold it for nothing. Only while the ops find
        // their algorithms, in the first steps.
        TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
        workspace.reset();
        allocator->freeCached(workspace_bytes);
      }
      workspace = allocator->allocate(bytes);
      workspace_bytes = roundedSize(bytes);
    }
    return workspace.get();
  }
  // Workspace to time an engine on: where neither the lent memory nor the shared workspace holds
  // it, memory of its own (kept in `trials` until the engines are timed), so that an engine tried
  // and not kept grows nothing that stays.
  using Trials = std::vector<std::pair<std::shared_ptr<void>, std::size_t>>;
  void* trialScratch(std::size_t bytes, Trials& trials) {
    if ((lent && bytes <= lent_bytes) || bytes <= workspace_bytes) return scratch(bytes);
    trials.emplace_back(allocator->allocate(bytes), bytes);
    return trials.back().first.get();
  }
  // Gives the trials' memory back to the device once their work is done (the cache would hold
  // each at its size for nothing).
  void endTrials(Trials& trials) {
    if (trials.empty()) return;
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (auto& [memory, bytes] : trials) {
      memory.reset();
      allocator->freeCached(bytes);
    }
    trials.clear();
  }
  Tensor empty(Shape shape, DType dtype) {
    Tensor t = uninitialized(std::move(shape), dtype);
    TROUPE_CUDA_CHECK(cudaMemsetAsync(t.raw(), 0, t.bytes(), stream));
    return t;
  }
  // The same without the zero fill: scratch that the next call on the stream overwrites whole
  // (a pass over memory less, each step).
  Tensor uninitialized(Shape shape, DType dtype) {
    const auto bytes = static_cast<std::size_t>(numelOf(shape)) * sizeOf(dtype);
    auto storage = allocator->allocate(bytes);
    void* data = storage.get();
    return Tensor(std::move(storage), data, std::move(shape), dtype,
                  Device{DeviceKind::kCuda, device});
  }
};

// A 4-d tensor descriptor, NCHW or channels-last NHWC in memory, destroyed with its owner.
class TensorDesc {
 public:
  TensorDesc(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
             DType dtype = DType::kFloat32, bool channels_last = false) {
    TROUPE_CUDA_CHECK(cudnnCreateTensorDescriptor(&d_));
    TROUPE_CUDA_CHECK(cudnnSetTensor4dDescriptor(
        d_, channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW, cudnnType(dtype),
        static_cast<int>(n), static_cast<int>(c), static_cast<int>(h), static_cast<int>(w)));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

// The algorithms of one convolution geometry, measured once.
// Each with the math type cudnnFind* timed it with: an algorithm's kernel depends on both, so
// each call sets its own on the descriptor.
struct ConvAlgos {
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  cudnnMathType_t fwd_math, bwd_data_math, bwd_filter_math;
  std::size_t workspace = 0;
};

// The graph-API plans of one convolution geometry and pointer alignment (conv_plan.h), each built
// on its first call: forward, backward filter, backward data, and backward data adding to dx.
// A plan cuDNN refuses stays null (tried), and that direction keeps the legacy call.
struct ConvPlans {
  std::unique_ptr<ConvPlan> plans[4];
  bool tried[4] = {false, false, false, false};
};

// Whether a cuDNN status says a call is not supported for these arguments (their type, layout or
// shape) rather than that it failed: cuDNN 9 says why with a code within NOT_SUPPORTED or
// BAD_PARAM. Not among them: what no other call would mend (a driver, runtime or architecture
// cuDNN cannot use, a library it cannot load) and troupe's own mistakes (a null or misaligned
// pointer), which are errors.
bool isRefusal(cudnnStatus_t status) {
  switch (static_cast<int>(status)) {
    case CUDNN_STATUS_BAD_PARAM:
    case 2001:  // CUDNN_STATUS_INVALID_VALUE, deprecated
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED:
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN:
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE:
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE:
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT:
    case CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT:
    case CUDNN_STATUS_NOT_SUPPORTED_PADDING:
    case CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM:
    case CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE:
      // A refused call may leave a launch error behind as the thread's last one: cleared, so
      // that the next kernel's launch check does not take it for its own.
      (void)cudaGetLastError();
      return true;
    default:
      return false;
  }
}

// The fastest algorithm that ran; with `deterministic` (CudaOptions), the fastest deterministic
// one, else the fastest: a run repeats to the bit where cuDNN offers a deterministic algorithm.
template <typename Perf>
const Perf& pickAlgo(const Perf* perf, int count, const char* what, bool deterministic,
                     std::size_t max_workspace) {
  const Perf* any = nullptr;
  for (int i = 0; i < count; ++i) {  // sorted by time
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > max_workspace) continue;
    if (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC) return perf[i];
    if (!any) any = &perf[i];
  }
  if (!any) throw Error(std::string("cuDNN has no ") + what + " algorithm for this convolution");
  return *any;
}

// A convolution's cuDNN descriptors for the element type of its tensors, made on the first call
// (the type comes with the tensors: NetOptions::precision); the algorithms are measured then.
class CudaConv final : public ConvOp {
 public:
  CudaConv(Context& ctx, const ConvGeometry& g,
           std::map<std::vector<std::int64_t>, ConvAlgos>& cache,
           std::map<std::vector<std::int64_t>, ConvPlans>& plans)
      : ctx_(ctx), g_(g), cache_(cache), plans_cache_(plans), way_(namedWay()) {}
  ~CudaConv() override {
    if (conv_) cudnnDestroyConvolutionDescriptor(conv_);
    if (w_) cudnnDestroyFilterDescriptor(w_);
  }

  void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    prepare(x.dtype());
    if (const ConvPlan* plan = planFor(kForward, act(x), act(w), act(y))) {
      plan->run(ctx_.cudnn, x.raw(), w.raw(), y.raw(), ctx_.scratch(plan->workspace()));
    } else {
      const ConvAlgos& a = legacy();
      void* ws = ctx_.scratch(a.workspace);
      TROUPE_CUDA_CHECK(cudnnSetConvolutionMathType(conv_, a.fwd_math));
      TROUPE_CUDA_CHECK(cudnnConvolutionForward(ctx_.cudnn, &kOne, x_->get(), act(x), w_, act(w),
                                                conv_, a.fwd, ws, a.workspace, &kZero, y_->get(),
                                                act(y)));
    }
    if (g_.bias) {
      channelBias(x.dtype(), act(y), act(b), g_.n, g_.out_channels, g_.outHeight() * g_.outWidth(),
                  g_.channels_last, ctx_.stream);
    }
  }

  void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                const Tensor& dw, const Tensor& db) override {
    backwardInto(x, w, dy, dx, dw, db, kZero);
  }
  // cuDNN's backward-data blends: dx = 1 * gradient + 1 * dx.
  bool addsToDx() const override { return true; }
  void backwardAddingToDx(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                          const Tensor& dw, const Tensor& db) override {
    backwardInto(x, w, dy, dx, dw, db, kOne);
  }

 private:
  // dx = gradient + dx_beta * dx.
  void backwardInto(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                    const Tensor& dw, const Tensor& db, const float& dx_beta) {
    prepare(x.dtype());
    if (wanted(dw)) {
      if (const ConvPlan* plan = planFor(kFilter, act(x), act(dw), act(dy))) {
        plan->run(ctx_.cudnn, x.raw(), dw.raw(), dy.raw(), ctx_.scratch(plan->workspace()));
      } else {
        const ConvAlgos& a = legacy();
        void* ws = ctx_.scratch(a.workspace);
        TROUPE_CUDA_CHECK(cudnnSetConvolutionMathType(conv_, a.bwd_filter_math));
        TROUPE_CUDA_CHECK(cudnnConvolutionBackwardFilter(ctx_.cudnn, &kOne, x_->get(), act(x),
                                                         y_->get(), act(dy), conv_, a.bwd_filter,
                                                         ws, a.workspace, &kZero, w_, act(dw)));
      }
    }
    if (g_.bias && wanted(db)) {
      channelBiasGradient(dy.dtype(), act(dy), act(db), g_.n, g_.out_channels,
                          g_.outHeight() * g_.outWidth(), g_.channels_last, ctx_.stream);
    }
    if (wanted(dx)) {
      const int kind = dx_beta == 0.0f ? kData : kDataAdding;
      if (const ConvPlan* plan = planFor(kind, act(dx), act(w), act(dy))) {
        plan->run(ctx_.cudnn, dx.raw(), w.raw(), dy.raw(), ctx_.scratch(plan->workspace()));
      } else {
        const ConvAlgos& a = legacy();
        void* ws = ctx_.scratch(a.workspace);
        TROUPE_CUDA_CHECK(cudnnSetConvolutionMathType(conv_, a.bwd_data_math));
        TROUPE_CUDA_CHECK(cudnnConvolutionBackwardData(ctx_.cudnn, &kOne, w_, act(w), y_->get(),
                                                       act(dy), conv_, a.bwd_data, ws, a.workspace,
                                                       &dx_beta, x_->get(), act(dx)));
      }
    }
  }

  enum PlanKind { kForward, kFilter, kData, kDataAdding };

  // Where the convolution goes by graph-API plans (graph_), the direction's plan for pointers
  // aligned as these (x, w and y of the call: dx, dw and dy where they are written), built on its
  // first call; null where cuDNN refused it (said once), or where the legacy calls are the way.
  const ConvPlan* planFor(int kind, const void* x, const void* w, const void* y) {
    if (!graph_) return nullptr;
    const std::int64_t alignment = std::min({alignmentOf(x), alignmentOf(w), alignmentOf(y)});
    // The backend's plans of this geometry and alignment, found in its cache once an alignment
    // (each a power of two up to 16), not on every call.
    ConvPlans*& found = plans_[std::countr_zero(static_cast<unsigned>(alignment))];
    if (!found) {
      std::vector<std::int64_t> key = key_;
      key.push_back(alignment);
      found = &plans_cache_[key];  // a std::map's elements stay where they are
    }
    ConvPlans& plans = *found;
    if (!plans.tried[kind]) {
      plans.tried[kind] = true;
      plans.plans[kind] = buildPlan(kind, alignment);
    }
    return plans.plans[kind].get();
  }

  // $TROUPE_CUDA_CONV, read as the op is made: auto (the default), legacy or graph.
  enum class Way { kAuto, kLegacy, kGraph };
  static Way namedWay() {
    const char* named = std::getenv("TROUPE_CUDA_CONV");
    const std::string way = named ? named : "";
    if (way.empty() || way == "auto") return Way::kAuto;
    if (way == "legacy") return Way::kLegacy;
    if (way == "graph") return Way::kGraph;
    throw InputError("TROUPE_CUDA_CONV=" + way + ": expected auto, legacy or graph");
  }

  static std::int64_t alignmentOf(const void* p) {
    const auto address = reinterpret_cast<std::uintptr_t>(p);
    std::int64_t a = 16;
    while (a > 1 && address % static_cast<std::uintptr_t>(a) != 0)
      a /= 2;
    return a;
  }

  std::unique_ptr<ConvPlan> buildPlan(int kind, std::int64_t alignment) {
    const ConvGeometry& g = g_;
    ConvPlanSpec spec;
    spec.kind = kind == kForward  ? ConvPlanSpec::Kind::kForward
                : kind == kFilter ? ConvPlanSpec::Kind::kBackwardFilter
                                  : ConvPlanSpec::Kind::kBackwardData;
    spec.geometry = g;
    spec.data = cudnnType(dtype_);
    spec.tf32 = ctx_.options.tf32;
    spec.deterministic = ctx_.options.deterministic;
    spec.beta = kind == kDataAdding ? 1.0f : 0.0f;
    spec.alignment = alignment;
    // Scratch tensors of the call's shapes to time the engines on (dx, dw: written).
    const Tensor x = ctx_.uninitialized({g.n, g.channels, g.height, g.width}, dtype_);
    const Tensor w = ctx_.uninitialized({g.out_channels, g.channels, g.kernel, g.kernel}, dtype_);
    const Tensor y = ctx_.uninitialized({g.n, g.out_channels, g.outHeight(), g.outWidth()}, dtype_);
    std::string refused;
    Context::Trials trials;
    auto plan = ConvPlan::build(
        ctx_.cudnn, ctx_.stream, spec, maxWorkspace(ctx_.device), x.raw(), w.raw(), y.raw(),
        [&](std::size_t bytes) { return ctx_.trialScratch(bytes, trials); }, &refused);
    ctx_.endTrials(trials);
    if (!plan) {  // said for each geometry and direction, once: they are few
      std::fprintf(stderr,
                   "troupe cuda: cuDNN's graph API refused a convolution's %s (%lld x %lld x "
                   "%lld x %lld to %lld channels, kernel %lld, stride %lld; %s): %s; its legacy "
                   "call instead\n",
                   kind == kForward  ? "forward"
                   : kind == kFilter ? "backward filter"
                                     : "backward data",
                   static_cast<long long>(g.n), static_cast<long long>(g.channels),
                   static_cast<long long>(g.height), static_cast<long long>(g.width),
                   static_cast<long long>(g.out_channels), static_cast<long long>(g.kernel),
                   static_cast<long long>(g.stride), toString(dtype_).c_str(), refused.c_str());
    }
    return plan;
  }

  // float16 and bfloat16 data accumulate in float (cuDNN's "pseudo" configurations) on tensor
  // cores; float32 uses them only under TF32.
  void prepare(DType dtype) {
    if (x_) {
      TROUPE_ENFORCE(dtype == dtype_, "a convolution made for ", toString(dtype_), " called with ",
                     toString(dtype), " tensors");
      return;
    }
    dtype_ = dtype;
    // auto: float16 and bfloat16 by graph-API plans, float32 by the legacy calls. On the H100,
    // ResNet-50 at batch 64 in float16 NHWC took 30.7 ms a step by the legacy calls, 27.4 of them
    // the host's (each call costs as long on the host as on the device), and 13.2 ms by plans;
    // in float32 NCHW, where the device is the bound, the plans' engines were 2.6% slower (batch
    // 128, under CUDA graphs). bench/gpu_vs_pytorch.py measures both.
    graph_ = way_ == Way::kGraph || (way_ == Way::kAuto && dtype != DType::kFloat32);
    const ConvGeometry& g = g_;
    const bool nhwc = g.channels_last;
    x_ = std::make_unique<TensorDesc>(g.n, g.channels, g.height, g.width, dtype, nhwc);
    y_ =
        std::make_unique<TensorDesc>(g.n, g.out_channels, g.outHeight(), g.outWidth(), dtype, nhwc);
    TROUPE_CUDA_CHECK(cudnnCreateFilterDescriptor(&w_));
    TROUPE_CUDA_CHECK(cudnnSetFilter4dDescriptor(
        w_, cudnnType(dtype), nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
        static_cast<int>(g.out_channels), static_cast<int>(g.channels), static_cast<int>(g.kernel),
        static_cast<int>(g.kernel)));
    TROUPE_CUDA_CHECK(cudnnCreateConvolutionDescriptor(&conv_));
    const int pad = static_cast<int>(g.pad), stride = static_cast<int>(g.stride);
    TROUPE_CUDA_CHECK(cudnnSetConvolution2dDescriptor(conv_, pad, pad, stride, stride, 1, 1,
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    // As PyTorch: float16 and bfloat16 on tensor cores; float32 by FMA, or with TF32 by cuDNN's
    // default math, which converts float32 to TF32 for tensor cores (its TENSOR_OP math would
    // not convert).
    TROUPE_CUDA_CHECK(cudnnSetConvolutionMathType(conv_, mathFor(dtype)));
    key_ = {g.n,
            g.channels,
            g.height,
            g.width,
            g.out_channels,
            g.kernel,
            g.stride,
            g.pad,
            ctx_.options.tf32,
            static_cast<std::int64_t>(dtype),
            g.channels_last,
            ctx_.options.deterministic};
  }

  // The legacy calls' algorithms for this geometry, measured on the first legacy call (once a
  // backend): where plans are the way, only a direction cuDNN refused a plan needs them.
  const ConvAlgos& legacy() {
    if (!algos_) {
      auto it = cache_.find(key_);
      if (it == cache_.end()) it = cache_.emplace(key_, measure()).first;
      algos_ = &it->second;  // a std::map's elements stay where they are
    }
    return *algos_;
  }

  cudnnMathType_t mathFor(DType dtype) const {
    if (dtype != DType::kFloat32) return CUDNN_TENSOR_OP_MATH;
    return ctx_.options.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;
  }

  // cudnnFind* times every algorithm on scratch tensors of this geometry.
  ConvAlgos measure() {
    ConvAlgos a{};
    constexpr int kMax = 16;
    int count = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[kMax];
    TROUPE_CUDA_CHECK(cudnnFindConvolutionForwardAlgorithm(ctx_.cudnn, x_->get(), w_, conv_,
                                                           y_->get(), kMax, &count, fwd));
    const bool deterministic = ctx_.options.deterministic;
    const std::size_t cap = maxWorkspace(ctx_.device);
    const auto& f = pickAlgo(fwd, count, "forward", deterministic, cap);
    cudnnConvolutionBwdDataAlgoPerf_t data[kMax];
    TROUPE_CUDA_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(ctx_.cudnn, w_, y_->get(), conv_,
                                                                x_->get(), kMax, &count, data));
    const auto& d = pickAlgo(data, count, "backward-data", deterministic, cap);
    cudnnConvolutionBwdFilterAlgoPerf_t filter[kMax];
    TROUPE_CUDA_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(ctx_.cudnn, x_->get(), y_->get(),
                                                                  conv_, w_, kMax, &count, filter));
    const auto& b = pickAlgo(filter, count, "backward-filter", deterministic, cap);
    // Find tries launches that may fail (their statuses say so): what they left as the thread's
    // last error is not a later kernel's.
    (void)cudaGetLastError();
    a.fwd = f.algo;
    a.bwd_data = d.algo;
    a.bwd_filter = b.algo;
    // Strict float32 keeps to FMA whatever a result says (TF32 off means off); the descriptor's
    // FMA math had Find time only such algorithms.
    const bool fma = mathFor(dtype_) == CUDNN_FMA_MATH;
    a.fwd_math = fma ? CUDNN_FMA_MATH : f.mathType;
    a.bwd_data_math = fma ? CUDNN_FMA_MATH : d.mathType;
    a.bwd_filter_math = fma ? CUDNN_FMA_MATH : b.mathType;
    a.workspace = std::max({f.memory, d.memory, b.memory});
    return a;
  }

  Context& ctx_;
  ConvGeometry g_;
  std::map<std::vector<std::int64_t>, ConvAlgos>& cache_;
  std::map<std::vector<std::int64_t>, ConvPlans>& plans_cache_;
  std::vector<std::int64_t> key_;  // the geometry's, for both caches
  ConvPlans* plans_[5] = {};       // in plans_cache_, by log2 of the pointers' alignment
  Way way_ = Way::kAuto;           // $TROUPE_CUDA_CONV
  bool graph_ = false;             // by graph-API plans: way_, and for auto the type
  DType dtype_ = DType::kFloat32;
  std::unique_ptr<TensorDesc> x_, y_;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  const ConvAlgos* algos_ = nullptr;  // in cache_, from the first legacy call
};

class CudaPool final : public PoolOp {
 public:
  CudaPool(Context& ctx, const PoolGeometry& g) : ctx_(ctx) {
    shape_ = PoolShape{g.n * g.channels,
                       g.height,
                       g.width,
                       g.outHeight(),
                       g.outWidth(),
                       g.kernel,
                       g.stride,
                       g.pad,
                       g.method == PoolMethod::kMax,
                       g.channels_last ? g.channels : 0};
    TROUPE_ENFORCE(shape_.oh > 0 && shape_.ow > 0, "pooling output of ", shape_.oh, "x", shape_.ow);
    if (shape_.max) argmax_ = ctx.empty({shape_.planes * shape_.oh * shape_.ow}, DType::kInt32);
  }
  void forward(const Tensor& x, const Tensor& y) override {
    poolForward(x.dtype(), shape_, act(x), act(y), static_cast<std::int32_t*>(argmax_.raw()),
                ctx_.stream);
  }
  void backward(const Tensor& dy, const Tensor& dx) override {
    poolBackward(dy.dtype(), shape_, act(dy), static_cast<const std::int32_t*>(argmax_.raw()),
                 act(dx), ctx_.stream);
  }

 private:
  Context& ctx_;
  PoolShape shape_{};
  Tensor argmax_;
};

// c = a b (column-major, as cuBLAS) with a, b and c of one type: cublasSgemm for float32 (TF32
// as the handle's math mode says), cublasGemmEx accumulating in float for float16 and bfloat16.
void gemm(Context& ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
          const Tensor& a, int lda, const Tensor& b, int ldb, const Tensor& c, int ldc) {
  ctx.readyCublas();
  if (c.dtype() == DType::kFloat32) {
    TROUPE_CUDA_CHECK(cublasSgemm(ctx.cublas, ta, tb, m, n, k, &kOne, f32(a), lda, f32(b), ldb,
                                  &kZero, f32(c), ldc));
    return;
  }
  const cudaDataType_t type = cublasType(c.dtype());
  TROUPE_ENFORCE(a.dtype() == c.dtype() && b.dtype() == c.dtype(), "a product of ",
                 toString(a.dtype()), " and ", toString(b.dtype()), " into ", toString(c.dtype()));
  // 16-bit products on tensor cores with float accumulation, whatever the handle's mode for
  // float32 (TF32 or not) is.
  TROUPE_CUDA_CHECK(cublasSetMathMode(ctx.cublas, CUBLAS_DEFAULT_MATH));
  const cublasStatus_t status =
      cublasGemmEx(ctx.cublas, ta, tb, m, n, k, &kOne, a.raw(), type, lda, b.raw(), type, ldb,
                   &kZero, c.raw(), type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (ctx.options.tf32)
    TROUPE_CUDA_CHECK(cublasSetMathMode(ctx.cublas, CUBLAS_TF32_TENSOR_OP_MATH));
  TROUPE_CUDA_CHECK(status);
}

// y[n, out] = x[n, in] w[out, in]^T + b, in cuBLAS's column-major terms (row-major x is x^T).
class CudaInnerProduct final : public InnerProductOp {
 public:
  CudaInnerProduct(Context& ctx, const InnerProductGeometry& g) : ctx_(ctx), g_(g) {}
  void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    const int n = static_cast<int>(g_.n), in = static_cast<int>(g_.in),
              out = static_cast<int>(g_.out);
    gemm(ctx_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, w, in, x, in, y, out);
    if (wanted(b)) addRowVector(y.dtype(), act(y), act(b), g_.n, g_.out, ctx_.stream);
  }
  void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                const Tensor& dw, const Tensor& db) override {
    const int n = static_cast<int>(g_.n), in = static_cast<int>(g_.in),
              out = static_cast<int>(g_.out);
    if (wanted(dw)) gemm(ctx_, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, x, in, dy, out, dw, in);
    if (wanted(db)) sumRows(dy.dtype(), act(dy), act(db), g_.n, g_.out, ctx_.stream);
    if (wanted(dx)) gemm(ctx_, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, w, in, dy, out, dx, in);
  }

 private:
  Context& ctx_;
  InnerProductGeometry g_;
};

// cuDNN's spatial batch norm: the batch's biased variance to normalise, the unbiased one into the
// running variance, as PyTorch (kernels/ops.h). x, y and their gradients may be float16 or
// bfloat16, and channels last; the scale, shift and statistics are float32 (cuDNN's rule, and
// PyTorch's under autocast). Training goes the first of these ways that cuDNN takes for the type
// and layout, and keeps to it:
// - persistent: the Ex calls in CUDNN_BATCHNORM_SPATIAL_PERSISTENT mode, as PyTorch trains (its
//   cuDNN batch norm), with a reserve space from the forward to the backward;
// - spatial: the plain calls in CUDNN_BATCHNORM_SPATIAL mode;
// - wide: the images to float32 NCHW copies, the spatial calls, and back (three more passes);
// - troupe: troupe's own kernels (batchNormForward), with the ReLU and add in their pass in every
//   type and layout, where cuDNN fuses them only for 16-bit NHWC: for float32 NCHW, two passes
//   over the activations fewer forward and three backward (its ReLU's mask recomputed from x, not
//   read from y).
// By default an NCHW batch norm with its ReLU goes troupe's way once cuDNN refuses the ReLU in its
// persistent calls (float32): on the H100, ResNet-50's float32 batch norms with a ReLU took 11.1
// ms a step by troupe's kernels against 13.4 by cuDNN's and troupe's ReLU kernels (batch 64), and
// the step 3.5% less; one without stays cuDNN's (1.15 ms against troupe's 1.37). Channels-last
// (TF32's layout) stays cuDNN's too: troupe's kernels have not been timed there. Inference is
// cuDNN's spatial call (PyTorch's too), or wide where refused. $TROUPE_CUDA_BATCH_NORM (persistent,
// spatial, wide or troupe) names the way to start from and keep to: the tests take each, the
// benchmarks compare them.
class CudaBatchNorm final : public BatchNormOp {
 public:
  enum class Way { kPersistent, kSpatial, kWide };

  CudaBatchNorm(Context& ctx, const BatchNormGeometry& g)
      : ctx_(ctx),
        g_(g),
        param_(1, g.channels, 1, 1),
        wide_desc_(g.n, g.channels, g.spatial, 1),
        mean_(ctx.empty({g.channels}, DType::kFloat32)),
        invstd_(ctx.empty({g.channels}, DType::kFloat32)) {
    if (g.eps < CUDNN_BN_MIN_EPSILON) {
      throw InputError("batch norm eps " + std::to_string(g.eps) + " is below cuDNN's minimum " +
                       std::to_string(CUDNN_BN_MIN_EPSILON));
    }
    const char* named = std::getenv("TROUPE_CUDA_BATCH_NORM");
    const std::string way = named ? named : "";
    own_where_refused_ = way.empty() && g.relu && !g.channels_last;
    train_way_ = way == "troupe" ? Way::kPersistent : firstWay(way);
    infer_way_ = train_way_ == Way::kWide ? Way::kWide : Way::kSpatial;
    if (way == "troupe") takeOwnWay();
  }
  ~CudaBatchNorm() override {
    if (relu_desc_) cudnnDestroyActivationDescriptor(relu_desc_);
  }
  // With relu (and add): the persistent way's calls apply them themselves
  // (CUDNN_BATCHNORM_OPS_BN_ACTIVATION, _BN_ADD_ACTIVATION) where cuDNN takes that for the type and
  // layout; else troupe's add and ReLU kernels after, and the ReLU's before the backward.
  void forward(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
               const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
               bool train) override {
    if (train) beta_ = beta;  // the fused backward reads it
    // normalize() hands a training forward over where cuDNN just refused the ReLU (by default).
    if ((train && own_) || !normalize(x, z, gamma, beta, running_mean, running_var, y, train)) {
      trained_own_ = true;
      batchNormForward(x.dtype(), shape_, act(x), g_.add ? act(z) : nullptr, f32(gamma), f32(beta),
                       f32(running_mean), f32(running_var), f32(mean_), f32(invstd_), f32(coef_),
                       act(y), static_cast<double*>(partial_.get()), ctx_.stream);
      return;
    }
    if (train) trained_own_ = false;
    if (g_.relu && !(train && trained_fused_)) {
      if (g_.add) {
        addRelu(y.dtype(), act(y), act(z), act(y), y.numel(), ctx_.stream);
      } else {
        reluForward(y.dtype(), act(y), act(y), y.numel(), ctx_.stream);
      }
    }
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& dy,
                const Tensor& dx, const Tensor& dz, const Tensor& dgamma,
                const Tensor& dbeta) override {
    if (trained_own_) {
      auto optional = [](const Tensor& t) { return wanted(t) ? f32(t) : nullptr; };
      batchNormBackward(x.dtype(), shape_, act(x), g_.relu ? act(y) : nullptr, act(dy), f32(gamma),
                        f32(coef_), f32(mean_), f32(invstd_), wanted(dx) ? act(dx) : nullptr,
                        g_.add && wanted(dz) ? act(dz) : nullptr, optional(dgamma), optional(dbeta),
                        static_cast<double*>(partial_.get()), f32(back_), ctx_.stream);
      return;
    }
    if (!g_.relu) return backwardOf(x, gamma, dy, dx, dgamma, dbeta);
    // With add, the gradient of z is the ReLU's backward's output (where it lands, else scratch).
    auto dzOrScratch = [&] {
      return g_.add && wanted(dz) ? dz : ctx_.uninitialized(dy.shape(), dy.dtype());
    };
    if (trained_fused_) {
      prepare(x.dtype());
      const Tensor dx_out = wanted(dx) ? dx : ctx_.uninitialized(x.shape(), x.dtype());
      const Tensor dg =
          wanted(dgamma) ? dgamma : ctx_.uninitialized({g_.channels}, DType::kFloat32);
      const Tensor dbt = wanted(dbeta) ? dbeta : ctx_.uninitialized({g_.channels}, DType::kFloat32);
      const Tensor dz_out = g_.add ? dzOrScratch() : Tensor();
      const cudnnStatus_t status =
          backwardPersistent(x, &y, gamma, dy, dx_out, g_.add ? &dz_out : nullptr, dg, dbt);
      if (status == CUDNN_STATUS_SUCCESS) return;
      refusedFused(status);  // throws unless refused
      // The spatial way's backward reads only the saved statistics, not the fused reserve space.
      trained_ = Way::kSpatial;
      trained_fused_ = false;
    }
    // The ReLU's backward first: the gradient where y > 0.
    const Tensor masked = dzOrScratch();
    reluBackward(y.dtype(), act(y), act(dy), act(masked), dy.numel(), ctx_.stream);
    backwardOf(x, gamma, masked, dx, dgamma, dbeta);
  }

 private:
  // Whether it normalised x into y; false where cuDNN refused the ReLU in a training forward and
  // troupe's kernels are the way from then on (own_).
  bool normalize(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                 const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                 bool train) {
    prepare(x.dtype());
    act(x);
    act(y);
    Way& way = train ? train_way_ : infer_way_;
    if (way == Way::kPersistent && g_.relu && fuse_relu_) {
      const cudnnStatus_t status =
          forwardPersistent(x, g_.add ? &z : nullptr, gamma, beta, running_mean, running_var, y,
                            /*relu=*/true);
      if (status == CUDNN_STATUS_SUCCESS) {
        trained_ = Way::kPersistent;
        trained_fused_ = true;
        return true;
      }
      refusedFused(status);
      if (own_) return false;
    }
    if (train) trained_fused_ = false;
    if (way == Way::kPersistent &&
        !refused(forwardPersistent(x, nullptr, gamma, beta, running_mean, running_var, y, false),
                 way)) {
      trained_ = Way::kPersistent;
      return true;
    }
    auto call = [&](cudnnTensorDescriptor_t d, const void* in, void* out) {
      return train ? cudnnBatchNormalizationForwardTraining(
                         ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d, in, d, out,
                         param_.get(), f32(gamma), f32(beta), g_.momentum, running_mean.raw(),
                         running_var.raw(), g_.eps, mean_.raw(), invstd_.raw())
                   : cudnnBatchNormalizationForwardInference(
                         ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, d, in, d, out,
                         param_.get(), f32(gamma), f32(beta), running_mean.raw(), running_var.raw(),
                         g_.eps);
    };
    if (train) trained_ = Way::kSpatial;
    if (way == Way::kSpatial && !refused(call(x_->get(), x.raw(), y.raw()), way)) return true;
    if (train) trained_ = Way::kWide;
    const Tensor wx = widened(x), wy = ctx_.uninitialized(x.shape(), DType::kFloat32);
    TROUPE_CUDA_CHECK(call(wide_desc_.get(), wx.raw(), wy.raw()));
    narrow(wy, y);
    return true;
  }
  void backwardOf(const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& dx,
                  const Tensor& dgamma, const Tensor& dbeta) {
    prepare(x.dtype());
    // cuDNN computes all three; what the caller does not want lands in scratch.
    const Tensor dx_out = wanted(dx) ? dx : ctx_.uninitialized(x.shape(), x.dtype());
    const Tensor dg = wanted(dgamma) ? dgamma : ctx_.uninitialized({g_.channels}, DType::kFloat32);
    const Tensor dbt = wanted(dbeta) ? dbeta : ctx_.uninitialized({g_.channels}, DType::kFloat32);
    // The way of the training forward, or the next: each saves the same statistics (the
    // persistent way a reserve space too, which only it reads).
    Way way = trained_;
    if (way == Way::kPersistent &&
        !refused(backwardPersistent(x, nullptr, gamma, dy, dx_out, nullptr, dg, dbt), way)) {
      return;
    }
    train_way_ = std::max(train_way_, way);  // what cuDNN refuses here, the forwards leave
    auto call = [&](cudnnTensorDescriptor_t d, const void* in, const void* grad, void* out) {
      return cudnnBatchNormalizationBackward(
          ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero, d, in, d, grad, d, out,
          param_.get(), f32(gamma), f32(dg), f32(dbt), g_.eps, mean_.raw(), invstd_.raw());
    };
    if (way == Way::kSpatial && !refused(call(x_->get(), act(x), act(dy), act(dx_out)), way)) {
      return;
    }
    train_way_ = std::max(train_way_, way);
    const Tensor wx = widened(x), wdy = widened(dy),
                 wdx = ctx_.uninitialized(x.shape(), DType::kFloat32);
    TROUPE_CUDA_CHECK(call(wide_desc_.get(), wx.raw(), wdy.raw(), wdx.raw()));
    narrow(wdx, dx_out);
  }

  // The way $TROUPE_CUDA_BATCH_NORM names for training, but troupe's.
  static Way firstWay(const std::string& way) {
    if (way.empty() || way == "persistent") return Way::kPersistent;
    if (way == "spatial") return Way::kSpatial;
    if (way == "wide") return Way::kWide;
    throw InputError("TROUPE_CUDA_BATCH_NORM=" + way +
                     ": expected persistent, spatial, wide or troupe");
  }

  // With relu: y = max(BN(x), 0) in the same kernels (CUDNN_BATCHNORM_OPS_BN_ACTIVATION); with z
  // too, y = max(BN(x) + z, 0) (CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION).
  cudnnStatus_t forwardPersistent(const Tensor& x, const Tensor* z, const Tensor& gamma,
                                  const Tensor& beta, const Tensor& running_mean,
                                  const Tensor& running_var, const Tensor& y, bool relu) {
    const cudnnTensorDescriptor_t d = x_->get();
    const cudnnBatchNormOps_t ops = z      ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                                    : relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION
                                           : CUDNN_BATCHNORM_OPS_BN;
    const cudnnActivationDescriptor_t activation = relu ? reluDesc() : nullptr;
    // The sizes follow from the descriptors and ops alone: asked once for each ops.
    ExSizes& sizes = forward_sizes_[ops];
    if (!sizes.asked) {
      sizes.asked = true;
      sizes.status = cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
          ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, d, z ? d : nullptr, d, param_.get(),
          activation, &sizes.workspace);
      if (sizes.status == CUDNN_STATUS_SUCCESS) {
        sizes.status = cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
            ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, activation, d, &sizes.reserve);
      }
    }
    if (sizes.status != CUDNN_STATUS_SUCCESS) return sizes.status;
    const std::size_t workspace = sizes.workspace, reserve = sizes.reserve;
    // The reserve goes to the backward, and serves every step (each forward's backward is queued
    // before the next forward, on the one stream).
    if (reserve_bytes_ != reserve || (reserve > 0 && !reserve_)) {
      reserve_ = reserve > 0 ? ctx_.allocator->allocate(reserve) : nullptr;
      reserve_bytes_ = reserve;
    }
    return cudnnBatchNormalizationForwardTrainingEx(
        ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, &kOne, &kZero, d, x.raw(),
        z ? d : nullptr, z ? act(*z) : nullptr, d, y.raw(), param_.get(), f32(gamma), f32(beta),
        g_.momentum, running_mean.raw(), running_var.raw(), g_.eps, mean_.raw(), invstd_.raw(),
        activation, ctx_.scratch(workspace), workspace, reserve_.get(), reserve_bytes_);
  }

  // With y (the fused forward's output): dy is the gradient of max(BN(x) (+ z), 0), whose mask
  // the calls take from y (and beta, of that forward); with dz, z's gradient lands there.
  cudnnStatus_t backwardPersistent(const Tensor& x, const Tensor* y, const Tensor& gamma,
                                   const Tensor& dy, const Tensor& dx, const Tensor* dz,
                                   const Tensor& dgamma, const Tensor& dbeta) {
    const cudnnTensorDescriptor_t d = x_->get();
    const bool relu = y != nullptr;
    const cudnnBatchNormOps_t ops = dz     ? CUDNN_BATCHNORM_OPS_BN_ADD_ACTIVATION
                                    : relu ? CUDNN_BATCHNORM_OPS_BN_ACTIVATION
                                           : CUDNN_BATCHNORM_OPS_BN;
    const cudnnActivationDescriptor_t activation = relu ? reluDesc() : nullptr;
    ExSizes& sizes = backward_sizes_[ops];
    if (!sizes.asked) {
      sizes.asked = true;
      sizes.status = cudnnGetBatchNormalizationBackwardExWorkspaceSize(
          ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, d, d, d, dz ? d : nullptr, d,
          param_.get(), activation, &sizes.workspace);
    }
    if (sizes.status != CUDNN_STATUS_SUCCESS) return sizes.status;
    const std::size_t workspace = sizes.workspace;
    return cudnnBatchNormalizationBackwardEx(
        ctx_.cudnn, CUDNN_BATCHNORM_SPATIAL_PERSISTENT, ops, &kOne, &kZero, &kOne, &kZero, d,
        act(x), relu ? d : nullptr, relu ? act(*y) : nullptr, d, act(dy), dz ? d : nullptr,
        dz ? act(*dz) : nullptr, d, act(dx), param_.get(), f32(gamma), relu ? f32(beta_) : nullptr,
        f32(dgamma), f32(dbeta), g_.eps, mean_.raw(), invstd_.raw(), activation,
        ctx_.scratch(workspace), workspace, reserve_.get(), reserve_bytes_);
  }

  cudnnActivationDescriptor_t reluDesc() {
    if (!relu_desc_) {
      TROUPE_CUDA_CHECK(cudnnCreateActivationDescriptor(&relu_desc_));
      TROUPE_CUDA_CHECK(cudnnSetActivationDescriptor(relu_desc_, CUDNN_ACTIVATION_RELU,
                                                     CUDNN_PROPAGATE_NAN, 0.0));
    }
    return relu_desc_;
  }
  // Whether cuDNN refused the ReLU in its persistent calls: the op trains by troupe's batch norm
  // kernels from then on by default, else applies the ReLU with its own kernels (said once, as
  // refused() says a way). Else checks the status.
  void refusedFused(cudnnStatus_t status) {
    if (!isRefusal(status)) TROUPE_CUDA_CHECK(status);
    fuse_relu_ = false;
    if (own_where_refused_) takeOwnWay();
    sayOnce(Way::kPersistent, Way::kPersistent, status, " with its ReLU", own_);
  }
  // Training by troupe's kernels from the next forward on (the scratch they need, made once).
  void takeOwnWay() {
    own_ = true;
    shape_ = BatchNormShape{g_.n,    g_.channels,       g_.spatial,  g_.channels_last,
                            g_.relu, g_.add && g_.relu, g_.momentum, g_.eps};
    partial_ = ctx_.allocator->allocate(static_cast<std::size_t>(batchNormScratch(shape_)) *
                                        sizeof(double));
    coef_ = ctx_.empty({2 * g_.channels}, DType::kFloat32);
    back_ = ctx_.empty({3 * g_.channels}, DType::kFloat32);
  }

  void prepare(DType dtype) {
    if (x_) {
      TROUPE_ENFORCE(dtype == dtype_, "a batch norm made for ", toString(dtype_), " called with ",
                     toString(dtype), " tensors");
      return;
    }
    dtype_ = dtype;
    x_ = std::make_unique<TensorDesc>(g_.n, g_.channels, g_.spatial, 1, dtype, g_.channels_last);
    // Nothing is wider than float32 NCHW: its wide way is the spatial one.
    if (dtype == DType::kFloat32 && !g_.channels_last) {
      train_way_ = std::min(train_way_, Way::kSpatial);
      infer_way_ = Way::kSpatial;
    }
  }
  // Whether cuDNN refused `way` for this type or layout: then `way` is the next one, which the
  // caller takes (and the op keeps to, where `way` is its member). Else checks the status.
  bool refused(cudnnStatus_t status, Way& way) {
    if (isRefusal(status)) {
      const bool widenable = dtype_ != DType::kFloat32 || g_.channels_last;
      if (way == Way::kPersistent || (way == Way::kSpatial && widenable)) {
        const Way next = way == Way::kPersistent ? Way::kSpatial : Way::kWide;
        sayOnce(way, next, status, "", false);
        way = next;
        return true;
      }
    }
    TROUPE_CUDA_CHECK(status);
    return false;
  }
  // A way cuDNN refuses is said once a process for each type, layout and way taken instead (`to`,
  // or troupe's kernels), on stderr (the benchmarks' and the GPU call's logs), since it costs
  // speed.
  void sayOnce(Way from, Way to, cudnnStatus_t status, const char* with, bool troupes) {
    static constexpr const char* kNames[] = {"persistent", "spatial", "wide"};
    const std::string instead = troupes ? "troupe's batch norm kernels instead"
                                        : std::string("the ") + kNames[static_cast<int>(to)] +
                                              " way instead" +
                                              (*with ? ", and troupe's ReLU kernels" : "");
    const std::string line = std::string("troupe cuda: cuDNN's ") + kNames[static_cast<int>(from)] +
                             " batch norm" + with + " refused " + toString(dtype_) +
                             (g_.channels_last ? " channels-last" : " NCHW") + " (" +
                             cudnnGetErrorString(status) + "); " + instead + "\n";
    static std::mutex mutex;
    static std::set<std::string> said;
    std::lock_guard lock(mutex);
    if (said.insert(line).second) std::fputs(line.c_str(), stderr);
  }
  // [n, C, spatial] of the op's type and layout as float32 NCHW, and back.
  Tensor widened(const Tensor& t) {
    const Tensor w = ctx_.uninitialized(t.shape(), DType::kFloat32);
    if (g_.channels_last) {
      transpose(t.dtype(), t.raw(), DType::kFloat32, w.raw(), g_.n, g_.spatial, g_.channels,
                ctx_.stream);
    } else {
      cast(t.dtype(), t.raw(), DType::kFloat32, w.raw(), t.numel(), ctx_.stream);
    }
    return w;
  }
  void narrow(const Tensor& wide, const Tensor& t) {
    if (g_.channels_last) {
      transpose(DType::kFloat32, wide.raw(), t.dtype(), t.raw(), g_.n, g_.channels, g_.spatial,
                ctx_.stream);
    } else {
      cast(DType::kFloat32, wide.raw(), t.dtype(), t.raw(), t.numel(), ctx_.stream);
    }
  }

  Context& ctx_;
  BatchNormGeometry g_;
  DType dtype_ = DType::kFloat32;
  std::unique_ptr<TensorDesc> x_;     // of the tensors' type and layout, made on the first call
  TensorDesc param_, wide_desc_;      // wide_desc_: float32 NCHW, for the wide way
  Way train_way_ = Way::kPersistent;  // the first ways cuDNN has not refused
  Way infer_way_ = Way::kSpatial;
  Way trained_ = Way::kSpatial;    // the way of the last training forward, for the backward
  Tensor mean_, invstd_;           // of the last training forward, for the backward
  std::shared_ptr<void> reserve_;  // the persistent way's, from the forward to the backward
  std::size_t reserve_bytes_ = 0;
  // The persistent calls' workspace and reserve sizes, by cudnnBatchNormOps_t (BN, BN with its
  // activation, BN with add and activation): asked on the first call of each.
  struct ExSizes {
    bool asked = false;
    cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
    std::size_t workspace = 0, reserve = 0;
  };
  ExSizes forward_sizes_[3], backward_sizes_[3];
  // relu: whether cuDNN's persistent calls may still apply it, and whether the last training
  // forward had them do it (trained_ is then kPersistent; its backward has them do it too,
  // reading beta_ of that forward).
  bool fuse_relu_ = true, trained_fused_ = false;
  Tensor beta_;
  cudnnActivationDescriptor_t relu_desc_ = nullptr;
  // The troupe way ($TROUPE_CUDA_BATCH_NORM=troupe, or by default in NCHW with a ReLU where cuDNN
  // refuses it): training in troupe's own kernels (batchNormForward), the ReLU and add always in
  // the same pass; inference stays cuDNN's.
  bool own_ = false, trained_own_ = false, own_where_refused_ = false;
  BatchNormShape shape_;
  std::shared_ptr<void> partial_;  // batchNormScratch(shape_) doubles
  Tensor coef_, back_;
};

class CudaRelu final : public ReluOp {
 public:
  CudaRelu(Context& ctx, std::int64_t numel) : ctx_(ctx), numel_(numel) {}
  void forward(const Tensor& x, const Tensor& y) override {
    reluForward(x.dtype(), act(x), act(y), numel_, ctx_.stream);
  }
  void backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override {
    reluBackward(y.dtype(), act(y), act(dy), act(dx), numel_, ctx_.stream);
  }

 private:
  Context& ctx_;
  std::int64_t numel_;
};

class CudaDropout final : public DropoutOp {
 public:
  CudaDropout(Context& ctx, std::int64_t numel, float ratio)
      : ctx_(ctx), numel_(numel), ratio_(ratio), mask_(ctx.empty({numel}, DType::kFloat32)) {}
  void forward(const Tensor& x, const Tensor& y, std::uint64_t seed) override {
    dropoutForward(x.dtype(), act(x), act(y), f32(mask_), numel_, ratio_, seed, ctx_.stream);
  }
  void backward(const Tensor& dy, const Tensor& dx) override {
    multiply(dy.dtype(), act(dy), f32(mask_), act(dx), numel_, ctx_.stream);
  }

 private:
  Context& ctx_;
  std::int64_t numel_;
  float ratio_;
  Tensor mask_;
};

class CudaAdd final : public AddOp {
 public:
  CudaAdd(Context& ctx, std::int64_t numel) : ctx_(ctx), numel_(numel) {}
  void forward(const Tensor& a, const Tensor& b, const Tensor& y) override {
    add(a.dtype(), act(a), act(b), act(y), numel_, ctx_.stream);
  }

 private:
  Context& ctx_;
  std::int64_t numel_;
};

class CudaGlobalAvgPool final : public GlobalAvgPoolOp {
 public:
  CudaGlobalAvgPool(Context& ctx, std::int64_t planes, std::int64_t spatial,
                    std::int64_t channels_last)
      : ctx_(ctx), planes_(planes), spatial_(spatial), channels_last_(channels_last) {}
  void forward(const Tensor& x, const Tensor& y) override {
    globalAvgPoolForward(x.dtype(), act(x), act(y), planes_, spatial_, channels_last_, ctx_.stream);
  }
  void backward(const Tensor& dy, const Tensor& dx) override {
    globalAvgPoolBackward(dy.dtype(), act(dy), act(dx), planes_, spatial_, channels_last_,
                          ctx_.stream);
  }

 private:
  Context& ctx_;
  std::int64_t planes_, spatial_;
  std::int64_t channels_last_;  // the channels when [n, spatial, channels] in memory; else 0
};

// The kernel records the first bad label; the forward's caller reads the metrics anyway, so the
// report rides along: backward() waits for the forward's flag (the forward is the last op before
// it) and throws InputError as the CPU op does.
class CudaSoftmaxLoss final : public SoftmaxLossOp, public Checked {
 public:
  CudaSoftmaxLoss(Context& ctx, std::int64_t n, std::int64_t classes, float smoothing)
      : ctx_(ctx),
        n_(n),
        classes_(classes),
        smoothing_(smoothing),
        prob_(ctx.empty({n * classes}, DType::kFloat32)),
        rows_(ctx.empty({4 * n}, DType::kFloat32)),
        bad_(ctx.empty({2}, DType::kInt32)) {
    TROUPE_CUDA_CHECK(cudaMallocHost(&bad_host_, 2 * sizeof(int)));
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~CudaSoftmaxLoss() override {
    std::erase(ctx_.unchecked, static_cast<Checked*>(this));
    cudaEventSynchronize(done_);  // the copy into bad_host_ ends before it is freed
    cudaEventDestroy(done_);
    cudaFreeHost(bad_host_);
  }
  // The bad labels of the last forward, which the backend's synchronize() calls for once the
  // stream is done with it.
  void check() override { checkLabels(); }

  void forward(const Tensor& logits, const Tensor& labels, const Tensor& metrics) override {
    checkLabels();  // a forward never checked yet (no synchronize since): before its flag goes
    TROUPE_ENFORCE_EQ(logits.numel(), n_ * classes_);
    TROUPE_ENFORCE_EQ(labels.numel(), n_);
    TROUPE_ENFORCE_EQ(metrics.numel(), 2);
    labels_ = labels;
    softmaxLossForward(logits.dtype(), act(logits), static_cast<const std::int32_t*>(labels.raw()),
                       f32(prob_), f32(metrics), static_cast<int*>(bad_.raw()), rows_.raw(), n_,
                       classes_, smoothing_, ctx_.stream);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(bad_host_, bad_.raw(), 2 * sizeof(int),
                                      cudaMemcpyDeviceToHost, ctx_.stream));
    if (ctx_.capturing) {
      // Recorded again by each replay, where the host can wait for it.
      TROUPE_CUDA_CHECK(cudaEventRecordWithFlags(done_, ctx_.stream, cudaEventRecordExternal));
      ctx_.captured_checks.push_back(this);
      return;  // the capture ran nothing to check
    }
    TROUPE_CUDA_CHECK(cudaEventRecord(done_, ctx_.stream));
    checked_ = false;
    ctx_.unchecked.push_back(this);
  }
  // A replay's forward, as forward() queues it: the last one's labels checked first.
  void beforeReplay() override { checkLabels(); }
  void afterReplay() override {
    checked_ = false;
    ctx_.unchecked.push_back(this);
  }
  // Rows with a bad label get zeros; the error comes at the next synchronize().
  void backward(float scale, const Tensor& dlogits) override {
    softmaxLossBackward(dlogits.dtype(), f32(prob_),
                        static_cast<const std::int32_t*>(labels_.raw()), act(dlogits), n_, classes_,
                        scale, smoothing_, ctx_.stream);
  }

 private:
  void checkLabels() {
    if (checked_) return;
    TROUPE_CUDA_CHECK(cudaEventSynchronize(done_));
    checked_ = true;
    std::erase(ctx_.unchecked, static_cast<Checked*>(this));
    if (bad_host_[0] > 0) {
      throw InputError("label " + std::to_string(bad_host_[1]) + " of sample " +
                       std::to_string(bad_host_[0] - 1) + " is outside [0, " +
                       std::to_string(classes_) + ")");
    }
  }

  Context& ctx_;
  std::int64_t n_, classes_;
  float smoothing_;
  Tensor prob_, rows_, bad_, labels_;
  int* bad_host_ = nullptr;
  cudaEvent_t done_ = nullptr;
  bool checked_ = true;
};

static_assert(sizeof(cuda::ChannelValues::mean) / sizeof(float) == Backend::kMaxChannels);

// Page-locked host memory (every device copies it asynchronously), zero-filled.
Tensor pinned(Shape shape, DType dtype) {
  const auto bytes =
      std::max<std::size_t>(1, static_cast<std::size_t>(numelOf(shape)) * sizeOf(dtype));
  void* p = nullptr;
  TROUPE_CUDA_CHECK(cudaMallocHost(&p, bytes));
  std::memset(p, 0, bytes);
  std::shared_ptr<void> storage(p, [](void* q) { cudaFreeHost(q); });
  return Tensor(std::move(storage), p, std::move(shape), dtype, Device{});
}

// The same for whoever stages data for `device` from a thread of its own (pinnedHostBuffer).
Tensor pinnedFor(Shape shape, DType dtype, int device) {
  if (device >= 0) TROUPE_CUDA_CHECK(cudaSetDevice(device));
  return pinned(std::move(shape), dtype);
}

// An instantiated CUDA graph of a backend's stream. It keeps the memory its work used that
// nobody else may (DeviceAllocator::endHolding, the workspace of its capture); the ops whose work
// is checked on the host (a softmax loss's labels) outlive it, as the net that owns both ensures.
class CudaGraph final : public DeviceGraph {
 public:
  CudaGraph(Context& ctx, cudaGraphExec_t exec, std::vector<Checked*> checks,
            std::shared_ptr<DeviceAllocator::Held> held, std::shared_ptr<void> workspace)
      : ctx_(ctx),
        exec_(exec),
        checks_(std::move(checks)),
        held_(std::move(held)),
        workspace_(std::move(workspace)) {}
  ~CudaGraph() override {
    cudaStreamSynchronize(ctx_.stream);  // its memory goes back to the cache after its last run
    cudaGraphExecDestroy(exec_);
  }
  void replay() override {
    TROUPE_CUDA_CHECK(cudaSetDevice(ctx_.device));
    for (Checked* c : checks_)
      c->beforeReplay();
    const cudaError_t launched = cudaGraphLaunch(exec_, ctx_.stream);
    if (launched != cudaSuccess) {
      (void)cudaGetLastError();
      TROUPE_CUDA_CHECK(launched);
    }
    for (Checked* c : checks_)
      c->afterReplay();
  }

 private:
  Context& ctx_;
  cudaGraphExec_t exec_;
  std::vector<Checked*> checks_;
  std::shared_ptr<DeviceAllocator::Held> held_;
  std::shared_ptr<void> workspace_;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int index, const CudaOptions& options) {
    ctx_.device = index;
    ctx_.options = options;
    TROUPE_CUDA_CHECK(cudaSetDevice(index));
    TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    TROUPE_CUDA_CHECK(cudnnCreate(&ctx_.cudnn));
    TROUPE_CUDA_CHECK(cudnnSetStream(ctx_.cudnn, ctx_.stream));
    TROUPE_CUDA_CHECK(cublasCreate(&ctx_.cublas));
    TROUPE_CUDA_CHECK(cublasSetStream(ctx_.cublas, ctx_.stream));
    TROUPE_CUDA_CHECK(cublasSetMathMode(
        ctx_.cublas, options.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    ctx_.allocator = std::make_shared<DeviceAllocator>(index);
    TROUPE_CUDA_CHECK(cudaMallocHost(&flag_host_, sizeof(int)));
    flag_ = ctx_.empty({1}, DType::kInt32);
    updates_flag_ = ctx_.empty({1}, DType::kInt32);
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(ctx_.stream);
    conv_plans_.clear();  // before the handle they were built with
    cudaFreeHost(flag_host_);
    cublasDestroy(ctx_.cublas);
    cudnnDestroy(ctx_.cudnn);
    cudaStreamDestroy(ctx_.stream);
  }

  Device device() const override { return Device{DeviceKind::kCuda, ctx_.device}; }
  int threads() const override { return 1; }

  Tensor empty(Shape shape, DType dtype) override {
    setDevice();
    return ctx_.empty(std::move(shape), dtype);
  }

  Tensor hostBuffer(Shape shape, DType dtype) override {
    setDevice();
    return pinned(std::move(shape), dtype);
  }

  void copy(const Tensor& src, const Tensor& dst) override {
    TROUPE_ENFORCE(src.dtype() == dst.dtype(), "copy between dtypes");
    TROUPE_ENFORCE_EQ(src.numel(), dst.numel());
    if (src.bytes() == 0 || src.raw() == dst.raw()) return;
    if (src.device().kind == DeviceKind::kCpu && dst.device().kind == DeviceKind::kCpu) {
      std::memmove(dst.raw(), src.raw(), src.bytes());
      return;
    }
    setDevice();
    // To or from pageable host memory the call returns once the host side is done with it; to
    // and from hostBuffer()'s pinned memory it returns at once.
    TROUPE_CUDA_CHECK(
        cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(), cudaMemcpyDefault, ctx_.stream));
  }

  void cast(const Tensor& src, const Tensor& dst) override {
    TROUPE_ENFORCE_EQ(src.numel(), dst.numel());
    setDevice();
    cuda::cast(src.dtype(), act(src), dst.dtype(), act(dst), src.numel(), ctx_.stream);
  }
  void transpose(const Tensor& src, const Tensor& dst, std::int64_t batches, std::int64_t rows,
                 std::int64_t cols) override {
    TROUPE_ENFORCE(src.numel() == batches * rows * cols && dst.numel() == src.numel(),
                   "a transpose of ", batches, "x", rows, "x", cols, " from ", src.numel(),
                   " into ", dst.numel(), " elements");
    TROUPE_ENFORCE(src.raw() != dst.raw(), "a transpose in place");
    setDevice();
    cuda::transpose(src.dtype(), act(src), dst.dtype(), act(dst), batches, rows, cols, ctx_.stream);
  }
  bool allFinite(const std::vector<Tensor>& tensors) override {
    setDevice();
    TROUPE_CUDA_CHECK(cudaMemsetAsync(flag_.raw(), 0, sizeof(int), ctx_.stream));
    for (const Tensor& t : tensors)
      cuda::nonFinite(f32(t), t.numel(), static_cast<int*>(flag_.raw()), ctx_.stream);
    TROUPE_CUDA_CHECK(
        cudaMemcpyAsync(flag_host_, flag_.raw(), sizeof(int), cudaMemcpyDeviceToHost, ctx_.stream));
    synchronize();
    return *flag_host_ == 0;
  }
  void fill(const Tensor& t, float value) override {
    cuda::fill(t.dtype(), act(t), t.numel(), value, ctx_.stream);
  }
  void axpy(float alpha, const Tensor& x, const Tensor& y) override {
    TROUPE_ENFORCE_EQ(x.numel(), y.numel());
    TROUPE_ENFORCE(x.dtype() == y.dtype(), "axpy of ", toString(x.dtype()), " into ",
                   toString(y.dtype()));
    cuda::axpy(x.dtype(), alpha, act(x), act(y), x.numel(), ctx_.stream);
  }
  void scale(const Tensor& t, float alpha) override {
    cuda::scale(t.dtype(), act(t), alpha, t.numel(), ctx_.stream);
  }
  void normalise(const Tensor& bytes, const Tensor& out, const std::vector<float>& mean,
                 const std::vector<float>& scale) override {
    const NormaliseShape s = normaliseShape(bytes, out, mean, scale);
    cuda::ChannelValues values;
    values.means = static_cast<int>(mean.size());
    values.scales = static_cast<int>(scale.size());
    std::copy(mean.begin(), mean.end(), values.mean);
    std::copy(scale.begin(), scale.end(), values.scale);
    cuda::normalise(static_cast<const std::uint8_t*>(bytes.raw()), f32(out), s.n * s.channels,
                    s.channels, s.plane, values, ctx_.stream);
  }
  // The finiteness of the updates gathers in a flag of its own on the device (zero from the
  // backend's creation and after each read).
  void sgdUpdate(const Tensor& w, const Tensor& g, const Tensor& v, float lr, float momentum,
                 float weight_decay, bool nesterov) override {
    TROUPE_ENFORCE_EQ(w.numel(), g.numel());
    TROUPE_ENFORCE_EQ(w.numel(), v.numel());
    cuda::sgd(f32(w), f32(g), f32(v), w.numel(), lr, momentum, weight_decay, nesterov,
              static_cast<int*>(updates_flag_.raw()), ctx_.stream);
  }
  void sgdUpdateExcept(
      const Tensor& w, const Tensor& g, const Tensor& v, float lr, float momentum,
      float weight_decay, bool nesterov,
      const std::vector<std::pair<std::int64_t, std::int64_t>>& no_decay) override {
    TROUPE_ENFORCE_EQ(w.numel(), g.numel());
    TROUPE_ENFORCE_EQ(w.numel(), v.numel());
    std::int64_t after = 0;
    for (const auto& [lo, hi] : no_decay) {
      TROUPE_ENFORCE(after <= lo && lo <= hi && hi <= w.numel(), "no-decay range [", lo, ", ", hi,
                     ") out of order or outside ", w.numel(), " weights");
      after = hi;
    }
    cuda::sgdExcept(f32(w), f32(g), f32(v), w.numel(), lr, momentum, weight_decay, nesterov,
                    no_decay, static_cast<int*>(updates_flag_.raw()), ctx_.stream);
  }
  void update(const UpdateKernel& kernel, const UpdateArgs& a) override {
    const std::int64_t n = a.w.numel();
    TROUPE_ENFORCE(a.state_offset >= 0 && a.stride >= a.state_offset + n &&
                       a.state.numel() >= kernel.states * a.stride,
                   "state of ", a.state.numel(), " values for ", kernel.states, " rows of ",
                   a.stride, " from ", a.state_offset, " (", n, " weights)");
    setDevice();
    const RuleTables& t = ruleTables(planUpdate(a, kernel.layerwise));
    cuda::RuleLaunch l{f32(a.w),
                       f32(a.g),
                       f32(a.state) + a.state_offset,
                       a.stride,
                       a.scalars,
                       static_cast<const cuda::UpdateChunk*>(t.chunks.raw()),
                       t.num_chunks,
                       static_cast<const std::int64_t*>(t.segments.raw()),
                       t.num_segments,
                       static_cast<double*>(t.partials.raw()),
                       f32(t.ratios),
                       static_cast<int*>(updates_flag_.raw())};
    if (!cuda::ruleUpdate(kernel.name, l, ctx_.stream)) {
      throw InputError(std::string("this CUDA plugin has no kernel of the optimizer rule '") +
                       kernel.name + "' (a plugin built before the rule was added?)");
    }
  }
  double sumOfSquares(const std::vector<Tensor>& tensors) override {
    setDevice();
    if (tensors.empty()) return 0.0;
    const std::size_t blocks = cuda::kSquareBlocks;
    Tensor partials = ctx_.empty(
        {static_cast<std::int64_t>(tensors.size() * blocks * sizeof(double))}, DType::kUInt8);
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      cuda::sumSquares(f32(tensors[k]), tensors[k].numel(),
                       static_cast<double*>(partials.raw()) + k * blocks, ctx_.stream);
    }
    std::vector<double> host(tensors.size() * blocks);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(host.data(), partials.raw(), host.size() * sizeof(double),
                                      cudaMemcpyDeviceToHost, ctx_.stream));
    synchronize();
    double total = 0;
    for (double x : host)
      total += x;
    return total;
  }
  bool updatesFinite() override {
    setDevice();
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(flag_host_, updates_flag_.raw(), sizeof(int),
                                      cudaMemcpyDeviceToHost, ctx_.stream));
    TROUPE_CUDA_CHECK(cudaMemsetAsync(updates_flag_.raw(), 0, sizeof(int), ctx_.stream));
    synchronize();
    return *flag_host_ == 0;
  }
  void synchronize() override {
    notCapturing("a host wait (synchronize, allFinite, updatesFinite)");
    TROUPE_CUDA_CHECK(cudaGetLastError());  // a launch that failed
    TROUPE_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    while (!ctx_.unchecked.empty())
      ctx_.unchecked.front()->check();  // removes itself
  }
  // While a graph is captured: an event that each replay records at this point.
  Event record() override {
    setDevice();
    return Event(std::make_shared<const CudaEvent>(ctx_.device, ctx_.stream, /*timed=*/false,
                                                   /*in_graph=*/ctx_.capturing));
  }
  Event recordTimed() override {
    notCapturing("a timed event recorded");
    setDevice();
    return Event(std::make_shared<const CudaEvent>(ctx_.device, ctx_.stream, /*timed=*/true));
  }
  double elapsed(const Event& from, const Event& to) override { return secondsBetween(from, to); }
  void waitFor(const Event& e) override {
    notCapturing("a wait for an event");
    streamWaitFor(ctx_.stream, e);
  }

  // Stream capture in this thread's mode: other threads' calls (a reducer's cudaMalloc) do not
  // spoil it.
  std::unique_ptr<DeviceGraph> capture(const std::function<void()>& queue) override {
    setDevice();
    synchronize();  // what the ops check on the host, checked before: no host wait inside
    TROUPE_CUDA_CHECK(cudaStreamBeginCapture(ctx_.stream, cudaStreamCaptureModeThreadLocal));
    ctx_.capturing = true;
    ctx_.captured_checks.clear();
    ctx_.allocator->beginHolding();
    cudaGraph_t graph = nullptr;
    auto end = [&] {
      ctx_.capturing = false;
      auto held = ctx_.allocator->endHolding();
      const cudaError_t e = cudaStreamEndCapture(ctx_.stream, &graph);
      return std::make_pair(e, std::move(held));
    };
    try {
      queue();
    } catch (...) {
      end();
      if (graph) cudaGraphDestroy(graph);
      (void)cudaGetLastError();  // the capture's own error, if it was invalidated
      throw;
    }
    auto [e, held] = end();
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      throw Error(std::string("CUDA failed: cudaStreamEndCapture: ") + cudaGetErrorString(e) +
                  " (a call that cannot be captured was made while capturing)");
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (made != cudaSuccess) {
      (void)cudaGetLastError();  // not left for the next launch's check to find
      TROUPE_CUDA_CHECK(made);
    }
    return std::make_unique<CudaGraph>(ctx_, exec, std::move(ctx_.captured_checks), std::move(held),
                                       ctx_.workspace);
  }
  MemoryStats memory() const override {
    const auto s = ctx_.allocator->stats();
    return MemoryStats{s.in_use, s.peak_in_use, s.reserved,
                       static_cast<std::int64_t>(ctx_.workspace_bytes), s.device_peak};
  }
  void resetPeakMemory() override { ctx_.allocator->resetPeak(); }
  void lendWorkspace(const Tensor& free) override {
    ctx_.lent = free.raw();
    ctx_.lent_bytes = free.raw() ? free.bytes() : 0;
  }

  std::unique_ptr<ConvOp> makeConv(const ConvGeometry& g) override {
    setDevice();
    return std::make_unique<CudaConv>(ctx_, g, conv_algos_, conv_plans_);
  }
  std::unique_ptr<PoolOp> makePool(const PoolGeometry& g) override {
    TROUPE_ENFORCE(
        g.n > 0 && g.channels > 0 && g.kernel > 0 && g.stride > 0 && g.pad >= 0 && g.pad < g.kernel,
        "bad pooling geometry");
    setDevice();
    return std::make_unique<CudaPool>(ctx_, g);
  }
  std::unique_ptr<InnerProductOp> makeInnerProduct(const InnerProductGeometry& g) override {
    return std::make_unique<CudaInnerProduct>(ctx_, g);
  }
  std::unique_ptr<BatchNormOp> makeBatchNorm(const BatchNormGeometry& g) override {
    setDevice();
    return std::make_unique<CudaBatchNorm>(ctx_, g);
  }
  std::unique_ptr<ReluOp> makeRelu(std::int64_t numel) override {
    return std::make_unique<CudaRelu>(ctx_, numel);
  }
  std::unique_ptr<DropoutOp> makeDropout(std::int64_t numel, float ratio) override {
    TROUPE_ENFORCE(ratio >= 0.0f && ratio < 1.0f, "dropout ratio ", ratio);
    setDevice();
    return std::make_unique<CudaDropout>(ctx_, numel, ratio);
  }
  std::unique_ptr<AddOp> makeAdd(std::int64_t numel) override {
    return std::make_unique<CudaAdd>(ctx_, numel);
  }
  std::unique_ptr<GlobalAvgPoolOp> makeGlobalAvgPool(std::int64_t n, std::int64_t channels,
                                                     std::int64_t spatial,
                                                     bool channels_last) override {
    return std::make_unique<CudaGlobalAvgPool>(ctx_, n * channels, spatial,
                                               channels_last ? channels : 0);
  }
  std::unique_ptr<SoftmaxLossOp> makeSoftmaxLoss(std::int64_t n, std::int64_t classes,
                                                 float label_smoothing) override {
    TROUPE_ENFORCE(label_smoothing >= 0.0f && label_smoothing < 1.0f, "label smoothing ",
                   label_smoothing);
    setDevice();
    return std::make_unique<CudaSoftmaxLoss>(ctx_, n, classes, label_smoothing);
  }

 private:
  // Calls may come from any thread (one at a time): each sets the device it works on.
  void setDevice() { TROUPE_CUDA_CHECK(cudaSetDevice(ctx_.device)); }
  // What CUDA would refuse on a capturing stream, refused by name.
  void notCapturing(const char* what) const {
    TROUPE_ENFORCE(!ctx_.capturing, what, " while a CUDA graph is captured");
  }

  // An update plan's chunks on the device (cut to kChunk elements, one block each), with its
  // segments' chunk ranges and the scratch of their sums: made once per plan, kept (the same
  // buckets come every step), so that a step queues no copy.
  struct RuleTables {
    Tensor chunks, segments, partials, ratios;
    int num_chunks = 0, num_segments = 0;
  };
  const RuleTables& ruleTables(const UpdatePlan& plan) {
    constexpr std::int64_t kChunk = 8192;
    // The pieces are the key: a step's lookup costs four numbers a piece, the chunks are made on
    // a plan's first call only.
    std::vector<std::int64_t> key;
    key.reserve(4 * plan.pieces.size());
    for (const UpdatePiece& p : plan.pieces)
      key.insert(key.end(), {p.begin, p.end, p.segment, p.decay ? 1 : 0});
    auto found = rule_tables_.find(key);
    if (found != rule_tables_.end()) return found->second;
    notCapturing("an optimizer update's first call for its ranges");
    std::vector<cuda::UpdateChunk> chunks;
    std::vector<std::int64_t> segments(2 * plan.segments.size(), 0);
    for (const UpdatePiece& p : plan.pieces) {
      if (p.segment >= 0 && (chunks.empty() || chunks.back().segment != p.segment))
        segments[2 * static_cast<std::size_t>(p.segment)] =
            static_cast<std::int64_t>(chunks.size());
      for (std::int64_t b = p.begin; b < p.end; b += kChunk)
        chunks.push_back({b, std::min(p.end, b + kChunk), p.segment, p.decay ? 1 : 0});
      if (p.segment >= 0)
        segments[2 * static_cast<std::size_t>(p.segment) + 1] =
            static_cast<std::int64_t>(chunks.size());
    }
    RuleTables t;
    t.num_chunks = static_cast<int>(chunks.size());
    t.num_segments = static_cast<int>(plan.segments.size());
    const auto upload = [&](const void* from, std::size_t bytes) {
      Tensor to =
          ctx_.empty({static_cast<std::int64_t>(std::max<std::size_t>(bytes, 1))}, DType::kUInt8);
      if (bytes) {
        TROUPE_CUDA_CHECK(
            cudaMemcpyAsync(to.raw(), from, bytes, cudaMemcpyHostToDevice, ctx_.stream));
        TROUPE_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
      }
      return to;
    };
    t.chunks = upload(chunks.data(), chunks.size() * sizeof(cuda::UpdateChunk));
    t.segments = upload(segments.data(), segments.size() * sizeof(std::int64_t));
    t.partials = ctx_.empty(
        {static_cast<std::int64_t>(std::max<std::size_t>(1, 2 * chunks.size()) * sizeof(double))},
        DType::kUInt8);
    t.ratios = ctx_.empty({std::max<std::int64_t>(1, t.num_segments)}, DType::kFloat32);
    return rule_tables_.emplace(std::move(key), std::move(t)).first->second;
  }

  Context ctx_;
  std::map<std::vector<std::int64_t>, ConvAlgos> conv_algos_;
  std::map<std::vector<std::int64_t>, ConvPlans> conv_plans_;
  std::map<std::vector<std::int64_t>, RuleTables> rule_tables_;
  Tensor flag_, updates_flag_;  // allFinite's; sgdUpdate's, gathered until updatesFinite()
  int* flag_host_ = nullptr;
};

CudaInfo describe() {
  CudaInfo info;
  cudaRuntimeGetVersion(&info.runtime);
  cudaDriverGetVersion(&info.driver);
  info.cudnn = static_cast<std::int64_t>(cudnnGetVersion());
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
      cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS) {
    info.cublas = major * 10000 + minor * 100 + patch;
  }
  ncclGetVersion(&info.nccl);
  info.architectures = TROUPE_CUDA_ARCHITECTURES;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    info.problem = info.driver == 0
                       ? "no NVIDIA driver on this machine (libcuda.so.1 is not loadable)"
                       : std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return info;
  }
  if (count == 0) info.problem = "the driver sees no CUDA device";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    CudaDeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.major = p.major;
    d.minor = p.minor;
    d.memory = static_cast<std::int64_t>(p.totalGlobalMem);
    d.multiprocessors = p.multiProcessorCount;
    info.devices.push_back(d);
  }
  return info;
}

std::unique_ptr<Backend> make(int index, const CudaOptions& options) {
  return std::make_unique<CudaBackend>(index, options);
}

}  // namespace
}  // namespace troupe::kernels::cuda

TROUPE_CUDA_PLUGIN(troupe::kernels::cuda)
