// troupe's own CUDA kernels, where no library does the job: element-wise ops, the fused SGD update,
// Caffe's pooling rules, global average pooling, dropout with the CPU's mask, softmax loss with a
// bad-label report. Each launcher queues its kernel on `stream` and returns; sizes are element
// counts. The semantics are the CPU ops' (kernels/ops.h, kernels/cpu/), so that the two backends
// agree within rounding.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace troupe::kernels::cuda {

void fill(float* p, std::int64_t n, float value, cudaStream_t stream);
void axpy(float alpha, const float* x, float* y, std::int64_t n, cudaStream_t stream);
void scale(float* p, float alpha, std::int64_t n, cudaStream_t stream);
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

void reluForward(const float* x, float* y, std::int64_t n, cudaStream_t stream);
void reluBackward(const float* y, const float* dy, float* dx, std::int64_t n, cudaStream_t stream);
// mask[i] = 0 with probability ratio (randomBits(seed, 0, i), kernels/random.h), else 1/(1-ratio).
void dropoutForward(const float* x, float* y, float* mask, std::int64_t n, float ratio,
                    std::uint64_t seed, cudaStream_t stream);
void multiply(const float* a, const float* b, float* y, std::int64_t n, cudaStream_t stream);
void add(const float* a, const float* b, float* y, std::int64_t n, cudaStream_t stream);

// y[p] = mean of x's plane p (planes of `spatial` values); the backward spreads dy[p] / spatial.
void globalAvgPoolForward(const float* x, float* y, std::int64_t planes, std::int64_t spatial,
                          cudaStream_t stream);
void globalAvgPoolBackward(const float* dy, float* dx, std::int64_t planes, std::int64_t spatial,
                           cudaStream_t stream);

// Caffe's pooling over planes of h x w into oh x ow (kernels/ops.h, PoolGeometry); max pooling
// records each window's arg max (within its plane) for the backward.
struct PoolShape {
  std::int64_t planes, h, w, oh, ow, kernel, stride, pad;
  bool max;
};
void poolForward(const PoolShape& s, const float* x, float* y, std::int32_t* argmax,
                 cudaStream_t stream);
void poolBackward(const PoolShape& s, const float* dy, const std::int32_t* argmax, float* dx,
                  cudaStream_t stream);

// Softmax cross-entropy over n rows of `classes` logits: prob (n x classes) keeps the softmax,
// metrics[0] the summed loss, metrics[1] the rows whose arg max is the label, summed in a fixed
// order (the same bits every run). A label outside [0, classes) leaves its row out and writes
// bad[0] = the first such row + 1, bad[1] = its label; else bad[0] = 0. rows: 4n words of scratch.
void softmaxLossForward(const float* logits, const std::int32_t* labels, float* prob,
                        float* metrics, int* bad, void* rows, std::int64_t n, std::int64_t classes,
                        cudaStream_t stream);
// dlogits = scale * (prob - onehot(label)); rows with a bad label get zeros.
void softmaxLossBackward(const float* prob, const std::int32_t* labels, float* dlogits,
                         std::int64_t n, std::int64_t classes, float scale, cudaStream_t stream);

// y[i, j] += b[j] over rows of `cols` (a bias); db[j] = sum over rows of dy[i, j].
void addRowVector(float* y, const float* b, std::int64_t rows, std::int64_t cols,
                  cudaStream_t stream);
void sumRows(const float* dy, float* db, std::int64_t rows, std::int64_t cols, cudaStream_t stream);

}  // namespace troupe::kernels::cuda
