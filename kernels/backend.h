// A Backend is one device's kernels and memory: the CPU (a thread budget) or one GPU (a stream).
//
// Layers and actors reach a device only through this interface, so a CUDA backend slots in beside
// the CPU one without changing them. Work is queued in order on the backend's stream: calls return
// once the work is queued, not necessarily done (on the CPU they run at once). synchronize() is the
// only host wait, and callers make it explicit (after a step, before reading a metric).
// Thread safety: one backend belongs to one actor (one replica); call it from one thread at a time.
// Several backends may compute at once from different threads, each within its own thread budget.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/event.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"
#include "kernels/update.h"
#include "troupe/error.h"

namespace troupe::kernels {

// Bytes of device memory a backend holds (zeros on the CPU, whose tensors are plain host memory).
struct MemoryStats {
  std::int64_t in_use = 0;       // in live tensors and workspaces
  std::int64_t peak_in_use = 0;  // the most in_use ever was
  std::int64_t reserved = 0;     // taken from the device, cached blocks included
  std::int64_t workspace = 0;    // of that in use, the ops' shared workspace (a convolution's)
  // The most that every backend of this process on this device held together (a replica's, its
  // updater's, its copier's): torch.cuda.max_memory_allocated's count.
  std::int64_t device_peak = 0;
};

// A backend's queued work, recorded once and queued again whole (a CUDA graph): Backend::capture.
class DeviceGraph {
 public:
  virtual ~DeviceGraph() = default;
  // Queues the recorded work again, with the arguments, pointers and sizes it was recorded with,
  // as one launch. From the backend owner's thread; the graph goes before its backend, and its
  // destructor waits for the backend's queued work (its memory goes back after its last replay).
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // Threads (CPU) this backend computes with.
  virtual int threads() const = 0;

