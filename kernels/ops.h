// Ops: the per-backend kernels that layers are made of, Caffe-style (`op.cc` for the CPU, `op.cu`
// later for CUDA) behind one interface each. A Backend creates them for one fixed geometry (batch
// size included); an op may keep workspace (argmax indices, batch statistics, dropout masks) from
// its forward for its backward, so an op object belongs to one layer.
//
// Tensors passed in live on the op's backend. Backward methods overwrite their outputs (never
// accumulate); an output with no memory (a default-constructed Tensor) is not wanted: skipped.
//
// Layout: an image tensor's shape is always [n, C, H, W]; its memory is NCHW, or NHWC (channels
// last, PyTorch's channels_last) for an op made with channels_last, which device backends offer
// and the CPU one refuses. A channels-last convolution's filter is [out, kernel, kernel, channels]
// in memory (cuDNN's KRSC); other parameters are per channel either way.
// Thread safety: like the backend that made it, one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor.h"

namespace troupe::kernels {

// Input [n, channels, height, width]; output [n, out_channels, outHeight(), outWidth()].
struct ConvGeometry {
  std::int64_t n = 1, channels = 1, height = 1, width = 1;
  std::int64_t out_channels = 1, kernel = 1, stride = 1, pad = 0;
  bool bias = true;
  bool channels_last = false;
  std::int64_t outHeight() const { return (height + 2 * pad - kernel) / stride + 1; }
  std::int64_t outWidth() const { return (width + 2 * pad - kernel) / stride + 1; }
};

class ConvOp {
 public:
  virtual ~ConvOp() = default;
  // w: [out_channels, channels, kernel, kernel]; b: [out_channels] (ignored unless bias).
  virtual void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) = 0;
  virtual void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                        const Tensor& dw, const Tensor& db) = 0;
  // Whether backwardAddingToDx() can add the input's gradient to what dx holds (a blob whose
  // gradient another layer's backward wrote first: a ResNet block's input) in the same pass,
  // rather than the net summing it through scratch. A device backend can (cuDNN's beta).
  virtual bool addsToDx() const { return false; }
  // backward(), with dx += the input's gradient; only where addsToDx().
  virtual void backwardAddingToDx(const Tensor& x, const Tensor& w, const Tensor& dy,
                                  const Tensor& dx, const Tensor& dw, const Tensor& db);
};

enum class PoolMethod : std::uint8_t { kMax, kAverage };

// Caffe's pooling: outHeight = ceil((height + 2 pad - kernel) / stride) + 1, dropping a last window
// that would start inside the padding; with ceil_mode false, floor instead of ceil (PyTorch's and
// Caffe2's default, which torchvision's ResNets are built with). Average pooling divides by the
// window clipped to the padded input (Caffe's rule); padding never wins a max.
// The images of Backend::normalise: n images of `channels` planes of `plane` values. Checked by
// normaliseShape (InvariantError on a mismatch of shape, dtype, or mean and scale).
struct NormaliseShape {
  std::int64_t n = 0, channels = 0, plane = 0;
};
NormaliseShape normaliseShape(const Tensor& bytes, const Tensor& out,
                              const std::vector<float>& mean, const std::vector<float>& scale);

struct PoolGeometry {
  std::int64_t n = 1, channels = 1, height = 1, width = 1;
  std::int64_t kernel = 2, stride = 2, pad = 0;
  PoolMethod method = PoolMethod::kMax;
  bool ceil_mode = true;
  bool channels_last = false;
  std::int64_t outHeight() const;
  std::int64_t outWidth() const;
};

class PoolOp {
 public:
  virtual ~PoolOp() = default;
  virtual void forward(const Tensor& x, const Tensor& y) = 0;
  virtual void backward(const Tensor& dy, const Tensor& dx) = 0;
};

// Fully connected: x [n, in] (any shape with n * in elements), w [out, in], b [out], y [n, out].
struct InnerProductGeometry {
  std::int64_t n = 1, in = 1, out = 1;
};

class InnerProductOp {
 public:
  virtual ~InnerProductOp() = default;
  virtual void forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) = 0;
  virtual void backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                        const Tensor& dw, const Tensor& db) = 0;
};

