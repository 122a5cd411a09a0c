// How a net is put together (private to kernels/): the graph of blobs and layers that
// makeNet's models build through a Builder, and what a config's [[layers]] tables are read with
// (SpecArgs, LayerNames) by the layer types' table (LayerType; kernels/layer_types/: one file a
// type, listed by the build).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/layers.h"
#include "kernels/net.h"
#include "troupe/error.h"

namespace troupe::kernels::graph {

struct Blob {
  Shape shape;  // per sample
  std::int64_t per = 0;
  // data: [max_batch * per]; the input blob has none (it is the caller's images). diff: at least
  // that, shared with blobs whose gradients live at other times (NetImpl::assignDiffs).
  Tensor data, diff;
  bool needs_diff = true;
};

// A parameter's initial values: U(-value, value), the constant value, or with normal N(0, value^2)
// (GPT-2's).
struct Init {
  bool constant = false;
  float value = 0.0f;
  bool normal = false;
};

struct BufferFill {
  std::int64_t begin = 0, end = 0;
  float value = 0.0f;
};

// Everything the builder produces, in forward order.
struct Graph {
  std::vector<Blob> blobs;
  std::vector<std::unique_ptr<Layer>> layers;
  std::vector<std::string> layer_names;
  std::vector<ParamInfo> params;
  std::vector<Init> inits;  // per param
  std::int64_t num_params = 0;
  std::int64_t num_buffers = 0;
  std::vector<BufferFill> buffer_fills;
  // Why the model is not the same model with channels-last images: an inner product that reads
  // an image (its weights' order would change); empty when it is.
  std::string channels_last_misfit;
  // What the input (blob 0) holds: images (float32), or tokens (int32); and how many labels a
  // sample has: one, or one a token (the next one).
  DType input_dtype = DType::kFloat32;
  std::int64_t label_rows = 1;
};

// A node is a blob with its per-sample shape.
struct Node {
  int blob = 0;
  Shape shape;
};

class Builder {
 public:
  explicit Builder(Graph& graph) : g_(graph) {}

  Node input(const Shape& shape) { return Node{newBlob(shape, false), shape}; }

  // Whether x is the input's token sequences.
  bool isTokens(const Node& x) const { return x.blob == 0 && g_.input_dtype == DType::kInt32; }

  // The input as sequences of t tokens (int32), each with its next token as its label.
  Node tokens(std::int64_t t) {
    g_.input_dtype = DType::kInt32;
    g_.label_rows = t;
    g_.channels_last_misfit = "it reads token sequences";
    return input({t});
  }

  Node conv(const Node& in, const std::string& name, std::int64_t oc, std::int64_t k,
            std::int64_t s, std::int64_t p, bool bias) {
    const Shape out{oc, (in.shape[1] + 2 * p - k) / s + 1, (in.shape[2] + 2 * p - k) / s + 1};
    auto layer = makeConvLayer(in.shape, oc, k, s, p, bias);
    const float bound = 1.0f / std::sqrt(static_cast<float>(in.shape[0] * k * k));
    beginParams();
    addParam(name + ".weight", {oc, in.shape[0], k, k}, {false, bound});
    if (bias) addParam(name + ".bias", {oc}, {false, bound}, false);
    return add(std::move(layer), name, {in}, out);
  }

  Node pool(const Node& in, const std::string& name, std::int64_t k, std::int64_t s, std::int64_t p,
            PoolMethod method, bool ceil_mode = true) {
    PoolGeometry geo;
    geo.height = in.shape[1];
    geo.width = in.shape[2];
    geo.kernel = k;
    geo.stride = s;
    geo.pad = p;
    geo.ceil_mode = ceil_mode;
    const Shape out{in.shape[0], geo.outHeight(), geo.outWidth()};
    return add(makePoolLayer(in.shape, k, s, p, method, ceil_mode), name, {in}, out);
  }

