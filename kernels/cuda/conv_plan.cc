// cuDNN graph-API convolution plans (conv_plan.h).
#include "kernels/cuda/conv_plan.h"

#include <algorithm>
#include <array>
#include <vector>

#include "kernels/cuda/cuda_util.h"

namespace troupe::kernels::cuda {

namespace {

constexpr std::int64_t kX = 'x', kW = 'w', kY = 'y';  // the tensors' unique ids

// A backend descriptor, destroyed with its owner.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptorType_t type) {
    TROUPE_CUDA_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(Desc&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  Desc& operator=(Desc&& o) noexcept {
    std::swap(d_, o.d_);
    return *this;
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* address() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// What a step of building says when cuDNN does not take it (a status in the BAD_PARAM or
// NOT_SUPPORTED families): thrown as a Refusal, so that this engine, or the whole plan, is left
// to the legacy calls; any other status (an execution failure, memory, an internal error) is an
// error.
struct Refusal {
  std::string what;
};
void take(cudnnStatus_t status, const char* step) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const int code = static_cast<int>(status);
  // Broader than cuda_backend.cc's isRefusal on purpose: here another engine may take what one
  // engine refuses (an architecture or a shape it was not built for).
  if (code >= 2000 && code < 4000) {
    (void)cudaGetLastError();  // a refused launch is not the next kernel's error
    throw Refusal{std::string(step) + ": " + cudnnGetErrorString(status)};
  }
  check(status, step, __FILE__, __LINE__);
}
template <typename T>
void set(const Desc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
         std::int64_t count, const T* values, const char* step) {
  take(cudnnBackendSetAttribute(d.get(), name, type, count, values), step);
}

// The handle attributes are deprecated in cuDNN 9.19's headers (for device-property
// descriptors, since 9.8), and still taken; the handle is what a plan runs with.
void setHandle(const Desc& d, bool plan, cudnnHandle_t handle) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  const auto name = plan ? CUDNN_ATTR_EXECUTION_PLAN_HANDLE : CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
#pragma GCC diagnostic pop
  set(d, name, CUDNN_TYPE_HANDLE, 1, &handle, "the handle");
}

Desc tensor(std::int64_t id, std::array<std::int64_t, 4> dims, bool nhwc, cudnnDataType_t type,
            std::int64_t alignment) {
  const auto [n, c, h, w] = dims;
  (void)n;
  const std::array<std::int64_t, 4> strides =
      nhwc ? std::array<std::int64_t, 4>{h * w * c, 1, w * c, c}
           : std::array<std::int64_t, 4>{c * h * w, h * w, w, 1};
  Desc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "a tensor's type");
  set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "a tensor's shape");
  set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "a tensor's strides");
  set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, "a tensor's id");
  set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "a tensor's alignment");
  take(cudnnBackendFinalize(d.get()), "a tensor");
  return d;
}

// An engine config's engine: its global index (the same engine from both heuristics' modes) and
// whether it has any of `numerical` notes or `behavior` notes.
struct Engine {
  std::int64_t index = -1;
  bool excluded = false;
};
Engine engineOf(const Desc& config, const std::vector<cudnnBackendNumericalNote_t>& numerical,
                const std::vector<cudnnBackendBehaviorNote_t>& behavior) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  std::int64_t count = 0;
  take(cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, engine.address()),
       "an engine");
  Engine out;
  take(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                                &count, &out.index),
       "an engine's index");
  std::array<cudnnBackendNumericalNote_t, CUDNN_NUMERICAL_NOTE_TYPE_COUNT> notes{};
  take(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                CUDNN_TYPE_NUMERICAL_NOTE, notes.size(), &count, notes.data()),
       "an engine's numerical notes");
  count = std::min<std::int64_t>(count, static_cast<std::int64_t>(notes.size()));
  for (std::int64_t i = 0; i < count; ++i) {
    if (std::find(numerical.begin(), numerical.end(), notes[i]) != numerical.end())
      out.excluded = true;
  }
  std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> behaviors{};
  take(cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE,
                                CUDNN_TYPE_BEHAVIOR_NOTE, behaviors.size(), &count,
                                behaviors.data()),
       "an engine's behaviour notes");
  count = std::min<std::int64_t>(count, static_cast<std::int64_t>(behaviors.size()));
  for (std::int64_t i = 0; i < count; ++i) {
    if (std::find(behavior.begin(), behavior.end(), behaviors[i]) != behavior.end())
      out.excluded = true;
  }
  return out;
}

