// A stand-in for libtroupe_cuda.so that the tests load where no GPU is (TROUPE_CUDA_LIBRARY): it
// reports $TROUPE_EMULATED_GPUS devices (2 unless set) and gives backends that behave, towards
// the code that uses them, as the CUDA backend does:
//   - their tensors say they live on cuda:N, so the host may not touch them (Tensor::f32 throws);
//     the memory is host memory underneath;
//   - work is queued on a stream, a thread of the backend's own, and runs later: a caller that
//     reads what it did not wait for (an Event, synchronize) reads it too early. With
//     $TROUPE_EMULATED_GPU_DELAY_US each piece of work first sleeps that long, so that such a read
//     finds old values nearly always, and copies from pinned memory sleep
//     $TROUPE_EMULATED_GPU_COPY_DELAY_US more, so that its writer, had it not waited, would
//     change it first;
//   - copies to pageable host memory return once done, copies from it once the source was read,
//     as cudaMemcpyAsync's do; copies to its hostBuffer()s (pinned) return at once; sgdUpdate
//     waits for its result; what the work threw (a bad label) comes at the next host wait.
// The arithmetic is the CPU backend's with one thread, so results match a CPU run with one thread
// per replica to the bit.
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "emulated_nccl.h"
#include "kernels/backend.h"
#include "kernels/cuda_plugin.h"
#include "stream.h"
#include "troupe/error.h"

namespace troupe::kernels::emulated {
namespace {

// A device's memory in live tensors, and its most.
class MemoryCounter {
 public:
  void add(std::int64_t bytes) {
    std::lock_guard lock(mutex_);
    stats_.in_use += bytes;
    stats_.reserved = stats_.in_use;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
    stats_.device_peak = stats_.peak_in_use;  // a backend's own: one a device here
  }
  MemoryStats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }
  void resetPeak() {
    std::lock_guard lock(mutex_);
    stats_.peak_in_use = stats_.device_peak = stats_.in_use;
  }

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

// The host buffers handed out as pinned, while they live (any emulated device copies them
// asynchronously, as any GPU does pinned memory).
class PinnedRanges {
 public:
  void add(const void* p, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    ranges_[static_cast<const char*>(p)] = bytes;
  }
  void remove(const void* p) {
    std::lock_guard lock(mutex_);
    ranges_.erase(static_cast<const char*>(p));
  }
  bool holds(const void* p, std::size_t bytes) const {
    std::lock_guard lock(mutex_);
    const auto* c = static_cast<const char*>(p);
    auto it = ranges_.upper_bound(c);
    if (it == ranges_.begin()) return false;
    --it;
    return c + bytes <= it->first + it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<const char*, std::size_t> ranges_;
};

// Shared with the buffers' deleters, which may run after everything else here is gone.
const std::shared_ptr<PinnedRanges>& pinnedRanges() {
  static const auto ranges = std::make_shared<PinnedRanges>();
  return ranges;
}

// The plugin's pinned host memory: plain host memory, registered while it lives.
Tensor pinned(Shape shape, DType dtype) {
  const auto bytes = static_cast<std::size_t>(numelOf(shape)) * sizeOf(dtype);
  void* p = std::aligned_alloc(64, std::max<std::size_t>(64, (bytes + 63) / 64 * 64));
  if (p == nullptr) throw ResourceError("out of host memory for a pinned buffer");
  std::memset(p, 0, bytes);
  pinnedRanges()->add(p, bytes);
  std::shared_ptr<void> storage(p, [ranges = pinnedRanges()](void* q) {
    ranges->remove(q);
    std::free(q);
  });
  return Tensor(std::move(storage), p, std::move(shape), dtype, Device{});
}

// pinnedHostBuffer's: the emulator has no current device to set.
Tensor pinnedFor(Shape shape, DType dtype, int) {
  return pinned(std::move(shape), dtype);
}

bool reduced(const Tensor& t) {
  return t.dtype() == DType::kFloat16 || t.dtype() == DType::kBFloat16;
}

// A GPU computes on float16 and bfloat16 tensors and the CPU ops take float32: a Widened is a
// float32 copy of such a tensor for one call, rounded back into it after the call where the call
// changed it (elements it did not write are not stored to, so that an input read elsewhere at the
// same time is left alone). A cuDNN op on these types computes in float too, rounding its output
// once. Other tensors pass through.
class Widened {
 public:
  explicit Widened(const Tensor& t) : narrow_(t) {
    if (!reduced(t)) {
      wide_ = t;
      return;
    }
    wide_ = Tensor::hostUninitialized(t.shape());
    const auto* in = static_cast<const std::uint16_t*>(t.raw());
    float* out = wide_.f32();
    for (std::int64_t i = 0; i < t.numel(); ++i)
      out[i] = t.dtype() == DType::kFloat16 ? fromFloat16(in[i]) : fromBFloat16(in[i]);
  }
  const Tensor& get() const { return wide_; }
  void narrowBack() const {
    if (!reduced(narrow_)) return;
    auto* out = static_cast<std::uint16_t*>(narrow_.raw());
    const float* in = wide_.f32();
    for (std::int64_t i = 0; i < narrow_.numel(); ++i) {
      const std::uint16_t v =
          narrow_.dtype() == DType::kFloat16 ? toFloat16(in[i]) : toBFloat16(in[i]);
      if (v != out[i]) out[i] = v;
    }
  }

