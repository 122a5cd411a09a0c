// A Net is one copy of a model on one backend: layers in order, a loss at the end, and all of its
// parameters in one flat tensor (gradients likewise), so that gradient buckets are plain slices.
//
// Thread safety: a Net belongs to one replica; call it from one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/event.h"
#include "kernels/flat_params.h"
#include "kernels/named.h"
#include "kernels/stage_link.h"
#include "kernels/tensor.h"

namespace troupe::kernels {

class Backend;

// A layer type a config's [[layers]] tables may name (layerTypes(): "conv", "pool", "fc", ...).
struct LayerTypeInfo {
  // An argument as the docs show it, its key first, then its default and values: "stride 1",
  // "method max or ave", "n_head: heads, each width / n_head wide". The key is the text before
  // the first space or colon.
  struct Arg {
    Arg(const char* text)  // NOLINT: the layer types' tables are lists of these texts
        : shown(text), key(shown.substr(0, shown.find_first_of(" :"))) {}
    std::string shown;
    std::string key;
  };
  std::string name;
  std::string summary;    // one line, for `troupe info`
  std::vector<Arg> args;  // besides name and input, which every layer takes
};

// Every layer type, in the order docs list them (kernels/layer_types/: one file each).
std::vector<LayerTypeInfo> layerTypes();

// One layer of a model written in a config file: a type (layerTypes()) and its arguments as text
// ("num_output" -> "20").
struct LayerSpec {
  std::string type;
  std::map<std::string, std::string> args;
};

// Either a built-in model by name (builtinModels(): "mlp", "lenet", the CIFAR ResNets "resnet20"
// and "resnet56", torchvision's ImageNet ResNets "resnet18", "resnet34", "resnet50"; the language
// models "gpt2" (GptShape) and "lstm" (LstmShape)) or a list of layers.
struct ModelSpec {
  std::string name;
  std::vector<LayerSpec> layers;
};

// A GPT's shape (model "gpt2"): GPT-2's layout as nanoGPT and llm.c write it (pre-norm blocks of
// causal self-attention and a GELU MLP four times as wide, a final layer norm, the output layer
// tied to the token embedding), its parameters named as nanoGPT names them
// ("transformer.h.0.attn.c_attn.weight"). The defaults are GPT-2 124M's (llm.c's d12); the
// vocabulary is NetOptions::num_labels and the context NetOptions::sequence_length.
struct GptShape {
  std::int64_t n_layer = 12;
  std::int64_t n_head = 12;
  std::int64_t n_embd = 768;
};

// An LSTM language model (model "lstm"): the word language model of MXNet's and PyTorch's
// examples (example/rnn/word_lm; pytorch/examples' word_language_model, its RNNModel): a token
// embedding emsize wide, nlayers LSTM layers of nhid (nn.LSTM's), dropout after the embedding and
// after each LSTM layer, a linear decoder to the vocabulary, with `tied` reading the embedding's
// weights (emsize = nhid). Parameters named as PyTorch's module names them (encoder.weight,
// rnn.weight_ih_l0, ..., decoder.weight, decoder.bias), the embedding and decoder drawn from
// U(-0.1, 0.1) as the example's init_weights. Each sequence starts from a zero state. The
// defaults are the examples' medium model: 2 layers of 650, dropout 0.5.
struct LstmShape {
  std::int64_t nlayers = 2;
  std::int64_t nhid = 650;
  std::int64_t emsize = 650;
  float dropout = 0.5f;
  bool tied = false;
};

// Pipeline parallelism (GPipe's micro-batches under PipeDream-Flush's 1F1B schedule): the layers
// cut into `stages` stages (Net::pipelineCuts, the cuts that share the forward FLOPs most evenly),
// each run by a thread of its own with its share of the backend's threads; a batch goes through
// them in micro_batches parts (0: as many as stages), each stage alternating one part's forward
// with an earlier one's backward. The gradients are the parts' summed in order, and the net is
// still one Net over the whole model's flat weights. A batch norm normalises each part by its own
// statistics and updates its running ones part by part, as GPipe's. CPU only.
//
// With `link`, the stages are processes of their own (pipeline_across processes): this net runs
// stage `stage` alone and exchanges activations and their gradients with the others through the
// link. It holds its stage's weights and the tied ones it reads alone (Net::weightWindow), and
// evaluates its own layers on the activations of the stage before. Its gradients are its own
// stage's, and for a range whose weights a layer of this stage reads, this stage's part of their
// gradient, which goes to their owner's stage.
enum class StagePlacement { kThreads, kProcesses };
inline constexpr Named<StagePlacement> kStagePlacements[] = {
    {"threads", StagePlacement::kThreads}, {"processes", StagePlacement::kProcesses}};

struct PipelineOptions {
  int stages = 1;
  int micro_batches = 0;
  StagePlacement placement = StagePlacement::kThreads;
  // StagePlacement::kProcesses: the stage this process runs, and its link to the others (set by
  // the run's plan; -1 and null: every stage is a thread here). The net then hands on its own
  // stage's gradients alone, and at each step's start writes the tied weights its stage reads
  // from another's (their owner sends them) into the weights it was given, whose other stages'
  // ranges it reads only to evaluate.
  int stage = -1;
  std::shared_ptr<StageLink> link;
  int microBatches() const { return micro_batches > 0 ? micro_batches : stages; }
};

struct NetOptions {
  ModelSpec model;
  int channels = 1;
  int height = 28;
  int width = 28;
  // Classes, or with sequence_length the vocabulary.
  int num_labels = 10;
  // 0: the input is images [N, channels, height, width] with a label each. Above 0: sequences of
  // this many tokens [N, sequence_length] (int32, each below num_labels), each token labelled
  // with the one that follows it, the loss summed over every token (a language model).
  std::int64_t sequence_length = 0;
  GptShape gpt;
  LstmShape lstm;
  // The softmax loss's target: 1 - this on the label, this / num_labels on every class
  // (SoftmaxLossOp; PyTorch's CrossEntropyLoss label_smoothing). In [0, 1).
  float label_smoothing = 0.0f;
  // The largest batch forward() will see; memory is sized for it.
  std::int64_t max_batch = 64;
  std::uint64_t seed = 1;
  // The built-in ImageNet ResNets start each block's last batch-norm scale at 0, so that every
  // block starts as the identity (Goyal et al.; torchvision's zero_init_residual).
  bool zero_init_residual = false;
  // What activations and the convolutions' and inner products' arithmetic use: float32, or
  // float16 / bfloat16 for mixed precision on a device (as PyTorch's autocast: batch norm
  // statistics, the loss and every parameter and gradient stay float32; convolutions and inner
  // products read a reduced copy of their weights, made each forward, and their weight gradients
  // are widened into grads() as they become final). The CPU backend computes in float32 only.
  DType precision = DType::kFloat32;
  // Images channels-last (NHWC) in memory, as PyTorch's channels_last: cuDNN's tensor-core
  // convolutions read NHWC natively. On a device backend only; shapes still say [n, C, H, W].
  // A convolution's filter is then KRSC in its copy, transposed from the float32 weights (whose
  // order, and so checkpoints, do not change). InputError for a model whose inner product reads
  // an image as a vector (Net::channelsLastMisfit), whose weights' meaning it would change.
  bool channels_last = false;
  // A ReLU that alone reads a batch norm's output is computed by the batch norm, in the same pass
  // (the same values, one pass over the activations less each way); false: each on its own.
  bool fuse = true;
  // trainStep() by CUDA graphs where the backend records them (Backend::capture): a step whose
  // inputs (the images' and labels' addresses and shapes, the weights' address, the gradient
  // scale, whether ranges are handed on) were seen before is recorded once and then replayed, one
  // launch for the host instead of a call an op. Not for a net with dropout (its seeds change
  // every step).
  bool graphs = false;
  PipelineOptions pipeline;
  // The weights come by useWeights() before any forward (a replica's: the updater's, or its copy
  // of them): the net neither allocates nor initialises any of its own (only its buffers).
  bool given_weights = false;
  // The gradients come by useGrads() before any backward, likewise (a pipeline stage's copies
  // share one).
  bool given_grads = false;
  // The layers the net runs from the start, [first, end) as runLayers() takes them ({0, 0}: all):
  // a pipeline stage's, whose activations are then planned for those layers alone.
  std::pair<std::size_t, std::size_t> layers{0, 0};
  // With `layers`: grads() holds the gradients of the stage's own parameters and of the tied
  // weights it reads alone (Net::gradWindow), not every parameter's; the net is not cut again.
  bool stage_grads = false;
  // With stage_grads: weights() likewise holds the weights of those ranges alone
  // (Net::weightWindow), which a stage in a process of its own reads.
  bool stage_weights = false;
  // ZeRO stage 2, where a worker keeps the sums of its shard of the gradients alone: grads() holds
  // `count` slots of a bucket each instead of every gradient (Net::gradSlots). The backward's
  // ranges are cut into buckets as a replica hands them on (BucketCutter), bucket k of those
  // without tied weights in slot k % count; a bucket with weights that two layers write (a tied
  // embedding's) has memory of its own. Before a layer writes into a slot, the backward calls the
  // net's GradWriteFn (setGradWriteHook), which waits until the reducer took the slot's last
  // bucket. count 0: every gradient in grads().
  struct GradSlots {
    int count = 0;
    std::int64_t first_bytes = 1 << 20;  // a step's first bucket
    std::int64_t bytes = 25 << 20;       // each other bucket
  };
  GradSlots grad_slots = {};
};

// How a replica cuts a step's gradient ranges, in the order the backward makes them final (each
// right before the last), into buckets for its reducer: a bucket ends once it holds first_bytes
// of float32 values (the step's first) or bytes (every other), and at the step's end.
class BucketCutter {
 public:
  using Range = std::pair<std::int64_t, std::int64_t>;
  BucketCutter(std::int64_t first_bytes, std::int64_t bytes) : cap_(first_bytes), bytes_(bytes) {}
  // [begin, end) is final: the bucket it ends, if it ends one.
  std::optional<Range> add(std::int64_t begin, std::int64_t end);
  // The step's end: its last bucket, if one is open.
  std::optional<Range> finish();

