// Pipeline stages of a net (Net::pipelineCuts, runLayers): the net cut into K stages, each a net
// of its own from the same seed that runs its run of layers, the activations passed forward and
// their gradients back, computes the whole net's loss and gradients to the bit: each layer does
// the same work on the same values. GPT-2's tied output layer sends its part of wte's gradient
// back to the embedding's stage, which adds its own to it, as the whole net's embedding does.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/flat_params.h"
#include "kernels/net.h"
#include "kernels/random.h"
#include "language_model_util.h"
#include "net_test_util.h"
#include "troupe/error.h"

namespace troupe::kernels {
namespace {

using Batch = testing::NetBatch;
using testing::imageModel;

Batch images(std::int64_t n, std::int64_t c, std::int64_t hw) {
  return testing::randomImages(n, c, hw, hw, /*seed=*/7);
}

std::vector<float> hostCopy(Backend& backend, const Tensor& t) {
  Tensor h = Tensor::host(t.shape(), t.dtype());
  backend.copy(t, h);
  backend.synchronize();
  return std::vector<float>(h.f32(), h.f32() + h.numel());
}

// Stage s runs layers [bounds[s], bounds[s + 1]): `stages` stages at cuts spread evenly over the
// net's cuts.
std::vector<std::size_t> boundsOf(const Net& net, int stages) {
  const auto cuts = net.pipelineCuts();
  EXPECT_GE(cuts.size() + 1, static_cast<std::size_t>(stages));
  std::vector<std::size_t> bounds{0};
  for (int s = 1; s < stages; ++s)
    bounds.push_back(cuts[static_cast<std::size_t>(s) * cuts.size() / stages].layer);
  bounds.push_back(net.layers().size());
  return bounds;
}

// [from, to) of the model's gradients, where `net` holds them (Net::gradWindow).
Tensor gradsOf(const Net& net, std::int64_t from, std::int64_t to) {
  return FlatParams(net.grads(), net.gradWindow()).slice(from, to);
}

// The whole net and its stages, one training forward and backward each: the last stage's loss and
// top-1 count, and every gradient, to the bit. With stage_grads, each stage's net holds the
// gradients of its own parameters and of the tied weights it reads alone.
void expectStagesAsWhole(const NetOptions& o, const Batch& batch, int stages,
                         bool stage_grads = false) {
  SCOPED_TRACE(o.model.name + ", " + std::to_string(stages) + " stages" +
               (stage_grads ? ", stage_grads" : ""));
  auto backend = makeCpuBackend(2);
  auto whole = makeNet(*backend, o);
  whole->forward(batch.inputs, batch.labels, true);
  whole->backward(1.0f, nullptr);
  const auto bounds = boundsOf(*whole, stages);
  std::vector<std::unique_ptr<Net>> nets;
  std::int64_t held_grads = 0, tied = 0;
  for (int s = 0; s < stages; ++s) {
    NetOptions stage = o;
    stage.layers = {bounds[s], bounds[s + 1]};
    stage.stage_grads = stage_grads;
    nets.push_back(makeNet(*backend, stage));
    const FlatParams::Ranges every{{0, whole->numParams()}};
    EXPECT_EQ(nets.back()->gradWindow(), stage_grads ? stageGradWindow(*nets.back()) : every);
    held_grads += nets.back()->grads().numel();
    for (const auto& [from, to] : nets.back()->tiedRanges())
      tied += to - from;
  }
  // Apart, the stages hold each parameter's gradient once, and the tied weights' again in the
  // stages that read them.
  if (stage_grads) {
    EXPECT_EQ(held_grads, whole->numParams() + tied);
  }
  Tensor in = batch.inputs;
  for (auto& net : nets) {
    net->forward(in, batch.labels, true);
    if (net != nets.back()) in = net->output();
  }
  for (int s = stages; s-- > 0;) {
    Net& net = *nets[static_cast<std::size_t>(s)];
    if (s + 1 < stages) net.setOutputGrad(nets[static_cast<std::size_t>(s) + 1]->inputGrad());
    for (int later = s + 1; later < stages; ++later) {  // tied parts that come back to s
      Net& reader = *nets[static_cast<std::size_t>(later)];
      for (const auto& [from, to] : reader.tiedRanges()) {
        for (const auto& [begin, end] : net.gradRanges())
          if (begin <= from && to <= end) net.setTiedGrad(from, gradsOf(reader, from, to));
      }
    }
    net.backward(1.0f, nullptr);
  }
  // Each stage holds its own layers' activations and gradients only: at each moment of the
  // step a part of what the whole net holds then.
  std::cout << "[ measured ] " << o.model.name << ", bytes each stage holds:";
  for (const auto& net : nets) {
    EXPECT_LE(net->memory().held, whole->memory().held);
    std::cout << " " << net->memory().held;
  }
  std::cout << " (the whole net " << whole->memory().held << ")\n";
  EXPECT_EQ(hostCopy(*backend, nets.back()->metrics()), hostCopy(*backend, whole->metrics()));
  const auto want = hostCopy(*backend, whole->grads());
  std::vector<int> writers(want.size(), 0);
  for (int s = 0; s < stages; ++s) {
    const Net& net = *nets[static_cast<std::size_t>(s)];
    for (const auto& [begin, end] : net.gradRanges()) {
      const auto got = hostCopy(*backend, gradsOf(net, begin, end));
      for (auto i = static_cast<std::size_t>(begin); i < static_cast<std::size_t>(end); ++i) {
        ++writers[i];
        ASSERT_EQ(std::memcmp(&got[i - begin], &want[i], sizeof(float)), 0)
            << "stage " << s << ", gradient " << i << ": " << got[i - begin] << ", the whole net's "
            << want[i];
      }
    }
  }
  for (std::size_t i = 0; i < writers.size(); ++i)
    ASSERT_EQ(writers[i], 1) << "gradient " << i << " written by " << writers[i] << " stages";
}

TEST(PipelineStages, LenetAndResnet20CutAnywhereComputeTheWholeNetsGradients) {
  const Batch mnist = images(3, 1, 28);
  const Batch cifar = images(2, 3, 32);
  for (int stages : {2, 4}) {
    for (const bool stage_grads : {false, true}) {
      expectStagesAsWhole(imageModel("lenet", 3, 1, 28), mnist, stages, stage_grads);
      expectStagesAsWhole(imageModel("resnet20", 2, 3, 32), cifar, stages, stage_grads);
    }
  }
  auto backend = makeCpuBackend(1);
  const auto lenet = makeNet(*backend, imageModel("lenet", 3, 1, 28));
  expectStagesAsWhole(imageModel("lenet", 3, 1, 28), mnist,
                      static_cast<int>(lenet->pipelineCuts().size()) + 1);
}

TEST(PipelineStages, Gpt2WithItsTiedOutputLayerAndTheLstmModelWithDropout) {
  NetOptions gpt = testing::languageModel("gpt2", 8, 40, 3);
  gpt.gpt = {3, 2, 16};
  const auto tokens = testing::randomSequences(3, 8, 40, 11);
  NetOptions lstm = testing::languageModel("lstm", 6, 30, 2);
  lstm.lstm = {2, 12, 12, 0.5f, false};
  const auto words = testing::randomSequences(2, 6, 30, 12);
  for (int stages : {2, 4}) {
    for (const bool stage_grads : {false, true}) {
      expectStagesAsWhole(gpt, {tokens.tokens, tokens.labels}, stages, stage_grads);
      expectStagesAsWhole(lstm, {words.tokens, words.labels}, stages, stage_grads);
    }
  }
}

// A stage's gradients hold its ranges one after another: a range is found where it lies, and one
// that it does not hold whole is refused, naming it.
TEST(PipelineStages, FlatParamsTakeARangeWhereItsHeldRangeLies) {
  Tensor values = Tensor::host({7});
  for (int i = 0; i < 7; ++i)
    values.f32()[i] = static_cast<float>(i);
  const FlatParams held(values, {{10, 14}, {20, 23}});
  EXPECT_EQ(held.slice(11, 14).f32(), values.f32() + 1);
  EXPECT_EQ(held.slice(11, 14).numel(), 3);
  EXPECT_EQ(held.slice(20, 23).f32(), values.f32() + 4);
  EXPECT_EQ(held.slice(22, 23).f32()[0], 6.0f);
  for (const auto& [begin, end] : {std::pair{9, 12}, {12, 15}, {14, 20}, {13, 21}, {30, 31}}) {
    try {
      held.slice(begin, end);
      ADD_FAILURE() << "[" << begin << ", " << end << ") was taken";
    } catch (const InvariantError& e) {
      EXPECT_NE(std::string(e.what()).find("parameters [" + std::to_string(begin) + ", " +
                                           std::to_string(end) + ") lie outside"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(FlatParams(values).slice(2, 5).f32(), values.f32() + 2);
  EXPECT_FALSE(FlatParams(Tensor(), {{10, 14}}).slice(10, 12).defined());
  EXPECT_THROW(FlatParams(values, {{20, 23}, {10, 14}}), InvariantError);  // out of order
  EXPECT_THROW(FlatParams(values, {{10, 13}}), InvariantError);            // not 7 values
}

// The cuts of ResNet-20: after the stem's convolution and its ReLU (which its batch norm
// computes: no cut between those two), after each block (whose input its shortcut reads too, so
// no cut inside one), and after the pooling and the inner product.
TEST(PipelineStages, CutsFallBetweenBlocksAndNotInsideFusedLayers) {
  auto backend = makeCpuBackend(1);
  const auto net = makeNet(*backend, imageModel("resnet20", 2, 3, 32));
  const auto layers = net->layers();
  std::vector<std::string> after, want{"conv1", "relu1"};
  for (const auto& cut : net->pipelineCuts())
    after.push_back(layers[cut.layer - 1].name);
  for (int stage = 1; stage <= 3; ++stage)
    for (int block = 1; block <= 3; ++block)
      want.push_back("stage" + std::to_string(stage) + ".block" + std::to_string(block) + ".relu2");
  want.insert(want.end(), {"avgpool", "fc"});
  EXPECT_EQ(after, want);
}

TEST(PipelineStages, WrongBoundsInputsAndAMissingTiedPartAreRefused) {
  auto backend = makeCpuBackend(1);
  NetOptions gpt = testing::languageModel("gpt2", 8, 40, 3);
  gpt.gpt = {2, 2, 16};
  auto net = makeNet(*backend, gpt);
  const auto cuts = net->pipelineCuts();
  ASSERT_FALSE(cuts.empty());
  // Inside a block: its input is read by the residual add too.
  EXPECT_THROW(net->runLayers(0, cuts[0].layer + 1), InvariantError);
  net->runLayers(cuts[0].layer, net->layers().size());
  const auto tokens = testing::randomSequences(3, 8, 40, 11);
  try {
    net->forward(tokens.tokens, tokens.labels, true);  // tokens, not activations
    ADD_FAILURE() << "tokens went into a stage that takes activations";
  } catch (const InvariantError& e) {
    EXPECT_NE(std::string(e.what()).find("the activations entering a stage are int32"),
              std::string::npos)
        << e.what();
  }
  auto first = makeNet(*backend, gpt);
  first->runLayers(0, cuts[0].layer);
  first->forward(tokens.tokens, tokens.labels, true);
  first->setOutputGrad(first->output());
  try {
    first->backward(1.0f, nullptr);
    ADD_FAILURE() << "the embedding's stage went back without the output layer's part of wte";
  } catch (const InvariantError& e) {
    EXPECT_NE(std::string(e.what()).find("before setTiedGrad() of its weights at 0"),
              std::string::npos)
        << e.what();
  }
}

// A net of `stages` pipeline stages (NetOptions::pipeline) against the whole net run on
// each micro-batch in turn, its gradients and metrics summed in the same order (the first
// copied, each next added): the same sums, to the bit, and the same running statistics of its
// batch norms. The ranges come to on_ready each once,
// in reverse order, together every parameter.
void expectPipelineAsMicroBatches(NetOptions o, const Batch& batch, int stages, int micro) {
  SCOPED_TRACE(o.model.name + ", " + std::to_string(stages) + " stages, " + std::to_string(micro) +
               " micro-batches");
  // The stages' threads split the pipeline's backend's: 1 each, as the whole net's here, so that
  // each op splits its sums as the whole net's does.
  auto backend = makeCpuBackend(2), one = makeCpuBackend(1);
  auto whole = makeNet(*one, o);
  o.pipeline.stages = stages;
  o.pipeline.micro_batches = micro;
  auto pipeline = makeNet(*backend, o);
  const std::int64_t n = batch.inputs.dim(0), count = std::min<std::int64_t>(micro, n);
  const std::int64_t per_label = batch.labels.numel() / n;
  for (int step = 1; step <= 2; ++step) {  // the second from the first's new weights
    std::vector<std::pair<std::int64_t, std::int64_t>> ready;
    pipeline->reseed(9);
    pipeline->trainStep(batch.inputs, batch.labels, 0.5f,
                        [&](std::int64_t begin, std::int64_t end, const Event*) {
                          ready.emplace_back(begin, end);
                        });
    std::int64_t at = whole->numParams();
    for (const auto& [begin, end] : ready) {
      EXPECT_EQ(end, at) << "a range out of order";
      at = begin;
    }
    EXPECT_EQ(at, 0) << "ranges left out";
    Tensor grads = Tensor::host({whole->numParams()}), metrics = Tensor::host({2});
    for (std::int64_t m = 0; m < count; ++m) {
      const std::int64_t begin = m * (n / count) + std::min(m, n % count);
      const std::int64_t end = (m + 1) * (n / count) + std::min(m + 1, n % count);
      const std::int64_t per = batch.inputs.numel() / n;
      Shape shape = batch.inputs.shape();
      shape[0] = end - begin;
      whole->reseed(randomBits(9, 1, static_cast<std::uint64_t>(m)));
      whole->forward(
          batch.inputs.slice(begin * per, end * per).view(shape),
          batch.labels.view({batch.labels.numel()}).slice(begin * per_label, end * per_label),
          true);
      whole->backward(0.5f, nullptr);
      if (m == 0) {
        backend->copy(whole->grads(), grads);
        backend->copy(whole->metrics(), metrics);
      } else {
        backend->axpy(1.0f, whole->grads(), grads);
        backend->axpy(1.0f, whole->metrics(), metrics);
      }
    }
    EXPECT_EQ(hostCopy(*backend, pipeline->metrics()), hostCopy(*backend, metrics));
    // Batch norms' running statistics, updated micro-batch by micro-batch in both.
    EXPECT_EQ(hostCopy(*backend, pipeline->buffers()), hostCopy(*backend, whole->buffers()));
    const auto got = hostCopy(*backend, pipeline->grads()), want = hostCopy(*backend, grads);
    for (std::size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
          << "step " << step << ", gradient " << i << ": " << got[i] << ", " << want[i];
    }
    // The next step from weights moved by these gradients, in both (the pipeline's copies read
    // the whole net's weights, which it was made with: useWeights).
    backend->axpy(-0.1f, grads, whole->weights());
    pipeline->useWeights(whole->weights());
  }
}

TEST(PipelineNet, StagesOverMicroBatchesSumTheMicroBatchesGradients) {
  const Batch mnist = images(5, 1, 28);
  expectPipelineAsMicroBatches(imageModel("lenet", 5, 1, 28), mnist, 2, 1);
  expectPipelineAsMicroBatches(imageModel("lenet", 5, 1, 28), mnist, 2, 3);
  expectPipelineAsMicroBatches(imageModel("mlp", 5, 1, 28), mnist, 3, 5);
  const Batch cifar = images(4, 3, 32);  // batch norms: each micro-batch's statistics
  expectPipelineAsMicroBatches(imageModel("resnet20", 4, 3, 32), cifar, 2, 2);
  expectPipelineAsMicroBatches(imageModel("resnet20", 4, 3, 32), cifar, 4, 4);
  NetOptions gpt = testing::languageModel("gpt2", 8, 40, 4);
  gpt.gpt = {4, 2, 16};
  const auto tokens = testing::randomSequences(4, 8, 40, 11);
  expectPipelineAsMicroBatches(gpt, {tokens.tokens, tokens.labels}, 4, 4);
  const auto three = testing::randomSequences(3, 8, 40, 13);  // fewer rows than micro-batches
  expectPipelineAsMicroBatches(gpt, {three.tokens, three.labels}, 2, 4);
  NetOptions lstm = testing::languageModel("lstm", 6, 30, 4);
  lstm.lstm = {2, 12, 12, 0.5f, false};
  const auto words = testing::randomSequences(4, 6, 30, 12);
  expectPipelineAsMicroBatches(lstm, {words.tokens, words.labels}, 3, 2);
}

// A stage that fails (the last one, on a bad label) ends the step with its error in the caller,
// the other stages given up waiting, and the next step runs as if nothing had been.
TEST(PipelineNet, AStageThatFailsEndsTheStepWithItsErrorAndTheNextStepRuns) {
  auto backend = makeCpuBackend(2);
  NetOptions o = imageModel("lenet", 4, 1, 28);
  o.pipeline.stages = 3;
  o.pipeline.micro_batches = 4;
  auto net = makeNet(*backend, o);
  Batch batch = images(4, 1, 28);
  batch.labels.i32()[2] = 10;  // of 10 classes: micro-batch 2 fails in the last stage
  try {
    net->trainStep(batch.inputs, batch.labels, 1.0f, nullptr);
    ADD_FAILURE() << "a bad label went through";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("label 10 of sample 0"), std::string::npos) << e.what();
  }
  batch.labels.i32()[2] = 2;
  net->trainStep(batch.inputs, batch.labels, 1.0f, nullptr);
  EXPECT_TRUE(std::isfinite(hostCopy(*backend, net->metrics())[0]));
}

TEST(PipelineNet, ModelsItCannotRunAreRefusedByName) {
  auto backend = makeCpuBackend(1);
  auto errorOf = [&](NetOptions o) -> std::string {
    try {
      makeNet(*backend, o);
    } catch (const InputError& e) {
      return e.what();
    }
    return "(no InputError)";
  };
  NetOptions mlp = imageModel("mlp", 4, 1, 28);
  mlp.pipeline.stages = 9;
  EXPECT_NE(errorOf(mlp).find("pipeline_stages 9: the model can be cut into at most"),
            std::string::npos)
      << errorOf(mlp);
  mlp.pipeline.stages = 2;
  mlp.pipeline.micro_batches = 5;
  EXPECT_EQ(errorOf(mlp), "micro_batches 5 is more than a replica's batch of 4");
  mlp.pipeline.stages = 0;
  EXPECT_EQ(errorOf(mlp), "pipeline_stages = 0 (at least 1)");
}

// A GPT-2 of 2 layers, 2 heads, 16 wide, over 40 tokens, sequences of 8, batches of 4, in 2
// pipeline stages of 2 micro-batches: its output layer, in stage 1, reads stage 0's wte (tied).
NetOptions twoStageGpt() {
  NetOptions gpt = testing::languageModel("gpt2", 8, 40, 4);
  gpt.gpt = {2, 2, 16};
  gpt.pipeline.stages = 2;
  gpt.pipeline.micro_batches = 2;
  return gpt;
}

// A link to no other process: what the net sends is kept, and the test delivers what comes.
class KeptLink final : public StageLink {
 public:
  void send(int to, StageTensor message) override {
    std::lock_guard lock(mutex_);
    sent_.emplace_back(to, std::move(message));
  }
  std::string nameOf(int stage) const override { return "worker " + std::to_string(stage + 10); }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(300); }
  std::chrono::milliseconds stallWarning() const override { return std::chrono::milliseconds(100); }
  void warn(const std::string& report) override {
    std::lock_guard lock(mutex_);
    warnings_.push_back(report);
  }
  std::vector<std::pair<int, StageTensor>> sent() {
    std::lock_guard lock(mutex_);
    return sent_;
  }
  std::vector<std::string> warnings() {
    std::lock_guard lock(mutex_);
    return warnings_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<int, StageTensor>> sent_;
  std::vector<std::string> warnings_;
};

// Stage 1 of a GPT-2 in 2 processes, whose output layer reads stage 0's wte (tied): a message
// that does not fit what the step can receive is refused naming its sender, and a wait on a stage
// that sends nothing is reported at the link's stall warning and ends after its timeout, naming
// that stage and its worker. Stage 0 sends wte's values at the step's start, and waits for stage
// 1's part of its gradient once its own backward is done.
TEST(PipelineStages, AStageInAProcessOfItsOwnRefusesMalformedMessagesAndTimesOutNamingTheSender) {
  const NetOptions gpt = twoStageGpt();
  const auto tokens = testing::randomSequences(4, 8, 40, 11);
  // Each stage keeps the weights and gradients of its own parameters alone, and stage 1 those of
  // wte too (40 tokens, 16 wide, the model's first parameters), which its output layer reads.
  NetOptions one = gpt;
  one.pipeline = {};
  auto probe = makeCpuBackend(1);
  const auto whole = makeNet(*probe, one);
  const auto ranges = pipelineParamRanges(*whole, 2);
  const std::vector<FlatParams::Ranges> windows = {{ranges[0]}, {{0, 40 * 16}, ranges[1]}};
  // A fresh stage `stage` given `messages` before its first step; the step's error, and what it
  // sent.
  const auto stepWith = [&](int stage, const std::vector<StageTensor>& messages,
                            std::vector<std::pair<int, StageTensor>>* sent = nullptr,
                            std::vector<std::string>* warnings = nullptr) {
    auto link = std::make_shared<KeptLink>();
    NetOptions o = gpt;
    o.pipeline.stage = stage;
    o.pipeline.link = link;
    auto backend = makeCpuBackend(1);
    auto net = makeNet(*backend, o);
    EXPECT_EQ(net->gradWindow(), windows[static_cast<std::size_t>(stage)]);
    EXPECT_EQ(net->weightWindow(), windows[static_cast<std::size_t>(stage)]);
    EXPECT_EQ(net->weights().numel(), net->grads().numel());
    const auto held = windows[static_cast<std::size_t>(stage)];
    EXPECT_EQ(net->grads().numel(), FlatParams::count(held));
    for (const StageTensor& message : messages)
      link->deliver(message);
    std::string error = "(no error)";
    try {
      net->trainStep(tokens.tokens, tokens.labels, 1.0f, nullptr);
    } catch (const Error& e) {
      error = e.what();
    }
    if (sent) *sent = link->sent();
    if (warnings) *warnings = link->warnings();
    return error;
  };
  const auto tensor = [](StageTensor::Kind kind, std::int64_t count, int from,
                         std::int32_t micro_batch = 0) {
    Tensor values = Tensor::host({count});
    std::fill(values.f32(), values.f32() + count, 0.5f);
    return StageTensor{1, micro_batch, from, kind, values};
  };
  const auto activations = [&](std::int64_t count, int from, std::int32_t micro_batch = 0) {
    return tensor(StageTensor::kActivations, count, from, micro_batch);
  };
  // wte: 40 tokens, 16 wide. A micro-batch of 2 sequences of 8 tokens, 16 wide, crosses the cut.
  const StageTensor wte = tensor(StageTensor::kTiedWeights, 40 * 16, 0);
  using Messages = std::vector<StageTensor>;
  for (const auto& [messages, error] :
       {std::pair{Messages{wte, activations(2 * 8 * 16 + 1, 0)},
                  "pipeline stage 1 got activations of micro-batch 0 from stage 0 (worker 10) "
                  "holding 257 values, not the [2,8,16] of 256 float32 values"},
        std::pair{Messages{wte, activations(256, 0, 2)},
                  "pipeline stage 1 got activations of micro-batch 2 from stage 0 (worker 10), of "
                  "a step of 2 micro-batches"},
        std::pair{Messages{wte, activations(256, 1)},
                  "pipeline stage 1 got activations from stage 1 (worker 11): it takes "
                  "activations from stage 0 only"},
        std::pair{Messages{wte},
                  "pipeline stage 1 waited 0.3 s for the activations of micro-batch 0 of step 1 "
                  "from stage 0 (worker 10) (peer_timeout)"},
        std::pair{Messages{},
                  "pipeline stage 1 waited 0.3 s for the tied weights of step 1 from stage 0 "
                  "(worker 10) (peer_timeout)"},
        std::pair{Messages{tensor(StageTensor::kTiedWeights, 641, 0)},
                  "pipeline stage 1 got tied weights from stage 0 (worker 10) holding 641 values, "
                  "not the 640 float32 values of their ranges"},
        std::pair{Messages{tensor(StageTensor::kTiedWeights, 640, 0, 1)},
                  "pipeline stage 1 got tied weights of step 1, micro-batch 1, from stage 0 "
                  "(worker 10) during step 1 (they come once a step, as micro-batch 0)"},
        std::pair{Messages{wte, wte},
                  "pipeline stage 1 got tied weights of step 1 twice from stage 0 (worker 10)"},
        std::pair{Messages{tensor(StageTensor::kTiedGradients, 640, 0)},
                  "pipeline stage 1 got tied weights' gradients from stage 0 (worker 10): it "
                  "takes them from no stage"}}) {
    const std::string got = stepWith(1, messages);
    EXPECT_NE(got.find(error), std::string::npos) << got;
  }
  // Stage 0, given both micro-batches' gradients, waits for stage 1's part of wte's gradient: the
  // stall is reported once, at 0.1 s.
  std::vector<std::pair<int, StageTensor>> sent;
  std::vector<std::string> warnings;
  const std::string waited = stepWith(
      0, {tensor(StageTensor::kGradients, 256, 1, 0), tensor(StageTensor::kGradients, 256, 1, 1)},
      &sent, &warnings);
  EXPECT_EQ(waited,
            "pipeline stage 0 waited 0.3 s for the tied weights' gradients of step 1 from stage 1 "
            "(worker 11) (peer_timeout)");
  EXPECT_EQ(warnings,
            std::vector<std::string>{
                "stall: pipeline stage 0 has waited 0.1 s for the tied weights' gradients "
                "of step 1 from stage 1 (worker 11); the run fails after 0.3 s "
                "(peer_timeout)"});
  // What it sent stage 1: wte's values as the step began, and each micro-batch's activations (the
  // stage's thread and the step's caller send them: in any order).
  ASSERT_EQ(sent.size(), 3u);
  std::vector<std::int32_t> activations_of;
  for (const auto& [to, message] : sent) {
    EXPECT_EQ(to, 1);
    if (message.kind == StageTensor::kTiedWeights) {
      EXPECT_EQ(message.values.numel(), 40 * 16);
    } else {
      EXPECT_EQ(message.kind, StageTensor::kActivations);
      activations_of.push_back(message.micro_batch);
    }
  }
  EXPECT_EQ(activations_of, (std::vector<std::int32_t>{0, 1}));
}

// An evaluation in stages of their own processes: stage 0 runs its layers and sends each
// micro-batch's activations on, numbered as evaluation micro-batches (their step: minus the
// number); stage 1 runs its own on them, its output layer reading wte as it was initialised, and
// scores the batch as the same stages as threads of one process do, to the bit. A message that
// does not fit is refused naming its sender, and a wait ends after the link's timeout, naming it.
TEST(PipelineStages, AStageInAProcessOfItsOwnEvaluatesItsLayersOnTheActivationsOfTheOneBefore) {
  const NetOptions gpt = twoStageGpt();
  const auto tokens = testing::randomSequences(4, 8, 40, 11);
  auto backend = makeCpuBackend(1);
  auto threads = makeNet(*backend, gpt);
  threads->forward(tokens.tokens, tokens.labels, false);
  const auto want = hostCopy(*backend, threads->metrics());

  const auto stageOf = [&](int stage, const std::shared_ptr<KeptLink>& link) {
    NetOptions o = gpt;
    o.pipeline.stage = stage;
    o.pipeline.link = link;
    return makeNet(*backend, o);
  };
  auto link0 = std::make_shared<KeptLink>();
  auto stage0 = stageOf(0, link0);
  stage0->forward(tokens.tokens, tokens.labels, false);
  EXPECT_FALSE(stage0->scoresBatch());
  EXPECT_EQ(hostCopy(*backend, stage0->metrics()), (std::vector<float>{0, 0}));
  const auto sent = link0->sent();
  ASSERT_EQ(sent.size(), 2u);  // 2 micro-batches of 2 sequences of 8 tokens, 16 wide
  for (std::size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(sent[i].first, 1);
    EXPECT_EQ(sent[i].second.kind, StageTensor::kActivations);
    EXPECT_EQ(sent[i].second.step, -static_cast<std::int64_t>(i) - 1);
    EXPECT_EQ(sent[i].second.values.numel(), 2 * 8 * 16);
  }
  auto link1 = std::make_shared<KeptLink>();
  auto stage1 = stageOf(1, link1);
  for (const auto& [to, message] : sent)
    link1->deliver(message);
  stage1->forward(tokens.tokens, tokens.labels, false);
  EXPECT_TRUE(stage1->scoresBatch());
  EXPECT_EQ(hostCopy(*backend, stage1->metrics()), want);
  EXPECT_GT(want[0], 0.0f);

  // What an evaluation of stage 1 refuses, and a wait on a stage 0 that sends nothing.
  const auto refusal = [&](const StageTensor& message) {
    auto link = std::make_shared<KeptLink>();
    auto net = stageOf(1, link);
    try {
      link->deliver(message);
      net->forward(tokens.tokens, tokens.labels, false);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  StageTensor good = sent[0].second;
  StageTensor odd = good;
  odd.values = good.values.slice(0, 2 * 8 * 16 - 1);
  EXPECT_EQ(refusal(odd),
            "pipeline stage 1 got activations of evaluation micro-batch 1 from stage 0 (worker 10) "
            "holding 255 values, not 1 to 2 rows of 128 float32 values");
  StageTensor gradients = good;
  gradients.kind = StageTensor::kGradients;
  EXPECT_EQ(refusal(gradients),
            "pipeline stage 1 got gradients of evaluation micro-batch 1 (as micro-batch 0) from "
            "stage 0 (worker 10): an evaluation takes activations from stage 0, each "
            "micro-batch's as micro-batch 0");
  StageTensor one_row = good;
  one_row.values = good.values.slice(0, 8 * 16);
  EXPECT_EQ(refusal(one_row),
            "pipeline stage 1 got activations of evaluation micro-batch 1 from stage 0 (worker 10) "
            "holding 128 values, not the [2,8,16] of 256 float32 values");
  StageTensor later = good;
  later.step = -2;  // micro-batch 1 never comes
  EXPECT_EQ(refusal(later),
            "pipeline stage 1 waited 0.3 s for the activations of evaluation micro-batch 1 from "
            "stage 0 (worker 10) (peer_timeout)");
}

// Before an evaluation (Net::prepareEvaluation) stage 0 sends the tied weights that stage 1's
// output layer reads (wte, 40 x 16) as they are then, as round 1's (the message's step: minus the
// round), and stage 1 takes them into the weights it reads, as a step's start does: with wte
// changed in stage 0 after both were made, stage 1 scores the batch as the stages as threads of
// one process do with the same change, to the bit. Tied weights of another size, or from a stage
// whose weights it does not read, are refused naming the sender; a wait for them that nothing
// answers ends after the link's timeout, naming it.
TEST(PipelineStages, BeforeAnEvaluationAStagesWorkerTakesTheTiedWeightsItReadsFromTheirOwner) {
  const NetOptions gpt = twoStageGpt();
  const auto tokens = testing::randomSequences(4, 8, 40, 11);
  auto backend = makeCpuBackend(1);
  const auto stageOf = [&](int stage, const std::shared_ptr<KeptLink>& link) {
    NetOptions o = gpt;
    o.pipeline.stage = stage;
    o.pipeline.link = link;
    return makeNet(*backend, o);
  };
  auto threads = makeNet(*backend, gpt);
  const auto wte =
      std::find_if(threads->params().begin(), threads->params().end(),
                   [](const ParamInfo& p) { return p.name == "transformer.wte.weight"; });
  ASSERT_NE(wte, threads->params().end());
  ASSERT_EQ(wte->size, 40 * 16);
  const auto halve = [&](const Net& net) {
    const Tensor w =
        FlatParams(net.weights(), net.weightWindow()).slice(wte->offset, wte->offset + wte->size);
    backend->scale(w, 0.5f);
    backend->synchronize();
  };
  halve(*threads);
  threads->forward(tokens.tokens, tokens.labels, false);
  const auto want = hostCopy(*backend, threads->metrics());

  auto link0 = std::make_shared<KeptLink>(), link1 = std::make_shared<KeptLink>();
  auto stage0 = stageOf(0, link0);
  auto stage1 = stageOf(1, link1);
  halve(*stage0);
  stage0->prepareEvaluation();
  stage0->forward(tokens.tokens, tokens.labels, false);
  const auto sent = link0->sent();
  ASSERT_EQ(sent.size(), 3u);  // the tied weights, then 2 micro-batches' activations
  EXPECT_EQ(sent[0].first, 1);
  EXPECT_EQ(sent[0].second.kind, StageTensor::kTiedWeights);
  EXPECT_EQ(sent[0].second.step, -1);
  EXPECT_EQ(sent[0].second.values.numel(), 40 * 16);
  for (const auto& [to, message] : sent)
    link1->deliver(message);
  stage1->prepareEvaluation();
  stage1->forward(tokens.tokens, tokens.labels, false);
  EXPECT_EQ(hostCopy(*backend, stage1->metrics()), want);
  EXPECT_TRUE(link1->sent().empty());  // it owns no weights that another stage reads

  const auto refusal = [&](std::optional<StageTensor> message) {
    auto link = std::make_shared<KeptLink>();
    auto net = stageOf(1, link);
    try {
      if (message) link->deliver(*message);
      net->prepareEvaluation();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  StageTensor short_one = sent[0].second;
  short_one.values = short_one.values.slice(0, 40 * 16 - 1);
  EXPECT_EQ(refusal(short_one),
            "pipeline stage 1 got tied weights for evaluation 1 from stage 0 (worker 10) holding "
            "639 values (as micro-batch 0), not the 640 float32 values of their ranges (as "
            "micro-batch 0)");
  StageTensor from_itself = sent[0].second;
  from_itself.from = 1;
  EXPECT_EQ(refusal(from_itself),
            "pipeline stage 1 got tied weights for evaluation 1 from stage 1 (worker 11): it reads "
            "none of that stage's weights");
  EXPECT_EQ(refusal(std::nullopt),
            "pipeline stage 1 waited 0.3 s for the tied weights of evaluation 1 from stage 0 "
            "(worker 10) (peer_timeout)");
}

}  // namespace
}  // namespace troupe::kernels