 private:
  Tensor narrow_, wide_;
};

// Calls fn with the Widened copies of `tensors`, then rounds back what it wrote.
template <typename Fn, typename... Tensors>
void widened(Fn&& fn, const Tensors&... tensors) {
  const std::array<Widened, sizeof...(Tensors)> wide{Widened(tensors)...};
  std::apply([&](const auto&... w) { fn(w.get()...); }, wide);
  for (const auto& w : wide)
    w.narrowBack();
}

// An argument of a channels-last op: an image tensor [n, c, s] that is [n, s, c] in memory (a
// filter [out, in, k k] that is [out, k k, in] likewise), and whether the op writes it. n 0: no
// image (a bias, a batch norm's scale).
struct Nhwc {
  std::int64_t n = 0, c = 0, s = 0;
  bool out = false;
};

// Each op of the CPU backend, its calls queued on the stream with host views of their tensors
// (float32 copies of reduced-precision ones). A channels-last op's images go to the CPU's NCHW op
// as NCHW copies, transposed by the CPU backend (`cpu`, used on the stream only), and what it
// writes comes back to NHWC.
template <typename Op>
class Queued {
 public:
  Queued(std::shared_ptr<Stream> stream, std::unique_ptr<Op> op,
         std::shared_ptr<Backend> cpu = nullptr)
      : stream_(std::move(stream)), op_(std::move(op)), cpu_(std::move(cpu)) {}

 protected:
  // The memory lent for a workspace (Backend::lendWorkspace), which the ops given it scribble
  // over (NaN in every float type) on the stream before and after their call, as a CUDA op's
  // workspace is written: a loan that overlaps what the call reads or what outlives it shows as
  // results unlike the CPU's.
  void workspaceFrom(std::shared_ptr<const Tensor> lent) { lent_ = std::move(lent); }
  void scribble() {
    if (!lent_ || lent_->raw() == nullptr) return;
    stream_->enqueue([to = hostView(*lent_)] { std::memset(to.raw(), 0xff, to.bytes()); });
  }