// Sets a descriptor-valued attribute to one descriptor.
void setDesc(const Desc& d, cudnnBackendAttributeName_t name, const Desc& value, const char* step) {
  cudnnBackendDescriptor_t v = value.get();
  set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, step);
}

// The engine configs cuDNN's heuristics in `mode` offer for the graph, best first.
std::vector<Desc> configs(const Desc& graph, cudnnBackendHeurMode_t mode) {
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  setDesc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "the heuristics' graph");
  set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "the heuristics' mode");
  take(cudnnBackendFinalize(heur.get()), "the heuristics");
  std::int64_t count = 0;
  take(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr),
       "the heuristics' count");
  std::vector<Desc> out;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    out.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(out.back().get());
  }
  std::int64_t got = 0;
  if (count > 0) {
    take(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()),
         "the heuristics' results");
  }
  out.resize(static_cast<std::size_t>(std::min(got, count)));
  return out;
}

// A variant pack of one call: the three tensors' pointers and the workspace.
Desc variantPack(const void* x, const void* w, const void* y, void* workspace) {
  const std::array<std::int64_t, 3> ids{kX, kW, kY};
  const std::array<void*, 3> pointers{const_cast<void*>(x), const_cast<void*>(w),
                                      const_cast<void*>(y)};
  Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  TROUPE_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                             CUDNN_TYPE_INT64, 3, ids.data()));
  TROUPE_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                             CUDNN_TYPE_VOID_PTR, 3, pointers.data()));
  TROUPE_CUDA_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                             CUDNN_TYPE_VOID_PTR, 1, &workspace));
  TROUPE_CUDA_CHECK(cudnnBackendFinalize(pack.get()));
  return pack;
}

// The convolution of spec's geometry, cross-correlating and accumulating in float.
Desc convolution(const ConvPlanSpec& s) {
  Desc conv(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;  // float16 and bfloat16 accumulate in float
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const std::int64_t dims = 2;
  const std::array<std::int64_t, 2> one{1, 1}, stride{s.geometry.stride, s.geometry.stride},
      pad{s.geometry.pad, s.geometry.pad};
  set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "compute");
  set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "mode");
  set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims, "dims");
  set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, one.data(), "dilations");
  set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride.data(), "strides");
  set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad.data(), "padding");
  set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad.data(), "padding");
  take(cudnnBackendFinalize(conv.get()), "the convolution");
  return conv;
}

