#include "kernels/layers.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <map>

#include "troupe/error.h"

namespace troupe::kernels {

FlatParams::FlatParams(Tensor values, Ranges held)
    : values_(std::move(values)), every_(false), held_(std::move(held)) {
  std::int64_t at = 0;
  for (std::size_t i = 0; i < held_.size(); ++i) {
    TROUPE_ENFORCE(
        held_[i].first <= held_[i].second && (i == 0 || held_[i - 1].second <= held_[i].first),
        "flat parameter ranges out of order at [", held_[i].first, ", ", held_[i].second, ")");
    at_.push_back(at);
    at += held_[i].second - held_[i].first;
  }
  TROUPE_ENFORCE(!values_.defined() || values_.numel() == at, "a flat tensor of ", values_.numel(),
                 " values holding ranges of ", at);
}

FlatParams::FlatParams(Tensor values, Ranges held, std::vector<std::int64_t> at)
    : values_(std::move(values)), every_(false), held_(std::move(held)), at_(std::move(at)) {
  TROUPE_ENFORCE_EQ(at_.size(), held_.size());
  for (std::size_t i = 0; i < held_.size(); ++i) {
    TROUPE_ENFORCE(
        held_[i].first <= held_[i].second && (i == 0 || held_[i - 1].second <= held_[i].first),
        "flat parameter ranges out of order at [", held_[i].first, ", ", held_[i].second, ")");
    TROUPE_ENFORCE(at_[i] >= 0 && (!values_.defined() ||
                                   at_[i] + held_[i].second - held_[i].first <= values_.numel()),
                   "flat parameters [", held_[i].first, ", ", held_[i].second, ") placed at ",
                   at_[i], " of a flat tensor of ", values_.numel());
  }
}

Tensor FlatParams::slice(std::int64_t begin, std::int64_t end) const {
  if (!values_.defined()) return Tensor();
  if (every_) return values_.slice(begin, end);
  const auto it =
      std::upper_bound(held_.begin(), held_.end(), begin,
                       [](std::int64_t b, const auto& range) { return b < range.first; });
  TROUPE_ENFORCE(it != held_.begin() && end <= std::prev(it)->second, "parameters [", begin, ", ",
                 end, ") lie outside the ranges this flat tensor holds");
  const auto i = static_cast<std::size_t>(std::prev(it) - held_.begin());
  const std::int64_t local = at_[i] + begin - held_[i].first;
  return values_.slice(local, local + end - begin);
}

void Layer::copyParams(Backend& backend, const FlatParams& weights, const FlatParams& copy, bool) {
  backend.cast(weights.slice(param_begin, param_end), copy.slice(param_begin, param_end));
}

void Layer::widenGrads(Backend& backend, const FlatParams& copy_grads, const FlatParams& grads,
                       bool) {
  backend.cast(copy_grads.slice(param_begin, param_end), grads.slice(param_begin, param_end));
}

namespace {

// A layer that runs one op, made for each batch size it sees (ops are fixed to a batch size) by
// make(), or by the maker it was given; what its backward reads (backwardReadsBottom,
// backwardReadsTop) is fixed when it is made, and most layers have no parameters to bind.
template <typename Op>
class OpLayer : public Layer {
 public:
  using Maker = std::function<std::unique_ptr<Op>(LayerContext& ctx, std::int64_t n)>;
  OpLayer(const char* kind, bool reads_bottom, bool reads_top, Maker maker = nullptr)
      : kind_(kind), reads_bottom_(reads_bottom), reads_top_(reads_top), maker_(std::move(maker)) {}
  const char* kind() const override { return kind_; }
  bool backwardReadsBottom() const override { return reads_bottom_; }
  bool backwardReadsTop() const override { return reads_top_; }
  void bind(const FlatParams&, const FlatParams&, const Tensor&) override {}