  template <typename Call, typename... Tensors>
  void queueNhwc(Call call, std::vector<Nhwc> layout, const Tensors&... tensors) {
    called();
    scribble();
    constexpr std::size_t kCount = sizeof...(Tensors);
    stream_->enqueue(
        [op = op_, cpu = cpu_, call, layout, views = std::make_tuple(hostView(tensors)...)] {
          std::apply(
              [&](const auto&... t) {
                widened(
                    [&](const auto&... w) {
                      const std::array<Tensor, kCount> given{w...};
                      std::array<Tensor, kCount> nchw = given;
                      for (std::size_t k = 0; k < kCount; ++k) {
                        const Nhwc& l = layout[k];
                        if (l.n == 0 || given[k].raw() == nullptr) continue;
                        nchw[k] = Tensor::hostUninitialized(given[k].shape());
                        cpu->transpose(given[k], nchw[k], l.n, l.s, l.c);
                      }
                      callWith(call, *op, nchw, std::make_index_sequence<kCount>{});
                      for (std::size_t k = 0; k < kCount; ++k) {
                        const Nhwc& l = layout[k];
                        if (l.n == 0 || !l.out || given[k].raw() == nullptr) continue;
                        cpu->transpose(nchw[k], given[k], l.n, l.c, l.s);
                      }
                    },
                    t...);
              },
              views);
        });
    scribble();
  }
  template <typename Call, std::size_t N, std::size_t... I>
  static void callWith(Call& call, Op& op, const std::array<Tensor, N>& args,
                       std::index_sequence<I...>) {
    call(op, args[I]...);
  }

  template <typename Call, typename... Tensors>
  void queue(Call call, const Tensors&... tensors) {
    called();
    scribble();
    stream_->enqueue([op = op_, call, views = std::make_tuple(hostView(tensors)...)]() mutable {
      std::apply(
          [&](const auto&... t) { widened([&](const auto&... w) { call(*op, w...); }, t...); },
          views);
    });
    scribble();
  }
  // Refuses an op's first call while a graph is captured, as the CUDA backend does: there a first
  // call finds the op's algorithm (timing it, growing the workspace), which a capture cannot hold.
  void called() {
    if (!called_) stream_->refuseWhileRecording("an op's first call");
    called_ = true;
  }
  bool called_ = false;
  std::shared_ptr<Stream> stream_;
  std::shared_ptr<Op> op_;        // shared with queued work: a net may go before its work ran
  std::shared_ptr<Backend> cpu_;  // for channels-last ops
  std::shared_ptr<const Tensor> lent_;
};

class Conv final : public ConvOp, Queued<ConvOp> {
 public:
  Conv(std::shared_ptr<Stream> stream, std::shared_ptr<Backend> cpu, const ConvGeometry& g)
      : Queued(std::move(stream), cpu->makeConv(nchw(g)), cpu), g_(g) {}
  using Queued::workspaceFrom;
  void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    auto call = [](ConvOp& op, auto&... t) { op.forward(t...); };
    if (!g_.channels_last) return queue(call, x, w, b, y);
    queueNhwc(call, {in(), filter(), {}, out(true)}, x, w, b, y);
  }
  void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                const Tensor& dw, const Tensor& db) override {
    queueBackward([](ConvOp& op, auto&... t) { op.backward(t...); }, x, w, dy, dx, dw, db);
  }
  // As cuDNN's backward-data with beta 1: the gradient computed apart, then added (as the CPU net
  // adds a second writer's scratch, so that the two end with the same bits).
  bool addsToDx() const override { return true; }
  void backwardAddingToDx(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                          const Tensor& dw, const Tensor& db) override {
    auto call = [cpu = cpu_](ConvOp& op, auto& x, auto& w, auto& dy, auto& dx, auto& dw, auto& db) {
      Tensor own = Tensor::hostUninitialized(dx.shape());
      op.backward(x, w, dy, own, dw, db);
      cpu->axpy(1.0f, own, dx);
    };
    queueBackward(call, x, w, dy, dx, dw, db);
  }