 private:
  std::int64_t cap_, bytes_;
  std::int64_t begin_ = -1, end_ = -1;
};

// A bucket of the backward's gradients (BucketCutter's) in a net's gradient slots
// (NetOptions::grad_slots): its slot, or -1 where it has memory of its own.
struct GradSlot {
  std::int64_t begin = 0, end = 0;
  int slot = -1;
};

// How trainStep() ran its steps with NetOptions::graphs: steps recorded as a graph (each also ran
// once by it), steps replayed, and why graphs are not used, if they are not.
struct StepGraphStats {
  std::int64_t captured = 0;
  std::int64_t replayed = 0;
  std::string off;  // "the backend records no graphs (the CPU)", "the net has dropout", ...
};

// Where a parameter lives in the flat weight / gradient tensors.
struct ParamInfo {
  std::string name;  // "conv1.weight"
  Shape shape;
  std::int64_t offset = 0;
  std::int64_t size = 0;
  int layer = 0;  // index of the layer that owns it, in forward order
  // False for a bias and a batch norm's scale and shift: what Goyal et al. (and GluonCV's --no-wd)
  // keep out of weight decay.
  bool decays = true;
};

// The parameters that do not decay (ParamInfo::decays false), as sorted, merged ranges of the flat
// parameters (kernels::OptimizerSettings::no_decay).
std::vector<std::pair<std::int64_t, std::int64_t>> noDecayRanges(
    const std::vector<ParamInfo>& params);

// Each parameter tensor's range of the flat parameters (kernels::OptimizerSettings::layers).
std::vector<std::pair<std::int64_t, std::int64_t>> paramRanges(
    const std::vector<ParamInfo>& params);

// One layer of a built net, for summaries (`troupe train --dry-run`).
struct LayerInfo {
  std::string name;             // "conv1", "stage1.block1.bn1", "loss"
  Shape output;                 // per sample: {C, H, W} or {features}; {} for the loss
  std::int64_t num_params = 0;  // trainable scalars of this layer
  // The layer that computes this one in its own pass (a ReLU fused into the batch norm before
  // it: NetOptions::fuse); empty: itself.
  std::string computed_by;
};

// Bytes of a net's activations and their gradients, at its max_batch: each apart (an in-place
// ReLU's output counted with its input), and the arena they share, each at its offset only while
// it is live (kernels/net.cc, planMemory), which is what the net holds.
struct NetMemory {
  std::int64_t activations = 0;
  std::int64_t gradients = 0;
  std::int64_t held = 0;
  // At most, the scratch for gradients that several readers add into, outside the arena.
  std::int64_t scratch = 0;
};

// Where a net's steps spent the device's time, by kind of layer (Layer::kind: "conv",
// "bn+relu", ...) and the net's own work between layers ("weight copies", "gradient widening",
// "gradient sums", "input layout"), each call timed between two events on the device (on the CPU,
// whose calls return when done, by the host's clock).
struct StepProfile {
  struct Row {
    std::string kind;
    double forward = 0, backward = 0;  // seconds, over all the steps
    std::int64_t calls = 0;
  };
  std::vector<Row> rows;  // in the order first met
  std::int64_t steps = 0;
};

// Called by backward() as soon as gradients [begin, end) of the flat gradient tensor are final.
// Ranges come in reverse layer order, never overlap, and together cover every parameter. `final`:
// where the net knows it, the event after which they are (a step replayed from a CUDA graph, whose
// whole work is queued before its ranges are called); null: at the backend's next record().
using GradReadyFn = std::function<void(std::int64_t begin, std::int64_t end, const Event* final)>;
// Called by backward() before a layer writes gradients [begin, end) (NetOptions::grad_slots).
using GradWriteFn = std::function<void(std::int64_t begin, std::int64_t end)>;

// A place where a net may be cut into pipeline stages: before layer `layer`, whose input is the
// one blob that crosses the cut (its activations go forward, their gradient back). Nothing else
// crosses: no other blob is read on both sides, and no layer on one side is computed by one on
// the other (a fused ReLU).
struct PipelineCut {
  std::size_t layer = 0;
  Shape shape;              // of the crossing activations, per sample
  double flops_before = 0;  // forward FLOPs a sample of the layers before the cut
};

class Net {
 public:
  virtual ~Net() = default;

