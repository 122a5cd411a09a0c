#include "kernels/net.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>

#include "kernels/backend.h"
#include "kernels/layers.h"
#include "kernels/random.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

struct Blob {
  Shape shape;  // per sample
  std::int64_t per = 0;
  // data: [max_batch * per]; the input blob has none (it is the caller's images). diff: at least
  // that, shared with blobs whose gradients live at other times (NetImpl::assignDiffs).
  Tensor data, diff;
  bool needs_diff = true;
};

// A parameter's initial values: U(-value, value), or the constant value.
struct Init {
  bool constant = false;
  float value = 0.0f;
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

  void loss(const Node& in, std::int64_t classes, float label_smoothing) {
    auto layer = makeSoftmaxLossLayer(classes, label_smoothing);
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

// ---- models ----

Node buildMlp(Builder& b, Node x, std::int64_t classes) {
  x = Builder::flatten(x);
  x = b.relu(b.fc(x, "fc1", 256), "relu1");
  x = b.relu(b.fc(x, "fc2", 128), "relu2");
  return b.fc(x, "fc3", classes);
}

Node buildLenet(Builder& b, Node x, std::int64_t classes) {
  x = b.conv(x, "conv1", 20, 5, 1, 0, true);
  x = b.pool(x, "pool1", 2, 2, 0, PoolMethod::kMax);
  x = b.conv(x, "conv2", 50, 5, 1, 0, true);
  x = b.pool(x, "pool2", 2, 2, 0, PoolMethod::kMax);
  x = b.relu(b.fc(Builder::flatten(x), "ip1", 500), "relu1");
  return b.fc(x, "ip2", classes);
}

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
constexpr BlockStyle kCifarBlock{false, 1.0f, ".shortcut.conv", ".shortcut.bn", ".relu2"};

Node residualBlock(Builder& b, const Node& x, const std::string& name, std::int64_t width,
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

// He et al.'s CIFAR ResNet-(6n+2): three stages of n basic blocks, 16, 32 and 64 wide.
Node buildCifarResnet(Builder& b, Node x, std::int64_t classes, int blocks) {
  x = b.relu(b.bn(b.conv(x, "conv1", 16, 3, 1, 1, false), "bn1"), "relu1");
  const std::int64_t widths[] = {16, 32, 64};
  for (int stage = 0; stage < 3; ++stage)
    for (int block = 0; block < blocks; ++block)
      x = residualBlock(b, x,
                        "stage" + std::to_string(stage + 1) + ".block" + std::to_string(block + 1),
                        widths[stage], stage > 0 && block == 0 ? 2 : 1, kCifarBlock);
  return b.fc(Builder::flatten(b.globalAvgPool(x, "avgpool")), "fc", classes);
}

// torchvision's ImageNet ResNets (v1.5: a bottleneck strides in its 3x3 convolution), layer for
// layer and named as torchvision names them ("layer1.0.conv1", "layer1.0.downsample.0").
struct ImageNetResnet {
  bool bottleneck = false;
  std::array<int, 4> blocks = {2, 2, 2, 2};
};

Node buildImageNetResnet(Builder& b, Node x, std::int64_t classes, const ImageNetResnet& r,
                         float gamma) {
  x = b.relu(b.bn(b.conv(x, "conv1", 64, 7, 2, 3, false), "bn1"), "relu");
  x = b.pool(x, "maxpool", 3, 2, 1, PoolMethod::kMax, false);
  const BlockStyle style{r.bottleneck, gamma, ".downsample.0", ".downsample.1", ".relu"};
  for (int stage = 0; stage < 4; ++stage) {
    for (int block = 0; block < r.blocks[stage]; ++block) {
      x = residualBlock(b, x, "layer" + std::to_string(stage + 1) + "." + std::to_string(block),
                        std::int64_t{64} << stage, stage > 0 && block == 0 ? 2 : 1, style);
    }
  }
  return b.fc(Builder::flatten(b.globalAvgPool(x, "avgpool")), "fc", classes);
}

// ---- layers written in a config ----

const std::vector<std::string> kLayerTypes = {"conv", "pool",    "fc",  "relu",
                                              "bn",   "dropout", "add", "flatten"};
// Arguments every layer takes: a name later layers may refer to, and the output it reads (a named
// layer's, or "data", the input) instead of the previous layer's.
const std::vector<std::string> kEveryLayerArgs = {"name", "input"};

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string layerWhere(const LayerSpec& spec, std::size_t index) {
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

Node buildFromSpec(Builder& b, Node x, const std::vector<LayerSpec>& layers) {
  LayerNames names(x);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& spec = layers[i];
    const std::string name = names.claim(spec, i);
    if (const auto input = spec.args.find("input"); input != spec.args.end())
      x = names.output(spec, i, "input", input->second);
    const bool spatial = x.shape.size() == 3;
    auto needSpatial = [&](const SpecArgs& args) {
      if (!spatial)
        throw InputError(args.where() + " needs a [C,H,W] input, got " + toString(x.shape));
    };
    if (spec.type == "conv") {
      SpecArgs args(spec, i, {"num_output", "kernel", "stride", "pad", "bias"});
      needSpatial(args);
      const std::int64_t one = 1, zero = 0;
      const std::int64_t oc = args.integer("num_output", 1, nullptr);
      const std::int64_t k = args.integer("kernel", 1, nullptr);
      const std::int64_t s = args.integer("stride", 1, &one);
      const std::int64_t p = args.integer("pad", 0, &zero);
      const bool bias = args.text("bias", {"true", "false"}, "true") == "true";
      if (x.shape[1] + 2 * p < k || x.shape[2] + 2 * p < k)
        throw InputError(args.where() + ": kernel " + std::to_string(k) + " exceeds the padded " +
                         toString(x.shape) + " input");
      x = b.conv(x, name, oc, k, s, p, bias);
    } else if (spec.type == "pool") {
      SpecArgs args(spec, i, {"kernel", "stride", "pad", "method", "global", "round_mode"});
      needSpatial(args);
      if (args.text("global", {"true", "false"}, "false") == "true") {  // Caffe's global_pooling
        for (const char* key : {"kernel", "stride", "pad", "round_mode"})
          if (spec.args.count(key)) args.fail(key, "is not taken by a global pool");
        if (args.text("method", {"max", "ave"}, "ave") != "ave")
          args.fail("method", "= max: a global pool averages (method ave)");
        x = b.globalAvgPool(x, name);
        names.built(spec, name, x);
        continue;
      }
      const std::int64_t zero = 0;
      const std::int64_t k = args.integer("kernel", 1, nullptr);
      const std::int64_t s = args.integer("stride", 1, &k);
      const std::int64_t p = args.integer("pad", 0, &zero);
      const bool max = args.text("method", {"max", "ave"}, "max") == "max";
      if (p >= k) args.fail("pad", "must be smaller than the kernel");
      if (x.shape[1] + 2 * p < k || x.shape[2] + 2 * p < k)
        throw InputError(args.where() + ": kernel " + std::to_string(k) + " exceeds the padded " +
                         toString(x.shape) + " input");
      // Caffe's ceil by default; floor as PyTorch's and Caffe2's (torchvision's ResNets).
      const bool ceil = args.text("round_mode", {"ceil", "floor"}, "ceil") == "ceil";
      x = b.pool(x, name, k, s, p, max ? PoolMethod::kMax : PoolMethod::kAverage, ceil);
    } else if (spec.type == "fc") {
      SpecArgs args(spec, i, {"num_output"});
      x = b.fc(x, name, args.integer("num_output", 1, nullptr));
    } else if (spec.type == "relu") {
      SpecArgs args(spec, i, {});
      x = b.relu(x, name);
    } else if (spec.type == "bn") {
      SpecArgs args(spec, i, {"gamma"});
      // The scale's first value: 0 for a residual branch's last batch norm (Goyal et al.).
      x = b.bn(x, name, args.real("gamma", -1e6f, 1e6f, 1.0f));
    } else if (spec.type == "dropout") {
      SpecArgs args(spec, i, {"ratio"});
      x = b.dropout(x, name, args.real("ratio", 0.0f, 1.0f, 0.5f));
    } else if (spec.type == "add") {
      // The residual connection: this input plus an earlier layer's output, of the same shape.
      SpecArgs args(spec, i, {"with"});
      const Node& other = names.output(spec, i, "with", args.string("with", nullptr));
      if (other.blob == x.blob) args.fail("with", "names this layer's own input");
      if (other.shape != x.shape) {
        args.fail("with", "= '" + spec.args.at("with") + "' gives " + toString(other.shape) +
                              " per sample, the input " + toString(x.shape));
      }
      x = b.sum(x, other, name);
    } else if (spec.type == "flatten") {
      SpecArgs args(spec, i, {});
      x = Builder::flatten(x);
    } else {
      throw InputError("layer " + std::to_string(i) + " has unknown type '" + spec.type +
                       "' (known: " + join(kLayerTypes) + ")");
    }
    names.built(spec, name, x);
  }
  return x;
}

// ---- the net ----

class NetImpl final : public Net, private LayerContext {
 public:
  NetImpl(Backend& backend, const NetOptions& options, Graph graph)
      : backend_(backend),
        options_(options),
        g_(std::move(graph)),
        act_(options.precision),
        nhwc_(options.channels_last),
        copies_(act_ != DType::kFloat32 || nhwc_) {
    TROUPE_ENFORCE(act_ == DType::kFloat32 || act_ == DType::kFloat16 || act_ == DType::kBFloat16,
                   "a net computing in ", toString(act_));
    if (nhwc_ && !g_.channels_last_misfit.empty()) {
      throw InputError("channels-last images (memory_format nhwc) would change this model: " +
                       g_.channels_last_misfit + "; use memory_format nchw");
    }
    if (options.fuse) fuseRelus();
    std::vector<int> readers(g_.blobs.size(), 0);  // layers that read each blob
    for (const auto& layer : g_.layers)
      if (layer->computed_by < 0)
        for (int b : layer->bottoms)
          ++readers[static_cast<std::size_t>(b)];
    planMemory(options.max_batch, readers);
    weights_ = backend_.empty({g_.num_params});
    grads_ = backend_.empty({g_.num_params});
    buffers_ = backend_.empty({g_.num_buffers});
    metrics_ = backend_.empty({2});
    if (copies_) {
      input_ = backend_.empty({options.max_batch * g_.blobs[0].per}, act_);
      reduced_weights_ = backend_.empty({g_.num_params}, act_);
      reduced_grads_ = backend_.empty({g_.num_params}, act_);
    }
    initialise();
    bindLayers();
    written_.assign(g_.blobs.size(), false);
  }

  const std::vector<ParamInfo>& params() const override { return g_.params; }
  const std::string& channelsLastMisfit() const override { return g_.channels_last_misfit; }
  NetMemory memory() const override { return memory_; }
  std::int64_t numParams() const override { return g_.num_params; }
  std::vector<LayerInfo> layers() const override {
    std::vector<LayerInfo> out;
    for (std::size_t l = 0; l < g_.layers.size(); ++l) {
      const Layer& layer = *g_.layers[l];
      out.push_back({g_.layer_names[l], layer.top >= 0 ? g_.blobs[layer.top].shape : Shape{},
                     layer.param_end - layer.param_begin, ""});
      if (layer.computed_by >= 0)
        out.back().computed_by = g_.layer_names[static_cast<std::size_t>(layer.computed_by)];
    }
    return out;
  }
  const Tensor& weights() const override { return weights_; }

  void useWeights(const Tensor& weights) override {
    TROUPE_ENFORCE_EQ(weights.numel(), g_.num_params);
    TROUPE_ENFORCE(weights.dtype() == DType::kFloat32 && weights.device() == backend_.device(),
                   "weights for a net must be float32 on its device");
    if (weights.raw() == weights_.raw()) return;
    weights_ = weights;
    bindLayers();
  }
  const Tensor& grads() const override { return grads_; }
  const Tensor& buffers() const override { return buffers_; }
  const Tensor& metrics() const override { return metrics_; }

  void forward(const Tensor& images, const Tensor& labels, bool train) override {
    const Shape expected{options_.channels, options_.height, options_.width};
    TROUPE_ENFORCE(
        images.rank() == 4 && Shape(images.shape().begin() + 1, images.shape().end()) == expected,
        "images of shape ", toString(images.shape()), " for a net on ", toString(expected));
    n_ = images.dim(0);
    TROUPE_ENFORCE(n_ >= 1 && n_ <= options_.max_batch, "batch of ", n_, " with max_batch ",
                   options_.max_batch);
    TROUPE_ENFORCE_EQ(labels.numel(), n_);
    images_ = inputOf(images);
    if (images_.raw() != images.raw()) {
      timed("input layout", false, [&] {
        if (nhwc_) {
          backend_.transpose(images, images_, n_, options_.channels,
                             std::int64_t{options_.height} * options_.width);
        } else {
          backend_.cast(images, images_);
        }
      });
    }
    if (copies_) {
      timed("weight copies", false, [&] {
        for (auto& layer : g_.layers) {
          if (layer->reducedParams() && layer->param_end > layer->param_begin)
            layer->copyParams(backend_, weights_, reduced_weights_, nhwc_);
        }
      });
    }
    labels_ = labels;
    trained_ = train;
    ++forward_count_;
    for (auto& layer : g_.layers) {
      if (layer->computed_by < 0)
        timed(layer->kind(), false, [&] { layer->forward(*this, n_, train); });
    }
  }

  void backward(float grad_scale, const GradReadyFn& on_ready) override {
    TROUPE_ENFORCE(trained_, "backward() after a forward() that was not training");
    std::fill(written_.begin(), written_.end(), false);
    for (std::size_t l = g_.layers.size(); l-- > 0;) {
      Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0) continue;  // no parameters
      current_ = &layer;
      pending_.clear();
      timed(layer.kind(), true, [&] { layer.backward(*this, n_, grad_scale); });
      if (!pending_.empty()) {
        timed("gradient sums", true, [&] {
          for (auto& [scratch, blob] : pending_)
            backend_.axpy(1.0f, scratch_[scratch].slice(0, n_ * g_.blobs[blob].per),
                          g_.blobs[blob].diff.slice(0, n_ * g_.blobs[blob].per));
        });
      }
      if (layer.param_end == layer.param_begin) continue;
      if (copies_ && layer.reducedParams()) {  // widened as it becomes final
        timed("gradient widening", true,
              [&] { layer.widenGrads(backend_, reduced_grads_, grads_, nhwc_); });
      }
      if (on_ready) on_ready(layer.param_begin, layer.param_end, nullptr);
    }
    current_ = nullptr;
    if (profiling_) ++profile_.steps;
  }

  void trainStep(const Tensor& images, const Tensor& labels, float grad_scale,
                 const GradReadyFn& on_ready) override {
    auto opByOp = [&] {
      forward(images, labels, true);
      backward(grad_scale, on_ready);
    };
    if (!options_.graphs || !graph_stats_.off.empty() || profiling_) return opByOp();
    const StepKey key{images.raw(),   labels.raw(),   weights_.raw(), images.shape(),
                      labels.shape(), images.dtype(), grad_scale,     on_ready != nullptr};
    auto replay = [&](const StepGraph& step) {
      step.graph->replay();
      ++graph_stats_.replayed;
      // The host's part of the forward and backward, as they left it.
      n_ = images.dim(0);
      images_ = inputOf(images);
      labels_ = labels;
      trained_ = true;
      if (on_ready) {
        for (const auto& range : step.ready)
          on_ready(range.begin, range.end, range.event < 0 ? nullptr : &step.events[range.event]);
      }
    };
    for (const auto& step : graphs_)
      if (step.key == key) return replay(step);
    // Recorded at its second sighting: the first ran each op once (its algorithm found, the
    // workspace grown), and a step seen once (an epoch's short last batch) costs no graph.
    if (std::find(seen_.begin(), seen_.end(), key) == seen_.end()) {
      opByOp();
      if (seen_.size() >= kGraphs) seen_.erase(seen_.begin());
      seen_.push_back(key);  // once the step went through
      if (random_) graph_stats_.off = "the net has dropout, whose seeds change every step";
      return;
    }
    // What the device found wrong in earlier steps (a bad label) is thrown here, as itself, not
    // taken for a failed capture.
    backend_.synchronize();
    StepGraph step{key, nullptr, {}, {}};
    try {
      step.graph = backend_.capture([&] {
        forward(images, labels, true);
        // An event of the graph's after every MiB of gradients and at the end, where a caller
        // hands ranges on as they are final (each event a node of the graph: not one a range).
        std::int64_t unmarked = 0;  // bytes of the ranges since the last event
        auto mark = [&] {
          step.events.push_back(backend_.record());
          for (auto it = step.ready.rbegin(); it != step.ready.rend() && it->event < 0; ++it)
            it->event = static_cast<int>(step.events.size()) - 1;
          unmarked = 0;
        };
        backward(grad_scale, [&](std::int64_t begin, std::int64_t end, const Event*) {
          step.ready.push_back({begin, end, -1});
          unmarked += (end - begin) * static_cast<std::int64_t>(sizeof(float));
          if (on_ready && unmarked >= kEventBytes) mark();
        });
        if (on_ready && unmarked > 0) mark();
      });
      if (!step.graph) graph_stats_.off = "the backend records no graphs (the CPU)";
    } catch (const Error& e) {  // nothing ran: the step goes op by op, as every later one
      graph_stats_.off = std::string("recording one failed: ") + e.what();
    }
    if (!step.graph) return opByOp();
    ++graph_stats_.captured;
    if (graphs_.size() >= kGraphs) graphs_.erase(graphs_.begin());
    graphs_.push_back(std::move(step));
    replay(graphs_.back());
  }
  StepGraphStats graphStats() const override {
    StepGraphStats s = graph_stats_;
    if (!options_.graphs && s.off.empty()) s.off = "not asked for (NetOptions::graphs)";
    return s;
  }

  void setProfiling(bool on) override {
    if (on && !profiling_) {
      profile_ = {};
      timed_.clear();
    }
    profiling_ = on;
  }
  StepProfile profile() override {
    backend_.synchronize();
    const bool host_clock = backend_.device().kind == DeviceKind::kCpu;
    for (const Timed& t : timed_) {
      StepProfile::Row& row = profile_.rows[static_cast<std::size_t>(t.row)];
      const double seconds = host_clock ? t.host : backend_.elapsed(t.from, t.to);
      (t.backward ? row.backward : row.forward) += seconds;
      ++row.calls;
    }
    timed_.clear();
    return profile_;
  }

  void reseed(std::uint64_t seed) override {
    seed_ = seed;
    forward_count_ = 0;
  }

 private:
  // fn(), between two timed events of the device when profiling (setProfiling), on `kind`'s row.
  template <typename Fn>
  void timed(const char* kind, bool backward, Fn fn) {
    if (!profiling_) return fn();
    auto row = std::find_if(profile_.rows.begin(), profile_.rows.end(),
                            [&](const StepProfile::Row& r) { return r.kind == kind; });
    if (row == profile_.rows.end()) row = profile_.rows.insert(row, StepProfile::Row{kind});
    Timed t{
        static_cast<int>(row - profile_.rows.begin()), backward, backend_.recordTimed(), {}, 0.0};
    const auto start = std::chrono::steady_clock::now();
    fn();
    t.host = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    t.to = backend_.recordTimed();
    timed_.push_back(std::move(t));
  }

  // What the first layer reads: the images, or their copy in the net's layout and type.
  Tensor inputOf(const Tensor& images) const {
    if (!nhwc_ && images.dtype() == act_) return images;
    return input_.slice(0, images.numel()).view(images.shape());
  }

  // LayerContext
  Backend& backend() override { return backend_; }
  Tensor data(int blob) override {
    if (blob == 0) return images_;
    return shaped(g_.blobs[blob].data, blob);
  }
  Tensor diff(int blob) override {
    const Blob& b = g_.blobs[blob];
    if (!b.needs_diff) return Tensor();
    if (current_ && blob != current_->top) {  // a bottom the current layer writes
      if (written_[blob]) {
        const int s = static_cast<int>(pending_.size());
        TROUPE_ENFORCE_LT(s, 2);
        pending_.emplace_back(s, blob);
        // Made at its first use: where every second writer adds in its own pass (a GPU's
        // convolutions, ConvOp::addsToDx), never, which saves two of the largest blob's size.
        if (!scratch_[s].defined())
          scratch_[s] = backend_.empty({options_.max_batch * max_per_}, act_);
        return shaped(scratch_[s], blob);
      }
      written_[blob] = true;
    }
    return shaped(b.diff, blob);
  }
  Tensor diffToAddTo(int blob, bool& add) override {
    const Blob& b = g_.blobs[blob];
    add = b.needs_diff && current_ && blob != current_->top && written_[blob];
    return add ? shaped(b.diff, blob) : diff(blob);
  }
  Tensor labels() override { return labels_; }
  Tensor metrics() override { return metrics_; }
  std::uint64_t dropoutSeed(int layer) override {
    random_ = true;
    return randomBits(seed_, static_cast<std::uint64_t>(layer), forward_count_);
  }
  bool channelsLast() override { return nhwc_; }

  // A ReLU that alone reads a batch norm's output (that it would overwrite in place) is taken by
  // the batch norm (Layer::takeRelu), which then writes the ReLU's output blob and reads its
  // gradient. So is a ReLU that alone reads an add of a batch norm's output (read by nothing else)
  // and another blob, the batch norm being the layer just before the add (takeAddRelu): it then
  // reads that other blob and writes its gradient too, where the add would have, in the same
  // order among the other layers' backward. The layers taken stay in the list (their names and
  // shapes for layers()) and are skipped; the blobs between are left with neither memory nor
  // gradient.
  void fuseRelus() {
    std::vector<int> readers(g_.blobs.size(), 0), producer(g_.blobs.size(), -1);
    for (std::size_t l = 0; l < g_.layers.size(); ++l) {
      const Layer& layer = *g_.layers[l];
      for (int b : layer.bottoms)
        ++readers[static_cast<std::size_t>(b)];
      if (layer.top >= 0) producer[static_cast<std::size_t>(layer.top)] = static_cast<int>(l);
    }
    auto only = [&](int blob, std::int64_t per) {  // read by one layer, of that size
      const auto b = static_cast<std::size_t>(blob);
      return blob > 0 && readers[b] == 1 && producer[b] >= 0 && g_.blobs[b].per == per;
    };
    for (auto& relu : g_.layers) {
      if (!relu->isRelu() || relu->bottoms.size() != 1) continue;
      const int in = relu->bottoms[0];
      const std::int64_t per = g_.blobs[static_cast<std::size_t>(relu->top)].per;
      if (!only(in, per)) continue;
      const int p = producer[static_cast<std::size_t>(in)];
      Layer& before = *g_.layers[static_cast<std::size_t>(p)];
      if (before.takeRelu(relu->top)) {
        relu->computed_by = p;
        g_.blobs[static_cast<std::size_t>(in)].needs_diff = false;
        continue;
      }
      if (!before.isAdd() || before.bottoms.size() != 2 || p == 0 ||
          before.bottoms[0] == before.bottoms[1])
        continue;
      Layer& bn = *g_.layers[static_cast<std::size_t>(p - 1)];
      const int side = bn.top == before.bottoms[0] ? 0 : bn.top == before.bottoms[1] ? 1 : -1;
      if (side < 0 || !only(bn.top, per)) continue;
      const int z = before.bottoms[static_cast<std::size_t>(1 - side)];
      if (g_.blobs[static_cast<std::size_t>(z)].per != per) continue;
      const int bn_top = bn.top;
      if (!bn.takeAddRelu(z, relu->top)) continue;
      before.computed_by = relu->computed_by = p - 1;
      g_.blobs[static_cast<std::size_t>(bn_top)].needs_diff = false;
      g_.blobs[static_cast<std::size_t>(in)].needs_diff = false;
    }
  }

  // Where each blob's activations and gradient live: one arena, each at an offset planned from
  // when it is live (the planner of MXNet's and Caffe2's memonger, on a timeline of the forward
  // pass and then the backward in reverse):
  // - a blob's activations from the forward that writes them to the last forward that reads them,
  //   or, where a backward reads them (Layer::backwardReadsBottom, backwardReadsTop), to the
  //   last such backward;
  // - its gradient from the backward of its last reader (the first to write it) to that of the
  //   layer that made the blob (which reads it last).
  // Memory whose lives do not overlap is shared: a deep net's gradients go where the activations
  // of its later layers were, as PyTorch frees an activation once its backward has used it. A
  // layer that may write its output over its input (Layer::inPlace: a ReLU) whose input no other
  // layer reads shares that input's memory. A blob no layer reads (a dead end) gets a zero
  // gradient of its own, outside the arena.
  void planMemory(std::int64_t max_batch, const std::vector<int>& readers) {
    const auto L = static_cast<std::int64_t>(g_.layers.size());
    auto fwd = [](std::size_t l) { return static_cast<std::int64_t>(l); };
    auto bwd = [L](std::size_t l) { return 2 * L - 1 - static_cast<std::int64_t>(l); };
    struct Item {
      std::int64_t size = 0;             // elements
      bool gradient = false;             // else activations
      std::int64_t begin = 0, end = -1;  // live over [begin, end]
      std::int64_t offset = 0;
    };
    std::vector<Item> items;
    const std::size_t nb = g_.blobs.size();
    std::vector<int> data_item(nb, -1), diff_item(nb, -1);
    auto live = [](Item& it, std::int64_t t) {
      if (it.end < it.begin) {
        it.begin = it.end = t;
      } else {
        it.begin = std::min(it.begin, t);
        it.end = std::max(it.end, t);
      }
    };
    // Activations: each top a layer computes, or its input's memory for an in-place ReLU.
    for (std::size_t l = 0; l < g_.layers.size(); ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.top < 0 || layer.computed_by >= 0) continue;
      const auto t = static_cast<std::size_t>(layer.top);
      max_per_ = std::max(max_per_, g_.blobs[t].per);
      const int in = layer.bottoms.size() == 1 ? layer.bottoms[0] : 0;
      const auto i = static_cast<std::size_t>(in);
      if (layer.inPlace() && in > 0 && readers[i] == 1 && g_.blobs[i].per == g_.blobs[t].per &&
          data_item[i] >= 0) {
        data_item[t] = data_item[i];
      } else {
        data_item[t] = static_cast<int>(items.size());
        items.push_back({max_batch * g_.blobs[t].per, false});
      }
      live(items[static_cast<std::size_t>(data_item[t])], fwd(l));
      if (layer.backwardReadsTop()) live(items[static_cast<std::size_t>(data_item[t])], bwd(l));
    }
    for (std::size_t l = 0; l < g_.layers.size(); ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0) continue;
      for (std::size_t k = 0; k < layer.bottoms.size(); ++k) {
        const int item = data_item[static_cast<std::size_t>(layer.bottoms[k])];
        if (item < 0) continue;  // the images
        live(items[static_cast<std::size_t>(item)], fwd(l));
        if (k == 0 && layer.backwardReadsBottom())
          live(items[static_cast<std::size_t>(item)], bwd(l));
      }
    }
    // Gradients: written first by the backward of the blob's last reader, read last by that of
    // the layer that made it.
    for (std::size_t l = 0; l < g_.layers.size(); ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0) continue;
      for (int b : layer.bottoms) {
        const auto bi = static_cast<std::size_t>(b);
        if (!g_.blobs[bi].needs_diff) continue;
        if (diff_item[bi] < 0) {
          diff_item[bi] = static_cast<int>(items.size());
          items.push_back({max_batch * g_.blobs[bi].per, true});
        }
        live(items[static_cast<std::size_t>(diff_item[bi])], bwd(l));
      }
    }
    for (std::size_t l = 0; l < g_.layers.size(); ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0 || layer.top < 0) continue;
      const int item = diff_item[static_cast<std::size_t>(layer.top)];
      if (item >= 0) live(items[static_cast<std::size_t>(item)], bwd(l));
    }
    // Offsets: the largest first, each at the lowest one clear of every placed item it is live
    // with; aligned to 256 bytes.
    const std::int64_t align =
        std::max<std::int64_t>(1, 256 / static_cast<std::int64_t>(sizeOf(act_)));
    std::vector<std::size_t> order(items.size());
    for (std::size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t x, std::size_t y) { return items[x].size > items[y].size; });
    std::int64_t total = 0;
    std::vector<std::size_t> placed;
    for (const std::size_t i : order) {
      Item& it = items[i];
      std::vector<std::pair<std::int64_t, std::int64_t>> taken;  // [offset, end) live with it
      for (const std::size_t j : placed) {
        const Item& o = items[j];
        if (o.begin <= it.end && it.begin <= o.end) taken.emplace_back(o.offset, o.offset + o.size);
      }
      std::sort(taken.begin(), taken.end());
      std::int64_t at = 0;
      for (const auto& [from, to] : taken) {
        if (at + it.size <= from) break;
        at = std::max(at, (to + align - 1) / align * align);
      }
      it.offset = at;
      total = std::max(total, at + it.size);
      placed.push_back(i);
    }
    arena_ = backend_.empty({std::max<std::int64_t>(total, 1)}, act_);
    const auto bytes = static_cast<std::int64_t>(sizeOf(act_));
    for (const Item& it : items)
      (it.gradient ? memory_.gradients : memory_.activations) += it.size * bytes;
    memory_.held = total * bytes;
    for (std::size_t b = 0; b < nb; ++b) {
      Blob& blob = g_.blobs[b];
      if (data_item[b] >= 0) {
        const Item& it = items[static_cast<std::size_t>(data_item[b])];
        blob.data = arena_.slice(it.offset, it.offset + it.size);
      }
      if (!blob.needs_diff) continue;
      if (diff_item[b] >= 0) {
        const Item& it = items[static_cast<std::size_t>(diff_item[b])];
        blob.diff = arena_.slice(it.offset, it.offset + it.size);
      } else {
        blob.diff = backend_.empty({max_batch * blob.per}, act_);  // a dead end: zero
        memory_.gradients += static_cast<std::int64_t>(blob.diff.bytes());
        memory_.held += static_cast<std::int64_t>(blob.diff.bytes());
      }
    }
  }

  // Layers computing in the net's precision read its reduced copy of their parameters, batch norm
  // reads float32.
  void bindLayers() {
    for (auto& layer : g_.layers) {
      if (copies_ && layer->reducedParams()) {
        layer->bind(reduced_weights_, reduced_grads_, buffers_);
      } else {
        layer->bind(weights_, grads_, buffers_);
      }
    }
  }

  Tensor shaped(const Tensor& store, int blob) const {
    Shape shape{n_};
    for (auto d : g_.blobs[blob].shape)
      shape.push_back(d);
    return store.slice(0, n_ * g_.blobs[blob].per).view(std::move(shape));
  }

  void initialise() {
    Tensor w = Tensor::host({g_.num_params});
    for (std::size_t p = 0; p < g_.params.size(); ++p) {
      const ParamInfo& info = g_.params[p];
      const Init init = g_.inits[p];
      float* out = w.f32() + info.offset;
      for (std::int64_t i = 0; i < info.size; ++i)
        out[i] = init.constant
                     ? init.value
                     : (2.0f * uniform01(randomBits(options_.seed, p + 1, i)) - 1.0f) * init.value;
    }
    backend_.copy(w, weights_);
    Tensor buf = Tensor::host({g_.num_buffers});
    for (const auto& fill : g_.buffer_fills)
      std::fill(buf.f32() + fill.begin, buf.f32() + fill.end, fill.value);
    backend_.copy(buf, buffers_);
  }

  Backend& backend_;
  NetOptions options_;
  Graph g_;
  std::int64_t max_per_ = 1;
  DType act_;    // of activations and of the reduced parameters
  bool nhwc_;    // images channels-last in memory
  bool copies_;  // convolutions and inner products compute from a copy of their weights
  Tensor weights_, grads_, buffers_, metrics_;
  Tensor arena_;  // every blob's activations and gradient (planMemory)
  NetMemory memory_;
  Tensor scratch_[2];  // a second writer's gradient until it is summed (diff()); made at first use
  Tensor images_, labels_;
  // With copies_: the input in the net's precision and layout, and the copies of the parameters
  // of the layers that compute from one (Layer::copyParams), and their gradients.
  Tensor input_, reduced_weights_, reduced_grads_;
  std::int64_t n_ = 0;
  bool trained_ = false;
  std::uint64_t seed_ = 0, forward_count_ = 0;
  std::vector<bool> written_;
  std::vector<std::pair<int, int>> pending_;
  Layer* current_ = nullptr;
  bool random_ = false;  // a forward drew a dropout seed
  // setProfiling: the calls timed since profile() last read them, and the rows so far.
  struct Timed {
    int row;
    bool backward;
    Event from, to;
    double host;  // seconds by the host's clock (the CPU's calls return when done)
  };
  bool profiling_ = false;
  std::vector<Timed> timed_;
  StepProfile profile_;

  // trainStep()'s graphs (NetOptions::graphs), each for the inputs it was recorded with, and the
  // inputs of the last steps run op by op. Last among the members: a graph goes before the ops
  // and tensors its work uses.
  struct StepKey {
    const void* images;
    const void* labels;
    const void* weights;
    Shape shape, labels_shape;
    DType dtype;
    float grad_scale;
    bool ready_events;  // recorded for an on_ready
    bool operator==(const StepKey&) const = default;
  };
  struct ReadyRange {
    std::int64_t begin, end;
    int event;  // in StepGraph::events, at or after its end; -1: none recorded
  };
  struct StepGraph {
    StepKey key;
    std::unique_ptr<DeviceGraph> graph;
    std::vector<ReadyRange> ready;  // backward's ranges, in order
    std::vector<Event> events;      // recorded in the graph, so at each replay
  };
  static constexpr std::size_t kGraphs = 4;
  static constexpr std::int64_t kEventBytes = 1 << 20;
  std::vector<StepKey> seen_;
  std::vector<StepGraph> graphs_;
  StepGraphStats graph_stats_;
};

}  // namespace