 private:
  // A backward call (x, w, dy, dx, dw, db) queued, in NCHW for the CPU's op: dx and dw written.
  template <typename Call>
  void queueBackward(Call call, const Tensor& x, const Tensor& w, const Tensor& dy,
                     const Tensor& dx, const Tensor& dw, const Tensor& db) {
    if (!g_.channels_last) return queue(call, x, w, dy, dx, dw, db);
    Nhwc dx_layout = in(), dw_layout = filter();
    dx_layout.out = dw_layout.out = true;
    queueNhwc(call, {in(), filter(), out(false), dx_layout, dw_layout, {}}, x, w, dy, dx, dw, db);
  }
  static ConvGeometry nchw(ConvGeometry g) {
    g.channels_last = false;
    return g;
  }
  Nhwc in() const { return {g_.n, g_.channels, g_.height * g_.width, false}; }
  Nhwc out(bool written) const {
    return {g_.n, g_.out_channels, g_.outHeight() * g_.outWidth(), written};
  }
  Nhwc filter() const { return {g_.out_channels, g_.channels, g_.kernel * g_.kernel, false}; }
  ConvGeometry g_;
};

class Pool final : public PoolOp, Queued<PoolOp> {
 public:
  Pool(std::shared_ptr<Stream> stream, std::shared_ptr<Backend> cpu, const PoolGeometry& g)
      : Queued(std::move(stream), cpu->makePool(nchw(g)), cpu), g_(g) {}
  void forward(const Tensor& x, const Tensor& y) override {
    auto call = [](PoolOp& op, auto&... t) { op.forward(t...); };
    if (!g_.channels_last) return queue(call, x, y);
    queueNhwc(call, {in(false), out(true)}, x, y);
  }
  void backward(const Tensor& dy, const Tensor& dx) override {
    auto call = [](PoolOp& op, auto&... t) { op.backward(t...); };
    if (!g_.channels_last) return queue(call, dy, dx);
    queueNhwc(call, {out(false), in(true)}, dy, dx);
  }

 private:
  static PoolGeometry nchw(PoolGeometry g) {
    g.channels_last = false;
    return g;
  }
  Nhwc in(bool written) const { return {g_.n, g_.channels, g_.height * g_.width, written}; }
  Nhwc out(bool written) const {
    return {g_.n, g_.channels, g_.outHeight() * g_.outWidth(), written};
  }
  PoolGeometry g_;
};

class InnerProduct final : public InnerProductOp, Queued<InnerProductOp> {
 public:
  using Queued::Queued;
  void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    queue([](InnerProductOp& op, auto&... t) { op.forward(t...); }, x, w, b, y);
  }
  void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                const Tensor& dw, const Tensor& db) override {
    queue([](InnerProductOp& op, auto&... t) { op.backward(t...); }, x, w, dy, dx, dw, db);
  }
};

class BatchNorm final : public BatchNormOp, Queued<BatchNormOp> {
 public:
  BatchNorm(std::shared_ptr<Stream> stream, std::shared_ptr<Backend> cpu,
            const BatchNormGeometry& g)
      : Queued(std::move(stream), cpu->makeBatchNorm(nchw(g)), cpu), g_(g) {}
  using Queued::workspaceFrom;
  void forward(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
               const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
               bool train) override {
    auto call = [train](BatchNormOp& op, auto&... t) { op.forward(t..., train); };
    if (!g_.channels_last) return queue(call, x, z, gamma, beta, running_mean, running_var, y);
    queueNhwc(call, {image(false), image(false), {}, {}, {}, {}, image(true)}, x, z, gamma, beta,
              running_mean, running_var, y);
  }
  void backward(const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& dy,
                const Tensor& dx, const Tensor& dz, const Tensor& dgamma,
                const Tensor& dbeta) override {
    auto call = [](BatchNormOp& op, auto&... t) { op.backward(t...); };
    if (!g_.channels_last) return queue(call, x, y, gamma, dy, dx, dz, dgamma, dbeta);
    queueNhwc(call,
              {image(false), image(false), {}, image(false), image(true), image(true), {}, {}}, x,
              y, gamma, dy, dx, dz, dgamma, dbeta);
  }

 private:
  static BatchNormGeometry nchw(BatchNormGeometry g) {
    g.channels_last = false;
    return g;
  }
  Nhwc image(bool written) const { return {g_.n, g_.channels, g_.spatial, written}; }
  BatchNormGeometry g_;
};

