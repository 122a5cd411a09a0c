// Training-step throughput of the built-in models on a backend: forward + backward + SGD
// (momentum 0.9) at a fixed batch, printed as samples/s, plus a per-op breakdown of LeNet and the
// MLP. Compare with bench/kernels_vs_pytorch.py (CPU) and bench/gpu_vs_pytorch.py (GPU), which run
// the same models in PyTorch. Inputs are the model's own: 1x28x28 and 10 classes for lenet and
// mlp, 3x32x32 and 10 for the CIFAR ResNets, 3x224x224 and 1000 for the ImageNet ones.
//
//   troupe_kernels_bench [--threads 2] [--batch 64] [--seconds 3] [--models lenet,mlp,resnet20]
//                        [--no-ops] [--device cpu|cuda:N] [--tf32] [--precision fp16|bf16]
//                        [--channels-last] [--deterministic] [--no-fuse] [--host-ops] [--graphs]
//                        [--profile]
// On a GPU each row also gives the backend's peak memory in use. --precision: mixed precision as
// a run's (NetOptions::precision); fp16 with the updater's loss-scale work each step (a finiteness
// test of the gradients and their unscaling), as PyTorch's GradScaler does. --channels-last: NHWC
// images on the device (NetOptions::channels_last; memory_format nhwc). --no-fuse: each ReLU on its
// own, not in its batch norm's pass (NetOptions::fuse), to measure what the fusion gives.
// --host-ops: the host's and the device's time per call of single ResNet-50 ops (convolutions,
// batch norms, a ReLU) in the run's type and layout, to tell which calls keep a GPU waiting.
// --graphs: each step's forward and backward by a CUDA graph (NetOptions::graphs), recorded at the
// second step with the same inputs and loss scale; a row then says graphs=replayed/recorded.
// --models gpt2: GPT-2 124M on token sequences of --seq tokens (256 by default; vocabulary 50257),
// its rows counted in sequences/s (tokens/s is that times --seq).
// --profile: after the timing, 3 steps with each layer between two timed events on the device,
// and a table of each kind of layer's ms a step (Net::setProfiling). Where the host sets the pace,
// a layer's time includes the device waiting for its calls: read it where the GPU does (fp32,
// large batches, --graphs' rows say whether).
// "host" in a row: the wall time per step the host spent queueing the step's work, its waits
// left out; on a device, a figure near the step's own says the host sets the pace, not the GPU.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda_plugin.h"
#include "kernels/net.h"
#include "kernels/optimizer.h"
#include "kernels/random.h"

using namespace troupe::kernels;