 protected:
  virtual std::unique_ptr<Op> make(LayerContext& ctx, std::int64_t n) { return maker_(ctx, n); }
  Op& op(LayerContext& ctx, std::int64_t n) {
    auto& op = ops_[n];
    if (!op) op = make(ctx, n);
    return *op;
  }

 private:
  const char* kind_;
  bool reads_bottom_, reads_top_;
  Maker maker_;
  std::map<std::int64_t, std::unique_ptr<Op>> ops_;
};

// The maker of an element-wise op (ReLU, GELU, add) over n samples of per_sample elements each.
template <typename Op>
typename OpLayer<Op>::Maker perSample(std::unique_ptr<Op> (Backend::*factory)(std::int64_t),
                                      std::int64_t per_sample) {
  return [factory, per_sample](LayerContext& ctx, std::int64_t n) {
    return (ctx.backend().*factory)(n * per_sample);
  };
}

// A layer whose op is made by a backend factory from the layer's geometry with the batch size n
// set (Geometry::n): the sequence ops'. g_ is the geometry of a batch of one.
template <typename Op, typename Geometry>
class GeometryLayer : public OpLayer<Op> {
 public:
  using Factory = std::unique_ptr<Op> (Backend::*)(const Geometry&);
  GeometryLayer(const char* kind, bool reads_bottom, bool reads_top, const Geometry& g,
                Factory factory)
      : OpLayer<Op>(kind, reads_bottom, reads_top), g_(g), factory_(factory) {}

 protected:
  std::unique_ptr<Op> make(LayerContext& ctx, std::int64_t n) override {
    Geometry g = g_;
    g.n = n;
    return (ctx.backend().*factory_)(g);
  }
  Geometry g_;

 private:
  Factory factory_;
};

// A layer whose op maps x to y, and whose backward needs dy alone (pooling: a max pool's choices
// are its op's).
template <typename Op>
class MapLayer final : public OpLayer<Op> {
 public:
  MapLayer(const char* kind, typename OpLayer<Op>::Maker maker)
      : OpLayer<Op>(kind, false, false, std::move(maker)) {}
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    this->op(ctx, n).forward(ctx.data(this->bottoms[0]), ctx.data(this->top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    const Tensor dx = ctx.diff(this->bottoms[0]);
    if (dx.raw()) this->op(ctx, n).backward(ctx.diff(this->top), dx);
  }
};

// The geometry (a convolution's, a pooling's) of a k x k window moved by s over an input of
// shape in, [channels, height, width], padded by p.
template <typename Geometry>
Geometry windowOver(const Shape& in, std::int64_t k, std::int64_t s, std::int64_t p) {
  Geometry g;
  g.channels = in[0];
  g.height = in[1];
  g.width = in[2];
  g.kernel = k;
  g.stride = s;
  g.pad = p;
  return g;
}

// The backward reads x, not y.
class ConvLayer final : public OpLayer<ConvOp> {
 public:
  ConvLayer(const Shape& in, std::int64_t oc, std::int64_t k, std::int64_t s, std::int64_t p,
            bool bias)
      : OpLayer("conv", true, false), g_(windowOver<ConvGeometry>(in, k, s, p)) {
    g_.out_channels = oc;
    g_.bias = bias;
  }
  double forwardFlops() const override {
    return 2.0 * static_cast<double>(g_.channels * g_.kernel * g_.kernel * g_.out_channels *
                                     g_.outHeight() * g_.outWidth());
  }
  void bind(const FlatParams& weights, const FlatParams& grads, const Tensor&) override {
    const std::int64_t wn = g_.out_channels * g_.channels * g_.kernel * g_.kernel;
    w_ = weights.slice(param_begin, param_begin + wn);
    dw_ = grads.slice(param_begin, param_begin + wn);
    if (g_.bias) {
      b_ = weights.slice(param_begin + wn, param_end);
      db_ = grads.slice(param_begin + wn, param_end);
    }
  }
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), w_, b_, ctx.data(top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    ConvOp& o = op(ctx, n);
    bool add = false;
    const Tensor dx = o.addsToDx() ? ctx.diffToAddTo(bottoms[0], add) : ctx.diff(bottoms[0]);
    if (add) {
      o.backwardAddingToDx(ctx.data(bottoms[0]), w_, ctx.diff(top), dx, dw_, db_);
    } else {
      o.backward(ctx.data(bottoms[0]), w_, ctx.diff(top), dx, dw_, db_);
    }
  }
  bool reducedParams() const override { return true; }
  // Channels last: the filter [out][in][k k] becomes [out][k k][in] (KRSC) in the copy.
  void copyParams(Backend& backend, const FlatParams& weights, const FlatParams& copy,
                  bool channels_last) override {
    if (!channels_last) return Layer::copyParams(backend, weights, copy, false);
    const std::int64_t wn = filterSize();
    backend.transpose(weights.slice(param_begin, param_begin + wn),
                      copy.slice(param_begin, param_begin + wn), g_.out_channels, g_.channels,
                      g_.kernel * g_.kernel);
    if (g_.bias) {
      backend.cast(weights.slice(param_begin + wn, param_end),
                   copy.slice(param_begin + wn, param_end));
    }
  }
  void widenGrads(Backend& backend, const FlatParams& copy_grads, const FlatParams& grads,
                  bool channels_last) override {
    if (!channels_last) return Layer::widenGrads(backend, copy_grads, grads, false);
    const std::int64_t wn = filterSize();
    backend.transpose(copy_grads.slice(param_begin, param_begin + wn),
                      grads.slice(param_begin, param_begin + wn), g_.out_channels,
                      g_.kernel * g_.kernel, g_.channels);
    if (g_.bias) {
      backend.cast(copy_grads.slice(param_begin + wn, param_end),
                   grads.slice(param_begin + wn, param_end));
    }
  }