class Relu final : public ReluOp, Queued<ReluOp> {
 public:
  using Queued::Queued;
  void forward(const Tensor& x, const Tensor& y) override {
    queue([](ReluOp& op, auto&... t) { op.forward(t...); }, x, y);
  }
  void backward(const Tensor& y, const Tensor& dy, const Tensor& dx) override {
    queue([](ReluOp& op, auto&... t) { op.backward(t...); }, y, dy, dx);
  }
};

class Dropout final : public DropoutOp, Queued<DropoutOp> {
 public:
  using Queued::Queued;
  void forward(const Tensor& x, const Tensor& y, std::uint64_t seed) override {
    queue([seed](DropoutOp& op, auto&... t) { op.forward(t..., seed); }, x, y);
  }
  void backward(const Tensor& dy, const Tensor& dx) override {
    queue([](DropoutOp& op, auto&... t) { op.backward(t...); }, dy, dx);
  }
};

class Add final : public AddOp, Queued<AddOp> {
 public:
  using Queued::Queued;
  void forward(const Tensor& a, const Tensor& b, const Tensor& y) override {
    queue([](AddOp& op, auto&... t) { op.forward(t...); }, a, b, y);
  }
};

class GlobalAvgPool final : public GlobalAvgPoolOp, Queued<GlobalAvgPoolOp> {
 public:
  GlobalAvgPool(std::shared_ptr<Stream> stream, std::shared_ptr<Backend> cpu, std::int64_t n,
                std::int64_t channels, std::int64_t spatial, bool channels_last)
      : Queued(std::move(stream), cpu->makeGlobalAvgPool(n, channels, spatial), cpu),
        layout_(channels_last ? Nhwc{n, channels, spatial, false} : Nhwc{}) {}
  void forward(const Tensor& x, const Tensor& y) override {
    auto call = [](GlobalAvgPoolOp& op, auto&... t) { op.forward(t...); };
    if (layout_.n == 0) return queue(call, x, y);
    queueNhwc(call, {layout_, {}}, x, y);
  }
  void backward(const Tensor& dy, const Tensor& dx) override {
    auto call = [](GlobalAvgPoolOp& op, auto&... t) { op.backward(t...); };
    if (layout_.n == 0) return queue(call, dy, dx);
    Nhwc written = layout_;
    written.out = true;
    queueNhwc(call, {{}, written}, dy, dx);
  }

 private:
  Nhwc layout_;  // of the input, when channels last
};

// A bad label fails the forward on the stream: thrown at the next host wait, as the CUDA op's.
class SoftmaxLoss final : public SoftmaxLossOp, Queued<SoftmaxLossOp> {
 public:
  using Queued::Queued;
  void forward(const Tensor& logits, const Tensor& labels, const Tensor& metrics) override {
    queue([](SoftmaxLossOp& op, auto&... t) { op.forward(t...); }, logits, labels, metrics);
  }
  void backward(float scale, const Tensor& dlogits) override {
    queue([scale](SoftmaxLossOp& op, auto&... t) { op.backward(scale, t...); }, dlogits);
  }
};

class EmulatedBackend final : public Backend {
 public:
  explicit EmulatedBackend(int index)
      : index_(index), cpu_(makeCpuBackend(1)), stream_(std::make_shared<Stream>()) {}
  ~EmulatedBackend() override {
    try {
      stream_->drain();
    } catch (...) {  // thrown at a host wait before, or nobody waited: gone with the backend
    }
  }

  Device device() const override { return Device{DeviceKind::kCuda, index_}; }
  int threads() const override { return 1; }

  // Pinned: copies into it do not wait (the stream writes it later), as cudaMemcpyAsync's to
  // cudaMallocHost memory do not.
  Tensor hostBuffer(Shape shape, DType dtype) override {
    return emulated::pinned(std::move(shape), dtype);
  }