namespace {

using Clock = std::chrono::steady_clock;

// Process CPU time in seconds (all threads, spin-waits included).
double cpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// CPU seconds per call of the last timeIt(): with one thread, the cost of the work itself on a
// machine where other processes compete for the cores (wall time then includes waiting).
double g_cpu_per_call = 0;

// Wall seconds per step that the host spent queueing a training step's work (forward, backward,
// unscale, update), its waits (fp16's finiteness read, the synchronize) left out. On a device,
// near the step's own time it says that the host, not the GPU, sets the pace.
double g_host_per_step = 0;

// Runs fn repeatedly for about `seconds` after a warm-up (then calls warmed, if given); returns
// seconds per call.
double timeIt(const std::function<void()>& fn, double seconds,
              const std::function<void()>& warmed = nullptr) {
  for (int i = 0; i < 3; ++i)
    fn();
  if (warmed) warmed();
  int calls = 0;
  const auto start = Clock::now();
  const double cpu_start = cpuSeconds();
  double elapsed = 0;
  do {
    fn();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  g_cpu_per_call = (cpuSeconds() - cpu_start) / calls;
  return elapsed / calls;
}

Tensor randomTensor(Backend& backend, Shape shape, std::uint64_t stream) {
  Tensor host = Tensor::host(shape);
  for (std::int64_t i = 0; i < host.numel(); ++i)
    host.f32()[i] = 2.0f * uniform01(randomBits(7, stream, i)) - 1.0f;
  Tensor t = backend.empty(std::move(shape));
  backend.copy(host, t);
  return t;
}

// The tokens a gpt2 sequence holds (--seq).
std::int64_t g_seq = 256;

struct Input {
  int channels, size, labels;
};
Input inputOf(const std::string& model) {
  if (model == "gpt2") return {1, 1, 50257};
  if (model == "lenet" || model == "mlp" || model == "softmax") return {1, 28, 10};
  if (model.rfind("resnet", 0) == 0 && model != "resnet20" && model != "resnet56") {
    return {3, 224, 1000};
  }
  return {3, 32, 10};
}

// Where a device's peak memory goes, from the last trainStep: the net's activations and
// gradients (its arena, NetMemory::held) and its parameters' tensors.
NetMemory g_net_memory;
std::int64_t g_param_bytes = 0;

// How the last trainStep's net ran its steps with --graphs, and with --profile where they went.
StepGraphStats g_graph_stats;
StepProfile g_profile;

double trainStep(Backend& backend, const std::string& model, std::int64_t batch, double seconds,
                 DType precision, bool channels_last, bool fuse, bool graphs, bool profile) {
  const Input in = inputOf(model);
  NetOptions options;
  options.fuse = fuse;
  options.model.name = model;
  options.max_batch = batch;
  options.channels = in.channels;
  options.height = options.width = in.size;
  options.num_labels = in.labels;
  options.precision = precision;
  options.channels_last = channels_last;
  options.graphs = graphs;
  const bool tokens = model == "gpt2";
  const std::int64_t rows = tokens ? g_seq : 1;  // labels a sample
  if (tokens) options.sequence_length = g_seq;
  auto net = makeNet(backend, options);
  auto sgd = makeOptimizer(backend, net->numParams(), OptimizerSettings{});
  g_net_memory = net->memory();
  // float32 weights, gradients and momentum, and the 16-bit or channels-last copies of the first
  // two where the net computes from copies.
  const bool copies = precision != DType::kFloat32 || channels_last;
  g_param_bytes =
      net->numParams() * (12 + (copies ? 2 * static_cast<std::int64_t>(sizeOf(precision)) : 0));
  // On the CPU, several random batches in turn, so that training never converges to a zero loss.
  // On a device one, as bench/gpu_vs_pytorch.py's PyTorch loop has: the peak memory then counts
  // one batch of images on both sides.
  const int batches = backend.device().kind == DeviceKind::kCpu ? 8 : 1;
  std::vector<Tensor> images, labels;
  for (int b = 0; b < batches; ++b) {
    Tensor host = Tensor::host({batch * rows}, DType::kInt32);
    for (std::int64_t i = 0; i < batch * rows; ++i)
      host.i32()[i] = static_cast<int>(randomBits(9, b, i) % static_cast<unsigned>(in.labels));
    labels.push_back(backend.empty({batch * rows}, DType::kInt32));
    backend.copy(host, labels.back());
    if (tokens) {  // the labels' values as the tokens: any tokens do
      images.push_back(backend.empty({batch, rows}, DType::kInt32));
      backend.copy(host, images.back());
    } else {
      images.push_back(randomTensor(backend, {batch, in.channels, in.size, in.size}, b + 1));
    }
  }
  // On a device the host queues 5 steps between waits, as bench/gpu_vs_pytorch.py's PyTorch loop
  // does (fp16's finiteness test waits each step on both sides: PyTorch's GradScaler reads its
  // found_inf on the host).
  const int per_call = backend.device().kind == DeviceKind::kCpu ? 1 : 5;
  int step = 0;
  float loss_scale = precision == DType::kFloat16 ? 65536.0f : 1.0f;  // halved on overflow
  double host = 0;  // seconds queueing, over `steps`
  std::int64_t steps = 0;
  const double per_step =
      timeIt(
          [&] {
            for (int i = 0; i < per_call; ++i) {
              const int b = step++ % batches;
              ++steps;
              auto queued = Clock::now();
              net->trainStep(images[b], labels[b], loss_scale / static_cast<float>(batch * rows),
                             nullptr);
              host += std::chrono::duration<double>(Clock::now() - queued).count();
              // skipped, as the updater does
              if (precision == DType::kFloat16 && !backend.allFinite({net->grads()})) {
                loss_scale /= 2;
                continue;
              }
              queued = Clock::now();
              if (precision == DType::kFloat16) backend.scale(net->grads(), 1.0f / loss_scale);
              sgd->stepRange(net->weights(), net->grads(), 0, net->numParams(), 0.01f, 1);
              host += std::chrono::duration<double>(Clock::now() - queued).count();
            }
            if (!sgd->finite()) std::fprintf(stderr, "warning: the weights are not finite\n");
            backend.synchronize();
          },
          seconds,
          [&] {
            host = 0;
            steps = 0;
            backend.resetPeakMemory();  // the steps' peak, as PyTorch's after its warm-up
          }) /
      per_call;
  g_cpu_per_call /= per_call;
  g_host_per_step = host / static_cast<double>(steps);
  g_graph_stats = net->graphStats();
  if (profile) {  // a few more steps, each layer between two timed events
    net->setProfiling(true);
    for (int i = 0; i < 3; ++i)
      net->trainStep(images[i % batches], labels[i % batches],
                     loss_scale / static_cast<float>(batch * rows), nullptr);
    g_profile = net->profile();
    net->setProfiling(false);
  }
  return per_step;
}

// --profile's table: each kind's device ms a step, forward and backward, and its share of the
// step (the rest: the update, and the device idle between calls).
void printProfile(const StepProfile& p, double step_seconds) {
  if (p.steps == 0) return;
  const double steps = static_cast<double>(p.steps);
  std::vector<StepProfile::Row> rows = p.rows;
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
    return a.forward + a.backward > b.forward + b.backward;
  });
  std::printf("  profile over %lld steps (ms a step):\n", static_cast<long long>(p.steps));
  double total = 0;
  for (const auto& r : rows) {
    const double ms = (r.forward + r.backward) / steps * 1e3;
    total += ms;
    std::printf("    %-20s fwd %8.3f  bwd %8.3f  calls %5.0f  %5.1f%%\n", r.kind.c_str(),
                r.forward / steps * 1e3, r.backward / steps * 1e3,
                static_cast<double>(r.calls) / steps, 100.0 * ms / (step_seconds * 1e3));
  }
  std::printf("    %-20s %8.3f ms of the step's %.3f\n", "all timed", total, step_seconds * 1e3);
}