  Node fc(const Node& in, const std::string& name, std::int64_t out) {
    const Shape& stored = g_.blobs[in.blob].shape;
    if (stored.size() == 3 && stored[1] * stored[2] > 1 && g_.channels_last_misfit.empty()) {
      g_.channels_last_misfit = "its inner product '" + name + "' reads a " +
                                std::to_string(stored[0]) + "x" + std::to_string(stored[1]) + "x" +
                                std::to_string(stored[2]) + " map as a vector";
    }
    const std::int64_t fan_in = numelOf(in.shape);
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    beginParams();
    addParam(name + ".weight", {out, fan_in}, {false, bound});
    addParam(name + ".bias", {out}, {false, bound}, false);
    return add(makeInnerProductLayer(fan_in, out), name, {in}, {out});
  }

  // ---- sequence models: a sample is t rows (tokens) of channels ----

  // Token and position embedding of the tokens `in` [t]: [t, channels]. Its parameters are
  // `token` [vocab, channels] then `position` [t, channels], N(0, 0.02^2) as GPT-2's. Without a
  // position name, the token embedding alone, drawn from `init`.
  Node embedding(const Node& in, const std::string& name, const std::string& token,
                 const std::string& position, std::int64_t vocab, std::int64_t channels,
                 Init init = {false, 0.02f, true}) {
    const std::int64_t t = in.shape[0];
    beginParams();
    addParam(token, {vocab, channels}, init);
    if (!position.empty()) addParam(position, {t, channels}, init);
    return add(makeEmbeddingLayer(t, vocab, channels, !position.empty()), name, {in},
               {t, channels});
  }

  // Over each row's last dimension; scale 1, shift 0, neither decays.
  Node layerNorm(const Node& in, const std::string& name) {
    const std::int64_t c = in.shape.back(), rows = numelOf(in.shape) / c;
    beginParams();
    addParam(name + ".weight", {c}, {true, 1.0f}, false);
    addParam(name + ".bias", {c}, {true, 0.0f}, false);
    return add(makeLayerNormLayer(rows, c), name, {in}, in.shape);
  }

  // torch's Linear over each row's last dimension: weights [out, in] drawn N(0, stddev^2), the
  // bias 0 (GPT-2's initialisation); or drawn from `weights`.
  Node linear(const Node& in, const std::string& name, std::int64_t out, float stddev) {
    return linear(in, name, out, Init{false, stddev, true});
  }
  Node linear(const Node& in, const std::string& name, std::int64_t out, Init weights) {
    const std::int64_t c = in.shape.back(), rows = numelOf(in.shape) / c;
    Shape shape = in.shape;
    shape.back() = out;
    beginParams();
    addParam(name + ".weight", {out, c}, weights);
    addParam(name + ".bias", {out}, {true, 0.0f}, false);
    return add(makeInnerProductLayer(c, out, rows), name, {in}, shape);
  }

  // The same with the weights of layer `owner`'s first parameter [out, in] (GPT-2's output
  // layer reads the token embedding: Layer::tie), and no bias (GPT-2's) or a bias of its own
  // (the LSTM language model's decoder). InputError naming both when the owner cannot be tied or
  // its weights do not fit.
  Node tiedLinear(const Node& in, const std::string& name, const std::string& owner,
                  bool bias = false) {
    const auto it = std::find(g_.layer_names.begin(), g_.layer_names.end(), owner);
    const auto layer = static_cast<std::size_t>(it - g_.layer_names.begin());
    const auto param = std::find_if(g_.params.begin(), g_.params.end(), [&](const ParamInfo& p) {
      return p.layer == static_cast<int>(layer);
    });
    const std::int64_t c = in.shape.back(), rows = numelOf(in.shape) / c;
    if (it == g_.layer_names.end() || param == g_.params.end() || !g_.layers[layer]->tie())
      throw InputError("'" + name + "' ties its weights to '" + owner +
                       "', which is no embedding or is tied already");
    if (param->shape.size() != 2 || param->shape[1] != c) {
      throw InputError("'" + name + "' reads rows of " + std::to_string(c) + ", and the weights " +
                       "of '" + owner + "' are " + toString(param->shape));
    }
    Shape shape = in.shape;
    shape.back() = param->shape[0];
    const std::int64_t tied_offset = param->offset;  // (addParam may move g_.params)
    if (bias) {
      beginParams();
      addParam(name + ".bias", {shape.back()}, {true, 0.0f}, false);
    }
    return add(makeInnerProductLayer(c, shape.back(), rows, tied_offset), name, {in}, shape);
  }