 private:
  std::int64_t filterSize() const { return g_.out_channels * g_.channels * g_.kernel * g_.kernel; }
  std::unique_ptr<ConvOp> make(LayerContext& ctx, std::int64_t n) override {
    ConvGeometry g = g_;
    g.n = n;
    g.channels_last = ctx.channelsLast();
    return ctx.backend().makeConv(g);
  }
  ConvGeometry g_;
  Tensor w_, b_, dw_, db_;
};

// The backward reads x, not y.
// rows: the vectors a sample holds (a sequence's tokens; 1 for an image read as a vector).
// `tied`: the weights [out, in] are another layer's, from that offset of the flat parameters (an
// output layer reading the token embedding, GPT-2's weight tying), and its backward writes that
// layer's gradient first; the layer owns a bias if it has parameters (an LSTM model's decoder),
// else none (GPT-2's).
class InnerProductLayer final : public OpLayer<InnerProductOp> {
 public:
  InnerProductLayer(std::int64_t in, std::int64_t out, std::int64_t rows, std::int64_t tied)
      : OpLayer("fc", true, false), in_(in), out_(out), rows_(rows), tied_(tied) {}
  double forwardFlops() const override { return 2.0 * static_cast<double>(in_ * out_ * rows_); }
  void bind(const FlatParams& weights, const FlatParams& grads, const Tensor&) override {
    const std::int64_t at = tied_ >= 0 ? tied_ : param_begin;
    w_ = weights.slice(at, at + in_ * out_);
    dw_ = grads.slice(at, at + in_ * out_);
    const std::int64_t bias = tied_ >= 0 ? param_begin : param_begin + in_ * out_;
    if (bias == param_end) return;
    b_ = weights.slice(bias, param_end);
    db_ = grads.slice(bias, param_end);
  }
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), w_, b_, ctx.data(top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    op(ctx, n).backward(ctx.data(bottoms[0]), w_, ctx.diff(top), ctx.diff(bottoms[0]), dw_, db_);
  }
  // A tied layer reads the float32 weights of the layer that owns them.
  bool reducedParams() const override { return tied_ < 0; }
  std::pair<std::int64_t, std::int64_t> tiedWeights() const override {
    if (tied_ < 0) return {0, 0};
    return {tied_, tied_ + in_ * out_};
  }