void opRow(const char* name, double flops, double fwd, double bwd, double fwd_cpu, double bwd_cpu) {
  std::printf("  %-26s fwd %8.1f us  bwd %8.1f us  %7.1f GFLOP/s  (cpu fwd %8.1f bwd %8.1f us)\n",
              name, fwd * 1e6, bwd * 1e6, flops > 0 ? flops / (fwd + bwd) / 1e9 : 0.0,
              fwd_cpu * 1e6, bwd_cpu * 1e6);
}

void convRow(Backend& backend, const char* name, ConvGeometry g, bool input_grad, double seconds) {
  auto op = backend.makeConv(g);
  const std::int64_t oh = g.outHeight(), ow = g.outWidth();
  Tensor x = randomTensor(backend, {g.n, g.channels, g.height, g.width}, 2);
  Tensor w = randomTensor(backend, {g.out_channels, g.channels, g.kernel, g.kernel}, 3);
  Tensor b = randomTensor(backend, {g.out_channels}, 4);
  Tensor y = backend.empty({g.n, g.out_channels, oh, ow});
  Tensor dx = input_grad ? backend.empty(x.shape()) : Tensor();
  Tensor dw = backend.empty(w.shape()), db = backend.empty(b.shape());
  const double macs = static_cast<double>(g.n * g.out_channels * oh * ow) *
                      static_cast<double>(g.channels * g.kernel * g.kernel);
  const double fwd = timeIt([&] { op->forward(x, w, b, y); }, seconds);
  const double fwd_cpu = g_cpu_per_call;
  const double bwd = timeIt([&] { op->backward(x, w, y, dx, dw, db); }, seconds);
  opRow(name, 2 * macs * (input_grad ? 3 : 2), fwd, bwd, fwd_cpu, g_cpu_per_call);
}

