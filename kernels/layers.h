// Layers (private to kernels/): backend-independent pieces of a Net, each holding the ops it runs.
// A layer reads and writes blobs (activations) through a LayerContext that the net provides.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/flat_params.h"
#include "kernels/ops.h"
#include "kernels/tensor.h"

namespace troupe::kernels {

class LayerContext {
 public:
  virtual ~LayerContext() = default;
  virtual Backend& backend() = 0;
  // Activation of blob b for the current batch, [n, per-sample shape...].
  virtual Tensor data(int blob) = 0;
  // Where to write d(loss)/d(blob b); a tensor without memory when b needs no gradient.
  virtual Tensor diff(int blob) = 0;
  // The same for an op that can add to it (ConvOp::addsToDx): `add` says whether another layer's
  // backward wrote that gradient first, so that the op adds to it rather than writes over it.
  virtual Tensor diffToAddTo(int blob, bool& add) = 0;
  virtual Tensor labels() = 0;
  virtual Tensor metrics() = 0;
  virtual std::uint64_t dropoutSeed(int layer) = 0;
  // Whether images are channels-last (NHWC) in memory (NetOptions::channels_last).
  virtual bool channelsLast() = 0;
};

class Layer {
 public:
  virtual ~Layer() = default;
  // The parameters' and buffers' views into the flat tensors, once those exist (gradients
  // without memory in a net that runs no backward: FlatParams::slice).
  virtual void bind(const FlatParams& weights, const FlatParams& grads, const Tensor& buffers) = 0;
  virtual void forward(LayerContext& ctx, std::int64_t n, bool train) = 0;
  // Writes ctx.diff() of every bottom and the layer's parameter gradients.
  virtual void backward(LayerContext& ctx, std::int64_t n, float grad_scale) = 0;
  // Whether the layer computes from a copy of its parameters in the net's precision and layout (a
  // convolution, an inner product), rather than from the float32 parameters (batch norm).
  virtual bool reducedParams() const { return false; }
  // Whether the layer may write its output over its input (a ReLU: its backward reads its output,
  // never its input), which the net then does where no other layer reads that input.
  virtual bool inPlace() const { return false; }
  // What the layer computes, for a profile of a step by kind (Net::setProfiling): "conv",
  // "bn+relu", "pool", ...
  virtual const char* kind() const = 0;
  // Floating-point operations of one sample's forward in the layer's products (convolution,
  // inner product, LSTM, attention: twice their multiply-adds); 0 for the rest, whose element-wise
  // work model FLOPs utilisation leaves out by convention (PaLM's, nanoGPT's and llm.c's MFU).
  virtual double forwardFlops() const { return 0; }
  virtual bool isRelu() const { return false; }
  virtual bool isAdd() const { return false; }
  // Whether the backward reads the activations of bottoms[0], and of top: the net keeps those
  // until then, and reuses the memory of the others once the forward is past them
  // (kernels/net.cc, planMemory). A layer that does not say reads both.
  virtual bool backwardReadsBottom() const { return true; }
  virtual bool backwardReadsTop() const { return true; }
  // Computes, in its own pass, the ReLU that alone reads its output, writing that ReLU's output
  // blob `relu_top` as its top (a batch norm: BatchNormGeometry::relu); false where it cannot.
  virtual bool takeRelu(int /*relu_top*/) { return false; }
  // The same for an add of its output and blob `z` (a new bottom) with the ReLU after it
  // (BatchNormGeometry::add).
  virtual bool takeAddRelu(int /*z*/, int /*relu_top*/) { return false; }
  // Another layer (a tied output layer) reads this layer's first parameter tensor as its weights
  // and writes its gradient first, in its backward: this layer's backward then adds to it. False
  // where the layer cannot (only a token embedding can, once).
  virtual bool tie() { return false; }
  // The range of the flat parameters that a tied layer reads as its weights (another layer's);
  // empty (0, 0) for every other layer.
  virtual std::pair<std::int64_t, std::int64_t> tiedWeights() const { return {0, 0}; }
  // Writes that copy ([param_begin, param_end) of `copy`) from the float32 parameters, and widens
  // the gradients of the copy into the float32 gradients: a cast, and for a channels-last
  // convolution's filter a transpose to cuDNN's KRSC and back.
  virtual void copyParams(Backend& backend, const FlatParams& weights, const FlatParams& copy,
                          bool channels_last);
  virtual void widenGrads(Backend& backend, const FlatParams& copy_grads, const FlatParams& grads,
                          bool channels_last);

  std::vector<int> bottoms;
  int top = -1;
  int computed_by = -1;  // the layer that took it (takeRelu, takeAddRelu): the net skips it
  std::int64_t param_begin = 0, param_end = 0;    // in the flat weights
  std::int64_t buffer_begin = 0, buffer_end = 0;  // in the flat buffers
};

// Per-sample shapes exclude the batch dimension: {C, H, W} or {features}.
std::unique_ptr<Layer> makeConvLayer(const Shape& in, std::int64_t out_channels,
                                     std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                                     bool bias);
std::unique_ptr<Layer> makePoolLayer(const Shape& in, std::int64_t kernel, std::int64_t stride,
                                     std::int64_t pad, PoolMethod method, bool ceil_mode = true);
// rows: vectors of `in` a sample holds, each mapped apart (a sequence's tokens). tied >= 0: the
// weights are another layer's, at that offset of the flat parameters, and there is no bias.
std::unique_ptr<Layer> makeInnerProductLayer(std::int64_t in, std::int64_t out,
                                             std::int64_t rows = 1, std::int64_t tied = -1);
std::unique_ptr<Layer> makeReluLayer(std::int64_t per_sample);
std::unique_ptr<Layer> makeBatchNormLayer(const Shape& in);
std::unique_ptr<Layer> makeDropoutLayer(std::int64_t per_sample, float ratio);
std::unique_ptr<Layer> makeAddLayer(std::int64_t per_sample);
std::unique_ptr<Layer> makeGlobalAvgPoolLayer(const Shape& in);
// rows: predictions a sample holds, each with its own label (a sequence's next tokens).
std::unique_ptr<Layer> makeSoftmaxLossLayer(std::int64_t classes, float label_smoothing = 0.0f,
                                            std::int64_t rows = 1);
// Sequences of t tokens, each a row of `channels`; without `positions`, no position embedding.
std::unique_ptr<Layer> makeEmbeddingLayer(std::int64_t t, std::int64_t vocab, std::int64_t channels,
                                          bool positions = true);
std::unique_ptr<Layer> makeLayerNormLayer(std::int64_t rows, std::int64_t channels);
std::unique_ptr<Layer> makeGeluLayer(std::int64_t per_sample);
std::unique_ptr<Layer> makeAttentionLayer(std::int64_t t, std::int64_t channels,
                                          std::int64_t heads);
std::unique_ptr<Layer> makeLstmLayer(std::int64_t t, std::int64_t input, std::int64_t hidden);

}  // namespace troupe::kernels