std::vector<std::pair<std::int64_t, std::int64_t>> noDecayRanges(
    const std::vector<ParamInfo>& params) {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (const auto& p : params) {  // in offset order
    if (p.decays || p.size == 0) continue;
    if (!ranges.empty() && ranges.back().second == p.offset) {
      ranges.back().second += p.size;
    } else {
      ranges.emplace_back(p.offset, p.offset + p.size);
    }
  }
  return ranges;
}

std::vector<std::pair<std::int64_t, std::int64_t>> paramRanges(
    const std::vector<ParamInfo>& params) {
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
  for (const auto& p : params)
    if (p.size > 0) ranges.emplace_back(p.offset, p.offset + p.size);
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

std::vector<std::string> builtinModels() {
  return {"mlp", "lenet", "resnet20", "resnet56", "resnet18", "resnet34", "resnet50"};
}

std::unique_ptr<Net> makeNet(Backend& backend, const NetOptions& options) {
  if (options.channels < 1 || options.height < 1 || options.width < 1)
    throw InputError("input of " + std::to_string(options.channels) + "x" +
                     std::to_string(options.height) + "x" + std::to_string(options.width));
  if (options.num_labels < 2)
    throw InputError("num_labels = " + std::to_string(options.num_labels) + " (at least 2)");
  if (options.max_batch < 1)
    throw InputError("max_batch = " + std::to_string(options.max_batch) + " (at least 1)");
  const ModelSpec& model = options.model;
  if (model.name.empty() == model.layers.empty())
    throw InputError(model.name.empty()
                         ? "a model needs a built-in name (" + join(builtinModels()) + ") or layers"
                         : "model '" + model.name + "' has both a built-in name and layers");
  Graph graph;
  Builder b(graph);
  Node x = b.input({options.channels, options.height, options.width});
  if (!model.name.empty()) {
    if (model.name == "mlp") {
      x = buildMlp(b, x, options.num_labels);
    } else if (model.name == "lenet") {
      if (options.height < 16 || options.width < 16)
        throw InputError("lenet needs inputs of at least 16x16");
      x = buildLenet(b, x, options.num_labels);
    } else if (model.name == "resnet20" || model.name == "resnet56") {
      x = buildCifarResnet(b, x, options.num_labels, model.name == "resnet20" ? 3 : 9);
    } else if (model.name == "resnet18" || model.name == "resnet34" || model.name == "resnet50") {
      // Five halvings (conv1, maxpool, three stages) leave at least one pixel.
      if (options.height < 32 || options.width < 32)
        throw InputError(model.name + " needs inputs of at least 32x32");
      ImageNetResnet r;
      r.bottleneck = model.name == "resnet50";
      if (model.name != "resnet18") r.blocks = {3, 4, 6, 3};
      x = buildImageNetResnet(b, x, options.num_labels, r,
                              options.zero_init_residual ? 0.0f : 1.0f);
    } else {
      throw InputError("unknown model '" + model.name + "' (built-in: " + join(builtinModels()) +
                       ")");
    }
  } else {
    x = buildFromSpec(b, x, model.layers);
    if (numelOf(x.shape) != options.num_labels)
      throw InputError("the last layer gives " + std::to_string(numelOf(x.shape)) +
                       " outputs per sample, num_labels is " + std::to_string(options.num_labels));
  }
  b.loss(x, options.num_labels, options.label_smoothing);
  return std::make_unique<NetImpl>(backend, options, std::move(graph));
}

}  // namespace troupe::kernels