void fcRow(Backend& backend, const char* name, InnerProductGeometry g, bool input_grad,
           double seconds) {
  auto op = backend.makeInnerProduct(g);
  Tensor x = randomTensor(backend, {g.n, g.in}, 2), w = randomTensor(backend, {g.out, g.in}, 3);
  Tensor b = randomTensor(backend, {g.out}, 4), y = backend.empty({g.n, g.out});
  Tensor dx = input_grad ? backend.empty(x.shape()) : Tensor();
  Tensor dw = backend.empty(w.shape()), db = backend.empty(b.shape());
  const double macs = static_cast<double>(g.n * g.in * g.out);
  const double fwd = timeIt([&] { op->forward(x, w, b, y); }, seconds);
  const double fwd_cpu = g_cpu_per_call;
  const double bwd = timeIt([&] { op->backward(x, w, y, dx, dw, db); }, seconds);
  opRow(name, 2 * macs * (input_grad ? 3 : 2), fwd, bwd, fwd_cpu, g_cpu_per_call);
}

void poolRow(Backend& backend, const char* name, PoolGeometry g, double seconds) {
  auto op = backend.makePool(g);
  Tensor x = randomTensor(backend, {g.n, g.channels, g.height, g.width}, 2);
  Tensor y = backend.empty({g.n, g.channels, g.outHeight(), g.outWidth()});
  Tensor dx = backend.empty(x.shape());
  const double fwd = timeIt([&] { op->forward(x, y); }, seconds);
  const double fwd_cpu = g_cpu_per_call;
  const double bwd = timeIt([&] { op->backward(y, dx); }, seconds);
  opRow(name, 0, fwd, bwd, fwd_cpu, g_cpu_per_call);
}

// Host and device time of single ops as a ResNet-50 step calls them, in the step's type and
// layout: `calls` calls queued right after a synchronize (the host's wall time per call, the
// queue never full), then the synchronize (the device's time per call once the host is ahead).
// A step of ~160 convolution and ~110 batch-norm calls whose host time nears the step's own
// says which calls keep the GPU waiting.
void hostTimed(const char* name, Backend& backend, const std::function<void()>& fn) {
  const int calls = 64;
  for (int i = 0; i < 3; ++i)
    fn();
  backend.synchronize();
  double host = 1e30, device = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto start = Clock::now();
    for (int i = 0; i < calls; ++i)
      fn();
    const auto queued = Clock::now();
    backend.synchronize();
    const auto done = Clock::now();
    host = std::min(host, std::chrono::duration<double>(queued - start).count() / calls);
    device = std::min(device, std::chrono::duration<double>(done - start).count() / calls);
  }
  std::printf("  %-50s host %7.1f us/call  device %8.1f us/call\n", name, host * 1e6, device * 1e6);
}

Tensor randomOf(Backend& backend, const Shape& shape, DType dtype, std::uint64_t stream) {
  Tensor f = randomTensor(backend, shape, stream);
  if (dtype == DType::kFloat32) return f;
  Tensor t = backend.empty(shape, dtype);
  backend.cast(f, t);
  return t;
}