// Batch norm over [n, channels, spatial] (PyTorch semantics): training normalises with the batch's
// mean and biased variance and updates running = (1 - momentum) * running + momentum * batch
// (unbiased variance); inference normalises with the running statistics.
struct BatchNormGeometry {
  std::int64_t n = 1, channels = 1, spatial = 1;
  float momentum = 0.1f;
  float eps = 1e-5f;
  bool channels_last = false;  // [n, spatial, channels] in memory
  // y = max(BN(x), 0): the ReLU that follows, computed in the same pass (the net fuses a ReLU
  // that alone reads the batch norm's output); the backward takes the gradient of that y.
  bool relu = false;
  // With relu, y = max(BN(x) + z, 0): the residual add before the ReLU too (a ResNet block's
  // end); the backward writes the gradient of z as well.
  bool add = false;
};

class BatchNormOp {
 public:
  virtual ~BatchNormOp() = default;
  // gamma, beta, running_mean, running_var: [channels]. z: read with add only.
  virtual void forward(const Tensor& x, const Tensor& z, const Tensor& gamma, const Tensor& beta,
                       const Tensor& running_mean, const Tensor& running_var, const Tensor& y,
                       bool train) = 0;
  // Back-propagates the last training forward, whose output y was (read with relu only); dz is
  // written with add only (a tensor without memory: not wanted).
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& gamma, const Tensor& dy,
                        const Tensor& dx, const Tensor& dz, const Tensor& dgamma,
                        const Tensor& dbeta) = 0;
};

// Element-wise and reduction ops over `numel` elements (or [n, channels, spatial] for pooling).
class ReluOp {
 public:
  virtual ~ReluOp() = default;
  virtual void forward(const Tensor& x, const Tensor& y) = 0;
  // dx = dy where y > 0, else 0 (y is the forward's output).
  virtual void backward(const Tensor& y, const Tensor& dy, const Tensor& dx) = 0;
};

// Inverted dropout: keeps an element with probability 1 - ratio and scales it by 1 / (1 - ratio).
// The mask is a function of (seed, element index) only, whatever the thread count.
class DropoutOp {
 public:
  virtual ~DropoutOp() = default;
  virtual void forward(const Tensor& x, const Tensor& y, std::uint64_t seed) = 0;
  virtual void backward(const Tensor& dy, const Tensor& dx) = 0;
};

// y = a + b.
class AddOp {
 public:
  virtual ~AddOp() = default;
  virtual void forward(const Tensor& a, const Tensor& b, const Tensor& y) = 0;
};

// [n, channels, spatial] -> [n, channels]; the input [n, spatial, channels] in memory when made
// channels_last.
class GlobalAvgPoolOp {
 public:
  virtual ~GlobalAvgPoolOp() = default;
  virtual void forward(const Tensor& x, const Tensor& y) = 0;
  virtual void backward(const Tensor& dy, const Tensor& dx) = 0;
};

// Softmax cross-entropy over logits [n, classes] with int32 labels [n].
class SoftmaxLossOp {
 public:
  virtual ~SoftmaxLossOp() = default;
  // metrics (2 floats) = {sum of the cross-entropy of p against the target, number of rows whose
  // arg max is the label}. The target is onehot(label), or with label smoothing s
  // (Backend::makeSoftmaxLoss) (1 - s) onehot(label) + s / classes, as PyTorch's
  // CrossEntropyLoss(label_smoothing=s): the loss is then (1 - s) (-log p(label)) +
  // s / classes * sum over k of -log p(k).
  // A label outside [0, classes) throws InputError: from here on the CPU; on a device, where the
  // labels are read by the device, from the backend's next synchronize() (its row left out).
  virtual void forward(const Tensor& logits, const Tensor& labels, const Tensor& metrics) = 0;
  // dlogits = scale * (softmax - target), from the last forward.
  virtual void backward(float scale, const Tensor& dlogits) = 0;
};

// ---- sequence models: a batch of n sequences of t tokens, each token a row of `channels` ----