  // Layer `index` of PyTorch's nn.LSTM `module` over in [t, input]: [t, hidden], its parameters
  // named as nn.LSTM's (MODULE.weight_ih_l0, MODULE.weight_hh_l0, MODULE.bias_ih_l0,
  // MODULE.bias_hh_l0), each U(-1/sqrt(hidden), 1/sqrt(hidden)) as nn.LSTM draws them; the layer
  // is MODULE.lINDEX.
  Node lstm(const Node& in, const std::string& module, std::int64_t index, std::int64_t hidden) {
    const std::int64_t t = in.shape[0], input = in.shape.back();
    const Init init{false, 1.0f / std::sqrt(static_cast<float>(hidden))};
    const std::string l = "_l" + std::to_string(index);
    beginParams();
    addParam(module + ".weight_ih" + l, {4 * hidden, input}, init);
    addParam(module + ".weight_hh" + l, {4 * hidden, hidden}, init);
    addParam(module + ".bias_ih" + l, {4 * hidden}, init, false);
    addParam(module + ".bias_hh" + l, {4 * hidden}, init, false);
    return add(makeLstmLayer(t, input, hidden), module + ".l" + std::to_string(index), {in},
               {t, hidden});
  }

  Node gelu(const Node& in, const std::string& name) {
    return add(makeGeluLayer(numelOf(in.shape)), name, {in}, in.shape);
  }

  // Causal self-attention of `heads` heads over in [t, 3 channels] (q, k, v): [t, channels].
  Node attention(const Node& in, const std::string& name, std::int64_t heads) {
    const std::int64_t t = in.shape[0], c = in.shape[1] / 3;
    return add(makeAttentionLayer(t, c, heads), name, {in}, {t, c});
  }

  Node relu(const Node& in, const std::string& name) {
    return add(makeReluLayer(numelOf(in.shape)), name, {in}, in.shape);
  }

  // gamma: the scale's first value (0 for the last batch norm of a residual branch, Goyal et al.).
  Node bn(const Node& in, const std::string& name, float gamma = 1.0f) {
    const std::int64_t c = in.shape[0];
    beginParams();
    addParam(name + ".weight", {c}, {true, gamma}, false);
    addParam(name + ".bias", {c}, {true, 0.0f}, false);
    const std::int64_t buffers = g_.num_buffers;
    g_.buffer_fills.push_back({buffers + c, buffers + 2 * c, 1.0f});  // running variance
    g_.num_buffers += 2 * c;
    Node out = add(makeBatchNormLayer(in.shape), name, {in}, in.shape);
    g_.layers.back()->buffer_begin = buffers;
    g_.layers.back()->buffer_end = buffers + 2 * c;
    return out;
  }

  Node dropout(const Node& in, const std::string& name, float ratio) {
    return add(makeDropoutLayer(numelOf(in.shape), ratio), name, {in}, in.shape);
  }

  Node sum(const Node& a, const Node& b, const std::string& name) {
    TROUPE_ENFORCE(a.shape == b.shape, "adding ", toString(a.shape), " and ", toString(b.shape));
    return add(makeAddLayer(numelOf(a.shape)), name, {a, b}, a.shape);
  }

  Node globalAvgPool(const Node& in, const std::string& name) {
    return add(makeGlobalAvgPoolLayer(in.shape), name, {in}, {in.shape[0]});
  }

  static Node flatten(const Node& in) { return Node{in.blob, {numelOf(in.shape)}}; }

  // The layers added so far, by name, in forward order.
  const std::vector<std::string>& layerNames() const { return g_.layer_names; }

  void loss(const Node& in, std::int64_t classes, float label_smoothing) {
    auto layer = makeSoftmaxLossLayer(classes, label_smoothing, g_.label_rows);
    layer->bottoms = {in.blob};
    layer->param_begin = layer->param_end = g_.num_params;
    g_.layers.push_back(std::move(layer));
    g_.layer_names.push_back("loss");
  }