  // Counted as a GPU's memory is (Backend::memory), freed when its last view goes.
  Tensor empty(Shape shape, DType dtype) override {
    const Tensor host = Tensor::host(std::move(shape), dtype);
    const auto bytes = static_cast<std::int64_t>(host.bytes());
    memory_->add(bytes);
    std::shared_ptr<Tensor> keep(new Tensor(host), [memory = memory_, bytes](Tensor* t) {
      memory->add(-bytes);
      delete t;
    });
    return Tensor(std::shared_ptr<void>(keep, host.raw()), host.raw(), host.shape(), dtype,
                  device());
  }
  MemoryStats memory() const override { return memory_->stats(); }
  void resetPeakMemory() override { memory_->resetPeak(); }
  void lendWorkspace(const Tensor& free) override { *lent_ = free; }

  void copy(const Tensor& src, const Tensor& dst) override {
    TROUPE_ENFORCE(src.dtype() == dst.dtype(), "copy between dtypes");
    TROUPE_ENFORCE_EQ(src.numel(), dst.numel());
    if (src.bytes() == 0 || src.raw() == dst.raw()) return;
    if (onHost(src) && onHost(dst)) {
      std::memmove(dst.raw(), src.raw(), src.bytes());
      return;
    }
    if ((onHost(src) && !isPinned(src)) || (onHost(dst) && !isPinned(dst)))
      stream_->refuseWhileRecording("a copy to or from pageable host memory");
    if (onHost(src) && !isPinned(src)) {  // pageable: read now, written in stream order
      auto staged =
          Tensor::hostUninitialized({static_cast<std::int64_t>(src.bytes())}, DType::kUInt8);
      std::memcpy(staged.raw(), src.raw(), src.bytes());
      stream_->enqueue(
          [staged, to = hostView(dst)] { std::memcpy(to.raw(), staged.raw(), staged.bytes()); });
      return;
    }
    // From pinned memory the stream reads the source late: $TROUPE_EMULATED_GPU_COPY_DELAY_US
    // later still, so that a source written again too early shows.
    const int late = onHost(src) ? copy_delay_ : 0;
    stream_->enqueue([from = hostView(src), to = hostView(dst), late] {
      if (late > 0) std::this_thread::sleep_for(std::chrono::microseconds(late));
      std::memmove(to.raw(), from.raw(), from.bytes());
    });
    if (onHost(dst) && !isPinned(dst)) stream_->drain();  // to pageable memory: once done
  }