// Token and position embedding (GPT-2's wte and wpe): y[i][s] = wte[tokens[i][s]] + wpe[s]; without
// `positions`, token embedding alone (an LSTM's encoder): y[i][s] = wte[tokens[i][s]], no wpe.
struct EmbeddingGeometry {
  std::int64_t n = 1, t = 1, vocab = 1, channels = 1;
  bool positions = true;
};

class EmbeddingOp {
 public:
  virtual ~EmbeddingOp() = default;
  // tokens: int32 [n, t]; wte [vocab, channels]; wpe [at least t, channels]; y [n, t, channels].
  // A token outside [0, vocab) throws InputError naming it and where it is.
  virtual void forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       const Tensor& y) = 0;
  // dwpe (its first t rows) is written; dwte is written, or added to with add_to_dwte (an
  // output layer tied to wte wrote its gradient first).
  virtual void backward(const Tensor& tokens, const Tensor& dy, const Tensor& dwte,
                        const Tensor& dwpe, bool add_to_dwte) = 0;
};

// Layer norm over each row of `channels` (PyTorch's LayerNorm): y = (x - mean) / sqrt(var + eps)
// * gamma + beta, var biased.
struct LayerNormGeometry {
  std::int64_t rows = 1, channels = 1;
  float eps = 1e-5f;
};

class LayerNormOp {
 public:
  virtual ~LayerNormOp() = default;
  virtual void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                       const Tensor& y) = 0;
  // From the last forward's statistics; dgamma and dbeta sum over rows in a fixed order.
  virtual void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, const Tensor& dx,
                        const Tensor& dgamma, const Tensor& dbeta) = 0;
};

// GELU in GPT-2's tanh form (PyTorch's gelu(approximate='tanh')): y = x/2 (1 + tanh(sqrt(2/pi)
// (x + 0.044715 x^3))).
class GeluOp {
 public:
  virtual ~GeluOp() = default;
  virtual void forward(const Tensor& x, const Tensor& y) = 0;
  virtual void backward(const Tensor& x, const Tensor& dy, const Tensor& dx) = 0;
};

// Causal multi-head self-attention of GPT-2 after its qkv projection: qkv [n, t, 3 channels] holds
// each token's query, key and value (each `channels` wide, head h at h * channels / heads), y
// [n, t, channels] is softmax(q k^T / sqrt(channels / heads), keys up to the query's position) v
// of each head, the heads side by side (nanoGPT's layout).
struct AttentionGeometry {
  std::int64_t n = 1, t = 1, channels = 1, heads = 1;
};

class AttentionOp {
 public:
  virtual ~AttentionOp() = default;
  virtual void forward(const Tensor& qkv, const Tensor& y) = 0;
  // From the last forward's attention weights.
  virtual void backward(const Tensor& qkv, const Tensor& dy, const Tensor& dqkv) = 0;
};

// One LSTM layer over sequences (PyTorch's nn.LSTM, batch_first, one layer; the state starts at
// 0 for each sequence): x [n, t, input], y [n, t, hidden] the hidden states h. Each step's gates
// are x W_ih^T + b_ih + h_prev W_hh^T + b_hh, 4 x hidden wide in PyTorch's (and cuDNN's) order
// i, f, g, o: c = sigmoid(f) c_prev + sigmoid(i) tanh(g), h = sigmoid(o) tanh(c).
struct LstmGeometry {
  std::int64_t n = 1, t = 1, input = 1, hidden = 1;
};

class LstmOp {
 public:
  virtual ~LstmOp() = default;
  // w_ih [4 hidden, input], w_hh [4 hidden, hidden], b_ih and b_hh [4 hidden].
  virtual void forward(const Tensor& x, const Tensor& w_ih, const Tensor& w_hh, const Tensor& b_ih,
                       const Tensor& b_hh, const Tensor& y) = 0;
  // From the last forward's gates and cells, and y (its hidden states): writes dx (where it has
  // memory) and the four parameter gradients (db_ih and db_hh are equal).
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& w_ih, const Tensor& w_hh,
                        const Tensor& dy, const Tensor& dx, const Tensor& dw_ih,
                        const Tensor& dw_hh, const Tensor& db_ih, const Tensor& db_hh) = 0;
};

}  // namespace troupe::kernels