 private:
  int newBlob(const Shape& shape, bool needs_diff) {
    Blob b;
    b.shape = shape;
    b.per = numelOf(shape);
    b.needs_diff = needs_diff;
    g_.blobs.push_back(std::move(b));
    return static_cast<int>(g_.blobs.size()) - 1;
  }

  void beginParams() { pending_begin_ = g_.num_params; }

  void addParam(const std::string& name, const Shape& shape, Init init, bool decays = true) {
    ParamInfo info;
    info.name = name;
    info.decays = decays;
    info.shape = shape;
    info.offset = g_.num_params;
    info.size = numelOf(shape);
    info.layer = static_cast<int>(g_.layers.size());
    g_.num_params += info.size;
    g_.params.push_back(std::move(info));
    g_.inits.push_back(init);
  }

  Node add(std::unique_ptr<Layer> layer, const std::string& name, std::vector<Node> ins,
           const Shape& out) {
    for (auto& in : ins)
      layer->bottoms.push_back(in.blob);
    layer->top = newBlob(out, true);
    if (pending_begin_ >= 0) {
      layer->param_begin = pending_begin_;
      layer->param_end = g_.num_params;
      pending_begin_ = -1;
    } else {
      layer->param_begin = layer->param_end = g_.num_params;
    }
    g_.layers.push_back(std::move(layer));
    g_.layer_names.push_back(name);
    return Node{g_.layers.back()->top, out};
  }

  Graph& g_;
  std::int64_t pending_begin_ = -1;
};

// Arguments every layer takes: a name later layers may refer to, and the output it reads (a named
// layer's, or "data", the input) instead of the previous layer's.
inline const std::vector<std::string> kEveryLayerArgs = {"name", "input"};

inline std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

inline std::string layerWhere(const LayerSpec& spec, std::size_t index) {
  return "layer " + std::to_string(index) + " (" + spec.type + ")";
}

class SpecArgs {
 public:
  SpecArgs(const LayerSpec& spec, std::size_t index, std::vector<std::string> known)
      : spec_(spec), index_(index), known_(std::move(known)) {
    known_.insert(known_.end(), kEveryLayerArgs.begin(), kEveryLayerArgs.end());
    for (const auto& [key, value] : spec.args)
      if (std::find(known_.begin(), known_.end(), key) == known_.end())
        fail(key, "is not an argument of it" + (known_.empty() ? std::string(" (it takes none)")
                                                               : " (known: " + join(known_) + ")"));
  }

  std::int64_t integer(const std::string& key, std::int64_t min, const std::int64_t* fallback) {
    auto it = spec_.args.find(key);
    if (it == spec_.args.end()) {
      if (!fallback) fail(key, "is missing");
      return *fallback;
    }
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (it->second.empty() || *end != '\0' || errno != 0)
      fail(key, "= '" + it->second + "' is not an integer");
    if (v < min) fail(key, "= " + it->second + " is below " + std::to_string(min));
    return v;
  }

  float real(const std::string& key, float lo, float hi, float fallback) {
    auto it = spec_.args.find(key);
    if (it == spec_.args.end()) return fallback;
    char* end = nullptr;
    const float v = std::strtof(it->second.c_str(), &end);
    if (it->second.empty() || *end != '\0') fail(key, "= '" + it->second + "' is not a number");
    if (!(v >= lo && v < hi))
      fail(key, "= " + it->second + " is outside [" + std::to_string(lo) + ", " +
                    std::to_string(hi) + ")");
    return v;
  }

  // The value as written; `fallback` if it is absent (nullptr: it is required).
  std::string string(const std::string& key, const char* fallback) {
    auto it = spec_.args.find(key);
    if (it != spec_.args.end()) return it->second;
    if (!fallback) fail(key, "is missing");
    return fallback;
  }