  void cast(const Tensor& src, const Tensor& dst) override {
    stream_->enqueue(
        [cpu = cpu_, from = hostView(src), to = hostView(dst)] { cpu->cast(from, to); });
  }
  void transpose(const Tensor& src, const Tensor& dst, std::int64_t batches, std::int64_t rows,
                 std::int64_t cols) override {
    stream_->enqueue([=, cpu = cpu_, from = hostView(src), to = hostView(dst)] {
      cpu->transpose(from, to, batches, rows, cols);
    });
  }
  bool allFinite(const std::vector<Tensor>& tensors) override {
    auto finite = std::make_shared<bool>(true);
    std::vector<Tensor> views;
    for (const auto& t : tensors)
      views.push_back(hostView(t));
    stream_->enqueue([cpu = cpu_, views, finite] { *finite = cpu->allFinite(views); });
    stream_->drain();
    return *finite;
  }
  void fill(const Tensor& t, float value) override {
    stream_->enqueue([cpu = cpu_, t = hostView(t), value] {
      widened([&](const Tensor& w) { cpu->fill(w, value); }, t);
    });
  }
  void axpy(float alpha, const Tensor& x, const Tensor& y) override {
    stream_->enqueue([cpu = cpu_, alpha, x = hostView(x), y = hostView(y)] {
      widened([&](const Tensor& a, const Tensor& b) { cpu->axpy(alpha, a, b); }, x, y);
    });
  }
  void scale(const Tensor& t, float alpha) override {
    stream_->enqueue([cpu = cpu_, t = hostView(t), alpha] {
      widened([&](const Tensor& w) { cpu->scale(w, alpha); }, t);
    });
  }
  void normalise(const Tensor& bytes, const Tensor& out, const std::vector<float>& mean,
                 const std::vector<float>& scale) override {
    stream_->enqueue([cpu = cpu_, b = hostView(bytes), o = hostView(out), mean, scale] {
      cpu->normalise(b, o, mean, scale);
    });
  }
  // The finiteness gathers in the CPU backend that computes on the stream; read there.
  void sgdUpdate(const Tensor& w, const Tensor& g, const Tensor& v, float lr, float momentum,
                 float weight_decay, bool nesterov) override {
    stream_->enqueue([=, cpu = cpu_, w = hostView(w), g = hostView(g), v = hostView(v)] {
      cpu->sgdUpdate(w, g, v, lr, momentum, weight_decay, nesterov);
    });
  }
  void update(const UpdateKernel& kernel, const UpdateArgs& a) override {
    UpdateArgs on_host = a;
    on_host.w = hostView(a.w);
    on_host.g = hostView(a.g);
    on_host.state = hostView(a.state);
    stream_->enqueue([cpu = cpu_, kernel, on_host] { cpu->update(kernel, on_host); });
  }
  double sumOfSquares(const std::vector<Tensor>& tensors) override {
    std::vector<Tensor> views;
    for (const Tensor& t : tensors)
      views.push_back(hostView(t));
    auto sum = std::make_shared<double>(0.0);
    stream_->enqueue([cpu = cpu_, views, sum] { *sum = cpu->sumOfSquares(views); });
    stream_->drain();
    return *sum;
  }
  bool updatesFinite() override {
    auto finite = std::make_shared<bool>(true);
    stream_->enqueue([cpu = cpu_, finite] { *finite = cpu->updatesFinite(); });
    stream_->drain();
    return *finite;
  }
  void synchronize() override { stream_->drain(); }
  // Recorded while a graph is captured: at that point of each replay (cudaEventRecordExternal's);
  // done until the first.
  Event record() override {
    const bool capturing = stream_->recording();
    auto event = std::make_shared<StreamEvent>(!capturing);
    if (capturing) captured_events_.push_back(event);
    stream_->enqueue([event] { event->fire(); });
    return Event(event);
  }
  Event recordTimed() override {
    stream_->refuseWhileRecording("a timed event recorded");
    return record();
  }
  double elapsed(const Event& from, const Event& to) override { return secondsBetween(from, to); }
  void waitFor(const Event& e) override {
    stream_->refuseWhileRecording("a wait for an event");
    if (e.done()) return;
    if (dynamic_cast<const StreamEvent*>(e.impl()) != nullptr) {
      stream_->enqueue(waitAsQueued(e));
    } else {
      e.wait();
    }
  }

  // The work kept as the stream recorded it, each piece queued again on replay: its tensors'
  // addresses and its scalars as they were at the capture.
  class Graph final : public DeviceGraph {
   public:
    Graph(std::shared_ptr<Stream> stream, std::vector<std::function<void()>> work,
          std::vector<std::shared_ptr<StreamEvent>> events)
        : stream_(std::move(stream)), work_(std::move(work)), events_(std::move(events)) {}
    void replay() override {
      for (const auto& e : events_)
        e->rearm();
      for (const auto& w : work_)
        stream_->enqueue(w);
    }

   private:
    std::shared_ptr<Stream> stream_;
    std::vector<std::function<void()>> work_;
    std::vector<std::shared_ptr<StreamEvent>> events_;  // recorded in the capture
  };
  std::unique_ptr<DeviceGraph> capture(const std::function<void()>& queue) override {
    stream_->drain();  // as the CUDA backend's
    stream_->beginRecording();
    captured_events_.clear();
    try {
      queue();
    } catch (...) {
      stream_->endRecording();
      throw;
    }
    return std::make_unique<Graph>(stream_, stream_->endRecording(),
                                   std::exchange(captured_events_, {}));
  }

