// One direction of a convolution as a finished cuDNN graph-API execution plan: built, and its
// engine timed, once per geometry; each call then fills a variant pack with the call's pointers
// and runs it. cuDNN 9's legacy calls (cudnnConvolutionForward, ...) go through the same graph
// machinery on each call; a finished plan leaves that work out of the step, as PyTorch's
// cuDNN path does. The way of float16 and bfloat16 convolutions, or of all with
// TROUPE_CUDA_CONV=graph (cuda_backend.cc, where the H100's figures are).
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kernels/ops.h"

namespace troupe::kernels::cuda {

struct ConvPlanSpec {
  enum class Kind { kForward, kBackwardData, kBackwardFilter };
  Kind kind = Kind::kForward;
  // x [n, channels, height, width], w [out_channels, channels, kernel, kernel], y [n,
  // out_channels, outHeight(), outWidth()]; NHWC (and KRSC) in memory with channels_last. The
  // bias is not the plan's.
  ConvGeometry geometry;
  cudnnDataType_t data = CUDNN_DATA_FLOAT;
  bool tf32 = false;            // float32 data may run on tensor cores as TF32
  bool deterministic = false;   // no engine that cuDNN notes as nondeterministic
  float beta = 0.0f;            // out = conv + beta * out
  std::int64_t alignment = 16;  // bytes every pointer of a call is aligned to, at least
};

class ConvPlan {
 public:
  // The plan of the fastest engine among those cuDNN's heuristics offer for spec (timed on
  // scratch x, w and y of its shapes, on stream, with at most max_workspace bytes from
  // `workspace`), or null with why in *refused when the graph API takes none.
  static std::unique_ptr<ConvPlan> build(cudnnHandle_t handle, cudaStream_t stream,
                                         const ConvPlanSpec& spec, std::size_t max_workspace,
                                         void* x, void* w, void* y,
                                         const std::function<void*(std::size_t)>& workspace,
                                         std::string* refused);
  ~ConvPlan();
  ConvPlan(const ConvPlan&) = delete;
  ConvPlan& operator=(const ConvPlan&) = delete;

  std::size_t workspace() const { return workspace_; }
  std::int64_t alignment() const { return alignment_; }
  // Forward: y = conv(x, w) (+ beta y); backward data: x = conv^T(dy = y, w) (+ beta x);
  // backward filter: w = dW(x, dy = y) (+ beta w). On the handle's stream.
  void run(cudnnHandle_t handle, const void* x, const void* w, const void* y,
           void* workspace) const;

 private:
  struct Descriptors;
  ConvPlan() = default;
  std::unique_ptr<Descriptors> d_;
  std::size_t workspace_ = 0;
  std::int64_t alignment_ = 16;
};

}  // namespace troupe::kernels::cuda