 private:
  std::unique_ptr<InnerProductOp> make(LayerContext& ctx, std::int64_t n) override {
    return ctx.backend().makeInnerProduct(InnerProductGeometry{n * rows_, in_, out_});
  }
  std::int64_t in_, out_, rows_, tied_;
  Tensor w_, b_, dw_, db_;
};

// The backward reads y, not x.
class ReluLayer final : public OpLayer<ReluOp> {
 public:
  explicit ReluLayer(std::int64_t per_sample)
      : OpLayer("relu", false, true, perSample(&Backend::makeRelu, per_sample)) {}
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), ctx.data(top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    const Tensor dx = ctx.diff(bottoms[0]);
    if (dx.raw()) op(ctx, n).backward(ctx.data(top), ctx.diff(top), dx);
  }
  bool inPlace() const override { return true; }
  bool isRelu() const override { return true; }
};

// The backward reads x, and y only for its ReLU: a batch norm without one lets its output go
// once the forward's readers are done (a downsampling block's, before the add).
class BatchNormLayer final : public OpLayer<BatchNormOp> {
 public:
  explicit BatchNormLayer(const Shape& in)
      : OpLayer("bn", true, false), channels_(in[0]), spatial_(numelOf(in) / in[0]) {}
  const char* kind() const override { return add_ ? "bn+add+relu" : relu_ ? "bn+relu" : "bn"; }
  bool backwardReadsTop() const override { return relu_; }
  void bind(const FlatParams& weights, const FlatParams& grads, const Tensor& buffers) override {
    gamma_ = weights.slice(param_begin, param_begin + channels_);
    beta_ = weights.slice(param_begin + channels_, param_end);
    dgamma_ = grads.slice(param_begin, param_begin + channels_);
    dbeta_ = grads.slice(param_begin + channels_, param_end);
    mean_ = buffers.slice(buffer_begin, buffer_begin + channels_);
    var_ = buffers.slice(buffer_begin + channels_, buffer_end);
  }
  void forward(LayerContext& ctx, std::int64_t n, bool train) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), add_ ? ctx.data(bottoms[1]) : Tensor(), gamma_, beta_,
                       mean_, var_, ctx.data(top), train);
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    const Tensor dx = ctx.diff(bottoms[0]);
    const Tensor dz = add_ ? ctx.diff(bottoms[1]) : Tensor();
    op(ctx, n).backward(ctx.data(bottoms[0]), ctx.data(top), gamma_, ctx.diff(top), dx, dz, dgamma_,
                        dbeta_);
  }
  // Once: a batch norm whose output already went through its ReLU takes no add after it.
  bool takeRelu(int relu_top) override {
    if (relu_) return false;
    relu_ = true;
    top = relu_top;
    return true;
  }
  bool takeAddRelu(int z, int relu_top) override {
    if (!takeRelu(relu_top)) return false;
    add_ = true;
    bottoms.push_back(z);
    return true;
  }

 private:
  std::unique_ptr<BatchNormOp> make(LayerContext& ctx, std::int64_t n) override {
    BatchNormGeometry g;
    g.n = n;
    g.channels = channels_;
    g.spatial = spatial_;
    g.channels_last = ctx.channelsLast();
    g.relu = relu_;
    g.add = add_;
    return ctx.backend().makeBatchNorm(g);
  }
  std::int64_t channels_, spatial_;
  bool relu_ = false, add_ = false;
  Tensor gamma_, beta_, dgamma_, dbeta_, mean_, var_;
};