  // Memory owned by this backend, zero-filled.
  virtual Tensor empty(Shape shape, DType dtype = DType::kFloat32) = 0;
  // Host memory, zero-filled, that this backend's copies to and from run asynchronously (pinned,
  // on a GPU; plain host memory on the CPU): for staging what goes between host and device.
  // Allocating it is slow on a GPU: keep it, never make it per step.
  virtual Tensor hostBuffer(Shape shape, DType dtype = DType::kFloat32) = 0;
  // Copies src into dst (same dtype and element count); either may be on the host or this device.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // dst = src (same element count, both on this backend) converted between float32, float16 and
  // bfloat16, rounding to nearest even; a value beyond float16's range becomes inf.
  virtual void cast(const Tensor& src, const Tensor& dst) = 0;
  // dst[b][j][i] = src[b][i][j] for b < batches, i < rows, j < cols, converted as cast() does:
  // NCHW images to NHWC (rows = C, cols = H W) and back, a filter to cuDNN's channels-last KRSC.
  virtual void transpose(const Tensor& src, const Tensor& dst, std::int64_t batches,
                         std::int64_t rows, std::int64_t cols) = 0;
  // fill, axpy and scale take float32 tensors, and on a device also float16 and bfloat16 ones.
  virtual void fill(const Tensor& t, float value) = 0;
  // y += alpha * x over all elements.
  virtual void axpy(float alpha, const Tensor& x, const Tensor& y) = 0;
  // t *= alpha.
  virtual void scale(const Tensor& t, float alpha) = 0;
  // Images [n, C, H, W] of uint8 `bytes` to float `out` (same shape): (value - mean[c]) * scale[c]
  // for channel c, each of mean and scale holding C values or one for all (at most kMaxChannels).
  // A batch read as bytes (input_dtype uint8) crosses to a device as bytes and is normalised there.
  static constexpr int kMaxChannels = 16;
  virtual void normalise(const Tensor& bytes, const Tensor& out, const std::vector<float>& mean,
                         const std::vector<float>& scale) = 0;
  // Whether every element of these float32 tensors is finite (no inf, no NaN): one host wait for
  // them all on a device. A step whose loss-scaled gradients are not is skipped (mixed precision).
  virtual bool allFinite(const std::vector<Tensor>& tensors) = 0;
  // One SGD step over equal-sized flat tensors (PyTorch semantics): g' = g + weight_decay * w;
  // v = momentum * v + g'; w -= lr * v, or with nesterov w -= lr * (g' + momentum * v).
  // Whether every updated weight is finite (no inf, no NaN) is tested in the same pass and
  // gathered, without a host wait, until updatesFinite() reads it.
  virtual void sgdUpdate(const Tensor& w, const Tensor& g, const Tensor& v, float lr,
                         float momentum, float weight_decay, bool nesterov) = 0;
  // The same with no weight decay on the elements of w in `no_decay` (sorted, disjoint ranges
  // within [0, w.numel()): a batch norm's and a bias's in Goyal et al.'s recipe). By default an
  // sgdUpdate a range; a device backend takes them all in one pass.
  virtual void sgdUpdateExcept(const Tensor& w, const Tensor& g, const Tensor& v, float lr,
                               float momentum, float weight_decay, bool nesterov,
                               const std::vector<std::pair<std::int64_t, std::int64_t>>& no_decay) {
    std::int64_t at = 0;
    auto update = [&](std::int64_t lo, std::int64_t hi, float decay) {
      if (lo < hi) {
        sgdUpdate(w.slice(lo, hi), g.slice(lo, hi), v.slice(lo, hi), lr, momentum, decay, nesterov);
      }
    };
    for (const auto& [lo, hi] : no_decay) {
      update(at, lo, weight_decay);
      update(lo, hi, 0.0f);
      at = hi;
    }
    update(at, w.numel(), weight_decay);
  }
  // One step of an optimizer's rule (kernels/update.h) over a.w: its state updated in place, and
  // whether every new weight is finite gathered as sgdUpdate's is. A layerwise rule's trust ratios
  // come from sums over each layer in a fixed order (a run repeats to the bit). A device backend
  // without a kernel of that name throws InputError naming it.
  virtual void update(const UpdateKernel& kernel, const UpdateArgs& a) = 0;
  // Sum of squares of every element of these float32 tensors (the global norm of gradient
  // clipping, squared), in a fixed order: a host wait on a device.
  virtual double sumOfSquares(const std::vector<Tensor>& tensors) = 0;
  // Whether every weight that sgdUpdate or update updated since the last call is finite; resets. A
  // host wait for those updates on a device backend (call it once per step), free on the CPU.
  virtual bool updatesFinite() = 0;
  // Waits until all queued work is done; throws what that work found wrong on the device (a bad
  // label of a softmax loss).
  virtual void synchronize() = 0;
  // An event done once the work queued so far is (on the CPU, at once: a default Event).
  virtual Event record() = 0;
  // Work queued from now on starts only once `e` is done: on the device where it can (another
  // stream's CUDA event), else by waiting on the host. Returns at once on a device.
  virtual void waitFor(const Event& e) = 0;
  // As record(), and the device notes when it gets there, for traces (a little costlier).
  virtual Event recordTimed() = 0;
  // Seconds from `from` to `to`, two done recordTimed() events of this backend; 0 on the CPU,
  // whose work the host times itself.
  virtual double elapsed(const Event& from, const Event& to) = 0;
  virtual MemoryStats memory() const { return {}; }
  // From here, peak_in_use and device_peak count from what is in use now (a replica's after each
  // step, so that an epoch's peak is its own steps', not the first step's trials).
  virtual void resetPeakMemory() {}
  // Memory that nothing reads or writes during the work queued until the next call (a net's arena
  // where no activation or gradient lives during one layer's call), which that work may take as
  // its workspace before the shared one; an undefined tensor ends the loan. A convolution's
  // workspace is then held only during its layer's call, as PyTorch's caching allocator frees it
  // after the call, instead of through the whole step.
  virtual void lendWorkspace(const Tensor& free) { (void)free; }
  // Waits for the work queued so far, then runs `queue`, recording the work it queues on this
  // backend instead of running it (CUDA stream capture), and returns that work as a graph whose
  // replay() costs the host one launch where queueing it costs a call an op. Null where the
  // backend cannot (the CPU, which has no queue). Every value is fixed at the capture: the
  // tensors' addresses and shapes, the scalars (a loss scale, a learning rate), the random seeds.
  // `queue` may not wait on the host (synchronize, allFinite, updatesFinite, a copy to or from
  // pageable memory), wait for events or time them, or be an op's first call (which finds its
  // algorithm by timing, and grows the workspace): those throw, and nothing stays recorded. The
  // memory the work reads and writes must stay allocated while the graph lives: the caller's
  // tensors and the ops' own (an op keeps its buffers; the graph keeps the workspace it used, and
  // any memory freed meanwhile). An event record() gives in `queue` marks that point of each
  // replay, as a CUDA event recorded again: after a replay, it is done once the last replay
  // queued got there (not to be asked before the first).
  virtual std::unique_ptr<DeviceGraph> capture(const std::function<void()>& queue) {
    (void)queue;
    return nullptr;
  }