  virtual const std::vector<ParamInfo>& params() const = 0;
  // Why NetOptions::channels_last would change this model ("its inner product 'ip1' reads a
  // 50x4x4 map as a vector"); empty when it would not.
  virtual const std::string& channelsLastMisfit() const = 0;
  virtual NetMemory memory() const = 0;
  // Number of trainable scalars.
  virtual std::int64_t numParams() const = 0;
  // The layers in forward order, the loss last (a flatten is no layer: the next one reads it).
  virtual std::vector<LayerInfo> layers() const = 0;
  // Floating-point operations of a training step's products for one sample: three times the
  // forward's (Layer::forwardFlops; the backward's two products for each of the forward's), the
  // model FLOPs of MFU (a GPT's 6 N + 12 L H Q T a token, as PaLM and nanoGPT count them).
  virtual double trainingFlopsPerSample() const = 0;
  // Flat weights of weightWindow()'s ranges, one after another, on the net's backend.
  virtual const Tensor& weights() const = 0;
  // The ranges of the flat parameters whose weights weights() holds, in order: {0, numParams()}
  // but in a net with NetOptions::stage_weights, whose are gradWindow()'s, and in a pipeline whose
  // stage is a process of its own (PipelineOptions::link), whose are that stage's.
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> weightWindow() const {
    return {{0, numParams()}};
  }
  // Computes with `weights` (weightWindow()'s count on the net's backend) from now on, in place
  // of weights(), without a copy; the caller keeps them alive and unchanged while the net reads
  // them.
  virtual void useWeights(const Tensor& weights) = 0;
  // Flat gradients of gradWindow()'s ranges, one after another (every parameter's but in a net
  // with NetOptions::stage_grads).
  virtual const Tensor& grads() const = 0;
  // The ranges of the flat parameters whose gradients grads() holds, in order: {0, numParams()}
  // but in a net with NetOptions::stage_grads, whose are gradRanges() and tiedRanges(), and in a
  // pipeline whose stage is a process of its own (PipelineOptions::link), whose are that stage's.
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> gradWindow() const {
    return {{0, numParams()}};
  }
  // grads() as the layers and the replica's buckets read it: gradWindow()'s ranges one after
  // another, or each bucket in its slot (NetOptions::grad_slots).
  virtual FlatParams gradParams() const { return FlatParams(grads(), gradWindow()); }
  // The buckets of NetOptions::grad_slots, in the order the backward makes them final; empty
  // without slots.
  virtual std::vector<GradSlot> gradSlots() const { return {}; }
  // Before an evaluation with the weights the net holds (no useWeights since the last step): a
  // pipeline stage in a process of its own (PipelineOptions::link) takes the tied weights it
  // reads from their owners' stages, as they are now, and sends its own to those that read them.
  virtual void prepareEvaluation() {}
  // With grad_slots: `hook` is called before each layer writes a range of gradients.
  virtual void setGradWriteHook(GradWriteFn hook);
  // Writes gradients into `grads` (gradWindow()'s count on the net's backend) from now on, in
  // place of its own: nets that never run at once may share one (a pipeline stage's copies). A
  // net with given_grads that never runs a backward needs none.
  virtual void useGrads(const Tensor& grads) = 0;
  // Non-trainable state (batch-norm running statistics), flat; may be empty.
  virtual const Tensor& buffers() const = 0;
  // Keeps its buffers in `buffers` (buffers().numel() float32 elements on the net's backend) from
  // now on, as they are: nets whose layers' ranges of them never run at once may share them (a
  // pipeline's stages).
  virtual void useBuffers(const Tensor& buffers) = 0;