  std::unique_ptr<ConvOp> makeConv(const ConvGeometry& g) override {
    auto conv = std::make_unique<Conv>(stream_, cpu_, g);
    conv->workspaceFrom(lent_);
    return conv;
  }
  std::unique_ptr<PoolOp> makePool(const PoolGeometry& g) override {
    return std::make_unique<Pool>(stream_, cpu_, g);
  }
  std::unique_ptr<InnerProductOp> makeInnerProduct(const InnerProductGeometry& g) override {
    return std::make_unique<InnerProduct>(stream_, cpu_->makeInnerProduct(g));
  }
  std::unique_ptr<BatchNormOp> makeBatchNorm(const BatchNormGeometry& g) override {
    auto bn = std::make_unique<BatchNorm>(stream_, cpu_, g);
    bn->workspaceFrom(lent_);
    return bn;
  }
  std::unique_ptr<ReluOp> makeRelu(std::int64_t numel) override {
    return std::make_unique<Relu>(stream_, cpu_->makeRelu(numel));
  }
  std::unique_ptr<DropoutOp> makeDropout(std::int64_t numel, float ratio) override {
    return std::make_unique<Dropout>(stream_, cpu_->makeDropout(numel, ratio));
  }
  std::unique_ptr<AddOp> makeAdd(std::int64_t numel) override {
    return std::make_unique<Add>(stream_, cpu_->makeAdd(numel));
  }
  std::unique_ptr<GlobalAvgPoolOp> makeGlobalAvgPool(std::int64_t n, std::int64_t channels,
                                                     std::int64_t spatial,
                                                     bool channels_last) override {
    return std::make_unique<GlobalAvgPool>(stream_, cpu_, n, channels, spatial, channels_last);
  }
  std::unique_ptr<SoftmaxLossOp> makeSoftmaxLoss(std::int64_t n, std::int64_t classes,
                                                 float label_smoothing) override {
    return std::make_unique<SoftmaxLoss>(stream_,
                                         cpu_->makeSoftmaxLoss(n, classes, label_smoothing));
  }

 private:
  static bool isPinned(const Tensor& t) { return pinnedRanges()->holds(t.raw(), t.bytes()); }

  int index_;
  std::shared_ptr<Backend> cpu_;  // its ops and element-wise loops, run on the stream
  std::shared_ptr<Stream> stream_;
  std::shared_ptr<MemoryCounter> memory_ = std::make_shared<MemoryCounter>();
  std::shared_ptr<Tensor> lent_ = std::make_shared<Tensor>();  // lendWorkspace's
  std::vector<std::shared_ptr<StreamEvent>> captured_events_;  // by the capture under way
  const int copy_delay_ = envInt("TROUPE_EMULATED_GPU_COPY_DELAY_US", 0);
};

CudaInfo describe() {
  CudaInfo info;
  info.architectures = "emulated";
  const int count = envInt("TROUPE_EMULATED_GPUS", 2);
  for (int i = 0; i < count; ++i) {
    CudaDeviceInfo d;
    d.index = i;
    d.name = "troupe's emulated GPU (host memory, the CPU backend's ops on a stream thread)";
    info.devices.push_back(d);
  }
  if (count == 0) info.problem = "the emulator was asked for no devices (TROUPE_EMULATED_GPUS=0)";
  return info;
}

std::unique_ptr<Backend> make(int index, const CudaOptions&) {
  const int count = envInt("TROUPE_EMULATED_GPUS", 2);
  if (index < 0 || index >= count) {
    throw InputError("there is no cuda:" + std::to_string(index) + ": the emulator has " +
                     std::to_string(count) + " device(s)");
  }
  return std::make_unique<EmulatedBackend>(index);
}

}  // namespace
}  // namespace troupe::kernels::emulated

TROUPE_CUDA_PLUGIN(troupe::kernels::emulated)