// The backward reads neither: the mask is its op's.
class DropoutLayer final : public OpLayer<DropoutOp> {
 public:
  DropoutLayer(std::int64_t per_sample, float ratio)
      : OpLayer("dropout", false, false, [per_sample, ratio](LayerContext& ctx, std::int64_t n) {
          return ctx.backend().makeDropout(n * per_sample, ratio);
        }) {}
  void forward(LayerContext& ctx, std::int64_t n, bool train) override {
    if (!train) {
      ctx.backend().copy(ctx.data(bottoms[0]), ctx.data(top));
      return;
    }
    op(ctx, n).forward(ctx.data(bottoms[0]), ctx.data(top), ctx.dropoutSeed(top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    const Tensor dx = ctx.diff(bottoms[0]);
    if (dx.raw()) op(ctx, n).backward(ctx.diff(top), dx);
  }
};

// The backward reads neither.
class AddLayer final : public OpLayer<AddOp> {
 public:
  explicit AddLayer(std::int64_t per_sample)
      : OpLayer("add", false, false, perSample(&Backend::makeAdd, per_sample)) {}
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), ctx.data(bottoms[1]), ctx.data(top));
  }
  void backward(LayerContext& ctx, std::int64_t, float) override {
    const Tensor dy = ctx.diff(top);
    for (int b : bottoms) {
      const Tensor dx = ctx.diff(b);
      if (dx.raw()) ctx.backend().copy(dy, dx);
    }
  }

  bool isAdd() const override { return true; }
};

// The backward reads neither: its op keeps the probabilities.
// rows: the predictions a sample holds (a sequence's next tokens), each with its label.
class SoftmaxLossLayer final : public OpLayer<SoftmaxLossOp> {
 public:
  SoftmaxLossLayer(std::int64_t classes, float smoothing, std::int64_t rows)
      : OpLayer("softmax loss", false, false,
                [classes, smoothing, rows](LayerContext& ctx, std::int64_t n) {
                  return ctx.backend().makeSoftmaxLoss(n * rows, classes, smoothing);
                }) {}
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), ctx.labels(), ctx.metrics());
  }
  void backward(LayerContext& ctx, std::int64_t n, float grad_scale) override {
    op(ctx, n).backward(grad_scale, ctx.diff(bottoms[0]));
  }
};

// Token and position embedding: bottoms[0] is the input's tokens. Its parameters are wte then
// wpe (none without positions). Tied (tie()): an output layer reads wte too, and wrote its gradient
// first.
class EmbeddingLayer final : public GeometryLayer<EmbeddingOp, EmbeddingGeometry> {
 public:
  explicit EmbeddingLayer(const EmbeddingGeometry& g)
      : GeometryLayer("embedding", true, false, g, &Backend::makeEmbedding) {}
  // Once: a second tied layer would write over the first one's gradient.
  bool tie() override {
    if (tied_) return false;
    return tied_ = true;
  }
  void bind(const FlatParams& weights, const FlatParams& grads, const Tensor&) override {
    const std::int64_t wn = g_.vocab * g_.channels;
    wte_ = weights.slice(param_begin, param_begin + wn);
    dwte_ = grads.slice(param_begin, param_begin + wn);
    wpe_ = weights.slice(param_begin + wn, param_end);
    dwpe_ = grads.slice(param_begin + wn, param_end);
  }
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), wte_, wpe_, ctx.data(top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    op(ctx, n).backward(ctx.data(bottoms[0]), ctx.diff(top), dwte_, dwpe_, tied_);
  }

 private:
  bool tied_ = false;
  Tensor wte_, wpe_, dwte_, dwpe_;
};

