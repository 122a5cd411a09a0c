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
#include "kernels/net_graph.h"
#include "kernels/random.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

using namespace graph;  // NOLINT: the builder's vocabulary

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

// GPT-2 (GptShape) over sequences x of tokens.
Node buildGpt(Builder& b, Node x, const GptShape& gpt, std::int64_t vocab) {
  Node h = b.embedding(x, "transformer.wte", "transformer.wte.weight", "transformer.wpe.weight",
                       vocab, gpt.n_embd);
  for (std::int64_t l = 0; l < gpt.n_layer; ++l)
    h = transformerBlock(b, h, "transformer.h." + std::to_string(l), gpt.n_head, gpt.n_layer);
  return b.tiedLinear(b.layerNorm(h, "transformer.ln_f"), "lm_head", "transformer.wte");
}

// The LSTM language model (LstmShape) over sequences x of tokens.
Node buildLstmLm(Builder& b, Node x, const LstmShape& lstm, std::int64_t vocab) {
  const Init uniform{false, 0.1f};
  Node h = b.embedding(x, "encoder", "encoder.weight", "", vocab, lstm.emsize, uniform);
  if (lstm.dropout > 0.0f) h = b.dropout(h, "drop.encoder", lstm.dropout);
  for (std::int64_t l = 0; l < lstm.nlayers; ++l) {
    h = b.lstm(h, "rnn", l, lstm.nhid);
    if (lstm.dropout > 0.0f) h = b.dropout(h, "drop.rnn.l" + std::to_string(l), lstm.dropout);
  }
  if (lstm.tied) return b.tiedLinear(h, "decoder", "encoder", true);
  return b.linear(h, "decoder", vocab, uniform);
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
    end_ = g_.layers.size();
    if (options.layers.second > 0) {
      runLayers(options.layers.first, options.layers.second);  // plans their memory alone
    } else {
      planMemory(options.max_batch);
    }
    TROUPE_ENFORCE(!options.stage_grads || options.layers.second > 0,
                   "a net with stage_grads runs a stage's layers");
    TROUPE_ENFORCE(!options.stage_weights || options.stage_grads,
                   "a net with stage_weights has stage_grads too");
    grad_window_ =
        options.stage_grads ? stageGradWindow(*this) : FlatParams::Ranges{{0, g_.num_params}};
    window_fixed_ = options.stage_grads;
    grad_count_ = FlatParams::count(grad_window_);
    if (options.grad_slots.count > 0) layOutGradSlots();
    weight_window_ = options.stage_weights ? grad_window_ : FlatParams::Ranges{{0, g_.num_params}};
    weight_count_ = options.stage_weights ? grad_count_ : g_.num_params;
    if (!options.given_weights) weights_ = backend_.empty({weight_count_});
    if (!options.given_grads) grads_ = backend_.empty({grad_count_});
    buffers_ = backend_.empty({g_.num_buffers});
    metrics_ = backend_.empty({2});
    if (copies_) {
      input_ = backend_.empty({options.max_batch * g_.blobs[0].per}, act_);
      reduced_weights_ = backend_.empty({weight_count_}, act_);
      reduced_grads_ = backend_.empty({grad_count_}, act_);
    }
    initialise();
    if (!options.given_weights) bindLayers();  // else at useWeights()
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
  double trainingFlopsPerSample() const override {
    double forward = 0;
    for (const auto& layer : g_.layers)
      forward += layer->forwardFlops();
    return 3 * forward;
  }
  const Tensor& weights() const override { return weights_; }

  void useWeights(const Tensor& weights) override {
    use(weights_, weights, weight_count_, "weights");
  }
  const Tensor& grads() const override { return grads_; }
  FlatParams gradParams() const override { return held(grads_); }
  std::vector<GradSlot> gradSlots() const override { return slots_; }
  void setGradWriteHook(GradWriteFn hook) override {
    TROUPE_ENFORCE(!hook || !slots_.empty(), "a gradient write hook on a net without slots");
    write_hook_ = std::move(hook);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> gradWindow() const override {
    return grad_window_;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> weightWindow() const override {
    return weight_window_;
  }
  void useGrads(const Tensor& grads) override { use(grads_, grads, grad_count_, "gradients"); }
  const Tensor& buffers() const override { return buffers_; }
  void useBuffers(const Tensor& buffers) override {
    use(buffers_, buffers, g_.num_buffers, "buffers");
  }
  const Tensor& metrics() const override { return metrics_; }

  Tensor ownInput(const Tensor& images) override {
    checkInput(images);
    Tensor own = inputOf(images);
    if (own.raw() != images.raw()) convertInput(images, own);
    return own;
  }

  bool convertsImages() const override {
    return g_.input_dtype != DType::kInt32 && input_.defined();
  }

  void forward(const Tensor& images, const Tensor& labels, bool train) override {
    TROUPE_ENFORCE(weights_.defined(), "a net with given_weights computes only after useWeights()");
    if (begin_ > 0) {
      checkActivations(images, in_blob_, "the activations entering a stage");
      n_ = images.dim(0);
      stage_input_ = images;
    } else {
      checkInput(images);
      n_ = images.dim(0);
      images_ = inputOf(images);
      if (images_.raw() != images.raw()) convertInput(images, images_);
    }
    if (end_ == g_.layers.size()) TROUPE_ENFORCE_EQ(labels.numel(), n_ * g_.label_rows);
    if (copies_) {
      timed("weight copies", false, [&] {
        for (std::size_t l = begin_; l < end_; ++l) {
          Layer& layer = *g_.layers[l];
          if (layer.reducedParams() && layer.param_end > layer.param_begin)
            layer.copyParams(backend_, FlatParams(weights_, weight_window_),
                             FlatParams(reduced_weights_, weight_window_), nhwc_);
        }
      });
    }
    labels_ = labels;
    trained_ = train;
    ++forward_count_;
    for (std::size_t l = begin_; l < end_; ++l) {
      Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0) continue;
      timed(layer.kind(), false,
            [&] { lending(lent_forward_[l], [&] { layer.forward(*this, n_, train); }); });
    }
  }

  void backward(float grad_scale, const GradReadyFn& on_ready) override {
    TROUPE_ENFORCE(trained_, "backward() after a forward() that was not training");
    TROUPE_ENFORCE(grads_.defined(), "a net with given_grads computes only after useGrads()");
    for (TiedOut& t : tied_out_) {
      TROUPE_ENFORCE(t.set, "a stage's backward() before setTiedGrad() of its weights at ",
                     t.range.first, " (which another stage reads)");
      t.set = false;
    }
    std::fill(written_.begin(), written_.end(), false);
    for (std::size_t l = end_; l-- > begin_;) {
      Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0) continue;  // no parameters
      current_ = &layer;
      pending_.clear();
      if (write_hook_) {  // its slots free (NetOptions::grad_slots)
        if (layer.param_end > layer.param_begin) write_hook_(layer.param_begin, layer.param_end);
        if (const auto tied = layer.tiedWeights(); tied.second > tied.first)
          write_hook_(tied.first, tied.second);
      }
      timed(layer.kind(), true,
            [&] { lending(lent_backward_[l], [&] { layer.backward(*this, n_, grad_scale); }); });
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
              [&] { layer.widenGrads(backend_, held(reduced_grads_), held(grads_), nhwc_); });
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
    if (!options_.graphs || !graph_stats_.off.empty() || profiling_ || staged() || write_hook_)
      return opByOp();
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

  // A cut before layer c: the blobs made before it (the input by none) and read at or after it
  // are the one that layer c - 1 made, and no layer from c on is computed by one before c.
  std::vector<PipelineCut> pipelineCuts() const override {
    const std::size_t count = g_.layers.size();
    std::vector<std::size_t> made_by(g_.blobs.size(), 0);  // 1 + the layer; 0: the input
    std::vector<std::size_t> last_read(g_.blobs.size(), 0);
    for (std::size_t l = 0; l < count; ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.top >= 0) made_by[static_cast<std::size_t>(layer.top)] = l + 1;
      for (int b : layer.bottoms)
        last_read[static_cast<std::size_t>(b)] = l;
    }
    std::vector<PipelineCut> cuts;
    double flops = 0;
    for (std::size_t c = 1; c < count; ++c) {
      flops += g_.layers[c - 1]->forwardFlops();
      const int top = g_.layers[c - 1]->top;
      bool one = top > 0 && last_read[static_cast<std::size_t>(top)] >= c;
      for (std::size_t b = 0; one && b < g_.blobs.size(); ++b)
        one = static_cast<int>(b) == top || made_by[b] > c || last_read[b] < c ||
              (b > 0 && made_by[b] == 0);  // between fused layers: nothing computes it
      for (std::size_t l = c; one && l < count; ++l) {
        const int by = g_.layers[l]->computed_by;
        one = by < 0 || static_cast<std::size_t>(by) >= c;
      }
      if (one) cuts.push_back({c, g_.blobs[static_cast<std::size_t>(top)].shape, flops});
    }
    return cuts;
  }

  void runLayers(std::size_t begin, std::size_t end) override {
    const std::size_t count = g_.layers.size();
    const auto cuts = pipelineCuts();
    auto cutAt = [&](std::size_t layer) {
      return std::find_if(cuts.begin(), cuts.end(),
                          [&](const PipelineCut& c) { return c.layer == layer; }) != cuts.end();
    };
    TROUPE_ENFORCE(
        begin < end && end <= count && (begin == 0 || cutAt(begin)) && (end == count || cutAt(end)),
        "layers [", begin, ", ", end, ") of ", count, " are no pipeline stage");
    begin_ = begin;
    end_ = end;
    in_blob_ = begin > 0 ? g_.layers[begin - 1]->top : -1;
    out_blob_ = end < count ? g_.layers[end - 1]->top : -1;
    TROUPE_ENFORCE(!window_fixed_,
                   "a net holding its stage's gradients alone (stage_grads) is not cut again");
    stage_input_ = Tensor();
    planMemory(options_.max_batch);  // the stage's layers' activations and gradients alone
    tied_in_.clear();
    tied_out_.clear();
    for (std::size_t l = 0; l < count; ++l) {
      const auto tied = g_.layers[l]->tiedWeights();
      if (tied.first == tied.second || inStage(l) == ownedInStage(tied.first)) continue;
      if (inStage(l)) {
        tied_in_.push_back(tied);
      } else {
        tied_out_.push_back({tied, false});
      }
    }
  }

  Tensor output() override {
    TROUPE_ENFORCE(out_blob_ >= 0, "output() of a stage that ends with the net's loss");
    return data(out_blob_);
  }
  void setOutputGrad(const Tensor& grad) override {
    TROUPE_ENFORCE(out_blob_ >= 0, "setOutputGrad() of a stage that ends with the net's loss");
    checkActivations(grad, out_blob_, "the gradient leaving a stage");
    TROUPE_ENFORCE_EQ(grad.dim(0), n_);
    backend_.copy(grad, shaped(g_.blobs[static_cast<std::size_t>(out_blob_)].diff, out_blob_));
  }
  Tensor inputGrad() override {
    TROUPE_ENFORCE(in_blob_ >= 0, "inputGrad() of a stage that starts with the net's input");
    return shaped(g_.blobs[static_cast<std::size_t>(in_blob_)].diff, in_blob_);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> gradRanges() const override {
    return stageRanges(&Layer::param_begin, &Layer::param_end);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> bufferRanges() const override {
    return stageRanges(&Layer::buffer_begin, &Layer::buffer_end);
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> tiedRanges() const override {
    return tied_in_;
  }
  std::vector<std::pair<std::int64_t, std::int64_t>> sharedWeights() const override {
    std::vector<std::pair<std::int64_t, std::int64_t>> shared;
    for (const auto& layer : g_.layers)
      if (layer->tiedWeights().second > layer->tiedWeights().first)
        shared.push_back(layer->tiedWeights());
    return shared;
  }
  void setTiedGrad(std::int64_t begin, const Tensor& part) override {
    const auto it = std::find_if(tied_out_.begin(), tied_out_.end(),
                                 [&](const TiedOut& t) { return t.range.first == begin; });
    TROUPE_ENFORCE(it != tied_out_.end() && part.numel() == it->range.second - begin,
                   "setTiedGrad of ", part.numel(), " values at ", begin,
                   ": no tied weights of this stage's there");
    backend_.copy(part, held(grads_).slice(begin, it->range.second));
    it->set = true;
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

  // `t` (`count` float32 on the net's device) in place of the net's own weights, gradients or
  // buffers (`slot`), its layers bound to it; without weights yet, they are bound at useWeights().
  void use(Tensor& slot, const Tensor& t, std::int64_t count, const char* what) {
    TROUPE_ENFORCE(
        t.numel() == count && t.dtype() == DType::kFloat32 && t.device() == backend_.device(), what,
        " for a net must be ", count, " float32 on its device, not ", t.numel(), " ",
        toString(t.dtype()));
    if (t.raw() == slot.raw()) return;
    slot = t;
    if (weights_.defined()) bindLayers();
  }

  // Gradients (or their reduced copy) as the layers take them: by their place in the model's.
  FlatParams held(const Tensor& grads) const {
    if (slots_.empty()) return FlatParams(grads, grad_window_);
    return FlatParams(grads, slot_ranges_, slot_at_);
  }

  // NetOptions::grad_slots: the backward's buckets, each in its slot or in memory of its own.
  void layOutGradSlots() {
    TROUPE_ENFORCE(!staged() && !options_.given_grads && !copies_,
                   "gradient slots in a pipeline's stage, with given gradients or reduced copies");
    GradSlotLayout layout = gradSlotLayout(*this, options_.grad_slots);
    slots_ = std::move(layout.buckets);
    slot_ranges_ = std::move(layout.ranges);
    slot_at_ = std::move(layout.at);
    grad_count_ = layout.size;
  }

  // The non-empty ranges [layer.*begin, layer.*end) of the layers run, in order.
  std::vector<std::pair<std::int64_t, std::int64_t>> stageRanges(std::int64_t Layer::*begin,
                                                                 std::int64_t Layer::*end) const {
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (std::size_t l = begin_; l < end_; ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.*end > layer.*begin) ranges.emplace_back(layer.*begin, layer.*end);
    }
    return ranges;
  }

  bool staged() const { return begin_ > 0 || end_ < g_.layers.size(); }
  bool inStage(std::size_t layer) const { return begin_ <= layer && layer < end_; }
  bool ownedInStage(std::int64_t param) const {
    for (std::size_t l = begin_; l < end_; ++l)
      if (g_.layers[l]->param_begin <= param && param < g_.layers[l]->param_end) return true;
    return false;
  }

  // Activations of blob `blob` in the net's precision, at most max_batch samples.
  void checkActivations(const Tensor& t, int blob, const char* what) const {
    const Shape& expected = g_.blobs[static_cast<std::size_t>(blob)].shape;
    TROUPE_ENFORCE(t.rank() == expected.size() + 1 &&
                       Shape(t.shape().begin() + 1, t.shape().end()) == expected &&
                       t.dtype() == act_ && t.dim(0) >= 1 && t.dim(0) <= options_.max_batch,
                   what, " are ", toString(t.dtype()), " ", toString(t.shape()), ", not ",
                   toString(act_), " [N <= ", options_.max_batch, ", ", toString(expected), "]");
  }

  // The images (or tokens) a batch gives: the net's input shape, at most max_batch of them.
  void checkInput(const Tensor& images) const {
    const Shape& expected = g_.blobs[0].shape;
    TROUPE_ENFORCE(images.rank() == expected.size() + 1 &&
                       Shape(images.shape().begin() + 1, images.shape().end()) == expected,
                   "inputs of shape ", toString(images.shape()), " for a net on ",
                   toString(expected));
    TROUPE_ENFORCE(g_.input_dtype != DType::kInt32 || images.dtype() == DType::kInt32, "tokens of ",
                   toString(images.dtype()), " (int32 expected)");
    TROUPE_ENFORCE(images.dim(0) >= 1 && images.dim(0) <= options_.max_batch, "batch of ",
                   images.dim(0), " with max_batch ", options_.max_batch);
  }

  // The images in the net's precision and layout, in its own input memory (inputOf's).
  void convertInput(const Tensor& images, const Tensor& own) {
    timed("input layout", false, [&] {
      if (nhwc_) {
        backend_.transpose(images, own, images.dim(0), options_.channels,
                           std::int64_t{options_.height} * options_.width);
      } else {
        backend_.cast(images, own);
      }
    });
  }

  // What the first layer reads: the images, or their copy in the net's layout and type.
  Tensor inputOf(const Tensor& images) const {
    if (g_.input_dtype == DType::kInt32) return images;  // tokens
    if (!nhwc_ && images.dtype() == act_) return images;
    return input_.slice(0, images.numel()).view(images.shape());
  }

  // LayerContext
  Backend& backend() override { return backend_; }
  Tensor data(int blob) override {
    if (blob == 0) return images_;
    if (blob == in_blob_) return stage_input_;
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
  //
  // A stage (runLayers) plans its own layers' blobs alone, on the same timeline.
  void planMemory(std::int64_t max_batch) {
    std::vector<int> readers(g_.blobs.size(), 0);  // layers that read each blob
    for (std::size_t l = begin_; l < end_; ++l)
      if (g_.layers[l]->computed_by < 0)
        for (int b : g_.layers[l]->bottoms)
          ++readers[static_cast<std::size_t>(b)];
    memory_ = NetMemory{};
    max_per_ = 0;
    MemoryPlan plan;
    plan.data_item.assign(g_.blobs.size(), -1);
    plan.diff_item.assign(g_.blobs.size(), -1);
    planActivations(max_batch, readers, plan);
    planGradients(max_batch, plan);
    const std::int64_t total = placeItems(plan.items);
    arena_ = backend_.empty({std::max<std::int64_t>(total, 1)}, act_);
    planLoans(plan.items, total);
    const auto bytes = static_cast<std::int64_t>(sizeOf(act_));
    for (const MemoryItem& it : plan.items)
      (it.gradient ? memory_.gradients : memory_.activations) += it.size * bytes;
    memory_.held = total * bytes;
    bindBlobMemory(max_batch, plan);
    // A gradient that several readers add into needs scratch (diff(): at most two of the largest
    // blob's size, made at first use, never where a GPU's convolution adds in its own pass).
    if (std::any_of(readers.begin(), readers.end(), [](int n) { return n > 1; }))
      memory_.scratch = 2 * max_batch * max_per_ * bytes;
  }

  // planMemory's items: a blob's activations or its gradient, live over steps [begin, end] of a
  // timeline of the forward pass and then the backward in reverse (forwardStep, backwardStep).
  struct MemoryItem {
    std::int64_t size = 0;             // elements
    bool gradient = false;             // else activations
    std::int64_t begin = 0, end = -1;  // live over [begin, end]
    std::int64_t offset = 0;

    void liveAt(std::int64_t t) {
      if (end < begin) {
        begin = end = t;
      } else {
        begin = std::min(begin, t);
        end = std::max(end, t);
      }
    }
  };
  // The items, and each blob's item of activations and of gradient (-1: none).
  struct MemoryPlan {
    std::vector<MemoryItem> items;
    std::vector<int> data_item, diff_item;
  };
  // Layer l's forward and backward on that timeline.
  static std::int64_t forwardStep(std::size_t l) { return static_cast<std::int64_t>(l); }
  std::int64_t backwardStep(std::size_t l) const {
    return 2 * static_cast<std::int64_t>(g_.layers.size()) - 1 - static_cast<std::int64_t>(l);
  }

  // Activations: each top a layer computes, or its input's memory for an in-place ReLU; live from
  // its forward to the last forward that reads it, or the last backward that does.
  void planActivations(std::int64_t max_batch, const std::vector<int>& readers, MemoryPlan& plan) {
    auto& items = plan.items;
    auto& data_item = plan.data_item;
    for (std::size_t l = begin_; l < end_; ++l) {
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
      items[static_cast<std::size_t>(data_item[t])].liveAt(forwardStep(l));
      if (layer.backwardReadsTop())
        items[static_cast<std::size_t>(data_item[t])].liveAt(backwardStep(l));
    }
    for (std::size_t l = begin_; l < end_; ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0) continue;
      for (std::size_t k = 0; k < layer.bottoms.size(); ++k) {
        const int item = data_item[static_cast<std::size_t>(layer.bottoms[k])];
        if (item < 0) continue;  // the images
        items[static_cast<std::size_t>(item)].liveAt(forwardStep(l));
        if (k == 0 && layer.backwardReadsBottom())
          items[static_cast<std::size_t>(item)].liveAt(backwardStep(l));
      }
    }
  }

  // Gradients: written first by the backward of the blob's last reader, read last by that of
  // the layer that made it.
  void planGradients(std::int64_t max_batch, MemoryPlan& plan) {
    auto& items = plan.items;
    auto& diff_item = plan.diff_item;
    for (std::size_t l = begin_; l < end_; ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0) continue;
      for (int b : layer.bottoms) {
        const auto bi = static_cast<std::size_t>(b);
        if (!g_.blobs[bi].needs_diff) continue;
        if (diff_item[bi] < 0) {
          diff_item[bi] = static_cast<int>(items.size());
          items.push_back({max_batch * g_.blobs[bi].per, true});
        }
        items[static_cast<std::size_t>(diff_item[bi])].liveAt(backwardStep(l));
      }
    }
    // A stage's outgoing gradient, which setOutputGrad() writes when the next stage's backward
    // is done.
    if (out_blob_ >= 0 && g_.blobs[static_cast<std::size_t>(out_blob_)].needs_diff) {
      const auto out = static_cast<std::size_t>(out_blob_);
      diff_item[out] = static_cast<int>(items.size());
      items.push_back({max_batch * g_.blobs[out].per, true});
      items.back().liveAt(backwardStep(end_));
    }
    for (std::size_t l = begin_; l < end_; ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.computed_by >= 0 || layer.top < 0) continue;
      const int item = diff_item[static_cast<std::size_t>(layer.top)];
      if (item >= 0) items[static_cast<std::size_t>(item)].liveAt(backwardStep(l));
    }
  }

  // Elements of the arena's 256-byte alignment (an item's offset; a loan's).
  std::int64_t arenaAlignment() const {
    return std::max<std::int64_t>(1, 256 / static_cast<std::int64_t>(sizeOf(act_)));
  }

  // Offsets: the largest first, each at the lowest one clear of every placed item it is live
  // with; aligned to 256 bytes. Returns the elements they span.
  std::int64_t placeItems(std::vector<MemoryItem>& items) const {
    const std::int64_t align = arenaAlignment();
    std::vector<std::size_t> order(items.size());
    for (std::size_t i = 0; i < order.size(); ++i)
      order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t x, std::size_t y) { return items[x].size > items[y].size; });
    std::int64_t total = 0;
    std::vector<std::size_t> placed;
    for (const std::size_t i : order) {
      MemoryItem& it = items[i];
      std::vector<std::pair<std::int64_t, std::int64_t>> taken;  // [offset, end) live with it
      for (const std::size_t j : placed) {
        const MemoryItem& o = items[j];
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
    return total;
  }

  // What each layer's call, forward and backward, lends the backend for its workspace
  // (Backend::lendWorkspace): the longest span of the arena that no item live at its step covers.
  // Late in the forward pass and early in the backward, where the activations kept for the
  // backward fill the arena, there is little; early and late in the step, most of it.
  void planLoans(const std::vector<MemoryItem>& items, std::int64_t total) {
    const std::int64_t align = arenaAlignment();
    auto freeAt = [&](std::int64_t t) {
      std::vector<std::pair<std::int64_t, std::int64_t>> taken;  // [offset, end) live at t
      for (const MemoryItem& it : items)
        if (it.begin <= t && t <= it.end) taken.emplace_back(it.offset, it.offset + it.size);
      std::sort(taken.begin(), taken.end());
      std::int64_t from = 0, best_from = 0, best = 0;
      auto span = [&](std::int64_t to) {
        const std::int64_t at = (from + align - 1) / align * align;
        if (to - at > best) {
          best_from = at;
          best = to - at;
        }
      };
      for (const auto& [offset, end] : taken) {
        span(offset);
        from = std::max(from, end);
      }
      span(total);
      return best > 0 ? arena_.slice(best_from, best_from + best) : Tensor();
    };
    lent_forward_.assign(g_.layers.size(), Tensor());
    lent_backward_.assign(g_.layers.size(), Tensor());
    for (std::size_t l = begin_; l < end_; ++l) {
      if (g_.layers[l]->computed_by >= 0) continue;
      lent_forward_[l] = freeAt(forwardStep(l));
      lent_backward_[l] = freeAt(backwardStep(l));
    }
  }

  // Runs one layer's call with `free` lent to the backend, and ends the loan after it.
  template <typename Fn>
  void lending(const Tensor& free, Fn fn) {
    backend_.lendWorkspace(free);
    try {
      fn();
    } catch (...) {
      backend_.lendWorkspace(Tensor());
      throw;
    }
    backend_.lendWorkspace(Tensor());
  }

  // Each blob's activations and gradient, sliced from the arena as planned; a blob no layer reads
  // (a dead end) gets a zero gradient of its own.
  // A stage's: the blobs its layers read or write, the others none.
  void bindBlobMemory(std::int64_t max_batch, const MemoryPlan& plan) {
    std::vector<bool> used(g_.blobs.size(), false);
    for (std::size_t l = begin_; l < end_; ++l) {
      const Layer& layer = *g_.layers[l];
      if (layer.top >= 0) used[static_cast<std::size_t>(layer.top)] = true;
      for (int b : layer.bottoms)
        used[static_cast<std::size_t>(b)] = true;
    }
    for (std::size_t b = 0; b < g_.blobs.size(); ++b) {
      Blob& blob = g_.blobs[b];
      blob.data = blob.diff = Tensor();
      if (!used[b]) continue;
      if (plan.data_item[b] >= 0) {
        const MemoryItem& it = plan.items[static_cast<std::size_t>(plan.data_item[b])];
        blob.data = arena_.slice(it.offset, it.offset + it.size);
      }
      if (!blob.needs_diff) continue;
      if (plan.diff_item[b] >= 0) {
        const MemoryItem& it = plan.items[static_cast<std::size_t>(plan.diff_item[b])];
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
  // With stage_grads, the layers of other stages (which never run here) get no gradients; with
  // stage_weights, no weights either.
  void bindLayers() {
    for (std::size_t l = 0; l < g_.layers.size(); ++l) {
      Layer& layer = *g_.layers[l];
      const bool grads = !window_fixed_ || inStage(l);
      const bool weights = !options_.stage_weights || inStage(l);
      if (copies_ && layer.reducedParams()) {
        layer.bind(weights ? FlatParams(reduced_weights_, weight_window_) : FlatParams(),
                   grads ? held(reduced_grads_) : FlatParams(), buffers_);
      } else {
        layer.bind(weights ? FlatParams(weights_, weight_window_) : FlatParams(),
                   grads ? held(grads_) : FlatParams(), buffers_);
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
    if (!options_.given_weights) initialiseWeights();
    Tensor buf = Tensor::host({g_.num_buffers});
    for (const auto& fill : g_.buffer_fills)
      std::fill(buf.f32() + fill.begin, buf.f32() + fill.end, fill.value);
    backend_.copy(buf, buffers_);
  }

  void initialiseWeights() {
    Tensor w = Tensor::host({g_.num_params});
    for (std::size_t p = 0; p < g_.params.size(); ++p) {
      const ParamInfo& info = g_.params[p];
      const Init init = g_.inits[p];
      float* out = w.f32() + info.offset;
      for (std::int64_t i = 0; i < info.size; ++i) {
        if (init.constant) {
          out[i] = init.value;
        } else if (init.normal) {  // Box-Muller on two draws
          const auto k = static_cast<std::uint64_t>(i);
          const float u = 1.0f - uniform01(randomBits(options_.seed, p + 1, 2 * k));
          const float v = uniform01(randomBits(options_.seed, p + 1, 2 * k + 1));
          out[i] = init.value * std::sqrt(-2.0f * std::log(u)) * std::cos(6.2831853f * v);
        } else {
          out[i] = (2.0f * uniform01(randomBits(options_.seed, p + 1, i)) - 1.0f) * init.value;
        }
      }
    }
    const FlatParams held(weights_, weight_window_);
    for (const auto& [begin, end] : weight_window_)
      backend_.copy(w.slice(begin, end), held.slice(begin, end));
  }

  Backend& backend_;
  NetOptions options_;
  Graph g_;
  std::int64_t max_per_ = 1;
  DType act_;    // of activations and of the reduced parameters
  bool nhwc_;    // images channels-last in memory
  bool copies_;  // convolutions and inner products compute from a copy of their weights
  Tensor weights_, grads_, buffers_, metrics_;
  FlatParams::Ranges grad_window_;  // what grads_ holds (gradWindow)
  // NetOptions::grad_slots: the buckets in backward order, and where each lies in grads_ (by
  // begin); the hook called before a layer writes.
  std::vector<GradSlot> slots_;
  FlatParams::Ranges slot_ranges_;
  std::vector<std::int64_t> slot_at_;
  GradWriteFn write_hook_;
  std::int64_t grad_count_ = 0;
  FlatParams::Ranges weight_window_;  // what weights_ holds (weightWindow)
  std::int64_t weight_count_ = 0;
  bool window_fixed_ = false;  // stage_grads: the layers run are fixed with it
  Tensor arena_;               // every blob's activations and gradient (planMemory)
  // By layer, the arena's span free during its forward and its backward call (planLoans).
  std::vector<Tensor> lent_forward_, lent_backward_;
  NetMemory memory_;
  Tensor scratch_[2];  // a second writer's gradient until it is summed (diff()); made at first use
  Tensor images_, labels_;
  // With copies_: the input in the net's precision and layout, and the copies of the parameters
  // of the layers that compute from one (Layer::copyParams), and their gradients.
  Tensor input_, reduced_weights_, reduced_grads_;
  std::int64_t n_ = 0;
  bool trained_ = false;
  std::uint64_t seed_ = 0, forward_count_ = 0;
  // runLayers(): the layers run, [begin_, end_); the blob entering at begin_ (-1: the input) and
  // its activations as forward() got them; the blob leaving at end_ (-1: none, the loss).
  std::size_t begin_ = 0, end_ = 0;
  int in_blob_ = -1, out_blob_ = -1;
  Tensor stage_input_;
  // Tied weights across the stage's bounds: those a layer here reads from another stage (this
  // stage's part of their gradient leaves in grads()), and those of a layer here that a layer of
  // another stage reads, whose part comes in (setTiedGrad) before each backward.
  std::vector<std::pair<std::int64_t, std::int64_t>> tied_in_;
  struct TiedOut {
    std::pair<std::int64_t, std::int64_t> range;
    bool set = false;  // this batch's part came
  };
  std::vector<TiedOut> tied_out_;
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

std::optional<BucketCutter::Range> BucketCutter::add(std::int64_t begin, std::int64_t end) {
  if (begin_ < 0) {
    end_ = end;
  } else {
    TROUPE_ENFORCE_EQ(end, begin_);  // reverse layer order over a forward-ordered layout
  }
  begin_ = begin;
  if ((end_ - begin_) * static_cast<std::int64_t>(sizeof(float)) < cap_) return std::nullopt;
  cap_ = bytes_;
  return finish();
}

std::optional<BucketCutter::Range> BucketCutter::finish() {
  if (begin_ < 0) return std::nullopt;
  const Range bucket{begin_, end_};
  begin_ = end_ = -1;
  return bucket;
}

GradSlotLayout gradSlotLayout(const Net& net, const NetOptions::GradSlots& o) {
  GradSlotLayout layout;
  BucketCutter cutter(o.first_bytes, o.bytes);
  const auto ranges = net.gradRanges();
  for (auto range = ranges.rbegin(); range != ranges.rend(); ++range)
    if (auto bucket = cutter.add(range->first, range->second))
      layout.buckets.push_back({bucket->first, bucket->second});
  if (auto bucket = cutter.finish()) layout.buckets.push_back({bucket->first, bucket->second});
  // A bucket with weights that two layers write, far apart in the backward, has its own memory;
  // the others take turns in the slots, each slot the size of its largest.
  const auto shared = net.sharedWeights();
  std::int64_t in_slots = 0;
  for (GradSlot& b : layout.buckets) {
    const bool own = std::any_of(shared.begin(), shared.end(), [&](const auto& t) {
      return t.first < b.end && b.begin < t.second;
    });
    b.slot = own ? -1 : static_cast<int>(in_slots++ % o.count);
  }
  std::vector<std::int64_t> slot_at(
      static_cast<std::size_t>(std::min<std::int64_t>(o.count, in_slots)), 0);
  for (const GradSlot& b : layout.buckets) {
    if (b.slot < 0) continue;
    auto& size = slot_at[static_cast<std::size_t>(b.slot)];
    size = std::max(size, b.end - b.begin);
  }
  for (auto& at : slot_at) {  // sizes to places
    const std::int64_t size = at;
    at = layout.size;
    layout.size += size;
  }
  // Each bucket's place, by begin (FlatParams' order): its slot's, or after the slots its own.
  std::vector<GradSlot> by_begin = layout.buckets;
  std::sort(by_begin.begin(), by_begin.end(),
            [](const GradSlot& a, const GradSlot& b) { return a.begin < b.begin; });
  for (const GradSlot& b : by_begin) {
    layout.ranges.emplace_back(b.begin, b.end);
    if (b.slot >= 0) {
      layout.at.push_back(slot_at[static_cast<std::size_t>(b.slot)]);
    } else {
      layout.at.push_back(layout.size);
      layout.size += b.end - b.begin;
    }
  }
  return layout;
}

void Net::setGradWriteHook(GradWriteFn hook) {
  TROUPE_ENFORCE(!hook, "a gradient write hook on a net without gradient slots");
}

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

std::vector<std::pair<std::int64_t, std::int64_t>> stageGradWindow(const Net& stage) {
  auto ranges = stage.gradRanges();
  for (const auto& range : stage.tiedRanges())
    ranges.push_back(range);
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> joined;
  for (const auto& [begin, end] : ranges) {
    if (!joined.empty() && begin <= joined.back().second) {
      joined.back().second = std::max(joined.back().second, end);
    } else {
      joined.emplace_back(begin, end);
    }
  }
  return joined;
}

std::vector<std::string> builtinModels() {
  return {"mlp",      "lenet",    "resnet20", "resnet56", "resnet18",
          "resnet34", "resnet50", "gpt2",     "lstm"};
}

namespace {

// InputError "KEY = VALUE (at least 1)" unless it is.
void needPositive(const char* key, std::int64_t value) {
  if (value < 1)
    throw InputError(std::string(key) + " = " + std::to_string(value) + " (at least 1)");
}

// InputError unless a language model's input is token sequences, naming block_size (and what
// the model's own users call it, `alias`, where that differs).
void needSequences(const std::string& model, std::int64_t sequence_length,
                   const std::string& alias = "") {
  if (sequence_length < 1) {
    throw InputError("model " + model +
                     " reads token sequences: set block_size (the tokens a sequence holds" +
                     (alias.empty() ? "" : ", " + alias) + ")");
  }
}

// InputError unless the GPT's shape is one (names each key as its config file does).
void checkGpt(const GptShape& gpt, std::int64_t sequence_length) {
  needSequences("gpt2", sequence_length);
  needPositive("n_layer", gpt.n_layer);
  needPositive("n_head", gpt.n_head);
  if (gpt.n_embd < 1 || gpt.n_embd % gpt.n_head != 0) {
    throw InputError("n_embd = " + std::to_string(gpt.n_embd) + " is not a positive multiple of " +
                     "n_head = " + std::to_string(gpt.n_head));
  }
}

// The same for an LSTM language model.
void checkLstm(const LstmShape& lstm, std::int64_t sequence_length) {
  needSequences("lstm", sequence_length, "the examples' bptt");
  needPositive("nlayers", lstm.nlayers);
  needPositive("nhid", lstm.nhid);
  needPositive("emsize", lstm.emsize);
  if (!(lstm.dropout >= 0.0f && lstm.dropout < 1.0f))
    throw InputError("dropout = " + std::to_string(lstm.dropout) + " is outside [0, 1)");
  if (lstm.tied && lstm.emsize != lstm.nhid) {
    throw InputError(std::string("tied needs emsize = nhid (the decoder reads the embedding's ") +
                     "weights), got emsize = " + std::to_string(lstm.emsize) +
                     ", nhid = " + std::to_string(lstm.nhid));
  }
}

bool isLanguageModel(const std::string& name) {
  return name == "gpt2" || name == "lstm";
}

}  // namespace

void checkNetInput(const NetOptions& options) {
  if (options.sequence_length < 0)
    throw InputError("sequence_length = " + std::to_string(options.sequence_length));
  if (options.sequence_length == 0 &&
      (options.channels < 1 || options.height < 1 || options.width < 1))
    throw InputError("input of " + std::to_string(options.channels) + "x" +
                     std::to_string(options.height) + "x" + std::to_string(options.width));
  const std::string& name = options.model.name;
  if (name == "gpt2") checkGpt(options.gpt, options.sequence_length);
  if (name == "lstm") checkLstm(options.lstm, options.sequence_length);
  if (options.sequence_length > 0 && !name.empty() && !isLanguageModel(name))
    throw InputError("model " + name + " reads images, not token sequences");
}

std::unique_ptr<Net> makeNet(Backend& backend, const NetOptions& options) {
  checkNetInput(options);
  if (options.num_labels < 2)
    throw InputError("num_labels = " + std::to_string(options.num_labels) + " (at least 2)");
  if (options.max_batch < 1)
    throw InputError("max_batch = " + std::to_string(options.max_batch) + " (at least 1)");
  needPositive("pipeline_stages", options.pipeline.stages);
  if (options.pipeline.micro_batches < 0) {
    throw InputError("micro_batches = " + std::to_string(options.pipeline.micro_batches) +
                     " (0: stages)");
  }
  if (options.pipeline.stages > 1) return makePipelineNet(backend, options);
  const ModelSpec& model = options.model;
  if (model.name.empty() == model.layers.empty())
    throw InputError(model.name.empty()
                         ? "a model needs a built-in name (" + join(builtinModels()) + ") or layers"
                         : "model '" + model.name + "' has both a built-in name and layers");
  Graph graph;
  Builder b(graph);
  Node x = options.sequence_length > 0 ? b.tokens(options.sequence_length)
                                       : b.input({options.channels, options.height, options.width});
  if (!model.name.empty()) {
    if (model.name == "gpt2") {
      x = buildGpt(b, x, options.gpt, options.num_labels);
    } else if (model.name == "lstm") {
      x = buildLstmLm(b, x, options.lstm, options.num_labels);
    } else if (model.name == "mlp") {
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
    const std::int64_t rows = std::max<std::int64_t>(1, options.sequence_length);
    if (numelOf(x.shape) != options.num_labels * rows)
      throw InputError("the last layer gives " + std::to_string(numelOf(x.shape)) +
                       " outputs per sample, num_labels is " + std::to_string(options.num_labels) +
                       (rows > 1 ? " for each of " + std::to_string(rows) + " tokens" : ""));
  }
  b.loss(x, options.num_labels, options.label_smoothing);
  return std::make_unique<NetImpl>(backend, options, std::move(graph));
}

}  // namespace troupe::kernels