  std::string text(const std::string& key, const std::vector<std::string>& allowed,
                   const std::string& fallback) {
    auto it = spec_.args.find(key);
    if (it == spec_.args.end()) return fallback;
    if (std::find(allowed.begin(), allowed.end(), it->second) == allowed.end())
      fail(key, "= '" + it->second + "' is not one of " + join(allowed));
    return it->second;
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw InputError(where() + ": argument '" + key + "' " + what);
  }
  std::string where() const { return layerWhere(spec_, index_); }
  const LayerSpec& spec() const { return spec_; }
  std::size_t index() const { return index_; }
  bool has(const std::string& key) const { return spec_.args.count(key) > 0; }

  // InputError unless `x` is an image: [C,H,W] per sample.
  void needSpatial(const Node& x) const {
    if (x.shape.size() != 3)
      throw InputError(where() + " needs a [C,H,W] input, got " + toString(x.shape));
  }
  // InputError unless a `kernel` with `pad` fits the image `x`.
  void needKernelFits(const Node& x, std::int64_t kernel, std::int64_t pad) const {
    if (x.shape[1] + 2 * pad < kernel || x.shape[2] + 2 * pad < kernel)
      throw InputError(where() + ": kernel " + std::to_string(kernel) + " exceeds the padded " +
                       toString(x.shape) + " input");
  }

 private:
  const LayerSpec& spec_;
  std::size_t index_;
  std::vector<std::string> known_;
};

// The layers' names (each one's own, or its type and count: "conv2") and the outputs that layers
// may read by name: "data" (the input) and each layer named in the file.
class LayerNames {
 public:
  explicit LayerNames(const Node& data) { named_.emplace("data", data); }

  // Layer `index`'s name; InputError if it is empty or taken.
  std::string claim(const LayerSpec& spec, std::size_t index) {
    const auto given = spec.args.find("name");
    const std::string name =
        given != spec.args.end() ? given->second : spec.type + std::to_string(++counts_[spec.type]);
    const std::string what = given != spec.args.end() ? "argument 'name' = '" + name + "'"
                                                      : "its default name '" + name + "'";
    if (name.empty()) throw InputError(layerWhere(spec, index) + ": argument 'name' is empty");
    if (name == "data") throw InputError(layerWhere(spec, index) + ": " + what + " is the input's");
    if (const auto [it, fresh] = used_.emplace(name, index); !fresh) {
      throw InputError(layerWhere(spec, index) + ": " + what + " is taken by layer " +
                       std::to_string(it->second) +
                       (given == spec.args.end() ? ": name one of them" : ""));
    }
    return name;
  }

  const Node& output(const LayerSpec& spec, std::size_t index, const std::string& key,
                     const std::string& name) const {
    auto it = named_.find(name);
    if (it == named_.end()) {
      std::vector<std::string> names;
      for (const auto& entry : named_)
        names.push_back(entry.first);
      throw InputError(layerWhere(spec, index) + ": argument '" + key + "' = '" + name +
                       "' names no earlier layer (named so far: " + join(names) + ")");
    }
    return it->second;
  }

  // After layer `index` is built: its output, if the file named it.
  void built(const LayerSpec& spec, const std::string& name, const Node& out) {
    if (spec.args.count("name")) named_.emplace(name, out);
  }