void hostOpRows(Backend& backend, std::int64_t n, DType dtype, bool channels_last) {
  std::printf("host and device time per op call, batch %lld:\n", static_cast<long long>(n));
  struct Conv {
    const char* name;
    ConvGeometry g;
  };
  const Conv convs[] = {
      {"conv 3x3 64->64 at 56x56", {n, 64, 56, 56, 64, 3, 1, 1, false, channels_last}},
      {"conv 1x1 256->64 at 56x56", {n, 256, 56, 56, 64, 1, 1, 0, false, channels_last}},
      {"conv 3x3 512->512 at 7x7", {n, 512, 7, 7, 512, 3, 1, 1, false, channels_last}},
  };
  for (const auto& [name, g] : convs) {
    auto op = backend.makeConv(g);
    Tensor x = randomOf(backend, {g.n, g.channels, g.height, g.width}, dtype, 2);
    Tensor w = randomOf(backend, {g.out_channels, g.channels, g.kernel, g.kernel}, dtype, 3);
    Tensor y = backend.empty({g.n, g.out_channels, g.outHeight(), g.outWidth()}, dtype);
    Tensor dy = randomOf(backend, y.shape(), dtype, 4);
    Tensor dx = backend.empty(x.shape(), dtype), dw = backend.empty(w.shape(), dtype);
    hostTimed((std::string(name) + " forward").c_str(), backend,
              [&] { op->forward(x, w, Tensor(), y); });
    hostTimed((std::string(name) + " backward (data, filter)").c_str(), backend,
              [&] { op->backward(x, w, dy, dx, dw, Tensor()); });
  }
  for (const bool relu : {false, true}) {
    BatchNormGeometry g{n, 256, 56 * 56, 0.1f, 1e-5f, channels_last, relu, false};
    auto op = backend.makeBatchNorm(g);
    const Shape xs{g.n, g.channels, g.spatial}, cs{g.channels};
    Tensor x = randomOf(backend, xs, dtype, 5), dy = randomOf(backend, xs, dtype, 6);
    Tensor y = backend.empty(xs, dtype), dx = backend.empty(xs, dtype);
    Tensor gamma = randomTensor(backend, cs, 7), beta = randomTensor(backend, cs, 8);
    Tensor mean = randomTensor(backend, cs, 9), var = backend.empty(cs);
    backend.fill(var, 1.0f);
    Tensor dgamma = backend.empty(cs), dbeta = backend.empty(cs);
    const std::string name = relu ? "batch norm + ReLU 256 at 56x56" : "batch norm 256 at 56x56";
    hostTimed((name + " forward").c_str(), backend,
              [&] { op->forward(x, Tensor(), gamma, beta, mean, var, y, true); });
    hostTimed((name + " backward").c_str(), backend,
              [&] { op->backward(x, y, gamma, dy, dx, Tensor(), dgamma, dbeta); });
  }
  auto relu = backend.makeRelu(n * 256 * 56 * 56);
  Tensor x = randomOf(backend, {n * 256 * 56 * 56}, dtype, 10);
  Tensor y = backend.empty(x.shape(), dtype);
  hostTimed("relu 256 at 56x56 forward", backend, [&] { relu->forward(x, y); });
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::int64_t batch = 64;
  double seconds = 3.0;
  std::string models = "lenet,mlp,resnet20";
  bool ops = true;
  std::string device = "cpu";
  CudaOptions cuda;
  DType precision = DType::kFloat32;
  std::string precision_name = "fp32";
  bool channels_last = false;
  bool fuse = true;
  bool host_ops = false;
  bool graphs = false;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--threads")
      threads = std::stoi(next());
    else if (arg == "--batch")
      batch = std::stoll(next());
    else if (arg == "--seconds")
      seconds = std::stod(next());
    else if (arg == "--models")
      models = next();
    else if (arg == "--no-ops")
      ops = false;
    else if (arg == "--device")
      device = next();
    else if (arg == "--tf32")
      cuda.tf32 = true;
    else if (arg == "--deterministic")
      cuda.deterministic = true;
    else if (arg == "--channels-last")
      channels_last = true;
    else if (arg == "--no-fuse")
      fuse = false;
    else if (arg == "--host-ops")
      host_ops = true;
    else if (arg == "--graphs")
      graphs = true;
    else if (arg == "--profile")
      profile = true;
    else if (arg == "--seq")
      g_seq = std::stoll(next());
    else if (arg == "--precision") {
      precision_name = next();
      if (precision_name == "fp16") {
        precision = DType::kFloat16;
      } else if (precision_name == "bf16") {
        precision = DType::kBFloat16;
      } else if (precision_name != "fp32") {
        std::fprintf(stderr, "--precision: fp32, fp16 or bf16, not %s\n", precision_name.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  Device on;  // cpu, or cuda:N
  if (device.rfind("cuda:", 0) == 0) {
    on = Device{DeviceKind::kCuda, std::atoi(device.c_str() + 5)};
  } else if (device != "cpu") {
    std::fprintf(stderr, "--device: cpu or cuda:N, not %s\n", device.c_str());
    return 2;
  }
  std::unique_ptr<Backend> backend;
  try {
    backend = makeBackend(on, threads, cuda);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::stringstream list(models);
  for (std::string model; std::getline(list, model, ',');) {
    double step = 0;
    try {
      step = trainStep(*backend, model, batch, seconds, precision, channels_last, fuse, graphs,
                       profile);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", model.c_str(), e.what());
      return 1;
    }
    std::printf(
        "%-9s batch=%lld threads=%d samples/s=%.0f  (%.3f ms/step, cpu %.3f ms/step, host %.3f "
        "ms/step)",
        model.c_str(), static_cast<long long>(batch), threads, batch / step, step * 1e3,
        g_cpu_per_call * 1e3, g_host_per_step * 1e3);
    if (on.kind == DeviceKind::kCuda) {
      const MemoryStats m = backend->memory();
      constexpr double kMiB = 1 << 20;
      std::printf(
          " device=%s tf32=%d precision=%s layout=%s peak_memory_mib=%.0f (net %.0f, parameters "
          "%.0f, workspace %.0f)",
          device.c_str(), cuda.tf32 ? 1 : 0, precision_name.c_str(),
          channels_last ? "nhwc" : "nchw", static_cast<double>(m.peak_in_use) / kMiB,
          static_cast<double>(g_net_memory.held) / kMiB, static_cast<double>(g_param_bytes) / kMiB,
          static_cast<double>(m.workspace) / kMiB);
    }
    std::printf(" fused_bn_relu=%d", fuse ? 1 : 0);
    if (graphs) {
      std::printf(" graphs=%lld/%lld", static_cast<long long>(g_graph_stats.replayed),
                  static_cast<long long>(g_graph_stats.captured));
      if (!g_graph_stats.off.empty()) std::printf(" (graphs off: %s)", g_graph_stats.off.c_str());
    }
    std::printf("\n");
    if (profile) printProfile(g_profile, step);
    std::fflush(stdout);
  }
  if (host_ops) hostOpRows(*backend, batch, precision, channels_last);
  if (ops) {
    const double s = seconds / 6;
    std::printf("per op, batch %lld, %d threads:\n", static_cast<long long>(batch), threads);
    convRow(*backend, "lenet conv1 1->20 5x5", {batch, 1, 28, 28, 20, 5, 1, 0, true}, false, s);
    poolRow(*backend, "lenet pool1 20x24x24", {batch, 20, 24, 24, 2, 2, 0, PoolMethod::kMax}, s);
    convRow(*backend, "lenet conv2 20->50 5x5", {batch, 20, 12, 12, 50, 5, 1, 0, true}, true, s);
    poolRow(*backend, "lenet pool2 50x8x8", {batch, 50, 8, 8, 2, 2, 0, PoolMethod::kMax}, s);
    fcRow(*backend, "lenet ip1 800->500", {batch, 800, 500}, true, s);
    fcRow(*backend, "lenet ip2 500->10", {batch, 500, 10}, true, s);
    fcRow(*backend, "mlp fc1 784->256", {batch, 784, 256}, false, s);
    fcRow(*backend, "mlp fc2 256->128", {batch, 256, 128}, true, s);
    convRow(*backend, "resnet conv 16->16 3x3", {batch, 16, 28, 28, 16, 3, 1, 1, false}, true, s);
    convRow(*backend, "resnet conv 64->64 3x3", {batch, 64, 7, 7, 64, 3, 1, 1, false}, true, s);
  }
  return 0;
}