// The backward reads x, not y. Parameters: gamma then beta.
class LayerNormLayer final : public OpLayer<LayerNormOp> {
 public:
  LayerNormLayer(std::int64_t rows, std::int64_t channels)
      : OpLayer("layer norm", true, false), rows_(rows), channels_(channels) {}
  void bind(const FlatParams& weights, const FlatParams& grads, const Tensor&) override {
    gamma_ = weights.slice(param_begin, param_begin + channels_);
    beta_ = weights.slice(param_begin + channels_, param_end);
    dgamma_ = grads.slice(param_begin, param_begin + channels_);
    dbeta_ = grads.slice(param_begin + channels_, param_end);
  }
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), gamma_, beta_, ctx.data(top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    op(ctx, n).backward(ctx.data(bottoms[0]), gamma_, ctx.diff(top), ctx.diff(bottoms[0]), dgamma_,
                        dbeta_);
  }

 private:
  std::unique_ptr<LayerNormOp> make(LayerContext& ctx, std::int64_t n) override {
    return ctx.backend().makeLayerNorm(LayerNormGeometry{n * rows_, channels_});
  }
  std::int64_t rows_, channels_;
  Tensor gamma_, beta_, dgamma_, dbeta_;
};

// Base, an OpLayer whose op maps x to y, with a backward that reads x and dy, not y (GELU;
// attention, whose weights are its op's).
template <typename Base>
class ReadsInputLayer : public Base {
 public:
  using Base::Base;
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    this->op(ctx, n).forward(ctx.data(this->bottoms[0]), ctx.data(this->top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    const Tensor dx = ctx.diff(this->bottoms[0]);
    if (dx.raw()) this->op(ctx, n).backward(ctx.data(this->bottoms[0]), ctx.diff(this->top), dx);
  }
};

// The backward reads the input (q, k, v), not y: the attention weights are its op's.
class AttentionLayer final : public ReadsInputLayer<GeometryLayer<AttentionOp, AttentionGeometry>> {
 public:
  explicit AttentionLayer(const AttentionGeometry& g)
      : ReadsInputLayer("attention", true, false, g, &Backend::makeAttention) {}
  // q k^T and the weights times v, as if every key were seen (PaLM's count: 12 L H Q T a token
  // for training), not the causal half.
  double forwardFlops() const override {
    return 4.0 * static_cast<double>(g_.t * g_.t * g_.channels);
  }
};

// The backward reads x and y (the hidden states); the gates and cells are its op's. Parameters:
// w_ih, w_hh, b_ih, b_hh (nn.LSTM's order).
class LstmLayer final : public GeometryLayer<LstmOp, LstmGeometry> {
 public:
  explicit LstmLayer(const LstmGeometry& g)
      : GeometryLayer("lstm", true, true, g, &Backend::makeLstm) {}
  double forwardFlops() const override {
    return 2.0 * static_cast<double>(g_.t * 4 * g_.hidden * (g_.input + g_.hidden));
  }
  void bind(const FlatParams& weights, const FlatParams& grads, const Tensor&) override {
    std::int64_t at = param_begin;
    auto take = [&](std::int64_t count, Tensor& w, Tensor& dw) {
      w = weights.slice(at, at + count);
      dw = grads.slice(at, at + count);
      at += count;
    };
    const std::int64_t gates = 4 * g_.hidden;
    take(gates * g_.input, w_ih_, dw_ih_);
    take(gates * g_.hidden, w_hh_, dw_hh_);
    take(gates, b_ih_, db_ih_);
    take(gates, b_hh_, db_hh_);
  }
  void forward(LayerContext& ctx, std::int64_t n, bool) override {
    op(ctx, n).forward(ctx.data(bottoms[0]), w_ih_, w_hh_, b_ih_, b_hh_, ctx.data(top));
  }
  void backward(LayerContext& ctx, std::int64_t n, float) override {
    op(ctx, n).backward(ctx.data(bottoms[0]), ctx.data(top), w_ih_, w_hh_, ctx.diff(top),
                        ctx.diff(bottoms[0]), dw_ih_, dw_hh_, db_ih_, db_hh_);
  }

 private:
  Tensor w_ih_, w_hh_, b_ih_, b_hh_, dw_ih_, dw_hh_, db_ih_, db_hh_;
};
}  // namespace

