// troupe's own CUDA kernels, where no library does the job: element-wise ops, the fused SGD update,
// Caffe's pooling rules, global average pooling, dropout with the CPU's mask, softmax loss with a
// bad-label report. Each launcher queues its kernel on `stream` and returns; sizes are element
// counts. The semantics are the CPU ops' (kernels/ops.h, kernels/cpu/), so that the two backends
// agree within rounding. Launchers over activations take their element type (`t`: float32,
// float16 or bfloat16) and compute in float, rounding once on the store; other arguments are
// float32 (a dropout mask, a softmax's probabilities, the SGD update's weights).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/optimizers/rule.h"
#include "kernels/tensor.h"

namespace troupe::kernels::cuda {

void fill(DType t, void* p, std::int64_t n, float value, cudaStream_t stream);
void axpy(DType t, float alpha, const void* x, void* y, std::int64_t n, cudaStream_t stream);
void scale(DType t, void* p, float alpha, std::int64_t n, cudaStream_t stream);
// out = in converted, rounding to nearest even.
void cast(DType from, const void* in, DType to, void* out, std::int64_t n, cudaStream_t stream);
// out[b][j][i] = in[b][i][j] converted (Backend::transpose).
void transpose(DType from, const void* in, DType to, void* out, std::int64_t batches,
               std::int64_t rows, std::int64_t cols, cudaStream_t stream);
// *bad (device) becomes 1 if an element is inf or NaN, and is left alone otherwise.
void nonFinite(const float* p, std::int64_t n, int* bad, cudaStream_t stream);
// Backend::normalise over `planes` planes of `plane` bytes, plane p of channel p % channels; each
// channel's mean and scale by value (one for all when count is 1).
struct ChannelValues {
  float mean[16], scale[16];
  int means = 1, scales = 1;
};
void normalise(const std::uint8_t* in, float* out, std::int64_t planes, std::int64_t channels,
               std::int64_t plane, const ChannelValues& values, cudaStream_t stream);
// PyTorch's SGD as kernels/backend.h states it; *bad (device) becomes 1 if an updated weight is
// not finite, and is left alone otherwise.
void sgd(float* w, const float* g, float* v, std::int64_t n, float lr, float momentum,
         float weight_decay, bool nesterov, int* bad, cudaStream_t stream);
// The same with no weight decay on elements [no_decay[k].first, .second) (sorted, disjoint,
// within [0, n)): one launch for every kMaxRanges of them.
struct DecayRanges {
  static constexpr int kMaxRanges = 64;
  int count = 0;
  std::int64_t begin[kMaxRanges], end[kMaxRanges];
};
void sgdExcept(float* w, const float* g, float* v, std::int64_t n, float lr, float momentum,
               float weight_decay, bool nesterov,
               const std::vector<std::pair<std::int64_t, std::int64_t>>& no_decay, int* bad,
               cudaStream_t stream);

// An optimizer rule's update (kernels/optimizers/rule.h, Backend::update) over `chunks` (device
// memory, one block each, in order): chunk k is elements [begin, end) of w, g and the state, with
// weight decay where `decay`, in trust-ratio segment `segment` (-1: none). A layerwise rule's
// segment s spans chunks [segments[2s], segments[2s + 1]); its sums go through `partials` (2 per
// chunk) to `ratios` (one per segment), in a fixed order. Returns false, queueing nothing, when no
// rule of that name is compiled into kernels/cuda/update_kernels.cu.
struct UpdateChunk {
  std::int64_t begin = 0, end = 0;
  int segment = -1;
  int decay = 1;
};
struct RuleLaunch {
  float* w;
  const float* g;
  float* state;  // element i's state k at state[i + k * stride]
  std::int64_t stride;
  UpdateScalars scalars;
  const UpdateChunk* chunks;
  int num_chunks;
  const std::int64_t* segments;
  int num_segments;
  double* partials;
  float* ratios;
  int* bad;  // becomes 1 if an updated weight is not finite
};
bool ruleUpdate(const char* name, const RuleLaunch& launch, cudaStream_t stream);
// partials[b] (device, kSquareBlocks of them) = the sum of p[i]^2 over block b's elements of p,
// in a fixed order.
constexpr int kSquareBlocks = 264;
void sumSquares(const float* p, std::int64_t n, double* partials, cudaStream_t stream);

void reluForward(DType t, const void* x, void* y, std::int64_t n, cudaStream_t stream);
void reluBackward(DType t, const void* y, const void* dy, void* dx, std::int64_t n,
                  cudaStream_t stream);
// mask[i] = 0 with probability ratio (randomBits(seed, 0, i), kernels/random.h), else 1/(1-ratio).
void dropoutForward(DType t, const void* x, void* y, float* mask, std::int64_t n, float ratio,
                    std::uint64_t seed, cudaStream_t stream);
// y = a * b with b float32 (a dropout mask).
void multiply(DType t, const void* a, const float* b, void* y, std::int64_t n, cudaStream_t stream);
void add(DType t, const void* a, const void* b, void* y, std::int64_t n, cudaStream_t stream);
// y = max(a + b, 0), rounded once (a batch norm's residual add and ReLU in one pass); NaN passes.
void addRelu(DType t, const void* a, const void* b, void* y, std::int64_t n, cudaStream_t stream);

// y[p] = mean of x's plane p (planes of `spatial` values); the backward spreads dy[p] / spatial.
// channels_last > 0: x is [n, spatial, channels_last] in memory (plane p = n * C + c).
void globalAvgPoolForward(DType t, const void* x, void* y, std::int64_t planes,
                          std::int64_t spatial, std::int64_t channels_last, cudaStream_t stream);
void globalAvgPoolBackward(DType t, const void* dy, void* dx, std::int64_t planes,
                           std::int64_t spatial, std::int64_t channels_last, cudaStream_t stream);

// Caffe's pooling over planes of h x w into oh x ow (kernels/ops.h, PoolGeometry); max pooling
// records each window's arg max (within its plane) for the backward. channels_last > 0: x and y
// are NHWC in memory with that many channels (planes = n * channels).
struct PoolShape {
  std::int64_t planes, h, w, oh, ow, kernel, stride, pad;
  bool max;
  std::int64_t channels_last;
};
void poolForward(DType t, const PoolShape& s, const void* x, void* y, std::int32_t* argmax,
                 cudaStream_t stream);
void poolBackward(DType t, const PoolShape& s, const void* dy, const std::int32_t* argmax, void* dx,
                  cudaStream_t stream);

// Softmax cross-entropy over n rows of `classes` logits: prob (n x classes) keeps the softmax,
// metrics[0] the summed loss, metrics[1] the rows whose arg max is the label, summed in a fixed
// order (the same bits every run). A label outside [0, classes) leaves its row out and writes
// bad[0] = the first such row + 1, bad[1] = its label; else bad[0] = 0. rows: 4n words of scratch.
// The logits are of type t; prob and metrics float32. With label smoothing s the target is
// (1 - s) onehot(label) + s / classes (SoftmaxLossOp).
void softmaxLossForward(DType t, const void* logits, const std::int32_t* labels, float* prob,
                        float* metrics, int* bad, void* rows, std::int64_t n, std::int64_t classes,
                        float smoothing, cudaStream_t stream);
// dlogits = scale * (prob - target); rows with a bad label get zeros.
void softmaxLossBackward(DType t, const float* prob, const std::int32_t* labels, void* dlogits,
                         std::int64_t n, std::int64_t classes, float scale, float smoothing,
                         cudaStream_t stream);

// y[i, j] += b[j] over rows of `cols` (a bias); db[j] = sum over rows of dy[i, j].
void addRowVector(DType t, void* y, const void* b, std::int64_t rows, std::int64_t cols,
                  cudaStream_t stream);
void sumRows(DType t, const void* dy, void* db, std::int64_t rows, std::int64_t cols,
             cudaStream_t stream);
// A convolution's bias, all of type t: y[n, c, ...] += b[c] over n images of `channels` planes of
// `spatial` elements, NCHW or (channels_last) NHWC; db[c] = the sum of dy[n, c, ...] over n and
// the plane, in a fixed order.
void channelBias(DType t, void* y, const void* b, std::int64_t n, std::int64_t channels,
                 std::int64_t spatial, bool channels_last, cudaStream_t stream);
void channelBiasGradient(DType t, const void* dy, void* db, std::int64_t n, std::int64_t channels,
                         std::int64_t spatial, bool channels_last, cudaStream_t stream);

// Batch norm training in troupe's own kernels (CudaBatchNorm's troupe way), NCHW or channels-last
// (n images of `channels` planes of `spatial`), of type t, with float32 parameters and statistics:
// the CPU op's arithmetic (kernels/cpu/batch_norm_op.cc), a channel's sums in double, and with
// relu (and add) y = max(BN(x) (+ z), 0) in the same pass, whose backward masks dy where that y >
// 0 (recomputed from x without add; read from y with add).
struct BatchNormShape {
  std::int64_t n = 0, channels = 0, spatial = 0;
  bool channels_last = false, relu = false, add = false;
  float momentum = 0.1f, eps = 1e-5f;
};
// Doubles of scratch (`partial`) that either call takes for this shape.
std::int64_t batchNormScratch(const BatchNormShape& s);
// mean, invstd: the batch's, saved for the backward; coef: 2 floats a channel for the backward's
// mask; the running statistics updated as the CPU op does.
void batchNormForward(DType t, const BatchNormShape& s, const void* x, const void* z,
                      const float* gamma, const float* beta, float* running_mean,
                      float* running_var, float* mean, float* invstd, float* coef, void* y,
                      double* partial, cudaStream_t stream);
// dx, dz (with add), dgamma, dbeta: each may be null (not wanted). back: 3 floats a channel.
void batchNormBackward(DType t, const BatchNormShape& s, const void* x, const void* y,
                       const void* dy, const float* gamma, const float* coef, const float* mean,
                       const float* invstd, void* dx, void* dz, float* dgamma, float* dbeta,
                       double* partial, float* back, cudaStream_t stream);

// After each launch above: throws a troupe error naming the kernel if its launch failed
// (cudaGetLastError), rather than leaving the error to a later call that does not say whose it is.
// Defined in cuda_backend.cc, where troupe's errors are.
void checkLaunch(const char* kernel, const char* file, int line);

}  // namespace troupe::kernels::cuda