 private:
  std::map<std::string, int> counts_;
  std::map<std::string, std::size_t> used_;
  std::map<std::string, Node> named_;
};

// A residual block: basic (two 3x3 convolutions) or bottleneck (1x1, 3x3 that strides, 1x1 to
// four times the width), a projection shortcut where the shape changes, the add, a ReLU. gamma: the
// first scale of the branch's last batch norm (0: Goyal et al.'s zero-init residuals). The
// shortcut's and the last ReLU's names differ between He et al.'s CIFAR nets and torchvision's.
struct BlockStyle {
  bool bottleneck = false;
  float gamma = 1.0f;
  const char* shortcut_conv;
  const char* shortcut_bn;
  const char* relu;
};
inline constexpr BlockStyle kCifarBlock{false, 1.0f, ".shortcut.conv", ".shortcut.bn", ".relu2"};

inline Node residualBlock(Builder& b, const Node& x, const std::string& name, std::int64_t width,
                          std::int64_t stride, const BlockStyle& style) {
  const std::int64_t out = style.bottleneck ? 4 * width : width;
  Node y;
  if (style.bottleneck) {
    y = b.relu(b.bn(b.conv(x, name + ".conv1", width, 1, 1, 0, false), name + ".bn1"),
               name + ".relu1");
    y = b.relu(b.bn(b.conv(y, name + ".conv2", width, 3, stride, 1, false), name + ".bn2"),
               name + ".relu2");
    y = b.bn(b.conv(y, name + ".conv3", out, 1, 1, 0, false), name + ".bn3", style.gamma);
  } else {
    y = b.relu(b.bn(b.conv(x, name + ".conv1", width, 3, stride, 1, false), name + ".bn1"),
               name + ".relu1");
    y = b.bn(b.conv(y, name + ".conv2", width, 3, 1, 1, false), name + ".bn2", style.gamma);
  }
  Node shortcut = x;
  if (stride != 1 || x.shape[0] != out) {
    shortcut = b.bn(b.conv(x, name + style.shortcut_conv, out, 1, stride, 0, false),
                    name + style.shortcut_bn);
  }
  return b.relu(b.sum(y, shortcut, name + ".add"), name + style.relu);
}

// GPT-2's block over x [t, channels] (pre-norm): x + attention, then + an MLP four times as
// wide with a GELU, its layers named as nanoGPT's modules (NAME.ln_1, NAME.attn.c_attn,
// NAME.attn, NAME.attn.c_proj, NAME.add_1, NAME.ln_2, NAME.mlp.c_fc, NAME.mlp.gelu,
// NAME.mlp.c_proj, NAME.add_2). The projections into the residual stream start at 0.02 / sqrt(2
// n_layer), the others at 0.02, as GPT-2's paper and llm.c draw them.
inline Node transformerBlock(Builder& b, const Node& x, const std::string& name, std::int64_t heads,
                             std::int64_t n_layer) {
  const std::int64_t c = x.shape.back();
  const float residual = 0.02f / std::sqrt(2.0f * static_cast<float>(n_layer));
  Node a = b.linear(b.layerNorm(x, name + ".ln_1"), name + ".attn.c_attn", 3 * c, 0.02f);
  a = b.linear(b.attention(a, name + ".attn", heads), name + ".attn.c_proj", c, residual);
  const Node h = b.sum(x, a, name + ".add_1");
  Node m = b.linear(b.layerNorm(h, name + ".ln_2"), name + ".mlp.c_fc", 4 * c, 0.02f);
  m = b.linear(b.gelu(m, name + ".mlp.gelu"), name + ".mlp.c_proj", c, residual);
  return b.sum(h, m, name + ".add_2");
}

// What a layer type's build gets: the builder, the layer's input (the previous layer's output,
// or the one its `input` names), its name, its arguments (checked against the row's keys), and
// the outputs named so far.
struct LayerCall {
  Builder& b;
  const Node& x;
  const std::string& name;
  SpecArgs& args;
  const LayerNames& names;
};

// A row of the layer types' table: what users read of it, and how it adds itself to a graph.
struct LayerType {
  LayerTypeInfo info;
  Node (*build)(LayerCall& call) = nullptr;
};

// Defines TYPELayerType(), the row of layer type TYPE (a kernels/layer_types/ file's one
// definition): its help and its arguments as the docs show them (LayerTypeInfo), then its build,
// the braced body that follows the macro, reading `LayerCall& c` and returning the layer's output:
//   TROUPE_LAYER_TYPE(relu, "max(x, 0)", {}) { return c.b.relu(c.x, c.name); }
#define TROUPE_LAYER_TYPE(type, help, ...)             \
  static Node type##Build(LayerCall& c);               \
  LayerType type##LayerType() {                        \
    return {{#type, help, __VA_ARGS__}, &type##Build}; \
  }                                                    \
  static Node type##Build(LayerCall& c)

// Every type, in the order docs list them: by file name (written by the build from
// kernels/layer_types/, cmake/registry.cmake).
const std::vector<LayerType>& layerTable();

// The net that `layers` describe, after input x (net_spec.cc).
Node buildFromSpec(Builder& b, Node x, const std::vector<LayerSpec>& layers);

}  // namespace troupe::kernels::graph