std::unique_ptr<Layer> makeConvLayer(const Shape& in, std::int64_t out_channels,
                                     std::int64_t kernel, std::int64_t stride, std::int64_t pad,
                                     bool bias) {
  return std::make_unique<ConvLayer>(in, out_channels, kernel, stride, pad, bias);
}
std::unique_ptr<Layer> makePoolLayer(const Shape& in, std::int64_t kernel, std::int64_t stride,
                                     std::int64_t pad, PoolMethod method, bool ceil_mode) {
  PoolGeometry geometry = windowOver<PoolGeometry>(in, kernel, stride, pad);
  geometry.method = method;
  geometry.ceil_mode = ceil_mode;
  return std::make_unique<MapLayer<PoolOp>>("pool", [geometry](LayerContext& ctx, std::int64_t n) {
    PoolGeometry g = geometry;
    g.n = n;
    g.channels_last = ctx.channelsLast();
    return ctx.backend().makePool(g);
  });
}
std::unique_ptr<Layer> makeInnerProductLayer(std::int64_t in, std::int64_t out, std::int64_t rows,
                                             std::int64_t tied) {
  return std::make_unique<InnerProductLayer>(in, out, rows, tied);
}
std::unique_ptr<Layer> makeReluLayer(std::int64_t per_sample) {
  return std::make_unique<ReluLayer>(per_sample);
}
std::unique_ptr<Layer> makeBatchNormLayer(const Shape& in) {
  return std::make_unique<BatchNormLayer>(in);
}
std::unique_ptr<Layer> makeDropoutLayer(std::int64_t per_sample, float ratio) {
  return std::make_unique<DropoutLayer>(per_sample, ratio);
}
std::unique_ptr<Layer> makeAddLayer(std::int64_t per_sample) {
  return std::make_unique<AddLayer>(per_sample);
}
std::unique_ptr<Layer> makeGlobalAvgPoolLayer(const Shape& in) {
  const std::int64_t channels = in[0], spatial = numelOf(in) / in[0];
  return std::make_unique<MapLayer<GlobalAvgPoolOp>>(
      "global pool", [channels, spatial](LayerContext& ctx, std::int64_t n) {
        return ctx.backend().makeGlobalAvgPool(n, channels, spatial, ctx.channelsLast());
      });
}
std::unique_ptr<Layer> makeSoftmaxLossLayer(std::int64_t classes, float label_smoothing,
                                            std::int64_t rows) {
  if (!(label_smoothing >= 0.0f && label_smoothing < 1.0f)) {
    throw InputError("label_smoothing = " + std::to_string(label_smoothing) + " is outside [0, 1)");
  }
  return std::make_unique<SoftmaxLossLayer>(classes, label_smoothing, rows);
}
std::unique_ptr<Layer> makeEmbeddingLayer(std::int64_t t, std::int64_t vocab, std::int64_t channels,
                                          bool positions) {
  return std::make_unique<EmbeddingLayer>(EmbeddingGeometry{1, t, vocab, channels, positions});
}
std::unique_ptr<Layer> makeLayerNormLayer(std::int64_t rows, std::int64_t channels) {
  return std::make_unique<LayerNormLayer>(rows, channels);
}
std::unique_ptr<Layer> makeGeluLayer(std::int64_t per_sample) {
  return std::make_unique<ReadsInputLayer<OpLayer<GeluOp>>>(
      "gelu", true, false, perSample(&Backend::makeGelu, per_sample));
}
std::unique_ptr<Layer> makeAttentionLayer(std::int64_t t, std::int64_t channels,
                                          std::int64_t heads) {
  return std::make_unique<AttentionLayer>(AttentionGeometry{1, t, channels, heads});
}
std::unique_ptr<Layer> makeLstmLayer(std::int64_t t, std::int64_t input, std::int64_t hidden) {
  return std::make_unique<LstmLayer>(LstmGeometry{1, t, input, hidden});
}

}  // namespace troupe::kernels