  // images: [N, C, H, W] float, labels: [N] int32, both on the net's backend, N <= max_batch; for
  // a language model (NetOptions::sequence_length T) tokens [N, T] int32 and labels [N, T] (or
  // N T) int32, and the metrics sum over the N T tokens.
  // train: dropout active, batch norm uses and updates batch statistics.
  virtual void forward(const Tensor& images, const Tensor& labels, bool train) = 0;
  // The images in the net's own memory, in its precision and layout, converted now where forward()
  // would convert them; else (images it reads as they are, tokens) the images themselves. Given
  // the result, forward() and trainStep() read nothing more of the images' buffer: a replica's
  // staging slot is free for the next batch once this conversion's work is done.
  virtual Tensor ownInput(const Tensor& images) = 0;
  // Whether ownInput() copies float32 images (a precision other than float32, or channels-last).
  virtual bool convertsImages() const = 0;
  // {sum of the loss over the batch, number of correct top-1 predictions} of the last forward,
  // as a 2-element float tensor on the backend (read it after synchronize()).
  virtual const Tensor& metrics() const = 0;
  // Whether the last training forward's metrics are of the batch: not in a pipeline stage's
  // process that has no loss (PipelineOptions::link; its metrics are zeros).
  virtual bool scoresBatch() const { return true; }
  // A pipeline stage in a process of its own (PipelineOptions::link): its steps' pipelined time
  // (from the step's start to its last backward) and the part of it the stage computed, since
  // the last call; zeros otherwise. 1 - busy / pipelined is the stage's bubble.
  virtual StageTimes stageTimes() { return {}; }
  // Back-propagates the last forward (which must have had train = true). Overwrites grads() with
  // grad_scale * d(sum of loss)/d(weights), calling on_ready as ranges become final.
  virtual void backward(float grad_scale, const GradReadyFn& on_ready) = 0;
  // forward(images, labels, true), then backward(grad_scale, on_ready): the same work and results,
  // by a CUDA graph where NetOptions::graphs says so. A step replayed calls on_ready once its whole
  // backward is queued, each range with an event of the graph's at or after its end (one at least
  // every MiB of gradients, so that their reduction still overlaps the rest of the backward).
  virtual void trainStep(const Tensor& images, const Tensor& labels, float grad_scale,
                         const GradReadyFn& on_ready) = 0;
  virtual StepGraphStats graphStats() const = 0;
  // While on, each forward and backward times its layers (a step then goes op by op: no graph),
  // for profile(): a diagnosis, whose events cost the host a little.
  virtual void setProfiling(bool on) = 0;
  // Waits for the device, and gives the time of the steps since profiling was last turned on.
  virtual StepProfile profile() = 0;
  // Seeds the randomness of the next forward (dropout), so runs repeat exactly.
  virtual void reseed(std::uint64_t seed) = 0;