  // Op factories (kernels/ops.h); each op is fixed to its geometry and used on this backend only.
  virtual std::unique_ptr<ConvOp> makeConv(const ConvGeometry& g) = 0;
  virtual std::unique_ptr<PoolOp> makePool(const PoolGeometry& g) = 0;
  virtual std::unique_ptr<InnerProductOp> makeInnerProduct(const InnerProductGeometry& g) = 0;
  virtual std::unique_ptr<BatchNormOp> makeBatchNorm(const BatchNormGeometry& g) = 0;
  virtual std::unique_ptr<ReluOp> makeRelu(std::int64_t numel) = 0;
  virtual std::unique_ptr<DropoutOp> makeDropout(std::int64_t numel, float ratio) = 0;
  virtual std::unique_ptr<AddOp> makeAdd(std::int64_t numel) = 0;
  virtual std::unique_ptr<GlobalAvgPoolOp> makeGlobalAvgPool(std::int64_t n, std::int64_t channels,
                                                             std::int64_t spatial,
                                                             bool channels_last = false) = 0;
  // label_smoothing in [0, 1): SoftmaxLossOp's target.
  virtual std::unique_ptr<SoftmaxLossOp> makeSoftmaxLoss(std::int64_t n, std::int64_t classes,
                                                         float label_smoothing) = 0;
  // Sequence models' ops. A backend without them throws InputError naming the op and the device.
  // Defined here, not in a .cc: Backend keeps no key function, so that its type information is in
  // every library that uses it (the CUDA plugin, loaded at run time, among them).
  virtual std::unique_ptr<EmbeddingOp> makeEmbedding(const EmbeddingGeometry&) {
    noKernel("an embedding");
  }
  virtual std::unique_ptr<LayerNormOp> makeLayerNorm(const LayerNormGeometry&) {
    noKernel("layer norm");
  }
  virtual std::unique_ptr<GeluOp> makeGelu(std::int64_t) { noKernel("GELU"); }
  virtual std::unique_ptr<AttentionOp> makeAttention(const AttentionGeometry&) {
    noKernel("self-attention");
  }
  virtual std::unique_ptr<LstmOp> makeLstm(const LstmGeometry&) { noKernel("an LSTM"); }

 private:
  [[noreturn]] void noKernel(const char* op) const {
    throw InputError(std::string(op) + " has no kernel on " + toString(device()) +
                     " yet: sequence models train on the CPU");
  }
};

// A CPU backend computing with `threads` threads (OpenMP; oneDNN's sgemm underneath). It flushes
// denormals to zero on the threads it computes with. Results are bitwise repeatable for a given
// thread count (reductions are split by thread). Throws InputError unless threads >= 1.
std::unique_ptr<Backend> makeCpuBackend(int threads);

// The float32 operations a second of this machine's sgemm (oneDNN's) on `threads` threads: the
// best of six 1024 x 1024 x 1024 products after two to warm up (about 0.1 s in all on 2 cores).
// The denominator of model FLOPs utilisation on the CPU (Net::trainingFlopsPerSample).
double cpuSgemmPeak(int threads);

}  // namespace troupe::kernels