// Each direction's operation and the attributes that name its tensors (x, w, y: dx, dw, dy where
// written), its convolution, alpha and beta.
struct OperationNames {
  cudnnBackendDescriptorType_t type;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
OperationNames operationNames(ConvPlanSpec::Kind kind) {
  using Kind = ConvPlanSpec::Kind;
  if (kind == Kind::kForward) {
    return {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  }
  if (kind == Kind::kBackwardData) {
    return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
            CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  }
  return {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
          CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
}

// spec's direction of the convolution over x, w and y, as an operation: out = conv + beta * out.
Desc operation(const ConvPlanSpec& s, const Desc& x, const Desc& w, const Desc& y,
               const Desc& conv) {
  const OperationNames names = operationNames(s.kind);
  const float alpha = 1.0f, beta = s.beta;
  Desc op(names.type);
  setDesc(op, names.x, x, "x");
  setDesc(op, names.w, w, "w");
  setDesc(op, names.y, y, "y");
  setDesc(op, names.conv, conv, "the convolution");
  set(op, names.alpha, CUDNN_TYPE_FLOAT, 1, &alpha, "alpha");
  set(op, names.beta, CUDNN_TYPE_FLOAT, 1, &beta, "beta");
  take(cudnnBackendFinalize(op.get()), "the operation");
  return op;
}

// The graph of the one operation, run with handle.
Desc operationGraph(const Desc& op, cudnnHandle_t handle) {
  Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  setDesc(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, op, "the graph's operation");
  setHandle(graph, /*plan=*/false, handle);
  take(cudnnBackendFinalize(graph.get()), "the operation graph");
  return graph;
}

// The notes that exclude an engine from running this call: none that converts its inputs down
// (as PyTorch), float32 without TF32 off tensor cores (as the legacy path's FMA math), no
// reduction in float16 or bfloat16 (the legacy calls accumulate in float), none that compiles at
// run time (seconds each), and with `deterministic` none that cuDNN notes as nondeterministic.
struct ExcludedNotes {
  std::vector<cudnnBackendNumericalNote_t> numerical;
  std::vector<cudnnBackendBehaviorNote_t> behavior;
};
ExcludedNotes excludedNotes(const ConvPlanSpec& s) {
  ExcludedNotes out;
  out.numerical = {CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION,
                   CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS};
  if (s.data == CUDNN_DATA_FLOAT && !s.tf32)
    out.numerical.push_back(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
  if (s.deterministic) out.numerical.push_back(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
  out.behavior = {CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION};
  return out;
}

// What became of the heuristics' configs while the fastest plan was sought, for the refusal's
// message: the engines tried (global indices), the configs passed over, and the last refusal.
struct Tally {
  std::vector<std::int64_t> tried;
  int repeated = 0, excluded = 0, refused = 0, too_large = 0;
  std::string last = "no engine";

  std::string refusal(std::size_t configs) const {
    return "no engine ran it: of " + std::to_string(configs) + " configs from the heuristics, " +
           std::to_string(repeated) + " repeated, " + std::to_string(excluded) +
           " excluded by their notes, " + std::to_string(too_large) +
           " over the workspace limit, " + std::to_string(refused) + " refused (the last: " + last +
           ")";
  }
};

// The engine configs both of cuDNN's heuristics' modes offer for the graph, mode A's first; a
// mode that refuses leaves its refusal in tally->last, as the other's engines may still take it.
std::vector<Desc> heuristicConfigs(const Desc& graph, Tally* tally) {
  std::vector<Desc> out;
  for (auto mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    try {
      for (auto& config : configs(graph, mode))
        out.push_back(std::move(config));
    } catch (const Refusal& r) {
      tally->last = r.what;
    }
  }
  return out;
}

// The finalized plan of config, and its workspace in *bytes; an empty Desc (counted in tally)
// when its engine was tried already, has an excluded note, or needs more than max_workspace.
Desc candidatePlan(const Desc& config, const ExcludedNotes& notes, cudnnHandle_t handle,
                   std::size_t max_workspace, Tally* tally, std::size_t* bytes) {
  const Engine engine = engineOf(config, notes.numerical, notes.behavior);
  if (std::find(tally->tried.begin(), tally->tried.end(), engine.index) != tally->tried.end()) {
    ++tally->repeated;
    return Desc();
  }
  tally->tried.push_back(engine.index);
  if (engine.excluded) {
    ++tally->excluded;
    return Desc();
  }
  Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  setHandle(plan, /*plan=*/true, handle);
  setDesc(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config, "the plan's engine");
  take(cudnnBackendFinalize(plan.get()), "a plan");
  std::int64_t workspace = 0, count = 0;
  take(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                CUDNN_TYPE_INT64, 1, &count, &workspace),
       "a plan's workspace");
  if (workspace < 0 || static_cast<std::size_t>(workspace) > max_workspace) {
    ++tally->too_large;
    return Desc();
  }
  *bytes = static_cast<std::size_t>(workspace);
  return plan;
}

// Two events that time the trials, destroyed with their owner.
struct Events {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Events() {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
  }
};

// Milliseconds one call of plan takes on stream, between the two events.
float timeRun(cudnnHandle_t handle, cudaStream_t stream, const Events& events, const Desc& plan,
              const Desc& pack) {
  TROUPE_CUDA_CHECK(cudaEventRecord(events.start, stream));
  take(cudnnBackendExecute(handle, plan.get(), pack.get()), "a plan's trial");
  TROUPE_CUDA_CHECK(cudaEventRecord(events.stop, stream));
  TROUPE_CUDA_CHECK(cudaEventSynchronize(events.stop));
  float ms = 0;
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
  return ms;
}

// A candidate's time a call: the least of its first call and kRuns more. A candidate whose first
// call already took more than kHopeless x the best time so far plus kLoadMs is given up after
// it (that time returned): it cannot win, and each call of a slow engine costs the more, the
// bigger the batch. (ResNet-50 in fp16 on an H200, with 4 calls of each of 8 candidates a plan:
// the first epoch ran 10, 21 and 49 s longer than the second at batch 64, 128 and 256.)
// kLoadMs covers what a first call may pay once (loading the engine's kernels), so that a fast
// engine is not given up for it on a small convolution, whose trials cost little anyway.
float timeCandidate(cudnnHandle_t handle, cudaStream_t stream, const Events& events,
                    const Desc& plan, const Desc& pack, float best) {
  constexpr int kRuns = 2;
  constexpr float kHopeless = 2.0f, kLoadMs = 1.0f;
  const float first = timeRun(handle, stream, events, plan, pack);
  if (best > 0 && first > kHopeless * best + kLoadMs) return first;
  float least = first;
  for (int i = 0; i < kRuns; ++i)
    least = std::min(least, timeRun(handle, stream, events, plan, pack));
  return least;
}

}  // namespace

// Everything a plan was built from, kept while it lives.
struct ConvPlan::Descriptors {
  Desc x, w, y, conv, op, graph;
  std::vector<Desc> configs;
  Desc plan;
};

ConvPlan::~ConvPlan() = default;

std::unique_ptr<ConvPlan> ConvPlan::build(cudnnHandle_t handle, cudaStream_t stream,
                                          const ConvPlanSpec& s, std::size_t max_workspace, void* x,
                                          void* w, void* y,
                                          const std::function<void*(std::size_t)>& workspace,
                                          std::string* refused) {
  std::unique_ptr<ConvPlan> out(new ConvPlan);
  out->alignment_ = s.alignment;
  out->d_ = std::make_unique<Descriptors>();
  Descriptors& d = *out->d_;
  try {
    const ConvGeometry& g = s.geometry;
    const bool nhwc = g.channels_last;
    d.x = tensor(kX, {g.n, g.channels, g.height, g.width}, nhwc, s.data, s.alignment);
    d.w = tensor(kW, {g.out_channels, g.channels, g.kernel, g.kernel}, nhwc, s.data, s.alignment);
    d.y = tensor(kY, {g.n, g.out_channels, g.outHeight(), g.outWidth()}, nhwc, s.data, s.alignment);
    d.conv = convolution(s);
    d.op = operation(s, d.x, d.w, d.y, d.conv);
    d.graph = operationGraph(d.op, handle);
    const ExcludedNotes notes = excludedNotes(s);
    Tally tally;
    d.configs = heuristicConfigs(d.graph, &tally);
    // The first kCandidates plans that cuDNN finalizes, timed; of those within kSameSpeed of the
    // fastest, the one with the least workspace kept: the workspace is held all through a step,
    // so it adds to the peak of a net's memory (ResNet-50 in fp16 on an H200: 982 MiB of its
    // peak at batch 256).
    constexpr int kCandidates = 8;
    constexpr float kSameSpeed = 1.02f;
    struct Timed {
      float ms;
      std::size_t bytes;
      Desc plan;
    };
    std::vector<Timed> timed;
    Events events;
    TROUPE_CUDA_CHECK(cudaEventCreate(&events.start));
    TROUPE_CUDA_CHECK(cudaEventCreate(&events.stop));
    float fastest = 0;
    for (const Desc& config : d.configs) {
      if (timed.size() == kCandidates) break;
      try {
        std::size_t bytes = 0;
        Desc plan = candidatePlan(config, notes, handle, max_workspace, &tally, &bytes);
        if (!plan.get()) continue;
        Desc pack = variantPack(x, w, y, workspace(bytes));
        const float ms = timeCandidate(handle, stream, events, plan, pack, fastest);
        fastest = timed.empty() ? ms : std::min(fastest, ms);
        timed.push_back({ms, bytes, std::move(plan)});
      } catch (const Refusal& r) {
        ++tally.refused;
        tally.last = r.what;  // this engine only: the next may take the call
      }
    }
    Timed* kept = nullptr;
    for (Timed& t : timed) {
      if (t.ms > fastest * kSameSpeed) continue;
      if (!kept || t.bytes < kept->bytes || (t.bytes == kept->bytes && t.ms < kept->ms)) kept = &t;
    }
    if (kept) {
      d.plan = std::move(kept->plan);
      out->workspace_ = kept->bytes;
    }
    if (!d.plan.get()) throw Refusal{tally.refusal(d.configs.size())};
  } catch (const Refusal& r) {
    if (refused) *refused = r.what;
    return nullptr;
  }
  return out;
}

void ConvPlan::run(cudnnHandle_t handle, const void* x, const void* w, const void* y,
                   void* workspace) const {
  Desc pack = variantPack(x, w, y, workspace);
  TROUPE_CUDA_CHECK(cudnnBackendExecute(handle, d_->plan.get(), pack.get()));
}

}  // namespace troupe::kernels::cuda