  // Pipeline parallelism (MXNet's model parallelism, GPipe's stages): where the net may be cut,
  // in order.
  virtual std::vector<PipelineCut> pipelineCuts() const = 0;
  // From now on forward(), backward() and trainStep() run layers [begin, end) only (at first all
  // of them): begin is 0 or a cut's layer, end a later cut's layer or the number of layers.
  // - begin > 0: forward()'s `images` are the activations that cross the cut at begin ([N, shape]
  //   in the net's precision), read where they lie until backward() is done; backward() leaves
  //   their gradient in inputGrad().
  // - end below the number of layers: forward() leaves the activations that cross the cut at end
  //   in output() and computes no loss (it takes no labels, and metrics() keep their values);
  //   backward() reads their gradient, which setOutputGrad() copies in first.
  // backward() writes the gradients of gradRanges() only. The net records no CUDA graphs.
  virtual void runLayers(std::size_t begin, std::size_t end) = 0;
  virtual Tensor output() = 0;
  virtual void setOutputGrad(const Tensor& grad) = 0;
  virtual Tensor inputGrad() = 0;
  // The ranges of the flat parameters whose gradients backward() leaves final, in order: the
  // stage's layers' own.
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> gradRanges() const = 0;
  // The ranges of the flat buffers that the stage's layers own (its batch norms' statistics), in
  // order.
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> bufferRanges() const = 0;
  // Tied weights across stages (GPT-2's output layer reads the embedding's wte): the ranges of
  // another stage's weights that a layer of this one reads. backward() leaves this stage's part
  // of their gradient in grads() over them; the owner's stage takes it by setTiedGrad() before
  // its own backward() of the same batch, which adds its part to it, as the whole net's does.
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> tiedRanges() const = 0;
  virtual void setTiedGrad(std::int64_t begin, const Tensor& part) = 0;
  // The ranges of weights that a second layer reads (a tied output layer's: the embedding's),
  // whose gradient two layers write; of the whole net.
  virtual std::vector<std::pair<std::int64_t, std::int64_t>> sharedWeights() const { return {}; }
};

// NetOptions::grad_slots' layout of a whole net's gradients: its buckets in the order the
// backward makes them final, each with its slot; where each lies in grads() (ranges by begin,
// for FlatParams); and grads()'s size.
struct GradSlotLayout {
  std::vector<GradSlot> buckets;
  FlatParams::Ranges ranges;
  std::vector<std::int64_t> at;
  std::int64_t size = 0;
};
GradSlotLayout gradSlotLayout(const Net& net, const NetOptions::GradSlots& slots);

// A stage's gradRanges() and tiedRanges(), sorted, those that touch joined: the gradients its
// backward writes (NetOptions::stage_grads).
std::vector<std::pair<std::int64_t, std::int64_t>> stageGradWindow(const Net& stage);

// InputError unless the input fits the model (images, or token sequences for gpt2) and a GPT's
// shape is one; makeNet checks it first, a run before it opens its data.
void checkNetInput(const NetOptions& options);

// Builds a net; an unknown model or layer name, or a bad layer argument, throws InputError naming
// it (and listing the known ones). Parameters are initialised from options.seed.
std::unique_ptr<Net> makeNet(Backend& backend, const NetOptions& options);

// makeNet's net of options.pipeline.stages stages (kernels/pipeline_net.cc).
std::unique_ptr<Net> makePipelineNet(Backend& backend, const NetOptions& options);
// Where a net of `stages` stages of `whole` (the same model, one stage) cuts it: stage s runs
// layers [bounds[s], bounds[s + 1]), at the cuts that share the forward FLOPs most evenly, each
// the nearest to its share.
std::vector<std::size_t> pipelineBounds(const Net& whole, int stages);
// The bytes of activations and their gradients that a net of `pipeline` stages holds at `batch`
// (each stage's copies at their micro-batch, with pipeline.stage that stage's alone and the
// messages that cross its cuts; and the whole model's net at a batch of 1, which the pipeline
// keeps), from `whole` at a batch of
// 1 (its memory plan for each stage in turn, scaled by the micro-batch's rows); `whole` runs all
// its layers after.
std::int64_t pipelineHeld(Net& whole, const PipelineOptions& pipeline, std::int64_t batch);
// The gradients that the stages of a net of `pipeline` stages of `whole` (the same model, one
// stage) hold for their backward, apart from the pipeline's sums of them: each stage's own and the
// tied weights it reads (NetOptions::stage_grads), with pipeline.stage that stage's alone.
std::int64_t pipelineStageGrads(Net& whole, const PipelineOptions& pipeline);
// Each stage's window (stageGradWindow) in a net of `stages` stages of `whole`: the ranges of
// the weights and gradients that a stage in a process of its own holds.
std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> pipelineStageWindows(Net& whole,
                                                                                     int stages);
// The flat parameters of each stage of a net of `stages` stages of `whole` (the same model, one
// stage): stage s's layers' own are [ranges[s].first, ranges[s].second), one range after another
// from 0 to every parameter (a stage without any: an empty range where the next one begins).
// `whole` runs all its layers after.
std::vector<std::pair<std::int64_t, std::int64_t>> pipelineParamRanges(Net& whole, int stages);
// The same for the flat buffers (Net::bufferRanges).
std::vector<std::pair<std::int64_t, std::int64_t>> pipelineBufferRanges(Net& whole, int stages);
// InputError naming what a net of options.pipeline.stages stages of `whole` (the same model, one
// stage) on `device` cannot do: a GPU, more stages than cuts, more micro-batches
// than options.max_batch.
void checkPipeline(const Net& whole, const NetOptions& options, const Device& device);

// Names of the built-in models, for error messages and --help.
std::vector<std::string> builtinModels();

}  // namespace troupe::kernels
